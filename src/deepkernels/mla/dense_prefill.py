"""Dense MHA-mode varlen prefill on Hopper: ``flash_attn_varlen_func`` & co.

Upstream FlashMLA offers this surface only on SM100 (CUTLASS FMHA, ``csrc/sm100/prefill/dense``). On sm90 the
bf16 calls :func:`deepkernels.mla._gluon_dense_prefill.supported` takes (d_qk 192/128, d_v 128, TMA-aligned K/V) run
the Gluon warp-specialised kernel of that module (fp16 compiles for it but has not run on a GPU, so it stays here); everything else (and the interpreter) runs this module's
FlashAttention-2-style Triton forward: one program per (128-row query block, sequence, head),
K/V streamed in ``BLOCK_N`` tiles with software pipelining, online softmax in base 2 with the running max in
raw-score units (the max element always gives ``exp2(0) = 1``), causal (bottom-right aligned) blocks
skipped entirely and only the diagonal blocks masked. d_qk = 192 is split into a 128 + 64 tile (Triton
block shapes are powers of two). GQA maps query head j to kv head ``j // (h / h_k)``.
"""
from __future__ import annotations

import warnings

import torch
import triton
import triton.language as tl

from .._backend import device_of, interpret_mode, use_kernels
from .._triton_helpers import rne_bf16 as _rne_bf16
from .._validate import check_flag, check_int, check_scale, check_tensor, rewrite_nonpositive_scale
from ..reference.mla_prefill import dense_prefill_ref
from . import _gluon_dense_prefill as _gdp

__all__ = ["flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func"]

_LOG2E = 1.4426950408889634





