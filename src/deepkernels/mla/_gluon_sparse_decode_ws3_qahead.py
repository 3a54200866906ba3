"""Softmax warpgroup of the 2-CTA cluster sparse decode kernel with the next request's Q loaded ahead (``Q_AHEAD``,
an option of ``_gluon_sparse_decode_ws3``; session 20, opt-in until measured).

:func:`_w3_softmax_wg` is ``_gluon_sparse_decode_ws2._w2_softmax_wg`` with ``CLUSTER`` (the cluster barriers at the
partition's start and end, the remote ``empty`` arrive after each local one) and ``HAS_EXTRA`` as there, and one
change, where each request's Q is loaded:

* WS2 / WS3 (``Q_ASYNC`` or not): at the top of every request piece the warpgroup loads the piece's Q rows (64 heads
  x 512 (+ 64 RoPE) bf16, 64 (+ 8) KB) into ``q_n`` (``q_p``) and waits for them before its first S; the producer,
  2 ring slots ahead, idles once it has filled them (profile: benchmarks/notes/mla_sparse_gluon.md, "Session 20
  attribution (V4.1)": 0.88 long ``empty`` waits per request piece, ~7.3 us each).
* Here: the first request's Q by cp.async before the request loop; every later request's Q by cp.async right after
  the previous request's token loop, BEFORE its epilogue (lse, the output-scale hand-off, the 256-column output
  store), so the copies overlap the epilogue; the top of each request waits for them (``cp.async.wait_group 0``,
  ``fence.proxy.async``, the 128-thread barrier: what the wgmmas reading ``q_n`` need). ``q_n`` is free at that
  point: every S wgmma of the request completed (``_w_block_softmax`` waits for its S before the softmax), and a
  128-thread barrier before the copies makes that true for all four warps. Nothing else reads or writes ``q_n`` /
  ``q_p`` (the epilogue uses ``a_smem`` and registers; the PV warpgroup reads ``p_smem`` and the ring).

Same Q bytes into the same tile, same consumer expressions in the same order: out / lse are bit-identical to the build
without it (``tests/test_mla_sparse_decode_ws3_s20.py``). Every cp.async group is waited for: a CTA without requests
issues none (the first issue is guarded by ``begin_req <= end_req``), and the last request of a part issues none.
"""
from __future__ import annotations

from .._gluon import async_copy, fence_async_shared, gl, mbarrier, warpgroup_mma, warpgroup_mma_wait
from .._gluon import jit as _jit
from ._gluon_cluster import _c_lane, _c_remote_arrive, _c_smem_base, _c_sync
from ._gluon_sparse_decode import _g_part, _g_req_range
from ._gluon_sparse_decode_ws import _w_block_softmax, _w_xrange
from ._gluon_sparse_decode_ws2 import _w2_scale, _w2_write_half

__all__ = ["_w3_q_issue", "_w3_softmax_wg"]


@_jit
def _w3_q_issue(q_n, q_p, q_ptr, req, si64, hq, dq, stride_qb, stride_qs, stride_qh, FMT: gl.constexpr):
    """cp.async of request ``req``'s Q rows (this CTA's heads ``hq``) into ``q_n`` (V3.2 also the RoPE part into
    ``q_p``): 8 (9) chunks of [64, 64] bf16, all in flight, one commit group (``Q_ASYNC``'s copies)."""
    D_V: gl.constexpr = 512
    q_rows = q_ptr + req.to(gl.int64) * stride_qb + si64 * stride_qs + hq.to(gl.int64)[:, None] * stride_qh
    for c in gl.static_range(8):
        async_copy.async_copy_global_to_shared(q_n.slice(c * 64, 64, dim=1), q_rows + (c * 64 + dq)[None, :])
    if FMT == 0:
        async_copy.async_copy_global_to_shared(q_p, q_rows + (D_V + dq)[None, :])
    async_copy.commit_group()


