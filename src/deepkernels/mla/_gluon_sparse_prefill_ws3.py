"""Sparse top-k MLA prefill, WS2 split consumer + 2-CTA cluster producer sharing (h_q a multiple of 128; not
dispatched: :data:`DISPATCH` False, nothing routes here but a direct call / the bench label ``gluon-ws3``).

Same contract, arguments and outputs as :func:`_gluon_sparse_prefill_ws2.launch_sparse_prefill_gluon_ws2` (read
that module's docstring: the dispatched sparse prefill kernel, one CTA per (query token, 64-head group), a 4-warp
cp.async producer, a softmax warpgroup and a PV warpgroup). Calls the cluster kernel cannot take (``h_q % 128 != 0``:
:func:`supported_ws3`) go to the WS2 launcher unchanged.

Why. WS2 measured 414-481 TFLOPS (FlashMLA on the same H200: 494-588, target 640); ncu: tensor pipe 51 %, L2 hit
95 %; consumer-only reorderings (OVERLAP, HALF) were all slower, the OVERLAP loss being attributed to an exposed
72 KB gather (G ~ 2,000 clk). The two 64-head CTAs of a query token gather exactly the same rows (same top-k
indices), so half of what every SM pulls from L2 is redundant. The sparse decode kernel's 2-CTA cluster scheme
(:mod:`._gluon_sparse_decode_ws3`, measured 1.16-1.25x its non-cluster version, bit-identical) removes it.

Per-block arithmetic (corrects the brief this module was written from, which had ~1.15 us per block and ~8 TB/s of
gathers from L2 -- a factor 2 off): one (CTA, 64-token block) is 2 * 64 * 64 * (576 + 512) = 8.9 MFLOP; WS2 at 481
TFLOPS = 3.64 TFLOPS per SM (one CTA per SM) -> 2.45 us = ~4,470 clk per block (WS2's OVERLAP notes, git cb51b03),
2.73 us at 431 (64K). The gathers are then 132 x 72 KB / 2.45 us = 3.9 TB/s aggregate (3.5 at 64K) -- not at the
L2's limit -- but ~30 B/clk INTO each SM, and G ~ 2,000 clk per 72 KB is ~36 B/clk: the per-SM ingress of a
4-warp cp.async gather looks like the gather's limit, not the aggregate L2 bandwidth. The tensor floor is ~1.2 us
per block (48 % of the measured 2.45: ncu's 51 %); the rest is the softmax chain between S and P V.

Design (the decode WS3 scheme applied to the prefill WS2 kernel):

* Compiled as an ordinary 1-CTA kernel, LAUNCHED as 2-CTA clusters (:class:`_PrefillClusterLauncher`, the decode
  module's :class:`_gluon_sparse_decode_ws3._ClusterLauncher` for this kernel: packed metadata ``(num_warps, 2,
  shared)``, Triton's launcher launches ``2 x gridX`` CTAs with cluster dimension (2, 1, 1)). The grid is WS2's,
  ``pid = tok * (h_q / 64) + hb``; with ``h_q % 128 == 0`` the cluster's CTAs (``ctaid.x`` 2k, 2k+1) are head groups
  2m, 2m+1 of the SAME query token: the same ``topk_length``, the same block count, the same indices.
* Producer (:func:`_p3_producer`, 4 warps), per 64-token block j (slot s = j % 2), CTA rank ``r = hb & 1``
  (= ``%cluster_ctarank``): cp.async of its HALF of the NoPE columns, ``[256 r, 256 r + 256)`` of each of the 64 rows,
  into its own ring slot (the ring viewed as ``kv4 = [4, 64, 256]``: piece ``2 s + r`` is exactly those columns of
  slot s -- NVMMA 128-byte swizzle stores each 64-column strip of 64 rows contiguously, 8 KB; the decode module's
  ``test_compile_ring_view_matches_slices`` fact), one commit group; the RoPE columns (8 KB) gathered by BOTH CTAs
  themselves (a second commit group, tracked by ``cp.async.mbarrier.arrive`` on ``ready[s]`` as in WS2); then
  ``cp.async.wait_group 1`` (this thread's NoPE copies -- zero-fills of invalid rows included -- have landed),
  ``fence.proxy.async`` (generic -> async proxy), a 128-thread barrier, and one thread pushes the 32 KB piece to the
  SAME offset of the peer CTA with two 16 KB DSMEM bulk copies (:func:`_gluon_sparse_decode_ws3._c_push`) that
  complete their bytes on the PEER's ``ready[s]``. Per CTA and block: 16 + 4 cp.async of 16 B per thread instead of
  36 + 4; 40 KB from L2 instead of 72 KB; 32 KB over DSMEM.
* Invalid rows (index < 0, >= s_kv, position >= topk_length): masked cp.async zero-fills them locally (never
  dereferenced), the wait_group covers the zero-fills too, so the peer receives zeros from the push.
* Consumers: WS2's softmax and PV warpgroups (copies of ``_p2_softmax_wg`` / ``_p2_pv_wg``, the same operations in
  the same order on the same tile bytes) with one addition each: after its local ``empty[s]`` arrive, an arrive on
  the PEER's ``empty[s]`` (``mapa`` + ``mbarrier.arrive.shared::cluster``, :func:`_c_remote_arrive`) -- the peer's
  producer pushes into this CTA's slot s. Expected bit-identical to WS2 (recorded by the GPU test).

Barrier protocol (j = block counter, the same sequence in both CTAs; s = j % 2):

1. ``ready[s]`` (count 1 + tx): the local producer, right after its ``empty[s]`` wait, announces the peer's 32,768
   bytes (``mbarrier.expect_tx``, one thread, :func:`_c_expect_tx`); its threads' ``cp.async.mbarrier.arrive`` for
   the RoPE copies (d_qk 576; net zero on the count); after the pushes its ordinary arrive (count 1). The peer's two
   bulk copies complete 2 x 16,384 tx bytes. The phase cannot complete before the local arrive (pending count), and
   the peer's bytes of phase k+1 cannot arrive before phase k completed here: the peer waits its ``empty[s]``, which
   needs this CTA's consumers' remote arrivals of phase k, made after they passed ``ready[s]`` phase k (a peer byte
   count before the local expect_tx makes the tx-count transiently negative: allowed, measured working in decode).
   Consumers wait parity ``(j // 2) & 1``.
2. ``empty[s]`` (count 4): softmax WG + PV WG of this CTA (local arrive after their wgmma reads of the slot
   completed) and of the peer (remote arrive right after the peer's local one). The producer waits parity
   ``((j // 2) & 1) ^ 1``: a slot is refilled -- locally AND, by the push, in the peer -- only when both CTAs'
   consumers released it.
3. ``pready`` / ``pfree``: WS2's softmax -> PV handshake, unchanged, CTA-local.
4. Push ordering: each producer thread ``cp.async.wait_group 1`` (its NoPE group complete and visible to itself),
   ``fence.proxy.async``, the 128-thread barrier (every thread's fence done), then ONE thread issues the bulk copies
   (they read the local piece through the async proxy).
5. Cluster: ``fence.mbarrier_init.release.cluster`` after the ``mbarrier.init``s; every partition starts and ends
   with ``barrier.cluster.arrive.release`` + ``wait.acquire`` (:func:`_c_sync`): the peer's barriers are initialised
   before any remote access, and no CTA exits while its peer may still push into it or arrive on it (the pushes
   complete on the peer's ``ready``, which the peer's consumers wait for before their final cluster barrier).

Shared-memory addresses for the PTX: the launcher reads the offsets of ``kv_n`` / ``ready`` / ``empty`` from the
compiled kernel's TTGIR (:func:`_gluon_sparse_decode_ws3.smem_offsets`) and passes them as runtime arguments;
``global_smem`` is read once per partition, outside its loops (the decode module's "Uniform registers" rules: no
``%tid.x`` read in asm -- the one-thread predicate is ``lane == 0`` from :func:`_c_lane` -- and no ``mov
global_smem`` inside the softmax loop).

Compile facts (Triton 3.6 wheel, ptxas sm_90a; all 8 (d_pe 64 / 0, topk_length, sink) configurations, PF_IDX on;
``tests/test_gluon_sparse_prefill_ws3.py::test_compile_sm90_ws3``):

==========  ==========  ====================  ==============  =====================  ================
d_qk        smem (B)    softmax block loop    PV block loop   producer block loop    spill st / ld
==========  ==========  ====================  ==============  =====================  ================
576         229,904 /   712 SASS, 40 HGMMA,   186, 4 HGMMA,   536-546, 21 LDGSTS,    0 / 0 B
            229,920     0 spills, R2UR 14     0 spills        2 UBLKCP, 0 spills
512         205,312 /   684-685, 36 HGMMA,    186, 4 HGMMA,   395-413, 16 LDGSTS,    0 / 0 B
            205,328     0 spills, R2UR 10     0 spills        2 UBLKCP, 0 spills
==========  ==========  ====================  ==============  =====================  ================

(smem: without / with topk_length; WS2: softmax loop 706 / 679 with R2UR 14 / 10 -- the descriptors stay in uniform
registers --, PV loop 179, producer loop 466 / 433 with 37 / 33 LDGSTS, 0 spills.) Registers: launch maxnreg 168 x 12
warps, setmaxnreg producer :data:`WS3_PRODUCER_REGS` 72 / PV :data:`WS3_PV_REGS` 200 / softmax 232 (WS2: 56 / 216 /
232); at 56 / 216 the producer's index prefetch spilled 2-11 instructions per block. PF_IDX off: producer loop
466-467 / 378-379, 0 spills. PTX: one ``%tid.x`` read, ``global_smem`` read 3 times (once per partition), no
``MEMBAR.ALL.GPU`` in any loop; per block the producer issues 16 (+ 4 RoPE) cp.async of 16 B per thread, ``cp.async.
wait_group 1`` (d_qk 512: 0), ``fence.proxy.async``, ``bar.sync 3, 128``, the two 16 KB ``cp.async.bulk.shared::
cluster`` pushes, the ``ready`` arrive (``test_compile_push_ordering``); Triton's membar pass adds one more ``bar.sync
3, 128`` right after the wait_group (harmless).

Producer pipelining (a known limit of this version). The producer blocks on ``cp.async.wait_group`` for each block
before it issues the next one, so at most ONE block's gather (40 KB) is in flight per CTA; WS2's producer, signalled
by ``cp.async.mbarrier.arrive`` alone, can have both ring slots' gathers in flight when the consumers are ahead.
In WS2's steady state the consumers hold one slot, so one gather in flight is the common case there too; but where
the gather was exposed (64K, OVERLAP) WS3 cannot overlap two. ``PF_IDX`` (default) at least loads the next block's
indices under the wait, so the next issue does not start with an L2 round trip. Deferring the push of block j-1
behind block j's issue was rejected: when the consumers are the bottleneck the producer would sit in block j's
``empty`` wait with block j-1 gathered but not pushed, putting a push on the critical path of every block.

PREDICTION (UNVERIFIED on GPU; H200, s_q 4096, h_q 128, topk 2048; paired ratio t_ws3 / t_ws2 in the same run,
WS2 ~476-481 at s_kv 8K / ~421-433 at 64K). Per (CTA, block): WS2 ~4,470 clk at 8K = S (~1,150) + softmax chain
(~2,300) + P V (~1,020); its gather (G ~ 2,000 clk) is hidden under that at 8K and partly exposed at 64K (where L2
misses lengthen it; 2.73 vs 2.45 us per block). WS3 halves the per-SM L2 ingress (40 KB instead of 72 KB; if G is
ingress-bound, G -> ~1,100 clk + the DSMEM push, 32 KB over the SM-to-SM network, ~1.7 TB/s aggregate at WS2's
block rate -- below the ~3.3 TB/s third-party microbenchmarks report for thread-level DSMEM traffic on H100), frees
~20 cp.async per producer thread per block, and adds per block 2 remote arrives, the wait_group + barrier, the push
latency and the two-CTA lockstep (a slot is refilled only when both CTAs' consumers released it). Prediction:
s_kv 8K speed 0.97-1.06x WS2 (paired time ratio 0.94-1.03; central 1.02x, ~490 TFLOPS: the gather was
mostly hidden); s_kv 64K 1.02-1.15x (central 1.07x, ~460 TFLOPS: the exposed part of the gather shrinks); sink on /
off alike; ``gluon-ws3-nopf`` 0.97-1.0x of ``gluon-ws3``. The bigger lever this enables, NOT built here: the FA3-order
OVERLAP schedule of WS2 (0.80x because of the exposed 72 KB gather; removed in session 18) on top of this producer.
Falsifiers: WS3 < 0.97x
at 8K means the lockstep / push latency costs more than the halved gather saves (check ``gluon-ws3-nopf`` and the
cluster co-residency line: fewer than 66 co-resident clusters = a second partial wave, ~0.5-0.7x); a hang = the tx /
count protocol is wrong (the device script's smoke guard); a non-bit-identical result = a pushed piece landed in the
wrong place or stale (the tests' NaN-poisoned unreferenced rows would show it as an error). Numerics: expected
bit-identical to WS2 (same tile bytes, same consumer code; recorded by ``test_gpu_ws3_equals_ws2``).

MEASURED (session 17, H200, git b53f320b4614, ``T_P3_TESTS=90 bash benchmarks/device_sparse_prefill_ws3.sh``, 6 rotated
rounds, results/sparse_prefill_ws3-h200-2026-11-29-s17.json): 41/41 GPU tests, bit-identical to WS2 (10/10 recorded
cases and all 4 bench shapes), 66 co-resident clusters (one wave). Paired t / t_ws2: ``gluon-ws3`` (PF_IDX on) 1.081 /
1.084 at 8K, 1.047 / 1.054 at 64K -- slower; ``gluon-ws3-nopf`` 1.011 / 1.016 at 8K, 0.976 / 0.994 at 64K (even).
Below the predicted 0.97-1.06x at 8K; at 64K even instead of 1.02-1.15x faster. Halving each CTA's gathers does not
move the kernel: the gathers are not its limit (the per-CTA S -> softmax -> P V chain is), and the index prefetch's
register split (producer 72 / PV 200) costs ~7 %. Not dispatched.

Next device run: ``GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_prefill_ws3.sh``.
"""
from __future__ import annotations

