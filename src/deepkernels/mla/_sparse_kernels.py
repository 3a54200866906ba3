"""Triton kernel for sparse top-k MLA decode over FP8/FP4 paged KV caches (split-KV stage; the combine is the one
dense decode uses, :mod:`deepkernels.mla.combine`).

One program = one (scheduler part, query position s, block of BLOCK_H query heads); the heads form the M dimension
of both MMAs (MQA: every head reads the same KV token). The program walks the requests of its part (FlashMLA
scheduler record, docs/spec/mla.md §3.1) and, per request, its share of the request's *virtual token line*:
``[0, 64*ceil(n_main/64))`` are main-cache positions, then ``[.., + n_extra)`` extra-cache positions (FlashMLA's
MODEL1 block order, spec §4). Per BLOCK_N positions it

1. loads the indices (positions ``>= topk_length`` read as -1) and marks a token valid iff
   ``0 <= idx < num_blocks * page_block_size`` -- any other value is never dereferenced;
2. gathers the token records by pointer (TMA gather is sm100-only), with int64 addresses
   ``(idx // page) * stride(0) + (idx % page) * record_bytes``;
3. dequantises in registers to bf16: fp32(e4m3 / e2m1) x fp32 scale, rounded once (V3.2 fp32 scales used as stored;
   UE8M0 / e4m3 scales are exact powers of two or exact products);
4. ``S = Q_a K_a^T (+ Q_rope K_rope^T for V3.2)`` where K_a is the 512-wide K = V tile (V3.2: the NoPE dims;
   MODEL1: 448 dequantised dims with its bf16 RoPE spliced into dims 448..511; V4.1/FP4: all 512), online softmax
   in base 2 with the running max in raw-score units (the max element gives exactly 2^0), P rounded to bf16 only as
   the PV operand, row sum from fp32 P;
5. ``O += P K_a``.

Invalid tokens load as zeros (masked loads) and their scores are set to -inf by selection, so NaN in unreferenced
cache slots can never reach the output. A request with one split writes ``out`` and ``lse`` directly (sink applied
here); a split request writes ``O/L`` and the base-2 ``log2 L + m`` to accumulator row ``num_splits[req] + split``
and :func:`deepkernels.mla.combine.combine_splits_` merges them (sink applied there, once).

Schedule reuse: split boundaries come from the scheduler record but are clamped to the request's actual token
line, and the last split of each request (``split == nsp - 1``) runs to the end of the line, so a schedule planned
for other lengths (reused ``FlashMLASchedMeta``) still covers every token exactly once. The running max is kept in
raw-score units, which needs ``sm_scale_log2 > 0``: the host rewrites a scale <= 0 exactly (``-q`` / ``q * 0``).

Format codes (constexpr ``FMT``/``XFMT``): 0 = V3.2 (656 B), 1 = MODEL1 (584 B), 2 = V4.1 (528 B), 3 = FP4 (288 B).
"""
from __future__ import annotations

import triton
import triton.language as tl

from .._triton_helpers import rne_bf16 as _rne_bf16
from .metadata import sched_record

__all__ = ["_sparse_decode_fwd_kernel", "online_softmax_step", "FMT_CODES"]

FMT_CODES = {"v32": 0, "model1": 1, "v41": 2, "fp4": 3}


@triton.jit
def _ue8m0_to_f32(e):
    """UE8M0 byte -> fp32 2^(e-127): 0 -> 2^-127 (subnormal bits), 255 -> NaN."""
    e32 = e.to(tl.int32)
    bits = tl.where(e32 == 0, 0x00400000, e32 << 23)
    v = bits.to(tl.float32, bitcast=True)
    return tl.where(e32 == 255, float("nan"), v)


