"""Sparse top-k MLA prefill, "dense-decode consumer" variant of the warp-specialised Gluon kernel (dispatched:
:data:`DISPATCH`, ``DEEPKERNELS_SPARSE_PREFILL_WS2=0`` / ``=1`` overrides, :func:`dispatch_on`; measured section
"Measured" at the end).

Same contract, arguments and outputs as :func:`_gluon_sparse_prefill._sparse_prefill_gluon_ws_kernel` (read that
module's docstring): one CTA per (query token, 64-head group), the token's top-k KV rows gathered 64 at a time by the
WS kernel's producer (:func:`_gluon_sparse_prefill._g_ws_producer`, imported unchanged: 4 warps, masked cp.async into
a 2-slot ring of ``[64, 512]`` (+ ``[64, 64]`` RoPE) tiles, invalid rows zero-filled and never dereferenced), online
softmax in base 2 with the running max in raw-score units, P rounded to bf16 only as the PV operand, the epilogue of
``_g_finish`` (out = O / (L [+ exp(sink - m)]) in bf16, lse / max_logits in natural-log units, rows without a valid
token: out 0, lse +inf, max_logits -inf). d_qk 576 (D_PE 64) and 512 (D_PE 0), as :func:`supported` accepts.

What differs is the consumer side, which takes the structure of the sparse decode WS2 kernel
(:mod:`._gluon_sparse_decode_ws2`, itself the dense decode kernel's): instead of 8 consumer warps splitting S by token
columns (m64n32 wgmmas, ``warps_per_cta=[4, 2]``, cross-warpgroup row max / sum through shared memory, a CTA-wide
barrier before P V),

* default partition = softmax warpgroup (4 warps), :func:`_p2_softmax_wg`: Q to shared memory once, then per
  64-token block: the block's 64 indices from global memory (validity: ``0 <= idx < s_kv`` and position ``< n``,
  the old consumer's expression; loaded before the ``ready`` wait so the latency hides under it), wait
  ``ready[slot]``, ``fence.proxy.async``, the FULL S = Q K^T (64 x 64, m64n64k16 wgmmas, ``warps_per_cta=[4, 1]``,
  32 NoPE + 4 RoPE k-steps), -inf for invalid tokens, the online softmax (row reductions inside the warpgroup),
  bf16 P + alpha to the PV warpgroup (``pready`` / ``pfree``), ``O[:, :256] = O[:, :256] * alpha + P V[:, :256]``,
  arrive ``empty[slot]``. Epilogue: the row statistics (``_g_finish``'s expressions: lse, max_logits stored here),
  the per-row output scale to the PV warpgroup through the alpha buffer, its half ``out[:, :256]``.
* worker 0 = PV warpgroup (4 warps), :func:`_p2_pv_wg`: per block wait ``ready[slot]`` (already passed: keeps the
  acquire of the producer's copies direct) and ``pready``, ``fence.proxy.async``, alpha, rescale ``O[:, 256:]``,
  ``O[:, 256:] += P V[:, 256:]``, arrive ``pfree`` and ``empty[slot]``; epilogue: the scale, ``out[:, 256:]``.
* worker 1 = the WS producer (4 warps), unchanged.

Barrier protocol (mbarriers; ``j`` = block counter of the CTA, one query token per CTA so no request loop):

1. ``ready[s]`` (count 1): producer -> both consumer warpgroups (each waits parity ``(j // 2) & 1``); the
   producer's per-thread ``cp.async.mbarrier.arrive`` (net zero) + one ordinary arrive, as in the WS kernel.
2. ``empty[s]`` (count 2): one arrive per consumer warpgroup after its P V of the slot completed (the softmax WG's
   after its S and P V: it is also the only reader of the RoPE tile); the producer waits parity ``((j//2)&1)^1``.
3. ``pready`` (count 1): softmax WG -> PV WG, "P and alpha (after the last block: the output scale) are in shared
   memory"; the PV WG waits parity ``j & 1`` (the scale message: ``num_blocks & 1``).
4. ``pfree`` (count 1): PV WG -> softmax WG, "P / alpha read (its P V completed)"; the softmax WG waits parity
   ``(j & 1) ^ 1`` before overwriting P / alpha (and ``(num_blocks & 1) ^ 1`` before writing the scale).

Shared memory (cross-compiled, Triton 3.6, ``metadata.shared``): d_qk 576: Q 64 KB + 8 KB, ring 2 x (64 + 8) KB,
P 8 KB, alpha 256 B, 6 mbarriers: 230,016 B of the 232,448 B limit (the WS kernel: 230,528 B with its
cross-warpgroup reduction scratch); d_qk 512: 205,440 B.

Registers (launch ``maxnreg`` :data:`WS2_MAXNREG` = 168, 12 warps; ``setmaxnreg``: producer
:data:`WS2_PRODUCER_REGS` = 56 (the WS kernel's 40 left 8-26 spill instructions in this kernel's producer loop), PV
warpgroup :data:`WS2_PV_REGS` = 216, softmax warpgroup the rest, 232). ptxas of the
Triton 3.6 wheel, all 6 (d_pe, has_len, has_sink) configurations: 0 spill instructions in the softmax token loop
(~520-560 SASS instructions, 40 / 36 HGMMA), 0 in the PV token loop (4 HGMMA), 0 bytes spill stores in all.

Prediction (H200, s_q 4096, h_q 128, topk 2048; per (CTA, 64-token block)). The WS kernel measures 354-394 TFLOPS =
2 * 64 * 64 * 1088 flop per block / (132 SMs) -> ~1.34-1.49 us per block per SM, and its consumer structure alone
measures ~3.0 us per block in the decode kernel with its (slower) producer -- i.e. in prefill the consumer, with
cp.async gathers cheap enough to hide, is what sets the block time. The WS2 consumers measured 2.14-2.44 us per
block in decode against ~3.0 for the old consumer structure (0.71-0.81x) -- the full m64n64 S reads Q once per
k-step for 64 tokens (half the Q shared-memory traffic of two m64n32 halves), there is no cross-warpgroup reduction
and no CTA-wide barrier, and the PV warpgroup's P V[:, 256:] runs under the softmax warpgroup's next S. Tensor work
per block is 4.46 M MAC = ~2,180 clk at 2,048 MAC/clk/SM (~1.2 us at 1.83 GHz) -- wait: in prefill one CTA per SM
does not run alone: the WS kernel's 224 KB of shared memory allows one CTA per SM, so the per-block time is the
CTA's own. Scaling the WS kernel's per-block time by the decode ratio gives 0.71-0.81 x -> 1.05-1.2 us?  No: the
tensor floor (1.2 us at m64 wgmmas from one warpgroup at a time, S and P V of consecutive blocks overlapping across
the two warpgroups) caps it; predicted ~1.25-1.35 us per block -> 420-470 TFLOPS (1.10-1.25x the WS kernel), with
the producer (4 warps, 72 KB per block from L2 / HBM at ~2.3 us per 2 blocks in flight) next in line. Uncertain:
the producer's cp.async issue shares the SM's issue slots; the index reload in the softmax warpgroup (L1 hit: the
producer just read the same 256 B) is on its critical path only when the ready wait does not cover it.

Not bit-identical to the WS kernel (row sums over 64 columns in one warpgroup instead of 2 x 32 + an add):
tolerance checks only.

Measured (session 16, H200, git 1c39d4c, ``GIT_SHA=1c39d4c bash benchmarks/device_sparse_prefill_ws2.sh``,
results/sparse_prefill_ws2-h200-2026-11-29-s16.json; s_q 4096, h_q 128, d_qk 576, topk 2048, do_bench median):
GPU tests 43/43; s_kv 8K 480.6 / 481.9 TFLOPS (sink / none; WS 403.3 / 403.7: 1.19x), s_kv 64K 430.9 / 433.5 (WS
373.5 / 376.0: 1.15x) -- the predicted 420-470 at its top (8K above it). Per block 2*64*64*1088 flop / 132 SMs ->
~1.1 us at 8K, ~1.2 us at 64K (where the gathers miss L2 more). Against FlashMLA on the same GPU (ANCHORS.md, no
sink): 0.82x / 0.83x; target 640 not reached.

Q by cp.async (session 19, opt-in ``Q_ASYNC``: launcher / compile keyword ``q_async``, default :data:`WS2_Q_ASYNC`
= False; the sparse decode softmax warpgroup's option of the same name, ``_gluon_sparse_decode_ws2._w2_softmax_wg``).
The session-19 ncu profile of the dispatched build (s_q 1024, s_kv 8K, gather_rows4; benchmarks/results/ncu-h200-
2026-11-30-s19/prefill8k_ws2.*) puts 270 cycles per (CTA, block) -- 6.8 % of the 3,951 -- in the softmax
warpgroup's setup, 230 of them the Q load: 9 ``LDG.E.128 -> STS.128`` chunks with a ``BAR.SYNC`` after each (Triton's
barrier between stores to slices of one buffer), ~2 chunks in flight, ~5 exposed DRAM round trips per CTA, while
the PV warpgroup and the producer wait on it. With ``Q_ASYNC`` :func:`_p2_prologue` issues Q as ONE copy of the
``[64, 512]`` NoPE tile (+ the ``[64, 64]`` RoPE tile): 36 (d_qk 576) / 32 (512) unmasked 16-byte cp.async per
thread back to back, one ``commit_group``, one ``wait_group 0``, then (Triton's barrier after the wait,)
``fence.proxy.async`` and the warpgroup barrier the wgmma readers need. Only a q whose base is 16-byte aligned and
whose token / head strides are multiples of 16 elements gets it (:func:`_q_async`; :func:`supported_ws2` admits
no other q, the guard covers direct launches: a 584-element head stride would compile 2-byte cp.async, which does
not exist -- tests/test_review_s18.py); other q keep the plain loads. Results are bit-identical (same bytes in the
same tiles). Compiled (Triton 3.6 wheel, sm90 ptxas, d_qk 576, gather_rows4, no lengths / sink): PTX bar.sync 21 ->
15, SASS LDGSTS 37 -> 73, LDG 60 -> 24, BAR.SYNC 32 -> 26, 2,659 -> 2,627 instructions; the softmax (706), PV
(179) and producer (207) loops unchanged, 0 spills, shared memory unchanged (229,872 B); every configuration alike
(tests/test_gluon_sparse_prefill_ws2.py ``-k q_async``).

Prediction (UNVERIFIED until its device run, ``benchmarks/device_sparse_prefill_qasync.sh``; H200, paired rotated
rounds against the build without it, s_q 4096, h_q 128, topk 2048, s_kv 8K-128K, sink off / on): the Q phase
drops to 1-2 round trips, but S_0 then waits for the producer's first gather (issued at CTA start, ~2,000-2,500
cycles, inference), so the setup goes from 270 to ~80-130 cycles per block: **0.955-0.97 of the kernel time
(central 0.96)** at every s_q (32 blocks per CTA at topk 2048) and s_kv. Falsifier: the paired t / t_off at s_q
4096, s_kv 8K > 0.98, or (ncu) the setup region stays > 150 cycles per block. If the setup shrinks but the first
``ready`` wait grows by as much, the first gather is the floor (next: the producer's block-0 index loads before its
first ``empty`` wait).

Output through shared memory (session 19, opt-in ``O_STAGE``: launcher / compile keyword ``o_stage``, default
:data:`WS2_O_STAGE` = False; the same profile's change 2). The epilogue stores ``out`` straight from the wgmma
accumulator layout: 64 4-byte ``STG.E`` per thread and warpgroup, each at 16 of 32 bytes per sector (the 4.19 M excess
sectors of the profile are all there), and the PV warpgroup's 64 ended the CTA (228 cycles per block, 'lg'
throttle). With ``O_STAGE`` each warpgroup writes its bf16 half ``o * inv`` into its own column half of the Q tile
(``q_n[:, :256]`` / ``q_n[:, 256:]``: dead once the softmax warpgroup's last S completed -- in its token loop, before
it sends the scale message the PV warpgroup waits for) by ``stmatrix`` (as P), a warpgroup barrier, then 16
``ld.shared.v4`` and 16 16-byte ``st.global.v4`` per thread, one 512-byte row half per warp instruction
(:func:`_p2_write_half_staged`). Same bf16 values: bit-identical. Compiled (d_qk 576, gather_rows4, no lengths /
sink): SASS STG 132 -> 36 (32 ``STG.E.128`` + 4 lse / max_logits), STSM 4 -> 36, LDS.128 0 -> 32, BAR.SYNC 32 -> 35,
2,659 -> 2,859 instructions (the 16 row addresses per thread); loops unchanged, 0 spills; shared memory +16 B
(229,888 B: the PV partition captures ``q_n``). Both options together: 2,819 instructions, BAR.SYNC 29.
Prediction (UNVERIFIED, same device run, ``mla_prefill.py --qasync --ostage``): the PV warpgroup's store phase
228 -> 70-120 cycles per block (4x fewer LSU instructions, full sectors, + ~30 of staging), the CTA tail shorter
by 110-160: **0.96-0.975 of the time**; with ``Q_ASYNC`` **0.92-0.945**. Falsifier: paired t / t_off > 0.985 at
s_kv 8K, or (ncu) the PV warpgroup's epilogue 'lg' samples do not fall 2x / L2 store sectors stay 2x ideal.

Removed options (session 18). Two opt-in consumer schedules lived here in sessions 16-17 and were never
dispatched: ``OVERLAP`` (FA3 order: S_j issued before P V_{j-1} with a register P operand, softmax_j under
P V_{j-1}; 1 also lagged the PV warpgroup behind S_j) and ``HALF`` (32-token half-tile ``ready`` / ``empty``
pairs, with any OVERLAP). Both were correct and bit-identical to this schedule on the H200 but slower: paired
t / t_ws2 OVERLAP 1 1.22-1.24, HALF 1.03-1.05, HALF + OVERLAP 1 / 2 1.15-1.19 (results/sparse_prefill_ov-h200-
2026-11-29-s16.json, results/sparse_prefill_half-h200-2026-11-29-s17.json; benchmarks/notes/mla_prefill.md). The
kernels, their design notes (predictions, barrier protocols, SASS facts), tests and device scripts are in git
history: ``git show cb51b03:src/deepkernels/mla/_gluon_sparse_prefill_ws2.py``. Removing them left the cleaned
PTX of every configuration of this kernel (and of the prefill WS3 / WS4 kernels that import its helpers)
byte-identical (``test_default_ptx_unchanged``).
"""
from __future__ import annotations

