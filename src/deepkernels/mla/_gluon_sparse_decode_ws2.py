"""Warp-specialised Gluon sparse MLA decode, "dense-decode consumer" variant (issue #6; dispatched for V4.1 main caches
without an extra cache, :data:`DISPATCH_FMTS`; measured section "Measured" at the end).

Same contract, argument list and constexprs as :func:`_gluon_sparse_decode_ws._sparse_decode_gluon_ws_kernel`
(read that module's docstring): one CTA per (scheduler part, query position, 64-head block), persistent over the
requests of its part; split boundaries clamped to the token line, the last split of a request running to its end;
indices valid iff ``position < topk_length`` and ``0 <= idx < num_blocks * page_block_size`` (anything else never
dereferenced, its K/V row zero); single-split requests write ``out``/``lse`` (sink applied), split requests write
``O/L`` and ``log2 L + m`` to accumulator row ``num_splits[req] + split`` for the unchanged ``combine_splits_``.
Formats V3.2 (FMT 0, 656 B/token, d_qk 576: RoPE in a separate ``kv_p`` tile) and V4.1 (FMT 2, 528 B/token, d_qk
512); no extra cache. Launcher :func:`launch_sparse_decode_gluon_ws2` is a drop-in for
``launch_sparse_decode_gluon_ws`` (extra cache: ValueError).

What differs is the consumer side, which takes the structure of the dense decode Gluon kernel
(``_gluon_dense_decode._g_softmax_wg`` / ``_g_pv_wg``; also FlashMLA's own sm90 sparse FP8 decode split):

* default partition = softmax warpgroup (4 warps), :func:`_w2_softmax_wg`: Q of the request to shared memory, then
  per 64-token block: wait ``ready[slot]``, ``fence.proxy.async``, the FULL S = Q K^T (64 x 64, m64n64k16 wgmmas,
  ``warps_per_cta=[4, 1]``; NoPE k-steps then RoPE k-steps for V3.2), mask with the producer's ``vmask[slot]``, the
  online softmax with the expressions of ``_w_consumer`` (row reductions inside the warpgroup: no cross-warpgroup
  reduction, per-row l for both formats), hand bf16 P + alpha to the PV warpgroup (``pready`` / ``pfree``),
  ``O[:, :256] = O[:, :256] * alpha + P V[:, :256]``, arrive ``empty[slot]``.
* worker 0 = PV warpgroup (4 warps), :func:`_w2_pv_wg`: per block wait ``ready[slot]`` (already passed: keeps the
  acquire of the producer's stores direct) and ``pready``, ``fence.proxy.async``, read alpha, rescale
  ``O[:, 256:]``, ``O[:, 256:] += P V[:, 256:]``, arrive ``pfree`` and ``empty[slot]``.
* worker 1 = the producer of the WS kernel, imported unchanged (``_w_producer`` V3.2 / ``_w_producer41`` V4.1, 4
  warps, same arguments as the WS kernel passes): gather + dequant into the 2-slot ring, validity mask per slot.

Barrier protocol (all mbarriers; ``it`` = ring counter over the CTA's blocks, ``msg`` = handshake counter):

1. ``ready[s]`` (count 1): producer -> both consumer warpgroups (each waits parity ``(it // 2) & 1``).
2. ``empty[s]`` (count 2): one arrive per consumer warpgroup after its P V of the slot completed (the softmax WG's
   after its S and P V: it is also the last reader of the RoPE tile); the producer waits parity ``((it//2)&1)^1``.
3. ``pready`` (count 1): softmax WG -> PV WG, "P and alpha (or at a request's end: the epilogue scale) are in
   shared memory"; PV waits parity ``msg & 1``.
4. ``pfree`` (count 1): PV WG -> softmax WG, "P / alpha buffer read (its P V completed)"; the softmax WG waits
   parity ``(msg & 1) ^ 1`` before overwriting P / alpha.
5. Per request one extra message: the per-row output scale (``1/L``, sink applied for single-split requests, 0 for
   empty rows) through the alpha buffer; each warpgroup then writes its 256 columns of ``out`` / ``o_acc``, the
   softmax WG also ``lse`` / ``l_acc`` (``_g_epilogue``'s expressions).

Invalid tokens need no tail zeroing: the producer's masked loads give exact-zero K/V rows and p = 0 for them.

Shared memory (cross-compiled, Triton 3.6, ``metadata.shared``): V3.2 Q 64 KB + 8 KB RoPE, ring 2 x (64 KB + 8 KB),
P 8 KB, + validity masks 128 B, alpha 256 B, 6 mbarriers, warp_specialize state: 230,064 B of the 232,448 B limit
(the WS kernel: 230,052 B; its cross-warpgroup reduction scratch is gone, the alpha buffer and 2 mbarriers are new);
V4.1 (no RoPE tiles) 205,472 B.

Registers (launch ``maxnreg`` 168, 12 warps; ``setmaxnreg``: PV warpgroup :data:`WS2_PV_REGS` = 160, producer 136
(V3.2, ``WS_PRODUCER_REGS``) / 120 (V4.1, ``WS_PRODUCER_REGS_V41``), the softmax warpgroup gets the rest: 208 (V3.2)
/ 224 (V4.1)). ptxas of the Triton 3.6 wheel, page shift 6 / -1 x lengths x sink: spill instructions in the
softmax token loop (605 / 569 SASS instructions, 40 / 36 HGMMA) 0, in the PV token loop (~187 instructions, 4 HGMMA)
0, in the producer block loop 5-6 (V3.2, ~1,320-1,340 instructions) / 12-14 (V4.1, ~1,380-1,400) -- the WS kernel's
producer numbers; 84-92 B (V3.2) / 56-60 B (V4.1) spill stores in all. The PV warpgroup's loop spilled 4 (PV 160),
6 (168), 2 (176; and the softmax loop then 5 at 192) until the per-request accumulator-row facts were re-loaded
after its token loop instead of kept live across it. Gluon's ``mbarrier.arrive`` in a 4-warp partition is a named
128-thread barrier + one predicated arrive (SASS ``BAR.SYNC 0x2, 0x80`` + ``SYNCS.ARRIVE``).

Prediction (H200, h_q 128, topk 2048, per (CTA, 64-token block); measured today: WS kernel 4.6 us = 252 TFLOPS,
its consumers alone 3.1 us, its producer alone 3.6 us; dense decode ~2.0 us for the same math). Tensor work per
block: S 64x64x576 = 2.36 M MAC (36 m64n64k16; Q read once per k-step for 64 token columns: half the Q
shared-memory traffic of the WS kernel's two m64n32 halves), P V 64x512x64 = 2.1 M MAC (4 m64n256k16 per
warpgroup): ~2,200 clk at 2,048 MAC/clk/SM = 1.2 us at 1.83 GHz, + the softmax (~300-400 clk, in-warpgroup
reductions, no CTA-wide barrier) of which the PV warpgroup's P V_right hides part, S_j+1 overlapping P V_right_j:
consumers ~2.0-2.4 us/block, like the dense decode kernel. The block time then becomes the producer's: ~3.6-3.9
us/block (the producer shares issue slots with 8 consumer warps as before) -> V3.2 ~290-320 TFLOPS at h_q 128
(1.15-1.28x the WS kernel), ws2 consumers alone (bench's ``_profile=1`` row) ~2.0-2.4 us/block; V4.1 the same
ratio on its 219-257 TFLOPS (~250-300); h_q 64: the same per-block gain. Beyond this the producer (gather +
dequant, 3.6 us) is the limit, not the consumers.

Not bit-identical to the WS kernel: the row sums are reduced over 64 columns in one warpgroup instead of 2 x 32 + a
cross-warpgroup add (max |diff| of out 3.05e-5 on the bench inputs); checked against the reference with FlashMLA's
tolerances.

Measured (H200, session 15, git 13766f45741b, ``benchmarks/device_sparse_ws2.sh`` as the first step of the closing
device call; results/sparse_decode_ws2-h200-2026-11-29-s15.json): smoke test and 41/41 GPU tests (grid, corner cases,
split counts with the combine, graph capture) through the public op. The consumers alone (``_profile=1``) 2.14-2.44
us per block at h_q 128 (prediction 2.0-2.4: inside; the WS kernel's consumers ~3.0), but the kernel stays
producer-bound: V3.2 (producer with the inline-PTX dequant + L2 prefetch) 0.977-0.994x the WS kernel (266 vs 272
TFLOPS at h_q 128 b 128 s_q 1), V4.1 1.038-1.049x (250.6 vs 240.4; 211.9 vs 204.1 at h_q 64). Prediction for the
kernel (1.15-1.28x) missed: the producer, not the consumers, sets the block time (~3.2-3.6 us alone, ~4.2-4.4 with
the consumers sharing the SM). Dispatched for V4.1 only.
"""
from __future__ import annotations

