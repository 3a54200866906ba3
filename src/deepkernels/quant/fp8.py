"""FP8 (e4m3) block-scaled quantizers and UE8M0 scale helpers, bit-for-bit with DeepGEMM.

Source of the semantics: DeepGEMM ``deep_gemm/utils/math.py`` at ``54e2261`` (docs/spec/gemm.md §2.4). Every function
here is plain PyTorch, follows the device of its input (CPU or CUDA) and never synchronises with the host, except
:func:`pack_ue8m0_to_int`, which validates its input the way upstream asserts it.

The one quantisation rule used everywhere (docs/spec/gemm.md §7.6, docs/cases/edge-cases.md §8):

1. zero-pad the input to whole groups (padding never raises an amax);
2. ``amax = max |x|`` over each group, computed in FP32, then ``clamp(min=1e-4)`` (an all-zero group gets a finite,
   positive scale);
3. ``sf = amax / 448.0``; with ``use_ue8m0`` the scale is rounded *up* to a power of two by :func:`ceil_to_ue8m0`;
4. ``q = e4m3(clamp(x * (1.0 / sf), -448, 448))`` -- multiply by the FP32 reciprocal (BF16 x FP32 promotes to
   FP32), round to nearest even. The clamp only matters where a rounding error pushes ``|x/sf|`` a hair past 448
   (torch would round that to 448 anyway) or for ``inf`` inputs; it keeps the result identical on every backend
   (ml_dtypes and some CUDA paths give NaN above 464 instead of saturating). NaN stays NaN.

Non-finite input (a deepkernels rule; upstream gives a +inf scale, NaN at the inf elements and 0 at the finite
ones, which a GEMM turns into NaN or +-inf depending on how the backend decodes an e4m3 NaN): a group holding
+-inf or NaN quantises to **all-NaN data** with a **NaN scale** (FP32 scales) or a ``2^127`` scale (UE8M0, which
cannot express NaN). A consumer that multiplies by the scale (every GEMM kernel, the reference) therefore gives NaN
in every output that reads the group, on every backend -- never a finite or infinite value that looks like an
answer. (Under ``TRITON_INTERPRET=1`` only the NaN scale guarantees that: the interpreter decodes an e4m3 NaN as a
finite number, so with UE8M0 scales an interpreter run may give +-inf there instead of NaN.) Groups without a
non-finite element are unaffected (bit-identical to upstream).
"""
from __future__ import annotations

from typing import Sequence, Tuple

import torch

from .._validate import check_tensor

__all__ = [
    "E4M3_MAX", "ceil_div", "align", "ceil_to_ue8m0", "pack_ue8m0_to_int", "unpack_ue8m0_from_int",
    "per_token_cast_to_fp8", "per_channel_cast_to_fp8", "per_block_cast_to_fp8", "per_custom_dims_cast_to_fp8",
    "cast_back_from_fp8", "cast_to_e4m3",
]

#: Largest finite ``float8_e4m3fn`` magnitude.
E4M3_MAX = 448.0
_AMAX_FLOOR = 1e-4
_FLOAT_INPUTS = (torch.float32, torch.bfloat16, torch.float16)


def ceil_div(x: int, y: int) -> int:
    """``ceil(x / y)`` for Python ints (DeepGEMM ``ceil_div``)."""
    return (x + y - 1) // y


def align(x: int, y: int) -> int:
    """``x`` rounded up to a multiple of ``y`` (DeepGEMM ``align``)."""
    return ceil_div(x, y) * y


def _check_gran(name: str, gran: int) -> int:
    if isinstance(gran, bool) or not isinstance(gran, int) or gran <= 0:
        raise ValueError(f"{name} must be a positive int, got {gran!r}")
    return gran