import os

from .._gluon import (IMPORT_ERROR as _IMPORT_ERROR, available, gl, async_copy,  # noqa: F401
                      fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)
from .._gluon import compile_sm90 as _compile_sm90_gluon, jit as _jit
from .._launch import cached_launcher, spec_key, triton_aligned
from . import _gluon_sparse_prefill as _gsp
from ._gluon_sparse_prefill import BLOCK_H, D_V, WS_MAXNREG, _g_ws_producer, _g_ws_rows, supported

__all__ = ["available", "supported_ws2", "dispatch_on", "launch_sparse_prefill_gluon_ws2", "compile_sm90_ws2",
           "DISPATCH", "WS2_PV_REGS", "WS2_MAXNREG", "WS2_PRODUCER_REGS", "WS2_NUM_WARPS", "WS2_Q_ASYNC",
           "WS2_O_STAGE"]

# launch_sparse_prefill_gluon (variant None) routes here since its first device run (session 16, H200, git 1c39d4c,
# results/sparse_prefill_ws2-h200-2026-11-29-s16.json: 43/43 GPU tests; s_q 4096, h_q 128, topk 2048: 480.6-481.9
# TFLOPS at s_kv 8K (1.19x WS), 430.9-433.5 at 64K (1.15x WS), sink off/on; errors equal to the WS kernel's)
DISPATCH = True
WS2_NUM_WARPS = 4         # the default partition (softmax warpgroup); + 4 PV + 4 producer warps = 12
WS2_MAXNREG = WS_MAXNREG  # 168: 12 warps x 32 x 168 = 64,512 of the 65,536 registers
# setmaxnreg of the producer: the WS kernel's 40 (WS_PRODUCER_REGS) left 8-26 spill instructions in its block loop
# (d_qk 576 / 512 without topk_length); 56 leaves 0 in all configurations, and the consumers still get 216 / 232
WS2_PRODUCER_REGS = 56
WS2_PV_REGS = 216         # setmaxnreg of the PV warpgroup; the softmax warpgroup gets the rest (168 * 3 - 56 - 216)
_LOG2E = 1.4426950408889634