@triton.jit
def _e2m1_pair_to_f32(raw):
    """Packed e2m1 bytes -> (even, odd) element values in fp32. The 3 magnitude bits go to fp32 bits 22..24 (exponent
    field = e2m1 exponent, top mantissa bit = e2m1 mantissa) and the sign to bit 31: that float is exactly the e2m1
    value times 2^-126 (the e2m1 subnormal 0.5 maps to an fp32 subnormal), so one exact multiply by 2^126 decodes
    {0, .5, 1, 1.5, 2, 3, 4, 6} with signs (mul.f32 keeps subnormals; no table, no select)."""
    r = raw.to(tl.int32)
    lo = ((r & 7) << 22) | ((r & 8) << 28)
    hi = ((r & 0x70) << 18) | ((r & 0x80) << 24)
    return (lo.to(tl.float32, bitcast=True) * 8.507059173023462e37,
            hi.to(tl.float32, bitcast=True) * 8.507059173023462e37)


@triton.jit
def _finish_bf16(x, UPCAST: tl.constexpr):
    if UPCAST:
        return _rne_bf16(x)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def online_softmax_step(s, valid, m_i, l_i, scale_log2, AXIS: tl.constexpr):
    """One block of an online softmax in base 2 with the running max in raw-score units (so the max element gives
    exactly 2^0 whatever the compiler fuses; FlashMLA d626421), shared by sparse decode and sparse prefill.

    ``s``: raw scores ``[rows, tokens]`` (AXIS = 1) or ``[tokens, rows]`` (AXIS = 0); ``valid [tokens]``: invalid
    tokens get score -inf by selection (never multiplied); ``m_i``, ``l_i [rows]``: running max (raw units) and sum.
    Returns ``(p, alpha, m_new, l_i)``: the block's fp32 probabilities (``s``'s layout), the rescale factor of the
    previous accumulator, the new running max and the updated row sum (from fp32 p). A row with no valid token so
    far keeps max -inf and gets p = 0, alpha = 1."""
    if AXIS == 1:
        s = tl.where(valid[None, :], s, float("-inf"))
    else:
        s = tl.where(valid[:, None], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, AXIS))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.exp2((m_i - m_safe) * scale_log2)
    if AXIS == 1:
        p = tl.exp2((s - m_safe[:, None]) * scale_log2)
    else:
        p = tl.exp2((s - m_safe[None, :]) * scale_log2)
    l_i = l_i * alpha + tl.sum(p, AXIS)
    return p, alpha, m_new, l_i


