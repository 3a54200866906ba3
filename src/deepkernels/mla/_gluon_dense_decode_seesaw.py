"""Gluon dense paged MLA decode for sm90 with a "seesaw" schedule (issue #5) -- NOT dispatched, not yet run on a GPU.

Same contract as :mod:`deepkernels.mla._gluon_dense_decode` (scheduler records, piece clamps, masking, causal
bottom-right, ``out``/``lse`` for single-split requests, ``o_acc``/``l_acc`` rows for the unchanged combine, lse
conventions) and the same launcher signature (:func:`gluon_dense_launch_seesaw`); only the work split between the
two math warpgroups changes. Shared helpers come from ``_gluon_dense_decode``.

Schedule. Two math warpgroups, WG0 (default partition, 4 warps) and WG1 (worker, 4 warps), each own HALF of the
output columns (``O[:, 0:256]`` / ``O[:, 256:512]``, 64x256 fp32 each) and alternate the S tiles of a piece: WG0
owns the piece's even tiles, WG1 the odd ones. The owner of tile t computes ``S_t = Q K_t^T`` (64x64, K = 576),
the online softmax from the running max it already holds, and publishes ``P_t`` (bf16 [64, 64]) and the new row
max ``m_t`` through shared memory; then BOTH warpgroups do ``O_half = O_half * alpha_t + P_t V_t[:, half]`` (the
non-owner derives ``alpha_t = exp2((m_{t-1} - m_t) * c)`` from the published max, bit-identical to the owner's).
A warpgroup's steps for its own tile t (issue order set by the constexpr ``ORDER``; config ``(num_stages,
math_regs, producer_regs, order)``):

  A. wait ``kready[t]``; issue ``S_t`` (async)                       (needs only Q and K_t)
  B. consume tile t-1 of the other warpgroup: wait ``pready`` (t-1), read ``m_{t-1}``, rescale O and l,
     issue ``P_{t-1} V_{t-1}[:, half]`` (async)
  C. wait for ``S_t``;  D. softmax of ``S_t``
  F. wait for ``P_{t-1} V``; arrive ``kempty[t-1]``
  E. wait ``pfree`` (t-1: the other WG's P_{t-1} V is done), store P_t, m_t (and zero V rows past the end of a
     partial tile, all 512 columns), fence, arrive ``pready`` (t)
  G. ``O *= alpha_t``; ``P_t V_t[:, half]``; wait; arrive ``kempty[t]`` and ``pfree`` (t)

ORDER 0: A B C D F E G -- S_t first, ``warpgroup_mma_wait(1)`` leaves P_{t-1} V in flight during the softmax.
ORDER 1: B A (C+F) D E G -- the other's P_{t-1} V first, so slot t-1 is released without queueing behind S_t;
nothing in flight in the softmax. ORDER 2 (default): WG0 runs ORDER 1, WG1 ORDER 0 -- FlashMLA's seesaw pairing:
for a pair (2i, 2i+1) WG0 does [P_{2i-1} V, S_2i] while WG1 does [S_2i+1]; WG0's softmax_2i runs under S_2i+1;
WG1 then issues P_2i V for its half and its softmax_2i+1 runs under both halves of P_2i V; both do P_2i+1 V; the
refill of slot 2i (after P_2i V) overlaps softmax_2i+1 and P_2i+1 V.
The same 2-stage K ring is used (Q 72 KB + 2 x 72 KB + one P 8 KB = 224 KB; a second P buffer would exceed 227 KB).

Barrier protocol (all mbarriers count 1 except ``kempty`` = 2; t is the CTA-global tile counter, carried across
pieces; r the piece counter):

* ``kready[s]`` (producer TMA -> owner of t): parity ``(t // 2) & 1``; only the owner waits (it alone reads K
  before ``pready``; the non-owner reads V only after ``pready``, which the owner arrives after its own wait).
* ``kempty[s]`` (count 2): one arrive from each math warpgroup after its P V of tile t completed (the owner's
  S_t completed before that). The producer waits parity ``((t // 2) & 1) ^ 1``. The owner of t+2 waits
  ``kready[t+2]`` only after it arrived ``kempty[t]`` itself (G of t), so no warpgroup holds a slot it waits on.
* ``pready`` (owner of t -> non-owner of t): parity ``t & 1``. ``pfree`` (owner of t -> owner of t+1, arrived
  after the owner's own P_t V completed): the writer of P_{t+1} waits parity ``t & 1`` and has itself completed
  its P_t V (F) before; so the single P / m buffer is overwritten only after both warpgroups read it. Arrivals on
  both barriers strictly alternate between the warpgroups (each arrive of t+1 is ordered after the wait of t), so
  no phase can be skipped.
* ``qready`` (WG0 -> WG1, parity ``r & 1``): Q of piece r in shared memory (WG0 loads it with plain loads).
  ``qfree`` (WG1 -> WG0, WG0 waits parity ``(r & 1) ^ 1`` before loading Q of piece r): WG1 finished piece r-1
  (every S wgmma on Q and its read of WG0's partial row sum).
* ``lready[w]`` (WG w -> the other, parity ``r & 1``): end-of-piece exchange of the per-warpgroup row sums
  ``l_w`` (each warpgroup keeps the sum over ITS tiles, rescaled by every tile's alpha, so ``L = l_0 + l_1``);
  ``lbuf[w]`` is rewritten only in piece r+1, after the Q hand-off, which orders it after the other's read.
Tiles 0 (both warpgroups only do the Q / l hand-off; ``L = 0``: zeros, lse +inf / -inf as today), 1 (WG0 owns
it, WG1 only consumes it), any parity of the tile count, partial last tiles and fully masked causal rows follow
the same paths. WG0 writes lse (it holds the final max: the last tile's max is read by the non-owner in B).

ptxas (CUDA 12.8 bundled with Triton 3.6, sm_90a; 9 warps padded to 12 = 384 threads, so the whole kernel is
allocated within 168 registers; setmaxnreg 256 / 232 / 40 for WG0 / WG1 / producer; shared memory 230,576 B of
232,448; no serialised wgmma (C7514) anywhere):

  ORDER 2: 264 B spill stores (causal or not); token loop of WG1 1 LDL, of WG0 16 LDL + 2-3 STL per own tile.
  ORDER 0: 252-272 B; WG1 loop 1 LDL, WG0 loop 14-17 LDL + 1-3 STL.
  ORDER 1: 264 B; WG1 loop 1 LDL, WG0 loop 16 LDL + 2-3 STL; no injected waits.
  WG0's loop spills are descriptor / pointer words (it also holds the Q-load state); moving the lse store to WG1
  made them worse (20 LDL + 5 STL). Wherever WG1 runs ORDER 0 (ORDER 0 and 2), ptxas injects one
  ``warpgroup.wait`` (C7517) in its B (S_t completes before O is rescaled) and schedules WG1's wait for its own
  P_{t-1} V before the softmax's exp2s (SASS), so WG1's softmax overlaps only the OTHER warpgroup's tensor-core work.

Prediction (per 64-token tile per CTA: S 64x64x576 = 2.36 M MAC + P V 64x512x64 = 2.10 M MAC = 8.9 MFLOP, 1.19 us
at the H200's ~7.5 dense TFLOP/s per SM, S ~0.63 + P V ~0.56; today's kernel takes ~2.1-2.5 us per tile at 475-559
TFLOPS, its softmax + hand-off ~0.5 us of it). With 2 ring stages K_{t+2} reuses slot t, released only after BOTH
halves of P_t V, then a ~0.7-0.9 us TMA refill of 72 KB. A timeline model (S 0.63, P V 0.56, softmax 0.5, refill
0.7 us): today ~1.7 us per tile, ORDER 1 ~1.7 (its softmax has nothing under it), ORDER 0 ~1.6 (the refill of
slot t-1 waits behind S_t), ORDER 2 ~1.4 (softmax_2i under S_2i+1, softmax_2i+1 under P_2i V, one refill gap per
pair) -- minus what the ptxas scheduling above takes back from WG1. Expected at h_q 128: ORDER 2 +5..+15 %
(~500-620 TFLOPS), ORDER 0 0..+8 %, ORDER 1 -5..+5 %; less at h_q 64. 620 everywhere probably also needs a deeper
ring (e.g. K in 32-token half tiles: 4 x 36 KB stages in the same 144 KB). Unmeasured until the next device call
(``benchmarks/device_mla_decode_seesaw.sh`` times all three orders against today's kernel).
"""
from __future__ import annotations