supported_ws2 = supported


def dispatch_on() -> bool:
    """Whether ``_gluon_sparse_prefill.launch_sparse_prefill_gluon`` (variant None) launches this kernel:
    ``DEEPKERNELS_SPARSE_PREFILL_WS2=1`` / ``=0`` (read per call; the device scripts switch it for a whole run),
    else :data:`DISPATCH`."""
    env = os.environ.get("DEEPKERNELS_SPARSE_PREFILL_WS2", "")
    if env in ("0", "1"):
        return env == "1"
    return DISPATCH


# ----------------------------------------------------------------------------------------------- device code

@_jit
def _p2_write_half(o, inv, tok, hb, out_ptr, stride_os, stride_oh, COL0: gl.constexpr, O_L: gl.constexpr):
    """Columns [COL0, COL0 + 256) of the CTA's output rows: ``o * inv`` in bf16 (``_g_finish``'s addressing)."""
    offs_ho = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, O_L))
    offs_d = COL0 + gl.arange(0, 256, gl.SliceLayout(0, O_L))
    o = o * inv[:, None]
    o_rows = out_ptr + tok * stride_os + offs_ho.to(gl.int64)[:, None] * stride_oh
    gl.store(o_rows + offs_d[None, :], o.to(gl.bfloat16))


@_jit
def _p2_write_half_staged(o, inv, tok, hb, out_ptr, stride_os, stride_oh, o_buf, COL0: gl.constexpr,
                          O_L: gl.constexpr):
    """:func:`_p2_write_half` through shared memory (``O_STAGE``): ``o * inv`` in bf16 into ``o_buf`` (this
    warpgroup's ``[64, 256]`` column half of the Q tile, dead after the CTA's last S) in the MMA layout, a warpgroup
    barrier, then read back one 512-byte row half per warp instruction and stored as 16-byte vectors (full 32-byte
    sectors) instead of 4-byte stores at 16 of 32 bytes per sector. Same bf16 values as :func:`_p2_write_half`."""
    LO: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    o = o * inv[:, None]
    o_buf.store(o.to(gl.bfloat16))
    gl.thread_barrier()          # every row of the half written before any warp reads another warp's rows
    ob = o_buf.load(LO)
    offs_ho = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, LO))
    offs_d = COL0 + gl.arange(0, 256, gl.SliceLayout(0, LO))
    o_rows = out_ptr + tok * stride_os + offs_ho.to(gl.int64)[:, None] * stride_oh
    gl.store(o_rows + offs_d[None, :], ob)