@triton.jit
def _gather_dequant(kv_ptr, idx, valid, page, stride_kb,
                    FMT: tl.constexpr, PAGE_SHIFT: tl.constexpr, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr):
    """Gather BLOCK_N token records and dequantise: returns (K_a [BLOCK_N, 512], K_rope [BLOCK_N, 64]).

    K_a is the 512-wide K = V tile (V3.2: the NoPE dims; MODEL1: 448 dequantised dims + the bf16 RoPE in dims
    448..511; V4.1/FP4: all 512). K_rope is V3.2's separate bf16 RoPE (zeros for the other formats, unused).
    bf16 on the GPU, bf16-valued fp32 under the interpreter."""
    if PAGE_SHIFT >= 0:     # power-of-two page: shift and mask instead of an integer division per token
        blk = idx >> PAGE_SHIFT
        row = idx & ((1 << PAGE_SHIFT) - 1)
    else:
        blk = idx // page
        row = idx - blk * page
    d = tl.arange(0, 512)
    dr = tl.arange(0, 64)
    vm = valid[:, None]
    if FMT == 0:        # V3.2: [512 e4m3][4 fp32][64 bf16]
        rec = blk.to(tl.int64) * stride_kb + row.to(tl.int64) * 656
        raw = tl.load(kv_ptr + rec[:, None] + d[None, :], mask=vm, other=0)
        sc = tl.load((kv_ptr + rec + 512).to(tl.pointer_type(tl.float32))[:, None] + tl.arange(0, 4)[None, :],
                     mask=vm, other=0.0)
        x = tl.reshape(raw.to(tl.float8e4nv, bitcast=True).to(tl.float32), (BLOCK_N, 4, 128))
        ka = tl.reshape(x * sc[:, :, None], (BLOCK_N, 512))
        kr = tl.load((kv_ptr + rec + 528).to(tl.pointer_type(tl.bfloat16))[:, None] + dr[None, :], mask=vm, other=0.0)
    elif FMT == 1:      # MODEL1: per block [B x (448 e4m3, 64 bf16)] then [B x (7 ue8m0, pad)]; RoPE -> tile 7
        base = blk.to(tl.int64) * stride_kb
        rec = base + row.to(tl.int64) * 576
        raw = tl.load(kv_ptr + rec[:, None] + d[None, :], mask=vm & (d[None, :] < 448), other=0)
        t = tl.arange(0, 8)
        e = tl.load(kv_ptr + (base + page.to(tl.int64) * 576 + row.to(tl.int64) * 8)[:, None] + t[None, :],
                    mask=vm & (t[None, :] < 7), other=0)
        sc = tl.where(t[None, :] < 7, _ue8m0_to_f32(e), 0.0)
        kr = tl.load((kv_ptr + rec + 448).to(tl.pointer_type(tl.bfloat16))[:, None] + dr[None, :], mask=vm,
                     other=0.0).to(tl.float32)
        x = tl.reshape(raw.to(tl.float8e4nv, bitcast=True).to(tl.float32), (BLOCK_N, 8, 64)) * sc[:, :, None]
        ka = tl.reshape(tl.where(t[None, :, None] == 7, kr[:, None, :], x), (BLOCK_N, 512))
    elif FMT == 2:      # V4.1: [512 e4m3 (RoPE incl.)][16 ue8m0]
        rec = blk.to(tl.int64) * stride_kb + row.to(tl.int64) * 528
        raw = tl.load(kv_ptr + rec[:, None] + d[None, :], mask=vm, other=0)
        e = tl.load(kv_ptr + (rec + 512)[:, None] + tl.arange(0, 16)[None, :], mask=vm, other=127)
        sc = _ue8m0_to_f32(e)
        x = tl.reshape(raw.to(tl.float8e4nv, bitcast=True).to(tl.float32), (BLOCK_N, 16, 32))
        ka = tl.reshape(x * sc[:, :, None], (BLOCK_N, 512))
        kr = tl.zeros([BLOCK_N, 64], dtype=tl.float32)
    else:               # FP4: [256 B of e2m1 pairs, even index in the low nibble][32 e4m3]
        rec = blk.to(tl.int64) * stride_kb + row.to(tl.int64) * 288
        raw = tl.load(kv_ptr + rec[:, None] + tl.arange(0, 256)[None, :], mask=vm, other=0)
        e = tl.load(kv_ptr + (rec + 256)[:, None] + tl.arange(0, 32)[None, :], mask=vm, other=0)
        sc = e.to(tl.float8e4nv, bitcast=True).to(tl.float32)[:, :, None]      # tile of byte j: j // 8
        lo, hi = _e2m1_pair_to_f32(raw)
        lo = tl.reshape(tl.reshape(lo, (BLOCK_N, 32, 8)) * sc, (BLOCK_N, 256))
        hi = tl.reshape(tl.reshape(hi, (BLOCK_N, 32, 8)) * sc, (BLOCK_N, 256))
        ka = tl.reshape(tl.join(lo, hi), (BLOCK_N, 512))                       # element 2j = lo, 2j+1 = hi
        kr = tl.zeros([BLOCK_N, 64], dtype=tl.float32)
    ka = _finish_bf16(ka, UPCAST)
    if FMT == 1:
        kr = tl.zeros([BLOCK_N, 64], dtype=tl.float32)
    if UPCAST:
        kr = kr.to(tl.float32)
    else:
        kr = kr.to(tl.bfloat16)
    return ka, kr