import torch

from .._launch import cached_launcher, spec_key
from .._gluon import gl, fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait
from .._gluon import compile_sm90 as _compile_sm90_gluon, jit as _jit
from . import _gluon_dense_decode as _base
from ._gluon_dense_decode import (_g_coords, _g_record, _g_piece, _g_producer, _g_zero_tail, _g_softmax,
                                  _g_out_rows, _g_write_half, _smem_layout, _LOG2E, available)

__all__ = ["available", "supported", "gluon_dense_launch_seesaw", "gluon_dense_forward_seesaw", "compile_sm90",
           "SEESAW_DEFAULT", "SEESAW_CANDIDATES"]

# (num_stages, math_regs, producer_regs, order): setmaxnreg of the worker partitions (WG1, producer) and the issue
# order inside a warpgroup's own tile (0: S_t first, 1: the other's P_{t-1} V first, 2: WG0 1 and WG1 0 -- FlashMLA's
# pairing; module docstring).
SEESAW_DEFAULT = (2, 232, 40, 2)
SEESAW_CANDIDATES = [SEESAW_DEFAULT, (2, 232, 40, 0), (2, 232, 40, 1)]


def supported(q: torch.Tensor, k_cache: torch.Tensor, rows: int) -> bool:
    """Same gate as today's Gluon kernel (:func:`deepkernels.mla._gluon_dense_decode.supported`)."""
    return _base.supported(q, k_cache, rows)