@_jit
def _p2_stats(m_i, l_i, tok, hb, sink_ptr, ml_ptr, lse_ptr, sm_scale, H_Q, HAS_SINK: gl.constexpr,
              S_L: gl.constexpr):
    """``_g_finish``'s per-row part (same expressions): stores lse and max_logits (natural-log units; empty rows +inf
    / -inf), returns the output scale 1 / (L [+ exp(sink - m)]) (0 for an empty row)."""
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    offs_h = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, S_L))
    denom = l_safe
    if HAS_SINK:
        sink = gl.load(sink_ptr + offs_h)
        m_nat = gl.where(empty, 0.0, m_i * sm_scale)
        denom = l_safe + gl.exp(sink - m_nat)
    inv = gl.where(empty, 0.0, 1.0 / denom)
    lse = gl.where(empty, float("inf"), m_i * sm_scale + gl.log(l_safe))
    mx = gl.where(empty, float("-inf"), m_i * sm_scale)
    gl.store(lse_ptr + tok * H_Q + offs_h, lse)
    gl.store(ml_ptr + tok * H_Q + offs_h, mx)
    return inv


@_jit
def _p2_prologue(q_n, q_p, q_ptr, idx_ptr, len_ptr, topk, stride_qs, stride_qh, stride_is, H_Q,
                 D_PE: gl.constexpr, HAS_LEN: gl.constexpr, Q_ASYNC: gl.constexpr = False):
    """Every softmax warpgroup's start: this CTA's (query token, 64-head group), its 64 Q rows into shared memory
    in 64-column chunks (32 registers of loads live at a time) made visible to the wgmma proxy, the token's valid
    position count ``n`` and block count, and its index row. Returns (tok, hb, n, num_blocks, idx_row).
    ``Q_ASYNC`` (module docstring, "Q by cp.async"): the chunks as 16-byte cp.async, all in flight, one commit
    group and one ``wait_group 0`` instead of a load -> store round trip per chunk (the launcher sets it only for a
    q whose base and row strides give 16-byte vectors)."""
    LP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    pid = gl.program_id(0)
    tok = (pid // (H_Q // 64)).to(gl.int64)
    hb = pid % (H_Q // 64)
    hq = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, LP))
    dq = gl.arange(0, 64, gl.SliceLayout(0, LP))
    q_rows = q_ptr + tok * stride_qs + hq.to(gl.int64)[:, None] * stride_qh
    if Q_ASYNC:
        dn = gl.arange(0, 512, gl.SliceLayout(0, LP))
        async_copy.async_copy_global_to_shared(q_n, q_rows + dn[None, :])
        if D_PE > 0:
            async_copy.async_copy_global_to_shared(q_p, q_rows + (512 + dq)[None, :])
        async_copy.commit_group()
        async_copy.wait_group(0)     # this thread's copies landed; the fence + barrier below publish them
    else:
        for c in gl.static_range(8):
            q_n.slice(c * 64, 64, dim=1).store(gl.load(q_rows + (c * 64 + dq)[None, :]))
        if D_PE > 0:
            q_p.store(gl.load(q_rows + (512 + dq)[None, :]))
    fence_async_shared()
    gl.thread_barrier()
    n, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    return tok, hb, n, num_blocks, idx_ptr + tok * stride_is


