"""FP4 (e2m1) quantisation and packing: the FlashMLA V4.1 rule (e4m3 per-16 scales) and DeepGEMM's per-token FP4.

e2m1 code (4 bits): bit 3 = sign, bits 0-2 = index into the magnitudes ``{0, 0.5, 1, 1.5, 2, 3, 4, 6}``.
Packing: two codes per byte, **even index in the low nibble**: ``byte = code[2i] | code[2i+1] << 4``.

Two rounding rules exist upstream and both are provided:

- :func:`round_to_e2m1` (FlashMLA [2026-09+] V4.1 FP4 KV cache, docs/spec/mla.md §2.4): PTX ``cvt.rn.satfinite`` --
  round to nearest, ties to the even code, saturate to +-6, NaN -> magnitude 0; the sign bit is always
  ``signbit(x)`` (so ``-0.1`` gives code 8, "-0").
- DeepGEMM ``_quantize_to_fp4_e2m1`` (used by :func:`per_token_cast_to_fp4`): ``bucketize`` on the midpoints, so
  ties round *down*, and the sign is only set for a non-zero magnitude.
"""
from __future__ import annotations

from typing import Tuple

import torch

from .._validate import check_tensor
from .fp8 import _check_gran, align, ceil_div, ceil_to_ue8m0, pack_ue8m0_to_int, unpack_ue8m0_from_int

__all__ = [
    "E2M1_MAX", "E2M1_VALUES", "round_to_e2m1", "e2m1_to_float", "pack_e2m1", "unpack_e2m1",
    "quantize_fp4_e2m1", "dequantize_fp4_e2m1", "per_token_cast_to_fp4", "cast_back_from_fp4",
]

E2M1_MAX = 6.0
#: magnitudes of the 8 non-negative e2m1 codes
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)
_SCALE_MIN = 2.0 ** -9


def _count_above_mids(a: torch.Tensor) -> torch.Tensor:
    """Number of midpoints strictly below ``a`` (= ``torch.bucketize(a, mids)``), without a device constant."""
    idx = torch.zeros(a.shape, dtype=torch.int32, device=a.device)
    for m in _MIDPOINTS:
        idx += (a > m).to(torch.int32)
    return idx


def round_to_e2m1(x: torch.Tensor) -> torch.Tensor:
    """Round to e2m1 codes with ``cvt.rn.satfinite`` semantics (ties to even, saturate to +-6, NaN -> +-0).

    Args:
        x: any shape, float dtype (converted to FP32).
    Returns:
        uint8 codes of the same shape, values 0..15 (bit 3 = ``signbit(x)``).
    """
    check_tensor("x", x)
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype} (shape {tuple(x.shape)})")
    y = x.float()
    a = torch.nan_to_num(y.abs(), nan=0.0).clamp(max=E2M1_MAX)
    idx = _count_above_mids(a)  # ties land on the lower neighbour ...
    for i, m in enumerate(_MIDPOINTS):
        if i % 2 == 1:  # ... which is odd for these midpoints: move to the even code
            idx += (a == m).to(torch.int32)
    return idx.to(torch.uint8) | (torch.signbit(y).to(torch.uint8) << 3)


def e2m1_to_float(codes: torch.Tensor) -> torch.Tensor:
    """FP32 values of e2m1 codes (uint8/int8, low 4 bits used); code 8 gives ``-0.0``."""
    check_tensor("codes", codes, dtype=(torch.uint8, torch.int8))
    c = codes.to(torch.int32) & 0xF
    i = c & 7  # 0, 1 -> 0, 0.5 (subnormal); i >= 2 -> 2^((i>>1)-1) * (1 + (i&1)/2)
    normal = torch.exp2(((i >> 1) - 1).float()) * (1.0 + 0.5 * (i & 1).float())
    mag = torch.where(i < 2, 0.5 * i.float(), normal)
    return torch.where((c & 8) != 0, -mag, mag)


def pack_e2m1(codes: torch.Tensor) -> torch.Tensor:
    """Pack codes ``[..., 2n]`` into bytes ``[..., n]``: even index in the low nibble. uint8 output.

    Raises ValueError if the last dim is odd.
    """
    check_tensor("codes", codes, dtype=(torch.uint8, torch.int8))
    if codes.dim() == 0 or codes.size(-1) % 2:
        raise ValueError(f"codes must have an even last dim, got shape {list(codes.shape)}")
    c = codes.view(torch.uint8) if codes.dtype == torch.int8 else codes
    return (c[..., 0::2] & 0xF) | ((c[..., 1::2] & 0xF) << 4)