import torch

from .._gluon import (IMPORT_ERROR as _IMPORT_ERROR, available, gl, async_copy, fence_async_shared,  # noqa: F401
                      mbarrier, warpgroup_mma, warpgroup_mma_wait)
from .._gluon import compile_sm90 as _compile_sm90_gluon, jit as _jit
from .._launch import spec_key
from . import _gluon_sparse_prefill as _gsp
from . import _gluon_sparse_prefill_ws2 as _ws2
from ._gluon_sparse_prefill import BLOCK_H, D_V, _g_ws_rows, supported
from ._gluon_sparse_prefill_ws2 import (WS2_MAXNREG, _LOG2E, _p2_prologue,
                                        _p2_stats, _p2_write_half)
from ._gluon_cluster import (_c_expect_tx, _c_init_fence, _c_lane, _c_peer_rank, _c_push, _c_remote_arrive,
                             _c_smem_base, _c_sync)
from ._gluon_sparse_decode_ws3 import _ClusterLauncher, _launch_device, _offset_args, smem_offsets

__all__ = ["available", "supported_ws3", "launch_sparse_prefill_gluon_ws3", "compile_sm90_ws3", "smem_offsets",
           "DISPATCH", "WS3_NUM_WARPS", "WS3_MAXNREG", "WS3_PRODUCER_REGS", "WS3_PV_REGS"]