import os

import torch

from .._gluon import (IMPORT_ERROR as _IMPORT_ERROR, available, gl, async_copy, fence_async_shared,  # noqa: F401
                      mbarrier, warpgroup_mma, warpgroup_mma_wait)
from .._gluon import compile_sm90 as _compile_sm90_gluon, jit as _jit
from .._launch import cached_launcher
from ._gluon_sparse_decode import GLUON_FMTS, _g_part, _g_req_range, _page_shift, supported
from . import _gluon_sparse_decode_ws as _ws
from ._gluon_cluster import _c_lane, _c_remote_arrive, _c_smem_base, _c_sync
from ._gluon_timeline import put_asm, stamp_asm, tl_put, tl_stamp
from ._gluon_sparse_decode_ws import (WS_FMTS, WS_MAXNREG, WS_PRODUCER_FENCE, WS_PRODUCER_REGS,
                                      WS_PRODUCER_REGS_V41, _w_block_softmax, _w_producer, _w_producer41, _w_xrange)

__all__ = ["available", "supported_ws2", "launch_sparse_decode_gluon_ws2", "compile_sm90_ws2", "DISPATCH",
           "DISPATCH_FMTS", "dispatch_on", "WS2_PV_REGS", "WS2_NUM_WARPS"]

BLOCK_H = 64
WS2_NUM_WARPS = 4        # the default partition (softmax warpgroup); + 4 PV + 4 producer warps = 12
WS2_PV_REGS = 160        # setmaxnreg of the PV warpgroup (128 accumulator registers + addresses)
# sparse_decode.py sends the calls the WS kernel would take (no extra cache) here for the main-cache formats in
# DISPATCH_FMTS (or as DEEPKERNELS_SPARSE_WS2 overrides): V4.1 since its first device run (session 15, H200, git
# 13766f45741b, results/sparse_decode_ws2-h200-2026-11-29-s15.json: 41/41 GPU tests through the public op; V4.1
# 1.038-1.049x the WS kernel at all 4 bench shapes, 250.6 vs 240.4 TFLOPS at h_q 128 b 128 s_q 1); V3.2 stays on the
# WS kernel (0.977-0.994x: both are producer-bound -- WS2's consumers alone take 2.1-2.4 us per block against the
# WS consumers' ~3.0, the producer ~3.2-3.6)
DISPATCH_FMTS = frozenset({"v41"})
DISPATCH = True           # (the WS2 path exists; which formats take it: DISPATCH_FMTS)


