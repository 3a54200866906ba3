"""PyTorch reference: sparse MLA prefill and dense MHA-mode varlen prefill (FlashMLA).

These functions *define* the semantics the Triton kernels in :mod:`deepkernels.mla.prefill` and
:mod:`deepkernels.mla.dense_prefill` are tested against. They compute in float32 (or float64 when asked)
and return float32 outputs; the public ops round ``out`` to the input dtype once.

Sources: FlashMLA ``tests/ref.py`` (``ref_sparse_attn_fwd``, since PR #150: natural-log ``lse`` and
``max_logits``, ``lse = +inf`` for rows with no valid index) and ``tests/test_fmha_sm100.py`` (per-sequence
SDPA with a bottom-right aligned causal mask). See ``shared/spec/mla.md`` §1.3, §1.4, §9.
"""
from __future__ import annotations

import math

import torch

from ._softmax import softmax_lse

__all__ = ["sparse_prefill_ref", "dense_prefill_ref", "sparse_valid_mask"]


def sparse_valid_mask(indices: torch.Tensor, s_kv: int, topk_length: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean ``[s_q, topk]``: index in ``[0, s_kv)`` and position ``< topk_length[i]`` (when given)."""
    idx = indices.to(torch.int64)
    valid = (idx >= 0) & (idx < s_kv)
    if topk_length is not None:
        pos = torch.arange(idx.shape[-1], device=idx.device)
        valid &= pos[None, :] < topk_length.to(torch.int64).to(idx.device)[:, None]
    return valid


def sparse_prefill_ref(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float,
                       d_v: int = 512, attn_sink: torch.Tensor | None = None,
                       topk_length: torch.Tensor | None = None, *, dtype: torch.dtype = torch.float32,
                       chunk_elems: int = 1 << 25):
    """Sparse top-k MLA prefill (FlashMLA ``flash_mla_sparse_fwd``) in plain PyTorch.

    Args:
        q: ``[s_q, h_q, d_qk]`` any float dtype.
        kv: ``[s_kv, h_kv=1, d_qk]``; V is ``kv[..., :d_v]``.
        indices: ``[s_q, h_kv=1, topk]`` integer; an entry is invalid if ``< 0`` or ``>= s_kv`` (never read).
        sm_scale: softmax scale applied to ``q·k``.
        attn_sink: optional ``[h_q]`` fp32; scales out by ``exp(lse)/(exp(lse)+exp(sink))``; never changes lse.
        topk_length: optional ``[s_q]`` integer; query i uses only positions ``< topk_length[i]``.
        dtype: compute dtype (float32 or float64).

    Returns:
        ``(out [s_q, h_q, d_v], max_logits [s_q, h_q], lse [s_q, h_q])`` in ``dtype``; natural log.
        Rows with no valid index: out 0, max_logits -inf, lse +inf.
    """
    s_q, h_q, d_qk = q.shape
    s_kv = kv.shape[0]
    kv2 = kv[:, 0, :] if kv.dim() == 3 else kv
    ind = indices[:, 0, :] if indices.dim() == 3 else indices
    topk = ind.shape[-1]
    out = torch.zeros(s_q, h_q, d_v, dtype=dtype, device=q.device)
    max_logits = torch.full((s_q, h_q), -math.inf, dtype=dtype, device=q.device)
    lse = torch.full((s_q, h_q), math.inf, dtype=dtype, device=q.device)
    if s_q == 0 or topk == 0:
        return out, max_logits, lse
    valid_all = sparse_valid_mask(ind, s_kv, topk_length)
    step = max(1, chunk_elems // max(1, topk * d_qk))
    for i0 in range(0, s_q, step):
        i1 = min(s_q, i0 + step)
        valid = valid_all[i0:i1]
        idx = torch.where(valid, ind[i0:i1].to(torch.int64), 0)
        if s_kv == 0:
            k = torch.zeros(i1 - i0, topk, d_qk, dtype=dtype, device=q.device)
        else:
            k = kv2[idx].to(dtype)                                      # [n, topk, d_qk]
        k = torch.where(valid[..., None], k, torch.zeros((), dtype=dtype, device=q.device))  # NaN-safe
        s = torch.einsum("nhd,ntd->nht", q[i0:i1].to(dtype), k) * sm_scale
        s = torch.where(valid[:, None, :], s, torch.full((), -math.inf, dtype=dtype, device=q.device))
        mx = s.amax(dim=-1)
        p, l, empty = softmax_lse(s)                                   # max-shifted; lse -inf for empty rows
        l_safe = torch.where(empty, torch.zeros_like(l), l)
        o = torch.einsum("nht,ntd->nhd", p, k[..., :d_v])
        if attn_sink is not None:
            sink = attn_sink.to(dtype).to(q.device)[None, :]
            # exp(lse)/(exp(lse)+exp(sink)) = 1/(1+exp(sink-lse)); +inf sink -> 0, -inf sink -> 1
            o = o * torch.sigmoid(l_safe - sink)[..., None]
        o = torch.where(empty[..., None], torch.zeros_like(o), o)
        out[i0:i1] = o
        max_logits[i0:i1] = mx
        lse[i0:i1] = torch.where(empty, torch.full_like(l, math.inf), l)
    return out, max_logits, lse


def dense_prefill_ref(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_q: torch.Tensor,
                      cu_seqlens_k: torch.Tensor, softmax_scale: float | None = None, causal: bool = False,
                      *, dtype: torch.dtype = torch.float32):
    """Dense MHA-mode varlen prefill (FlashMLA ``flash_attn_varlen_func`` forward) in plain PyTorch.

    Args:
        q: ``[total_q, h, d_qk]``; k: ``[total_k, h_k, d_qk]``; v: ``[total_k, h_k, d_v]``; ``h % h_k == 0``
        (GQA: query head j uses kv head ``j // (h // h_k)``).
        cu_seqlens_q, cu_seqlens_k: ``[b + 1]`` integer prefix sums of the sequence lengths.
        softmax_scale: default ``d_qk ** -0.5``.
        causal: bottom-right aligned: query row i of a sequence sees keys ``j <= i + s_k - s_q``.

    Returns:
        ``(out [total_q, h, d_v], lse [total_q, h])`` in ``dtype``, natural log. Rows that see no key:
        out 0, lse +inf (the project's MLA empty-row convention).
    """
    total_q, h, d_qk = q.shape
    h_k = k.shape[1]
    d_v = v.shape[-1]
    if softmax_scale is None:
        softmax_scale = d_qk ** -0.5
    out = torch.zeros(total_q, h, d_v, dtype=dtype, device=q.device)
    lse = torch.full((total_q, h), math.inf, dtype=dtype, device=q.device)
    cq = [int(x) for x in cu_seqlens_q.tolist()]
    ck = [int(x) for x in cu_seqlens_k.tolist()]
    g = h // h_k
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[b], cq[b + 1], ck[b], ck[b + 1]
        s_q, s_k = q1 - q0, k1 - k0
        if s_q == 0 or s_k == 0:
            continue
        qb = q[q0:q1].to(dtype).transpose(0, 1)                                  # [h, s_q, d]
        kb = k[k0:k1].to(dtype).transpose(0, 1).repeat_interleave(g, dim=0)      # [h, s_k, d]
        vb = v[k0:k1].to(dtype).transpose(0, 1).repeat_interleave(g, dim=0)
        s = torch.matmul(qb, kb.transpose(1, 2)) * softmax_scale
        if causal:
            i = torch.arange(s_q, device=q.device)[:, None]
            j = torch.arange(s_k, device=q.device)[None, :]
            s = s.masked_fill(j > i + (s_k - s_q), -math.inf)
        p, l, empty = softmax_lse(s)                                             # [h, s_q, s_k], [h, s_q]
        o = torch.matmul(p, vb)
        o = torch.where(empty[..., None], torch.zeros_like(o), o)
        out[q0:q1] = o.transpose(0, 1)
        lse[q0:q1] = torch.where(empty, torch.full_like(l, math.inf), l).transpose(0, 1)
    return out, lse
