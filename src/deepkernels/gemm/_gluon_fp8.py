"""Gluon (``triton.experimental.gluon``, Triton 3.6) FP8 1D2D GEMM main loop for sm90.

``D[M, N] (bf16) = A[M, K] (e4m3, 1x128 per-row scales sfa) @ B[N, K]^T (e4m3, 128x128 block scales sfb)``, the
same semantics as the Triton 1D2D path in :mod:`deepkernels.gemm._fp8_kernels` (no C, BF16 out): for every
128-wide K block ``kb`` the tensor cores produce a fresh FP32 partial ``P = A_kb @ B_kb^T`` and the CUDA cores
promote it, ``acc += P * (sfa[m, kb] * sfb[n // 128, kb])``; D is rounded to BF16 once.

Two kernels (both sm90-only, no interpreter support in Triton 3.6):

* :func:`_fp8_gluon_ws_kernel` — DeepGEMM-style warp specialisation: the default partition (4 warps, few
  registers) is a TMA producer that fills a ``NUM_STAGES``-deep shared-memory ring (A ``[BLOCK_M, 128]`` +
  B ``[BLOCK_N, 128]`` per stage, ``ready``/``empty`` mbarriers); ``BLOCK_M // 64`` math partitions of 4 warps
  (one warpgroup each, 64 rows) run ``warpgroup_mma`` on their 64-row slice of the A stage and promote. With
  ``OVERLAP`` the wgmma of block kb+1 is issued before block kb's partial is waited for (``num_outstanding=1``),
  so the promotion of kb runs while the tensor cores work on kb+1 (3 accumulator-sized register sets per
  thread); without it each partition waits for its own wgmma (DeepGEMM's choice: the other math warpgroup keeps
  the tensor cores busy). Persistent tile loop (grid ``min(tiles, num_sms)``), L2-grouped tile order, masked
  BF16 epilogue from registers. ``EPI_TMA`` (issue #3, configs :data:`GLUON_EPI`, not dispatched, not yet run on a
  GPU): each math warpgroup instead writes its 64 x BLOCK_N BF16 tile to its own 16 KB shared buffer (stmatrix),
  fences, issues a TMA store (two 64 x 64 boxes; partial tiles clipped by the TMA unit) and starts the next tile's
  mainloop at once; it waits for that store (``cp.async.bulk.wait_group.read 0``) only before rewriting the
  buffer one tile later. The kernel's ``d_ptr`` is then a bf16 TensorDescriptor (block [64, BLOCK_N]); a D that
  TMA cannot address (row stride % 8 != 0 or unaligned base) runs the same config with the register epilogue.
  With EPI_TMA off the instruction stream is unchanged (cross-compiled PTX of every pre-existing config compared
  before/after the change, .loc/debug/labels stripped: identical).
* :func:`_fp8_gluon_pipe_kernel` — the simple version: one partition (``BLOCK_M // 16`` warps), one program per
  tile, the TMA ring prefetched ``NUM_STAGES`` blocks ahead inside the K loop, async wgmma with ``wait(1)``.

* :func:`_fp8_gluon_m_contiguous_kernel` — the WS structure for the MoE m-grouped contiguous GEMM (per-tile group
  passes computed on the device from the row ids; padding rows written as zeros).
* :func:`_fp8_gluon_m_masked_kernel` — the WS structure for the m-grouped masked GEMM (tile schedule built on the
  device from ``masked_m``; CUDA-graph replayable).
* ``_fp8_gluon_m_contiguous_epi_kernel`` / ``_fp8_gluon_m_masked_epi_kernel`` — the same two with the TMA-store
  epilogue (``EPI_TMA`` of their math partitions; configs with ``epi_tma=True``, e.g. ``GLUON_WS_128_S6_EPI`` /
  ``GLUON_WS_128_S4_EPI``; not dispatched by default, ``DEEPKERNELS_GROUPED_EPI=1`` in grouped.py; not yet run on
  a GPU). A 64-row warpgroup slice is TMA-stored only where writing all of it is allowed -- contiguous: every row
  of the slice inside D has the pass's group id (or, for the padding pass, a padding id); masked: the slice lies
  wholly below ``masked_m[g]`` (descriptor over D viewed as ``[G * M_max, N]``) -- and goes through the register
  store otherwise, so the written rows and values are those of the register epilogue. Separate entry points (D
  as pointer *and* descriptor) so the register-epilogue kernels' parameter lists and launches are unchanged; their
  cross-compiled PTX (.loc/debug stripped) was compared before/after the change: identical.

Dispatch (measured on the H200, benchmarks/notes/gemm_gluon.md): ``dense.py`` sends 1D2D BF16-out calls with
M >= 1024, K >= 7168 to :func:`_launch_fp8_gluon` (128x128, 4 stages for N <= 2112 else 6); ``grouped.py`` sends
m-grouped contiguous FP8 calls (alignment % 128 == 0, M_sum >= 8192, N >= 4096, K >= 2048) to
:func:`_launch_fp8_gluon_m_contiguous` and masked FP8 calls (expected_m >= 256, N >= 4096, K >= 2048) to
:func:`_launch_fp8_gluon_m_masked`. The launchers take CUDA tensors only and refuse under ``TRITON_INTERPRET=1``;
the public ops' cached plans pass a :class:`deepkernels._launch.KernelLauncher` so repeat calls skip Triton's
per-call argument binding.
v3 candidates that did *not* pay (2026-11-29 15:07 UTC sweep): scale prefetch (``prefetch=True``: within the
run-to-run drift of the plain configs) and 128x256 tiles (0.70x of 128x128: two serial half-wgmmas per K block
plus ~416 B of spills).

Scales ahead (session 19, ``GluonConfig.scale_ahead`` / constexpr ``SCALE_AHEAD``, configs :data:`GLUON_SA`, opt-in
until measured). An ncu profile of the dispatched S4 EPI config at 4096x7168x16384 (benchmarks/notes/profiling.md,
"Gluon FP8 GEMM, 4096x7168x16384 (session 19)"): 777 cycles per 128-wide K block against 512 of tensor work; each
math warpgroup's serial chain per block spends ~133 cycles with its first wgmma waiting on the block's three scale
loads (ptxas put ``FMUL sa*sb`` between ``WARPGROUP.ARRIVE`` and the first ``QGMMA``; the v3 ``prefetch`` build only
moved that wait between QGMMA 1 and 2 through its loop-carried ``sa = sa_n`` copy). ``scale_ahead=1``: block kb's
scales are loaded right after block kb - 2's wgmma issue into one of two alternating register sets, the K loop
unrolled by two (no register copy in front of a wgmma); ptxas then also schedules one block's promotion under the
next block's wgmma. ``scale_ahead=2``: + every block's ``ready`` wait in the previous block's wgmma shadow. Both:
0 spills (sm90 ptxas), same shared memory, D bit-identical to S4 EPI (same products, same FMA order). Prediction
(H200, K >= 7168 at M 4096): 0.78-0.88 of S4 EPI's time (~590-670 cycles per K block; the smaller gain if the TMA fill
shares the 128 B/clk shared-memory bandwidth with the wgmma operand reads: a 640-cycle floor); 2 within +-3 % of 1;
small K (512-2048) less (the epilogue and per-tile costs weigh more). Falsifier: >= 0.95 at 4096x7168x16384 (the
chain was not the limiter). Paired bench: ``benchmarks/gemm_gluon.py --ab --sa`` (``device_gemm_sa.sh``).
Measured (H200, git 3a72eb4f3309, 5 rotated rounds, A/A control; results/gemm_sa-h200-2026-11-30-s19.json): 30/30 GPU
tests bit-identical; t / t_S4_EPI, scale_ahead 1: M 4096 (7168, 16384) 0.923, (4096, 7168) 0.946, (2112, 7168) 0.946,
K <= 2048 0.98-1.02; M 2048 K >= 7168 0.94-0.95 except (2112, 7168) 1.138 (2 waves; A/A 1.02); scale_ahead 2 worse
(0.95-1.09). Prediction 0.78-0.88 missed: ~6-8 % instead of 12-22 % -> dense.py dispatches scale_ahead 1 at M >= 2048,
K >= 7168 with >= 3 waves of tiles. The same K loop (:func:`_g_kloop_ahead`) runs in the grouped TMA-store entries
(contiguous / masked ``SCALE_AHEAD``, configs with ``epi_tma`` only: the register-epilogue fallback drops it);
refactoring the dense loop into that helper left every cross-compiled PTX identical (7 builds compared).

Three math warpgroups (session 19; first GPU run session 20, outcome below; configs
:data:`GLUON_3WG`: ``BLOCK_M`` 192 of :func:`_fp8_gluon_ws_kernel`; not dispatched). The SA1 profile still shows each
math warpgroup waiting on its own wgmma with only the other warpgroup's wgmma to overlap; a full in-warpgroup pipeline
spills at 232-240 registers. Here a CTA computes a 192 x 128 tile with three 64-row math warpgroups, so while one
promotes, two others have wgmmas queued. Triton 3.6 requires power-of-two TMA boxes and shared shapes, so A arrives
as three [64, 128] boxes into three per-warpgroup rings (``_g_math(..., A_OWN=True)`` reads its own ring from row 0);
``empty`` counts 3 arrivals; 4 warpgroups x 128 threads x 128 registers = the whole file, split 3 x 152 + 56 (ptxas:
0 spills, math partitions up to R149 with scale_ahead, 4 stages + 3 epilogue buffers = 213 KB). Results must be
bit-identical to S4 EPI (each row's K blocks, products and FMA order are the same). Prediction (H200, K >= 7168, M
4096, against S6 EPI SA1): per 192-row K block the tensor work is 768 cycles against ~1,050 for 1.5 blocks today, so
0.75-0.85 of the time if shared memory keeps up; the SS wgmma reads (3 x 24 KB) + the 40 KB TMA fill are ~146 B/clk
per tensor-cycle (> 128 B/clk) if the fill shares the bank bandwidth -> ~0.85-0.95; 192-row tiles quantise worse at M
4096 (22 row tiles, 9.3 waves at N 7168 vs 13.6): another +0-4 %. Falsifier: >= 1.0 at 4096x7168x16384. Device run:
``benchmarks/device_gemm_sa.sh`` (its tests and ``--ab --sa`` include these configs).
Outcome (session 20, git f4b6ff9, ``results/gemm_3wg-h200-2026-11-30-s20.json``): the GPU tests pass (71/71 of
``-k "scale_ahead or three_wg"``, D bit-identical to S4 EPI); paired against S6 EPI SA1 (5 rotated rounds, A/A of the
S4 EPI base 0.95-1.07) the 3WG SA1 build is **1.067** at 4096x7168x16384 (falsified: >= 1.0), 1.05-1.11 at the other
K >= 7168 shapes with N >= 4096, better only where its tile count quantises better (4096x2112x7168: 0.944; K 512
0.93-0.96 without SA). Not dispatched; kept as configs for the wave-quantisation case (see ``notes/gemm_gluon.md``).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, replace

import torch

from .._gluon import (IMPORT_ERROR as _IMPORT_ERROR, available, fence_async_shared, gl, mbarrier, tma,
                      warpgroup_mma, warpgroup_mma_wait, TensorDescriptor)
from .._gluon import compile_sm90 as _compile_sm90_gluon, jit as _jit

BLOCK_K = 128  # one scale block of K per stage




@dataclass(frozen=True)
class GluonConfig:
    block_m: int = 128          # 64 or 128 (one 64-row math warpgroup per 64 rows)
    block_n: int = 128          # power of two <= 128 (one scalar sfb per K block)
    num_stages: int = 4
    group_m: int = 8
    warp_spec: bool = True      # producer + BLOCK_M//64 math partitions, persistent
    overlap: bool = True        # issue wgmma kb+1 before promoting kb (wait(1))
    math_regs: int = 232        # setmaxnreg for the math partitions (WS only)
    producer_regs: int = 40     # registers left to the default (TMA producer) partition (WS only)
    prefetch: bool = False      # load block kb+1's scales during block kb (non-overlap WS path)
    epi_tma: bool = False       # epilogue through shared memory + TMA store, not waited for (WS only)
    scale_ahead: int = 0        # 1: scales two blocks ahead, K loop x2 (session 19); 2: + early ready waits

    def name(self) -> str:
        kind = "ws" if self.warp_spec else "pipe"
        return (f"gluon_{kind}_{self.block_m}x{self.block_n}x128_s{self.num_stages}"
                f"{'_ov' if self.overlap else ''}{'_pf' if self.prefetch else ''}{'_epi' if self.epi_tma else ''}"
                f"{f'_sa{self.scale_ahead}' if self.scale_ahead else ''}")

    def num_warps(self) -> int:
        return 4 if self.warp_spec else self.block_m // 16

    def a_box(self) -> int:
        """Rows of A's TMA box: ``block_m``, or 64 for the 192-row three-warpgroup tile (boxes are powers of two)."""
        return 64 if self.block_m == 192 else self.block_m

    def maxnreg(self) -> int | None:
        if not self.warp_spec:
            return None
        n_math = self.block_m // 64
        warpgroups = 1 + n_math
        # default partition gets (maxnreg * all threads - sum(worker regs * worker threads)) / its threads
        return (self.producer_regs + n_math * self.math_regs) // warpgroups // 8 * 8

    def smem_bytes(self) -> int:
        epi = self.block_m * self.block_n * 2 if self.epi_tma else 0  # one bf16 [64, BLOCK_N] buffer per warpgroup
        return self.num_stages * (self.block_m + self.block_n) * BLOCK_K + 2 * 8 * self.num_stages + epi