DISPATCH = False          # not dispatched: launch_sparse_prefill_gluon never routes here (the lead decides)
WS3_NUM_WARPS = 4         # the default partition (softmax warpgroup); + 4 PV + 4 producer warps = 12
WS3_MAXNREG = WS2_MAXNREG
# setmaxnreg: producer 72 / PV 200 / softmax 232 (the rest: 168 * 3 - 72 - 200). The producer's next-block index
# prefetch (PF_IDX) holds 2 x 64 indices + validity: at WS2's 56 / 216 it spilled 2-11 instructions per block
# (d_qk 576 with topk_length: 11), at 64 / 208 0 per block but 8-24 B in all; 72 / 200: 0 anywhere, PV loop unchanged
WS3_PRODUCER_REGS = 72
WS3_PV_REGS = 200
_HALF_BYTES = 32768       # bytes the peer pushes into each ring slot per block: 64 rows x 256 bf16 columns


# ----------------------------------------------------------------------------------------------- device code

@_jit
def _p3_rows(idx_row, start, n, s_kv, LN: gl.constexpr):
    """Top-k positions [start, start + 64) in the row slice of ``LN``: (index clamped to 0 where invalid, valid),
    ``_g_gather``'s expressions (index < 0, >= s_kv, or position >= n: invalid)."""
    offs_n = start + gl.arange(0, 64, gl.SliceLayout(1, LN))
    idx = gl.load(idx_row + offs_n, mask=offs_n < n, other=-1)
    ok = (idx >= 0) & (idx < s_kv)
    return gl.where(ok, idx, 0), ok


