"""Argument checks for public ops: every failure names the argument, what was seen and what was expected."""
from __future__ import annotations

import math
import numbers
from typing import Iterable, Sequence

import numpy as np
import torch

__all__ = ["check_tensor", "check_dtype", "check_shape", "check_compiled_dims", "overlaps", "output_aliases",
           "check_no_alias", "check_distinct_elements",
           "check_int32_extent", "check_scale", "rewrite_nonpositive_scale", "check_int", "check_int_tuple",
           "check_flag", "check_gemm_recipe", "INT32_MAX"]

INT32_MAX = 2**31 - 1


def check_tensor(name: str, t, *, ndim: int | Sequence[int] | None = None,
                 dtype: torch.dtype | Iterable[torch.dtype] | None = None) -> torch.Tensor:
    """Raise TypeError unless ``t`` is a tensor of the given rank(s) and dtype(s); return it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if ndim is not None:
        ndims = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in ndims:
            raise ValueError(f"{name} must have {' or '.join(map(str, ndims))} dims, got shape {tuple(t.shape)}")
    if dtype is not None:
        check_dtype(name, t, dtype)
    return t


def check_dtype(name: str, t: torch.Tensor, dtype) -> None:
    dtypes = (dtype,) if isinstance(dtype, torch.dtype) else tuple(dtype)
    if t.dtype not in dtypes:
        raise TypeError(f"{name} must have dtype {' or '.join(map(str, dtypes))}, got {t.dtype} "
                        f"(shape {tuple(t.shape)})")


def check_shape(name: str, t: torch.Tensor, expected: Sequence[int | None]) -> None:
    """``expected`` may hold None for 'any size' in a dim."""
    ok = t.dim() == len(expected) and all(e is None or e == s for e, s in zip(expected, t.shape))
    if not ok:
        exp = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
        raise ValueError(f"{name} must have shape {exp}, got {list(t.shape)}")


def check_compiled_dims(compiled_dims) -> None:
    """DeepGEMM's ``compiled_dims`` knob (a compile-cache hint, no effect on results): a string of 'm', 'n', 'k'."""
    if not isinstance(compiled_dims, str) or any(ch not in "mnk" for ch in compiled_dims):
        raise ValueError(f"compiled_dims must be a string of 'm', 'n', 'k', got {compiled_dims!r}")