@_jit
def _p2_valid(idx_row, j, n, s_kv, LS: gl.constexpr):
    """Validity of block j's 64 tokens (the WS consumer's expression, inline in :func:`_p2_softmax_wg`; used by
    the prefill WS4 kernel)."""
    offs_n = j * 64 + gl.arange(0, 64, LS)
    idx = gl.load(idx_row + offs_n, mask=offs_n < n, other=-1)
    return (idx >= 0) & (idx < s_kv)


@_jit
def _p2_softmax_wg(q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree, q_ptr, idx_ptr, len_ptr,
                   sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2, stride_qs, stride_qh,
                   stride_is, stride_os, stride_oh, H_Q, D_PE: gl.constexpr, HAS_LEN: gl.constexpr,
                   HAS_SINK: gl.constexpr, Q_ASYNC: gl.constexpr = False, O_STAGE: gl.constexpr = False):
    """Default partition (4 warps): Q, the full S = Q K^T, the online softmax, P + alpha to the PV warpgroup,
    O[:, :256] += P V[:, :256]; epilogue: lse / max_logits, the output scale to the PV warpgroup, out[:, :256].
    ``Q_ASYNC``: :func:`_p2_prologue`'s; ``O_STAGE``: out[:, :256] through ``q_n[:, :256]``
    (:func:`_p2_write_half_staged`; this warpgroup's last S wgmma completed in its token loop)."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    LS: gl.constexpr = gl.SliceLayout(0, S_L)
    tok, hb, n, num_blocks, idx_row = _p2_prologue(q_n, q_p, q_ptr, idx_ptr, len_ptr, topk, stride_qs, stride_qh,
                                                   stride_is, H_Q, D_PE, HAS_LEN, Q_ASYNC)
    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))   # running max of raw q.k
    l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, S_L))
    acc = gl.zeros([64, 256], gl.float32, O_L)
    s_zero = gl.zeros([64, 64], gl.float32, S_L)
    for j in range(num_blocks):
        slot = j % 2
        # validity of the block's tokens (the WS consumer's expression), loaded before the ready wait
        offs_n = j * 64 + gl.arange(0, 64, LS)
        idx = gl.load(idx_row + offs_n, mask=offs_n < n, other=-1)
        valid = (idx >= 0) & (idx < s_kv)
        mbarrier.wait(ready.index(slot), (j // 2) & 1)
        fence_async_shared()     # the cp.async writes (generic proxy) before the wgmma reads (async proxy)
        tok_s = warpgroup_mma(q_n, kv_n.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if D_PE > 0:
            tok_s = warpgroup_mma(q_p, kv_p.index(slot).permute((1, 0)), tok_s, is_async=True)
        s = warpgroup_mma_wait(0, deps=(tok_s, ))
        # online softmax step (_g_softmax's expressions, row reductions inside this warpgroup)
        s = gl.where(valid[None, :], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2((m_i - m_safe) * scale_log2)
        p = gl.exp2((s - m_safe[:, None]) * scale_log2)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        # P and alpha to the PV warpgroup (once it released the previous ones)
        mbarrier.wait(pfree, (j & 1) ^ 1)
        p_smem.store(p.to(gl.bfloat16))
        a_smem.store(alpha)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(pready)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        tok_o = warpgroup_mma(p_smem, kv_n.index(slot).slice(0, 256, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(tok_o, ))
        mbarrier.arrive(empty.index(slot))

    # epilogue: lse / max_logits here, the output scale to the PV warpgroup, own half of the output
    inv = _p2_stats(m_i, l_i, tok, hb, sink_ptr, ml_ptr, lse_ptr, sm_scale, H_Q, HAS_SINK, S_L)
    mbarrier.wait(pfree, (num_blocks & 1) ^ 1)
    a_smem.store(inv)
    gl.thread_barrier()
    mbarrier.arrive(pready)
    if O_STAGE:
        _p2_write_half_staged(acc, gl.convert_layout(inv, gl.SliceLayout(1, O_L)), tok, hb, out_ptr, stride_os,
                              stride_oh, q_n.slice(0, 256, dim=1), 0, O_L)
    else:
        _p2_write_half(acc, gl.convert_layout(inv, gl.SliceLayout(1, O_L)), tok, hb, out_ptr, stride_os, stride_oh,
                       0, O_L)


@_jit
def _p2_pv_wg(kv_n, p_smem, a_smem, ready, empty, pready, pfree, len_ptr, out_ptr, topk, stride_os, stride_oh, H_Q,
              HAS_LEN: gl.constexpr, q_n=None, O_STAGE: gl.constexpr = False):
    """Worker partition (4 warps): O[:, 256:] = O[:, 256:] * alpha + P V[:, 256:] per block; epilogue: the output
    scale from the softmax warpgroup, out[:, 256:]. ``O_STAGE``: out[:, 256:] through ``q_n[:, 256:]``
    (:func:`_p2_write_half_staged`; the scale message comes after the softmax warpgroup's last S completed)."""
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    pid = gl.program_id(0)
    tok = (pid // (H_Q // 64)).to(gl.int64)
    _, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    acc = gl.zeros([64, 256], gl.float32, O_L)
    for j in range(num_blocks):
        slot = j % 2
        mbarrier.wait(ready.index(slot), (j // 2) & 1)    # passed already (the softmax WG sent P after it)
        mbarrier.wait(pready, j & 1)
        fence_async_shared()     # the cp.async V writes (generic proxy) before this warpgroup's wgmma
        alpha = a_smem.load(gl.SliceLayout(1, O_L))
        acc = acc * alpha[:, None]
        tok_o = warpgroup_mma(p_smem, kv_n.index(slot).slice(256, 256, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(tok_o, ))
        mbarrier.arrive(pfree)
        mbarrier.arrive(empty.index(slot))
    mbarrier.wait(pready, num_blocks & 1)
    inv = a_smem.load(gl.SliceLayout(1, O_L))
    pid = gl.program_id(0)
    if O_STAGE:
        _p2_write_half_staged(acc, inv, (pid // (H_Q // 64)).to(gl.int64), pid % (H_Q // 64), out_ptr, stride_os,
                              stride_oh, q_n.slice(256, 256, dim=1), 256, O_L)
    else:
        _p2_write_half(acc, inv, (pid // (H_Q // 64)).to(gl.int64), pid % (H_Q // 64), out_ptr, stride_os,
                       stride_oh, 256, O_L)


@_jit
def _p2_smem(D_PE: gl.constexpr):
    """Shared memory: Q, the 2-slot K (= V) ring, P, the alpha / scale vector; d_qk 576 also the RoPE tiles (d_qk
    512: the NoPE tiles stand in, never read); mbarriers ``ready`` (count 1), ``empty`` (count 2: one arrive per
    consumer warpgroup), ``pready`` / ``pfree`` (count 1), initialised."""
    SH_N: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 512], gl.bfloat16)
    SH_P: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    q_n = gl.allocate_shared_memory(gl.bfloat16, [64, 512], SH_N)
    kv_n = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 512], SH_N)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [64, 64], SH_P)
    if D_PE > 0:
        q_p = gl.allocate_shared_memory(gl.bfloat16, [64, D_PE], SH_P)
        kv_p = gl.allocate_shared_memory(gl.bfloat16, [2, 64, D_PE], SH_P)
    else:
        q_p = q_n
        kv_p = kv_n
    a_smem = gl.allocate_shared_memory(gl.float32, [64], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    pready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    pfree = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)      # one arrive per consumer warpgroup
    mbarrier.init(pready, count=1)
    mbarrier.init(pfree, count=1)
    return q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree


@_jit
def _sparse_prefill_gluon_ws2_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr,
    s_kv, topk, sm_scale, scale_log2,
    stride_qs, stride_qh, stride_kvs, stride_is, stride_os, stride_oh, H_Q,
    D_PE: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, PV_REGS: gl.constexpr, GATHER_ROWS4: gl.constexpr = False,
    Q_ASYNC: gl.constexpr = False, O_STAGE: gl.constexpr = False,
):
    """The WS kernel's arguments (``NUM_SLOTS`` fixed at 2) + ``PV_REGS``, the PV warpgroup's ``setmaxnreg``.
    Partitions: softmax warpgroup (default, 4 warps), PV warpgroup (4), the WS producer (4). ``GATHER_ROWS4``
    (session 18, the launcher's default :data:`WS2_GATHER_ROWS4`): the producer's NoPE gather 4 rows x 8 lanes per
    warp instruction (``_g_ws_producer``'s ``ROWS4``). ``Q_ASYNC`` (session 19, opt-in, the launcher's default
    :data:`WS2_Q_ASYNC`): the softmax warpgroup's Q by one batch of cp.async (module docstring, "Q by cp.async").
    ``O_STAGE`` (session 19, opt-in, :data:`WS2_O_STAGE`): each warpgroup's bf16 output half staged in the dead Q
    tile and stored as 16-byte row vectors (module docstring, "Output through shared memory")."""
    q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree = _p2_smem(D_PE)
    gl.warp_specialize([
        (_p2_softmax_wg, (q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree, q_ptr, idx_ptr,
                          len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2,
                          stride_qs, stride_qh, stride_is, stride_os, stride_oh, H_Q, D_PE, HAS_LEN, HAS_SINK,
                          Q_ASYNC, O_STAGE)),
        (_p2_pv_wg, (kv_n, p_smem, a_smem, ready, empty, pready, pfree, len_ptr, out_ptr, topk, stride_os,
                     stride_oh, H_Q, HAS_LEN, q_n, O_STAGE)),
        (_g_ws_producer, (kv_n, kv_p, ready, empty, kv_ptr, idx_ptr, len_ptr, s_kv, topk, stride_kvs, stride_is,
                          H_Q, D_PE, HAS_LEN, 2, GATHER_ROWS4)),
    ], [4, 4], [PV_REGS, PRODUCER_REGS])


# ----------------------------------------------------------------------------------------------- host code

_CONSTEXPRS = ("D_PE", "HAS_LEN", "HAS_SINK", "PRODUCER_REGS", "PV_REGS", "GATHER_ROWS4", "Q_ASYNC",
               "O_STAGE")   # parameter order
# the NoPE gather 4 rows x 8 lanes per warp instruction (kernel docstring), on since session 18: H200, git
# 1462978aae98, s_q 4096 h_q 128 topk 2048, 6 rotated rounds paired against the 1 row x 32 lanes build: 0.960 at s_kv
# 8K (466.7 -> 482.5 TFLOPS), 0.925 at 64K (406.1 -> 436.7), bit-identical (results/sparse_prefill_r4-h200-2026-11-30-
# s18.json); producer loop 466 -> 206 SASS instructions
WS2_GATHER_ROWS4 = True
# the softmax warpgroup's Q by one batch of cp.async (kernel docstring; module docstring "Q by cp.async"; session 19,
# from the s19 ncu profile's setup region: 270 cycles per block, ~5 exposed DRAM round trips of the 9-chunk Q load).
# On since its device run (session 19, H200, git 6e0329064a26, benchmarks/device_sparse_prefill_qasync.sh, 18/18 GPU
# bit-identity tests, 5 rotated rounds, A/A 1.001-1.012, results/sparse_prefill_qasync-h200-2026-11-30-s19.json):
# alone 0.978-1.002 of the time (predicted 0.955-0.970: falsified), with O_STAGE 0.946-0.965 (O_STAGE alone
# 0.954-0.972) over s_kv 8K-128K, sink off / on -> both on
WS2_Q_ASYNC = True
# each warpgroup's bf16 output half staged in the dead Q tile, then 16-byte row stores (kernel docstring; module
# docstring "Output through shared memory"; session 19, the s19 profile's epilogue: 64 4-byte STG.E per PV thread at
# 16 of 32 bytes per sector, 228 cycles per block). On since the same run: alone 0.954-0.972 (predicted 0.96-0.975)
WS2_O_STAGE = True
_LAUNCHERS: dict = {}   # (kernel, (names, constexprs, options, specialisation)) -> KernelLauncher
_LAUNCHER_LIMIT = 1024


def _q_async(q_async, q=None) -> bool:
    """The Q_ASYNC constexpr: ``q_async`` (default :data:`WS2_Q_ASYNC`), and, given ``q``, only when its base is
    16-byte aligned and its token / head strides are multiples of 16 elements: the 16-byte cp.async needs the
    divisibility Triton only derives for multiples of 16 (a head stride of 584 elements has 16-byte rows, but the
    kernel would compile 2-byte cp.async, which does not exist; tests/test_review_s18.py) -- such q keep the plain
    loads. (:func:`supported_ws2` already admits only such q; this guards direct launches.)"""
    on = bool(WS2_Q_ASYNC if q_async is None else q_async)
    return on and (q is None or triton_aligned(q, *q.stride()[:2]))


def launch_sparse_prefill_gluon_ws2(out, max_logits, lse, q, kv, indices, sm_scale, attn_sink=None,
                                    topk_length=None, *, pv_regs=None, producer_regs=None, maxnreg=None,
                                    gather_rows4=None, q_async=None, o_stage=None):
    """Drop-in for :func:`_gluon_sparse_prefill.launch_sparse_prefill_gluon` (without ``variant``): same
    out-parameter contract (inputs validated by ``flash_mla_sparse_fwd``; last dims contiguous; the caller checked
    :func:`supported_ws2`). Keyword-only tuning knobs (benchmarks): PV / producer ``setmaxnreg``, launch
    ``maxnreg``, ``gather_rows4`` (default :data:`WS2_GATHER_ROWS4`), ``q_async`` (default :data:`WS2_Q_ASYNC`;
    only for a q with 16-byte vectors, :func:`_q_async`), ``o_stage`` (default :data:`WS2_O_STAGE`). Launched
    through a cached
    :class:`deepkernels._launch.KernelLauncher` keyed by (constexpr names, constexprs, options,
    :func:`deepkernels._launch.spec_key` of the arguments)."""
    s_q, h_q, d_qk = q.shape
    if s_q == 0:
        return
    args, ints = _gsp.launch_args(out, max_logits, lse, q, kv, indices, attn_sink, topk_length)
    names = _CONSTEXPRS
    constexprs = (d_qk - D_V, topk_length is not None, attn_sink is not None,
                  producer_regs or WS2_PRODUCER_REGS, pv_regs or WS2_PV_REGS,
                  bool(WS2_GATHER_ROWS4 if gather_rows4 is None else gather_rows4), _q_async(q_async, q),
                  bool(WS2_O_STAGE if o_stage is None else o_stage))
    opts = (WS2_NUM_WARPS, maxnreg or WS2_MAXNREG)
    launcher = cached_launcher(_LAUNCHERS, _sparse_prefill_gluon_ws2_kernel,
                               (names, constexprs, opts, spec_key(*args, *ints)),
                               lambda: dict(zip(names, constexprs), num_warps=opts[0], maxnreg=opts[1]),
                               _LAUNCHER_LIMIT)
    launcher((s_q * (h_q // BLOCK_H), ), *args, float(sm_scale), float(sm_scale) * _LOG2E, *ints)


def compile_sm90_ws2(d_pe: int = 64, has_len: bool = False, has_sink: bool = False, pv_regs=None,
                     producer_regs=None, maxnreg=None, gather_rows4=None, q_async=None, o_stage=None):
    """Cross-compile the kernel for sm90 (no GPU needed) with the divisibility facts of an aligned launch. Returns
    the CompiledKernel (``.asm['ptx']``, ``.metadata.shared``)."""
    # every constexpr, in parameter order (the cross-compile binds constexprs by position)
    consts = dict(zip(_CONSTEXPRS, (d_pe, has_len, has_sink, producer_regs or WS2_PRODUCER_REGS,
                                    pv_regs or WS2_PV_REGS,
                                    bool(WS2_GATHER_ROWS4 if gather_rows4 is None else gather_rows4),
                                    _q_async(q_async), bool(WS2_O_STAGE if o_stage is None else o_stage))))
    return _compile_sm90_gluon(_sparse_prefill_gluon_ws2_kernel, _gsp.SIG, consts, _gsp.HINTED,
                               num_warps=WS2_NUM_WARPS,
                               maxnreg=maxnreg or WS2_MAXNREG)
