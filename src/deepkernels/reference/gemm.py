"""PyTorch reference: dense FP8/BF16 GEMM semantics (DeepGEMM ``fp8_gemm_nt``, ``bf16_gemm_nt``).

This module *defines* what the Triton kernels in :mod:`deepkernels.gemm` compute. It is written for clarity
and runs on any device (CPU or CUDA).

FP8 block-scaled GEMM (DeepGEMM SM90 "promotion" rule, docs/spec/gemm.md §2.5)::

    for every 128-wide K block kb:
        P   = fp32( A[:, kb] @ B[:, kb].T )          # fresh partial, exact products, one rounding to fp32
        acc = acc + P * (sfa[m, kb] * sfb[n', kb])   # scale product in fp32, accumulate in fp32
    D = out_dtype(C + acc)                           # one rounding at the end (C is fp32-added first)

``sfb[n', kb]`` is ``sfb[n // 128, kb]`` for the 128x128 weight recipe ``(1, 128, 128)`` ("1D2D") and
``sfb[n, kb]`` for the per-token recipe ``(1, 1, 128)`` ("1D1D"). A K tail (K not a multiple of 128)
contributes only its real columns; ``ceil(K / 128)`` scale columns are used.

BF16 GEMM: ``D = out_dtype(C + fp32(A @ B.T))`` (products accumulated in float64 here, rounded once to fp32).
"""
from __future__ import annotations

import torch

from ..quant.fp8 import ceil_div

__all__ = [
    "fp8_gemm_ref",
    "bf16_gemm_ref",
    "fp8_gemm_nt",
    "bf16_gemm_nt",
    "resolve_recipe",
]

_BLOCK_K = 128


def resolve_recipe(recipe, n: int, k: int, sfb: torch.Tensor) -> tuple[int, int, int]:
    """Return the effective ``(gran_m, gran_n, gran_k)`` for an FP8 GEMM.

    ``recipe=None`` means the SM90 default ``(1, 128, 128)``; if SFB has ``n`` rows (and not
    ``ceil(n/128)``, i.e. it is per-token), ``(1, 1, 128)`` is inferred. Raises ValueError for recipes other
    than ``(1, 128, 128)`` and ``(1, 1, 128)``.
    """
    if recipe is None:
        nb = ceil_div(n, 128)
        if sfb.dim() == 2 and sfb.shape[0] == n and n != nb:
            return (1, 1, 128)
        return (1, 128, 128)
    recipe = tuple(int(r) for r in recipe)
    if recipe not in ((1, 128, 128), (1, 1, 128)):
        raise ValueError(f"recipe must be (1, 128, 128) or (1, 1, 128) on SM90, got {recipe}")
    return recipe


def _unpack_sf(sf: torch.Tensor, mn: int, sfk: int) -> torch.Tensor:
    """FP32 scales as a logical ``[mn, sfk]`` fp32 tensor; packed UE8M0 int32 ``[mn, ceil(sfk/4)]`` unpacked."""
    if sf.dtype == torch.float32:
        return sf
    if sf.dtype == torch.int32:
        # 4 UE8M0 exponent bytes per int32, little-endian: byte j = K-group 4w+j; value 2^(e-127)
        u = sf.contiguous().view(torch.uint8).reshape(sf.shape[0], -1)[:, :sfk].to(torch.int32)
        return (u << 23).view(torch.float32)
    raise TypeError(f"scale factors must be float32 or packed UE8M0 int32, got {sf.dtype}")