def cast_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Saturating round-to-nearest-even cast of an FP32 tensor to ``torch.float8_e4m3fn``.

    Values beyond +-448 (including +-inf) become +-448; NaN stays NaN. Same shape as ``x``.
    """
    return x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def ceil_to_ue8m0(x: torch.Tensor) -> torch.Tensor:
    """Smallest power of two ``>= |x|``, by exponent arithmetic on the FP32 bits (DeepGEMM ``ceil_to_ue8m0``).

    ``bits = float32(|x|)``; ``e = ((bits >> 23) & 0xFF) + (mantissa != 0)``; ``e = clamp(e, 1, 254)``; result is
    ``e << 23`` as FP32. So exact powers of two are unchanged, values just above them go to the next power,
    ``0 -> 2^-126``, subnormals -> ``2^-126``, values above ``2^127`` (and inf, NaN) -> ``2^127``.

    Args:
        x: any shape, any floating dtype (converted to FP32 first).
    Returns:
        FP32 tensor of the same shape, every element a positive normal power of two.
    Raises:
        TypeError if ``x`` is not a floating tensor.
    """
    check_tensor("x", x)
    if not x.is_floating_point():
        raise TypeError(f"x must be a floating-point tensor, got {x.dtype} (shape {tuple(x.shape)})")
    bits = x.abs().float().contiguous().view(torch.int32)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (exp.clamp(1, 254) << 23).view(torch.float32)


def pack_ue8m0_to_int(x: torch.Tensor) -> torch.Tensor:
    """Pack FP32 power-of-two scales into UE8M0 bytes, four per ``int32`` (DeepGEMM ``pack_ue8m0_to_int``).

    Byte ``j`` (little-endian) of output word ``w`` holds the FP32 exponent byte of ``x[..., 4*w + j]``.

    Args:
        x: FP32 ``[..., 4*W]``, every element a non-negative power of two (zero mantissa, sign bit clear).
    Returns:
        int32 ``[..., W]``, contiguous.
    Raises:
        TypeError if ``x`` is not FP32; ValueError if the last dim is not a multiple of 4 or an element is not a
        non-negative power of two (upstream asserts; this check synchronises with the device).
    """
    check_tensor("x", x, dtype=torch.float32)
    if x.dim() == 0 or x.size(-1) % 4 != 0:
        raise ValueError(f"x must have a last dim that is a multiple of 4, got shape {list(x.shape)}")
    bits = x.contiguous().view(torch.int32)
    if x.numel() and bool(((bits & (0x7FFFFF | (1 << 31))) != 0).any()):
        raise ValueError(f"x (shape {list(x.shape)}) must hold non-negative powers of two only "
                         "(mantissa bits and sign bit zero); round with ceil_to_ue8m0 first")
    return ((bits >> 23) & 0xFF).to(torch.uint8).view(torch.int32)


def unpack_ue8m0_from_int(packed_sf: torch.Tensor) -> torch.Tensor:
    """Inverse of :func:`pack_ue8m0_to_int` (DeepGEMM ``unpack_ue8m0_from_int``).

    Args:
        packed_sf: int32 ``[..., W]`` (any strides).
    Returns:
        FP32 ``[..., 4*W]``: byte ``e`` becomes ``e << 23`` as FP32 (so ``e == 0`` gives ``0.0``).
    Raises:
        TypeError if ``packed_sf`` is not int32; ValueError if it is 0-d.
    """
    check_tensor("packed_sf", packed_sf, dtype=torch.int32)
    if packed_sf.dim() == 0:
        raise ValueError("packed_sf must have at least 1 dim, got a 0-d tensor")
    by = dense(packed_sf).view(torch.uint8)
    return (by.to(torch.int32) << 23).view(torch.float32)


def dense(t: torch.Tensor) -> torch.Tensor:
    """``t`` with standard row-major strides (a copy only when needed). Unlike ``.contiguous()``, it also fixes
    a non-unit stride on a size-1 last dim, so ``.view(other_dtype)`` always works on the result."""
    if t.is_contiguous() and (t.dim() == 0 or t.stride(-1) == 1):
        return t
    return torch.empty(t.shape, dtype=t.dtype, device=t.device).copy_(t)


def _scale_from_amax(amax: torch.Tensor, use_ue8m0: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sf, inv)``: the scale of each group (rule steps 2-3) and the multiplier its data is quantised with.

    A group whose amax is not finite (it holds +-inf or NaN) gets ``inv = NaN``, so all of its data is NaN, and
    ``sf = NaN`` (FP32 scales) or ``2^127`` (UE8M0: :func:`ceil_to_ue8m0` cannot express NaN; the NaN data still
    carries it). Cost: one elementwise op on the (small) amax tensor, two more with UE8M0."""
    nan = float("nan")
    amax = amax.nan_to_num(nan=nan, posinf=nan)  # amax >= 0: +inf is the only other non-finite value
    sf = amax.clamp(min=_AMAX_FLOOR) / E4M3_MAX
    if not use_ue8m0:
        return sf, 1.0 / sf
    sf_r = ceil_to_ue8m0(sf)
    return sf_r, 1.0 / sf_r + (sf - sf)  # + 0 for finite groups (exact), + NaN for non-finite ones