def dispatch_on(fmt: str) -> bool:
    """Whether sparse_decode.py sends a call with main-cache format ``fmt`` that the WS kernel would take (no extra
    cache) here instead: ``fmt in DISPATCH_FMTS`` (with :data:`DISPATCH`), ``DEEPKERNELS_SPARSE_WS2=1`` / ``=0``
    override it for every format (read per call; the device scripts switch it for a whole run)."""
    env = os.environ.get("DEEPKERNELS_SPARSE_WS2", "")
    if env in ("0", "1"):
        return env == "1"
    return DISPATCH and fmt in DISPATCH_FMTS


_LOG2E = 1.4426950408889634

# TIMELINE instrumentation of the 2-CTA cluster kernel (``_gluon_sparse_decode_ws3``, launcher keyword ``timeline``:
# a ZEROED int64 [CTAs, TL_WORDS] buffer; constexpr TIMELINE of ``_w2_softmax_wg`` / ``_w2_pv_wg`` /
# ``_w3_producer``, off by default, never dispatched; notes benchmarks/notes/sparse_decode_timeline.md). Modelled on
# the dense decode kernel's (``_gluon_dense_decode._tl_put`` / ``_tl_stamp``): a stamp is ``%globaltimer`` (ns) by
# lane 0 of each warp of the partition as ``red.global.max.u64`` (the time the LAST warp got there), address formed
# inside the asm (nothing live across the loops). Per CTA (row = ``%ctaid.x``) a header of TL_HEADER words:
# 0 softmax warpgroup entry, 1 its start cluster barrier passed (metadata read), 2 its request loop done, 3 its end
# cluster barrier passed, 4 PV warpgroup's request loop done, 5 producer's start cluster barrier passed, 6 producer's
# request loop done, 7 %smid, 8 %cluster_ctarank, 9 pieces (end_req - begin_req + 1), 10 / 11 %clock64 at softmax
# entry / loop done, 12 hb | si << 32 (64-head block, query position), 13-15 unused; then TL_PIECE words for each of
# the first TL_MAX_PIECES request pieces (later pieces overwrite the last record) of the softmax warpgroup: 0 piece
# start (top of the request iteration), 1 its Q in shared memory, 2 first K block ready (its ``ready`` wait; = 1
# without blocks), 3 token loop done (last block's P V_L complete), 4 epilogue done (lse + own O half's stores
# issued), 5 request, 6 t_lo | t_end << 32 (positions), 7 nsp | split << 32. _s_tl_put / _s_tl_stamp address
# this layout (asm from deepkernels.mla._gluon_timeline).
TL_HEADER, TL_PIECE, TL_MAX_PIECES = 16, 8, 30
TL_WORDS = TL_HEADER + TL_PIECE * TL_MAX_PIECES
_TL_PUT_ASM = gl.constexpr(put_asm(TL_HEADER, TL_PIECE, TL_MAX_PIECES, TL_WORDS))
_TL_STAMP_ASM = gl.constexpr(stamp_asm(TL_HEADER, TL_PIECE, TL_MAX_PIECES, TL_WORDS))


# ----------------------------------------------------------------------------------------------- device code

@_jit
def _s_tl_put(tl_ptr, req, begin_req, word, val):
    """TIMELINE: ``tl_ptr[ctaid, off] = val`` in this kernel's layout (``off = word`` for ``req < 0``, else
    ``16 + min(req - begin_req, 29) * 8 + word``); :func:`deepkernels.mla._gluon_timeline.tl_put`."""
    return tl_put(tl_ptr, req, begin_req, word, val, _TL_PUT_ASM)


@_jit
def _s_tl_stamp(tl_ptr, req, begin_req, word):
    """TIMELINE: ``%globaltimer`` as an atomic max into the word :func:`_s_tl_put` addresses;
    :func:`deepkernels.mla._gluon_timeline.tl_stamp`."""
    return tl_stamp(tl_ptr, req, begin_req, word, _TL_STAMP_ASM)


@_jit
def _s_tl_sreg(tl_ptr, word, WHICH: gl.constexpr):
    """TIMELINE: a special register into header word ``word``: ``WHICH`` 0 ``%smid``, 1 ``%cluster_ctarank``,
    2 ``%clock64``."""
    if WHICH == 0:
        v = gl.inline_asm_elementwise(asm="mov.u32 $0, %smid;", constraints="=r,r", args=[gl.program_id(0)],
                                      dtype=gl.int32, is_pure=False, pack=1).to(gl.int64)
    elif WHICH == 1:
        v = gl.inline_asm_elementwise(asm="mov.u32 $0, %cluster_ctarank;", constraints="=r,r",
                                      args=[gl.program_id(0)], dtype=gl.int32, is_pure=False, pack=1).to(gl.int64)
    else:
        v = gl.inline_asm_elementwise(asm="mov.u64 $0, %clock64;", constraints="=l,r", args=[gl.program_id(0)],
                                      dtype=gl.int64, is_pure=False, pack=1)
    return _s_tl_put(tl_ptr, -1, 0, word, v)


@_jit
def _w2_write_half(o, inv, hb, req64, si64, nsp, base_row, split, out_ptr, oacc_ptr, s_q, h_q, acc_rows,
                   COL0: gl.constexpr, O_L: gl.constexpr):
    """Columns [COL0, COL0 + 256) of a request's output: ``o * inv`` to ``out`` (single split, bf16) or to the
    accumulator row ``base_row + split`` (``_g_epilogue``'s addressing and masks)."""
    heads_o = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, O_L))
    da = COL0 + gl.arange(0, 256, gl.SliceLayout(0, O_L))
    o = o * inv[:, None]
    if nsp <= 1:
        row_off_o = (req64 * s_q + si64) * h_q + heads_o.to(gl.int64)
        gl.store(out_ptr + row_off_o[:, None] * 512 + da[None, :], o.to(gl.bfloat16))
    else:
        acc_row = (base_row + split).to(gl.int64)
        ok = (acc_row >= 0) & (acc_row < acc_rows)
        a_off_o = (acc_row * s_q + si64) * h_q + heads_o.to(gl.int64)
        gl.store(oacc_ptr + a_off_o[:, None] * 512 + da[None, :], o, mask=((heads_o >= 0) & ok)[:, None])