@triton.jit
def _dense_prefill_block(acc, m_i, l_i, q1, q2, k_base, v_base, stride_kt, stride_vt, start, end, s_k, diag,
                         scale_log2, offs_m,
                         D1: tl.constexpr, D2: tl.constexpr, DV: tl.constexpr, BLOCK_N: tl.constexpr,
                         MASK: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
                         NUM_STAGES: tl.constexpr):
    offs_d1 = tl.arange(0, D1)
    offs_dv = tl.arange(0, DV)
    for n0 in tl.range(start, end, BLOCK_N, num_stages=NUM_STAGES):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        k_rows = k_base + offs_n[:, None].to(tl.int64) * stride_kt
        v_rows = v_base + offs_n[:, None].to(tl.int64) * stride_vt
        if MASK:
            kmask = offs_n < s_k
            k1 = tl.load(k_rows + offs_d1[None, :], mask=kmask[:, None], other=0.0)
        else:
            k1 = tl.load(k_rows + offs_d1[None, :])
        if UPCAST:
            k1 = k1.to(tl.float32)
        s = tl.dot(q1, tl.trans(k1))
        if D2 > 0:
            offs_d2 = tl.arange(0, D2)
            if MASK:
                k2 = tl.load(k_rows + D1 + offs_d2[None, :], mask=kmask[:, None], other=0.0)
            else:
                k2 = tl.load(k_rows + D1 + offs_d2[None, :])
            if UPCAST:
                k2 = k2.to(tl.float32)
            s = tl.dot(q2, tl.trans(k2), s)
        if MASK:
            ok = kmask[None, :]
            if CAUSAL:
                ok = ok & (offs_n[None, :] <= offs_m[:, None] + diag)
            s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        if MASK:
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        else:
            m_safe = m_new
        alpha = tl.exp2((m_i - m_safe) * scale_log2)
        p = tl.exp2((s - m_safe[:, None]) * scale_log2)
        l_i = l_i * alpha + tl.sum(p, 1)
        if MASK:
            v = tl.load(v_rows + offs_dv[None, :], mask=kmask[:, None], other=0.0)
        else:
            v = tl.load(v_rows + offs_dv[None, :])
        if UPCAST:
            # the interpreter's fp32 -> bf16 cast truncates; fp32 -> fp16 rounds to nearest (numpy)
            if v.dtype == tl.float16:
                pv = tl.dot(p.to(tl.float16).to(tl.float32), v.to(tl.float32))
            else:
                pv = tl.dot(_rne_bf16(p), v.to(tl.float32))
        else:
            pv = tl.dot(p.to(v.dtype), v)
        acc = acc * alpha[:, None] + pv
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _dense_prefill_fwd_kernel(
    q_ptr, k_ptr, v_ptr, out_ptr, lse_ptr, cu_q_ptr, cu_k_ptr,
    sm_scale, scale_log2, n_m_blocks, total_q,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh, H, GROUP,
    D1: tl.constexpr, D2: tl.constexpr, DV: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, UPCAST: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    pid = tl.program_id(0)
    # consecutive programs share (sequence, head), so K/V tiles are reused from L2; within a head the
    # longest causal blocks run first
    m_block = n_m_blocks - 1 - pid % n_m_blocks
    bh = pid // n_m_blocks
    b = bh // H
    h = bh % H
    q0 = tl.load(cu_q_ptr + b)
    s_q = tl.load(cu_q_ptr + b + 1) - q0
    k0 = tl.load(cu_k_ptr + b)
    s_k = tl.load(cu_k_ptr + b + 1) - k0
    if m_block * BLOCK_M >= s_q:
        return
    kh = h // GROUP
    offs_m = m_block * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = offs_m < s_q
    tok = q0.to(tl.int64) + offs_m
    q_rows = q_ptr + tok[:, None] * stride_qt + h.to(tl.int64) * stride_qh
    offs_d1 = tl.arange(0, D1)
    q1 = tl.load(q_rows + offs_d1[None, :], mask=row_ok[:, None], other=0.0)
    if UPCAST:
        q1 = q1.to(tl.float32)
    q2 = q1
    if D2 > 0:
        offs_d2 = tl.arange(0, D2)
        q2 = tl.load(q_rows + D1 + offs_d2[None, :], mask=row_ok[:, None], other=0.0)
        if UPCAST:
            q2 = q2.to(tl.float32)
    k_base = k_ptr + k0.to(tl.int64) * stride_kt + kh.to(tl.int64) * stride_kh
    v_base = v_ptr + k0.to(tl.int64) * stride_vt + kh.to(tl.int64) * stride_vh

    diag = s_k - s_q                      # bottom-right aligned: row i sees keys j <= i + diag
    if CAUSAL:
        row_end = tl.minimum((m_block + 1) * BLOCK_M, s_q)
        hi = tl.minimum(tl.maximum(row_end + diag, 0), s_k)
        free = tl.minimum(tl.maximum(m_block * BLOCK_M + diag + 1, 0), hi)   # keys every row sees
    else:
        hi = s_k
        free = s_k
    n_full = (free // BLOCK_N) * BLOCK_N

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DV], tl.float32)
    acc, m_i, l_i = _dense_prefill_block(acc, m_i, l_i, q1, q2, k_base, v_base, stride_kt, stride_vt,
                                         0, n_full, s_k, diag, scale_log2, offs_m, D1, D2, DV, BLOCK_N,
                                         False, CAUSAL, UPCAST, NUM_STAGES)
    acc, m_i, l_i = _dense_prefill_block(acc, m_i, l_i, q1, q2, k_base, v_base, stride_kt, stride_vt,
                                         n_full, hi, s_k, diag, scale_log2, offs_m, D1, D2, DV, BLOCK_N,
                                         True, CAUSAL, UPCAST, NUM_STAGES)
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    out = acc * tl.where(empty, 0.0, 1.0 / l_safe)[:, None]
    if UPCAST and out_ptr.dtype.element_ty == tl.bfloat16:
        out = _rne_bf16(out)
    offs_dv = tl.arange(0, DV)
    o_rows = out_ptr + tok[:, None] * stride_ot + h.to(tl.int64) * stride_oh
    tl.store(o_rows + offs_dv[None, :], out.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])
    lse = tl.where(empty, float("inf"), m_i * sm_scale + tl.log(l_safe))
    tl.store(lse_ptr + h.to(tl.int64) * total_q + tok, lse, mask=row_ok)