def overlaps(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Whether the byte ranges two non-empty tensors span in one storage intersect (a conservative test: strided
    views that interleave without sharing an element also count)."""
    if x.numel() == 0 or y.numel() == 0 or x.device != y.device:
        return False
    if x.untyped_storage().data_ptr() != y.untyped_storage().data_ptr():
        return False

    def span(t):
        lo = t.data_ptr()
        return lo, lo + (sum((n - 1) * st for n, st in zip(t.shape, t.stride())) + 1) * t.element_size()
    (a0, a1), (b0, b1) = span(x), span(y)
    return a0 < b1 and b0 < a1


def output_aliases(d, inputs) -> bool:
    """Whether ``d`` overlaps one of ``inputs`` (a tuple of tensors / None) in memory. Cheap when it cannot
    (no shared storage: one storage-pointer comparison per input); the byte spans are compared only for an input
    sharing d's storage (e.g. two views of one workspace tensor), so disjoint views of one buffer stay legal."""
    try:
        ds = d.untyped_storage().data_ptr()
        return any(t is not None and t.untyped_storage().data_ptr() == ds and overlaps(d, t) for t in inputs)
    except Exception:   # unusual argument types: validation reports them
        return False


def check_no_alias(d, named_inputs: dict) -> None:
    """ValueError naming the input when the output ``d`` overlaps it: the kernels read the inputs tile by tile while
    other programs write d, so an output written over an input gives wrong values (the reference, which computes
    first and copies after, did not show it)."""
    for name, t in named_inputs.items():
        if t is not None and output_aliases(d, (t,)):
            raise ValueError(f"d (shape {list(d.shape)}, strides {list(d.stride())}) overlaps {name} (shape "
                             f"{list(t.shape)}, strides {list(t.stride())}) in memory; write the output to a separate "
                             f"buffer")


def check_distinct_elements(name: str, t: torch.Tensor) -> None:
    """Raise ValueError unless no two elements of the output ``t`` share memory (padded row / group strides are
    fine; a broadcast view such as ``x.expand(8, 128)``, a zero or too-small stride is not). Shape/stride
    arithmetic only (no data access): the kernels write every row / group independently, so rows or groups
    that alias would race, and the torch reference would reject the in-place write."""
    shape, stride = t.shape, t.stride()
    extent = 1
    for dim in range(t.dim() - 1, -1, -1):
        if shape[dim] > 1 and stride[dim] < extent:
            what = "groups" if dim == 0 and t.dim() == 3 else "rows" if dim == t.dim() - 2 else "columns" \
                if dim == t.dim() - 1 else f"entries along dim {dim}"
            raise ValueError(f"{name} (shape {list(shape)}, strides {list(stride)}) has overlapping {what}: "
                             f"stride({dim}) must be >= {extent}")
        extent = max(extent, (shape[dim] - 1) * stride[dim] + extent) if shape[dim] > 0 else extent


def check_int32_extent(what: str, value: int, why: str = "TMA coordinates are 32-bit") -> None:
    """Raise ValueError when a size the kernels index with 32-bit integers exceeds ``2^31 - 1``."""
    if value > INT32_MAX:
        raise ValueError(f"{what} = {value} exceeds 2^31 - 1 ({why}); split the call")


def check_scale(name: str, value, *, finite: bool = True) -> float:
    """A scalar scale argument (``softmax_scale``, ``sm_scale``) as a Python float.

    Accepts any real number (Python or NumPy scalar, e.g. ``np.float32``) and a one-element real tensor. Raises
    TypeError naming the argument for anything else (None, str, bool, complex, lists, bool / complex tensors) and
    ValueError for a tensor with more than one element; with ``finite`` a non-finite value is a ValueError too.
    Any finite sign is accepted: the attention ops take any finite scale (as FlashMLA does) and hand a scale <= 0
    to their kernels through :func:`rewrite_nonpositive_scale`."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(f"{name} must be a number or a one-element tensor, got a tensor of shape "
                             f"{list(value.shape)}")
        if value.dtype == torch.bool or value.is_complex():
            raise TypeError(f"{name} must be a real number, got a {value.dtype} tensor")
        v = float(value.item())
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number (float, int, NumPy scalar or one-element tensor), got "
                        f"{type(value).__name__} {value!r}")
    else:
        try:
            v = float(value)
        except OverflowError:  # e.g. 10**400 or Fraction(10**400): beyond the float range, so not finite
            raise ValueError(f"{name} must be finite (within the float range), got a {type(value).__name__} of "
                             f"magnitude about 2^{_magnitude_bits(value)}") from None
    if finite and not math.isfinite(v):
        raise ValueError(f"{name} must be finite, got {value}")
    return v


def _magnitude_bits(value) -> int:
    """log2 of ``|value|`` rounded down, for a number too large to print or convert (``str`` of a Python int
    over 4300 digits raises)."""
    try:
        return int(abs(value)).bit_length() - 1
    except Exception:  # pragma: no cover
        return 1024


def check_int(name: str, value, *, min_value: int | None = None, exc: type = TypeError) -> int:
    """An integer argument as a Python int: any ``numbers.Integral`` (Python int, NumPy integer scalar), not bool
    (nor float, str, None: no silent truncation). Raises ``exc`` (default TypeError) naming the argument for a
    non-integer and ValueError for a value below ``min_value``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise exc(f"{name} must be an int, got {type(value).__name__} {value!r}")
    v = int(value)
    if min_value is not None and v < min_value:
        raise ValueError(f"{name} must be >= {min_value}, got {v}")
    return v


def check_flag(name: str, value) -> bool:
    """A boolean argument (``causal``, ...) as a Python bool, as upstream's pybind ``bool`` conversion takes it: a
    bool, a NumPy bool, a real number (its truth value) or None (False). Anything else is a TypeError naming the
    argument: a str above all (``causal="False"`` would be truthy, silently the opposite of what was asked), bytes,
    containers and tensors."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    if isinstance(value, (np.bool_, numbers.Real)):
        return bool(value)
    raise TypeError(f"{name} must be a bool, got {type(value).__name__} {value!r}")


def check_int_tuple(name: str, value, length: int) -> tuple[int, ...]:
    """A tuple / list of ``length`` integers (``numbers.Integral``, not bool or float) as a tuple of Python ints.
    TypeError naming the argument for another type or a non-integer entry, ValueError for a wrong length."""
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of {length} ints, got {type(value).__name__} {value!r}")
    if len(value) != length:
        raise ValueError(f"{name} must be a tuple of {length} ints, got {len(value)} entries: {tuple(value)!r}")
    for v in value:
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise TypeError(f"{name} must be a tuple of {length} ints, got {type(v).__name__} {v!r} in "
                            f"{tuple(value)!r}")
    return tuple(int(v) for v in value)


def check_gemm_recipe(recipe, recipe_a, recipe_b, supported: Sequence[tuple[int, int, int]],
                      what: str) -> tuple[int, int, int] | None:
    """DeepGEMM's FP8 scale-granularity arguments (docs/spec/gemm.md §1.1) as one ``(gran_m, gran_n, gran_k)``.

    ``recipe`` is a 3-tuple; ``recipe_a`` / ``recipe_b`` are ``(gran_mn, gran_k)`` per operand, given together,
    and map to ``(recipe_a[0], recipe_b[0], gran_k)`` (both must share gran_k): ``(1, 128)`` + ``(128, 128)`` is
    ``(1, 128, 128)``, ``(1, 128)`` + ``(1, 128)`` is ``(1, 1, 128)``. At most one of the two spellings may be
    set. Returns None when neither is (the op's default), else the recipe, which must be in ``supported`` (the
    same rule for both spellings). TypeError / ValueError naming the argument(s) and showing the value(s)."""
    if recipe is not None and (recipe_a is not None or recipe_b is not None):
        raise ValueError(f"pass either recipe or recipe_a + recipe_b, not both; got recipe={recipe!r}, "
                         f"recipe_a={recipe_a!r}, recipe_b={recipe_b!r}")
    if (recipe_a is None) != (recipe_b is None):
        raise ValueError(f"recipe_a and recipe_b must be given together; got recipe_a={recipe_a!r}, "
                         f"recipe_b={recipe_b!r}")
    if recipe is not None:
        r = check_int_tuple("recipe", recipe, 3)
        if r not in supported:
            raise ValueError(f"{what} support recipe {' or '.join(map(str, supported))} on SM90, got recipe={r}")
        return r
    if recipe_a is None:
        return None
    ra = check_int_tuple("recipe_a", recipe_a, 2)
    rb = check_int_tuple("recipe_b", recipe_b, 2)
    r = (ra[0], rb[0], ra[1])
    if ra[1] != rb[1] or r not in supported:
        ok = " or ".join(f"recipe_a={(s[0], s[2])} + recipe_b={(s[1], s[2])} (recipe {s})" for s in supported)
        raise ValueError(f"{what} support {ok} on SM90, got recipe_a={ra}, recipe_b={rb}")
    return r


def rewrite_nonpositive_scale(q: torch.Tensor, scale: float):
    """Exact rewrite of a softmax scale <= 0 for the attention kernels (dense / sparse decode, sparse / dense
    prefill), which keep the running max in raw-score units (``q·k``; valid only for a positive scale):
    ``softmax(scale·q·k) = softmax(|scale|·(-q)·k)`` for scale < 0 (negation is exact, so every logit
    ``(-q)·k·|scale|`` equals ``q·k·scale`` and the natural-log ``lse`` / ``max_logits`` a kernel derives from its
    max keep their meaning), and scale 0 (or -0.0) is ``softmax(1·(0·q)·k)``: every logit 0 (``q * 0`` keeps q's
    NaN/inf -> NaN, like the definition). Returns ``(q, scale, unchanged)``; one elementwise op on q (no host sync),
    only for scale <= 0. The reference paths need no rewrite: they apply the scale as written."""
    if scale > 0:
        return q, scale, True
    if scale < 0:
        return q.neg(), -scale, False
    return q * 0, 1.0, False