@_jit
def _w2_scale(m_i, l_i, hb, req64, si64, nsp, base_row, split, sink_ptr, lse_ptr, lacc_ptr, s_q, h_q, acc_rows,
              sm_scale_log2, HAS_SINK: gl.constexpr, S_L: gl.constexpr):
    """``_g_epilogue``'s per-row part: stores ``lse`` (single split: natural log, +inf for an empty row) or the
    base-2 ``log2 L + m`` (-inf empty) to ``l_acc``; returns the per-row output scale (1 / (L + sink term) or 1 / L,
    0 for an empty row)."""
    empty = (l_i == 0.0) | (l_i != l_i)
    l_safe = gl.where(empty, 1.0, l_i)
    m_log2 = m_i * sm_scale_log2
    heads = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, S_L))
    if nsp <= 1:
        denom = l_safe
        if HAS_SINK:
            sink = gl.load(sink_ptr + heads) * 1.4426950408889634
            denom = l_safe + gl.exp2(sink - gl.where(empty, 0.0, m_log2))
        inv = gl.where(empty, 0.0, 1.0 / denom)
        lse = gl.where(empty, float("inf"), (gl.log2(l_safe) + m_log2) * 0.6931471805599453)
        row_off = (req64 * s_q + si64) * h_q + heads.to(gl.int64)
        gl.store(lse_ptr + row_off, lse)
    else:
        inv = gl.where(empty, 0.0, 1.0 / l_safe)
        acc_row = (base_row + split).to(gl.int64)
        ok = (acc_row >= 0) & (acc_row < acc_rows)
        a_off = (acc_row * s_q + si64) * h_q + heads.to(gl.int64)
        gl.store(lacc_ptr + a_off, gl.where(empty, float("-inf"), gl.log2(l_safe) + m_log2),
                 mask=(heads >= 0) & ok)
    return inv


@_jit
def _w2_q_issue(q_n, q_p, q_ptr, req, si64, hq, dq, stride_qb, stride_qs, stride_qh, FMT: gl.constexpr):
    """cp.async of request ``req``'s Q rows (this CTA's heads ``hq``) into ``q_n`` (V3.2 also the RoPE part into
    ``q_p``): 8 (9) chunks of [64, 64] bf16, all in flight, one commit group (``Q_ASYNC`` / ``Q_AHEAD``)."""
    D_V: gl.constexpr = 512
    q_rows = q_ptr + req.to(gl.int64) * stride_qb + si64 * stride_qs + hq.to(gl.int64)[:, None] * stride_qh
    for c in gl.static_range(8):
        async_copy.async_copy_global_to_shared(q_n.slice(c * 64, 64, dim=1), q_rows + (c * 64 + dq)[None, :])
    if FMT == 0:
        async_copy.async_copy_global_to_shared(q_p, q_rows + (D_V + dq)[None, :])
    async_copy.commit_group()


