"""PyTorch reference: MoE grouped GEMMs (DeepGEMM m-grouped contiguous / masked, k-grouped contiguous).

This module *defines* what the Triton kernels of :mod:`deepkernels.gemm.grouped` compute. Every group is a
dense GEMM with the rules of :mod:`deepkernels.reference.gemm` (one fresh FP32 partial per 128-wide K block,
scaled by ``sfa * sfb``, accumulated in FP32, one rounding at the end; BF16: FP32 accumulation).

M-grouped contiguous (``A [M_sum, K]``, ``B [G, N, K]``, ``D [M_sum, N]``)::

    D[i] = A[i] @ B[gid[i]].T     if 0 <= gid[i] < G
    D[i] = 0                      otherwise (padding rows: -1 in the per-row layout, psum gaps)

``gid`` is ``grouped_layout`` itself (per-row layout) or derived from the prefix-sum layout: group ``g`` owns
rows ``[start_g, end_g)`` with ``end_g = grouped_layout[g]``, ``start_0 = 0``,
``start_g = align(end_{g-1}, alignment)``. Padding rows are written with exact zeros (a documented choice: upstream
SM90 writes zeros for whole padding sub-tiles and ``A_row @ B_g.T`` for padding rows inside a computed one).

M-grouped masked (``A [G, M_max, K]``, ``D [G, M_max, N]``): ``D[g, :masked_m[g]] = A[g, :masked_m[g]] @ B[g].T``;
rows ``>= masked_m[g]`` are left untouched (``masked_m`` clamped to ``[0, M_max]``).

K-grouped (weight gradient): ``D[g] = C[g] + A_g @ B_g.T`` where ``A_g`` is group g's ``[M, k_g]`` slice of the
K dimension; ``k_g == 0`` gives ``D[g] = C[g]``. FP8 uses per-token (1x128) scales on both operands ("1D1D").
"""
from __future__ import annotations

import torch

from ..quant.fp8 import ceil_div
from .gemm import bf16_gemm_ref, fp8_gemm_ref

__all__ = [
    "row_group_ids",
    "m_grouped_fp8_gemm_contiguous_ref", "m_grouped_bf16_gemm_contiguous_ref",
    "m_grouped_fp8_gemm_masked_ref", "m_grouped_bf16_gemm_masked_ref",
    "k_grouped_fp8_gemm_ref", "k_grouped_bf16_gemm_ref",
    "k_grouped_offsets",
]


def row_group_ids(grouped_layout: torch.Tensor, m_sum: int, num_groups: int, use_psum_layout: bool,
                  alignment: int) -> torch.Tensor:
    """int64 ``[m_sum]``: the group of every row of an M-grouped contiguous layout, -1 for padding rows.

    Per-row layout: ``grouped_layout`` ``[m_sum]`` itself, with ids outside ``[0, num_groups)`` mapped to -1.
    Psum layout: ``grouped_layout`` ``[num_groups]`` cumulative ends; row r is in group g iff
    ``start_g <= r < end_g`` (see module docstring). Runs on the layout's device without a host sync.
    """
    rows = torch.arange(m_sum, device=grouped_layout.device, dtype=torch.int64)
    if not use_psum_layout:
        gid = grouped_layout.to(torch.int64)
        return torch.where((gid >= 0) & (gid < num_groups), gid, torch.full_like(gid, -1))
    ends = grouped_layout.to(torch.int64)
    starts = torch.zeros_like(ends)
    if ends.numel() > 1:
        starts[1:] = (ends[:-1] + alignment - 1) // alignment * alignment
    g = torch.searchsorted(ends, rows, right=True)           # first group whose end is > r
    gc = g.clamp(max=max(num_groups - 1, 0))
    ok = (g < num_groups) & (rows >= starts[gc]) & (rows < ends[gc])
    return torch.where(ok, gc, torch.full_like(gc, -1))