@_jit
def _p3_gather(dst_n, dst_p, kv_ptr, i_n, ok_n, i_p, ok_p, stride_kvs, col0, D_PE: gl.constexpr,
               LN: gl.constexpr, LP: gl.constexpr):
    """cp.async of one block's rows (:func:`_p3_rows` of both layouts): NoPE columns [col0, col0 + 256) into
    ``dst_n`` ([64, 256]) as one commit group, then (d_qk 576) the RoPE columns into ``dst_p`` ([64, 64]) as a
    second; invalid rows zero-filled (masked cp.async: source size 0) and never dereferenced."""
    rows = kv_ptr + i_n.to(gl.int64)[:, None] * stride_kvs
    offs_d = col0 + gl.arange(0, 256, gl.SliceLayout(0, LN))
    async_copy.async_copy_global_to_shared(dst_n, rows + offs_d[None, :], mask=ok_n[:, None])
    async_copy.commit_group()
    if D_PE > 0:
        rowsp = kv_ptr + i_p.to(gl.int64)[:, None] * stride_kvs
        offs_p = gl.arange(0, D_PE, gl.SliceLayout(0, LP))
        async_copy.async_copy_global_to_shared(dst_p, rowsp + 512 + offs_p[None, :], mask=ok_p[:, None])
        async_copy.commit_group()