def _check_float_input(name: str, x: torch.Tensor, ndim=None) -> None:
    check_tensor(name, x, ndim=ndim)
    if x.dtype not in _FLOAT_INPUTS:
        raise TypeError(f"{name} must have dtype float32, bfloat16 or float16, got {x.dtype} (shape {tuple(x.shape)})")


def _pad_last(x: torch.Tensor, padded: int) -> torch.Tensor:
    if x.size(-1) == padded:
        return x
    return torch.nn.functional.pad(x, (0, padded - x.size(-1)))


def per_token_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False, gran_k: int = 128,
                          use_packed_ue8m0: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-token (1 x ``gran_k``) FP8 quantisation (DeepGEMM ``per_token_cast_to_fp8``; SFA of the GEMMs).

    Args:
        x: ``[m, n]`` float32/bfloat16/float16, any strides. ``n`` need not be a multiple of ``gran_k``: the tail
            group is zero-padded before its amax.
        use_ue8m0: round each scale up to a power of two (:func:`ceil_to_ue8m0`) before quantising.
        gran_k: group width along ``n`` (128 on SM90; 32 for MXFP8).
        use_packed_ue8m0: return the scales packed 4 per int32 (:func:`pack_ue8m0_to_int`); requires
            ``use_ue8m0``. Upstream asserts ``ceil(n/gran_k) % 4 == 0`` here; deepkernels instead pads the scale
            row with 1.0 (exponent byte 127) to a multiple of 4, like DeepGEMM's FP4 variant.
    Returns:
        ``(x_fp8, sf)``: ``x_fp8`` float8_e4m3fn ``[m, n]`` contiguous; ``sf`` float32 ``[m, ceil(n/gran_k)]``
        (scale = dequantisation multiplier, ``x ~= x_fp8 * sf``), or int32 ``[m, ceil(ceil(n/gran_k)/4)]`` packed.
        Non-finite input: a group holding +-inf or NaN gets all-NaN data and a NaN scale (``2^127`` with UE8M0;
        module docstring), so ``fp8_gemm_nt`` rows reading it are NaN on every backend.
    Raises:
        TypeError for a non-tensor or non-float dtype; ValueError for a non-2-D ``x``, a bad ``gran_k`` or
        ``use_packed_ue8m0`` without ``use_ue8m0``.
    """
    _check_float_input("x", x, ndim=2)
    _check_gran("gran_k", gran_k)
    if use_packed_ue8m0 and not use_ue8m0:
        raise ValueError("use_packed_ue8m0=True requires use_ue8m0=True (packing needs power-of-two scales)")
    m, n = x.shape
    padded_n = align(n, gran_k)
    x_view = _pad_last(x, padded_n).reshape(m, padded_n // gran_k, gran_k)
    sf, inv = _scale_from_amax(x_view.abs().float().amax(dim=2), use_ue8m0)
    x_fp8 = cast_to_e4m3(x_view * inv.unsqueeze(2)).view(m, padded_n)[:, :n].contiguous()
    if use_packed_ue8m0:
        num_sf = sf.size(1)
        sf = pack_ue8m0_to_int(torch.nn.functional.pad(sf, (0, align(num_sf, 4) - num_sf), value=1.0))
    return x_fp8, sf


def per_channel_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False,
                            gran_k: int = 128) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-channel (``gran_k`` x 1) FP8 quantisation along rows (DeepGEMM ``per_channel_cast_to_fp8``).

    Used for K-grouped weight-gradient operands laid out ``[K, MN]``: each column gets one scale per ``gran_k``
    consecutive rows.

    Args:
        x: ``[m, n]`` float32/bfloat16/float16 with ``m % gran_k == 0``.
        use_ue8m0: round scales up to powers of two.
        gran_k: rows per scale group.
    Returns:
        ``(x_fp8 float8_e4m3fn [m, n] contiguous, sf float32 [m // gran_k, n])``.
    Raises:
        TypeError for a bad dtype; ValueError for a non-2-D ``x`` or ``m % gran_k != 0``.
    """
    _check_float_input("x", x, ndim=2)
    _check_gran("gran_k", gran_k)
    m, n = x.shape
    if m % gran_k != 0:
        raise ValueError(f"x must have a first dim that is a multiple of gran_k={gran_k}, got shape {[m, n]}")
    x_view = x.reshape(m // gran_k, gran_k, n)
    sf, inv = _scale_from_amax(x_view.abs().float().amax(dim=1), use_ue8m0)
    return cast_to_e4m3(x_view * inv.unsqueeze(1)).view(m, n), sf


def per_block_cast_to_fp8(x: torch.Tensor, use_ue8m0: bool = False,
                          gran_k: int = 128) -> Tuple[torch.Tensor, torch.Tensor]:
    """Per-block (``gran_k`` x ``gran_k``) FP8 quantisation (DeepGEMM ``per_block_cast_to_fp8``; SFB of 1D2D).

    Args:
        x: ``[m, n]`` float32/bfloat16/float16; both dims are zero-padded to multiples of ``gran_k`` before the
            amax.
        use_ue8m0: round scales up to powers of two.
        gran_k: block edge.
    Returns:
        ``(x_fp8 float8_e4m3fn [m, n] contiguous, sf float32 [ceil(m/gran_k), ceil(n/gran_k)] contiguous)``.
    Raises:
        TypeError for a bad dtype; ValueError for a non-2-D ``x`` or a bad ``gran_k``.
    """
    _check_float_input("x", x, ndim=2)
    _check_gran("gran_k", gran_k)
    m, n = x.shape
    pm, pn = align(m, gran_k), align(n, gran_k)
    x_padded = x if (pm, pn) == (m, n) else torch.nn.functional.pad(x, (0, pn - n, 0, pm - m))
    x_view = x_padded.reshape(pm // gran_k, gran_k, pn // gran_k, gran_k)
    sf, inv = _scale_from_amax(x_view.abs().float().amax(dim=(1, 3), keepdim=True), use_ue8m0)
    x_fp8 = cast_to_e4m3(x_view * inv).view(pm, pn)[:m, :n].contiguous()
    return x_fp8, sf.view(pm // gran_k, pn // gran_k)


def per_custom_dims_cast_to_fp8(x: torch.Tensor, dims: Sequence[int],
                                use_ue8m0: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """One scale per index of ``dims``, amax over all other dims (DeepGEMM ``per_custom_dims_cast_to_fp8``).

    Example: the MQA-logits KV cache ``[n, d]`` with ``dims=(0,)`` gets one FP32 scale per token.

    Args:
        x: any shape, float32/bfloat16/float16.
        dims: the dims that keep their own scale.
        use_ue8m0: round scales up to powers of two.
    Returns:
        ``(x_fp8 float8_e4m3fn, same shape as x; sf float32)``: sf has x's sizes over ``dims`` and is then
        ``.squeeze()``-d as upstream, so a kept dim of size 1 is dropped too (x ``[1, n]``, ``dims=(0,)``: a 0-d sf).
    Raises:
        TypeError for a bad dtype; ValueError for a dim out of range.
    """
    _check_float_input("x", x)
    keep = set()
    for d in dims:
        if not -x.dim() <= d < x.dim():
            raise ValueError(f"dims entry {d} out of range for x of shape {list(x.shape)}")
        keep.add(d % x.dim())
    reduce = tuple(i for i in range(x.dim()) if i not in keep)
    if any(x.size(i) == 0 for i in reduce):  # nothing to reduce: amax 0 -> the 1e-4 floor, like an all-zero group
        amax = x.new_zeros([1 if i in reduce else x.size(i) for i in range(x.dim())], dtype=torch.float32)
    else:
        amax = x.abs().float().amax(dim=reduce, keepdim=True) if reduce else x.abs().float()
    sf, inv = _scale_from_amax(amax, use_ue8m0)
    return cast_to_e4m3(x * inv), sf.squeeze()


def _gran_for(size: int, num_sf: int, gran_k: int, name: str, x_shape, sf_shape) -> int:
    # prefer the per-token reading when both fit (they then index identically)
    if num_sf == ceil_div(size, gran_k):
        return gran_k
    if num_sf == size:
        return 1
    raise ValueError(f"{name}: sf of shape {list(sf_shape)} does not fit x of shape {list(x_shape)} with "
                     f"gran_k={gran_k} (expected {ceil_div(size, gran_k)} or {size} along that dim)")


def cast_back_from_fp8(x_fp8: torch.Tensor, sf: torch.Tensor, gran_k: int = 128, use_packed_ue8m0: bool = False,
                       out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Dequantise FP8 data with its scales: ``x_fp8.float() * sf`` broadcast over each scale's group, in FP32.

    The scale granularity is read from the shapes, so the output of any quantizer above round-trips:
    per-token ``sf [.., m, ceil(n/gran_k)]``, per-block ``[.., ceil(m/gran_k), ceil(n/gran_k)]``, per-channel
    ``[.., m/gran_k, n]`` (a dim where both readings fit indexes identically either way).

    Args:
        x_fp8: ``[m, n]`` or ``[g, m, n]`` float8_e4m3fn (any strides).
        sf: float32 scales as above with the same leading dims, or int32 packed UE8M0 with ``use_packed_ue8m0``
            (unpacked and cropped to ``ceil(n/gran_k)`` first; any strides, e.g. the MN-major TMA layout).
        gran_k: group size used at quantisation.
        use_packed_ue8m0: ``sf`` is packed (:func:`pack_ue8m0_to_int`).
        out_dtype: dtype of the result; the product is computed in FP32 and rounded once.
    Returns:
        ``out_dtype`` tensor of ``x_fp8``'s shape.
    Raises:
        TypeError for wrong dtypes; ValueError for shapes that do not match.
    """
    check_tensor("x_fp8", x_fp8, ndim=(2, 3), dtype=torch.float8_e4m3fn)
    _check_gran("gran_k", gran_k)
    check_tensor("sf", sf, ndim=x_fp8.dim(), dtype=torch.int32 if use_packed_ue8m0 else torch.float32)
    if sf.shape[:-2] != x_fp8.shape[:-2]:
        raise ValueError(f"sf must have the leading (group) dims of x_fp8: sf {list(sf.shape)}, "
                         f"x_fp8 {list(x_fp8.shape)}")
    m, n = x_fp8.shape[-2:]
    if use_packed_ue8m0:
        sf = unpack_ue8m0_from_int(sf)
        if sf.size(-1) < ceil_div(n, gran_k):
            raise ValueError(f"packed sf of shape {list(sf.shape[:-1])}+[{sf.size(-1) // 4}] holds "
                             f"{sf.size(-1)} scales per row, need {ceil_div(n, gran_k)} for n={n}")
        sf = sf[..., :ceil_div(n, gran_k)]
    gm = _gran_for(m, sf.size(-2), gran_k, "rows", x_fp8.shape, sf.shape)
    gn = _gran_for(n, sf.size(-1), gran_k, "columns", x_fp8.shape, sf.shape)
    rows = torch.arange(m, device=sf.device) // gm
    cols = torch.arange(n, device=sf.device) // gn
    full = sf.index_select(-2, rows).index_select(-1, cols)
    return (x_fp8.float() * full).to(out_dtype)