# ----------------------------------------------------------------------------------------------- device code

@_jit
def _sw_consume(t, o, m_i, l_i, k_nope, p_smem, m_smem, pready, sm_scale_log2, COL0: gl.constexpr,
                NUM_STAGES: gl.constexpr):
    """B of the other warpgroup's tile t: wait for its P_t / m_t, rescale, issue P_t V_t[:, half] (async)."""
    L_S: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    L_O: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    mbarrier.wait(pready, t & 1)
    m_new = m_smem.load(gl.SliceLayout(1, L_S))
    alpha = gl.exp2((m_i - m_new) * sm_scale_log2)
    l_i = l_i * alpha
    o = o * gl.convert_layout(alpha, gl.SliceLayout(1, L_O))[:, None]
    o_tok = warpgroup_mma(p_smem, k_nope.index(t % NUM_STAGES).slice(COL0, 256, dim=1), o, is_async=True)
    return o_tok, m_new, l_i


@_jit
def _sw_consume_last(t, o, m_i, l_i, k_nope, p_smem, m_smem, pready, kempty, sm_scale_log2, COL0: gl.constexpr,
                     NUM_STAGES: gl.constexpr):
    """The other warpgroup's trailing tile of a piece: B, wait, release the slot."""
    o_tok, m_i, l_i = _sw_consume(t, o, m_i, l_i, k_nope, p_smem, m_smem, pready, sm_scale_log2, COL0, NUM_STAGES)
    o = warpgroup_mma_wait(0, deps=(o_tok, ))
    mbarrier.arrive(kempty.index(t % NUM_STAGES))
    return o, m_i, l_i