GLUON_WS_128_S4 = GluonConfig(128, 128, 4, overlap=False)
GLUON_WS_128_S6 = GluonConfig(128, 128, 6, overlap=False)
# v3 candidates: scales of block kb+1 loaded during block kb; 128x256 tiles (two 128-column halves per math
# warpgroup, one partial at a time; ptxas spills ~416 B in the math loop). Measured (H200, 2026-11-29 15:07 UTC,
# results/gemm_gluon-h200-v3-2026-11-29.json): prefetch 0.97-1.03x the plain configs (noise), 128x256 0.53-0.83x;
# neither is dispatched; the 128x256 math partition was removed afterwards (git a9c3bd0 has it).
GLUON_WS_128_S4_PF = GluonConfig(128, 128, 4, overlap=False, prefetch=True)
GLUON_WS_128_S6_PF = GluonConfig(128, 128, 6, overlap=False, prefetch=True)
# swept and timed on the GPU (tests + benchmarks/gemm_gluon.py)
GLUON_CANDIDATES = [GLUON_WS_128_S4, GLUON_WS_128_S6, GLUON_WS_128_S4_PF, GLUON_WS_128_S6_PF]
# lost to the 128x128 ws configs at every M = 4096 shape in the 2026-11-29 sweep
# (results/gemm_gluon-h200-2026-11-29.json): compile tier only
GLUON_RETIRED = [
    GluonConfig(128, 64, 8, overlap=True),
    GluonConfig(64, 128, 8, overlap=False),
    GluonConfig(128, 128, 4, warp_spec=False, overlap=True),
]
GLUON_DEFAULT = GLUON_CANDIDATES[0]
# issue #3, NOT dispatched, not yet run on a GPU: the epilogue goes registers -> per-warpgroup shared buffer (bf16
# [64, 128], 16 KB) -> TMA store that nobody waits for until the same warpgroup's next epilogue, so the math
# warpgroups start the next tile's wgmmas right after issuing the store. 6 stages: 192 KB ring + 32 KB = 224 KB.
# Needs a TMA-able D (16-B aligned base, d.stride(0) % 8 == 0); otherwise the launcher runs the same config with
# the register epilogue.
GLUON_WS_128_S4_EPI = GluonConfig(128, 128, 4, overlap=False, epi_tma=True)
GLUON_WS_128_S6_EPI = GluonConfig(128, 128, 6, overlap=False, epi_tma=True)
GLUON_EPI = [GLUON_WS_128_S4_EPI, GLUON_WS_128_S6_EPI]
# session 19 (module docstring, "Scales ahead"), opt-in until measured: the S4 EPI loop with each block's scales
# loaded two blocks ahead (1) and also every block's ``ready`` wait in the previous block's wgmma shadow (2)
GLUON_WS_128_S4_EPI_SA1 = GluonConfig(128, 128, 4, overlap=False, epi_tma=True, scale_ahead=1)
GLUON_WS_128_S4_EPI_SA2 = GluonConfig(128, 128, 4, overlap=False, epi_tma=True, scale_ahead=2)
# the grouped kernels' TMA-store configs (contiguous: S6 EPI, masked: S4 EPI) with scale_ahead 1 (their EPI entries);
# S6 EPI SA1 is also a dense candidate (6 stages with the earlier scale loads)
GLUON_WS_128_S6_EPI_SA1 = GluonConfig(128, 128, 6, overlap=False, epi_tma=True, scale_ahead=1)
GLUON_SA = [GLUON_WS_128_S4_EPI_SA1, GLUON_WS_128_S4_EPI_SA2, GLUON_WS_128_S6_EPI_SA1]
# session 19 (GPU-verified session 20, not dispatched: 1.05-1.11x the time of S6 EPI SA1 at K >= 7168, module docstring,
# "Three math warpgroups"): 192-row tiles (BLOCK_M 192
# of _fp8_gluon_ws_kernel), three 64-row math warpgroups + the producer warpgroup: 4 x 128 threads x 128 registers =
# the whole register file, split as 3 x 152 (math) + 56 (producer)
GLUON_WS_192_S4_EPI = GluonConfig(192, 128, 4, overlap=False, epi_tma=True, math_regs=152, producer_regs=56)
GLUON_WS_192_S4_EPI_SA1 = GluonConfig(192, 128, 4, overlap=False, epi_tma=True, scale_ahead=1, math_regs=152,
                                      producer_regs=56)
GLUON_3WG = [GLUON_WS_192_S4_EPI, GLUON_WS_192_S4_EPI_SA1]


# ----------------------------------------------------------------------------------------------- device code

@_jit
def _g_ring_barriers(NUM_STAGES: gl.constexpr, EMPTY_COUNT: gl.constexpr):
    """The TMA ring's ``ready`` (count 1: the producer's expect-tx arrive) and ``empty`` (``EMPTY_COUNT``: one arrive
    per math warpgroup) mbarriers, ``NUM_STAGES`` each, allocated and initialised (every GEMM kernel here)."""
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=EMPTY_COUNT)
    return ready, empty


@_jit
def _g_tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
    num_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_in_group
    first_m = group_id * GROUP_M
    group_size = gl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % group_size)
    pid_n = (tile_id % num_in_group) // group_size
    return pid_m, pid_n


@_jit
def _g_load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, slot, off_m, off_n, kb, pred, A_PARTS: gl.constexpr = 1):
    """One ring stage by TMA on ``ready[slot]``: A's tile rows and B. ``A_PARTS`` > 1 (the three-warpgroup kernel:
    TMA boxes and shared shapes must be powers of two): ``a_bufs`` is a tuple of per-warpgroup rings, each loaded with
    the next ``a_desc`` box of rows."""
    bar = ready.index(slot)
    if A_PARTS == 1:
        mbarrier.expect(bar, a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
        tma.async_copy_global_to_shared(a_desc, [off_m, kb * 128], bar, a_bufs.index(slot), pred=pred)
    else:
        BOX: gl.constexpr = a_desc.block_type.shape[0]
        mbarrier.expect(bar, A_PARTS * a_desc.block_type.nbytes + b_desc.block_type.nbytes, pred=pred)
        for i in gl.static_range(A_PARTS):
            tma.async_copy_global_to_shared(a_desc, [off_m + i * BOX, kb * 128], bar, a_bufs[i].index(slot),
                                            pred=pred)
    tma.async_copy_global_to_shared(b_desc, [off_n, kb * 128], bar, b_bufs.index(slot), pred=pred)


@_jit
def _g_store_tile(d_ptr, acc, off_m, off_n, M, N, stride_dm,
                  ROWS: gl.constexpr, BLOCK_N: gl.constexpr, L: gl.constexpr):
    offs_m = off_m + gl.arange(0, ROWS, gl.SliceLayout(1, L))
    offs_n = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(0, L))
    ptrs = d_ptr + offs_m.to(gl.int64)[:, None] * stride_dm + offs_n[None, :]
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    gl.store(ptrs, acc.to(gl.bfloat16), mask=mask)