def m_grouped_fp8_gemm_contiguous_ref(a, b, grouped_layout: torch.Tensor, use_psum_layout: bool = False,
                                      alignment: int = 128, out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Reference M-grouped contiguous FP8 GEMM; returns a new ``[M_sum, N]`` tensor of ``out_dtype``.

    a: ``(A [M_sum, K] e4m3, sfa [M_sum, ceil(K/128)] fp32)``; b: ``(B [G, N, K] e4m3, sfb [G, ceil(N/128),
    ceil(K/128)] fp32)``; grouped_layout: int32 ``[M_sum]`` (per-row) or ``[G]`` (psum).
    """
    (a_data, sfa), (b_data, sfb) = a, b
    m_sum, n = a_data.shape[0], b_data.shape[1]
    gid = row_group_ids(grouped_layout, m_sum, b_data.shape[0], use_psum_layout, alignment)
    out = torch.zeros(m_sum, n, dtype=out_dtype, device=a_data.device)
    for g in range(b_data.shape[0]):
        rows = (gid == g).nonzero().flatten()
        if rows.numel():
            out[rows] = fp8_gemm_ref((a_data[rows], sfa[rows]), (b_data[g], sfb[g]), out_dtype=out_dtype)
    return out


def m_grouped_bf16_gemm_contiguous_ref(a: torch.Tensor, b: torch.Tensor, grouped_layout: torch.Tensor,
                                       use_psum_layout: bool = False, alignment: int = 128,
                                       out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Reference M-grouped contiguous BF16 GEMM: a ``[M_sum, K]``, b ``[G, N, K]`` (any strides)."""
    m_sum, n = a.shape[0], b.shape[1]
    gid = row_group_ids(grouped_layout, m_sum, b.shape[0], use_psum_layout, alignment)
    out = torch.zeros(m_sum, n, dtype=out_dtype, device=a.device)
    for g in range(b.shape[0]):
        rows = (gid == g).nonzero().flatten()
        if rows.numel():
            out[rows] = bf16_gemm_ref(a[rows], b[g], out_dtype=out_dtype)
    return out


def m_grouped_fp8_gemm_masked_ref(a, b, d: torch.Tensor, masked_m: torch.Tensor) -> torch.Tensor:
    """Reference M-grouped masked FP8 GEMM, in place: writes only ``d[g, :masked_m[g]]``; returns ``d``.

    a: ``(A [G, M_max, K], sfa [G, M_max, ceil(K/128)])``; b: ``(B [G, N, K], sfb [G, ceil(N/128), ceil(K/128)])``;
    d: ``[G, M_max, N]``; masked_m: int ``[G]`` (read on the host here; values clamped to ``[0, M_max]``).
    """
    (a_data, sfa), (b_data, sfb) = a, b
    m_max = a_data.shape[1]
    for g, mg in enumerate(masked_m.tolist()):
        mg = min(max(int(mg), 0), m_max)
        if mg:
            d[g, :mg] = fp8_gemm_ref((a_data[g, :mg], sfa[g, :mg]), (b_data[g], sfb[g]), out_dtype=d.dtype)
    return d


def m_grouped_bf16_gemm_masked_ref(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
                                   masked_m: torch.Tensor) -> torch.Tensor:
    """Reference M-grouped masked BF16 GEMM, in place (see :func:`m_grouped_fp8_gemm_masked_ref`)."""
    m_max = a.shape[1]
    for g, mg in enumerate(masked_m.tolist()):
        mg = min(max(int(mg), 0), m_max)
        if mg:
            d[g, :mg] = bf16_gemm_ref(a[g, :mg], b[g], out_dtype=d.dtype)
    return d


def k_grouped_offsets(ks) -> tuple[list[int], list[int]]:
    """Per-group K start offsets and scale-column start offsets (``ceil(k_g/128)`` columns per group)."""
    k_off, sf_off, k_acc, s_acc = [], [], 0, 0
    for k in ks:
        k_off.append(k_acc)
        sf_off.append(s_acc)
        k_acc += int(k)
        s_acc += ceil_div(int(k), 128)
    return k_off, sf_off


def k_grouped_fp8_gemm_ref(a, b, ks, c: torch.Tensor | None, m: int, n: int, layout: str = "nt") -> torch.Tensor:
    """Reference K-grouped FP8 GEMM with per-token scales on both operands; returns a new fp32 ``[G, M, N]``.

    ``layout="nt"`` (DeepGEMM SM90 ``k_grouped_fp8_gemm_nt_contiguous``): A is a flat buffer of per-group
    row-major ``[M, k_g]`` chunks (``M * sum(ks)`` elements), sfa ``[M, sum ceil(k_g/128)]``; B likewise with N.
    ``layout="tn"`` (``k_grouped_fp8_gemm_tn_contiguous``): A ``[sum_k, M]``, sfa ``[sum ceil(k_g/128), M]``;
    B ``[sum_k, N]``, sfb ``[sum ceil(k_g/128), N]``.
    c: ``[G, M, N]`` (added in fp32), or None.
    """
    (a_data, sfa), (b_data, sfb) = a, b
    g_num = len(ks)
    out = torch.zeros(g_num, m, n, dtype=torch.float32, device=a_data.device)
    if c is not None:
        out += c.float()
    k_off, sf_off = k_grouped_offsets(ks)
    a_flat, b_flat = a_data.reshape(-1), b_data.reshape(-1)
    for g, k in enumerate(ks):
        if k == 0:
            continue
        s0, s1 = sf_off[g], sf_off[g] + ceil_div(k, 128)
        if layout == "nt":
            ag = a_flat[m * k_off[g]: m * (k_off[g] + k)].view(m, k)
            bg = b_flat[n * k_off[g]: n * (k_off[g] + k)].view(n, k)
            sa, sb = sfa[:, s0:s1], sfb[:, s0:s1]
        else:
            ag, bg = a_data[k_off[g]:k_off[g] + k].T, b_data[k_off[g]:k_off[g] + k].T
            sa, sb = sfa[s0:s1].T, sfb[s0:s1].T
        out[g] = fp8_gemm_ref((ag, sa), (bg, sb), c=out[g], recipe=(1, 1, 128), out_dtype=torch.float32)
    return out


def k_grouped_bf16_gemm_ref(a: torch.Tensor, b: torch.Tensor, ks, c: torch.Tensor | None) -> torch.Tensor:
    """Reference K-grouped BF16 TN GEMM: a ``[sum_k, M]``, b ``[sum_k, N]``; returns fp32 ``[G, M, N]``."""
    m, n = a.shape[1], b.shape[1]
    out = torch.zeros(len(ks), m, n, dtype=torch.float32, device=a.device)
    if c is not None:
        out += c.float()
    k_off, _ = k_grouped_offsets(ks)
    for g, k in enumerate(ks):
        if k:
            out[g] = bf16_gemm_ref(a[k_off[g]:k_off[g] + k].T, b[k_off[g]:k_off[g] + k].T, c=out[g],
                                   out_dtype=torch.float32)
    return out