@_jit
def _sw_own(t, t0, k1, lim, o, m_i, l_i, q_nope, q_rope, k_nope, k_rope, p_smem, m_smem, kready, kempty,
            pready, pfree, sm_scale_log2, HAS_PREV: gl.constexpr, COL0: gl.constexpr, NUM_STAGES: gl.constexpr,
            ORDER: gl.constexpr):
    """This warpgroup's own tile t (tokens [t0, t0 + 64)), steps of the module docstring: ORDER 0 = A B C D F E G
    (S_t issued first, the other's P_{t-1} V in flight during the softmax), ORDER 1 = B A (C+F) D E G (the other's
    P_{t-1} V issued first, so slot t-1 is released without waiting behind S_t; nothing in flight in the softmax)."""
    DT: gl.constexpr = k_nope.dtype
    L_S: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    L_O: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    slot = t % NUM_STAGES
    zero_s = gl.zeros([64, 64], gl.float32, L_S)
    if ORDER == 1:
        if HAS_PREV:
            # B
            o_tok, m_i, l_i = _sw_consume(t - 1, o, m_i, l_i, k_nope, p_smem, m_smem, pready, sm_scale_log2, COL0,
                                          NUM_STAGES)
        # A
        mbarrier.wait(kready.index(slot), (t // NUM_STAGES) & 1)
        s_tok = warpgroup_mma(q_nope, k_nope.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s_tok = warpgroup_mma(q_rope, k_rope.index(slot).permute((1, 0)), s_tok, is_async=True)
        if HAS_PREV:
            # C + F
            s, o = warpgroup_mma_wait(0, deps=(s_tok, o_tok))
            mbarrier.arrive(kempty.index((t - 1) % NUM_STAGES))
        else:
            s = warpgroup_mma_wait(0, deps=(s_tok, ))
        # D
        p, alpha, m_i, l_i = _g_softmax(s, m_i, l_i, t0, lim, sm_scale_log2, L_S)
    else:
        # A
        mbarrier.wait(kready.index(slot), (t // NUM_STAGES) & 1)
        s_tok = warpgroup_mma(q_nope, k_nope.index(slot).permute((1, 0)), zero_s, use_acc=False, is_async=True)
        s_tok = warpgroup_mma(q_rope, k_rope.index(slot).permute((1, 0)), s_tok, is_async=True)
        if HAS_PREV:
            # B (tile t-1 belongs to the other warpgroup)
            o_tok, m_i, l_i = _sw_consume(t - 1, o, m_i, l_i, k_nope, p_smem, m_smem, pready, sm_scale_log2, COL0,
                                          NUM_STAGES)
            # C
            s = warpgroup_mma_wait(1, deps=(s_tok, ))
        else:
            s = warpgroup_mma_wait(0, deps=(s_tok, ))
        # D
        p, alpha, m_i, l_i = _g_softmax(s, m_i, l_i, t0, lim, sm_scale_log2, L_S)
        if HAS_PREV:
            # F
            o = warpgroup_mma_wait(0, deps=(o_tok, ))
            mbarrier.arrive(kempty.index((t - 1) % NUM_STAGES))
    # E
    mbarrier.wait(pfree, (t & 1) ^ 1)
    p_smem.store(p.to(DT))
    m_smem.store(m_i)
    if k1 - t0 < 64:
        _g_zero_tail(k_nope.index(slot), k1 - t0, 64, 512, 4)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(pready)
    # G
    o = o * gl.convert_layout(alpha, gl.SliceLayout(1, L_O))[:, None]
    o_tok2 = warpgroup_mma(p_smem, k_nope.index(slot).slice(COL0, 256, dim=1), o, is_async=True)
    o = warpgroup_mma_wait(0, deps=(o_tok2, ))
    mbarrier.arrive(kempty.index(slot))
    mbarrier.arrive(pfree)
    return o, m_i, l_i


@_jit
def _sw_math_wg(q_ptr, k_nope, k_rope, q_nope, q_rope, p_smem, m_smem, l_smem, kready, kempty, pready, pfree,
                qready, qfree, lready, seqlens_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
                stride_qb, stride_qs, stride_qh, max_pages, b, s_q, h_q, group, rows, num_m_blocks, h_kv,
                acc_rows, sm_scale, sm_scale_log2,
                W: gl.constexpr, CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr, ORDER: gl.constexpr):
    L_S: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    L_O: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    L_Q: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    COL0: gl.constexpr = W * 256
    mb, kvh, part = _g_coords(num_m_blocks, h_kv)
    begin_req, end_req, begin_blk, end_blk, begin_split = _g_record(meta_ptr, part, b)
    rmask_s, sidx_s, hidx_s = _g_out_rows(mb, rows, group, kvh, L_S)
    rmask_o, sidx_o, hidx_o = _g_out_rows(mb, rows, group, kvh, L_O)
    kt = 0      # CTA-global tile counter at the start of the piece
    r = 0       # piece counter
    for req in range(begin_req, end_req + 1):
        seqlen, k0, k1 = _g_piece(req, begin_req, end_req, begin_blk, end_blk, begin_split, seqlens_ptr,
                                  nsplits_ptr, max_pages)
        if W == 0:
            # Q of this piece -> shared memory, after WG1 finished the previous piece
            rmask_q, sidx_q, hidx_q = _g_out_rows(mb, rows, group, kvh, L_Q)
            q_row = sidx_q.to(gl.int64) * stride_qs + hidx_q.to(gl.int64) * stride_qh
            dq = gl.arange(0, 64, gl.SliceLayout(0, L_Q))
            q_base = q_ptr + req.to(gl.int64) * stride_qb + q_row
            mbarrier.wait(qfree, (r & 1) ^ 1)
            for c in gl.static_range(8):
                x = gl.load(q_base[:, None] + (c * 64 + dq)[None, :], mask=rmask_q[:, None], other=0.0)
                q_nope.slice(c * 64, 64, dim=1).store(x)
            x = gl.load(q_base[:, None] + (512 + dq)[None, :], mask=rmask_q[:, None], other=0.0)
            q_rope.store(x)
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(qready)
        else:
            mbarrier.wait(qready, r & 1)

        if CAUSAL:
            limit = seqlen - (s_q - 1 - sidx_s)
        else:
            limit = seqlen + sidx_s * 0
        lim = gl.minimum(limit, k1)
        m_i = gl.full([64], -1e30, gl.float32, gl.SliceLayout(1, L_S))
        l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, L_S))
        o = gl.zeros([64, 256], gl.float32, L_O)
        n_tiles = gl.maximum(k1 - k0 + 63, 0) // 64
        if W == 0:
            if n_tiles > 0:
                o, m_i, l_i = _sw_own(kt, k0, k1, lim, o, m_i, l_i, q_nope, q_rope, k_nope, k_rope, p_smem,
                                      m_smem, kready, kempty, pready, pfree, sm_scale_log2, False, COL0, NUM_STAGES,
                                      ORDER)
            for j in range(2, n_tiles, 2):
                o, m_i, l_i = _sw_own(kt + j, k0 + j * 64, k1, lim, o, m_i, l_i, q_nope, q_rope, k_nope, k_rope,
                                      p_smem, m_smem, kready, kempty, pready, pfree, sm_scale_log2, True, COL0,
                                      NUM_STAGES, ORDER)
            if (n_tiles >= 2) & (n_tiles % 2 == 0):
                o, m_i, l_i = _sw_consume_last(kt + n_tiles - 1, o, m_i, l_i, k_nope, p_smem, m_smem, pready,
                                               kempty, sm_scale_log2, COL0, NUM_STAGES)
        else:
            for j in range(1, n_tiles, 2):
                o, m_i, l_i = _sw_own(kt + j, k0 + j * 64, k1, lim, o, m_i, l_i, q_nope, q_rope, k_nope, k_rope,
                                      p_smem, m_smem, kready, kempty, pready, pfree, sm_scale_log2, True, COL0,
                                      NUM_STAGES, ORDER)
            if n_tiles % 2 == 1:
                o, m_i, l_i = _sw_consume_last(kt + n_tiles - 1, o, m_i, l_i, k_nope, p_smem, m_smem, pready,
                                               kempty, sm_scale_log2, COL0, NUM_STAGES)
        kt += n_tiles

        # end of piece: exchange the per-warpgroup row sums (L = l_0 + l_1)
        l_smem.slice(W * 64, 64).store(l_i)
        gl.thread_barrier()
        mbarrier.arrive(lready.index(W))
        mbarrier.wait(lready.index(1 - W), r & 1)
        l_tot = l_i + l_smem.slice((1 - W) * 64, 64).load(gl.SliceLayout(1, L_S))
        if W == 1:
            gl.thread_barrier()
            mbarrier.arrive(qfree)      # WG1 is done with Q and lbuf[0] of this piece
        r += 1

        empty = (l_tot == 0.0) | (l_tot != l_tot)
        inv = gl.where(empty, 0.0, 1.0 / gl.where(empty, 1.0, l_tot))
        base_row = gl.load(nsplits_ptr + req)
        nsp = gl.load(nsplits_ptr + req + 1) - base_row
        split = base_row + gl.where(req == begin_req, begin_split, 0)
        _g_write_half(o, gl.convert_layout(inv, gl.SliceLayout(1, L_O)), req, split, nsp, rmask_o, sidx_o,
                      hidx_o, out_ptr, oacc_ptr, s_q, h_q, acc_rows, COL0, L_O)
        if W == 0:
            sidx64 = sidx_s.to(gl.int64)
            hidx64 = hidx_s.to(gl.int64)
            req64 = req.to(gl.int64)
            if nsp <= 1:
                lse_n = gl.where(empty, float("inf"), gl.log(gl.where(empty, 1.0, l_tot)) + m_i * sm_scale)
                gl.store(lse_ptr + (req64 * h_q + hidx64) * s_q + sidx64, lse_n, mask=rmask_s)
            else:
                acc_row = split.to(gl.int64)
                ok = (acc_row >= 0) & (acc_row < acc_rows)
                lse_2 = gl.where(empty, float("-inf"),
                                 gl.log2(gl.where(empty, 1.0, l_tot)) + m_i * sm_scale_log2)
                gl.store(lacc_ptr + (acc_row * s_q + sidx64) * h_q + hidx64, lse_2, mask=rmask_s & ok)


_NO_SPEC = ["stride_btb", "max_pages", "num_kv_blocks", "b", "s_q", "h_q",
            "group", "rows", "num_m_blocks", "h_kv", "acc_rows"]


def _mla_decode_seesaw_kernel_fn(q_ptr, kn_desc, kp_desc, bt_ptr, seqlens_ptr, meta_ptr, nsplits_ptr,
                              out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
                              stride_qb, stride_qs, stride_qh, stride_btb, max_pages, num_kv_blocks,
                              b, s_q, h_q, group, rows, num_m_blocks, h_kv, acc_rows, sm_scale, sm_scale_log2,
                              CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr,
                              MATH_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, ORDER: gl.constexpr):
    DT: gl.constexpr = kn_desc.dtype
    SL: gl.constexpr = kn_desc.layout
    k_nope = gl.allocate_shared_memory(DT, [NUM_STAGES, 64, 512], SL)
    k_rope = gl.allocate_shared_memory(DT, [NUM_STAGES, 64, 64], kp_desc.layout)
    q_nope = gl.allocate_shared_memory(DT, [64, 512], SL)
    q_rope = gl.allocate_shared_memory(DT, [64, 64], kp_desc.layout)
    p_smem = gl.allocate_shared_memory(DT, [64, 64], kp_desc.layout)
    vec: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    m_smem = gl.allocate_shared_memory(gl.float32, [64], vec)
    l_smem = gl.allocate_shared_memory(gl.float32, [128], vec)
    kready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    kempty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    pready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    pfree = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    qready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    qfree = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    lready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(kready.index(i), count=1)
        mbarrier.init(kempty.index(i), count=2)  # one arrive per math warpgroup
    mbarrier.init(pready, count=1)
    mbarrier.init(pfree, count=1)
    mbarrier.init(qready, count=1)
    mbarrier.init(qfree, count=1)
    mbarrier.init(lready.index(0), count=1)
    mbarrier.init(lready.index(1), count=1)
    # per-warpgroup issue order: ORDER 0 / 1 for both, ORDER 2 = WG0 order 1, WG1 order 0 (module docstring)
    ORDER_W0: gl.constexpr = ORDER - (ORDER == 2)
    ORDER_W1: gl.constexpr = ORDER * (ORDER < 2)
    gl.warp_specialize([
        (_sw_math_wg, (q_ptr, k_nope, k_rope, q_nope, q_rope, p_smem, m_smem, l_smem, kready, kempty, pready, pfree,
                       qready, qfree, lready, seqlens_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr,
                       lacc_ptr, stride_qb, stride_qs, stride_qh, max_pages, b, s_q, h_q, group, rows,
                       num_m_blocks, h_kv, acc_rows, sm_scale, sm_scale_log2, 0, CAUSAL, NUM_STAGES, ORDER_W0)),
        (_sw_math_wg, (q_ptr, k_nope, k_rope, q_nope, q_rope, p_smem, m_smem, l_smem, kready, kempty, pready, pfree,
                       qready, qfree, lready, seqlens_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr,
                       lacc_ptr, stride_qb, stride_qs, stride_qh, max_pages, b, s_q, h_q, group, rows,
                       num_m_blocks, h_kv, acc_rows, sm_scale, sm_scale_log2, 1, CAUSAL, NUM_STAGES, ORDER_W1)),
        (_g_producer, (kn_desc, kp_desc, k_nope, k_rope, kready, kempty, bt_ptr, seqlens_ptr, meta_ptr,
                       nsplits_ptr, stride_btb, max_pages, num_kv_blocks, b, num_m_blocks, h_kv, NUM_STAGES)),
    ], [4, 1], [MATH_REGS, PRODUCER_REGS])


_mla_decode_seesaw_kernel = _jit(_mla_decode_seesaw_kernel_fn, do_not_specialize=_NO_SPEC)


# ----------------------------------------------------------------------------------------------- host code

_CONSTEXPRS = ("CAUSAL", "NUM_STAGES", "MATH_REGS", "PRODUCER_REGS", "ORDER")
_LAUNCHERS: dict = {}
_LAUNCHER_LIMIT = 1024


def gluon_dense_launch_seesaw(q, k_cache, block_table, seqlens, sched, num_splits, scale, causal, out, lse, o_acc,
                              l_acc, config=None, _spec=None):
    """Launch the seesaw split-KV kernel (no combine); arguments and outputs exactly as
    :func:`deepkernels.mla._gluon_dense_decode.gluon_dense_launch` (``config`` = ``(num_stages, math_regs,
    producer_regs, order)``, default :data:`SEESAW_DEFAULT`)."""
    stages, math_regs, prod_regs, order = config or SEESAW_DEFAULT
    grid, args = _base._launch_args(q, k_cache, block_table, seqlens, sched, num_splits, out, lse, o_acc, l_acc)
    constexprs = (bool(causal and q.shape[1] > 1), stages, math_regs, prod_regs, order)
    launcher = cached_launcher(_LAUNCHERS, _mla_decode_seesaw_kernel,
                               (constexprs, spec_key(*args) if _spec is None else _spec),
                               lambda: dict(zip(_CONSTEXPRS, constexprs), num_warps=4), _LAUNCHER_LIMIT,
                               cache_descriptors=True)
    launcher(grid, *args, scale, scale * _LOG2E)
    return out, lse


def gluon_dense_forward_seesaw(q, k_cache, block_table, cache_seqlens, sched, num_splits, scale, causal,
                               config=None):
    """Whole split-KV step on the seesaw kernel: ``_gluon_dense_decode.gluon_dense_forward`` (allocate, NaN-poison
    when ``decode._POISON_OUTPUTS``, launch, unchanged combine) with :func:`gluon_dense_launch_seesaw`."""
    return _base.gluon_dense_forward(q, k_cache, block_table, cache_seqlens, sched, num_splits, scale, causal,
                                     config, launch=gluon_dense_launch_seesaw)


def compile_sm90(config=None, causal=False, dtype="bf16"):
    """Cross-compile the seesaw kernel for sm90 (no GPU needed). Returns the CompiledKernel."""
    stages, math_regs, prod_regs, order = config or SEESAW_DEFAULT
    lay = repr(_smem_layout())
    sig = {"q_ptr": f"*{dtype}", "kn_desc": f"tensordesc<{dtype}[64, 512],{lay}>",
           "kp_desc": f"tensordesc<{dtype}[64, 64],{lay}>", "bt_ptr": "*i32", "seqlens_ptr": "*i32",
           "meta_ptr": "*i32", "nsplits_ptr": "*i32", "out_ptr": f"*{dtype}", "lse_ptr": "*fp32",
           "oacc_ptr": "*fp32", "lacc_ptr": "*fp32",
           "stride_qb": "i32", "stride_qs": "i32", "stride_qh": "i32", "stride_btb": "i32", "max_pages": "i32",
           "num_kv_blocks": "i32", "b": "i32", "s_q": "i32", "h_q": "i32", "group": "i32", "rows": "i32",
           "num_m_blocks": "i32", "h_kv": "i32", "acc_rows": "i32", "sm_scale": "fp32", "sm_scale_log2": "fp32"}
    consts = dict(CAUSAL=causal, NUM_STAGES=stages, MATH_REGS=math_regs, PRODUCER_REGS=prod_regs,
                  ORDER=order)
    div16 = ("q_ptr", "bt_ptr", "seqlens_ptr", "meta_ptr", "nsplits_ptr", "out_ptr", "lse_ptr", "oacc_ptr",
             "lacc_ptr", "stride_qb", "stride_qs", "stride_qh")
    return _compile_sm90_gluon(_mla_decode_seesaw_kernel, sig, consts, div16, num_warps=4)