@_jit
def _w2_softmax_wg(q_n, q_p, kv_n, kv_p, p_smem, a_smem, vmask, ready, empty, pready, pfree, q_ptr, len_ptr,
                   sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr, stride_qb, stride_qs,
                   stride_qh, b, s_q, h_q, topk, acc_rows, sm_scale_log2,
                   HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, SBLOCK: gl.constexpr, FMT: gl.constexpr,
                   empty_off=0, CLUSTER: gl.constexpr = False, xlen_ptr=None, xtopk=None,
                   HAS_EXTRA: gl.constexpr = False, HAS_XLEN: gl.constexpr = False, Q_ASYNC: gl.constexpr = False,
                   Q_AHEAD: gl.constexpr = False, TIMELINE: gl.constexpr = False, tl_ptr=None):
    """Default partition (4 warps): Q, the full S = Q K^T, the online softmax, P + alpha to the PV warpgroup,
    O[:, :256] += P V[:, :256]; per request the output scale to the PV warpgroup, its half of the output and lse.
    ``CLUSTER`` (the 2-CTA cluster kernel, ``_gluon_sparse_decode_ws3``): cluster barriers at the partition's start
    and end and, after each local ``empty`` arrive, one on the peer CTA's ``empty`` (shared offset ``empty_off``);
    ``HAS_EXTRA``: a request's extra-cache blocks follow its main ones in the same token loop (only the count
    changes). ``Q_ASYNC`` (session 18, a cluster-kernel option, on for V3.2): each request's Q rows by cp.async, all 9 chunks
    in flight at once, instead of 9 load -> store round trips in series (~7 us per request piece in the profile).
    ``Q_AHEAD`` (session 20, the cluster kernel's option, dispatched for V4.1; ``_gluon_sparse_decode_ws3`` module
    docstring "Q ahead"; ``Q_ASYNC`` is then ignored): the first request's Q by cp.async before the request loop,
    every later one's right after the previous request's token loop, before its epilogue (the copies overlap it;
    ``q_n`` is free there: every S wgmma of the request completed, and a 128-thread barrier makes that true for the
    four warps); the request top waits for them. Every cp.async group is waited for (no issue without a request
    after it). ``TIMELINE`` (``CLUSTER`` only; ``tl_ptr`` the buffer): header words 0, 1, 2, 3, 7-12 and every
    piece record (:data:`TL_WORDS`); the first K block's ``ready`` wait is done once early, for its stamp (waiting
    a completed phase again returns at once)."""
    D_V: gl.constexpr = 512
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    LP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    LS: gl.constexpr = gl.SliceLayout(0, S_L)
    if TIMELINE:
        _s_tl_stamp(tl_ptr, -1, 0, 0)                           # header: softmax warpgroup entry
        _s_tl_sreg(tl_ptr, 10, 2)
    hb, si, begin_req, end_req, begin_blk, end_blk, begin_split = _g_part(meta_ptr, b, s_q, h_q)
    if CLUSTER:
        _c_sync()
        lane = _c_lane()
        gs = _c_smem_base()
    if TIMELINE:
        _s_tl_stamp(tl_ptr, -1, 0, 1)                           # start cluster barrier passed
        _s_tl_sreg(tl_ptr, 7, 0)
        _s_tl_sreg(tl_ptr, 8, 1)
        _s_tl_put(tl_ptr, -1, 0, 9, end_req - begin_req + 1)
        _s_tl_put(tl_ptr, -1, 0, 12, hb.to(gl.int64) + (si.to(gl.int64) << 32))
    si64 = si.to(gl.int64)
    hq = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, LP))
    dq = gl.arange(0, 64, gl.SliceLayout(0, LP))
    s_zero = gl.zeros([64, 64], gl.float32, S_L)
    it = 0
    msg = 0
    if Q_AHEAD:
        if begin_req <= end_req:       # the first request's Q (a part without requests issues nothing)
            _w2_q_issue(q_n, q_p, q_ptr, begin_req, si64, hq, dq, stride_qb, stride_qs, stride_qh, FMT)
    for req in range(begin_req, end_req + 1):
        req64 = req.to(gl.int64)
        if TIMELINE:
            _s_tl_stamp(tl_ptr, req, begin_req, 0)              # piece start
        if Q_AHEAD:
            async_copy.wait_group(0)   # this request's Q: issued before the loop or during the previous epilogue
        else:
            gl.thread_barrier()        # every S wgmma of the previous request (this warpgroup's) read Q
            if Q_ASYNC:
                _w2_q_issue(q_n, q_p, q_ptr, req, si64, hq, dq, stride_qb, stride_qs, stride_qh, FMT)
                async_copy.wait_group(0)
            else:
                q_rows = q_ptr + req64 * stride_qb + si64 * stride_qs + hq.to(gl.int64)[:, None] * stride_qh
                for c in gl.static_range(8):
                    q_n.slice(c * 64, 64, dim=1).store(gl.load(q_rows + (c * 64 + dq)[None, :]))
                if FMT == 0:
                    q_p.store(gl.load(q_rows + (D_V + dq)[None, :]))
        fence_async_shared()
        gl.thread_barrier()
        if TIMELINE:
            _s_tl_stamp(tl_ptr, req, begin_req, 1)              # Q in shared memory
        n, base_row, nsp, split, t_lo, _, t_end = _g_req_range(req, begin_req, end_req, begin_blk, end_blk,
                                                               begin_split, len_ptr, nsplits_ptr, topk, HAS_LEN,
                                                               SBLOCK)
        nblocks = gl.maximum(t_end - t_lo + 63, 0) // 64
        if HAS_EXTRA:
            x_lo, x_end = _w_xrange(req, end_req, end_blk, split, nsp, n, t_lo, xlen_ptr, xtopk, HAS_XLEN, SBLOCK)
            nblocks += gl.maximum(x_end - x_lo + 63, 0) // 64
        if TIMELINE:
            if nblocks > 0:
                mbarrier.wait(ready.index(it % 2), (it // 2) & 1)
            _s_tl_stamp(tl_ptr, req, begin_req, 2)              # first K block ready
            _s_tl_put(tl_ptr, req, begin_req, 5, req)
            _s_tl_put(tl_ptr, req, begin_req, 6, t_lo.to(gl.int64) + (t_end.to(gl.int64) << 32))
            _s_tl_put(tl_ptr, req, begin_req, 7, nsp.to(gl.int64) + (split.to(gl.int64) << 32))
        m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))   # running max of raw q.k
        l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, S_L))
        acc = gl.zeros([64, 256], gl.float32, O_L)
        for j in range(nblocks):
            slot = it % 2
            mbarrier.wait(ready.index(slot), (it // 2) & 1)
            # S of the whole block and the online softmax step (the WS consumers' expressions; row sum per block)
            p, alpha, m_i, l_i = _w_block_softmax(q_n, q_p, kv_n, kv_p, vmask, slot, s_zero, m_i, l_i, sm_scale_log2,
                                                  FMT, False, LS)
            # P and alpha to the PV warpgroup (once it released the previous ones)
            mbarrier.wait(pfree, (msg & 1) ^ 1)
            p_smem.store(p.to(gl.bfloat16))
            a_smem.store(alpha)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(pready)
            msg += 1
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
            tok_o = warpgroup_mma(p_smem, kv_n.index(slot).slice(0, 256, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(tok_o, ))
            mbarrier.arrive(empty.index(slot))
            if CLUSTER:
                _c_remote_arrive(lane, gs, empty_off, slot * 8)
            it += 1
        if TIMELINE:
            _s_tl_stamp(tl_ptr, req, begin_req, 3)              # token loop done
        if Q_AHEAD:   # the next request's Q, in flight during this epilogue (after the whole warpgroup's last S)
            if req < end_req:
                gl.thread_barrier()
                _w2_q_issue(q_n, q_p, q_ptr, req + 1, si64, hq, dq, stride_qb, stride_qs, stride_qh, FMT)

        # epilogue: lse / l_acc here, the output scale to the PV warpgroup, own half of the output
        inv = _w2_scale(m_i, l_i, hb, req64, si64, nsp, base_row, split, sink_ptr, lse_ptr, lacc_ptr, s_q, h_q,
                        acc_rows, sm_scale_log2, HAS_SINK, S_L)
        mbarrier.wait(pfree, (msg & 1) ^ 1)
        a_smem.store(inv)
        gl.thread_barrier()
        mbarrier.arrive(pready)
        msg += 1
        _w2_write_half(acc, gl.convert_layout(inv, gl.SliceLayout(1, O_L)), hb, req64, si64, nsp, base_row, split,
                       out_ptr, oacc_ptr, s_q, h_q, acc_rows, 0, O_L)
        if TIMELINE:
            _s_tl_stamp(tl_ptr, req, begin_req, 4)              # epilogue's stores issued
    if TIMELINE:
        _s_tl_stamp(tl_ptr, -1, 0, 2)                           # request loop done
        _s_tl_sreg(tl_ptr, 11, 2)
    if CLUSTER:
        _c_sync()
    if TIMELINE:
        _s_tl_stamp(tl_ptr, -1, 0, 3)                           # end cluster barrier passed


@_jit
def _w2_pv_wg(kv_n, p_smem, a_smem, ready, empty, pready, pfree, len_ptr, meta_ptr, nsplits_ptr, out_ptr, oacc_ptr,
              b, s_q, h_q, topk, acc_rows, HAS_LEN: gl.constexpr, SBLOCK: gl.constexpr, empty_off=0,
              CLUSTER: gl.constexpr = False, xlen_ptr=None, xtopk=None, HAS_EXTRA: gl.constexpr = False,
              HAS_XLEN: gl.constexpr = False, TIMELINE: gl.constexpr = False, tl_ptr=None):
    """Worker partition (4 warps): O[:, 256:] = O[:, 256:] * alpha + P V[:, 256:] per block; per request the
    output scale from the softmax warpgroup and its half of the output. ``CLUSTER`` / ``HAS_EXTRA``: as
    :func:`_w2_softmax_wg`; ``TIMELINE``: header word 4 (its request loop done)."""
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    hb, si, begin_req, end_req, begin_blk, end_blk, begin_split = _g_part(meta_ptr, b, s_q, h_q)
    if CLUSTER:
        _c_sync()
        lane = _c_lane()
        gs = _c_smem_base()
    si64 = si.to(gl.int64)
    it = 0
    msg = 0
    for req in range(begin_req, end_req + 1):
        req64 = req.to(gl.int64)
        n, base_row, nsp, split, t_lo, _, t_end = _g_req_range(req, begin_req, end_req, begin_blk, end_blk,
                                                               begin_split, len_ptr, nsplits_ptr, topk, HAS_LEN,
                                                               SBLOCK)
        nblocks = gl.maximum(t_end - t_lo + 63, 0) // 64
        if HAS_EXTRA:
            x_lo, x_end = _w_xrange(req, end_req, end_blk, split, nsp, n, t_lo, xlen_ptr, xtopk, HAS_XLEN, SBLOCK)
            nblocks += gl.maximum(x_end - x_lo + 63, 0) // 64
        acc = gl.zeros([64, 256], gl.float32, O_L)
        for j in range(nblocks):
            slot = it % 2
            mbarrier.wait(ready.index(slot), (it // 2) & 1)    # passed already (the softmax WG sent P after it)
            mbarrier.wait(pready, msg & 1)
            fence_async_shared()     # the producer's V stores (generic proxy) before this warpgroup's wgmma
            alpha = a_smem.load(gl.SliceLayout(1, O_L))
            acc = acc * alpha[:, None]
            tok = warpgroup_mma(p_smem, kv_n.index(slot).slice(256, 256, dim=1), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(tok, ))
            mbarrier.arrive(pfree)
            mbarrier.arrive(empty.index(slot))
            if CLUSTER:
                _c_remote_arrive(lane, gs, empty_off, slot * 8)
            msg += 1
            it += 1
        mbarrier.wait(pready, msg & 1)
        inv = a_smem.load(gl.SliceLayout(1, O_L))
        gl.thread_barrier()
        mbarrier.arrive(pfree)
        msg += 1
        # the request's accumulator-row facts again, after the token loop (fewer values live across it)
        hb, si, begin_req, end_req, begin_blk, end_blk, begin_split = _g_part(meta_ptr, b, s_q, h_q)
        n, base_row, nsp, split, t_lo, _, t_end = _g_req_range(req, begin_req, end_req, begin_blk, end_blk,
                                                               begin_split, len_ptr, nsplits_ptr, topk, HAS_LEN,
                                                               SBLOCK)
        _w2_write_half(acc, inv, hb, req64, si.to(gl.int64), nsp, base_row, split, out_ptr, oacc_ptr, s_q, h_q,
                       acc_rows, 256, O_L)
    if TIMELINE:
        _s_tl_stamp(tl_ptr, -1, 0, 4)                           # header: PV warpgroup's request loop done
    if CLUSTER:
        _c_sync()


@_jit
def _w2_smem(FMT: gl.constexpr):
    """Shared memory: Q, the 2-slot K (= V) ring, P, the alpha / scale vector; V3.2 (FMT 0) also the RoPE tiles
    (V4.1: ``p_smem`` stands in, never read); per slot the 64 tokens' validity (int8); mbarriers ``ready`` (count 1),
    ``empty`` (count 2: one arrive per consumer warpgroup), ``pready`` / ``pfree`` (count 1), initialised."""
    D_V: gl.constexpr = 512
    SH_N: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, D_V], gl.bfloat16)
    SH_P: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    q_n = gl.allocate_shared_memory(gl.bfloat16, [64, D_V], SH_N)
    kv_n = gl.allocate_shared_memory(gl.bfloat16, [2, 64, D_V], SH_N)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [64, 64], SH_P)
    if FMT == 0:
        q_p = gl.allocate_shared_memory(gl.bfloat16, [64, 64], SH_P)
        kv_p = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 64], SH_P)
    else:
        q_p = p_smem
        kv_p = p_smem
    a_smem = gl.allocate_shared_memory(gl.float32, [64], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    vmask = gl.allocate_shared_memory(gl.int8, [2, 64], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    pready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    pfree = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)      # one arrive per consumer warpgroup
    mbarrier.init(pready, count=1)
    mbarrier.init(pfree, count=1)
    return q_n, q_p, kv_n, kv_p, p_smem, a_smem, vmask, ready, empty, pready, pfree


_NO_SPEC = ["page", "num_tok", "b", "s_q", "h_q", "topk", "acc_rows"]


@_jit(do_not_specialize=_NO_SPEC)
def _sparse_decode_gluon_ws2_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
    stride_qb, stride_qs, stride_qh, stride_kb, page, num_tok, stride_ib, stride_is,
    b, s_q, h_q, topk, acc_rows, sm_scale_log2,
    PAGE_SHIFT: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, SBLOCK: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, PRODUCER_FENCE: gl.constexpr, FMT: gl.constexpr, PROFILE: gl.constexpr = 0,
    DEQ_ASM: gl.constexpr = False, PV_REGS: gl.constexpr = 160, PF_L2: gl.constexpr = False,
    ROW_LANES: gl.constexpr = False,
):
    """The WS kernel's arguments and constexprs (``PROFILE`` 1: the producer runs only the ring protocol -- the
    consumers' time alone; ``DEQ_ASM`` / ``PF_L2``: the producer's inline-PTX dequant / L2 prefetch of block j+2, as
    in the WS kernel) + ``PV_REGS``, the PV warpgroup's ``setmaxnreg``. Partitions: softmax warpgroup (default, 4 warps), PV warpgroup (4), producer (4)."""
    q_n, q_p, kv_n, kv_p, p_smem, a_smem, vmask, ready, empty, pready, pfree = _w2_smem(FMT)
    if FMT == 0:
        gl.warp_specialize([
            (_w2_softmax_wg, (q_n, q_p, kv_n, kv_p, p_smem, a_smem, vmask, ready, empty, pready, pfree, q_ptr,
                              len_ptr, sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
                              stride_qb, stride_qs, stride_qh, b, s_q, h_q, topk, acc_rows, sm_scale_log2,
                              HAS_LEN, HAS_SINK, SBLOCK, FMT)),
            (_w2_pv_wg, (kv_n, p_smem, a_smem, ready, empty, pready, pfree, len_ptr, meta_ptr, nsplits_ptr, out_ptr,
                         oacc_ptr, b, s_q, h_q, topk, acc_rows, HAS_LEN, SBLOCK)),
            (_w_producer, (kv_n, kv_p, vmask, ready, empty, kv_ptr, idx_ptr, len_ptr, meta_ptr, nsplits_ptr,
                           stride_kb, page, num_tok, stride_ib, stride_is, b, s_q, h_q, topk, None, None, None, None,
                           None, None, None, None, None, PAGE_SHIFT, HAS_LEN, SBLOCK, PRODUCER_FENCE, False, False, 0,
                           0, PROFILE, DEQ_ASM, PF_L2, ROW_LANES)),
        ], [4, 4], [PV_REGS, PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_w2_softmax_wg, (q_n, q_p, kv_n, kv_p, p_smem, a_smem, vmask, ready, empty, pready, pfree, q_ptr,
                              len_ptr, sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
                              stride_qb, stride_qs, stride_qh, b, s_q, h_q, topk, acc_rows, sm_scale_log2,
                              HAS_LEN, HAS_SINK, SBLOCK, FMT)),
            (_w2_pv_wg, (kv_n, p_smem, a_smem, ready, empty, pready, pfree, len_ptr, meta_ptr, nsplits_ptr, out_ptr,
                         oacc_ptr, b, s_q, h_q, topk, acc_rows, HAS_LEN, SBLOCK)),
            (_w_producer41, (kv_n, vmask, ready, empty, kv_ptr, idx_ptr, len_ptr, meta_ptr, nsplits_ptr,
                             stride_kb, page, num_tok, stride_ib, stride_is, b, s_q, h_q, topk, None, None, None,
                             None, None, None, None, None, None, PAGE_SHIFT, HAS_LEN, SBLOCK, PRODUCER_FENCE, False,
                             False, 0, 0, PROFILE, DEQ_ASM, PF_L2, ROW_LANES)),
        ], [4, 4], [PV_REGS, PRODUCER_REGS])


