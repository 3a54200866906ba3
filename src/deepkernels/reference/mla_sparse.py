"""PyTorch reference: sparse top-k MLA decode over FlashMLA's FP8/FP4 paged KV formats.

Defines the semantics of ``flash_mla_with_kvcache(..., is_fp8_kvcache=True, indices=...)`` for every format
(FlashMLA ``tests/ref.py::ref_sparse_attn_decode`` at 9241ae3, extended to the [2026-09+] V4.1 / FP4 formats;
docs/spec/mla.md §1.2, §2, §4, §9):

- The format is detected from the cache's last dim (bytes per token): 656 -> V3.2 (d_qk 576, V = the 512 NoPE
  dims), 584 -> MODEL1 (d_qk 512, V = K incl. RoPE), 528 -> V4.1 (d_qk 512), 288 -> FP4 (d_qk 512; only as the
  extra cache next to a V4.1 main cache).
- K is the cache dequantised to bf16 by :func:`deepkernels.quant.dequantize_kv_cache` (``numerics="reference"``:
  V3.2 fp32 scales are used as stored, ``bf16(fp32(e4m3) * scale)``; power-of-two scales are exact in every
  variant).
- ``indices[b, s, j]`` = ``page_block * page_block_size + offset``. Entry j is **valid** iff
  ``0 <= idx < num_blocks * page_block_size`` and ``j < topk_length[b]`` (when given). Upstream only treats -1 as
  invalid and reads any other out-of-range value from wild memory; here such values count as invalid.
- Main and extra tokens (``extra_indices`` / ``extra_topk_length`` over ``extra_k_cache``) form **one** softmax.
- ``s = (q . k) * softmax_scale`` over valid tokens; ``lse = ln sum exp(s)``; ``out = sum softmax(s) v``;
  the sink multiplies out by ``1 / (1 + exp(sink - lse))`` and never changes lse (``+inf`` -> out 0, ``-inf`` ->
  no effect). A row with no valid token: out 0 and lse +inf, with or without a sink.
- ``lse`` is returned as FlashMLA's sparse path returns it: ``[b, h_q, s_q]``, the transposed view of a contiguous
  ``[b, s_q, h_q]`` tensor.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..quant.kvcache import KV_FORMATS, dequantize_kv_cache, kv_format_from_bytes_per_token
from ._softmax import softmax_lse

__all__ = ["sparse_decode_ref", "sparse_valid_mask", "detect_sparse_formats"]


def detect_sparse_formats(k_cache: torch.Tensor, extra_k_cache: Optional[torch.Tensor] = None):
    """``(main_fmt, extra_fmt_or_None)`` names from bytes per token, with FlashMLA's pairing rules.

    Raises ValueError for an unknown size, an FP4 main cache, or an extra cache whose format does not pair with
    the main one (same format, or FP4 next to V4.1).
    """
    main = kv_format_from_bytes_per_token(int(k_cache.shape[-1]))
    if main == "fp4":
        raise ValueError("k_cache: the 288-byte FP4 format is only valid as extra_k_cache next to a 528-byte V4.1 "
                         f"main cache, got k_cache shape {list(k_cache.shape)}")
    extra = None
    if extra_k_cache is not None:
        extra = kv_format_from_bytes_per_token(int(extra_k_cache.shape[-1]))
        if not (extra == main or (main == "v41" and extra == "fp4")):
            raise ValueError(f"extra_k_cache format {extra!r} ({extra_k_cache.shape[-1]} B/token) does not pair with "
                             f"the main cache format {main!r} ({k_cache.shape[-1]} B/token): it must be the same "
                             "format, or 288-byte FP4 next to 528-byte V4.1")
    return main, extra


def sparse_valid_mask(indices: torch.Tensor, num_tokens: int, length: Optional[torch.Tensor] = None) -> torch.Tensor:
    """Validity of each entry of ``indices [b, s_q, topk]``: ``0 <= idx < num_tokens`` and position ``< length[b]``."""
    valid = (indices >= 0) & (indices.long() < num_tokens)
    if length is not None:
        pos = torch.arange(indices.shape[-1], device=indices.device)
        valid = valid & (pos[None, None, :] < length.to(indices.device).long()[:, None, None])
    return valid


def _flat_kv(cache: torch.Tensor, fmt: str, numerics: str) -> torch.Tensor:
    nb, page = cache.shape[:2]
    return dequantize_kv_cache(cache, fmt, numerics=numerics).reshape(nb * page, -1)


def sparse_decode_ref(q: torch.Tensor, k_cache: torch.Tensor, indices: torch.Tensor, head_dim_v: int = 512,
                      softmax_scale: Optional[float] = None, attn_sink: Optional[torch.Tensor] = None,
                      extra_k_cache: Optional[torch.Tensor] = None, extra_indices: Optional[torch.Tensor] = None,
                      topk_length: Optional[torch.Tensor] = None, extra_topk_length: Optional[torch.Tensor] = None,
                      numerics: str = "reference", compute_dtype: torch.dtype = torch.float32,
                      out_dtype: Optional[torch.dtype] = None):
    """Sparse MLA decode over a packed FP8/FP4 KV cache (see the module docstring for the semantics).

    Args:
        q: ``[b, s_q, h_q, d_qk]`` bf16 (d_qk 576 for V3.2, 512 otherwise), any strides.
        k_cache: ``[num_blocks, page_block_size, 1, bytes_per_token]`` fp8_e4m3fn/int8/uint8 byte container
            (656, 584 or 528 bytes per token), ``stride(1) == bytes_per_token``.
        indices: ``[b, s_q, topk]`` int32/int64, ``page_block * page_block_size + offset``; invalid entries (-1,
            any negative, ``>= num_blocks * page_block_size``) are ignored.
        head_dim_v: 512. softmax_scale: default ``d_qk ** -0.5``.
        attn_sink: ``[h_q]`` fp32 or None. topk_length / extra_topk_length: ``[b]`` int or None.
        extra_k_cache / extra_indices: second cache (same format, or FP4 next to V4.1) and its ``[b, s_q, extra_topk]``
            indices, attended in the same softmax.
        numerics: passed to :func:`dequantize_kv_cache` (``"reference"`` or ``"sm90"``, V3.2 non-power-of-two
            scales only). compute_dtype: float32 (FlashMLA's test reference) or float64.
        out_dtype: dtype of ``out`` (default q's dtype, rounded once; float32 keeps the unrounded result, which
            is what tests compare a bf16 kernel output against).
    Returns:
        ``out [b, s_q, h_q, head_dim_v]`` in ``out_dtype`` and ``lse [b, h_q, s_q]`` fp32 natural log
        (transposed view of a contiguous ``[b, s_q, h_q]``).
    Raises:
        ValueError for an unknown or unpaired format, a ``d_qk`` that does not match the format, or mismatched
        index shapes.
    """
    main, extra = detect_sparse_formats(k_cache, extra_k_cache)
    f = KV_FORMATS[main]
    b, s_q, h_q, d_qk = q.shape
    if d_qk != f.d_qk:
        raise ValueError(f"q: d_qk must be {f.d_qk} for the {main!r} format, got q shape {list(q.shape)}")
    if head_dim_v != f.d_v:
        raise ValueError(f"head_dim_v must be {f.d_v}, got {head_dim_v}")
    if (extra_k_cache is None) != (extra_indices is None):
        raise ValueError("extra_indices is required with extra_k_cache and forbidden without it")
    scale = d_qk ** -0.5 if softmax_scale is None else float(softmax_scale)
    dev = q.device
    kv = _flat_kv(k_cache, main, numerics).to(dev)
    segs = [(kv, indices, topk_length)]
    if extra_k_cache is not None:
        segs.append((_flat_kv(extra_k_cache, extra, numerics).to(dev), extra_indices, extra_topk_length))
    out = torch.empty(b, s_q, h_q, head_dim_v, dtype=out_dtype or q.dtype, device=dev)
    lse_buf = torch.empty(b, s_q, h_q, dtype=torch.float32, device=dev)
    sink = None if attn_sink is None else attn_sink.to(dev, compute_dtype)
    for i in range(b):
        ks, ms = [], []
        for flat, ind, length in segs:
            ind_i = ind[i:i + 1].to(dev)
            valid = sparse_valid_mask(ind_i, flat.shape[0], None if length is None else length[i:i + 1])[0]
            safe = torch.where(valid, ind_i[0].long(), torch.zeros_like(ind_i[0].long()))
            k = flat[safe].to(compute_dtype)                                          # [s_q, T, d_qk]
            ks.append(torch.where(valid[..., None], k, torch.zeros_like(k)))          # never multiply NaN
            ms.append(valid)
        k = torch.cat(ks, dim=1)
        valid = torch.cat(ms, dim=1)                                                  # [s_q, T]
        s = torch.einsum("shd,std->sht", q[i].to(compute_dtype), k) * scale
        s = torch.where(valid[:, None, :], s, torch.full_like(s, float("-inf")))
        p, lse, empty = softmax_lse(s)   # max-shifted; masked (-inf) scores give p = 0 exactly
        o = torch.einsum("sht,std->shd", p, k[..., :head_dim_v])
        if sink is not None:
            o = o / (1 + torch.exp(sink[None, :] - lse))[..., None]                     # sink=+inf -> 0, -inf -> 1
        o = torch.where(empty[..., None], torch.zeros_like(o), o)
        out[i] = o.to(out.dtype)
        lse_buf[i] = torch.where(empty, torch.full_like(lse, float("inf")), lse).float()
    return out, lse_buf.transpose(1, 2)