@triton.jit
def _dense_prefill_uncovered_kernel(out_ptr, lse_ptr, cu_q_ptr, B, covered, total_q, H, stride_ot, stride_oh,
                                    DV: tl.constexpr, BLOCK_R: tl.constexpr):
    """Guard after the attention launch (grid ``B + 2``) for the query rows the attention grid never writes, when
    ``cu_seqlens_qo`` is on the device (not checked: a host sync). Program ``i < B``: rows ``>= covered`` of
    sequence i (the grid, sized from the caller's ``max_seqlen_qo``, did not reach them) get NaN out and lse (not
    computed). Program ``B``: rows ``[0, cu[0])``, program ``B + 1``: rows ``[cu[B], total_q)`` (in no sequence,
    e.g. CUDA-graph padding tokens) get out 0 / lse +inf (they see no key). Every range is clamped to
    ``[0, total_q)``, so nonsense ``cu_seqlens`` never make it write outside out / lse. Correct inputs: each program
    loads two ints and writes nothing."""
    pid = tl.program_id(0)
    is_seq = pid < B
    i_lo = tl.where(is_seq, pid, tl.where(pid == B, 0, B))
    c_lo = tl.load(cu_q_ptr + i_lo).to(tl.int64)
    c_hi = tl.load(cu_q_ptr + tl.where(is_seq, pid + 1, i_lo)).to(tl.int64)
    lo = tl.where(is_seq, c_lo + covered, tl.where(pid == B, 0, c_hi))
    hi = tl.where(is_seq, c_hi, tl.where(pid == B, c_lo, total_q))
    lo = tl.maximum(lo, 0)
    n = (tl.maximum(tl.minimum(hi, total_q) - lo, 0)).to(tl.int32)
    o_val = tl.where(is_seq, float("nan"), 0.0)
    l_val = tl.where(is_seq, float("nan"), float("inf"))
    fill_o = (tl.zeros([BLOCK_R, DV], tl.float32) + o_val).to(out_ptr.dtype.element_ty)
    fill_l = tl.zeros([BLOCK_R], tl.float32) + l_val
    offs_r = tl.arange(0, BLOCK_R)
    offs_d = tl.arange(0, DV)
    for r0 in range(0, n, BLOCK_R):
        rows = r0 + offs_r
        ok = rows < n
        tok = lo + rows
        o_p = out_ptr + tok[:, None] * stride_ot + offs_d[None, :]
        l_p = lse_ptr + tok
        for _h in range(H):
            tl.store(o_p, fill_o, mask=ok[:, None])
            tl.store(l_p, fill_l, mask=ok)
            o_p += stride_oh
            l_p += total_q


# (BLOCK_M, BLOCK_N, num_warps, num_stages) by d_qk. 8 warps put two warpgroups on the 128 query rows
# (Triton assigns all warps to M for chained dots). Chosen by benchmarks/mla_prefill.py --sweep on the H200
# (results/mla_prefill-h200-a161c54.json): (128, 128, 8, 2) best for d_qk 192 in all 4 shapes (+6-16% over
# BLOCK_N 64); for 128 within 2% of (128, 128, 8, 3).
DENSE_CONFIGS = {
    192: (128, 128, 8, 2),
    128: (128, 128, 8, 2),
}
DENSE_CANDIDATES = {
    192: [(128, 64, 8, 2), (128, 128, 8, 2), (128, 64, 8, 3), (64, 64, 4, 3)],
    128: [(128, 128, 8, 2), (128, 64, 8, 3), (128, 64, 8, 2), (128, 128, 8, 3)],
}


