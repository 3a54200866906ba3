"""Gluon sm90 FP8 1D2D GEMM for small M (M <= 128, decode-time GEMMs), issue #3 (>= 3000 GB/s at M <= 128).

``D[M, N] (bf16) = A[M, K] (e4m3, 1x128 scales sfa) @ B[N, K]^T (e4m3, 128x128 scales sfb)`` with the same per-block
FP32 promotion as :mod:`deepkernels.gemm._gluon_fp8` (a fresh wgmma partial per 128-wide K block, ``acc += P * (sa *
sb)``, one BF16 rounding). Opt-in through :func:`launch_fp8_gemm_small`; dispatched by ``dk.fp8_gemm_nt`` only at
the (M class, N, K) rows of :data:`SMALL_FP8_TABLE` (session 20, after its first device run; the rule and its
measurement: ``dense._use_small``), through a per-signature :class:`SmallPlan` (dense.py's plan cache).

Why a separate kernel: at M <= 128 the GEMM is a B stream (B is 3-117 MB, A + D + scales < 10 %), so the kernel must
keep every SM reading B with enough bytes in flight, and split the work evenly over the 132 SMs:

* one CTA owns all M rows (``BLOCK_M`` 64: one math warpgroup; 128: two, rows 0-63 / 64-127, sharing each B stage),
  so B is read once (the Triton table configs use 64-row tiles: at M 128 B is fetched twice, once per row tile);
* work item = (N tile, K split): the N tiles x ``split`` K ranges (``kps`` = ceil(kb / split) K blocks each) are
  spread over a persistent grid of min(items, SMs) CTAs; :func:`pick_config` chooses BLOCK_N (64 / 128) and the split
  so that the items fill the SMs in (nearly) whole waves;
* the producer warpgroup streams A + B stages through a deep ring (6-12 stages, ~192 KB: 96-128 KB of B in flight per
  SM against the ~30 KB per SM that 4 TB/s x ~1 us of HBM latency needs) and runs on into the next item's K blocks
  while the math warpgroups finish the previous item;
* split-K reduction, ``mode``:
  - ``"fixup"`` (default): one kernel. Every split stores its FP32 partial into ``ws [S, M, N]``, then a per-(tile,
    warpgroup) counter is incremented (``thread_barrier`` then one ``atom.acq_rel.gpu``: the CUTLASS semaphore
    pattern, no spinning so it cannot hang); the split that arrives last resets the counter to 0 and sums ``ws[0] +
    ... + ws[S-1]`` in that fixed order from 0.0 -- exactly :func:`_gemm_splitk_reduce_kernel`'s order, so the result
    does not depend on who arrives last and equals the dispatched split-K path bit for bit when the splits do.
    The counters live in a zeroed int32 buffer per (device, stream) that the kernel leaves zeroed again.
  - ``"reduce"``: the same partials, then dense.py's ``_splitk_finish`` (the separate reduce kernel of the dispatched
    path): one more launch (~2-4 us of a 5-15 us call) and a full FP32 pass, for comparison.
  Byte / latency arithmetic (benchmarks/notes/gemm_small.md): the partials are S x M x N x 4 B, written and re-read
  from L2 (M 128, N 4096, S 4: 8 MB vs 29 MB of B), the fixup's extra latency is one L2 round trip per split
  (~1-2 us, overlapped with the other CTAs' streaming), while a second kernel costs a launch gap plus its own
  ramp-up; atomics into a zeroed FP32 workspace would need a memset and a cast kernel (3 launches) and are not
  deterministic.

M from 1 to 128 (TMA zero-fills rows >= M; stores are masked), any N (the last N tile is clipped), K any multiple of
16 (the K tail of the last 128-block is zero-filled by TMA, as in the large-M kernel); ``S x M x N < 2^31`` for the
int32 workspace offsets (else no split).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

from .._gluon import IMPORT_ERROR as _IMPORT_ERROR, available, gl, mbarrier, TensorDescriptor
from .._gluon import compile_sm90 as _compile_sm90_gluon, jit as _jit
from .._launch import KernelLauncher, cached_launcher, spec_key
from ._gluon_fp8 import (BLOCK_K, _g_kloop, _g_kloop_ahead, _g_load_stage, _g_ring_barriers, _g_store_tile, _num_sms,
                         _smem_layout, check_dense_operands, check_gluon_runnable)

__all__ = ["SmallConfig", "pick_config", "launch_fp8_gemm_small", "SMALL_CANDIDATES", "SMALL_FP8_TABLE", "SmallPlan",
           "rule_enabled", "rule_config"]

_SMEM_RING = 196608  # bytes of shared memory given to the A + B ring (the rest: barriers, scratch)


def default_stages(block_m: int, block_n: int) -> int:
    """Ring depth filling ~192 KB: 64x128 8, 128x128 6, 64x64 12, 128x64 8."""
    return max(2, min(12, _SMEM_RING // ((block_m + block_n) * BLOCK_K)))


@dataclass(frozen=True)
class SmallConfig:
    block_m: int = 64           # 64 (M <= 64: one math warpgroup) or 128 (two)
    block_n: int = 128          # 64 or 128 (one scalar sfb per K block)
    num_stages: int = 0         # 0: default_stages(block_m, block_n)
    split: int = 1              # requested K splits (clamped so that every split has >= 1 K block)
    mode: str = "fixup"         # "fixup" (in-kernel last-arriver reduce) or "reduce" (separate reduce kernel)
    scale_ahead: int = 0        # 1: _gluon_fp8's scales-two-blocks-ahead K loop (same FMA order)
    math_regs: int = 232
    producer_regs: int = 40

    def stages(self) -> int:
        return self.num_stages or default_stages(self.block_m, self.block_n)

    def name(self) -> str:
        return (f"small_{self.block_m}x{self.block_n}_s{self.stages()}_k{self.split}"
                f"{'' if self.mode == 'fixup' else '_' + self.mode}{f'_sa{self.scale_ahead}' if self.scale_ahead else ''}")

    def maxnreg(self) -> int:
        n_math = self.block_m // 64
        return (self.producer_regs + n_math * self.math_regs) // (1 + n_math) // 8 * 8

    def smem_bytes(self) -> int:
        return self.stages() * (self.block_m + self.block_n) * BLOCK_K + 2 * 8 * self.stages()


# Dispatch table of dk.fp8_gemm_nt: (m_class, N, K) -> config, m_class as gemm/_configs.py (64: M <= 64, 128: M <= 128).
# Only the rows where the best small-M variant beat the dispatched Triton table config by >= 3 % in CUDA-graph replay
# (paired rotated rounds, median of 5 per-round ratios t/t_dispatched, A/A 0.991-1.006; H200, git 34ef2f5,
# benchmarks/results/gemm_small-h200-2026-11-30-s20.json). Every row keeps the Triton table's split-K (K partition),
# so D is expected bit-identical to the Triton path (tests/test_gemm_small_dispatch.py checks it on the GPU).
SMALL_FP8_TABLE: dict = {
    (64, 7168, 2048): SmallConfig(64, 64, split=1),                        # small_64x64_s12_k1          0.904
    (128, 2112, 7168): SmallConfig(128, 64, split=4, mode="reduce"),       # small_128x64_s8_k4_reduce   0.962
    (128, 24576, 1536): SmallConfig(128, 64, split=1, scale_ahead=1),      # small_128x64_s8_k1_sa1      0.922
    (128, 7168, 16384): SmallConfig(128, 128, split=2, mode="reduce"),     # small_128x128_s6_k2_reduce  0.950
    (128, 7168, 2048): SmallConfig(128, 64, split=1, scale_ahead=1),       # small_128x64_s8_k1_sa1      0.872
}

# The rule for shapes outside SMALL_FP8_TABLE (session 20, second round), on by default since its sweep:
# DEEPKERNELS_GEMM_SMALL_RULE=0 (read when a call signature's plan is made) or SMALL_RULE = False turns it off.
# Derived from the first run's 12 shapes, then narrowed by benchmarks/gemm_small_sweep.py (H200, git 646a3c203ff9, 30
# other (N, K) x M in {1, 16, 64, 96, 128}, 102 shapes, 3 rotated rounds, A/A 0.984-1.017, every rule output
# bit-identical to the Triton path; benchmarks/results/gemm_small_sweep-h200-2026-11-30-s20.json): where Triton does
# not split K and the 64-wide N tiles fit one wave the rule won at all 24 shapes (M <= 64: median 0.878, 0.835-0.994;
# M > 64: 0.922 / 0.915, 0.854-0.954); with a K split (M > 64) 0.891-1.102 (median 0.954) and with more 64-wide tiles
# than SMs 0.875-1.058: those stay on Triton.
SMALL_RULE = True
RULE_MIN_K = 1024        # K 512 (4 K blocks) lost at every variant (1.05-1.15): too few K blocks per item


def rule_enabled() -> bool:
    """Env ``DEEPKERNELS_GEMM_SMALL_RULE`` (1 / true / on / yes, or 0 / false / off / no) if set, else SMALL_RULE."""
    v = os.environ.get("DEEPKERNELS_GEMM_SMALL_RULE", "").strip().lower()
    if v in ("1", "true", "on", "yes"):
        return True
    if v in ("0", "false", "off", "no"):
        return False
    return SMALL_RULE


def rule_config(m: int, n: int, k: int, num_sms: int) -> SmallConfig | None:
    """The rule's small-M config at any (M <= 128, N, K >= RULE_MIN_K), or None (Triton): only where the Triton
    config (``select_fp8_config``: table or ``fp8_rule``) does not split K and the 64-wide N tiles fit one wave
    (ceil(N / 64) <= SMs), so D stays bit-identical to the Triton path: M > 64 (two Triton 64-row tiles read B
    twice, the small kernel once) BLOCK_N 64 + scales-ahead, M <= 64 64x64. Measured (the sweep above): 24 of 24
    such shapes faster, 0.835-0.994. The first version also took M > 64 with a K split (the Triton BLOCK_N + the
    separate reduce) and more tiles than SMs: 0.875-1.102 in the sweep, dropped.
    """
    if m > 128 or m <= 0 or n <= 0 or k < RULE_MIN_K:
        return None
    from ._configs import select_fp8_config
    t = select_fp8_config(m, n, k, num_sms)
    num_kb = -(-k // 128)
    split, _ = split_plan(num_kb, t.split_k)
    if split * m * n >= 2 ** 31:
        return None
    if split != 1 or -(-n // 64) > num_sms:
        return None
    if m > 64:
        return SmallConfig(128, 64, split=1, scale_ahead=1)
    return SmallConfig(64, 64, split=1)


# compile-tier set: every (BLOCK_M, BLOCK_N) x reduction kind the picker or the bench can produce
SMALL_CANDIDATES = [SmallConfig(bm, bn, split=sp, mode=md, scale_ahead=sa) for bm in (64, 128) for bn in (64, 128)
                    for sp, md, sa in ((2, "fixup", 0), (2, "reduce", 0), (1, "fixup", 0), (2, "fixup", 1),
                                       (1, "fixup", 1))]


# ----------------------------------------------------------------------------------------------- device code

@_jit
def _s_item(item, S, KPS, num_kb):
    """Work item -> (N tile, split, first K block, end K block); the splits of one tile are consecutive items."""
    tile = item // S
    s = item - tile * S
    kb0 = s * KPS
    kb1 = gl.minimum(kb0 + KPS, num_kb)
    return tile, s, kb0, kb1


@_jit
def _s_producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, N, K, S, KPS, num_progs,
                BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr):
    """TMA producer: A rows [0, BLOCK_M) + B rows of the item's N tile, K blocks [kb0, kb1), item after item."""
    pid = gl.program_id(0)
    num_items = gl.cdiv(N, BLOCK_N) * S
    num_kb = gl.cdiv(K, 128)
    it = 0
    for item in range(pid, num_items, num_progs):
        tile, s, kb0, kb1 = _s_item(item, S, KPS, num_kb)
        for kb in range(kb0, kb1):
            slot = it % NUM_STAGES
            mbarrier.wait(empty.index(slot), ((it // NUM_STAGES) & 1) ^ 1)  # fresh barriers: phase 1 complete
            _g_load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, slot, 0, tile * BLOCK_N, kb, True)
            it += 1


@_jit
def _s_offsets(off_m, off_n, M, N, ROWS: gl.constexpr, BLOCK_N: gl.constexpr, L: gl.constexpr):
    """int32 offsets ``m * N + n`` of a [ROWS, BLOCK_N] slice of one workspace plane and its in-bounds mask."""
    offs_m = off_m + gl.arange(0, ROWS, gl.SliceLayout(1, L))
    offs_n = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(0, L))
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    return offs_m[:, None] * N + offs_n[None, :], mask


@_jit
def _s_fixup(ws_ptr, d_ptr, S, off_m, off_n, M, N, stride_dm, ROWS: gl.constexpr, BLOCK_N: gl.constexpr,
             L: gl.constexpr):
    """Last split of a tile: ``D = bf16(0 + ws[0] + ws[1] + ... + ws[S-1])`` (the reduce kernel's order per
    element). Four 16-row chunks in a row-major blocked layout (4 consecutive columns per thread): the whole 64-row
    slice at once in the wgmma layout spilled (64 scalar addresses + two 64-register tiles per thread)."""
    CH: gl.constexpr = 16
    LB: gl.constexpr = gl.BlockedLayout([1, 4], [32 // (BLOCK_N // 4), BLOCK_N // 4], [4, 1], [1, 0])
    plane = M * N
    for c in gl.static_range(ROWS // CH):
        offs, mask = _s_offsets(off_m + c * CH, off_n, M, N, CH, BLOCK_N, LB)
        tot = gl.zeros([CH, BLOCK_N], gl.float32, LB)
        for j in range(S):
            tot += gl.load(ws_ptr + j * plane + offs, mask=mask, other=0.0, cache_modifier=".cg")
        _g_store_tile(d_ptr, tot, off_m + c * CH, off_n, M, N, stride_dm, CH, BLOCK_N, LB)


@_jit
def _s_math(a_bufs, b_bufs, ready, empty, d_ptr, ws_ptr, cnt_ptr, sfa_ptr, sfb_ptr, M, N, K, S, KPS, stride_dm,
            sfa_sm, sfa_sk, sfb_sn, sfb_sk, num_progs,
            ROW0: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
            SPLIT_MODE: gl.constexpr, SCALE_AHEAD: gl.constexpr):
    """One math warpgroup: rows [ROW0, ROW0 + 64) of every item. SPLIT_MODE 0: BF16 store into D (no split);
    1: FP32 partial into ws[s] (separate reduce); 2: partial + counter, the last split reduces (module docstring)."""
    ROWS: gl.constexpr = 64
    L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                instr_shape=[16, BLOCK_N, 32])
    pid = gl.program_id(0)
    num_items = gl.cdiv(N, BLOCK_N) * S
    num_kb = gl.cdiv(K, 128)
    zero = gl.zeros([ROWS, BLOCK_N], gl.float32, L)
    offs_m = ROW0 + gl.arange(0, ROWS, gl.SliceLayout(1, L))
    m_mask = offs_m < M
    sfa_rows = sfa_ptr + offs_m.to(gl.int64) * sfa_sm
    it = 0
    for item in range(pid, num_items, num_progs):
        tile, s, kb0, kb1 = _s_item(item, S, KPS, num_kb)
        off_n = tile * BLOCK_N
        sfb_base = sfb_ptr + (off_n // 128).to(gl.int64) * sfb_sn + kb0.to(gl.int64) * sfb_sk
        sfa_k = sfa_rows + kb0.to(gl.int64) * sfa_sk
        acc = gl.zeros([ROWS, BLOCK_N], gl.float32, L)
        if SCALE_AHEAD > 0:
            acc, it = _g_kloop_ahead(a_bufs, b_bufs, ready, empty, it, zero, acc, sfa_k, m_mask, sfa_sk, sfb_base,
                                     sfb_sk, kb1 - kb0, ROW0, ROWS, NUM_STAGES, False)
        else:
            acc, it = _g_kloop(a_bufs, b_bufs, ready, empty, it, zero, acc, sfa_k, m_mask, sfa_sk, sfb_base, sfb_sk,
                               kb1 - kb0, ROW0, ROWS, NUM_STAGES)
        if SPLIT_MODE == 0:
            _g_store_tile(d_ptr, acc, ROW0, off_n, M, N, stride_dm, ROWS, BLOCK_N, L)
        else:
            offs, mask = _s_offsets(ROW0, off_n, M, N, ROWS, BLOCK_N, L)
            gl.store(ws_ptr + s * (M * N) + offs, acc, mask=mask)
            if SPLIT_MODE == 2:
                gl.thread_barrier()   # every thread's partial is stored before the release below
                cnt = cnt_ptr + tile * (BLOCK_M // 64) + ROW0 // 64
                old = gl.atomic_add(cnt, 1, sem="acq_rel", scope="gpu")
                if old == S - 1:      # last split of this (tile, warpgroup): every other partial is visible
                    gl.atomic_xchg(cnt, 0, sem="relaxed", scope="gpu")   # leave the counter zeroed
                    _s_fixup(ws_ptr, d_ptr, S, ROW0, off_n, M, N, stride_dm, ROWS, BLOCK_N, L)


# runtime ints that vary per call and gain nothing from Triton's ==1 / %16 specialisation: one build per config
# (N and stride_dm stay specialised: N % 16 lets the fixup / epilogue vectorise)
@_jit(do_not_specialize=["M", "K", "S", "KPS", "sfa_sm", "sfa_sk", "sfb_sn", "sfb_sk", "num_progs"])
def _fp8_small_kernel(a_desc, b_desc, d_ptr, ws_ptr, cnt_ptr, sfa_ptr, sfb_ptr, M, N, K, S, KPS, stride_dm,
                      sfa_sm, sfa_sk, sfb_sn, sfb_sk, num_progs,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, NUM_STAGES: gl.constexpr,
                      MATH_REGS: gl.constexpr, SPLIT_MODE: gl.constexpr, SCALE_AHEAD: gl.constexpr):
    """Persistent warp-specialised small-M FP8 GEMM: TMA producer (default partition, 4 warps) + BLOCK_M // 64 math
    warpgroups; items = N tiles x S K-splits (module docstring)."""
    gl.static_assert(BLOCK_M == 64 or BLOCK_M == 128)
    gl.static_assert(BLOCK_N <= 128)
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready, empty = _g_ring_barriers(NUM_STAGES, BLOCK_M // 64)   # empty: one arrive per math warpgroup
    if BLOCK_M == 128:
        gl.warp_specialize([
            (_s_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, N, K, S, KPS, num_progs,
                           BLOCK_N, NUM_STAGES)),
            (_s_math, (a_bufs, b_bufs, ready, empty, d_ptr, ws_ptr, cnt_ptr, sfa_ptr, sfb_ptr, M, N, K, S, KPS,
                       stride_dm, sfa_sm, sfa_sk, sfb_sn, sfb_sk, num_progs, 0, BLOCK_M, BLOCK_N, NUM_STAGES,
                       SPLIT_MODE, SCALE_AHEAD)),
            (_s_math, (a_bufs, b_bufs, ready, empty, d_ptr, ws_ptr, cnt_ptr, sfa_ptr, sfb_ptr, M, N, K, S, KPS,
                       stride_dm, sfa_sm, sfa_sk, sfb_sn, sfb_sk, num_progs, 64, BLOCK_M, BLOCK_N, NUM_STAGES,
                       SPLIT_MODE, SCALE_AHEAD)),
        ], [4, 4], [MATH_REGS, MATH_REGS])
    else:
        gl.warp_specialize([
            (_s_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, N, K, S, KPS, num_progs,
                           BLOCK_N, NUM_STAGES)),
            (_s_math, (a_bufs, b_bufs, ready, empty, d_ptr, ws_ptr, cnt_ptr, sfa_ptr, sfb_ptr, M, N, K, S, KPS,
                       stride_dm, sfa_sm, sfa_sk, sfb_sn, sfb_sk, num_progs, 0, BLOCK_M, BLOCK_N, NUM_STAGES,
                       SPLIT_MODE, SCALE_AHEAD)),
        ], [4], [MATH_REGS])


# ----------------------------------------------------------------------------------------------- host code

def split_plan(num_kb: int, split: int) -> tuple[int, int]:
    """(S, kps): K blocks per split ``kps = ceil(num_kb / split)`` and the splits that get work, ``S = ceil(num_kb /
    kps)`` (so no split is empty)."""
    split = max(1, min(split, num_kb))
    kps = -(-num_kb // split)
    return -(-num_kb // kps), kps


# cost model of pick_config (benchmarks/notes/gemm_small.md): achievable HBM read rate, per-item overhead of the
# persistent loop (epilogue not hidden behind the next item's stream) and the fixed cost of a split (partial store,
# counter round trip, L2 re-read by the last split)
_HBM_BPS = 4.0e12
_L2_BPS = 8.0e12
_T_ITEM_US = 0.25
_T_SPLIT_US = 0.8


def model_us(m: int, n: int, k: int, block_n: int, split: int, num_sms: int) -> float:
    """Modelled kernel time (us) of (BLOCK_N, split): the busiest CTA's bytes (its items x K blocks x the B tile +
    a quarter of the A tile, A being L2-resident) at 1/num_sms of the HBM rate, plus per-item and split costs."""
    bm = 64 if m <= 64 else 128
    num_kb = -(-k // 128)
    s_eff, kps = split_plan(num_kb, split)
    tiles = -(-n // block_n)
    items = tiles * s_eff
    rounds = -(-items // num_sms)
    busiest = rounds * kps * BLOCK_K * (block_n + 0.25 * bm)
    t = busiest * num_sms / _HBM_BPS * 1e6 + rounds * _T_ITEM_US
    if s_eff > 1:
        t += _T_SPLIT_US + 2 * s_eff * m * n * 4 / _L2_BPS * 1e6
    return t


@functools.lru_cache(maxsize=4096)
def pick_config(m: int, n: int, k: int, num_sms: int, mode: str = "fixup") -> SmallConfig:
    """The (BLOCK_N, split) of smallest :func:`model_us` (BLOCK_N 128 first on ties: fewer A re-reads); memoised."""
    bm = 64 if m <= 64 else 128
    num_kb = -(-k // 128)
    best = None
    for bn in (128, 64):
        seen = set()
        for split in range(1, 17):
            s_eff, _ = split_plan(num_kb, split)
            if s_eff in seen or s_eff * m * n >= 2 ** 31:
                continue
            seen.add(s_eff)
            t = model_us(m, n, k, bn, s_eff, num_sms)
            if best is None or t < best[0] - 1e-9:
                best = (t, bn, s_eff)
    _, bn, s = best
    return SmallConfig(bm, bn, split=s, mode=mode)


_COUNTERS: dict = {}
_KEEP: list = []        # every counter buffer ever handed out (a captured CUDA graph may still point at one)
_LAUNCHERS: dict = {}


def _counters(device: torch.device, need: int) -> torch.Tensor:
    """Zeroed int32 counters of the fixup mode, one buffer per (device, current stream): the kernel leaves them
    zeroed, so the buffer is reused across calls and CUDA-graph replays; calls on one stream are ordered, calls on
    different streams get different buffers (two GEMMs running concurrently must not share counters). Graphs
    captured on one stream share that stream's buffer: replay them in stream order (not concurrently). A buffer is
    never freed (a captured graph may hold its address); a call that needs more than the current one (64 Ki counters
    = N up to 2^21 at BLOCK_N 64 and two warpgroups) gets a new, larger one. During a capture on a stream without a
    buffer (no eager call on it yet, e.g. ``torch.cuda.graph``'s default capture stream) the buffer cannot be zeroed
    eagerly: that graph gets a buffer of its own whose zeroing (a memset node) is part of the graph."""
    key = (device.index if device.index is not None else torch.cuda.current_device(),
           torch.cuda.current_stream(device).cuda_stream)
    buf = _COUNTERS.get(key)
    if buf is None or buf.numel() < need:
        if torch.cuda.is_current_stream_capturing():
            buf = torch.zeros(need, dtype=torch.int32, device=device)      # memset captured into this graph
            _KEEP.append(buf)
            return buf
        buf = _COUNTERS[key] = torch.zeros(max(need, 65536), dtype=torch.int32, device=device)
        _KEEP.append(buf)
    return buf


def small_meta(cfg: SmallConfig, split_mode: int) -> dict:
    """Constexprs + compile options of :func:`_fp8_small_kernel` for ``cfg`` (a KernelLauncher's ``meta``)."""
    return dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, NUM_STAGES=cfg.stages(), MATH_REGS=cfg.math_regs,
                SPLIT_MODE=split_mode, SCALE_AHEAD=cfg.scale_ahead, num_warps=4, maxnreg=cfg.maxnreg())


def launch_fp8_gemm_small(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor,
                          cfg: SmallConfig | None = None, num_sms: int | None = None) -> torch.Tensor:
    """``d = (a * sfa) @ (b * sfb)^T`` in BF16 for M <= 128 (module docstring); returns d.

    a ``[M, K]`` / b ``[N, K]`` float8_e4m3fn K-major (stride(-1) == 1, 16-B aligned rows and base; K % 16 == 0);
    sfa ``[M, ceil(K/128)]`` float32 in any layout (read through its strides); sfb ``[ceil(N/128), ceil(K/128)]``
    float32 (any strides); d ``[M, N]`` bfloat16 with stride(-1) == 1 (any row stride). The layouts dense.py passes to
    ``_launch_fp8_gluon``. ``cfg`` None: :func:`pick_config`; ``cfg.block_m`` must cover M (64 for M <= 64, else 128).
    ``num_sms``: persistent grid cap (default: the device's SM count). Raises ValueError / TypeError for bad inputs,
    RuntimeError without Gluon or under ``TRITON_INTERPRET``."""
    _check_small(a, sfa, b, sfb, d)
    m, k = a.shape
    n = b.shape[0]
    if m == 0 or n == 0:
        return d
    if k == 0:
        return d.zero_()
    return _go_small(a, sfa, b, sfb, d, cfg, num_sms or _num_sms(a.device))


def _check_small(a, sfa, b, sfb, d) -> None:
    """The input checks of :func:`launch_fp8_gemm_small` (its docstring): the dense Gluon launchers' shared checks,
    then M <= 128."""
    check_gluon_runnable()
    m, _, _ = check_dense_operands(a, sfa, b, sfb, d)
    if m > 128:
        raise ValueError(f"the small-M kernel covers M <= 128, got M = {m}")


def _geometry(m: int, n: int, k: int, cfg: SmallConfig | None, sms: int):
    """(cfg, S, kps, split_mode, N tiles, grid) of a launch (M, N, K > 0); ValueError for a config that cannot run M."""
    kb = (k + 127) // 128
    cfg = cfg or pick_config(m, n, k, sms)
    if cfg.block_m not in (64, 128) or cfg.block_n not in (64, 128) or m > cfg.block_m or \
            cfg.mode not in ("fixup", "reduce") or cfg.scale_ahead not in (0, 1):
        raise ValueError(f"bad small-M config for M = {m}: {cfg}")
    s_eff, kps = split_plan(kb, cfg.split)
    if s_eff * m * n >= 2 ** 31:   # int32 workspace offsets
        s_eff, kps = 1, kb
    split_mode = 0 if s_eff == 1 else (2 if cfg.mode == "fixup" else 1)
    tiles = (n + cfg.block_n - 1) // cfg.block_n
    return cfg, s_eff, kps, split_mode, tiles, max(1, min(tiles * s_eff, sms))


def _go_small(a, sfa, b, sfb, d, cfg, sms):
    """The launch of :func:`launch_fp8_gemm_small` after its input checks (M, N, K > 0, M <= 128)."""
    m, k = a.shape
    n = b.shape[0]
    cfg, s_eff, kps, split_mode, tiles, progs = _geometry(m, n, k, cfg, sms)
    lay = _smem_layout()
    a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [cfg.block_m, BLOCK_K], lay)
    b_desc = TensorDescriptor(b, [n, k], [b.stride(0), 1], [cfg.block_n, BLOCK_K], lay)
    # unused pointer arguments (no split: ws; no fixup: counters) get sfb: no allocation, no counter buffer
    ws = sfb if s_eff == 1 else torch.empty((s_eff, m, n), dtype=torch.float32, device=d.device)
    cnt = _counters(d.device, tiles * (cfg.block_m // 64)) if split_mode == 2 else sfb
    args = (a_desc, b_desc, d, ws, cnt, sfa, sfb, m, n, k, s_eff, kps, d.stride(0), sfa.stride(0), sfa.stride(1),
            sfb.stride(0), sfb.stride(1), progs)
    launcher = cached_launcher(_LAUNCHERS, _fp8_small_kernel, (cfg, split_mode, spec_key(*args)),
                               lambda: small_meta(cfg, split_mode), cache_descriptors=True)
    launcher((progs, ), *args)
    if split_mode == 1:
        from .dense import _splitk_finish
        _splitk_finish(ws, d, False, s_eff)
    return d


def _fast_desc(t, shape, strides, block, layout):
    """A Gluon host ``TensorDescriptor`` without its ``__post_init__`` asserts (~3 us of host time each): only for a
    :class:`SmallPlan`'s repeat calls, whose signature (dtype, shape, strides, 16-B alignment) equals that of a call
    whose descriptors were built and checked by the real constructor. Same fields, same class (Triton's launcher and
    the descriptor cache read ``base``, ``shape``, ``strides``, ``padding``; the JIT ``block_shape`` / ``layout``)."""
    desc = object.__new__(TensorDescriptor)
    desc.__dict__.update(base=t, shape=shape, strides=strides, block_shape=block, layout=layout, padding="zero")
    return desc


class SmallPlan:
    """The launch of one validated ``dk.fp8_gemm_nt`` call signature on the small-M kernel (dense.py's plan cache,
    as ``_GluonPlan`` for the large-M kernel): geometry, launch integers and constexprs fixed at construction from
    the first call's tensors; a call only builds the two TMA descriptors (real constructor on the first call, the
    unchecked :func:`_fast_desc` afterwards), allocates the split-K workspace (when K is split), fetches the stream's
    counters (fixup mode) and calls its own :class:`deepkernels._launch.KernelLauncher` (descriptor cache on; the
    first call binds it through ``kernel[grid]``), then the separate reduce (``reduce`` mode).

    The caller guarantees that every call has the first call's signature (dense.py: dtype, shape, strides, device and
    16-B alignment of every tensor): then every launch has the same Triton specialisation and the same checks'
    verdicts. Construct only after :func:`launch_fp8_gemm_small`'s checks passed (:meth:`checked` does both)."""

    __slots__ = ("config", "split_mode", "s_eff", "grid", "ints", "ws_shape", "need", "launcher", "layout",
                 "a_shape", "a_strides", "a_block", "b_shape", "b_strides", "b_block", "finish", "mk_desc")

    def __init__(self, a, sfa, b, sfb, d, cfg: SmallConfig | None, sms: int):
        m, k = a.shape
        n = b.shape[0]
        cfg, s_eff, kps, split_mode, tiles, progs = _geometry(m, n, k, cfg, sms)
        self.config, self.split_mode, self.s_eff = cfg, split_mode, s_eff
        self.grid = (progs, )
        self.ints = (m, n, k, s_eff, kps, d.stride(0), sfa.stride(0), sfa.stride(1), sfb.stride(0), sfb.stride(1),
                     progs)
        self.ws_shape = (s_eff, m, n)
        self.need = tiles * (cfg.block_m // 64)
        self.layout = _smem_layout()
        self.a_shape, self.a_strides, self.a_block = [m, k], [a.stride(0), 1], [cfg.block_m, BLOCK_K]
        self.b_shape, self.b_strides, self.b_block = [n, k], [b.stride(0), 1], [cfg.block_n, BLOCK_K]
        self.launcher = KernelLauncher(_fp8_small_kernel, small_meta(cfg, split_mode), cache_descriptors=True)
        self.finish = None
        if split_mode == 1:
            from .dense import _splitk_finish
            self.finish = _splitk_finish
        self.mk_desc = TensorDescriptor

    @classmethod
    def checked(cls, a, sfa, b, sfb, d, cfg: SmallConfig | None = None, num_sms: int | None = None):
        """:func:`launch_fp8_gemm_small`'s checks, then the plan (None for empty work: nothing to launch)."""
        _check_small(a, sfa, b, sfb, d)
        if a.shape[0] == 0 or b.shape[0] == 0 or a.shape[1] == 0:
            return None
        return cls(a, sfa, b, sfb, d, cfg, num_sms or _num_sms(a.device))

    def __call__(self, a, sfa, b, sfb, d) -> None:
        mk, lay = self.mk_desc, self.layout
        a_desc = mk(a, self.a_shape, self.a_strides, self.a_block, lay)
        b_desc = mk(b, self.b_shape, self.b_strides, self.b_block, lay)
        mode = self.split_mode
        if mode == 0:
            ws = cnt = sfb
        else:
            ws = torch.empty(self.ws_shape, dtype=torch.float32, device=d.device)
            cnt = _counters(d.device, self.need) if mode == 2 else sfb
        self.launcher(self.grid, a_desc, b_desc, d, ws, cnt, sfa, sfb, *self.ints)
        if mode == 1:
            self.finish(ws, d, False, self.s_eff)
        self.mk_desc = _fast_desc


def _compile_sm90_small(cfg: SmallConfig, split_mode: int | None = None):
    """Cross-compile :func:`_fp8_small_kernel` for ``cfg`` for sm90 (no GPU needed); ``split_mode`` None: 0 for
    ``cfg.split == 1``, else 2 (fixup) / 1 (reduce). Returns the CompiledKernel."""
    if split_mode is None:
        split_mode = 0 if cfg.split == 1 else (2 if cfg.mode == "fixup" else 1)
    lay = repr(_smem_layout())
    sig = {"a_desc": f"tensordesc<fp8e4nv[{cfg.block_m}, {BLOCK_K}],{lay}>",
           "b_desc": f"tensordesc<fp8e4nv[{cfg.block_n}, {BLOCK_K}],{lay}>",
           "d_ptr": "*bf16", "ws_ptr": "*fp32", "cnt_ptr": "*i32" if split_mode == 2 else "*fp32",
           "sfa_ptr": "*fp32", "sfb_ptr": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", "S": "i32", "KPS": "i32", "stride_dm": "i32",
           "sfa_sm": "i32", "sfa_sk": "i32", "sfb_sn": "i32", "sfb_sk": "i32", "num_progs": "i32"}
    meta = small_meta(cfg, split_mode)
    opts = {"num_warps": meta.pop("num_warps"), "maxnreg": meta.pop("maxnreg")}
    return _compile_sm90_gluon(_fp8_small_kernel, sig, meta, ("d_ptr", "ws_ptr", "cnt_ptr", "sfa_ptr", "sfb_ptr"),
                               **opts)