@_jit
def _g_producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, num_progs,
                BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, NUM_STAGES: gl.constexpr,
                A_PARTS: gl.constexpr = 1):
    """The TMA producer partition: every tile's K blocks into the ring (``A_PARTS``: :func:`_g_load_stage`)."""
    pid = gl.program_id(0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    num_kb = gl.cdiv(K, 128)
    it = 0
    for tile_id in range(pid, num_tiles, num_progs):
        pid_m, pid_n = _g_tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        for kb in range(num_kb):
            slot = it % NUM_STAGES
            phase = (it // NUM_STAGES) & 1
            mbarrier.wait(empty.index(slot), phase ^ 1)  # fresh barriers count as a completed phase 1
            _g_load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, slot, off_m, off_n, kb, True, A_PARTS)
            it += 1


@_jit
def _g_issue(a_bufs, b_bufs, ready, it, zero, ROW0: gl.constexpr, ROWS: gl.constexpr, NUM_STAGES: gl.constexpr):
    """Wait for ring entry ``it`` and issue its wgmma (fresh accumulator) on rows [ROW0, ROW0 + ROWS)."""
    slot = it % NUM_STAGES
    mbarrier.wait(ready.index(slot), (it // NUM_STAGES) & 1)
    return warpgroup_mma(a_bufs.index(slot).slice(ROW0, ROWS), b_bufs.index(slot).permute((1, 0)), zero,
                         use_acc=False, is_async=True)


@_jit
def _g_retire(tok, NUM_OUT: gl.constexpr, acc, empty, it, sfa_rows, m_mask, sfa_sk, sfb_base, sfb_sk, kb,
              NUM_STAGES: gl.constexpr):
    """Wait until at most NUM_OUT wgmmas are in flight (so ``tok``, K block ``kb`` = ring entry ``it``, is done),
    hand its ring slot back to the producer and promote its partial into ``acc``."""
    sa = gl.load(sfa_rows + kb * sfa_sk, mask=m_mask, other=0.0)
    sb = gl.load(sfb_base + kb * sfb_sk)
    part = warpgroup_mma_wait(NUM_OUT, deps=(tok, ))
    mbarrier.arrive(empty.index(it % NUM_STAGES))
    return acc + part * (sa * sb)[:, None]


@_jit
def _g_kloop(a_bufs, b_bufs, ready, empty, it, zero, acc, sfa_rows, m_mask, sfa_sk, sfb_base, sfb_sk, num_kb,
             ROW0: gl.constexpr, ROWS: gl.constexpr, NUM_STAGES: gl.constexpr):
    """The plain K loop of one math warpgroup (dense and masked kernels): per 128-wide K block load its scales, wait
    for the stage, issue the wgmma, wait for it, release the stage, promote. Returns ``(acc, it)``."""
    for kb in range(num_kb):
        sa = gl.load(sfa_rows + kb * sfa_sk, mask=m_mask, other=0.0)
        sb = gl.load(sfb_base + kb * sfb_sk)
        slot = it % NUM_STAGES
        mbarrier.wait(ready.index(slot), (it // NUM_STAGES) & 1)
        tok = warpgroup_mma(a_bufs.index(slot).slice(ROW0, ROWS), b_bufs.index(slot).permute((1, 0)),
                            zero, use_acc=False, is_async=True)
        part = warpgroup_mma_wait(0, deps=(tok, ))
        mbarrier.arrive(empty.index(slot))
        acc += part * (sa * sb)[:, None]
        it += 1
    return acc, it


@_jit
def _g_kloop_ahead(a_bufs, b_bufs, ready, empty, it, zero, acc, sfa_rows, m_mask, sfa_sk, sfb_base, sfb_sk, num_kb,
                   ROW0: gl.constexpr, ROWS: gl.constexpr, NUM_STAGES: gl.constexpr, EARLY: gl.constexpr):
    """The K loop of one math warpgroup with ``SCALE_AHEAD`` (module docstring, "Scales ahead"): block kb's scales
    loaded right after block kb - 2's wgmma issue into one of two alternating register sets (the loop unrolled by
    two: no register copy in front of a wgmma); ``EARLY``: every block's ``ready`` wait in the previous block's wgmma
    shadow. Returns ``(acc, it)``."""
    kb1 = gl.minimum(num_kb - 1, 1)
    sa0 = gl.load(sfa_rows, mask=m_mask, other=0.0)
    sb0 = gl.load(sfb_base)
    sa1 = gl.load(sfa_rows + kb1 * sfa_sk, mask=m_mask, other=0.0)
    sb1 = gl.load(sfb_base + kb1 * sfb_sk)
    if EARLY:
        mbarrier.wait(ready.index(it % NUM_STAGES), (it // NUM_STAGES) & 1)
    for kb in range(0, num_kb - 1, 2):
        # block kb (register set 0)
        slot = it % NUM_STAGES
        if not EARLY:
            mbarrier.wait(ready.index(slot), (it // NUM_STAGES) & 1)
        tok = warpgroup_mma(a_bufs.index(slot).slice(ROW0, ROWS), b_bufs.index(slot).permute((1, 0)),
                            zero, use_acc=False, is_async=True)
        s0 = sa0 * sb0
        kn = gl.minimum(kb + 2, num_kb - 1)
        sa0 = gl.load(sfa_rows + kn * sfa_sk, mask=m_mask, other=0.0)
        sb0 = gl.load(sfb_base + kn * sfb_sk)
        if EARLY:
            mbarrier.wait(ready.index((it + 1) % NUM_STAGES), ((it + 1) // NUM_STAGES) & 1)
        part = warpgroup_mma_wait(0, deps=(tok, ))
        mbarrier.arrive(empty.index(slot))
        acc += part * s0[:, None]
        it += 1
        # block kb + 1 (register set 1)
        slot = it % NUM_STAGES
        if not EARLY:
            mbarrier.wait(ready.index(slot), (it // NUM_STAGES) & 1)
        tok = warpgroup_mma(a_bufs.index(slot).slice(ROW0, ROWS), b_bufs.index(slot).permute((1, 0)),
                            zero, use_acc=False, is_async=True)
        s1 = sa1 * sb1
        kn = gl.minimum(kb + 3, num_kb - 1)
        sa1 = gl.load(sfa_rows + kn * sfa_sk, mask=m_mask, other=0.0)
        sb1 = gl.load(sfb_base + kn * sfb_sk)
        if EARLY:
            mbarrier.wait(ready.index((it + 1) % NUM_STAGES), ((it + 1) // NUM_STAGES) & 1,
                          pred=kb + 2 < num_kb)
        part = warpgroup_mma_wait(0, deps=(tok, ))
        mbarrier.arrive(empty.index(slot))
        acc += part * s1[:, None]
        it += 1
    if num_kb % 2 == 1:      # the last block (set 0: loaded by the last pair, or before the loop)
        slot = it % NUM_STAGES
        if not EARLY:
            mbarrier.wait(ready.index(slot), (it // NUM_STAGES) & 1)
        tok = warpgroup_mma(a_bufs.index(slot).slice(ROW0, ROWS), b_bufs.index(slot).permute((1, 0)),
                            zero, use_acc=False, is_async=True)
        s0 = sa0 * sb0
        part = warpgroup_mma_wait(0, deps=(tok, ))
        mbarrier.arrive(empty.index(slot))
        acc += part * s0[:, None]
        it += 1
    return acc, it


@_jit
def _g_math(a_bufs, b_bufs, ready, empty, d_ptr, sfa_ptr, sfb_ptr, M, N, K, stride_dm,
            sfa_sm, sfa_sk, sfb_sn, sfb_sk, num_progs,
            ROW0: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
            NUM_STAGES: gl.constexpr, OVERLAP: gl.constexpr, PREFETCH: gl.constexpr, EPI_TMA: gl.constexpr = False,
            SCALE_AHEAD: gl.constexpr = 0, A_OWN: gl.constexpr = False):
    """One math warpgroup: rows [ROW0, ROW0 + 64) of every BLOCK_M tile.

    ``A_OWN`` (the three-warpgroup build, ``BLOCK_M`` 192 of :func:`_fp8_gluon_ws_kernel`): ``a_bufs`` is this
    warpgroup's own [NUM_STAGES, 64, 128] A ring (read from row 0) instead of the tile's [NUM_STAGES, BLOCK_M, 128] ring (read from
    row ROW0); plain and scale-ahead K loops only.

    ``SCALE_AHEAD`` (module docstring, "Scales ahead"): 1 = block kb's scales are loaded two blocks earlier, right
    after block kb - 2's wgmma issue, the K loop unrolled by two so no loop-carried register copy sits in front of a
    wgmma (two alternating register sets); 2 = the same + every block's ``ready`` wait issued in the previous
    block's wgmma shadow (predicated on the block being in this tile).

    ``EPI_TMA``: ``d_ptr`` is the tuple ``(d_desc, epi_buf)`` — D's TensorDescriptor (bf16, block [64, BLOCK_N]) and
    this warpgroup's own shared [64, BLOCK_N] bf16 buffer; the tile goes registers -> buffer -> TMA store (rows and
    columns outside D clipped by the TMA unit), and the store is waited for only before the buffer is overwritten
    by the next tile's epilogue (``tma.store_wait(0)``; by then a whole mainloop has passed) and once at the end."""
    ROWS: gl.constexpr = 64
    L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                instr_shape=[16, BLOCK_N, 32])
    pid = gl.program_id(0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    num_kb = gl.cdiv(K, 128)
    zero = gl.zeros([ROWS, BLOCK_N], gl.float32, L)
    it = 0
    for tile_id in range(pid, num_tiles, num_progs):
        pid_m, pid_n = _g_tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M + ROW0
        off_n = pid_n * BLOCK_N
        offs_m = off_m + gl.arange(0, ROWS, gl.SliceLayout(1, L))
        m_mask = offs_m < M
        sfa_rows = sfa_ptr + offs_m.to(gl.int64) * sfa_sm
        sfb_base = sfb_ptr + (off_n // 128).to(gl.int64) * sfb_sn
        acc = gl.zeros([ROWS, BLOCK_N], gl.float32, L)
        if OVERLAP:
            # Unrolled by two so that no in-flight accumulator is ever copied (a loop-carried "prev = cur"
            # makes ptxas serialise every wgmma, C7514): tok_a is dead before it is redefined.
            tok_a = _g_issue(a_bufs, b_bufs, ready, it, zero, ROW0, ROWS, NUM_STAGES)
            for kb in range(1, num_kb - 1, 2):
                tok_b = _g_issue(a_bufs, b_bufs, ready, it + 1, zero, ROW0, ROWS, NUM_STAGES)
                acc = _g_retire(tok_a, 1, acc, empty, it, sfa_rows, m_mask, sfa_sk, sfb_base, sfb_sk, kb - 1,
                                NUM_STAGES)
                tok_a = _g_issue(a_bufs, b_bufs, ready, it + 2, zero, ROW0, ROWS, NUM_STAGES)
                acc = _g_retire(tok_b, 1, acc, empty, it + 1, sfa_rows, m_mask, sfa_sk, sfb_base, sfb_sk, kb,
                                NUM_STAGES)
                it += 2
            if (num_kb - 1) % 2 == 1:
                tok_b = _g_issue(a_bufs, b_bufs, ready, it + 1, zero, ROW0, ROWS, NUM_STAGES)
                acc = _g_retire(tok_a, 1, acc, empty, it, sfa_rows, m_mask, sfa_sk, sfb_base, sfb_sk,
                                num_kb - 2, NUM_STAGES)
                acc = _g_retire(tok_b, 0, acc, empty, it + 1, sfa_rows, m_mask, sfa_sk, sfb_base, sfb_sk,
                                num_kb - 1, NUM_STAGES)
                it += 2
            else:
                acc = _g_retire(tok_a, 0, acc, empty, it, sfa_rows, m_mask, sfa_sk, sfb_base, sfb_sk,
                                num_kb - 1, NUM_STAGES)
                it += 1
        elif SCALE_AHEAD > 0:
            acc, it = _g_kloop_ahead(a_bufs, b_bufs, ready, empty, it, zero, acc, sfa_rows, m_mask, sfa_sk,
                                     sfb_base, sfb_sk, num_kb, 0 if A_OWN else ROW0, ROWS, NUM_STAGES,
                                     SCALE_AHEAD == 2)
        elif PREFETCH:
            # scales of block kb+1 are loaded while block kb's wgmma runs (global-load latency off the path
            # between the wgmma wait and the promotion)
            sa = gl.load(sfa_rows, mask=m_mask, other=0.0)
            sb = gl.load(sfb_base)
            for kb in range(num_kb):
                kn = gl.minimum(kb + 1, num_kb - 1)
                sa_n = gl.load(sfa_rows + kn * sfa_sk, mask=m_mask, other=0.0)
                sb_n = gl.load(sfb_base + kn * sfb_sk)
                slot = it % NUM_STAGES
                mbarrier.wait(ready.index(slot), (it // NUM_STAGES) & 1)
                tok = warpgroup_mma(a_bufs.index(slot).slice(ROW0, ROWS), b_bufs.index(slot).permute((1, 0)),
                                    zero, use_acc=False, is_async=True)
                part = warpgroup_mma_wait(0, deps=(tok, ))
                mbarrier.arrive(empty.index(slot))
                acc += part * (sa * sb)[:, None]
                sa = sa_n
                sb = sb_n
                it += 1
        else:
            acc, it = _g_kloop(a_bufs, b_bufs, ready, empty, it, zero, acc, sfa_rows, m_mask, sfa_sk, sfb_base,
                               sfb_sk, num_kb, 0 if A_OWN else ROW0, ROWS, NUM_STAGES)
        if EPI_TMA:
            tma.store_wait(0)        # this warpgroup's previous tile has left the buffer (issued a mainloop ago)
            gl.thread_barrier()      # ... and every thread of the warpgroup knows it before writing the buffer
            d_ptr[1].store(acc.to(gl.bfloat16))
            fence_async_shared()     # generic-proxy writes visible to the TMA (async proxy)
            gl.thread_barrier()
            tma.async_copy_shared_to_global(d_ptr[0], [off_m, off_n], d_ptr[1])
        else:
            _g_store_tile(d_ptr, acc, off_m, off_n, M, N, stride_dm, ROWS, BLOCK_N, L)
    if EPI_TMA:
        tma.store_wait(0)            # the buffer must outlive the last store's shared-memory reads


@_jit
def _fp8_gluon_ws_kernel(a_desc, b_desc, d_ptr, sfa_ptr, sfb_ptr, M, N, K, stride_dm,
                         sfa_sm, sfa_sk, sfb_sn, sfb_sk, num_progs,
                         BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
                         NUM_STAGES: gl.constexpr, OVERLAP: gl.constexpr, MATH_REGS: gl.constexpr,
                         PREFETCH: gl.constexpr = False, EPI_TMA: gl.constexpr = False,
                         SCALE_AHEAD: gl.constexpr = 0):
    """Persistent warp-specialised FP8 1D2D GEMM: TMA producer (default partition) + BLOCK_M//64 math
    warpgroups (worker partitions, 4 warps each). ``EPI_TMA``: ``d_ptr`` is a TensorDescriptor of D (bf16, block
    [64, BLOCK_N]) instead of a pointer, and each math warpgroup stores through its own shared buffer + TMA.
    ``BLOCK_M`` 192 (session 19, GPU-tested session 20, not dispatched; module docstring, "Three math warpgroups"):
    three math warpgroups; TMA boxes and shared shapes must be powers of two, so ``a_desc``'s block is [64, 128] and each warpgroup owns an A
    ring (and epilogue buffer), read from row 0 (``_g_math(..., A_OWN=True)``)."""
    gl.static_assert(BLOCK_M == 64 or BLOCK_M == 128 or BLOCK_M == 192)
    gl.static_assert(BLOCK_N <= 128)
    if BLOCK_M == 192:
        gl.static_assert(not OVERLAP and not PREFETCH)
        a_bufs = (gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape, a_desc.layout),
                  gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape, a_desc.layout),
                  gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape, a_desc.layout))
    else:
        a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES] + b_desc.block_type.shape, b_desc.layout)
    if EPI_TMA:
        gl.static_assert(not OVERLAP and not PREFETCH)
        if BLOCK_M == 192:
            d_0 = (d_ptr, gl.allocate_shared_memory(d_ptr.dtype, d_ptr.block_type.shape, d_ptr.layout))
            d_1 = (d_ptr, gl.allocate_shared_memory(d_ptr.dtype, d_ptr.block_type.shape, d_ptr.layout))
            d_2 = (d_ptr, gl.allocate_shared_memory(d_ptr.dtype, d_ptr.block_type.shape, d_ptr.layout))
        else:
            epi = gl.allocate_shared_memory(d_ptr.dtype, [BLOCK_M // 64] + d_ptr.block_type.shape, d_ptr.layout)
            d_0 = (d_ptr, epi.index(0))
            d_1 = (d_ptr, epi.index(BLOCK_M // 64 - 1))
    else:
        d_0 = d_ptr
        d_1 = d_ptr
        d_2 = d_ptr
    ready, empty = _g_ring_barriers(NUM_STAGES, BLOCK_M // 64)   # empty: one arrive per math warpgroup
    if BLOCK_M == 192:
        gl.warp_specialize([
            (_g_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, num_progs, BLOCK_M, BLOCK_N,
                           GROUP_M, NUM_STAGES, 3)),
            (_g_math, (a_bufs[0], b_bufs, ready, empty, d_0, sfa_ptr, sfb_ptr, M, N, K, stride_dm, sfa_sm, sfa_sk,
                       sfb_sn, sfb_sk, num_progs, 0, BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES, False, False, EPI_TMA,
                       SCALE_AHEAD, True)),
            (_g_math, (a_bufs[1], b_bufs, ready, empty, d_1, sfa_ptr, sfb_ptr, M, N, K, stride_dm, sfa_sm, sfa_sk,
                       sfb_sn, sfb_sk, num_progs, 64, BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES, False, False, EPI_TMA,
                       SCALE_AHEAD, True)),
            (_g_math, (a_bufs[2], b_bufs, ready, empty, d_2, sfa_ptr, sfb_ptr, M, N, K, stride_dm, sfa_sm, sfa_sk,
                       sfb_sn, sfb_sk, num_progs, 128, BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES, False, False, EPI_TMA,
                       SCALE_AHEAD, True)),
        ], [4, 4, 4], [MATH_REGS, MATH_REGS, MATH_REGS])
    elif BLOCK_M == 128:
        gl.warp_specialize([
            (_g_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, num_progs,
                           BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES)),
            (_g_math, (a_bufs, b_bufs, ready, empty, d_0, sfa_ptr, sfb_ptr, M, N, K, stride_dm,
                       sfa_sm, sfa_sk, sfb_sn, sfb_sk, num_progs, 0, BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES,
                       OVERLAP, PREFETCH, EPI_TMA, SCALE_AHEAD)),
            (_g_math, (a_bufs, b_bufs, ready, empty, d_1, sfa_ptr, sfb_ptr, M, N, K, stride_dm,
                       sfa_sm, sfa_sk, sfb_sn, sfb_sk, num_progs, 64, BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES,
                       OVERLAP, PREFETCH, EPI_TMA, SCALE_AHEAD)),
        ], [4, 4], [MATH_REGS, MATH_REGS])
    else:
        gl.warp_specialize([
            (_g_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, M, N, K, num_progs,
                           BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES)),
            (_g_math, (a_bufs, b_bufs, ready, empty, d_0, sfa_ptr, sfb_ptr, M, N, K, stride_dm,
                       sfa_sm, sfa_sk, sfb_sn, sfb_sk, num_progs, 0, BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES,
                       OVERLAP, PREFETCH, EPI_TMA, SCALE_AHEAD)),
        ], [4], [MATH_REGS])


@_jit
def _fp8_gluon_pipe_kernel(a_desc, b_desc, d_ptr, sfa_ptr, sfb_ptr, M, N, K, stride_dm,
                           sfa_sm, sfa_sk, sfb_sn, sfb_sk,
                           BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
                           NUM_STAGES: gl.constexpr, num_warps: gl.constexpr):
    """Single-partition version: one tile per program, TMA ring NUM_STAGES blocks ahead, wgmma kb+1 issued
    before kb's promotion (wait(1))."""
    gl.static_assert(BLOCK_N <= 128)
    L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                instr_shape=[16, BLOCK_N, 32])
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(ready.index(i), count=1)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _g_tile_coords(gl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    off_m = pid_m * BLOCK_M
    off_n = pid_n * BLOCK_N
    num_kb = gl.cdiv(K, 128)
    for i in gl.static_range(NUM_STAGES):
        _g_load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, i, off_m, off_n, i, i < num_kb)

    offs_m = off_m + gl.arange(0, BLOCK_M, gl.SliceLayout(1, L))
    m_mask = offs_m < M
    sfa_rows = sfa_ptr + offs_m.to(gl.int64) * sfa_sm
    sfb_base = sfb_ptr + (off_n // 128).to(gl.int64) * sfb_sn
    zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, L)
    acc = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, L)

    mbarrier.wait(ready.index(0), 0)
    prev = warpgroup_mma(a_bufs.index(0), b_bufs.index(0).permute((1, 0)), zero, use_acc=False, is_async=True)
    for kb in range(1, num_kb):
        sa = gl.load(sfa_rows + (kb - 1) * sfa_sk, mask=m_mask, other=0.0)
        sb = gl.load(sfb_base + (kb - 1) * sfb_sk)
        slot = kb % NUM_STAGES
        mbarrier.wait(ready.index(slot), (kb // NUM_STAGES) & 1)
        cur = warpgroup_mma(a_bufs.index(slot), b_bufs.index(slot).permute((1, 0)), zero, use_acc=False,
                            is_async=True)
        part = warpgroup_mma_wait(1, deps=(prev, ))
        # block kb-1 is done: refill its slot with block kb-1+NUM_STAGES
        nxt = kb - 1 + NUM_STAGES
        _g_load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, (kb - 1) % NUM_STAGES, off_m, off_n, nxt,
                      nxt < num_kb)
        acc += part * (sa * sb)[:, None]
        prev = cur
    sa = gl.load(sfa_rows + (num_kb - 1) * sfa_sk, mask=m_mask, other=0.0)
    sb = gl.load(sfb_base + (num_kb - 1) * sfb_sk)
    part = warpgroup_mma_wait(0, deps=(prev, ))
    acc += part * (sa * sb)[:, None]
    for i in gl.static_range(NUM_STAGES):
        mbarrier.invalidate(ready.index(i))
    _g_store_tile(d_ptr, acc, off_m, off_n, M, N, stride_dm, BLOCK_M, BLOCK_N, L)


# ------------------------------------------------------------------- m-grouped contiguous (MoE) on the WS loop
# D[i] = A[i] @ B[gid[i]].T for 0 <= gid[i] < G, exact zeros for the other (padding) rows. Same producer /
# math-warpgroup structure as _fp8_gluon_ws_kernel; B is one TMA descriptor over the flattened [G*N, K]. Per
# tile, every partition computes the same sequence of *passes* from the tile's row ids (the smallest group id
# >= g_lo among the tile's rows, then the next, ...): one pass per group present, so a tile that mixes groups
# (a layout breaking the 128-row alignment) still gives the reference result; the math warpgroups store only
# their rows of the pass's group, then write zeros to padding rows. No host read of the layout.


@_jit
def _gc_tile_group(gid_ptr, off_m, M, G, g_lo, BLOCK_M: gl.constexpr):
    """Smallest group id >= g_lo among rows [off_m, off_m + BLOCK_M) (ids outside [0, G) are padding), or G."""
    LG: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    offs = off_m + gl.arange(0, BLOCK_M, LG)
    ids = gl.load(gid_ptr + offs, mask=offs < M, other=-1)
    ids = gl.where((ids >= g_lo) & (ids < G), ids, G)
    return gl.min(ids, axis=0)


@_jit
def _gc_store_rows(d_ptr, acc, gid_ptr, off_m, off_n, M, N, G, g, stride_dm,
                   ROWS: gl.constexpr, BLOCK_N: gl.constexpr, L: gl.constexpr):
    """Store ``acc`` (BF16) into the rows of [off_m, off_m + ROWS) whose id is ``g``; ``g = -1``: into the padding
    rows (ids outside [0, G)). Offsets and masks are built here, after the main loop (not live across it)."""
    offs_m = off_m + gl.arange(0, ROWS, gl.SliceLayout(1, L))
    offs_n = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(0, L))
    m_mask = offs_m < M
    ids = gl.load(gid_ptr + offs_m, mask=m_mask, other=0)
    if g >= 0:
        rows = m_mask & (ids == g)
    else:
        rows = m_mask & ((ids < 0) | (ids >= G))
    ptrs = d_ptr + offs_m.to(gl.int64)[:, None] * stride_dm + offs_n[None, :]
    gl.store(ptrs, acc.to(gl.bfloat16), mask=rows[:, None] & (offs_n < N)[None, :])


@_jit
def _g_epi_store(desc, buf, acc, row, col):
    """EPI_TMA store of one 64-row warpgroup tile of the grouped kernels (the dense kernel's sequence): wait until
    this warpgroup's previous TMA store has read ``buf`` (issued one pass/tile ago), write ``acc`` (BF16) to ``buf``,
    fence the generic-proxy writes for the async proxy, issue ``buf`` -> D[row:, col:] (rows / columns outside the
    descriptor's shape clipped by the TMA unit). Nobody waits for the store here."""
    tma.store_wait(0)
    gl.thread_barrier()
    buf.store(acc.to(gl.bfloat16))
    fence_async_shared()
    gl.thread_barrier()
    tma.async_copy_shared_to_global(desc, [row, col], buf)


@_jit
def _gc_store_rows_epi(d, acc, gid_ptr, off_m, off_n, M, N, G, g, stride_dm,
                       ROWS: gl.constexpr, BLOCK_N: gl.constexpr, L: gl.constexpr):
    """:func:`_gc_store_rows` for EPI_TMA (``d`` = (D pointer, D descriptor, this warpgroup's shared buffer)): the
    same 64 row ids are loaded; if every row of the slice that lies inside D has id ``g`` (``g = -1``: every one is
    a padding id) -- one max-reduction of the mismatches, row ids are not assumed sorted -- nothing else may be
    written there and the slice goes through the TMA store; otherwise the masked register store of
    :func:`_gc_store_rows` (all-false mask when no row matches, as there)."""
    offs_m = off_m + gl.arange(0, ROWS, gl.SliceLayout(1, L))
    m_mask = offs_m < M
    ids = gl.load(gid_ptr + offs_m, mask=m_mask, other=0)
    if g >= 0:
        rows = m_mask & (ids == g)
    else:
        rows = m_mask & ((ids < 0) | (ids >= G))
    others = gl.max((m_mask & (rows == 0)).to(gl.int32), axis=0)  # 1: a row of D in the slice is not ours
    if (others == 0) & (off_m < M):
        _g_epi_store(d[1], d[2], acc, off_m, off_n)
    else:
        offs_n = off_n + gl.arange(0, BLOCK_N, gl.SliceLayout(0, L))
        ptrs = d[0] + offs_m.to(gl.int64)[:, None] * stride_dm + offs_n[None, :]
        gl.store(ptrs, acc.to(gl.bfloat16), mask=rows[:, None] & (offs_n < N)[None, :])


@_jit
def _gc_producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, gid_ptr, M, N, K, G, num_progs,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, NUM_STAGES: gl.constexpr):
    pid = gl.program_id(0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    num_kb = gl.cdiv(K, 128)
    it = 0
    for tile_id in range(pid, num_tiles, num_progs):
        pid_m, pid_n = _g_tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        g = _gc_tile_group(gid_ptr, off_m, M, G, 0, BLOCK_M)
        while g < G:
            b_row = g * N + off_n
            for kb in range(num_kb):
                slot = it % NUM_STAGES
                mbarrier.wait(empty.index(slot), ((it // NUM_STAGES) & 1) ^ 1)
                _g_load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, slot, off_m, b_row, kb, True)
                it += 1
            g = _gc_tile_group(gid_ptr, off_m, M, G, g + 1, BLOCK_M)


@_jit
def _gc_math(a_bufs, b_bufs, ready, empty, d_ptr, sfa_ptr, sfb_ptr, gid_ptr, M, N, K, G, stride_dm,
             sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs,
             ROW0: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
             NUM_STAGES: gl.constexpr, PREFETCH: gl.constexpr, EPI_TMA: gl.constexpr = False,
             SCALE_AHEAD: gl.constexpr = 0):
    """One math warpgroup of the contiguous kernel: rows [ROW0, ROW0 + 64) of every (tile, group) pass.
    ``SCALE_AHEAD``: the K loop of :func:`_g_kloop_ahead` (module docstring, "Scales ahead").
    ``EPI_TMA``: ``d_ptr`` is (D pointer, D descriptor, this warpgroup's shared [64, BLOCK_N] bf16 buffer) and the
    stores go through :func:`_gc_store_rows_epi` (TMA store for pure slices, else the masked register store)."""
    ROWS: gl.constexpr = 64
    L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                instr_shape=[16, BLOCK_N, 32])
    pid = gl.program_id(0)
    num_pid_m = gl.cdiv(M, BLOCK_M)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    num_kb = gl.cdiv(K, 128)
    zero = gl.zeros([ROWS, BLOCK_N], gl.float32, L)
    it = 0
    # one flat loop, one (tile, group) pass or one tile advance per iteration (a `while` over the passes nested
    # in the tile loop made ptxas spill ~740 B in the math partitions; this form compiles without spills)
    tile_id = pid
    g = G
    if tile_id < num_tiles:
        pid_m, pid_n = _g_tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        g = _gc_tile_group(gid_ptr, pid_m * BLOCK_M, M, G, 0, BLOCK_M)
    while tile_id < num_tiles:
        pid_m, pid_n = _g_tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_t = pid_m * BLOCK_M
        off_m = off_t + ROW0
        off_n = pid_n * BLOCK_N
        if g < G:
            offs_m = off_m + gl.arange(0, ROWS, gl.SliceLayout(1, L))
            m_mask = offs_m < M
            sfa_rows = sfa_ptr + offs_m.to(gl.int64) * sfa_sm
            sfb_base = sfb_ptr + g.to(gl.int64) * sfb_sg + (off_n // 128).to(gl.int64) * sfb_sn
            acc = gl.zeros([ROWS, BLOCK_N], gl.float32, L)
            if SCALE_AHEAD > 0:
                acc, it = _g_kloop_ahead(a_bufs, b_bufs, ready, empty, it, zero, acc, sfa_rows, m_mask, sfa_sk,
                                         sfb_base, sfb_sk, num_kb, ROW0, ROWS, NUM_STAGES, SCALE_AHEAD == 2)
            else:
                if PREFETCH:
                    sa = gl.load(sfa_rows, mask=m_mask, other=0.0)
                    sb = gl.load(sfb_base)
                for kb in range(num_kb):
                    if PREFETCH:
                        kn = gl.minimum(kb + 1, num_kb - 1)
                        sa_n = gl.load(sfa_rows + kn * sfa_sk, mask=m_mask, other=0.0)
                        sb_n = gl.load(sfb_base + kn * sfb_sk)
                    else:
                        sa = gl.load(sfa_rows + kb * sfa_sk, mask=m_mask, other=0.0)
                        sb = gl.load(sfb_base + kb * sfb_sk)
                    slot = it % NUM_STAGES
                    mbarrier.wait(ready.index(slot), (it // NUM_STAGES) & 1)
                    tok = warpgroup_mma(a_bufs.index(slot).slice(ROW0, ROWS), b_bufs.index(slot).permute((1, 0)),
                                        zero, use_acc=False, is_async=True)
                    part = warpgroup_mma_wait(0, deps=(tok, ))
                    mbarrier.arrive(empty.index(slot))
                    acc += part * (sa * sb)[:, None]
                    if PREFETCH:
                        sa = sa_n
                        sb = sb_n
                    it += 1
            if EPI_TMA:
                _gc_store_rows_epi(d_ptr, acc, gid_ptr, off_m, off_n, M, N, G, g, stride_dm, ROWS, BLOCK_N, L)
            else:
                _gc_store_rows(d_ptr, acc, gid_ptr, off_m, off_n, M, N, G, g, stride_dm, ROWS, BLOCK_N, L)
            g = _gc_tile_group(gid_ptr, off_t, M, G, g + 1, BLOCK_M)
        else:
            # padding rows -> exact zeros (a fresh zero tile: the loop's wgmma `zero` stays unmaterialised)
            if EPI_TMA:
                _gc_store_rows_epi(d_ptr, gl.zeros([ROWS, BLOCK_N], gl.float32, L), gid_ptr, off_m, off_n, M, N,
                                   G, -1, stride_dm, ROWS, BLOCK_N, L)
            else:
                _gc_store_rows(d_ptr, gl.zeros([ROWS, BLOCK_N], gl.float32, L), gid_ptr, off_m, off_n, M, N, G,
                               -1, stride_dm, ROWS, BLOCK_N, L)
            tile_id += num_progs
            if tile_id < num_tiles:
                pid_m, pid_n = _g_tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
                g = _gc_tile_group(gid_ptr, pid_m * BLOCK_M, M, G, 0, BLOCK_M)
    if EPI_TMA:
        tma.store_wait(0)            # the buffer must outlive the last store's shared-memory reads


@_jit
def _fp8_gluon_m_contiguous_kernel(a_desc, b_desc, d_ptr, sfa_ptr, sfb_ptr, gid_ptr, M, N, K, G, stride_dm,
                                   sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs,
                                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
                                   NUM_STAGES: gl.constexpr, MATH_REGS: gl.constexpr, PREFETCH: gl.constexpr):
    """Persistent warp-specialised m-grouped contiguous FP8 1D2D GEMM (TMA producer + 2 math warpgroups)."""
    gl.static_assert(BLOCK_M == 128)
    gl.static_assert(BLOCK_N <= 128)
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready, empty = _g_ring_barriers(NUM_STAGES, 2)   # empty: one arrive per math warpgroup
    gl.warp_specialize([
        (_gc_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, gid_ptr, M, N, K, G, num_progs,
                        BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES)),
        (_gc_math, (a_bufs, b_bufs, ready, empty, d_ptr, sfa_ptr, sfb_ptr, gid_ptr, M, N, K, G, stride_dm,
                    sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs, 0, BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES,
                    PREFETCH)),
        (_gc_math, (a_bufs, b_bufs, ready, empty, d_ptr, sfa_ptr, sfb_ptr, gid_ptr, M, N, K, G, stride_dm,
                    sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs, 64, BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES,
                    PREFETCH)),
    ], [4, 4], [MATH_REGS, MATH_REGS])


@_jit
def _fp8_gluon_m_contiguous_epi_kernel(a_desc, b_desc, d_ptr, d_desc, sfa_ptr, sfb_ptr, gid_ptr, M, N, K, G,
                                       stride_dm, sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs,
                                       BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
                                       NUM_STAGES: gl.constexpr, MATH_REGS: gl.constexpr, PREFETCH: gl.constexpr,
                                       SCALE_AHEAD: gl.constexpr = 0):
    """:func:`_fp8_gluon_m_contiguous_kernel` with the TMA-store epilogue (``_gc_math(..., EPI_TMA=True)``): D is
    passed both as a pointer (masked register stores of mixed slices) and as a bf16 TensorDescriptor ``d_desc``
    (block [64, BLOCK_N]); each math warpgroup owns one [64, BLOCK_N] bf16 shared buffer. A separate entry point
    (not a constexpr of the kernel above) so that kernel's parameter list -- and every existing launch -- stays as
    it was."""
    gl.static_assert(BLOCK_M == 128)
    gl.static_assert(BLOCK_N <= 128)
    gl.static_assert(not PREFETCH)
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES] + b_desc.block_type.shape, b_desc.layout)
    epi = gl.allocate_shared_memory(d_desc.dtype, [2] + d_desc.block_type.shape, d_desc.layout)
    ready, empty = _g_ring_barriers(NUM_STAGES, 2)   # empty: one arrive per math warpgroup
    gl.warp_specialize([
        (_gc_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, gid_ptr, M, N, K, G, num_progs,
                        BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES)),
        (_gc_math, (a_bufs, b_bufs, ready, empty, (d_ptr, d_desc, epi.index(0)), sfa_ptr, sfb_ptr, gid_ptr, M, N,
                    K, G, stride_dm, sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs, 0, BLOCK_M, BLOCK_N,
                    GROUP_M, NUM_STAGES, PREFETCH, True, SCALE_AHEAD)),
        (_gc_math, (a_bufs, b_bufs, ready, empty, (d_ptr, d_desc, epi.index(1)), sfa_ptr, sfb_ptr, gid_ptr, M, N,
                    K, G, stride_dm, sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs, 64, BLOCK_M, BLOCK_N,
                    GROUP_M, NUM_STAGES, PREFETCH, True, SCALE_AHEAD)),
    ], [4, 4], [MATH_REGS, MATH_REGS])


# ------------------------------------------------------------------------ m-grouped masked on the WS loop (v3)
# D[g, :m_g] = A[g, :m_g] @ B[g].T with m_g = clamp(masked_m[g], 0, M_MAX). Every partition builds the same tile
# schedule on the device from masked_m (DeepGEMM-style: total = sum_g ceil(m_g / BLOCK_M) * n_tiles, a forward-only
# group cursor), so the grid depends on shapes only (CUDA-graph replayable) and rows >= m_g are never written.
# First run on the H200 2026-11-29 (git 3ea864ac1545): GPU tests passed, 1.05-1.17x the Triton masked kernel.


@_jit
def _gm_total_tiles(masked_m_ptr, G, M_MAX, num_pid_n, BLOCK_M: gl.constexpr):
    total = 0
    for gg in range(0, G):
        mg = gl.minimum(gl.maximum(gl.load(masked_m_ptr + gg), 0), M_MAX)
        total += gl.cdiv(mg, BLOCK_M) * num_pid_n
    return total


@_jit
def _gm_advance(masked_m_ptr, tile_id, g, before, m_g, tiles_g, M_MAX, num_pid_n, BLOCK_M: gl.constexpr):
    """Move the group cursor forward until tile ``tile_id`` lies in group ``g``."""
    while tile_id >= before + tiles_g:
        before += tiles_g
        g += 1
        m_g = gl.minimum(gl.maximum(gl.load(masked_m_ptr + g), 0), M_MAX)
        tiles_g = gl.cdiv(m_g, BLOCK_M) * num_pid_n
    return g, before, m_g, tiles_g


@_jit
def _gm_producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, masked_m_ptr, M_MAX, N, K, G, num_progs,
                 BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr, NUM_STAGES: gl.constexpr):
    pid = gl.program_id(0)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_kb = gl.cdiv(K, 128)
    total = _gm_total_tiles(masked_m_ptr, G, M_MAX, num_pid_n, BLOCK_M)
    g = 0
    before = 0
    m_g = gl.minimum(gl.maximum(gl.load(masked_m_ptr), 0), M_MAX)
    tiles_g = gl.cdiv(m_g, BLOCK_M) * num_pid_n
    it = 0
    for tile_id in range(pid, total, num_progs):
        g, before, m_g, tiles_g = _gm_advance(masked_m_ptr, tile_id, g, before, m_g, tiles_g, M_MAX, num_pid_n,
                                              BLOCK_M)
        pid_m, pid_n = _g_tile_coords(tile_id - before, gl.cdiv(m_g, BLOCK_M), num_pid_n, GROUP_M)
        a_row = g * M_MAX + pid_m * BLOCK_M
        b_row = g * N + pid_n * BLOCK_N
        for kb in range(num_kb):
            slot = it % NUM_STAGES
            mbarrier.wait(empty.index(slot), ((it // NUM_STAGES) & 1) ^ 1)
            _g_load_stage(a_desc, b_desc, a_bufs, b_bufs, ready, slot, a_row, b_row, kb, True)
            it += 1


@_jit
def _gm_math(a_bufs, b_bufs, ready, empty, d_ptr, sfa_ptr, sfb_ptr, masked_m_ptr, M_MAX, N, K, G,
             stride_dg, stride_dm, sfa_sg, sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs,
             ROW0: gl.constexpr, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
             NUM_STAGES: gl.constexpr, EPI_TMA: gl.constexpr = False, SCALE_AHEAD: gl.constexpr = 0):
    """One math warpgroup of the masked kernel: rows [ROW0, ROW0 + 64) of every tile. ``SCALE_AHEAD``: the K loop of
    :func:`_g_kloop_ahead`. ``EPI_TMA``: ``d_ptr`` is
    (D pointer, descriptor of D viewed as [G * M_MAX, N], this warpgroup's shared [64, BLOCK_N] bf16 buffer); a
    slice that lies wholly inside the group (``off_m + 64 <= m_g``) is TMA-stored at row ``g * M_MAX + off_m``, any
    other slice goes through the masked register store (rows >= m_g are never written either way)."""
    ROWS: gl.constexpr = 64
    L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                instr_shape=[16, BLOCK_N, 32])
    pid = gl.program_id(0)
    num_pid_n = gl.cdiv(N, BLOCK_N)
    num_kb = gl.cdiv(K, 128)
    total = _gm_total_tiles(masked_m_ptr, G, M_MAX, num_pid_n, BLOCK_M)
    g = 0
    before = 0
    m_g = gl.minimum(gl.maximum(gl.load(masked_m_ptr), 0), M_MAX)
    tiles_g = gl.cdiv(m_g, BLOCK_M) * num_pid_n
    zero = gl.zeros([ROWS, BLOCK_N], gl.float32, L)
    it = 0
    for tile_id in range(pid, total, num_progs):
        g, before, m_g, tiles_g = _gm_advance(masked_m_ptr, tile_id, g, before, m_g, tiles_g, M_MAX, num_pid_n,
                                              BLOCK_M)
        pid_m, pid_n = _g_tile_coords(tile_id - before, gl.cdiv(m_g, BLOCK_M), num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M + ROW0  # row inside group g
        off_n = pid_n * BLOCK_N
        offs_m = off_m + gl.arange(0, ROWS, gl.SliceLayout(1, L))
        m_mask = offs_m < m_g
        g64 = g.to(gl.int64)
        sfa_rows = sfa_ptr + g64 * sfa_sg + offs_m.to(gl.int64) * sfa_sm
        sfb_base = sfb_ptr + g64 * sfb_sg + (off_n // 128).to(gl.int64) * sfb_sn
        acc = gl.zeros([ROWS, BLOCK_N], gl.float32, L)
        if SCALE_AHEAD > 0:
            acc, it = _g_kloop_ahead(a_bufs, b_bufs, ready, empty, it, zero, acc, sfa_rows, m_mask, sfa_sk,
                                     sfb_base, sfb_sk, num_kb, ROW0, ROWS, NUM_STAGES, SCALE_AHEAD == 2)
        else:
            acc, it = _g_kloop(a_bufs, b_bufs, ready, empty, it, zero, acc, sfa_rows, m_mask, sfa_sk, sfb_base,
                               sfb_sk, num_kb, ROW0, ROWS, NUM_STAGES)
        # rows >= m_g never written (group base offset g * stride_dg; m_g <= M_MAX)
        if EPI_TMA:
            if off_m + ROWS <= m_g:
                _g_epi_store(d_ptr[1], d_ptr[2], acc, g * M_MAX + off_m, off_n)
            else:
                _g_store_tile(d_ptr[0] + g64 * stride_dg, acc, off_m, off_n, m_g, N, stride_dm, ROWS, BLOCK_N, L)
        else:
            _g_store_tile(d_ptr + g64 * stride_dg, acc, off_m, off_n, m_g, N, stride_dm, ROWS, BLOCK_N, L)
    if EPI_TMA:
        tma.store_wait(0)            # the buffer must outlive the last store's shared-memory reads


@_jit
def _fp8_gluon_m_masked_kernel(a_desc, b_desc, d_ptr, sfa_ptr, sfb_ptr, masked_m_ptr, M_MAX, N, K, G,
                               stride_dg, stride_dm, sfa_sg, sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs,
                               BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
                               NUM_STAGES: gl.constexpr, MATH_REGS: gl.constexpr):
    """Persistent warp-specialised m-grouped masked FP8 1D2D GEMM (TMA producer + BLOCK_M // 64 math WGs)."""
    gl.static_assert(BLOCK_M == 64 or BLOCK_M == 128)
    gl.static_assert(BLOCK_N <= 128)
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES] + b_desc.block_type.shape, b_desc.layout)
    ready, empty = _g_ring_barriers(NUM_STAGES, BLOCK_M // 64)   # empty: one arrive per math warpgroup
    if BLOCK_M == 128:
        gl.warp_specialize([
            (_gm_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, masked_m_ptr, M_MAX, N, K, G, num_progs,
                            BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES)),
            (_gm_math, (a_bufs, b_bufs, ready, empty, d_ptr, sfa_ptr, sfb_ptr, masked_m_ptr, M_MAX, N, K, G,
                        stride_dg, stride_dm, sfa_sg, sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs,
                        0, BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES)),
            (_gm_math, (a_bufs, b_bufs, ready, empty, d_ptr, sfa_ptr, sfb_ptr, masked_m_ptr, M_MAX, N, K, G,
                        stride_dg, stride_dm, sfa_sg, sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs,
                        64, BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES)),
        ], [4, 4], [MATH_REGS, MATH_REGS])
    else:
        gl.warp_specialize([
            (_gm_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, masked_m_ptr, M_MAX, N, K, G, num_progs,
                            BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES)),
            (_gm_math, (a_bufs, b_bufs, ready, empty, d_ptr, sfa_ptr, sfb_ptr, masked_m_ptr, M_MAX, N, K, G,
                        stride_dg, stride_dm, sfa_sg, sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs,
                        0, BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES)),
        ], [4], [MATH_REGS])


@_jit
def _fp8_gluon_m_masked_epi_kernel(a_desc, b_desc, d_ptr, d_desc, sfa_ptr, sfb_ptr, masked_m_ptr, M_MAX, N, K, G,
                                   stride_dg, stride_dm, sfa_sg, sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs,
                                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, GROUP_M: gl.constexpr,
                                   NUM_STAGES: gl.constexpr, MATH_REGS: gl.constexpr, SCALE_AHEAD: gl.constexpr = 0):
    """:func:`_fp8_gluon_m_masked_kernel` with the TMA-store epilogue (``_gm_math(..., EPI_TMA=True)``): D as a
    pointer (register stores of slices crossing m_g) and as a bf16 TensorDescriptor ``d_desc`` over D viewed as
    [G * M_MAX, N] (block [64, BLOCK_N]); one [64, BLOCK_N] bf16 shared buffer per math warpgroup. A separate entry
    point so that the register-epilogue kernel's parameter list and launches stay as they were."""
    gl.static_assert(BLOCK_M == 64 or BLOCK_M == 128)
    gl.static_assert(BLOCK_N <= 128)
    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [NUM_STAGES] + a_desc.block_type.shape, a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [NUM_STAGES] + b_desc.block_type.shape, b_desc.layout)
    epi = gl.allocate_shared_memory(d_desc.dtype, [BLOCK_M // 64] + d_desc.block_type.shape, d_desc.layout)
    ready, empty = _g_ring_barriers(NUM_STAGES, BLOCK_M // 64)   # empty: one arrive per math warpgroup
    if BLOCK_M == 128:
        gl.warp_specialize([
            (_gm_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, masked_m_ptr, M_MAX, N, K, G, num_progs,
                            BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES)),
            (_gm_math, (a_bufs, b_bufs, ready, empty, (d_ptr, d_desc, epi.index(0)), sfa_ptr, sfb_ptr, masked_m_ptr,
                        M_MAX, N, K, G, stride_dg, stride_dm, sfa_sg, sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk,
                        num_progs, 0, BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES, True, SCALE_AHEAD)),
            (_gm_math, (a_bufs, b_bufs, ready, empty, (d_ptr, d_desc, epi.index(1)), sfa_ptr, sfb_ptr, masked_m_ptr,
                        M_MAX, N, K, G, stride_dg, stride_dm, sfa_sg, sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk,
                        num_progs, 64, BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES, True, SCALE_AHEAD)),
        ], [4, 4], [MATH_REGS, MATH_REGS])
    else:
        gl.warp_specialize([
            (_gm_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, masked_m_ptr, M_MAX, N, K, G, num_progs,
                            BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES)),
            (_gm_math, (a_bufs, b_bufs, ready, empty, (d_ptr, d_desc, epi.index(0)), sfa_ptr, sfb_ptr, masked_m_ptr,
                        M_MAX, N, K, G, stride_dg, stride_dm, sfa_sg, sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk,
                        num_progs, 0, BLOCK_M, BLOCK_N, GROUP_M, NUM_STAGES, True, SCALE_AHEAD)),
        ], [4], [MATH_REGS])


# ----------------------------------------------------------------------------------------------- host code

@functools.lru_cache(maxsize=None)
def _smem_layout():
    """The A/B descriptors' shared layout (128-B swizzle, 8-bit elements); built once (~3 us per construction)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)


@functools.lru_cache(maxsize=None)
def _d_smem_layout():
    """Shared layout of the bf16 [64, BLOCK_N] epilogue buffer / D descriptor block (EPI_TMA configs): 128-B swizzle
    (a 256-B row is stored as two 128-B-wide TMA boxes, split by the compiler); built once."""
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)


def d_tma_ok(d: torch.Tensor) -> bool:
    """True when D can be written through a TMA descriptor: bf16 with contiguous rows, 16-B aligned base and row
    stride (``d.stride(0) % 8 == 0``: N % 8 == 0 for a contiguous D)."""
    return d.stride(-1) == 1 and d.stride(0) % 8 == 0 and d.data_ptr() % 16 == 0


def masked_d_tma_ok(d: torch.Tensor) -> bool:
    """True when a masked GEMM's D ``[G, M_max, N]`` can be written through one 2D TMA descriptor over D viewed as
    ``[G * M_max, N]``: :func:`d_tma_ok` for one group's ``[M_max, N]`` and packed groups (``d.stride(0) == M_max *
    d.stride(1)``, or G == 1)."""
    return d.dim() == 3 and d_tma_ok(d[0]) and (d.shape[0] == 1 or d.stride(0) == d.shape[1] * d.stride(1))


def grouped_register_twin(cfg: GluonConfig) -> GluonConfig:
    """The register-epilogue config a grouped TMA-store config falls back to for a D that TMA cannot address: the
    grouped register entries have no ``SCALE_AHEAD`` (the dense kernel keeps it)."""
    return replace(cfg, epi_tma=False, scale_ahead=0)


def m_contiguous_kernel(cfg: GluonConfig):
    """The contiguous kernel that runs ``cfg``: the TMA-store-epilogue entry point for ``cfg.epi_tma`` configs."""
    return _fp8_gluon_m_contiguous_epi_kernel if cfg.epi_tma else _fp8_gluon_m_contiguous_kernel


def m_masked_kernel(cfg: GluonConfig):
    """The masked kernel that runs ``cfg``: the TMA-store-epilogue entry point for ``cfg.epi_tma`` configs."""
    return _fp8_gluon_m_masked_epi_kernel if cfg.epi_tma else _fp8_gluon_m_masked_kernel


_NUM_SMS: dict = {}


def _num_sms(device) -> int:
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _NUM_SMS:
        _NUM_SMS[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _NUM_SMS[idx]


def _launch_fp8_gluon(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor,
                      config: GluonConfig | None = None, num_sms: int | None = None, launcher=None) -> torch.Tensor:
    """``d = (a * sfa) @ (b * sfb)^T`` in BF16 with the Gluon sm90 kernel.

    a ``[M, K]`` / b ``[N, K]`` float8_e4m3fn K-major (stride(-1) == 1, 16-B aligned rows and base);
    sfa ``[M, ceil(K/128)]`` float32 in any layout (read through its strides); sfb ``[ceil(N/128),
    ceil(K/128)]`` float32 (any strides); d ``[M, N]`` bfloat16 with stride(-1) == 1. No C, no split-K.
    ``launcher``: for warp-specialised configs, a :class:`deepkernels._launch.KernelLauncher` of
    ``_fp8_gluon_ws_kernel`` with :func:`ws_meta` ``(config)``, owned by a caller whose calls share one
    specialisation (dense.py's per-signature plans); None launches through ``kernel[grid]``.
    ``config.epi_tma`` (TMA-store epilogue) needs a TMA-able d (:func:`d_tma_ok`); for any other d the same config
    runs with the register epilogue (``launcher`` is then ignored: it was built for the TMA variant).
    """
    check_gluon_runnable()
    cfg = config or GLUON_DEFAULT
    if cfg.epi_tma and (not cfg.warp_spec or cfg.overlap or cfg.prefetch):
        raise ValueError(f"the TMA-store epilogue exists for the plain (non-overlap, non-prefetch) WS loop only: {cfg}")
    if cfg.scale_ahead and (not cfg.warp_spec or cfg.overlap or cfg.prefetch or cfg.scale_ahead not in (1, 2)):
        raise ValueError(f"scale_ahead (1 or 2) exists for the plain (non-overlap, non-prefetch) WS loop only: {cfg}")
    m, n, k = check_dense_operands(a, sfa, b, sfb, d)
    if m == 0 or n == 0:
        return d
    if k == 0:
        return d.zero_()
    return _go_dense(a, sfa, b, sfb, d, cfg, num_sms or _num_sms(a.device), launcher)


def check_gluon_runnable() -> None:
    """RuntimeError unless Gluon imports and the Triton interpreter is off (Gluon kernels have no interpreter)."""
    if not available():
        raise RuntimeError(f"Gluon is not importable: {_IMPORT_ERROR!r}")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("Gluon kernels have no interpreter support (TRITON_INTERPRET is set)")


def check_dense_operands(a, sfa, b, sfb, d) -> tuple[int, int, int]:
    """The operand checks the dense Gluon launchers share (this module's and ``_gluon_fp8_small``'s): CUDA tensors,
    e4m3 a / b, float32 sfa / sfb, bf16 d, shapes a [M, K], b [N, K], sfa [M, ceil(K/128)], sfb [ceil(N/128),
    ceil(K/128)], d [M, N], K-major a / b and row-major d. Returns (M, N, K)."""
    for name, t in (("a", a), ("sfa", sfa), ("b", b), ("sfb", sfb), ("d", d)):
        if not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor")
    if a.dtype != torch.float8_e4m3fn or b.dtype != torch.float8_e4m3fn:
        raise TypeError("a and b must be float8_e4m3fn")
    if sfa.dtype != torch.float32 or sfb.dtype != torch.float32 or d.dtype != torch.bfloat16:
        raise TypeError("sfa/sfb must be float32 and d bfloat16")
    m, k = a.shape
    n, k2 = b.shape
    kb = (k + 127) // 128
    if k2 != k or tuple(d.shape) != (m, n) or tuple(sfa.shape) != (m, kb) or tuple(sfb.shape) != ((n + 127) // 128, kb):
        raise ValueError(f"shape mismatch: a {tuple(a.shape)} sfa {tuple(sfa.shape)} b {tuple(b.shape)} "
                         f"sfb {tuple(sfb.shape)} d {tuple(d.shape)}")
    if (a.stride(1) != 1 and k > 1) or (b.stride(1) != 1 and k > 1) or (d.stride(1) != 1 and n > 1):
        raise ValueError("a, b must be K-major and d row-major")
    return m, n, k


def _go_dense(a, sfa, b, sfb, d, cfg, num_sms, launcher):
    """The launch of :func:`_launch_fp8_gluon` without its checks (a dense.py plan's repeat calls; M, N, K > 0)."""
    m, k = a.shape
    n = b.shape[0]
    lay = _smem_layout()
    a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [cfg.a_box(), BLOCK_K], lay)
    b_desc = TensorDescriptor(b, [n, k], [b.stride(0), 1], [cfg.block_n, BLOCK_K], lay)
    tiles = ((m + cfg.block_m - 1) // cfg.block_m) * ((n + cfg.block_n - 1) // cfg.block_n)
    ints = (m, n, k, d.stride(0), sfa.stride(0), sfa.stride(1), sfb.stride(0), sfb.stride(1))
    d_arg = d
    if cfg.epi_tma:
        if d_tma_ok(d):
            d_arg = TensorDescriptor(d, [m, n], [d.stride(0), 1], [64, cfg.block_n], _d_smem_layout())
        else:  # D not TMA-able: the register epilogue of the same config
            cfg = replace(cfg, epi_tma=False)
            launcher = None
    if cfg.warp_spec:
        progs = min(tiles, num_sms)
        if launcher is not None:
            launcher((progs, ), a_desc, b_desc, d_arg, sfa, sfb, *ints, progs)
        else:
            _fp8_gluon_ws_kernel[(progs, )](a_desc, b_desc, d_arg, sfa, sfb, *ints, progs, **ws_meta(cfg))
    else:
        _fp8_gluon_pipe_kernel[(tiles, )](
            a_desc, b_desc, d, sfa, sfb, *ints,
            cfg.block_m, cfg.block_n, cfg.group_m, cfg.num_stages, num_warps=cfg.num_warps())
    return d


def _compile_sm90(cfg: GluonConfig):
    """Cross-compile the kernel for ``cfg`` for sm90 (no GPU needed). Returns the CompiledKernel."""
    lay = repr(_smem_layout())
    sig = {"a_desc": f"tensordesc<fp8e4nv[{cfg.a_box()}, {BLOCK_K}],{lay}>",
           "b_desc": f"tensordesc<fp8e4nv[{cfg.block_n}, {BLOCK_K}],{lay}>",
           "d_ptr": "*bf16", "sfa_ptr": "*fp32", "sfb_ptr": "*fp32",
           "M": "i32", "N": "i32", "K": "i32", "stride_dm": "i32",
           "sfa_sm": "i32", "sfa_sk": "i32", "sfb_sn": "i32", "sfb_sk": "i32"}
    div16 = ("d_ptr", "sfa_ptr", "sfb_ptr")
    if cfg.epi_tma:
        sig["d_ptr"] = f"tensordesc<bf16[64, {cfg.block_n}],{_d_smem_layout()!r}>"
        div16 = ("sfa_ptr", "sfb_ptr")
    if cfg.warp_spec:
        fn = _fp8_gluon_ws_kernel
        sig["num_progs"] = "i32"
        consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP_M=cfg.group_m, NUM_STAGES=cfg.num_stages,
                      OVERLAP=cfg.overlap, MATH_REGS=cfg.math_regs, PREFETCH=cfg.prefetch)
        consts.update(EPI_TMA=cfg.epi_tma, SCALE_AHEAD=cfg.scale_ahead)   # in parameter order, defaults included
        opts = {"num_warps": 4, "maxnreg": cfg.maxnreg()}
    else:
        fn = _fp8_gluon_pipe_kernel
        consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP_M=cfg.group_m, NUM_STAGES=cfg.num_stages,
                      num_warps=cfg.num_warps())
        opts = {"num_warps": cfg.num_warps()}
    return _compile_sm90_gluon(fn, sig, consts, div16, **opts)


def _launch_fp8_gluon_m_contiguous(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                                   d: torch.Tensor, gid: torch.Tensor, config: GluonConfig | None = None,
                                   num_sms: int | None = None, launcher=None) -> torch.Tensor:
    """m-grouped contiguous ``d[i] = (a[i] * sfa[i]) @ (b[gid[i]] * sfb[gid[i]])^T`` (BF16), zeros where ``gid[i]``
    is outside ``[0, G)``, with the Gluon warp-specialised loop (128x128 tiles: ``config.block_m`` must be 128).

    a ``[M, K]`` e4m3 K-major; b ``[G, N, K]`` e4m3 K-major with packed groups (``b.stride(0) == N *
    b.stride(1)``); sfa ``[M, ceil(K/128)]`` / sfb ``[G, ceil(N/128), ceil(K/128)]`` float32, any strides;
    d ``[M, N]`` bfloat16 row-major; gid int32 ``[M]``. The caller validated shapes (grouped.py). ``launcher``: a
    :class:`deepkernels._launch.KernelLauncher` of :func:`m_contiguous_kernel` ``(config)`` with
    :func:`m_contiguous_meta` ``(config)``, owned by a caller whose calls all share one specialisation (grouped.py's
    per-signature plans); None launches through ``kernel[grid]``.
    ``config.epi_tma`` (:data:`GLUON_WS_128_S6_EPI`; not dispatched by default, not yet run on a GPU): the
    TMA-store epilogue for 64-row slices whose rows all belong to the pass's group (or are all padding), the
    register store for the others; needs a TMA-able d (:func:`d_tma_ok`), else the same config runs with the
    register epilogue (``launcher`` is then ignored: it was built for the TMA variant)."""
    if not available():
        raise RuntimeError(f"Gluon is not importable: {_IMPORT_ERROR!r}")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("Gluon kernels have no interpreter support (TRITON_INTERPRET is set)")
    cfg = config or GLUON_WS_128_S6
    if cfg.block_m != 128 or cfg.block_n > 128 or not cfg.warp_spec or cfg.overlap or (cfg.epi_tma and cfg.prefetch) \
            or (cfg.scale_ahead and (not cfg.epi_tma or cfg.scale_ahead not in (1, 2))):
        raise ValueError(f"m-grouped contiguous Gluon kernel needs a 128 x <=128 non-overlap WS config "
                         f"(the TMA-store epilogue without prefetch), got {cfg}")
    for name, t in (("a", a), ("sfa", sfa), ("b", b), ("sfb", sfb), ("d", d), ("gid", gid)):
        if not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor")
    m, k = a.shape
    g_num, n = b.shape[0], b.shape[1]
    if d.dtype != torch.bfloat16 or a.stride(1) != 1 or b.stride(2) != 1 or d.stride(1) != 1 or \
            (g_num > 1 and b.stride(0) != n * b.stride(1)):
        raise ValueError("needs bf16 row-major d, K-major a and b, packed b groups")
    return _go_m_contiguous(a, sfa, b, sfb, d, gid, cfg, num_sms or _num_sms(a.device), launcher)


def _go_m_contiguous(a, sfa, b, sfb, d, gid, cfg, num_sms, launcher):
    """The launch of :func:`_launch_fp8_gluon_m_contiguous` without its checks (a grouped.py plan's repeat calls)."""
    m, k = a.shape
    g_num, n = b.shape[0], b.shape[1]
    lay = _smem_layout()
    a_desc = TensorDescriptor(a, [m, k], [a.stride(0), 1], [cfg.block_m, BLOCK_K], lay)
    b_desc = TensorDescriptor(b, [g_num * n, k], [b.stride(1), 1], [cfg.block_n, BLOCK_K], lay)
    tiles = ((m + cfg.block_m - 1) // cfg.block_m) * ((n + cfg.block_n - 1) // cfg.block_n)
    progs = max(1, min(tiles, num_sms))
    d_args = (d, )
    if cfg.epi_tma:
        if d_tma_ok(d):
            d_args = (d, TensorDescriptor(d, [m, n], [d.stride(0), 1], [64, cfg.block_n], _d_smem_layout()))
        else:  # D not TMA-able: the register epilogue of the same config
            cfg = grouped_register_twin(cfg)
            launcher = None
    args = (a_desc, b_desc, *d_args, sfa, sfb, gid, m, n, k, g_num, d.stride(0), sfa.stride(0), sfa.stride(1),
            sfb.stride(0), sfb.stride(1), sfb.stride(2), progs)
    if launcher is not None:
        launcher((progs, ), *args)
    else:
        m_contiguous_kernel(cfg)[(progs, )](*args, **m_contiguous_meta(cfg))
    return d


def ws_meta(cfg: GluonConfig) -> dict:
    """Constexprs + compile options of the dense warp-specialised kernel for ``cfg`` (a KernelLauncher's ``meta``)."""
    meta = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP_M=cfg.group_m, NUM_STAGES=cfg.num_stages,
                OVERLAP=cfg.overlap, MATH_REGS=cfg.math_regs, PREFETCH=cfg.prefetch, num_warps=4,
                maxnreg=cfg.maxnreg())
    if cfg.epi_tma:  # only then: the existing configs' launches stay exactly as they were
        meta["EPI_TMA"] = True
    if cfg.scale_ahead:
        meta["SCALE_AHEAD"] = cfg.scale_ahead
    return meta


def m_contiguous_meta(cfg: GluonConfig) -> dict:
    """Constexprs + compile options of the m-grouped contiguous kernel for ``cfg`` (a KernelLauncher's ``meta``).
    The same keys for ``epi_tma`` configs: the TMA-store variant is its own entry point
    (:func:`m_contiguous_kernel`), not an extra constexpr, so existing launches are unchanged."""
    meta = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP_M=cfg.group_m, NUM_STAGES=cfg.num_stages,
                MATH_REGS=cfg.math_regs, PREFETCH=cfg.prefetch, num_warps=4, maxnreg=cfg.maxnreg())
    if cfg.scale_ahead:      # the TMA-store entry only (the launchers check)
        meta["SCALE_AHEAD"] = cfg.scale_ahead
    return meta


def m_masked_meta(cfg: GluonConfig) -> dict:
    """Constexprs + compile options of the m-grouped masked kernel for ``cfg`` (a KernelLauncher's ``meta``); same
    keys for ``epi_tma`` configs (their kernel is :func:`m_masked_kernel` ``(cfg)``)."""
    meta = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP_M=cfg.group_m, NUM_STAGES=cfg.num_stages,
                MATH_REGS=cfg.math_regs, num_warps=4, maxnreg=cfg.maxnreg())
    if cfg.scale_ahead:      # the TMA-store entry only (the launchers check)
        meta["SCALE_AHEAD"] = cfg.scale_ahead
    return meta


def _compile_sm90_m_contiguous(cfg: GluonConfig):
    """Cross-compile the m-grouped contiguous kernel for ``cfg`` for sm90 (no GPU needed)."""
    lay = repr(_smem_layout())
    fn = m_contiguous_kernel(cfg)
    sig = {"a_desc": f"tensordesc<fp8e4nv[{cfg.block_m}, {BLOCK_K}],{lay}>",
           "b_desc": f"tensordesc<fp8e4nv[{cfg.block_n}, {BLOCK_K}],{lay}>", "d_ptr": "*bf16"}
    if cfg.epi_tma:
        sig["d_desc"] = f"tensordesc<bf16[64, {cfg.block_n}],{_d_smem_layout()!r}>"
    sig |= {"sfa_ptr": "*fp32", "sfb_ptr": "*fp32", "gid_ptr": "*i32",
           "M": "i32", "N": "i32", "K": "i32", "G": "i32", "stride_dm": "i32",
           "sfa_sm": "i32", "sfa_sk": "i32", "sfb_sg": "i32", "sfb_sn": "i32", "sfb_sk": "i32", "num_progs": "i32"}
    consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP_M=cfg.group_m, NUM_STAGES=cfg.num_stages,
                  MATH_REGS=cfg.math_regs, PREFETCH=cfg.prefetch)
    if cfg.epi_tma:      # the TMA-store entry's trailing constexpr (the cross-compile binds every constexpr)
        consts["SCALE_AHEAD"] = cfg.scale_ahead
    return _compile_sm90_gluon(fn, sig, consts, ("d_ptr", "sfa_ptr", "sfb_ptr", "gid_ptr"), num_warps=4,
                               maxnreg=cfg.maxnreg())


def _launch_fp8_gluon_m_masked(a: torch.Tensor, sfa: torch.Tensor, b: torch.Tensor, sfb: torch.Tensor,
                               d: torch.Tensor, masked_m: torch.Tensor, config: GluonConfig | None = None,
                               num_sms: int | None = None, launcher=None) -> torch.Tensor:
    """m-grouped masked ``d[g, :m_g] = (a[g] * sfa[g]) @ (b[g] * sfb[g])^T`` (BF16) on the Gluon WS loop;
    ``m_g = clamp(masked_m[g], 0, M_max)`` read on the device only (graph-capturable); rows >= m_g untouched.

    a ``[G, M_max, K]`` / b ``[G, N, K]`` e4m3 K-major with packed groups; sfa ``[G, M_max, ceil(K/128)]`` /
    sfb ``[G, ceil(N/128), ceil(K/128)]`` float32, any strides; d ``[G, M_max, N]`` bfloat16, last dim contiguous;
    masked_m int32 ``[G]``. ``launcher`` as in :func:`_launch_fp8_gluon_m_contiguous` (kernel
    :func:`m_masked_kernel`, meta :func:`m_masked_meta`).
    ``config.epi_tma`` (:data:`GLUON_WS_128_S4_EPI`; not dispatched by default, not yet run on a GPU): 64-row
    slices that lie wholly below m_g are TMA-stored through a descriptor over d viewed as ``[G * M_max, N]``, the
    slice crossing m_g through the masked register store; needs :func:`masked_d_tma_ok` (d), else the same config
    runs with the register epilogue (``launcher`` then ignored)."""
    if not available():
        raise RuntimeError(f"Gluon is not importable: {_IMPORT_ERROR!r}")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise RuntimeError("Gluon kernels have no interpreter support (TRITON_INTERPRET is set)")
    cfg = config or GLUON_WS_128_S4
    if cfg.block_n > 128 or not cfg.warp_spec or cfg.overlap or (cfg.epi_tma and cfg.prefetch) \
            or (cfg.scale_ahead and (not cfg.epi_tma or cfg.scale_ahead not in (1, 2))):
        raise ValueError(f"m-grouped masked Gluon kernel needs a <=128-column non-overlap WS config "
                         f"(the TMA-store epilogue without prefetch), got {cfg}")
    for name, t in (("a", a), ("sfa", sfa), ("b", b), ("sfb", sfb), ("d", d), ("masked_m", masked_m)):
        if not t.is_cuda:
            raise ValueError(f"{name} must be a CUDA tensor")
    g_num, m_max, k = a.shape
    n = b.shape[1]
    if d.dtype != torch.bfloat16 or a.stride(2) != 1 or b.stride(2) != 1 or d.stride(2) != 1 or \
            (g_num > 1 and (a.stride(0) != m_max * a.stride(1) or b.stride(0) != n * b.stride(1))):
        raise ValueError("needs bf16 d with contiguous rows, K-major a and b with packed groups")
    return _go_m_masked(a, sfa, b, sfb, d, masked_m, cfg, num_sms or _num_sms(a.device), launcher)


def _go_m_masked(a, sfa, b, sfb, d, masked_m, cfg, num_sms, launcher):
    """The launch of :func:`_launch_fp8_gluon_m_masked` without its checks (a grouped.py plan's repeat calls: same
    signature as a checked call)."""
    g_num, m_max, k = a.shape
    n = b.shape[1]
    lay = _smem_layout()
    a_desc = TensorDescriptor(a, [g_num * m_max, k], [a.stride(1), 1], [cfg.block_m, BLOCK_K], lay)
    b_desc = TensorDescriptor(b, [g_num * n, k], [b.stride(1), 1], [cfg.block_n, BLOCK_K], lay)
    tiles_upper = g_num * ((m_max + cfg.block_m - 1) // cfg.block_m) * ((n + cfg.block_n - 1) // cfg.block_n)
    progs = max(1, min(tiles_upper, num_sms))
    d_args = (d, )
    if cfg.epi_tma:
        if masked_d_tma_ok(d):  # rows of group g at g * M_max + row of the [G * M_max, N] view
            d_args = (d, TensorDescriptor(d, [g_num * m_max, n], [d.stride(1), 1], [64, cfg.block_n],
                                          _d_smem_layout()))
        else:  # D not TMA-able as one [G * M_max, N] matrix: the register epilogue of the same config
            cfg = grouped_register_twin(cfg)
            launcher = None
    args = (a_desc, b_desc, *d_args, sfa, sfb, masked_m, m_max, n, k, g_num, d.stride(0), d.stride(1),
            sfa.stride(0), sfa.stride(1), sfa.stride(2), sfb.stride(0), sfb.stride(1), sfb.stride(2), progs)
    if launcher is not None:
        launcher((progs, ), *args)
    else:
        m_masked_kernel(cfg)[(progs, )](*args, **m_masked_meta(cfg))
    return d


def _compile_sm90_m_masked(cfg: GluonConfig):
    """Cross-compile the m-grouped masked kernel for ``cfg`` for sm90 (no GPU needed)."""
    lay = repr(_smem_layout())
    fn = m_masked_kernel(cfg)
    sig = {"a_desc": f"tensordesc<fp8e4nv[{cfg.block_m}, {BLOCK_K}],{lay}>",
           "b_desc": f"tensordesc<fp8e4nv[{cfg.block_n}, {BLOCK_K}],{lay}>", "d_ptr": "*bf16"}
    if cfg.epi_tma:
        sig["d_desc"] = f"tensordesc<bf16[64, {cfg.block_n}],{_d_smem_layout()!r}>"
    sig |= {"sfa_ptr": "*fp32", "sfb_ptr": "*fp32", "masked_m_ptr": "*i32",
           "M_MAX": "i32", "N": "i32", "K": "i32", "G": "i32", "stride_dg": "i32", "stride_dm": "i32",
           "sfa_sg": "i32", "sfa_sm": "i32", "sfa_sk": "i32", "sfb_sg": "i32", "sfb_sn": "i32", "sfb_sk": "i32",
           "num_progs": "i32"}
    consts = dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, GROUP_M=cfg.group_m, NUM_STAGES=cfg.num_stages,
                  MATH_REGS=cfg.math_regs)
    if cfg.epi_tma:      # the TMA-store entry's trailing constexpr (the cross-compile binds every constexpr)
        consts["SCALE_AHEAD"] = cfg.scale_ahead
    return _compile_sm90_gluon(fn, sig, consts, ("d_ptr", "sfa_ptr", "sfb_ptr", "masked_m_ptr"), num_warps=4,
                               maxnreg=cfg.maxnreg())