def _launch_dense_prefill(out, lse_hm, q, k, v, cu_q, cu_k, max_seqlen_q, softmax_scale, causal, config=None,
                          hint_checked=False):
    """Out-parameter launcher: ``out [total_q, h, d_v]`` (last dim contiguous), ``lse_hm [h, total_q]``
    contiguous fp32. Inputs validated by the public op.

    ``max_seqlen_q`` sizes the grid (upstream's meaning: the caller's promise that no query sequence is longer). It
    is clamped to ``total_q`` (no sequence is longer, so a huge hint never asks for more programs than that). Unless
    ``hint_checked`` (the public op checked the hint and ``cu_seqlens_qo`` on the host), a guard launch
    (:func:`_dense_prefill_uncovered_kernel`, ``b + 2`` programs) follows: rows of a sequence longer than the hint
    get NaN out / lse, rows in no sequence (``cu_seqlens_qo`` ending before ``total_q``: CUDA-graph padding) out 0 /
    lse +inf, so no row ever keeps what the buffer held (checking device ``cu_seqlens`` would be a host sync)."""
    total_q, h, d_qk = q.shape
    b = cu_q.shape[0] - 1
    if total_q == 0 or h == 0:
        return
    hint, max_seqlen_q = int(max_seqlen_q), min(int(max_seqlen_q), total_q)
    # both kernels put (row block, sequence, head) on grid axis 0 with int32 program ids (Gluon and Triton use 128
    # rows per block for every dispatched config; an explicit config with fewer rows only makes the grid larger)
    n_prog = triton.cdiv(max_seqlen_q, (config or (128,))[0]) * b * h
    if n_prog > 2 ** 31 - 1:
        raise ValueError(f"max_seqlen_qo={hint} (used as {max_seqlen_q} <= total_q) with b={b} sequences and h={h} "
                         f"heads needs {n_prog} programs, more than a grid holds (2^31 - 1): pass the real longest "
                         "query length, or split the batch")
    covered = 0
    if max_seqlen_q == 0 or b == 0:
        pass
    elif config is None and q.dtype == torch.bfloat16 and _gdp.supported(q, k, v):
        # sm90, bf16 (fp16 compiles but has not run on a GPU: it stays on the Triton kernel): the Gluon warp-specialised kernel (TMA producer, two 64-row consumer warpgroups, 128-key tiles, S_j
        # issued before softmax_{j-1} finishes). H200, b 2, h 128, s 4096/8192, d 192/128, causal and not: 509-653
        # TFLOPS = 0.86-1.10x torch SDPA vs 0.78-0.84x for this Triton kernel in the same run
        # (results/mla_prefill_dense_gluon_v2-h200-2026-11-29.json). Explicit configs and
        # DEEPKERNELS_DISABLE_GLUON=dense_prefill keep the Triton kernel.
        _gdp.launch_dense_prefill_gluon(out, lse_hm, q, k, v, cu_q, cu_k, max_seqlen_q, softmax_scale, causal)
        covered = triton.cdiv(max_seqlen_q, _gdp.BLOCK_M) * _gdp.BLOCK_M
    else:
        block_m, block_n, num_warps, num_stages = config or DENSE_CONFIGS[d_qk]
        d1 = 128
        n_m = triton.cdiv(max_seqlen_q, block_m)
        grid = (n_m * b * h,)
        _dense_prefill_fwd_kernel[grid](
            q, k, v, out, lse_hm, cu_q, cu_k,
            float(softmax_scale), float(softmax_scale) * _LOG2E, n_m, total_q,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), out.stride(0),
            out.stride(1), h, h // k.shape[1], D1=d1, D2=d_qk - d1, DV=v.shape[-1], BLOCK_M=block_m,
            BLOCK_N=block_n, CAUSAL=bool(causal), UPCAST=interpret_mode(), NUM_STAGES=num_stages,
            num_warps=num_warps, num_stages=num_stages,
        )
        covered = n_m * block_m
    if not hint_checked:
        _dense_prefill_uncovered_kernel[(b + 2,)](out, lse_hm, cu_q, b, covered, total_q, h, out.stride(0),
                                                  out.stride(1), DV=v.shape[-1], BLOCK_R=16, num_warps=4)


def _fix_last(t):
    return t if t.stride(-1) == 1 else t.contiguous()


