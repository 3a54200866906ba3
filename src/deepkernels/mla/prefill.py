"""Sparse top-k MLA prefill: ``flash_mla_sparse_fwd`` (FlashMLA), as a Triton kernel for sm90.

Kernel shape (FlashMLA SM90 ``sparse_attn_fwd`` in spirit): one program per (query token, 64-head group);
the token's heads form the M dimension of both MMAs. The program walks the token's top-k list in blocks of
``BLOCK_N`` indices, gathers those KV rows by pointer (TMA gather is sm100-only), splits the 576-wide
rows into a 512 NoPE tile (also V) and a 64 RoPE tile, and runs an online softmax in base 2 with the running
max kept in *raw score* units, so ``exp2((s - m) * scale)`` is exactly 1 for the max element whatever the
compiler fuses (FlashMLA commit d626421). P is rounded to bf16 only as the PV operand; the row sum uses
fp32 P. Invalid indices (``< 0``, ``>= s_kv``, or at positions ``>= topk_length``) are masked loads: they
are never dereferenced and their V rows load as 0.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._backend import device_of, interpret_mode, use_kernels
from .._triton_helpers import rne_bf16 as _rne_bf16
from .._validate import check_dtype, check_int, check_scale, check_tensor, rewrite_nonpositive_scale
from ..reference.mla_prefill import sparse_prefill_ref
from . import _gluon_sparse_prefill as _gsp
from ._sparse_kernels import online_softmax_step

__all__ = ["flash_mla_sparse_fwd"]

_LOG2E = 1.4426950408889634





@triton.jit
def _sparse_prefill_fwd_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr,
    s_kv, topk, sm_scale, scale_log2,
    stride_qs, stride_qh, stride_kvs, stride_is, stride_os, stride_oh, H_Q,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    D_V: tl.constexpr, D_PE: tl.constexpr,
    HAS_LEN: tl.constexpr, HAS_SINK: tl.constexpr, UPCAST: tl.constexpr, NUM_STAGES: tl.constexpr,
    TRANS_S: tl.constexpr,
):
    NUM_HB = H_Q // BLOCK_H
    pid = tl.program_id(0)
    tok = (pid // NUM_HB).to(tl.int64)
    hb = pid % NUM_HB
    offs_h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, D_V)

    q_rows = q_ptr + tok * stride_qs + offs_h[:, None].to(tl.int64) * stride_qh
    q_nope = tl.load(q_rows + offs_d[None, :])
    if UPCAST:
        q_nope = q_nope.to(tl.float32)
    if D_PE > 0:
        offs_p = tl.arange(0, D_PE)
        q_pe = tl.load(q_rows + D_V + offs_p[None, :])
        if UPCAST:
            q_pe = q_pe.to(tl.float32)

    n = topk
    if HAS_LEN:
        n = tl.minimum(tl.maximum(tl.load(len_ptr + tok), 0), topk)

    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)       # running max of raw q.k
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, D_V], tl.float32)
    idx_row = idx_ptr + tok * stride_is
    for start in tl.range(0, n, BLOCK_N, num_stages=NUM_STAGES):
        offs_n = start + tl.arange(0, BLOCK_N)
        idx = tl.load(idx_row + offs_n, mask=offs_n < n, other=-1)
        valid = (idx >= 0) & (idx < s_kv)
        kv_rows = kv_ptr + idx.to(tl.int64)[:, None] * stride_kvs
        k_nope = tl.load(kv_rows + offs_d[None, :], mask=valid[:, None], other=0.0)
        if UPCAST:
            k_nope = k_nope.to(tl.float32)
        if TRANS_S:
            # S^T = K Q^T: tokens on the MMA M axis, so BLOCK_N = 128 tokens fill both warpgroups of a
            # chained-dot layout (Triton puts every warp on M for chained dots; with M = 64 heads the
            # second warpgroup would redo the QK product).
            st = tl.dot(k_nope, tl.trans(q_nope))
            if D_PE > 0:
                k_pe = tl.load(kv_rows + D_V + offs_p[None, :], mask=valid[:, None], other=0.0)
                if UPCAST:
                    k_pe = k_pe.to(tl.float32)
                st = tl.dot(k_pe, tl.trans(q_pe), st)
            pt, alpha, m_new, l_i = online_softmax_step(st, valid, m_i, l_i, scale_log2, 0)
            if UPCAST:
                pv = tl.dot(tl.trans(_rne_bf16(pt)), k_nope)
            else:
                pv = tl.dot(tl.trans(pt.to(k_nope.dtype)), k_nope)
        else:
            s = tl.dot(q_nope, tl.trans(k_nope))
            if D_PE > 0:
                k_pe = tl.load(kv_rows + D_V + offs_p[None, :], mask=valid[:, None], other=0.0)
                if UPCAST:
                    k_pe = k_pe.to(tl.float32)
                s = tl.dot(q_pe, tl.trans(k_pe), s)
            p, alpha, m_new, l_i = online_softmax_step(s, valid, m_i, l_i, scale_log2, 1)
            if UPCAST:
                pv = tl.dot(_rne_bf16(p), k_nope)
            else:
                pv = tl.dot(p.to(k_nope.dtype), k_nope)
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    denom = l_safe
    if HAS_SINK:
        sink = tl.load(sink_ptr + offs_h)
        m_nat = tl.where(empty, 0.0, m_i * sm_scale)
        denom = l_safe + tl.exp(sink - m_nat)
    inv = tl.where(empty, 0.0, 1.0 / denom)
    out = acc * inv[:, None]
    if UPCAST:
        out = _rne_bf16(out)
    o_rows = out_ptr + tok * stride_os + offs_h[:, None].to(tl.int64) * stride_oh
    tl.store(o_rows + offs_d[None, :], out.to(out_ptr.dtype.element_ty))
    lse = tl.where(empty, float("inf"), m_i * sm_scale + tl.log(l_safe))
    mx = tl.where(empty, float("-inf"), m_i * sm_scale)
    tl.store(lse_ptr + tok * H_Q + offs_h, lse)
    tl.store(ml_ptr + tok * H_Q + offs_h, mx)


# Config table: (BLOCK_H, BLOCK_N, num_warps, num_stages, TRANS_S) by h_q. BLOCK_H = 64 keeps the [64, 512] fp32
# accumulator at 128 registers/thread over two warpgroups (FlashMLA's split of V into 2 x 256), but Triton
# puts all 8 warps on M for the chained QK dot, so with 64 heads both warpgroups compute the same S
# (QK work doubled). TRANS_S=True (S^T, 128 tokens on M) avoids that but its 147 KB K tile leaves room for
# one stage only. The candidates are timed by benchmarks/mla_prefill.py --sweep (notes/mla_prefill.md);
# on the H200 (results/mla_prefill-h200-a161c54.json) (64, 64, 8, 2, False) won at every s_kv: 236-260
# TFLOPS vs 210-256 for the S^T variant, 176-188 for BLOCK_N 32, 153-163 for S^T at BLOCK_N 64.
SPARSE_CANDIDATES = [
    (64, 64, 8, 2, False),
    (64, 32, 8, 3, False),
    (64, 128, 8, 1, True),
    (64, 64, 8, 2, True),
]
SPARSE_CONFIGS = {
    16: (16, 64, 4, 2, False),
    32: (32, 64, 4, 2, False),
    64: (64, 64, 8, 2, False),
    128: (64, 64, 8, 2, False),
}


def sparse_prefill_config(h_q: int) -> tuple:
    return SPARSE_CONFIGS[h_q]


def _launch_sparse_prefill(out, max_logits, lse, q, kv, indices, sm_scale, attn_sink=None, topk_length=None,
                           config=None):
    """Out-parameter launcher. ``out [s_q, h_q, 512]`` (last dim contiguous), ``max_logits``/``lse``
    contiguous ``[s_q, h_q]`` fp32. Inputs must already be validated by :func:`flash_mla_sparse_fwd`."""
    s_q, h_q, d_qk = q.shape
    if s_q == 0:
        return
    if config is None and _gsp.supported(q, kv):
        # Gluon kernel (h_q % 64 == 0 on sm90), warp-specialised variant: 360-401 TFLOPS on the H200 vs 235-258 for
        # this Triton kernel at s_q 4096, h_q 128, topk 2048 (results/mla_prefill_gluon-ws-h200-2026-11-29.json).
        # Explicit configs and DEEPKERNELS_DISABLE_GLUON=1 keep the Triton kernel.
        # launch_sparse_prefill_gluon picks the dispatched variant: the split-consumer kernel
        # (_gluon_sparse_prefill_ws2; since session 16: 431-482 TFLOPS, 1.15-1.19x the WS kernel,
        # results/sparse_prefill_ws2-h200-2026-11-29-s16.json) while its dispatch_on(); =0 the WS kernel.
        _gsp.launch_sparse_prefill_gluon(out, max_logits, lse, q, kv, indices, sm_scale, attn_sink, topk_length)
        return
    block_h, block_n, num_warps, num_stages, trans_s = config or sparse_prefill_config(h_q)
    topk = indices.shape[-1]
    d_v = 512
    grid = (s_q * (h_q // block_h),)
    dummy = lse
    _sparse_prefill_fwd_kernel[grid](
        q, kv, indices, topk_length if topk_length is not None else dummy,
        attn_sink if attn_sink is not None else dummy, out, max_logits, lse,
        kv.shape[0], topk, float(sm_scale), float(sm_scale) * _LOG2E,
        q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), out.stride(0), out.stride(1),
        h_q, BLOCK_H=block_h, BLOCK_N=block_n, D_V=d_v, D_PE=d_qk - d_v,
        HAS_LEN=topk_length is not None, HAS_SINK=attn_sink is not None, UPCAST=interpret_mode(),
        NUM_STAGES=num_stages, TRANS_S=trans_s, num_warps=num_warps, num_stages=num_stages,
    )


def _last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.stride(-1) == 1 or t.shape[-1] <= 1 else t.contiguous()


def flash_mla_sparse_fwd(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float,
                         d_v: int = 512, attn_sink: torch.Tensor | None = None,
                         topk_length: torch.Tensor | None = None):
    """Sparse top-k MLA prefill (FlashMLA ``flash_mla_sparse_fwd``, SM90 ``sparse_attn_fwd`` semantics
    since PR #150).

    Args:
        q: ``[s_q, h_q, d_qk]`` bf16, ``h_q`` in {16, 32, 64, 128}, ``d_qk`` in {576, 512}; any strides
            (a non-unit last-dim stride is copied).
        kv: ``[s_kv, 1, d_qk]`` bf16, plain (non-paged) rows; V is ``kv[..., :512]``; any strides.
        indices: ``[s_q, 1, topk]`` int32, any ``topk >= 0`` (padded internally). An entry is invalid if
            ``< 0`` or ``>= s_kv``; invalid entries are never read (INT_MIN, -123456, s_kv, 2^31-1 are safe).
        sm_scale: softmax scale on ``q·k``; any finite real (as FlashMLA). A scale <= 0 is exact: the kernels keep
            the running max in raw-score units, so the host runs them on ``-q`` with ``|sm_scale|`` (scale < 0) or on
            ``q * 0`` with scale 1 (scale 0: every valid logit 0, ``lse = log(#valid)``, ``max_logits`` 0).
        d_v: must be 512 (an int: Python or NumPy; a float, str or bool is a TypeError naming it).
        attn_sink: optional ``[h_q]`` fp32; scales out by ``exp(lse)/(exp(lse)+exp(sink))`` (``+inf`` -> 0,
            ``-inf`` -> no effect); never changes ``lse`` or ``max_logits``.
        topk_length: optional ``[s_q]`` int32; query i uses only ``indices[i, 0, :topk_length[i]]``
            (values clamped to ``[0, topk]``).

    Returns:
        ``(out [s_q, h_q, 512] bf16, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32)``, all contiguous,
        natural-log units of ``(q·k)·sm_scale``. A row with no valid index: out 0, max_logits -inf,
        lse +inf (with or without a sink).

    Raises:
        TypeError / ValueError naming the argument for wrong types, dtypes, shapes, devices, ``d_v != 512``
        or a non-finite ``sm_scale`` (a Python / NumPy real or a one-element tensor; else TypeError).

    CUDA tensors (or any tensors under ``TRITON_INTERPRET=1``) run the Triton kernel; CPU tensors run
    :func:`deepkernels.reference.mla_prefill.sparse_prefill_ref`.
    """
    check_tensor("q", q, ndim=3, dtype=torch.bfloat16)
    check_tensor("kv", kv, ndim=3, dtype=torch.bfloat16)
    check_tensor("indices", indices, ndim=3, dtype=torch.int32)
    s_q, h_q, d_qk = q.shape
    if d_qk not in (576, 512):
        raise ValueError(f"q: d_qk (last dim) must be 576 or 512, got shape {list(q.shape)}")
    if h_q not in SPARSE_CONFIGS:
        raise ValueError(f"q: h_q must be one of {sorted(SPARSE_CONFIGS)}, got shape {list(q.shape)}")
    if kv.shape[1] != 1 or kv.shape[2] != d_qk:
        raise ValueError(f"kv must have shape [s_kv, 1, {d_qk}], got {list(kv.shape)}")
    if indices.shape[0] != s_q or indices.shape[1] != 1:
        raise ValueError(f"indices must have shape [{s_q}, 1, topk], got {list(indices.shape)}")
    if check_int("d_v", d_v) != 512:   # float / str / bool: TypeError naming d_v
        raise ValueError(f"d_v must be 512, got {d_v}")
    sm_scale = check_scale("sm_scale", sm_scale)   # any finite real scalar (np.float32 too); else Type/ValueError
    if attn_sink is not None:
        check_tensor("attn_sink", attn_sink, ndim=1, dtype=torch.float32)
        if attn_sink.shape[0] != h_q:
            raise ValueError(f"attn_sink must have shape [{h_q}], got {list(attn_sink.shape)}")
        attn_sink = attn_sink.contiguous()
    if topk_length is not None:
        check_tensor("topk_length", topk_length, ndim=1, dtype=torch.int32)
        if topk_length.shape[0] != s_q:
            raise ValueError(f"topk_length must have shape [{s_q}], got {list(topk_length.shape)}")
        topk_length = topk_length.contiguous()
    dev = device_of(q, kv, indices, attn_sink, topk_length)
    if kv.shape[0] >= 2**31:
        raise ValueError(f"kv: s_kv must be < 2^31 (int32 indices), got {kv.shape[0]}")

    if not use_kernels(q, kv, indices, attn_sink, topk_length):
        o, ml, lse = sparse_prefill_ref(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
        return o.to(q.dtype), ml.float().contiguous(), lse.float().contiguous()

    out = torch.empty(s_q, h_q, d_v, dtype=q.dtype, device=dev)
    max_logits = torch.empty(s_q, h_q, dtype=torch.float32, device=dev)
    lse = torch.empty(s_q, h_q, dtype=torch.float32, device=dev)
    # scale <= 0: exact rewrite (-q, |scale| or 0*q, 1); (-q)·k·|scale| == q·k·scale, so max_logits / lse keep units
    q, sm_scale, _ = rewrite_nonpositive_scale(q, sm_scale)
    _launch_sparse_prefill(out, max_logits, lse, _last_dim_contiguous(q), _last_dim_contiguous(kv),
                           _last_dim_contiguous(indices), sm_scale, attn_sink, topk_length)
    return out, max_logits, lse