# ----------------------------------------------------------------------------------------------- host code

def supported_ws2(q: torch.Tensor, k_cache: torch.Tensor, fmt: str, extra_k_cache=None, config=None) -> bool:
    """``supported_ws`` restricted to calls without an extra cache: the single-partition kernel's gate
    (``_gluon_sparse_decode.supported``) and a V3.2 or V4.1 main cache."""
    if fmt not in WS_FMTS or extra_k_cache is not None:
        return False
    return supported(q, k_cache, fmt, extra_k_cache, config)


def _producer_regs(fmt: str) -> int:
    return WS_PRODUCER_REGS_V41 if fmt == "v41" else WS_PRODUCER_REGS


def launch_sparse_decode_gluon_ws2(out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt, attn_sink=None,
                                   extra_k_cache=None, extra_indices=None, xfmt=None, topk_length=None,
                                   extra_topk_length=None, config=None, _spec=None, *, pv_regs=None,
                                   producer_regs=None, maxnreg=None, producer_fence=None, _profile=0, deq_asm=None,
                                   pf_l2=None, row_lanes=None):
    """Drop-in for ``launch_sparse_decode_gluon_ws`` without an extra cache (same arguments and outputs; the caller
    checked :func:`supported_ws2`; ``config`` ignored; ``_spec`` as there). Keyword-only tuning knobs (benchmarks):
    PV / producer ``setmaxnreg``, launch ``maxnreg``, producer-side proxy fence, ``_profile`` 1 (the producer runs
    only the ring protocol: the consumers' time alone; output meaningless); ``deq_asm`` / ``pf_l2``: the producer
    options (default: the WS kernel's per-format choice, ``fmt in`` its ``WS_DEQ_ASM`` / ``WS_PF_L2``); ``row_lanes``:
    the producer's lanes over token rows first (default ``fmt in`` ``WS_ROW_LANES``)."""
    from .combine import combine_splits_
    from .metadata import SCHED_BLOCK

    if extra_k_cache is not None or fmt not in WS_FMTS:
        raise ValueError(f"launch_sparse_decode_gluon_ws2: main cache {fmt!r}, extra cache "
                         f"{'given' if extra_k_cache is not None else None}: V3.2 or V4.1 main cache, no extra cache "
                         f"only")
    b, s_q, h_q, _ = q.shape
    parts = sched.shape[0]
    o_acc, l_acc, acc_rows = _ws._acc_buffers(out, lse_buf, q, sched)
    kv = k_cache.view(torch.uint8)
    topk = indices.shape[2]
    ptrs, ints = _ws._main_args(out, lse_buf, q, kv, indices, sched, num_splits, attn_sink, topk_length, o_acc, l_acc,
                                acc_rows)
    spec = _ws._launch_spec(_spec, ptrs, ints, acc_rows, sched, num_splits)
    fence = WS_PRODUCER_FENCE if producer_fence is None else bool(producer_fence)
    opts = (WS2_NUM_WARPS, maxnreg or WS_MAXNREG)
    names = _CONSTEXPRS
    constexprs = (_page_shift(kv.shape[1]), topk_length is not None, attn_sink is not None, SCHED_BLOCK,
                  producer_regs or _producer_regs(fmt), fence, GLUON_FMTS[fmt], pv_regs or WS2_PV_REGS)
    constexprs += (int(_profile), bool((fmt in _ws.WS_DEQ_ASM) if deq_asm is None else deq_asm),
                   bool((fmt in _ws.WS_PF_L2) if pf_l2 is None else pf_l2),
                   bool((fmt in _ws.WS_ROW_LANES) if row_lanes is None else row_lanes))
    launcher = cached_launcher(_LAUNCHERS, _sparse_decode_gluon_ws2_kernel, (names, constexprs, opts, spec),
                               lambda: dict(zip(names, constexprs), num_warps=opts[0], maxnreg=opts[1]),
                               _LAUNCHER_LIMIT)
    launcher((parts * s_q * (h_q // BLOCK_H), ), *ptrs, *ints, scale * _LOG2E)
    combine_splits_(out, lse_buf.transpose(1, 2), o_acc, l_acc, num_splits, attn_sink=attn_sink,
                    lengths=topk_length, topk=topk, extra_lengths=None, extra_topk=None, rne=False, _spec=_spec)


_CONSTEXPRS = ("PAGE_SHIFT", "HAS_LEN", "HAS_SINK", "SBLOCK", "PRODUCER_REGS", "PRODUCER_FENCE", "FMT", "PV_REGS",
               "PROFILE", "DEQ_ASM", "PF_L2", "ROW_LANES")
_LAUNCHERS: dict = {}   # (kernel, (constexprs, options, specialisation)) -> KernelLauncher
_LAUNCHER_LIMIT = 1024


def compile_sm90_ws2(fmt: str = "v32", page_shift: int = 6, has_len: bool = True, has_sink: bool = True,
                     pv_regs=None, producer_regs=None, maxnreg=None, producer_fence=None, profile: int = 0,
                     deq_asm=None, pf_l2=None, row_lanes=None):
    """Cross-compile the kernel for sm90 (no GPU needed) with the divisibility facts of an aligned launch. Returns
    the CompiledKernel (``.asm['ptx']``, ``.metadata.shared``)."""
    fn = _sparse_decode_gluon_ws2_kernel
    sig = dict(q_ptr="*bf16", kv_ptr="*u8", idx_ptr="*i32", len_ptr="*i32", sink_ptr="*fp32", meta_ptr="*i32",
               nsplits_ptr="*i32", out_ptr="*bf16", lse_ptr="*fp32", oacc_ptr="*fp32", lacc_ptr="*fp32",
               stride_qb="i32", stride_qs="i32", stride_qh="i32", stride_kb="i32", page="i32", num_tok="i32",
               stride_ib="i32", stride_is="i32", b="i32", s_q="i32", h_q="i32", topk="i32", acc_rows="i32",
               sm_scale_log2="fp32")
    consts = dict(PAGE_SHIFT=page_shift, HAS_LEN=has_len, HAS_SINK=has_sink, SBLOCK=64,
                  PRODUCER_REGS=producer_regs or _producer_regs(fmt),
                  PRODUCER_FENCE=WS_PRODUCER_FENCE if producer_fence is None else bool(producer_fence),
                  FMT=GLUON_FMTS[fmt])
    # every constexpr, in parameter order (the cross-compile binds constexprs by position)
    consts.update(PROFILE=int(profile), DEQ_ASM=bool((fmt in _ws.WS_DEQ_ASM) if deq_asm is None else deq_asm),
                  PV_REGS=pv_regs or WS2_PV_REGS, PF_L2=bool((fmt in _ws.WS_PF_L2) if pf_l2 is None else pf_l2),
                  ROW_LANES=bool((fmt in _ws.WS_ROW_LANES) if row_lanes is None else row_lanes))
    hinted = [k for k, v in sig.items() if v.startswith("*")] + ["stride_qb", "stride_qs", "stride_qh", "stride_kb",
                                                                  "stride_ib", "stride_is"]
    return _compile_sm90_gluon(fn, sig, consts, hinted, num_warps=WS2_NUM_WARPS, maxnreg=maxnreg or WS_MAXNREG)