def flash_attn_varlen_func(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, dropout_p=0.0,
                           softmax_scale=None, causal=False, deterministic=False, is_varlen=True):
    """Dense MHA-mode varlen attention forward (FlashMLA ``flash_attn_varlen_func``, SM100 FMHA semantics).

    Args:
        q: ``[total_q, h, d_qk]`` bf16 or fp16, d_qk in {192, 128}; any strides (last dim ideally contiguous).
        k: ``[total_k, h_k, d_qk]``, v: ``[total_k, h_k, 128]``, same dtype as q; ``h % h_k == 0`` (GQA).
        cu_seqlens_qo, cu_seqlens_kv: ``[b + 1]`` int32 prefix sums of the per-sequence lengths
            (non-decreasing, starting at 0, ending at total_q / total_k; zero-length sequences allowed).
        max_seqlen_qo: int >= every query length (sizes the grid, as upstream; clamped to total_q, so a larger one
            only costs nothing); max_seqlen_kv: int >= 0, unused (key lengths come from cu_seqlens_kv: any value
            gives the same result). Python or NumPy integers (not bool, float or str: TypeError naming the argument;
            a negative one: ValueError).
        dropout_p: must be 0. softmax_scale: default ``d_qk ** -0.5``; any finite real (as FlashMLA; <= 0 is exact:
            the kernels, whose running max is in raw-score units, run on ``-q`` with ``|scale|``, or on ``q * 0``
            with scale 1 for 0). causal: bottom-right aligned, row i of
            a sequence sees keys ``j <= i + s_k - s_q``; a bool (NumPy bool, 0 / 1, None = False; a str: TypeError). deterministic: must be False (the forward is
            deterministic anyway). is_varlen: accepted for compatibility.

    Returns:
        ``(out [total_q, h, 128] in q's dtype, lse [total_q, h] fp32 natural log)``; ``lse`` is the transposed
        view of a contiguous ``[h, total_q]`` buffer, as upstream. Rows that see no key: out 0, lse +inf.

    Raises:
        TypeError / ValueError naming the argument for bad dtypes, shapes, devices, head dims, dropout,
        non-integer or negative ``max_seqlen_qo`` / ``max_seqlen_kv``, a non-finite ``softmax_scale`` (also one
        beyond the float range, e.g. ``10**400``; one that is not a real number / one-element tensor: TypeError), or
        a ``max_seqlen_qo`` smaller than a query length when ``cu_seqlens_qo`` is on the host (CPU inputs). On
        CUDA, ``cu_seqlens_qo`` lives on the device and is not read (a host sync): a too-small ``max_seqlen_qo``
        leaves query rows past ``ceil(max_seqlen_qo / 128) * 128`` of a longer sequence uncomputed, and those rows
        come back as **NaN** out and lse; rows of q in no sequence (``cu_seqlens_qo[-1] < total_q``, e.g.
        CUDA-graph padding tokens; ``cu_seqlens_qo[0] > 0``) come back as out 0 / lse +inf (they see no key). A
        guard launch writes both kinds: never stale memory, never a plausible value. Also a ValueError: a
        ``max_seqlen_qo`` whose grid, ``ceil(min(max_seqlen_qo, total_q) / 128) * b * h`` programs, passes 2^31 - 1.

    CUDA tensors (or any under ``TRITON_INTERPRET=1``) run the Triton kernel; CPU tensors run
    :func:`deepkernels.reference.mla_prefill.dense_prefill_ref`. Forward only on every backend: the outputs never
    require grad (a UserWarning says so when an input requires grad under grad mode).
    """
    check_tensor("q", q, ndim=3, dtype=(torch.bfloat16, torch.float16))
    check_tensor("k", k, ndim=3, dtype=q.dtype)
    check_tensor("v", v, ndim=3, dtype=q.dtype)
    check_tensor("cu_seqlens_qo", cu_seqlens_qo, ndim=1, dtype=torch.int32)
    check_tensor("cu_seqlens_kv", cu_seqlens_kv, ndim=1, dtype=torch.int32)
    total_q, h, d_qk = q.shape
    total_k, h_k, _ = k.shape
    if (d_qk, v.shape[-1]) not in ((192, 128), (128, 128)):
        raise ValueError(f"(d_qk, d_v) must be (192, 128) or (128, 128), got q {list(q.shape)}, v {list(v.shape)}")
    if k.shape[2] != d_qk or v.shape[0] != total_k or v.shape[1] != h_k:
        raise ValueError(f"k must be [total_k, h_k, {d_qk}] and v [total_k, h_k, 128]; got k {list(k.shape)}, "
                         f"v {list(v.shape)}")
    if h_k == 0 or h % h_k != 0:
        raise ValueError(f"h ({h}) must be a multiple of h_k ({h_k}); q {list(q.shape)}, k {list(k.shape)}")
    if cu_seqlens_qo.shape != cu_seqlens_kv.shape or cu_seqlens_qo.shape[0] < 1:
        raise ValueError(f"cu_seqlens_qo and cu_seqlens_kv must both be [b + 1], got "
                         f"{list(cu_seqlens_qo.shape)} and {list(cu_seqlens_kv.shape)}")
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p must be 0.0, got {dropout_p}")
    if deterministic:
        raise ValueError("deterministic=True is not supported (upstream asserts it is False)")
    causal = check_flag("causal", causal)   # a str ("False") would be truthy: TypeError, as upstream's pybind bool
    max_seqlen_qo = check_int("max_seqlen_qo", max_seqlen_qo, min_value=0)
    check_int("max_seqlen_kv", max_seqlen_kv, min_value=0)
    if softmax_scale is None:
        softmax_scale = d_qk ** -0.5
    softmax_scale = check_scale("softmax_scale", softmax_scale)   # any finite real; <= 0 rewritten for the kernels
    dev = device_of(q, k, v, cu_seqlens_qo, cu_seqlens_kv)
    if cu_seqlens_qo.device.type == "cpu":
        cq, ck = cu_seqlens_qo.tolist(), cu_seqlens_kv.tolist()
        lq = [b - a for a, b in zip(cq, cq[1:])]
        lk = [b - a for a, b in zip(ck, ck[1:])]
        if cq[0] != 0 or min(lq, default=0) < 0 or cq[-1] != total_q:
            raise ValueError(f"cu_seqlens_qo must be non-decreasing from 0 to total_q={total_q}, got {cq}")
        if ck[0] != 0 or min(lk, default=0) < 0 or ck[-1] != total_k:
            raise ValueError(f"cu_seqlens_kv must be non-decreasing from 0 to total_k={total_k}, got {ck}")
        if max(lq, default=0) > max_seqlen_qo:
            raise ValueError(f"max_seqlen_qo={max_seqlen_qo} is smaller than a query length ({max(lq)})")

    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v)):
        warnings.warn("flash_attn_varlen_func is forward-only in deepkernels: the result carries no gradient "
                      "(upstream's backward is not implemented)", stacklevel=2)
    if not use_kernels(q, k, v, cu_seqlens_qo, cu_seqlens_kv):
        with torch.no_grad():       # forward-only on every backend, like the kernel path
            o, lse = dense_prefill_ref(q, k, v, cu_seqlens_qo, cu_seqlens_kv, softmax_scale, causal)
        return o.to(q.dtype), lse.t().contiguous().t()

    out = torch.empty(total_q, h, v.shape[-1], dtype=q.dtype, device=dev)
    lse_hm = torch.empty(h, total_q, dtype=torch.float32, device=dev)
    q, softmax_scale, _ = rewrite_nonpositive_scale(q, softmax_scale)   # scale <= 0: exact (-q, |scale| / 0*q, 1)
    _launch_dense_prefill(out, lse_hm, _fix_last(q), _fix_last(k), _fix_last(v), cu_seqlens_qo.contiguous(),
                          cu_seqlens_kv.contiguous(), max_seqlen_qo, softmax_scale, causal,
                          hint_checked=cu_seqlens_qo.device.type == "cpu")   # checked above: no guard launch
    return out, lse_hm.t()


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, head_dim_qk, dropout_p=0.0, softmax_scale=None,
                                     causal=False, deterministic=False, is_varlen=True):
    """Packed variant (FlashMLA): ``qkv [total, h, 2*head_dim_qk + d_v]`` split along the **last** dim as
    ``q = [..., :d]``, ``k = [..., d:2d]``, ``v = [..., 2d:]`` (views, no copy); same cu_seqlens for q and k.
    ``head_dim_qk`` (192 or 128) and ``max_seqlen`` are integers (Python or NumPy, not bool / float / str:
    TypeError naming the argument; head_dim_qk < 1 or max_seqlen < 0: ValueError). Returns ``(out, lse)`` and
    raises as :func:`flash_attn_varlen_func`."""
    check_tensor("qkv", qkv, ndim=3)
    d = check_int("head_dim_qk", head_dim_qk, min_value=1)
    max_seqlen = check_int("max_seqlen", max_seqlen, min_value=0)
    if qkv.shape[-1] <= 2 * d:
        raise ValueError(f"qkv last dim must exceed 2*head_dim_qk={2 * d}, got shape {list(qkv.shape)}")
    return flash_attn_varlen_func(qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:], cu_seqlens, cu_seqlens,
                                  max_seqlen, max_seqlen, dropout_p, softmax_scale, causal, deterministic, is_varlen)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, head_dim_qk,
                                    dropout_p=0.0, softmax_scale=None, causal=False, deterministic=False,
                                    is_varlen=True):
    """Packed-KV variant (FlashMLA): ``kv [total_k, h_k, head_dim_qk + d_v]`` split along the last dim as
    ``k = [..., :d]``, ``v = [..., d:]`` (views). ``head_dim_qk`` is an integer (Python or NumPy, not bool / float
    / str: TypeError naming it; < 1: ValueError). Returns ``(out, lse)`` and raises as
    :func:`flash_attn_varlen_func`."""
    check_tensor("kv", kv, ndim=3)
    d = check_int("head_dim_qk", head_dim_qk, min_value=1)
    if kv.shape[-1] <= d:
        raise ValueError(f"kv last dim must exceed head_dim_qk={d}, got shape {list(kv.shape)}")
    return flash_attn_varlen_func(q, kv[..., :d], kv[..., d:], cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo,
                                  max_seqlen_kv, dropout_p, softmax_scale, causal, deterministic, is_varlen)
