"""Triton kernel for dense paged MLA decode (split-KV stage; FlashMLA SM90 dense decode semantics).

One program = one (sm part, kv head, block of BLOCK_M query rows). Query rows are FlashMLA's flattened
``row = s_q_idx * (h_q / h_kv) + head_in_group`` (docs/spec/mla.md §4), so all h_q/h_kv heads and all s_q positions of a
kv head share every KV tile (MQA: at h_q=128 a 64-row tile does 64x the FLOPs per byte). The program walks the
requests of its part (scheduler record, spec §3.1) and, per request, the KV tiles of its block range:

    S = Q_nope[M,512] @ K_nope^T + Q_rope[M,64] @ K_rope^T      (576 split as 512 + 64: power-of-two blocks)
    online softmax in log2 units with the running max kept in raw-score units, p = 2^((s - m)·scale·log2e)
    (no fused-FMA drift: the max element gives exactly 2^0 = 1 even for huge logits)
    O += bf16(P) @ V, V = K_nope (the same tile; KV is streamed once per (request, split))

Masking is by selection: tokens past the split end / sequence length are loaded as 0 (never read) and their scores
set to -inf; causal rows (bottom-right aligned) mask ``tok >= seqlen - (s_q - 1 - s_q_idx)``. Page indices are
clamped to ``[0, num_blocks)`` and never read past ``ceil(len / page)`` or the block-table row, so stale metadata or
bad lengths cannot fault. Offsets are int64.

Split boundaries come from the scheduler record (planned lengths) but are clamped to the actual ``seqlen``, and the
last split of each request (``split == nsp - 1``) runs to its actual end: any schedule of the same batch (a reused
``FlashMLASchedMeta`` after ``cache_seqlens`` grew or shrank) covers every token exactly once. The running max in
raw-score units needs ``sm_scale > 0``; the host rewrites a scale <= 0 exactly
(``deepkernels._validate.rewrite_nonpositive_scale``).

Finalisation: a request with one split writes ``out``/``lse`` (natural log, +inf when empty) directly; a split
request writes ``O/L`` and the base-2 ``log2 L + m`` (-inf when empty) to accumulator row
``num_splits[req] + split`` for the combine kernel.
"""
from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["_mla_decode_fwd_kernel"]


# Integer arguments that vary per call are not specialised (no recompile when b, h_q, the block-table width, ...
# happen to be 1 or multiples of 16); the strides stay specialised (they decide load vectorisation).
_NO_SPEC = ["stride_btb", "max_pages", "num_kv_blocks", "b", "s_q", "h_q", "group", "rows", "num_m_blocks", "h_kv",
            "acc_rows"]