@_jit
def _p3_producer(kv4, kv_p, ready, empty, kv_ptr, idx_ptr, len_ptr, s_kv, topk, stride_kvs, stride_is, H_Q,
                 ring_off, ready_off, D_PE: gl.constexpr, HAS_LEN: gl.constexpr, PF_IDX: gl.constexpr):
    """Worker partition (4 warps): per block this CTA's half of the NoPE columns (+ the RoPE columns) by cp.async,
    the half pushed to the peer CTA's same ring piece (module docstring, "Design" / "Barrier protocol"). ``PF_IDX``:
    the next block's 64 indices are loaded right after this block's copies are issued (their L2 latency hides under
    the wait for the copies, instead of preceding the next block's issue)."""
    LN4: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    LP4: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    _c_sync()
    lane = _c_lane()
    gs = _c_smem_base()
    peer = _c_peer_rank()
    pid = gl.program_id(0)
    tok = (pid // (H_Q // 64)).to(gl.int64)
    r = (pid % (H_Q // 64)) & 1              # = %cluster_ctarank (h_q % 128 == 0)
    n, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    idx_row = idx_ptr + tok * stride_is
    if PF_IDX:
        i_n, ok_n = _p3_rows(idx_row, 0, n, s_kv, LN4)
        i_p, ok_p = _p3_rows(idx_row, 0, n, s_kv, LP4)
    for j in range(num_blocks):
        slot = j % 2
        if not PF_IDX:
            i_n, ok_n = _p3_rows(idx_row, j * 64, n, s_kv, LN4)
            i_p, ok_p = _p3_rows(idx_row, j * 64, n, s_kv, LP4)
        mbarrier.wait(empty.index(slot), ((j // 2) & 1) ^ 1)   # both CTAs' consumers released the slot
        bar = gs + ready_off + slot * 8
        _c_expect_tx(lane, bar)                                  # the peer's 32 KB of this block
        piece = 2 * slot + r
        _p3_gather(kv4.index(piece), kv_p.index(slot), kv_ptr, i_n, ok_n, i_p, ok_p, stride_kvs, r * 256, D_PE,
                   LN4, LP4)
        if D_PE > 0:
            async_copy.mbarrier_arrive(ready.index(slot))        # the RoPE copies complete on ready (net zero)
        if PF_IDX:
            i_n, ok_n = _p3_rows(idx_row, j * 64 + 64, n, s_kv, LN4)
            i_p, ok_p = _p3_rows(idx_row, j * 64 + 64, n, s_kv, LP4)
        if D_PE > 0:
            async_copy.wait_group(1)                             # this thread's NoPE copies (+ zero-fills) landed
        else:
            async_copy.wait_group(0)
        fence_async_shared()                                     # ... visible to the async proxy (the bulk copy)
        gl.thread_barrier()                                      # every producer thread's fence done
        src = gs + ring_off + piece * 32768                      # _HALF_BYTES
        _c_push(lane, src, bar, peer)
        _c_push(lane, src + 16384, bar, peer)
        mbarrier.arrive(ready.index(slot))
    _c_sync()


@_jit
def _p3_softmax_wg(q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree, q_ptr, idx_ptr, len_ptr,
                   sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2, stride_qs, stride_qh,
                   stride_is, stride_os, stride_oh, H_Q, empty_off, D_PE: gl.constexpr, HAS_LEN: gl.constexpr,
                   HAS_SINK: gl.constexpr):
    """``_gluon_sparse_prefill_ws2._p2_softmax_wg`` + the remote ``empty`` arrive and the cluster barriers."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    LS: gl.constexpr = gl.SliceLayout(0, S_L)
    _c_sync()
    lane = _c_lane()
    gs = _c_smem_base()
    tok, hb, n, num_blocks, idx_row = _p2_prologue(q_n, q_p, q_ptr, idx_ptr, len_ptr, topk, stride_qs, stride_qh,
                                                   stride_is, H_Q, D_PE, HAS_LEN)
    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))   # running max of raw q.k
    l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, S_L))
    acc = gl.zeros([64, 256], gl.float32, O_L)
    s_zero = gl.zeros([64, 64], gl.float32, S_L)
    for j in range(num_blocks):
        slot = j % 2
        offs_n = j * 64 + gl.arange(0, 64, LS)
        idx = gl.load(idx_row + offs_n, mask=offs_n < n, other=-1)
        valid = (idx >= 0) & (idx < s_kv)
        mbarrier.wait(ready.index(slot), (j // 2) & 1)
        fence_async_shared()     # the cp.async writes (generic proxy) before the wgmma reads (async proxy)
        tok_s = warpgroup_mma(q_n, kv_n.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if D_PE > 0:
            tok_s = warpgroup_mma(q_p, kv_p.index(slot).permute((1, 0)), tok_s, is_async=True)
        s = warpgroup_mma_wait(0, deps=(tok_s, ))
        s = gl.where(valid[None, :], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2((m_i - m_safe) * scale_log2)
        p = gl.exp2((s - m_safe[:, None]) * scale_log2)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
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
        _c_remote_arrive(lane, gs, empty_off, slot * 8)          # the peer's producer pushes into this slot

    inv = _p2_stats(m_i, l_i, tok, hb, sink_ptr, ml_ptr, lse_ptr, sm_scale, H_Q, HAS_SINK, S_L)
    mbarrier.wait(pfree, (num_blocks & 1) ^ 1)
    a_smem.store(inv)
    gl.thread_barrier()
    mbarrier.arrive(pready)
    _p2_write_half(acc, gl.convert_layout(inv, gl.SliceLayout(1, O_L)), tok, hb, out_ptr, stride_os, stride_oh, 0,
                   O_L)
    _c_sync()


@_jit
def _p3_pv_wg(kv_n, p_smem, a_smem, ready, empty, pready, pfree, len_ptr, out_ptr, topk, stride_os, stride_oh, H_Q,
              empty_off, HAS_LEN: gl.constexpr):
    """``_gluon_sparse_prefill_ws2._p2_pv_wg`` + the remote ``empty`` arrive and the cluster barriers."""
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    _c_sync()
    lane = _c_lane()
    gs = _c_smem_base()
    pid = gl.program_id(0)
    tok = (pid // (H_Q // 64)).to(gl.int64)
    _, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    acc = gl.zeros([64, 256], gl.float32, O_L)
    for j in range(num_blocks):
        slot = j % 2
        mbarrier.wait(ready.index(slot), (j // 2) & 1)    # passed already (the softmax WG sent P after it)
        mbarrier.wait(pready, j & 1)
        fence_async_shared()
        alpha = a_smem.load(gl.SliceLayout(1, O_L))
        acc = acc * alpha[:, None]
        tok_o = warpgroup_mma(p_smem, kv_n.index(slot).slice(256, 256, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(tok_o, ))
        mbarrier.arrive(pfree)
        mbarrier.arrive(empty.index(slot))
        _c_remote_arrive(lane, gs, empty_off, slot * 8)
    mbarrier.wait(pready, num_blocks & 1)
    inv = a_smem.load(gl.SliceLayout(1, O_L))
    _p2_write_half(acc, inv, tok, pid % (H_Q // 64), out_ptr, stride_os, stride_oh, 256, O_L)
    _c_sync()


@_jit
def _p3_smem(D_PE: gl.constexpr):
    """WS2's shared memory (``_p2_smem``) with ``empty`` counting 4 arrivals (both CTAs' two consumer warpgroups)
    and ``kv4``, the ring viewed as [4, 64, 256] (piece ``2 s + h`` = slot s, columns [256 h, 256 h + 256))."""
    SH_N: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 512], gl.bfloat16)
    SH_H: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 256], gl.bfloat16)
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
        mbarrier.init(empty.index(i), count=4)      # softmax WG + PV WG of this CTA and of the peer
    mbarrier.init(pready, count=1)
    mbarrier.init(pfree, count=1)
    kv4 = kv_n._reinterpret(gl.bfloat16, [4, 64, 256], SH_H)
    return q_n, q_p, kv_n, kv4, kv_p, p_smem, a_smem, ready, empty, pready, pfree


_NO_SPEC = ["ring_off", "ready_off", "empty_off"]


@_jit(do_not_specialize=_NO_SPEC)
def _sparse_prefill_gluon_ws3_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr,
    s_kv, topk, sm_scale,
    stride_qs, stride_qh, stride_kvs, stride_is, stride_os, stride_oh, H_Q,
    scale_log2, ring_off, ready_off, empty_off,
    D_PE: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, PV_REGS: gl.constexpr, PF_IDX: gl.constexpr = True,
):
    """WS2's runtime arguments with ``scale_log2`` moved after ``H_Q`` (the cluster launcher's calling convention:
    arguments, the scale, the three shared offsets) + ``ring_off`` / ``ready_off`` / ``empty_off``
    (:func:`smem_offsets`). Launched as 2-CTA clusters only (:func:`launch_sparse_prefill_gluon_ws3`)."""
    q_n, q_p, kv_n, kv4, kv_p, p_smem, a_smem, ready, empty, pready, pfree = _p3_smem(D_PE)
    _c_init_fence(H_Q)
    gl.warp_specialize([
        (_p3_softmax_wg, (q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree, q_ptr, idx_ptr, len_ptr,
                          sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2, stride_qs, stride_qh,
                          stride_is, stride_os, stride_oh, H_Q, empty_off, D_PE, HAS_LEN, HAS_SINK)),
        (_p3_pv_wg, (kv_n, p_smem, a_smem, ready, empty, pready, pfree, len_ptr, out_ptr, topk, stride_os, stride_oh,
                     H_Q, empty_off, HAS_LEN)),
        (_p3_producer, (kv4, kv_p, ready, empty, kv_ptr, idx_ptr, len_ptr, s_kv, topk, stride_kvs, stride_is, H_Q,
                        ring_off, ready_off, D_PE, HAS_LEN, PF_IDX)),
    ], [4, 4], [PV_REGS, PRODUCER_REGS])


# ----------------------------------------------------------------------------------------------- host code

_CONSTEXPRS = ("D_PE", "HAS_LEN", "HAS_SINK", "PRODUCER_REGS", "PV_REGS", "PF_IDX")   # parameter order
_LAUNCHERS: dict = {}
_LAUNCHER_LIMIT = 256


def supported_ws3(q: torch.Tensor, kv: torch.Tensor) -> bool:
    """``supported_ws2`` (= ``_gluon_sparse_prefill.supported``) and h_q a multiple of 128 (the two 64-head groups
    of a query token form one cluster)."""
    return q.shape[1] % 128 == 0 and supported(q, kv)


class _PrefillClusterLauncher(_ClusterLauncher):
    """:class:`_gluon_sparse_decode_ws3._ClusterLauncher` (compile once through ``warmup``, read the shared offsets,
    launch through the compiled kernel's CUDA launcher with packed metadata ``(num_warps, 2, shared)``) for
    :func:`_sparse_prefill_gluon_ws3_kernel`."""

    __slots__ = ()

    def _jit_kernel(self):
        return _sparse_prefill_gluon_ws3_kernel


def _args(out, max_logits, lse, q, kv, indices, sm_scale, attn_sink, topk_length) -> tuple:
    """The kernel's runtime arguments before ``scale_log2`` (WS2's order, ``scale_log2`` taken out)."""
    args, ints = _gsp.launch_args(out, max_logits, lse, q, kv, indices, attn_sink, topk_length)
    return (*args, float(sm_scale), *ints)


def launch_sparse_prefill_gluon_ws3(out, max_logits, lse, q, kv, indices, sm_scale, attn_sink=None,
                                    topk_length=None, *, pv_regs=None, producer_regs=None, maxnreg=None,
                                    pf_idx: bool = True):
    """Drop-in for :func:`_gluon_sparse_prefill_ws2.launch_sparse_prefill_gluon_ws2` (same positional arguments and
    out-parameter contract: inputs validated by ``flash_mla_sparse_fwd``, last dims contiguous, the caller checked
    ``supported_ws2``). ``h_q % 128 != 0``: the WS2 launcher runs the call (default schedule). Keyword-only knobs
    (benchmarks): PV / producer ``setmaxnreg``, launch ``maxnreg``, ``pf_idx`` (the producer's next-block index
    prefetch, default on; off = the indices loaded right before their block's copies). One
    :class:`_PrefillClusterLauncher` per (constexprs, options, :func:`deepkernels._launch.spec_key` of the
    arguments, device)."""
    s_q, h_q, d_qk = q.shape
    if s_q == 0:
        return
    if h_q % 128:
        _ws2.launch_sparse_prefill_gluon_ws2(out, max_logits, lse, q, kv, indices, sm_scale, attn_sink, topk_length)
        return
    args = _args(out, max_logits, lse, q, kv, indices, sm_scale, attn_sink, topk_length)
    constexprs = (d_qk - D_V, topk_length is not None, attn_sink is not None, producer_regs or WS3_PRODUCER_REGS,
                  pv_regs or WS3_PV_REGS, bool(pf_idx))
    opts = (WS3_NUM_WARPS, maxnreg or WS3_MAXNREG)
    key = (constexprs, opts, spec_key(*args), _launch_device(q))
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        if len(_LAUNCHERS) >= _LAUNCHER_LIMIT:
            _LAUNCHERS.clear()
        launcher = _LAUNCHERS[key] = _PrefillClusterLauncher(dict(zip(_CONSTEXPRS, constexprs), num_warps=opts[0],
                                                                  maxnreg=opts[1]))
    launcher(s_q * (h_q // BLOCK_H) // 2, args, float(sm_scale) * _LOG2E)


def compile_sm90_ws3(d_pe: int = 64, has_len: bool = False, has_sink: bool = False, pv_regs=None,
                     producer_regs=None, maxnreg=None, pf_idx: bool = True):
    """Cross-compile the kernel for sm90 (no GPU needed) with the divisibility facts of an aligned launch. Returns
    the CompiledKernel (``.asm['ptx']``, ``.asm['ttgir']``, ``.metadata.shared``)."""
    sig = {k: v for k, v in _gsp.SIG.items() if k != "scale_log2"}      # WS2's, scale_log2 moved behind H_Q
    sig.update(scale_log2="fp32", ring_off="i32", ready_off="i32", empty_off="i32")
    # every constexpr, in parameter order (the cross-compile binds constexprs by position)
    consts = dict(zip(_CONSTEXPRS, (d_pe, has_len, has_sink, producer_regs or WS3_PRODUCER_REGS,
                                    pv_regs or WS3_PV_REGS, bool(pf_idx))))
    return _compile_sm90_gluon(_sparse_prefill_gluon_ws3_kernel, sig, consts, _gsp.HINTED, num_warps=WS3_NUM_WARPS,
                               maxnreg=maxnreg or WS3_MAXNREG)