def fp8_gemm_ref(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor],
                 c: torch.Tensor | None = None, recipe=None,
                 out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Reference ``D = C + A @ B.T`` with DeepGEMM's per-128-K-block FP32 promotion (see module docstring).

    Args:
        a: ``(A [M, K] float8_e4m3fn (any strides), sfa [M, ceil(K/128)] float32, any layout)``.
        b: ``(B [N, K] float8_e4m3fn, sfb [ceil(N/128), ceil(K/128)] (1D2D) or [N, ceil(K/128)] (1D1D))``.
            Packed UE8M0 int32 scales ``[MN, ceil(ceil(K/128)/4)]`` are unpacked (128x128 SFB then must be
            already broadcast per row).
        c: optional ``[M, N]`` accumulator (fp32 or bf16), added in fp32 before the final rounding.
        recipe: ``None``, ``(1, 128, 128)`` or ``(1, 1, 128)``.
        out_dtype: torch.bfloat16 or torch.float32.

    Returns: a new ``[M, N]`` tensor of ``out_dtype`` on A's device.
    """
    a_data, sfa = a
    b_data, sfb = b
    m, k = a_data.shape
    n = b_data.shape[0]
    sfk = ceil_div(k, _BLOCK_K)
    gran = resolve_recipe(recipe, n, k, sfb)
    if sfb.dtype == torch.int32:  # packed UE8M0 weight scales are always broadcast per row
        gran = (1, 1, 128)
    sfa = _unpack_sf(sfa, m, sfk).float()
    sfb = _unpack_sf(sfb, n, sfk).float()
    acc = torch.zeros(m, n, dtype=torch.float32, device=a_data.device)
    af = a_data.to(torch.float64)
    bf = b_data.to(torch.float64)
    n_rows_sf = torch.arange(n, device=a_data.device) // gran[1]
    for kb in range(sfk):
        k0, k1 = kb * _BLOCK_K, min(k, (kb + 1) * _BLOCK_K)
        partial = (af[:, k0:k1] @ bf[:, k0:k1].T).to(torch.float32)
        scale = sfa[:, kb].reshape(m, 1) * sfb[n_rows_sf, kb].reshape(1, n)  # fp32 product
        acc = acc + partial * scale
    if c is not None:
        acc = c.to(torch.float32) + acc
    return acc.to(out_dtype)


def bf16_gemm_ref(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor | None = None,
                  out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """Reference BF16 ``D = C + A @ B.T``: A ``[M, K]``, B ``[N, K]`` bf16 (any strides), C ``[M, N]`` optional.

    Products are accumulated in float64 and rounded once to fp32; C is added in fp32; one final rounding to
    ``out_dtype`` (bf16 or fp32).
    """
    acc = (a.to(torch.float64) @ b.to(torch.float64).T).to(torch.float32)
    if c is not None:
        acc = c.to(torch.float32) + acc
    return acc.to(out_dtype)


def _finish_inplace(d: torch.Tensor, c: torch.Tensor | None, k: int, compute) -> None:
    m, n = d.shape
    if m == 0 or n == 0:
        return
    if k == 0:
        if c is None:
            d.zero_()
        elif c is not d:
            d.copy_(c)
        return
    d.copy_(compute())


def fp8_gemm_nt(a, b, d: torch.Tensor, c: torch.Tensor | None = None, recipe=None,
                compiled_dims: str = "nk", disable_ue8m0_cast: bool = False) -> None:
    """In-place reference with DeepGEMM's ``fp8_gemm_nt`` signature: writes ``C + A @ B.T`` into ``d``.

    ``m == 0 or n == 0`` is a no-op; ``k == 0`` gives ``d = c`` (or zeros). No argument validation here: the
    public op :func:`deepkernels.fp8_gemm_nt` validates before it dispatches.
    """
    _finish_inplace(d, c, a[0].shape[1],
                    lambda: fp8_gemm_ref(a, b, c=c, recipe=recipe, out_dtype=d.dtype))


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
                 compiled_dims: str = "nk") -> None:
    """In-place reference with DeepGEMM's ``bf16_gemm_nt`` signature: writes ``C + A @ B.T`` into ``d``."""
    _finish_inplace(d, c, a.shape[1], lambda: bf16_gemm_ref(a, b, c=c, out_dtype=d.dtype))