@triton.jit(do_not_specialize=_NO_SPEC)
def _mla_decode_fwd_kernel(
    q_ptr, k_ptr, bt_ptr, seqlens_ptr, meta_ptr, nsplits_ptr,
    out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_kt, stride_kh,
    stride_btb, max_pages, num_kv_blocks,
    b, s_q, h_q, group, rows, num_m_blocks, h_kv, acc_rows,
    sm_scale, sm_scale_log2,
    CAUSAL: tl.constexpr, PAGE: tl.constexpr, SBLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, D_NOPE: tl.constexpr, D_PE: tl.constexpr,
    UPCAST: tl.constexpr, NUM_STAGES: tl.constexpr,
    TILE_IN_PAGE: tl.constexpr = False, V_SPLIT: tl.constexpr = 1, LAZY_RESCALE: tl.constexpr = False,
    WARP_SPEC: tl.constexpr = False,
):
    # TILE_IN_PAGE: every KV tile lies inside one page (host guarantees BLOCK_N divides PAGE and SBLOCK), so the
    #   tile needs one scalar block-table load and its rows are affine in the token index.
    # V_SPLIT = 2: the program computes all of S = Q K^T but only half of the 512 output columns (its "own" half
    #   of K_nope doubles as V); two programs share a (part, kv head, row block). Halves the accumulator.
    # LAZY_RESCALE: keep a stale running max while no row's max grows by more than 2^8 (block-uniform test), so
    #   the accumulator is rescaled only when needed; O/L and lse are unchanged (p <= 256 in fp32 / bf16).
    # WARP_SPEC: tl.range(warp_specialize=True) on the KV loop (experimental on sm90).
    DV: tl.constexpr = D_NOPE // V_SPLIT
    pid = tl.program_id(0)
    zero64 = pid.to(tl.int64) * 0
    vh = pid % V_SPLIT
    tmp = pid // V_SPLIT
    mb = tmp % num_m_blocks
    tmp = tmp // num_m_blocks
    kvh = tmp % h_kv
    part = tmp // h_kv
    rec = meta_ptr + part * 8
    begin_req = tl.maximum(tl.load(rec + 0), 0)
    end_req = tl.minimum(tl.load(rec + 1), b - 1)
    begin_blk = tl.load(rec + 2)
    end_blk = tl.load(rec + 3)
    begin_split = tl.load(rec + 4)

    r = mb * BLOCK_M + tl.arange(0, BLOCK_M)
    rmask = r < rows
    sidx = tl.where(rmask, r // group, 0)
    hidx = tl.where(rmask, kvh * group + r % group, 0)
    dv_own = vh * DV + tl.arange(0, DV)              # output / V columns of this program
    dv_oth = (1 - vh) * DV + tl.arange(0, DV)        # the other half (V_SPLIT == 2 only)
    dp = tl.arange(0, D_PE)
    offs_n = tl.arange(0, BLOCK_N)
    offs_n64 = offs_n.to(tl.int64)
    q_row = sidx.to(tl.int64) * stride_qs + hidx.to(tl.int64) * stride_qh
    kv_head_off = kvh.to(tl.int64) * stride_kh
    cdt = k_ptr.dtype.element_ty

    for req in range(begin_req, end_req + 1):
        req64 = req + zero64
        seqlen = tl.maximum(tl.load(seqlens_ptr + req), 0)
        nblk = (tl.maximum(seqlen - 1, 0) // SBLOCK) + 1
        # the last split of a request runs to the request's actual end: a schedule planned for shorter lengths
        # (reused FlashMLASchedMeta) still covers every token; boundaries past the end give empty splits
        # (num_splits is read again after the KV loop: nothing extra stays live across it)
        not_last = tl.where(req == begin_req, begin_split, 0) < (tl.load(nsplits_ptr + req + 1)
                                                                 - tl.load(nsplits_ptr + req) - 1)
        sb = tl.where(req == begin_req, begin_blk, 0)
        se = tl.where((req == end_req) & not_last, end_blk, nblk)
        k0 = tl.maximum(sb, 0) * SBLOCK
        k1 = tl.minimum(tl.minimum(se * SBLOCK, seqlen), max_pages * PAGE)

        q_base = q_ptr + req64 * stride_qb
        qn = tl.load(q_base + q_row[:, None] + dv_own[None, :], mask=rmask[:, None], other=0.0)
        qp = tl.load(q_base + q_row[:, None] + D_NOPE + dp[None, :], mask=rmask[:, None], other=0.0)
        if UPCAST:
            qn = qn.to(tl.float32)
            qp = qp.to(tl.float32)
        if V_SPLIT == 2:
            qo = tl.load(q_base + q_row[:, None] + dv_oth[None, :], mask=rmask[:, None], other=0.0)
            if UPCAST:
                qo = qo.to(tl.float32)
        if CAUSAL:
            limit = seqlen - (s_q - 1 - sidx)
        else:
            limit = seqlen + sidx * 0

        m_i = tl.full([BLOCK_M], -1e30, dtype=tl.float32)
        l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, DV], dtype=tl.float32)
        bt_row = bt_ptr + req64 * stride_btb
        for t0 in tl.range(k0, k1, BLOCK_N, num_stages=NUM_STAGES, warp_specialize=WARP_SPEC):
            tok = t0 + offs_n
            tmask = tok < k1
            if TILE_IN_PAGE:
                page = tl.load(bt_row + t0 // PAGE)
                page = tl.minimum(tl.maximum(page, 0), num_kv_blocks - 1)
                kbase = k_ptr + (page.to(tl.int64) * stride_kb + (t0 % PAGE + zero64) * stride_kt
                                 + kv_head_off)
                krow = kbase + offs_n64[:, None] * stride_kt
            else:
                page = tl.load(bt_row + tok // PAGE, mask=tmask, other=0)
                page = tl.minimum(tl.maximum(page, 0), num_kv_blocks - 1)
                koff = page.to(tl.int64) * stride_kb + (tok % PAGE).to(tl.int64) * stride_kt + kv_head_off
                krow = k_ptr + koff[:, None]
            kn = tl.load(krow + dv_own[None, :], mask=tmask[:, None], other=0.0)
            kp = tl.load(krow + D_NOPE + dp[None, :], mask=tmask[:, None], other=0.0)
            if UPCAST:
                kn = kn.to(tl.float32)
                kp = kp.to(tl.float32)
            s = tl.dot(qn, tl.trans(kn))
            if V_SPLIT == 2:
                ko = tl.load(krow + dv_oth[None, :], mask=tmask[:, None], other=0.0)
                if UPCAST:
                    ko = ko.to(tl.float32)
                s = tl.dot(qo, tl.trans(ko), s)
            s = tl.dot(qp, tl.trans(kp), s)
            valid = tmask[None, :] & (tok[None, :] < limit[:, None])
            s = tl.where(valid, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            if LAZY_RESCALE:
                grow = tl.max((m_new - m_i) * sm_scale_log2, 0)
                if grow > 8.0:
                    alpha = tl.exp2((m_i - m_new) * sm_scale_log2)
                    l_i = l_i * alpha
                    acc = acc * alpha[:, None]
                    m_i = m_new
                p = tl.exp2((s - m_i[:, None]) * sm_scale_log2)
                l_i = l_i + tl.sum(p, 1)
            else:
                alpha = tl.exp2((m_i - m_new) * sm_scale_log2)
                p = tl.exp2((s - m_new[:, None]) * sm_scale_log2)
                l_i = l_i * alpha + tl.sum(p, 1)
                acc = acc * alpha[:, None]
                m_i = m_new
            if UPCAST:
                acc = tl.dot(p, kn, acc)
            else:
                acc = tl.dot(p.to(cdt), kn, acc)

        base_row = tl.load(nsplits_ptr + req)
        nsp = tl.load(nsplits_ptr + req + 1) - base_row
        acc_row = (base_row + tl.where(req == begin_req, begin_split, 0)).to(tl.int64)
        empty = (l_i == 0.0) | (l_i != l_i)
        inv = tl.where(empty, 0.0, 1.0 / tl.where(empty, 1.0, l_i))
        o = acc * inv[:, None]
        sidx64 = sidx.to(tl.int64)
        hidx64 = hidx.to(tl.int64)
        fmask = rmask & (nsp <= 1)
        lse_n = tl.where(empty, float("inf"), tl.log(tl.where(empty, 1.0, l_i)) + m_i * sm_scale)
        ooff = ((req64 * s_q + sidx64) * h_q + hidx64) * D_NOPE
        tl.store(out_ptr + ooff[:, None] + dv_own[None, :], o.to(out_ptr.dtype.element_ty), mask=fmask[:, None])
        tl.store(lse_ptr + (req64 * h_q + hidx64) * s_q + sidx64, lse_n, mask=fmask & (vh == 0))
        smask = rmask & (nsp > 1) & (acc_row >= 0) & (acc_row < acc_rows)
        lse_2 = tl.where(empty, float("-inf"), tl.log2(tl.where(empty, 1.0, l_i)) + m_i * sm_scale_log2)
        aoff = (acc_row * s_q + sidx64) * h_q + hidx64
        tl.store(oacc_ptr + aoff[:, None] * D_NOPE + dv_own[None, :], o, mask=smask[:, None])
        tl.store(lacc_ptr + aoff, lse_2, mask=smask & (vh == 0))
