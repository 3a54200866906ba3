"""Scale-factor layouts for the FP8 GEMMs: TMA alignment, MN-major transposes, packed UE8M0 (DeepGEMM-compatible).

Source of the semantics: DeepGEMM ``csrc/apis/layout.hpp``, ``csrc/utils/layout.hpp`` and
``csrc/jit_kernels/impls/smxx_layout.hpp`` at ``54e2261`` (docs/spec/gemm.md §1.13, §2.1-2.3). Plain PyTorch,
follows the device of its input; upstream's ``DG_HOST_ASSERT`` failures are ``ValueError``/``TypeError`` here.

Layout words: an SF tensor ``[.., MN, SFK]`` is *MN-major TMA-aligned* when ``stride(-2) == 1`` and
``stride(-1) == A = get_tma_aligned_size(MN, element_size)`` (for FP32/int32: ``align(MN, 4)``), with groups packed
as ``stride(-3) == A * SFK``. Element ``(g, mn, k)`` then sits at ``g*A*SFK + k*A + mn``; rows ``MN..A-1`` of each
column are padding that kernels may read and must ignore (left uninitialised, as upstream).
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch

from .._validate import check_tensor
from .fp8 import align, ceil_div

__all__ = [
    "get_tma_aligned_size", "get_mn_major_tma_aligned_tensor", "get_col_major_tma_aligned_tensor",
    "get_mn_major_tma_aligned_packed_ue8m0_tensor", "transform_sf_into_required_layout", "check_sf_layout",
    "is_mn_major_tma_aligned",
]


def get_tma_aligned_size(x: int, element_size: int) -> int:
    """``x`` rounded up so that ``x * element_size`` is a multiple of 16 bytes (DeepGEMM ``get_tma_aligned_size``).

    Args:
        x: a dimension (elements), ``>= 0``.
        element_size: bytes per element; must divide 16.
    Returns:
        ``align(x, 16 // element_size)`` (FP32: a multiple of 4).
    Raises:
        ValueError if ``16 % element_size != 0`` or ``x < 0``.
    """
    if element_size <= 0 or 16 % element_size != 0:
        raise ValueError(f"element_size must divide 16, got {element_size}")
    if x < 0:
        raise ValueError(f"x must be >= 0, got {x}")
    return align(int(x), 16 // element_size)


def _batched(sf: torch.Tensor, name: str = "sf") -> torch.Tensor:
    check_tensor(name, sf, ndim=(2, 3), dtype=torch.float32)
    return sf.unsqueeze(0) if sf.dim() == 2 else sf


def is_mn_major_tma_aligned(sf: torch.Tensor) -> bool:
    """Whether ``sf`` ``[MN, SFK]`` / ``[G, MN, SFK]`` already has upstream's exact MN-major TMA-aligned strides.

    2-D: ``stride == (1, A)``; 3-D: ``stride == (A*SFK, 1, A)``, with ``A = get_tma_aligned_size(MN, elem)``.
    A 3-D tensor with a single group passes whatever its ``stride(0)`` (edge case B39: a batch dim added by
    ``unsqueeze`` must not force a copy; upstream would copy it).
    """
    mn, sf_k = sf.shape[-2:]
    a = get_tma_aligned_size(mn, sf.element_size())
    if sf.dim() == 3 and sf.size(0) != 1 and sf.stride(0) != a * sf_k:
        return False
    return sf.stride(-2) == 1 and sf.stride(-1) == a


def get_mn_major_tma_aligned_tensor(sf: torch.Tensor) -> torch.Tensor:
    """FP32 scales in MN-major, TMA-aligned layout (DeepGEMM ``get_mn_major_tma_aligned_tensor``).

    Args:
        sf: float32 ``[MN, SFK]`` or ``[G, MN, SFK]``, any strides (e.g. the row-major SFA of
            :func:`per_token_cast_to_fp8`).
    Returns:
        ``sf`` itself (same object, no copy) when :func:`is_mn_major_tma_aligned`; otherwise a new tensor of the
        same shape and values with strides ``(1, A)`` / ``(A*SFK, 1, A)``, ``A = align(MN, 4)``, exactly upstream's
        strides. Its storage covers the whole padded ``G*SFK*A`` extent (padding rows uninitialised, as upstream;
        upstream's ``empty_strided`` storage ends after the last real row), so a kernel may read the padding.
        A tensor passed through unchanged keeps whatever storage the caller gave it.
    Raises:
        TypeError if ``sf`` is not a float32 tensor; ValueError if it is not 2-D or 3-D.
    """
    batched = _batched(sf)
    if is_mn_major_tma_aligned(sf):
        return sf
    g, mn, sf_k = batched.shape
    a = get_tma_aligned_size(mn, 4)
    # full [G, SFK, A] storage (empty_strided would stop after the last real row, so a TMA box over the padded
    # extent of the last column would read past the allocation); strides exactly upstream's
    storage = torch.empty(g * sf_k * a, dtype=sf.dtype, device=sf.device)
    out = storage.as_strided((g, mn, sf_k), (a * sf_k, 1, a))
    out.copy_(batched)
    return out.squeeze(0) if sf.dim() == 2 else out


#: v1 name of :func:`get_mn_major_tma_aligned_tensor`.
get_col_major_tma_aligned_tensor = get_mn_major_tma_aligned_tensor


def _mk_alignment() -> int:
    try:  # the GEMM module owns the runtime knob; fall back to upstream's default
        from ..gemm import get_mk_alignment_for_contiguous_layout  # type: ignore[attr-defined]
        return int(get_mk_alignment_for_contiguous_layout())
    except Exception:
        return 128


def _psum_valid_rows(psum_layout: torch.Tensor, mn: int, m_alignment: int) -> torch.Tensor:
    """Bool ``[mn]``: rows that belong to a group of the psum layout (gaps are False). No host sync."""
    ends = psum_layout.to(torch.int64)
    starts = torch.zeros_like(ends)
    if ends.numel() > 1:
        starts[1:] = (ends[:-1] + m_alignment - 1) // m_alignment * m_alignment
    rows = torch.arange(mn, device=psum_layout.device)
    return ((rows[:, None] >= starts[None, :]) & (rows[:, None] < ends[None, :])).any(dim=1)


def get_mn_major_tma_aligned_packed_ue8m0_tensor(sf: torch.Tensor, psum_layout: Optional[torch.Tensor] = None,
                                                 *, m_alignment: Optional[int] = None) -> torch.Tensor:
    """Pack FP32 power-of-two scales into UE8M0 int32, MN-major TMA-aligned (DeepGEMM, SM100 SF layout).

    Word ``(g, mn, w)`` holds the exponent bytes (``bits >> 23``) of K-groups ``4w .. 4w+3`` of row ``mn``,
    little-endian (byte ``j`` = K-group ``4w+j``); bytes for K-groups ``>= SFK`` are zero.

    Args:
        sf: float32 ``[MN, SFK]`` or ``[G, MN, SFK]``, any strides, every (non-gap) element a non-negative power
            of two.
        psum_layout: optional int32 ``[num_groups]`` cumulative row ends of an M-grouped psum layout (2-D ``sf``
            only); rows in the gaps between ``end[g-1]`` and ``align(end[g-1], m_alignment)`` are not validated
            and pack to 0 (upstream leaves them uninitialised).
        m_alignment: psum group alignment; default ``deepkernels.get_mk_alignment_for_contiguous_layout()``
            (128 unless set).
    Returns:
        int32 ``[MN, ceil(SFK/4)]`` with strides ``(1, A)``, or ``[G, MN, ceil(SFK/4)]`` with strides
        ``(ceil(SFK/4)*A, 1, A)``; ``A = align(MN, 4)``; padding rows zero.
    Raises:
        TypeError for a non-float32 ``sf`` or non-int32 ``psum_layout``; ValueError for a bad rank, a psum layout
        with a 3-D ``sf``, or a scale that is not a non-negative power of two (upstream traps on its CUDA path and
        silently drops the mantissa on its torch path; this check synchronises with the device).
    """
    batched = _batched(sf)
    g, mn, sf_k = batched.shape
    a = get_tma_aligned_size(mn, 4)
    packed_k = ceil_div(sf_k, 4)
    bits = batched.contiguous().view(torch.int32)
    if psum_layout is not None:
        check_tensor("psum_layout", psum_layout, ndim=1, dtype=torch.int32)
        if sf.dim() != 2:
            raise ValueError(f"psum_layout needs a 2-D sf, got sf of shape {list(sf.shape)}")
        if psum_layout.numel() == 0:
            raise ValueError("psum_layout must have at least one group, got shape [0]")
        valid = _psum_valid_rows(psum_layout, mn, m_alignment or _mk_alignment()).view(1, mn, 1)
        bits = torch.where(valid, bits, torch.zeros_like(bits))
    if bits.numel() and bool(((bits & (0x7FFFFF | (1 << 31))) != 0).any()):
        raise ValueError(f"sf (shape {list(sf.shape)}) must hold non-negative powers of two only; "
                         "round with ceil_to_ue8m0 first")
    padded = torch.zeros((g, mn, packed_k * 4), dtype=torch.uint8, device=sf.device)
    padded[:, :, :sf_k] = (bits >> 23).to(torch.uint8)
    words = padded.view(torch.int32)  # [g, mn, packed_k], byte j of word w = K-group 4w+j (little-endian)
    storage = torch.zeros((g, packed_k, a), dtype=torch.int32, device=sf.device)
    out = storage.as_strided((g, mn, packed_k), (packed_k * a, 1, a))
    out.copy_(words)
    return out.squeeze(0) if sf.dim() == 2 else out


def check_sf_layout(sf: torch.Tensor, mn: int, k: int, gran_mn: int, gran_k: int, num_groups: Optional[int] = None,
                    tma_stride_check: bool = False, sm90_sfb_check: bool = False,
                    type_check: Optional[torch.dtype] = None, *, name: str = "sf") -> torch.Tensor:
    """Validate an SF tensor the way DeepGEMM's ``check_sf_layout`` asserts; return it unchanged.

    Shape: ``[ceil(mn/gran_mn), ceil(k/(gran_k * (1 if FP32 else 4)))]`` with a leading ``num_groups`` dim when
    given. ``tma_stride_check``: MN-major (``stride(-2) == 1`` or ``mn == 1``), ``stride(-1) >= align(mn, 4)``
    and ``% 4 == 0``, packed groups. ``sm90_sfb_check``: contiguous or contiguous after transposing the last
    two dims, packed groups.

    Raises:
        TypeError for a dtype other than float32/int32 (or ``type_check``); ValueError naming ``name``, the
        shape/strides seen and what was expected.
    """
    check_tensor(name, sf, dtype=(type_check,) if type_check is not None else (torch.float32, torch.int32))
    nd = 2 + (num_groups is not None)
    if sf.dim() != nd:
        raise ValueError(f"{name} must have {nd} dims, got shape {list(sf.shape)}")
    per = 1 if sf.dtype == torch.float32 else 4
    expected = ([num_groups] if num_groups is not None else []) + [ceil_div(mn, gran_mn), ceil_div(k, gran_k * per)]
    if list(sf.shape) != expected:
        raise ValueError(f"{name} must have shape {expected} for mn={mn}, k={k}, granularity ({gran_mn}, {gran_k}) "
                         f"and dtype {sf.dtype}, got {list(sf.shape)}")
    strides = list(sf.stride())
    if tma_stride_check:
        ok = (num_groups is None or sf.stride(-3) == sf.stride(-1) * sf.size(-1)) \
            and (sf.stride(-2) == 1 or mn == 1) \
            and sf.stride(-1) >= get_tma_aligned_size(mn, sf.element_size()) and sf.stride(-1) % 4 == 0
        if not ok:
            raise ValueError(f"{name} (shape {list(sf.shape)}) must be MN-major and TMA-aligned: stride(-2) == 1, "
                             f"stride(-1) >= {get_tma_aligned_size(mn, sf.element_size())} and a multiple of 4, "
                             f"packed groups; got strides {strides}")
    if sm90_sfb_check:
        rows, cols = sf.shape[-2:]
        ok = (num_groups is None or sf.stride(-3) == rows * cols) and (
            (sf.stride(-1) == 1 and sf.stride(-2) == cols) or (sf.stride(-1) == rows and sf.stride(-2) == 1))
        if not ok:
            raise ValueError(f"{name} (shape {list(sf.shape)}) must be contiguous or contiguous after transposing its "
                             f"last two dims, with packed groups; got strides {strides}")
    return sf


def _default_arch(sf: torch.Tensor) -> int:
    if sf.device.type == "cuda":
        return torch.cuda.get_device_capability(sf.device)[0]
    return 9  # deepkernels targets Hopper; CPU tensors follow the SM90 rules


def transform_sf_into_required_layout(sf: torch.Tensor, mn: int, k: int, recipe: Sequence[int],
                                      num_groups: Optional[int] = None, is_sfa: Optional[bool] = None,
                                      disable_ue8m0_cast: bool = False, psum_layout: Optional[torch.Tensor] = None,
                                      *, arch_major: Optional[int] = None) -> torch.Tensor:
    """Bring a GEMM scale tensor into the layout the kernels read (DeepGEMM ``transform_sf_into_required_layout``).

    Decision table (docs/spec/gemm.md §2.3), after :func:`check_sf_layout` on the shape:

    ======  ====================  =====================================  ==============================================
    dtype   (gran_mn, gran_k)     arch / flag                            result
    ======  ====================  =====================================  ==============================================
    FP32    (1, 128)              SM90, or ``disable_ue8m0_cast``        :func:`get_mn_major_tma_aligned_tensor`
    FP32    (128, 128)            SM90, or ``disable_ue8m0_cast``        ``sf`` as-is after the SM90 SFB stride check
    FP32    (1|128, 32|128)       SM100/SM120, no ``disable_ue8m0_cast``  rows broadcast, then packed UE8M0 (int32)
    INT32   (1, 32|128)           SM100/SM120                            ``sf`` after the TMA stride check
    ======  ====================  =====================================  ==============================================

    Args:
        sf: float32 or int32 ``[ceil(mn/gran_mn), SFK]`` (``[num_groups, ...]`` when grouped).
        mn, k: the operand's logical MN and K.
        recipe: ``(gran_m_a, gran_n_b, gran_k)`` together with ``is_sfa`` (selects ``gran_mn``), or
            ``(gran_mn, gran_k)`` with ``is_sfa=None``.
        num_groups: group count for 3-D ``sf``.
        disable_ue8m0_cast: keep FP32 on SM100 (ignored on SM90).
        psum_layout: forwarded to the UE8M0 packer (SM100 SFA).
        arch_major: compute-capability major the layout is for; default: the device's for CUDA tensors, 9 (Hopper,
            deepkernels' target) for CPU tensors.
    Returns:
        The tensor to hand to a kernel (possibly ``sf`` itself).
    Raises:
        ValueError for a bad recipe, shape, stride or an unknown combination ("Unknown SF transformation");
        TypeError for a dtype other than float32/int32.
    """
    recipe = tuple(recipe)
    if len(recipe) == 3:
        if is_sfa is None:
            raise ValueError("is_sfa must be given with a 3-tuple recipe (it selects recipe[0] or recipe[1])")
        gran_mn, gran_k = (recipe[0] if is_sfa else recipe[1]), recipe[2]
    elif len(recipe) == 2:
        if is_sfa is not None:
            raise ValueError(f"is_sfa must be None with a 2-tuple recipe, got is_sfa={is_sfa}")
        gran_mn, gran_k = recipe
    else:
        raise ValueError(f"recipe must be a 3-tuple (gran_m, gran_n, gran_k) or 2-tuple (gran_mn, gran_k), got {recipe}")
    check_sf_layout(sf, mn, k, gran_mn, gran_k, num_groups)
    arch = _default_arch(sf) if arch_major is None else int(arch_major)
    fp32 = sf.dtype == torch.float32
    if fp32 and gran_mn == 1 and gran_k == 128 and (arch == 9 or disable_ue8m0_cast):
        return get_mn_major_tma_aligned_tensor(sf)
    if fp32 and gran_mn == 128 and gran_k == 128 and (arch == 9 or disable_ue8m0_cast):
        return check_sf_layout(sf, mn, k, gran_mn, gran_k, num_groups, sm90_sfb_check=True,
                               type_check=torch.float32)
    if fp32 and gran_k in (32, 128) and arch in (10, 12):
        if disable_ue8m0_cast:
            raise ValueError(f"disable_ue8m0_cast=True is not supported for (gran_mn, gran_k)=({gran_mn}, {gran_k}) "
                             f"on SM{arch}0")
        if gran_mn != 1:
            rows = torch.arange(mn, device=sf.device) // gran_mn
            sf = sf.index_select(-2, rows)
        return get_mn_major_tma_aligned_packed_ue8m0_tensor(sf, psum_layout)
    if not fp32 and gran_mn == 1 and gran_k in (32, 128) and arch in (10, 12):
        return check_sf_layout(sf, mn, k, gran_mn, gran_k, num_groups, tma_stride_check=True,
                               type_check=torch.int32)
    raise ValueError(f"Unknown SF transformation: sf dtype {sf.dtype}, shape {list(sf.shape)}, "
                     f"(gran_mn, gran_k)=({gran_mn}, {gran_k}), arch SM{arch}0, "
                     f"disable_ue8m0_cast={disable_ue8m0_cast}")