def unpack_e2m1(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_e2m1`: bytes ``[..., n]`` (uint8/int8/float8 storage) -> uint8 codes ``[..., 2n]``."""
    check_tensor("packed", packed, dtype=(torch.uint8, torch.int8, torch.float8_e4m3fn))
    if packed.dim() == 0:
        raise ValueError("packed must have at least 1 dim")
    p = packed if packed.dtype == torch.uint8 else packed.view(torch.uint8)
    return torch.stack((p & 0xF, p >> 4), dim=-1).flatten(-2)


def quantize_fp4_e2m1(x: torch.Tensor, tile: int = 16) -> Tuple[torch.Tensor, torch.Tensor]:
    """FP4 quantisation with one e4m3 scale per ``tile`` elements (FlashMLA V4.1 FP4 rule, docs/spec/mla.md §2.4).

    Per tile: ``amax = max|x|`` in FP32 (NaN counts as inf); ``scale = e4m3(clamp(amax / 6, 2^-9, 448))`` (clamped
    before the cast, so no overflow); a tile holding NaN or inf gets scale NaN (byte 0x7F). Each element:
    ``code = round_to_e2m1(x / float(scale))``.

    Args:
        x: ``[..., n]`` float32/bfloat16/float16, ``n % tile == 0``.
        tile: elements per scale (16 in the V4.1 FP4 cache).
    Returns:
        ``(packed uint8 [..., n/2], scales float8_e4m3fn [..., n/tile])``.
    Raises:
        TypeError for a non-float ``x``; ValueError if ``n % tile != 0`` or ``tile`` is odd or not positive.
    """
    check_tensor("x", x)
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype} (shape {tuple(x.shape)})")
    if isinstance(tile, bool) or not isinstance(tile, int) or tile <= 0 or tile % 2:
        raise ValueError(f"tile must be a positive even int, got {tile!r}")
    if x.dim() == 0 or x.size(-1) % tile:
        raise ValueError(f"x must have a last dim that is a multiple of tile={tile}, got shape {list(x.shape)}")
    n = x.size(-1)
    xt = x.float().reshape(*x.shape[:-1], n // tile, tile)
    ax = xt.abs()
    amax = torch.where(torch.isnan(ax), torch.full_like(ax, float("inf")), ax).amax(dim=-1, keepdim=True)
    scale = (amax / E2M1_MAX).clamp(_SCALE_MIN, 448.0).to(torch.float8_e4m3fn)
    scale = torch.where(torch.isinf(amax), torch.full_like(scale, float("nan")), scale)
    codes = round_to_e2m1(xt / scale.float())
    return pack_e2m1(codes.reshape(x.shape)), scale.squeeze(-1)


def dequantize_fp4_e2m1(packed: torch.Tensor, scales: torch.Tensor, tile: int = 16,
                        out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``value(code) * float(scale)`` per element (exact in bf16: at most 2+4 significant bits).

    Args:
        packed: uint8/int8 ``[..., n/2]``.
        scales: float8_e4m3fn ``[..., n/tile]`` (or uint8 bytes of e4m3).
        out_dtype: result dtype (default bfloat16).
    Returns:
        ``out_dtype [..., n]``.
    Raises:
        TypeError for wrong dtypes; ValueError for a 0-d ``packed``, scales whose shape does not match or a
        ``tile`` that is not a positive int.
    """
    codes = unpack_e2m1(packed)
    check_tensor("scales", scales, dtype=(torch.float8_e4m3fn, torch.uint8, torch.int8))
    _check_gran("tile", tile)
    s = scales if scales.dtype == torch.float8_e4m3fn else scales.view(torch.float8_e4m3fn)
    n = codes.size(-1)
    if s.shape[:-1] != codes.shape[:-1] or s.size(-1) * tile != n:
        raise ValueError(f"scales must have shape {list(codes.shape[:-1]) + [n // tile]} for packed of shape "
                         f"{list(packed.shape)} and tile={tile}, got {list(scales.shape)}")
    vals = e2m1_to_float(codes).reshape(*codes.shape[:-1], n // tile, tile) * s.float().unsqueeze(-1)
    return vals.reshape(codes.shape).to(out_dtype)


def _deepgemm_fp4_codes(x: torch.Tensor) -> torch.Tensor:
    a = x.abs().clamp(max=E2M1_MAX)
    idx = torch.where(torch.isnan(a), 7, _count_above_mids(a))  # bucketize sorts NaN last
    sign = (x < 0) & (idx != 0)
    return idx.to(torch.uint8) | (sign.to(torch.uint8) << 3)


def per_token_cast_to_fp4(x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128,
                          use_packed_ue8m0: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """DeepGEMM ``per_token_cast_to_fp4`` (SM100 FP4 operands): per 1 x ``gran_k`` group,
    ``sf = clamp(amax, 1e-4) / 6`` (optionally :func:`ceil_to_ue8m0`), codes by DeepGEMM's bucketize rounding of
    ``x * (1/sf)``, packed two per int8 (even index low).

    Args:
        x: ``[m, n]`` float, ``n`` even (zero-padded to whole groups for the amax).
        use_packed_ue8m0: pack scales 4 per int32 (requires ``use_ue8m0``); the scale row is padded with 1.0 to a
            multiple of 4.
    Returns:
        ``(int8 [m, n/2], float32 sf [m, ceil(n/gran_k)] or int32 packed [m, ceil(ceil(n/gran_k)/4)])``.
    Raises:
        TypeError for a non-float ``x``; ValueError for an odd ``n``, a non-2-D ``x``, a ``gran_k`` that is not a
        positive int or ``use_packed_ue8m0`` without ``use_ue8m0``.
    """
    check_tensor("x", x, ndim=2)
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype} (shape {tuple(x.shape)})")
    _check_gran("gran_k", gran_k)
    m, n = x.shape
    if n % 2:
        raise ValueError(f"x must have an even last dim, got shape {[m, n]}")
    if use_packed_ue8m0 and not use_ue8m0:
        raise ValueError("use_packed_ue8m0=True requires use_ue8m0=True")
    padded_n = align(n, gran_k)
    xp = torch.nn.functional.pad(x, (0, padded_n - n)) if padded_n != n else x
    xv = xp.reshape(m, padded_n // gran_k, gran_k)
    sf = xv.abs().float().amax(dim=2).clamp(min=1e-4) / E2M1_MAX
    if use_ue8m0:
        sf = ceil_to_ue8m0(sf)
    codes = _deepgemm_fp4_codes(xv * (1.0 / sf.unsqueeze(2))).view(m, padded_n)
    packed = pack_e2m1(codes)[:, : n // 2].contiguous().view(torch.int8)
    if use_packed_ue8m0:
        num_sf = sf.size(1)
        sf = pack_ue8m0_to_int(torch.nn.functional.pad(sf, (0, align(num_sf, 4) - num_sf), value=1.0))
    return packed, sf


def cast_back_from_fp4(packed: torch.Tensor, sf: torch.Tensor, gran_k: int = 128,
                       use_packed_ue8m0: bool = False) -> torch.Tensor:
    """Inverse of :func:`per_token_cast_to_fp4`: FP32 ``[m, 2 * packed.size(1)]`` = ``value(code) * sf[row, k // gran_k]``.

    ``packed``: int8/uint8 ``[m, n/2]``; ``sf``: float32 ``[m, >= ceil(n/gran_k)]`` or, with ``use_packed_ue8m0``,
    int32 packed UE8M0. Raises TypeError for wrong dtypes, ValueError for wrong ranks / shapes or a ``gran_k`` that
    is not a positive int."""
    check_tensor("packed", packed, ndim=2, dtype=(torch.int8, torch.uint8))
    _check_gran("gran_k", gran_k)
    m, n = packed.size(0), packed.size(1) * 2
    if use_packed_ue8m0:
        sf = unpack_ue8m0_from_int(sf)
    check_tensor("sf", sf, ndim=2, dtype=torch.float32)
    if sf.size(0) != m or sf.size(1) < ceil_div(n, gran_k):
        raise ValueError(f"sf must have shape [{m}, >= {ceil_div(n, gran_k)}], got {list(sf.shape)}")
    cols = torch.arange(n, device=packed.device) // gran_k
    return e2m1_to_float(unpack_e2m1(packed)) * sf[:, cols]