@_jit
def _w3_softmax_wg(q_n, q_p, kv_n, kv_p, p_smem, a_smem, vmask, ready, empty, pready, pfree, q_ptr, len_ptr,
                   sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr, stride_qb, stride_qs,
                   stride_qh, b, s_q, h_q, topk, acc_rows, sm_scale_log2,
                   HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, SBLOCK: gl.constexpr, FMT: gl.constexpr,
                   empty_off, xlen_ptr=None, xtopk=None, HAS_EXTRA: gl.constexpr = False,
                   HAS_XLEN: gl.constexpr = False):
    """Default partition of the cluster kernel with ``Q_AHEAD`` (module docstring): ``_w2_softmax_wg`` with
    ``CLUSTER`` (and ``HAS_EXTRA`` / ``HAS_XLEN`` as there), each request's Q copied during the previous request's
    epilogue."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    LP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    LS: gl.constexpr = gl.SliceLayout(0, S_L)
    hb, si, begin_req, end_req, begin_blk, end_blk, begin_split = _g_part(meta_ptr, b, s_q, h_q)
    _c_sync()
    lane = _c_lane()
    gs = _c_smem_base()
    si64 = si.to(gl.int64)
    hq = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, LP))
    dq = gl.arange(0, 64, gl.SliceLayout(0, LP))
    s_zero = gl.zeros([64, 64], gl.float32, S_L)
    it = 0
    msg = 0
    if begin_req <= end_req:       # the first request's Q (a part without requests issues nothing)
        _w3_q_issue(q_n, q_p, q_ptr, begin_req, si64, hq, dq, stride_qb, stride_qs, stride_qh, FMT)
    for req in range(begin_req, end_req + 1):
        req64 = req.to(gl.int64)
        async_copy.wait_group(0)       # this request's Q: issued before the loop or during the previous epilogue
        fence_async_shared()
        gl.thread_barrier()
        n, base_row, nsp, split, t_lo, _, t_end = _g_req_range(req, begin_req, end_req, begin_blk, end_blk,
                                                               begin_split, len_ptr, nsplits_ptr, topk, HAS_LEN,
                                                               SBLOCK)
        nblocks = gl.maximum(t_end - t_lo + 63, 0) // 64
        if HAS_EXTRA:
            x_lo, x_end = _w_xrange(req, end_req, end_blk, split, nsp, n, t_lo, xlen_ptr, xtopk, HAS_XLEN, SBLOCK)
            nblocks += gl.maximum(x_end - x_lo + 63, 0) // 64
        m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))   # running max of raw q.k
        l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, S_L))
        acc = gl.zeros([64, 256], gl.float32, O_L)
        for j in range(nblocks):
            slot = it % 2
            mbarrier.wait(ready.index(slot), (it // 2) & 1)
            p, alpha, m_i, l_i = _w_block_softmax(q_n, q_p, kv_n, kv_p, vmask, slot, s_zero, m_i, l_i, sm_scale_log2,
                                                  FMT, False, LS)
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
            _c_remote_arrive(lane, gs, empty_off, slot * 8)
            it += 1
        # the next request's Q, in flight during this epilogue: every S wgmma of this request completed in its warp;
        # the barrier makes that true for the whole warpgroup before any copy overwrites Q
        if req < end_req:
            gl.thread_barrier()
            _w3_q_issue(q_n, q_p, q_ptr, req + 1, si64, hq, dq, stride_qb, stride_qs, stride_qh, FMT)
        # epilogue (``_w2_softmax_wg``'s): lse / l_acc here, the output scale to the PV warpgroup, own half of O
        inv = _w2_scale(m_i, l_i, hb, req64, si64, nsp, base_row, split, sink_ptr, lse_ptr, lacc_ptr, s_q, h_q,
                        acc_rows, sm_scale_log2, HAS_SINK, S_L)
        mbarrier.wait(pfree, (msg & 1) ^ 1)
        a_smem.store(inv)
        gl.thread_barrier()
        mbarrier.arrive(pready)
        msg += 1
        _w2_write_half(acc, gl.convert_layout(inv, gl.SliceLayout(1, O_L)), hb, req64, si64, nsp, base_row, split,
                       out_ptr, oacc_ptr, s_q, h_q, acc_rows, 0, O_L)
    _c_sync()