@triton.jit
def _attend_range(acc, m_i, l_i, q_a, q_r, kv_ptr, idx_row, t_lo, t_hi, n, page, stride_kb, num_tok,
                  sm_scale_log2,
                  FMT: tl.constexpr, PAGE_SHIFT: tl.constexpr, HAS_ROPE: tl.constexpr,
                  BLOCK_N: tl.constexpr, UPCAST: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Online softmax over positions [t_lo, t_hi) of one index row (positions >= n are invalid)."""
    for t0 in tl.range(t_lo, t_hi, BLOCK_N, num_stages=NUM_STAGES):
        offs = t0 + tl.arange(0, BLOCK_N)
        inb = offs < n
        idx = tl.load(idx_row + offs, mask=inb, other=-1)
        valid = inb & (idx >= 0) & (idx < num_tok)
        idx = tl.where(valid, idx, 0)
        ka, kr = _gather_dequant(kv_ptr, idx, valid, page, stride_kb, FMT, PAGE_SHIFT, BLOCK_N, UPCAST)
        s = tl.dot(q_a, tl.trans(ka))
        if HAS_ROPE:
            s = tl.dot(q_r, tl.trans(kr), s)
        p, alpha, m_new, l_i = online_softmax_step(s, valid, m_i, l_i, sm_scale_log2, 1)
        pb = _finish_bf16(p, UPCAST)
        acc = tl.dot(pb, ka, acc * alpha[:, None])
        m_i = m_new
    return acc, m_i, l_i


# Integer arguments that vary per decode step or per cache size only bound loops, clamps and masks: not specialised
# (no recompile when the batch becomes 1 or a multiple of 16, or with the schedule's size); strides, page sizes and
# topk stay specialised.
@triton.jit(do_not_specialize=["b", "num_tok", "xnum_tok", "acc_rows"])
def _sparse_decode_fwd_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, xkv_ptr, xidx_ptr, xlen_ptr, sink_ptr,
    meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
    stride_qb, stride_qs, stride_qh,
    stride_kb, page, num_tok, stride_ib, stride_is,
    stride_xkb, xpage, xnum_tok, stride_xib, stride_xis,
    b, s_q, h_q, topk, xtopk, acc_rows, sm_scale_log2,
    FMT: tl.constexpr, XFMT: tl.constexpr, PAGE_SHIFT: tl.constexpr, XPAGE_SHIFT: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_LEN: tl.constexpr,
    HAS_XLEN: tl.constexpr, HAS_SINK: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, XBLOCK_N: tl.constexpr, SBLOCK: tl.constexpr,
    UPCAST: tl.constexpr, NUM_STAGES: tl.constexpr,
):
    HAS_ROPE: tl.constexpr = FMT == 0      # V3.2: separate 64-wide bf16 RoPE tile (QK only); MODEL1's RoPE sits
    #                                        in dims 448..511 of its 512-wide K = V tile
    D_A: tl.constexpr = 512
    pid = tl.program_id(0)
    zero64 = pid.to(tl.int64) * 0
    n_hb = (h_q + BLOCK_H - 1) // BLOCK_H         # BLOCK_H may exceed h_q (padded head rows, masked)
    hb = pid % n_hb
    tmp = pid // n_hb
    si = tmp % s_q
    part = tmp // s_q
    begin_req, end_req, begin_blk, end_blk, begin_split = sched_record(meta_ptr, part, b)

    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = heads < h_q
    heads = tl.where(hm, heads, 0)
    da = tl.arange(0, D_A)
    dr = tl.arange(0, 64)
    si64 = si + zero64
    heads64 = heads.to(tl.int64)
    for req in range(begin_req, end_req + 1):
        req64 = req + zero64
        q_row = q_ptr + req64 * stride_qb + si64 * stride_qs + heads64[:, None] * stride_qh
        q_a = tl.load(q_row + da[None, :], mask=hm[:, None], other=0.0)
        if HAS_ROPE:
            q_r = tl.load(q_row + D_A + dr[None, :], mask=hm[:, None], other=0.0)
        else:
            q_r = tl.zeros([BLOCK_H, 64], dtype=tl.bfloat16)
        if UPCAST:
            q_a = q_a.to(tl.float32)
            q_r = q_r.to(tl.float32)
        n = topk + req * 0
        if HAS_LEN:
            n = tl.minimum(tl.maximum(tl.load(len_ptr + req), 0), topk)
        n_blk = (n + SBLOCK - 1) // SBLOCK
        base_row = tl.load(nsplits_ptr + req)
        nsp = tl.load(nsplits_ptr + req + 1) - base_row
        split = tl.where(req == begin_req, begin_split, 0)
        # the last split of a request runs to the end of its token line, whatever the lengths the schedule was
        # planned for (a reused FlashMLASchedMeta): the splits always partition [0, inf) of the actual line
        t_lo = tl.minimum(tl.maximum(tl.where(req == begin_req, begin_blk, 0), 0), 1 << 24) * SBLOCK
        t_hi = tl.minimum(tl.where((req == end_req) & (split < nsp - 1), end_blk, 1 << 24), 1 << 24) * SBLOCK

        m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
        l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, D_A], dtype=tl.float32)
        idx_row = idx_ptr + req64 * stride_ib + si64 * stride_is
        acc, m_i, l_i = _attend_range(acc, m_i, l_i, q_a, q_r, kv_ptr, idx_row, t_lo,
                                             tl.minimum(t_hi, n), n, page, stride_kb, num_tok, sm_scale_log2,
                                      FMT, PAGE_SHIFT, HAS_ROPE, BLOCK_N, UPCAST, NUM_STAGES)
        if HAS_EXTRA:
            nx = xtopk + req * 0
            if HAS_XLEN:
                nx = tl.minimum(tl.maximum(tl.load(xlen_ptr + req), 0), xtopk)
            off = n_blk * SBLOCK
            xidx_row = xidx_ptr + req64 * stride_xib + si64 * stride_xis
            acc, m_i, l_i = _attend_range(acc, m_i, l_i, q_a, q_r, xkv_ptr, xidx_row,
                                                 tl.maximum(t_lo - off, 0), tl.minimum(t_hi - off, nx), nx, xpage,
                                                 stride_xkb, xnum_tok, sm_scale_log2,
                                          XFMT, XPAGE_SHIFT, HAS_ROPE, XBLOCK_N, UPCAST, NUM_STAGES)

        acc_row = (base_row + split).to(tl.int64)
        empty = (l_i == 0.0) | (l_i != l_i)
        l_safe = tl.where(empty, 1.0, l_i)
        m_log2 = m_i * sm_scale_log2
        row_off = (req64 * s_q + si64) * h_q + heads64
        if nsp <= 1:
            denom = l_safe
            if HAS_SINK:
                sink = tl.load(sink_ptr + heads) * 1.4426950408889634
                denom = l_safe + tl.exp2(sink - tl.where(empty, 0.0, m_log2))
            inv = tl.where(empty, 0.0, 1.0 / denom)
            lse = tl.where(empty, float("inf"), (tl.log2(l_safe) + m_log2) * 0.6931471805599453)
            tl.store(lse_ptr + row_off, lse, mask=hm)
            o_ptr = out_ptr + row_off[:, None] * 512
            o = acc * inv[:, None]
            if UPCAST:
                o = _rne_bf16(o)
            tl.store(o_ptr + da[None, :], o.to(out_ptr.dtype.element_ty), mask=hm[:, None])
        else:
            inv = tl.where(empty, 0.0, 1.0 / l_safe)
            ok = (acc_row >= 0) & (acc_row < acc_rows)
            a_off = (acc_row * s_q + si64) * h_q + heads64
            tl.store(lacc_ptr + a_off, tl.where(empty, float("-inf"), tl.log2(l_safe) + m_log2), mask=hm & ok)
            a_ptr = oacc_ptr + a_off[:, None] * 512
            tl.store(a_ptr + da[None, :], acc * inv[:, None], mask=(hm & ok)[:, None])
