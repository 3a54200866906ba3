"""FP8 and BF16 dense GEMMs (DeepGEMM ``fp8_gemm_{nt,nn,tn,tt}``, ``bf16_gemm_{nt,nn,tn,tt}``) and the
``set_num_sms`` / ``get_num_sms`` runtime knobs.

Semantics (docs/spec/gemm.md §1.1-1.4, §7): ``D = C + op(A) @ op(B)`` written in place into ``d``; the functions
return None. ``nn/tn/tt`` are transposed views onto the NT core (for FP8 the scale tensor is transposed
together with its data). CUDA tensors run the Triton kernels of ``_fp8_kernels.py`` / ``_bf16_kernels.py``;
CPU tensors run :mod:`deepkernels.reference.gemm` (or the kernels under ``TRITON_INTERPRET=1``).

Documented superset of upstream SM90 (which asserts instead): FP8 operands may be MN-major (copied to
K-major first, one extra pass); the FP8 recipes may be combined with either output dtype and with or
without ``c``; N need not be a multiple of 8; an odd ``set_num_sms`` value is accepted.
"""
from __future__ import annotations

import os

import torch

from .._backend import ensure_tma_allocator, gluon_disabled, interpret_mode, use_kernels
from .._launch import KernelLauncher
from .._validate import (check_compiled_dims, check_distinct_elements, check_gemm_recipe, check_int32_extent,
                         check_tensor, overlaps, check_no_alias, output_aliases)
from ..quant.fp8 import ceil_div
from ..reference import gemm as _ref
from ._bf16_kernels import _bf16_gemm_nt_kernel
from ._configs import GemmConfig, select_bf16_config, select_fp8_config
from ._fp8_kernels import _fp8_gemm_nt_kernel, _fp8_gemm_nt_ws_kernel, _gemm_splitk_reduce_kernel

__all__ = [
    "fp8_gemm_nt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt",
    "fp8_fp4_gemm_nt", "fp8_fp4_gemm_nn", "fp8_fp4_gemm_tn", "fp8_fp4_gemm_tt",
    "bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt",
    "set_num_sms", "get_num_sms", "set_tc_util", "get_tc_util", "set_pdl", "get_pdl", "set_ignore_compile_dims",
    "set_block_size_multiple_of",
]

_NUM_SMS = 0  # 0: use the device's SM count


_SM_COUNT: dict = {}


def _device_sm_count() -> int | None:
    if not torch.cuda.is_available():
        return None
    dev = torch.cuda.current_device()
    if dev not in _SM_COUNT:
        _SM_COUNT[dev] = torch.cuda.get_device_properties(dev).multi_processor_count
    return _SM_COUNT[dev]


def _check_num_sms(num_sms, cap: int | None = None) -> None:
    """Validation shared by :func:`set_num_sms` and ``set_mla_num_sms``: TypeError unless an int (bool is not),
    ValueError outside ``[0, cap]``; ``cap`` None: the device SM count (1024 without CUDA)."""
    if isinstance(num_sms, bool) or not isinstance(num_sms, int):
        raise TypeError(f"num_sms must be an int, got {type(num_sms).__name__} {num_sms!r}")
    if cap is not None:
        if not 0 <= num_sms <= cap:
            raise ValueError(f"num_sms must be in [0, {cap}] (0 restores the default), got {num_sms}")
        return
    count = _device_sm_count()
    if count is None:
        if not 0 <= num_sms <= 1024:
            raise ValueError(f"num_sms must be in [0, 1024] (no CUDA device here, so 1024 is the cap; 0 restores "
                             f"the default), got {num_sms}")
    elif not 0 <= num_sms <= count:
        raise ValueError(f"num_sms must be in [0, {count}] (the device SM count; 0 restores it), got {num_sms}")


def set_num_sms(num_sms: int) -> None:
    """Limit the persistent GEMM grids to ``num_sms`` SMs (DeepGEMM ``set_num_sms``).

    ``0 <= num_sms <= device SM count`` (on a machine without CUDA: ``<= 1024``); 0 restores the default (the
    device count; 132 without CUDA, see :func:`get_num_sms`).
    Raises TypeError for a non-integer (bool included), ValueError for an out-of-range value.
    """
    global _NUM_SMS
    _check_num_sms(num_sms)
    _NUM_SMS = num_sms


def get_num_sms() -> int:
    """SMs the GEMMs use: the ``set_num_sms`` value, else the device SM count (132 on H200; 132 without CUDA)."""
    return _NUM_SMS or _device_sm_count() or 132


# DeepGEMM's other runtime knobs (docs/spec/gemm.md §7), validated as upstream. None changes a result; none changes
# what these kernels do today: tc_util has no SM90 effect upstream either, the kernels launch without PDL, no
# dimension is baked into a kernel (Triton specialises on its own), and block sizes come from the measured tables.
_KNOBS = {"tc_util": 100, "pdl": False, "ignore_compile_dims": False, "block_size_multiple_of": (1, 1)}


def set_tc_util(tc_util: int) -> None:
    """DeepGEMM ``set_tc_util``: tensor-core utilisation target in percent, ``0 <= tc_util <= 100`` (0 means 100).
    Recorded only (no SM90 effect, as upstream). Raises TypeError / ValueError."""
    if isinstance(tc_util, bool) or not isinstance(tc_util, int):
        raise TypeError(f"tc_util must be an int, got {type(tc_util).__name__}")
    if not 0 <= tc_util <= 100:
        raise ValueError(f"tc_util must be in [0, 100], got {tc_util}")
    _KNOBS["tc_util"] = tc_util or 100


def get_tc_util() -> int:
    """The ``set_tc_util`` value (default 100)."""
    return _KNOBS["tc_util"]


def set_pdl(enable_pdl: bool) -> None:
    """DeepGEMM ``set_pdl`` (programmatic dependent launch). Recorded only: these kernels launch without PDL."""
    if not isinstance(enable_pdl, bool):
        raise TypeError(f"enable_pdl must be a bool, got {type(enable_pdl).__name__}")
    _KNOBS["pdl"] = enable_pdl


def get_pdl() -> bool:
    """The ``set_pdl`` value (default False)."""
    return _KNOBS["pdl"]


def set_ignore_compile_dims(ignore: bool) -> None:
    """DeepGEMM ``set_ignore_compile_dims``: treat every M/N/K as a runtime value. Recorded only: these kernels
    never bake ``compiled_dims`` into a kernel."""
    if not isinstance(ignore, bool):
        raise TypeError(f"ignore must be a bool, got {type(ignore).__name__}")
    _KNOBS["ignore_compile_dims"] = ignore


def set_block_size_multiple_of(x) -> None:
    """DeepGEMM ``set_block_size_multiple_of(x or (x_m, x_n))``: positive ints. Recorded only: block sizes come
    from the measured config tables (``gemm/_configs.py``)."""
    pair = tuple(x) if isinstance(x, (tuple, list)) else (x, x)
    if len(pair) != 2 or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0 for v in pair):
        raise ValueError(f"block_size_multiple_of must be a positive int or a pair of them, got {x!r}")
    _KNOBS["block_size_multiple_of"] = pair


# --------------------------------------------------------------------------------------------- validation
def _check_out(d, c, m: int, n: int, dtypes) -> None:
    check_tensor("d", d, ndim=2, dtype=dtypes)
    if tuple(d.shape) != (m, n):
        raise ValueError(f"d must have shape [{m}, {n}] (M = a rows, N = b rows), got {list(d.shape)}")
    if n > 1 and d.stride(1) != 1:
        raise ValueError(f"d must be row-major (stride(-1) == 1), got strides {list(d.stride())}")
    # an output whose rows alias (e.g. ``torch.zeros(1, N).expand(M, N)``) would be written by several tiles at
    # once (the kernels: last writer wins; the reference: torch's in-place error) -- the grouped GEMMs' check.
    # c is only read (copied into d first, or read by the reference), so a broadcast c stays allowed.
    check_distinct_elements("d", d)
    if c is None:
        return
    check_tensor("c", c, ndim=2, dtype=d.dtype)
    if tuple(c.shape) != (m, n):
        raise ValueError(f"c must have shape [{m}, {n}] like d, got {list(c.shape)}")
    if n > 1 and c.stride(1) != 1:
        raise ValueError(f"c must be row-major (stride(-1) == 1), got strides {list(c.stride())}")
    if c.data_ptr() == d.data_ptr() and c is not d and (c.shape != d.shape or c.stride() != d.stride()):
        raise ValueError("c shares d's storage but has different sizes/strides; pass c=d for in-place accumulation")
    if c.data_ptr() != d.data_ptr() and overlaps(c, d):
        raise ValueError(f"c (shape {list(c.shape)}, strides {list(c.stride())}) and d (shape {list(d.shape)}, "
                         f"strides {list(d.stride())}) overlap in memory without being the same view; pass c=d for "
                         f"in-place accumulation or separate buffers")



def _check_extents(m: int, n: int, k: int) -> None:
    """M, N and K must each fit the kernels' 32-bit TMA coordinates and tile indices (``< 2^31``); M·N (and
    every row x stride product) may exceed 2^31: D offsets are computed in int64. Checked from shapes only,
    before any allocation or launch, on every backend (the reference would otherwise try to allocate it)."""
    for what, v in (("M (rows of a and d)", m), ("N (rows of b, columns of d)", n), ("K", k)):
        check_int32_extent(what, v, "TMA coordinates and tile indices are 32-bit")


def _k_major(name: str, t: torch.Tensor, allow_mn_major: bool) -> tuple[torch.Tensor, bool]:
    """Return (tensor, is_k_major). K-major: stride(-1) == 1; MN-major: stride(-2) == 1."""
    rows, cols = t.shape
    if t.stride(1) == 1 or cols == 1:
        return t, True
    if t.stride(0) == 1 or rows == 1:
        if allow_mn_major:
            return t, False
        return t.contiguous(), True
    raise ValueError(f"{name} must be K-major (stride(-1) == 1) or MN-major (stride(-2) == 1), "
                     f"got shape {list(t.shape)} strides {list(t.stride())}")


def _row_stride(name: str, t: torch.Tensor, k_major: bool, inner: int) -> int:
    """Row stride of the underlying row-major storage, checked for TMA (16-byte aligned rows and base)."""
    esz = t.element_size()
    outer = t.shape[0] if k_major else t.shape[1]
    stride = t.stride(0) if k_major else t.stride(1)
    if outer <= 1:
        stride = ceil_div(inner * esz, 16) * 16 // esz  # a single row: any 16-B aligned stride will do
    if (stride * esz) % 16 != 0:
        raise ValueError(f"{name} (shape {list(t.shape)}, strides {list(t.stride())}) needs 16-byte aligned rows for "
                         f"TMA: its row stride ({stride} elements of {esz} B) must be a multiple of {16 // esz}")
    if t.data_ptr() % 16 != 0:
        raise ValueError(f"{name} must start at a 16-byte aligned address (got a view with offset)")
    return stride


def _normalise_sf(name: str, sf, mn: int, k: int, gran_mn: int) -> tuple[torch.Tensor, bool]:
    """Validate scales (shape ``[ceil(mn/gran_mn), ceil(k/128)]``, :func:`deepkernels.quant.check_sf_layout`).

    FP32 scales are returned as they are: the kernels read them through their strides, so any layout (row-major,
    MN-major TMA-aligned, sliced) works without the copy upstream makes. Packed UE8M0 int32 scales are unpacked
    to FP32 (always per row). Returns (sf, per_row)."""
    from ..quant import check_sf_layout, unpack_ue8m0_from_int

    check_tensor(name, sf, ndim=2, dtype=(torch.float32, torch.int32))
    if sf.dtype == torch.int32:  # packed UE8M0 (SM100 format): always per row
        check_sf_layout(sf, mn, k, 1, 128, name=name)
        return unpack_ue8m0_from_int(sf)[:, :ceil_div(k, 128)], True
    check_sf_layout(sf, mn, k, gran_mn, 128, name=name)
    return sf, gran_mn == 1


def _check_fp8_pair(name: str, x) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise TypeError(f"{name} must be a (data, scale) pair of tensors, got {type(x).__name__}")
    data, sf = x
    check_tensor(f"{name}[0]", data, ndim=2, dtype=torch.float8_e4m3fn)
    check_tensor(f"{name}[1]", sf, ndim=2, dtype=(torch.float32, torch.int32))
    return data, sf


def _early_exit(d: torch.Tensor, c, m: int, n: int, k: int) -> bool:
    if m == 0 or n == 0:
        return True
    if k == 0:
        if c is None:
            d.zero_()
        elif c.data_ptr() != d.data_ptr():
            d.copy_(c)
        return True
    return False


# --------------------------------------------------------------------------------------------- launch plans
# Host fast path: a call whose *signature* (dtype, shape, strides, device and 16-B alignment of every tensor, the
# c/d aliasing facts, recipe, compiled_dims, config override, set_num_sms value, interpreter flag) equals one
# that already passed validation gets the cached plan: every check is a function of that signature, so its
# verdict is reused (no check is skipped for an input that would fail it), and the plan launches the compiled
# kernel directly (deepkernels._launch.KernelLauncher). Calls that needed a copy (MN-major FP8, packed UE8M0
# scales) or that launch nothing are never cached and take the full path every time.
_PLAN_LIMIT = 4096
_FP8_PLANS: dict = {}
_BF16_PLANS: dict = {}
_T = torch.Tensor
_ENV = os.environ
_RUNTIME = None


def _interp() -> bool:
    global _RUNTIME
    if _RUNTIME is None:
        try:
            from triton import knobs
            _RUNTIME = knobs.runtime
        except Exception:  # pragma: no cover
            return interpret_mode()
    return bool(_RUNTIME.interpret)


def _tsig(t: torch.Tensor) -> tuple:
    return (t.dtype, t.shape, t.stride(), t.device, t.data_ptr() & 15)


def _c_sig(c, d):
    if c is None:
        return None
    if type(c) is not _T:
        raise TypeError  # unusual argument: full path
    if c is not d and c.untyped_storage().data_ptr() == d.untyped_storage().data_ptr():
        raise TypeError  # c in d's storage but not d itself: the full path checks the overlap every time
    return (_tsig(c), c is d, c.data_ptr() == d.data_ptr())


def _recipe_sig(r):
    """A recipe argument for a plan signature: None, or a tuple of exact ints. Anything else (floats, bools, NumPy
    ints, which compare and hash equal to ints) raises TypeError, so the call takes the full (validating) path:
    ``(True, 128, 128)`` must never hit the plan of ``(1, 128, 128)``."""
    if r is None:
        return None
    t = tuple(r)
    for x in t:
        if type(x) is not int:
            raise TypeError
    return t


_FP8_RECIPES = ((1, 128, 128), (1, 1, 128))


def _fp8_sig(a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims, cfg):
    """Hashable signature of an FP8 call, or None when it has unusual argument types (full path)."""
    try:
        if type(a) not in (tuple, list) or type(b) not in (tuple, list) or len(a) != 2 or len(b) != 2:
            return None
        ad, sa = a
        bd, sb = b
        if type(ad) is not _T or type(sa) is not _T or type(bd) is not _T or type(sb) is not _T or type(d) is not _T:
            return None
        recipes = None if recipe is None and recipe_a is None and recipe_b is None else \
            (_recipe_sig(recipe), _recipe_sig(recipe_a), _recipe_sig(recipe_b))
        if output_aliases(d, (ad, sa, bd, sb)):
            return None      # d over an input: the full path raises (a plan must never be reused for it)
        return (_tsig(ad), _tsig(sa), _tsig(bd), _tsig(sb), _tsig(d), _c_sig(c, d),
                recipes, compiled_dims, cfg, _NUM_SMS, _interp())
    except Exception:
        return None


def _bf16_sig(a, b, d, c, compiled_dims, cfg):
    try:
        if type(a) is not _T or type(b) is not _T or type(d) is not _T or output_aliases(d, (a, b)):
            return None
        return (_tsig(a), _tsig(b), _tsig(d), _c_sig(c, d), compiled_dims, cfg, _NUM_SMS, _interp())
    except Exception:
        return None


def _store_plan(cache: dict, sig, plan) -> None:
    if sig is None:
        return
    try:
        if len(cache) >= _PLAN_LIMIT:
            cache.clear()
        cache[sig] = plan
    except TypeError:  # unhashable piece (e.g. compiled_dims given as a list): no caching
        pass


def _lookup(cache: dict, sig):
    if sig is None or _ENV.get("DEEPKERNELS_FORCE_REFERENCE", "0") not in ("", "0"):
        return None
    try:
        return cache.get(sig)
    except TypeError:
        return None


def _grid(m: int, n: int, cfg: GemmConfig) -> tuple[int, int]:
    tiles = ceil_div(m, cfg.block_m) * ceil_div(n, cfg.block_n) * cfg.split_k
    # the kernels count tiles in 32-bit (tile ids, grid axis 0): reachable only near M·N ~ 2^44 outputs
    check_int32_extent(f"the tile count ceil(M/{cfg.block_m}) * ceil(N/{cfg.block_n}) * split_k", tiles,
                       "tile ids are 32-bit")
    if cfg.progs_per_sm == 0:  # not persistent: one program per tile
        return tiles, tiles
    return tiles, max(1, min(tiles, get_num_sms() * cfg.progs_per_sm))


_REDUCE_LAUNCHERS: dict = {}


def _splitk_finish(ws: torch.Tensor, d: torch.Tensor, accumulate: bool, split_k: int) -> None:
    m, n = d.shape
    block = 1024
    key = (split_k, accumulate, d.dtype, spec := (m * n, n, d.stride(0)), d.data_ptr() & 15)
    launcher = _REDUCE_LAUNCHERS.get(key)
    if launcher is None:
        if len(_REDUCE_LAUNCHERS) >= _PLAN_LIMIT:
            _REDUCE_LAUNCHERS.clear()
        launcher = _REDUCE_LAUNCHERS[key] = KernelLauncher(
            _gemm_splitk_reduce_kernel, dict(SPLIT_K=split_k, ACCUMULATE=accumulate, BLOCK=block, num_warps=4))
    launcher((ceil_div(m * n, block),), ws, d, *spec)


class _Plan:
    """One validated call signature: launch arguments fixed except the tensors."""

    __slots__ = ("launcher", "grid", "ints", "copy_c", "split_k", "ws_shape", "accumulate", "ws_kernel")

    def __call__(self, a, sfa, b, sfb, d, c) -> None:
        if self.copy_c:
            d.copy_(c)
        if self.ws_kernel:
            self.launcher(self.grid, a, b, d, sfa, sfb, *self.ints)
            return
        ws = d if self.split_k == 1 else torch.empty(self.ws_shape, dtype=torch.float32, device=d.device)
        self.launcher(self.grid, a, b, d, sfa, sfb, ws, *self.ints)
        if self.split_k > 1:
            _splitk_finish(ws, d, self.accumulate, self.split_k)


class _GluonPlan:
    """Large-M 1D2D calls on the Gluon warp-specialised kernel (gemm/_gluon_fp8.py). One plan per call signature:
    the first call goes through the checked launcher and binds a KernelLauncher; later calls build the two TMA
    descriptors and call the compiled kernel directly (``_go_dense``: no re-checks, no argument binding)."""

    __slots__ = ("config", "launcher", "go")

    def __call__(self, a, sfa, b, sfb, d, c) -> None:
        go = getattr(self, "go", None)
        if go is not None:
            go(a, sfa, b, sfb, d, self.config, get_num_sms(), self.launcher)
            return
        from . import _gluon_fp8 as G

        self.launcher = None
        if self.config.warp_spec:
            self.launcher = KernelLauncher(G._fp8_gluon_ws_kernel, G.ws_meta(self.config), cache_descriptors=True)
        G._launch_fp8_gluon(a, sfa, b, sfb, d, config=self.config, num_sms=get_num_sms(), launcher=self.launcher)
        if d.shape[0] and d.shape[1] and a.shape[1]:     # a plan only exists for non-empty work; belt and braces
            self.go = G._go_dense


class _SmallPlan:
    """M <= 128 calls on the small-M Gluon kernel (gemm/_gluon_fp8_small.py), one plan per call signature like
    :class:`_GluonPlan`: the first call runs the small-M launcher's input checks and builds a
    ``_gluon_fp8_small.SmallPlan`` (geometry, launch integers and a KernelLauncher with the descriptor cache fixed
    for the signature; its first launch binds the compiled kernel through ``kernel[grid]``); later calls go straight
    to it (two TMA descriptors, the split-K workspace when K is split, the compiled kernel, the reduce kernel in
    ``reduce`` mode): the same host work as the Triton :class:`_Plan` (one launcher call + a workspace and the
    reduce launch when K is split) plus two Python descriptor objects."""

    __slots__ = ("config", "small")

    def __call__(self, a, sfa, b, sfb, d, c) -> None:
        small = getattr(self, "small", None)
        if small is None:
            from . import _gluon_fp8_small as S
            small = S.SmallPlan.checked(a, sfa, b, sfb, d, self.config, get_num_sms())
            if small is None:     # a plan only exists for non-empty work; belt and braces
                return
            self.small = small
        small(a, sfa, b, sfb, d)


def _use_small(m: int, n: int, k: int, d, c, sfb_per_row: bool):
    """The small-M Gluon kernel's config for this call, or None (Triton table / rule). BF16 out, no C, 128x128 weight
    scales (the kernel's only recipe), M <= 128: the (M class, N, K) rows of ``_gluon_fp8_small.SMALL_FP8_TABLE``,
    elsewhere ``_gluon_fp8_small.rule_config`` (Triton would not split K and ceil(N / 64) <= SMs; measured faster
    at 24 of 24 such sweep shapes, bit-identical; ``DEEPKERNELS_GEMM_SMALL_RULE=0`` keeps the table only);
    ``DEEPKERNELS_DISABLE_GLUON=gemm_small`` (or ``gemm``, or ``1``) keeps the
    Triton path, as do ``TRITON_INTERPRET`` and non-CUDA tensors.

    Rule (session 20, H200, git 34ef2f5, benchmarks/results/gemm_small-h200-2026-11-30-s20.json, notes
    benchmarks/notes/gemm_small.md): the small-M kernel's variants vs the dispatched Triton table config at the 12
    issue-#3 shapes (M 64 / 128 x the six DeepSeek-V3 (N, K)), CUDA-graph replay with L2 flush, 5 rotated rounds,
    median of the paired per-round ratios t / t_dispatched (A/A 0.991-1.006). Best variant per shape: M 64: (2112,
    7168) auto_reduce 0.976, (24576, 1536) sa1 1.013, (32768, 512) none < 1.04, (7168, 16384) auto_reduce 1.029,
    (4096, 7168) alt 0.976, (7168, 2048) auto 0.904; M 128: (2112, 7168) auto_reduce 0.962, (24576, 1536) sa1 0.922,
    (32768, 512) none < 1.10, (7168, 16384) auto_reduce 0.950, (4096, 7168) auto_reduce 0.971, (7168, 2048) sa1
    0.872. Dispatched where the win is >= 3 % (ratio <= 0.97): the five table rows; the 2.4-2.9 % wins are within
    reach of the A/A spread and stay on Triton. (That run's whole-call ratios, 1.3-3.2x worse, timed the unplanned
    ``launch_fp8_gemm_small`` host path; the plan removes it.) Every row keeps the Triton table's split-K and the per-K-block
    promotion order, so D is expected bit-identical to the Triton path (the first run found it for all five configs
    at M 64 / 128; tests/test_gemm_small_dispatch.py gates on calc_diff < 1e-6 and reports bit identity). The configs
    were measured at 132 SMs; ``set_num_sms`` only caps their persistent grid."""
    if m > 128 or sfb_per_row or c is not None or d.dtype != torch.bfloat16 or not d.is_cuda:
        return None
    from ._configs import m_class
    from ._gluon_fp8_small import SMALL_FP8_TABLE

    cfg = SMALL_FP8_TABLE.get((m_class(m), n, k))
    if cfg is None:
        # the rule outside the table (session 20 sweep; on by default): _gluon_fp8_small.rule_config
        from . import _gluon_fp8_small as _S
        if _S.rule_enabled():
            cfg = _S.rule_config(m, n, k, get_num_sms())
    if cfg is None or interpret_mode() or gluon_disabled("gemm_small") or gluon_disabled("gemm"):
        return None
    from . import _gluon_fp8_small

    return cfg if _gluon_fp8_small.available() else None


def _use_gluon(m: int, n: int, k: int, d, c, sfb_per_row: bool):
    """The Gluon kernel's config for this call, or None (Triton table). Only BF16 out, no C, 128x128 weight scales.

    Today's rule (session 15, H200, git a5eb39723349, results/gemm_gluon_epi-h200-2026-11-29-s15.json: M 1024 / 2048
    / 4096 x the six DeepSeek-V3 (N, K), whole-call us): the warp-specialised 128x128 Gluon kernel with the
    TMA-store epilogue (``GLUON_WS_128_S4_EPI``: the tile goes registers -> shared -> TMA store, waited for only
    before the next tile's epilogue) was the fastest of the Triton table, the register-epilogue Gluon configs S4/S6
    and the TMA-store S6 config at 13 of 18 shapes and within 1.7 % of TMA-store S6 at the other 5; vs the Triton
    table 1.18-1.80x (e.g. M 1024: (32768, 512) 47 vs 76 us, (24576, 1536) 80 vs 117, (7168, 2048) 38 vs 46,
    (7168, 16384) 257 vs 304; M 4096: (32768, 512) 161 vs 290, (7168, 16384) 977 vs 1191). (That run's cuBLAS
    column timed ``_scaled_mm`` plus a copy into D, 10-120 us at M 4096: its "vs cuBLAS" ratios are not comparable
    and the script no longer copies.) The session's closing ``deepkernels bench`` (git 13766f45741b, results/
    h200-2026-11-29-s15.json) against cuBLAS blockwise in the same process, M 4096: 0.82-1.07x (K 512 1.07, K 1536
    0.97, K 2048 0.96, K >= 7168 0.82-0.87), before this dispatch 0.68-0.89x. So: M >= 1024 (smaller M not
    measured; M <= 128 has its own table configs), any K.
    A D that TMA cannot address (``_gluon_fp8.d_tma_ok``: row stride or base not 16-byte aligned -- part of the
    cached plan's signature) gets the register-epilogue config where that one beat the Triton table (K >= 7168,
    results/gemm_gluon-h200-2026-11-29.json: S4 for N <= 2112, S6 above) and the Triton table elsewhere.
    Session 19 (scales two blocks ahead of their wgmma, bit-identical; paired rotated rounds with an A/A control, H200):
    first run (git 3a72eb4f3309, results/gemm_sa-h200-2026-11-30-s19.json), ``GLUON_WS_128_S4_EPI_SA1`` / S4 EPI at
    M 4096: (7168, 16384) 0.923, (4096, 7168) 0.946, (2112, 7168) 0.946, K <= 2048 0.98-1.02; M 2048 K >= 7168
    0.942 / 0.949 but (2112, 7168) 1.138 (272 tiles, ~2 waves; A/A 1.023). Second run (git 8c8709d35356,
    results/gemm_sa-h200-2026-11-30-s19b.json, A/A 0.983-1.023), M 4096, the 6-stage twin ``GLUON_WS_128_S6_EPI_SA1``:
    0.945 / 0.904 / 0.941 at K >= 7168 (N 7168 / 4096 / 2112), 0.948 at (24576, 1536), 0.953 at (7168, 2048), 0.991
    at (32768, 512); S4 SA1 0.930 / 0.926 / 0.952 / 0.976 / 0.978 / 1.014. So: S6 SA1 at M >= 2048 (SA measured at
    2048 and 4096 only), K >= 1536 and >= 3 waves of 128 x 128 tiles (``3 * get_num_sms()``); the rest S4 EPI."""
    if m < 1024 or sfb_per_row or c is not None or d.dtype != torch.bfloat16 or not d.is_cuda:
        return None
    if interpret_mode() or gluon_disabled("gemm"):
        return None
    from . import _gluon_fp8

    if not _gluon_fp8.available():
        return None
    if _gluon_fp8.d_tma_ok(d):
        tiles = -(-m // 128) * -(-n // 128)
        if m >= 2048 and k >= 1536 and tiles >= 3 * get_num_sms():
            return _gluon_fp8.GLUON_WS_128_S6_EPI_SA1
        return _gluon_fp8.GLUON_WS_128_S4_EPI
    if k < 7168:
        return None
    return _gluon_fp8.GLUON_WS_128_S4 if n <= 2112 else _gluon_fp8.GLUON_WS_128_S6


def _fp8_plan(a, sfa, b, sfb, d, c, sfb_per_row: bool, cfg: GemmConfig | None) -> _Plan:
    m, k = a.shape
    n = b.shape[0]
    if cfg is None:
        gcfg = _use_gluon(m, n, k, d, c, sfb_per_row)
        if gcfg is not None:
            gplan = _GluonPlan()
            gplan.config = gcfg
            return gplan
        scfg = _use_small(m, n, k, d, c, sfb_per_row)
        if scfg is not None:
            splan = _SmallPlan()
            splan.config = scfg
            return splan
    cfg = cfg or select_fp8_config(m, n, k, get_num_sms())
    ensure_tma_allocator()
    accumulate = c is not None
    stride_am = _row_stride("a[0]", a, True, k)
    stride_bn = _row_stride("b[0]", b, True, k)
    _, grid = _grid(m, n, cfg)
    plan = _Plan()
    plan.grid = (grid,)
    plan.copy_c = accumulate and c is not d and c.data_ptr() != d.data_ptr()
    plan.accumulate = accumulate
    plan.split_k = cfg.split_k
    plan.ws_shape = (cfg.split_k, m, n)
    ints = (m, n, k, stride_am, stride_bn, d.stride(0), sfa.stride(0), sfa.stride(1), sfb.stride(0), sfb.stride(1),
            grid)
    # the warp-specialised kernel covers 128x128 weight scales and per-row scales, no split-K / TMA store, and no
    # C accumulation: Triton 3.6 autoWS gives both consumer warpgroups the *whole* tile when BLOCK_M = 64 (checked
    # in TTGIR), so both would read-add-store D. ws configs are experimental (not swept; see _configs.py).
    plan.ws_kernel = cfg.warp_spec and cfg.split_k == 1 and (sfb_per_row or cfg.block_n <= 128) and not accumulate
    if plan.ws_kernel:
        plan.launcher = KernelLauncher(_fp8_gemm_nt_ws_kernel, dict(
            SFB_PER_ROW=sfb_per_row, ACCUMULATE=accumulate, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=128,
            GROUP_M=cfg.group_m, NUM_STAGES=cfg.num_stages, num_warps=4, num_stages=cfg.num_stages))
    else:
        tma_store = cfg.tma_store and cfg.split_k == 1 and (d.stride(0) * d.element_size()) % 16 == 0 \
            and d.data_ptr() % 16 == 0
        plan.launcher = KernelLauncher(_fp8_gemm_nt_kernel, dict(
            SFB_PER_ROW=sfb_per_row, ACCUMULATE=accumulate, SPLIT_K=cfg.split_k, TMA_STORE=tma_store,
            BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=128, GROUP_M=cfg.group_m, NUM_STAGES=cfg.num_stages,
            FLATTEN=cfg.flatten, num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    plan.ints = ints
    return plan


class _Bf16Plan(_Plan):
    __slots__ = ()

    def __call__(self, a, b, d, c) -> None:
        if self.copy_c:
            d.copy_(c)
        ws = d if self.split_k == 1 else torch.empty(self.ws_shape, dtype=torch.float32, device=d.device)
        self.launcher(self.grid, a, b, d, ws, *self.ints)
        if self.split_k > 1:
            _splitk_finish(ws, d, self.accumulate, self.split_k)


def _bf16_plan(a, a_kmajor, b, b_kmajor, d, c, cfg: GemmConfig | None) -> _Bf16Plan:
    m, k = a.shape
    n = b.shape[0]
    cfg = cfg or select_bf16_config(m, n, k, get_num_sms())
    ensure_tma_allocator()
    accumulate = c is not None
    stride_a = _row_stride("a", a, a_kmajor, k if a_kmajor else m)
    stride_b = _row_stride("b", b, b_kmajor, k if b_kmajor else n)
    _, grid = _grid(m, n, cfg)
    plan = _Bf16Plan()
    plan.grid = (grid,)
    plan.copy_c = accumulate and c is not d and c.data_ptr() != d.data_ptr()
    plan.accumulate = accumulate
    plan.split_k = cfg.split_k
    plan.ws_shape = (cfg.split_k, m, n)
    plan.ws_kernel = False
    plan.ints = (m, n, k, stride_a, stride_b, d.stride(0), grid)
    plan.launcher = KernelLauncher(_bf16_gemm_nt_kernel, dict(
        A_KMAJOR=a_kmajor, B_KMAJOR=b_kmajor, ACCUMULATE=accumulate, SPLIT_K=cfg.split_k,
        UPCAST=interpret_mode(), BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k,
        GROUP_M=cfg.group_m, NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    return plan


# --------------------------------------------------------------------------------------------- public ops
def fp8_gemm_nt(a, b, d: torch.Tensor, c: torch.Tensor | None = None, recipe=None, recipe_a=None, recipe_b=None,
                compiled_dims: str = "nk", disable_ue8m0_cast: bool = False, *, _config: GemmConfig | None = None
                ) -> None:
    """FP8 block-scaled GEMM ``d = c + a @ b.T`` (DeepGEMM ``fp8_gemm_nt`` / ``fp8_fp4_gemm_nt``, SM90 semantics).

    Args:
        a: ``(A, sfa)``: A ``[M, K]`` float8_e4m3fn, K-major (row stride a multiple of 16 B, 16-B aligned base;
            an MN-major A is copied to K-major); sfa ``[M, ceil(K/128)]`` float32 per-token scales (1x128) in any
            layout (checked with :func:`deepkernels.quant.check_sf_layout` and read through its strides, no copy;
            MN-major TMA-aligned as from ``get_mn_major_tma_aligned_tensor`` is the fastest), or packed UE8M0
            int32 ``[M, ceil(ceil(K/128)/4)]``.
        b: ``(B, sfb)``: B ``[N, K]`` float8_e4m3fn, K-major like A; sfb float32 ``[ceil(N/128), ceil(K/128)]``
            (recipe ``(1, 128, 128)``, any strides) or ``[N, ceil(K/128)]`` (recipe ``(1, 1, 128)``), or packed
            UE8M0 int32 ``[N, ceil(ceil(K/128)/4)]`` (per row).
        d: ``[M, N]`` bfloat16 or float32, row-major (any row stride); written in place.
        c: optional ``[M, N]`` of d's dtype, row-major; ``c is d`` accumulates in place. Added in FP32 before the
            single final rounding.
        recipe: None (SM90 default ``(1, 128, 128)``; ``(1, 1, 128)`` inferred from an ``[N, *]`` sfb),
            ``(1, 128, 128)`` or ``(1, 1, 128)``: a tuple / list of ints ``(gran_m, gran_n, gran_k)``.
        recipe_a, recipe_b: upstream's per-operand spelling ``(gran_mn, gran_k)``, given together and not with
            ``recipe``: ``(1, 128)`` + ``(128, 128)`` is recipe ``(1, 128, 128)``, ``(1, 128)`` + ``(1, 128)`` is
            ``(1, 1, 128)``.
        compiled_dims: accepted for compatibility (a compile-cache knob upstream; no effect on results).
        disable_ue8m0_cast: accepted for compatibility (SM100-only upstream; ignored on SM90).

    Numerics: one fresh FP32 ``tl.dot`` partial per 128-wide K block, scaled by ``sfa * sfb`` and accumulated in
    FP32 (see :mod:`deepkernels.reference.gemm`). M may be any value >= 0; N any value; K any multiple of 16
    (K tails are zero-filled). ``m == 0 or n == 0``: no-op; ``k == 0``: ``d = c`` or zeros.

    Raises:
        TypeError for wrong types/dtypes (a recipe / recipe_a / recipe_b that is not a tuple or list of ints);
        ValueError for shape mismatches, wrong scale shapes, unsupported recipes (or recipe together with
        recipe_a / recipe_b, or only one of recipe_a / recipe_b), misaligned strides, a ``d`` whose rows overlap
        in memory (e.g. an ``expand``-ed view; a broadcast ``c`` is fine), a ``d`` overlapping an input (A, B or
        a scale tensor; disjoint views of one buffer are fine), or M, N or K >= 2^31 (32-bit TMA
        coordinates; M·N beyond 2^31 is fine: D offsets are int64) -- all before any allocation or launch.
    """
    sig = _fp8_sig(a, b, d, c, recipe, recipe_a, recipe_b, compiled_dims, _config)
    plan = _lookup(_FP8_PLANS, sig)
    if plan is not None:  # same signature as a validated call: same verdict, launch directly
        plan(a[0], a[1], b[0], b[1], d, c)
        return
    a_data, sfa = _check_fp8_pair("a", a)
    b_data, sfb = _check_fp8_pair("b", b)
    check_compiled_dims(compiled_dims)
    recipe = check_gemm_recipe(recipe, recipe_a, recipe_b, _FP8_RECIPES, "dense FP8 GEMMs")
    m, k = a_data.shape
    n, kb_ = b_data.shape
    if kb_ != k:
        raise ValueError(f"a[0] [M, K] and b[0] [N, K] must share K, got {list(a_data.shape)} and {list(b_data.shape)}")
    _check_extents(m, n, k)
    _check_out(d, c, m, n, (torch.bfloat16, torch.float32))
    check_no_alias(d, {"a[0]": a_data, "a[1]": sfa, "b[0]": b_data, "b[1]": sfb})
    gran = _ref.resolve_recipe(recipe, n, k, sfb)
    sfa_in, sfb_in, a_in, b_in = sfa, sfb, a_data, b_data
    sfa, _ = _normalise_sf("a[1]", sfa, m, k, 1)
    sfb, sfb_per_row = _normalise_sf("b[1]", sfb, n, k, gran[1])
    if m and n and k:  # empty work launches nothing, so no layout rules apply
        a_data, _ = _k_major("a[0]", a_data, allow_mn_major=False)
        b_data, _ = _k_major("b[0]", b_data, allow_mn_major=False)
        _row_stride("a[0]", a_data, True, k)
        _row_stride("b[0]", b_data, True, k)
    if not use_kernels(a_data, sfa, b_data, sfb, d, c):
        _ref.fp8_gemm_nt((a_data, sfa), (b_data, sfb), d, c=c, recipe=(1, 1, 128) if sfb_per_row else (1, 128, 128))
        return
    if _early_exit(d, c, m, n, k):
        return
    plan = _fp8_plan(a_data, sfa, b_data, sfb, d, c, sfb_per_row, _config)
    if sfa is sfa_in and sfb is sfb_in and a_data is a_in and b_data is b_in:  # no copies were made
        _store_plan(_FP8_PLANS, sig, plan)
    plan(a_data, sfa, b_data, sfb, d, c)


def _t(x):
    return (x[0].T, x[1].T) if isinstance(x, (tuple, list)) and len(x) == 2 else x


def _t2(x):
    """Transpose a 2-D tensor view; anything else passes through for the NT core's own validation to report."""
    return x.T if isinstance(x, torch.Tensor) and x.dim() == 2 else x


class _in_caller_layout:
    """Re-raise a validation error of the NT core (which sees transposed views) with the shapes the caller passed,
    so a message never quotes a shape the caller did not pass."""

    def __init__(self, op: str, a, b, layout: str, core: str = "fp8_gemm_nt"):
        self.op, self.a, self.b, self.layout, self.core = op, a, b, layout, core

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not ValueError:
            return False

        def shapes(x):
            if isinstance(x, torch.Tensor):
                return f"shape {list(x.shape)}, strides {list(x.stride())}"
            if isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, torch.Tensor) for t in x):
                return f"data {list(x[0].shape)}, sf {list(x[1].shape)}"
            return "not a (data, sf) pair"

        scales = " (scales transposed with their data)" if self.core.startswith("fp8") else ""
        raise ValueError(f"{self.op}({self.layout}): got a: {shapes(self.a)}; b: {shapes(self.b)}. The op runs as "
                         f"{self.core} on the transposed views{scales}, which reported: {exc}") from exc


def fp8_gemm_nn(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims: str = "nk",
                disable_ue8m0_cast: bool = False) -> None:
    """``d = c + a @ b``: a ``([M, K], sfa [M, ceil(K/128)])``, b ``([K, N], sfb [ceil(K/128), ceil(N/128)])``.

    View onto :func:`fp8_gemm_nt` with ``b`` and its scales transposed (DeepGEMM ``fp8_gemm_nn``).
    c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast and the errors raised: as :func:`fp8_gemm_nt`."""
    with _in_caller_layout("fp8_gemm_nn", a, b, "a [M, K], b [K, N]"):
        fp8_gemm_nt(a, _t(b), d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)


def fp8_gemm_tn(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims: str = "mn",
                disable_ue8m0_cast: bool = False) -> None:
    """``d = c + a.T @ b``: a ``([K, M], sfa [ceil(K/128), M])``, b ``([K, N], sfb [ceil(K/128), ceil(N/128)])``.

    View onto :func:`fp8_gemm_nt` with both operands (and scales) transposed (DeepGEMM ``fp8_gemm_tn``).
    c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast and the errors raised: as :func:`fp8_gemm_nt`."""
    with _in_caller_layout("fp8_gemm_tn", a, b, "a [K, M], b [K, N]"):
        fp8_gemm_nt(_t(a), _t(b), d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)


def fp8_gemm_tt(a, b, d, c=None, recipe=None, recipe_a=None, recipe_b=None, compiled_dims: str = "mn",
                disable_ue8m0_cast: bool = False) -> None:
    """``d = c + a.T @ b.T``: a ``([K, M], sfa [ceil(K/128), M])``, b ``([N, K], sfb)``.

    View onto :func:`fp8_gemm_nt` with ``a`` and its scales transposed (DeepGEMM ``fp8_gemm_tt``).
    c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast and the errors raised: as :func:`fp8_gemm_nt`."""
    with _in_caller_layout("fp8_gemm_tt", a, b, "a [K, M], b [N, K]"):
        fp8_gemm_nt(_t(a), b, d, c, recipe, recipe_a, recipe_b, compiled_dims, disable_ue8m0_cast)


fp8_fp4_gemm_nt, fp8_fp4_gemm_nn, fp8_fp4_gemm_tn, fp8_fp4_gemm_tt = fp8_gemm_nt, fp8_gemm_nn, fp8_gemm_tn, fp8_gemm_tt


def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: torch.Tensor | None = None,
                 compiled_dims: str = "nk", *, _config: GemmConfig | None = None) -> None:
    """BF16 GEMM ``d = c + a @ b.T`` (DeepGEMM ``bf16_gemm_nt``).

    Args:
        a: ``[M, K]`` bfloat16, K-major or MN-major (row stride of the underlying storage a multiple of 8
            elements, 16-B aligned base).
        b: ``[N, K]`` bfloat16, K-major or MN-major (same alignment rule).
        d: ``[M, N]`` bfloat16 or float32, row-major; written in place.
        c: optional ``[M, N]`` of d's dtype; ``c is d`` accumulates in place; added in FP32, one final rounding.
        compiled_dims: accepted for compatibility (no effect on results).

    ``m == 0 or n == 0``: no-op; ``k == 0``: ``d = c`` or zeros. Raises TypeError/ValueError before launch for
    wrong dtypes, shapes, misaligned strides, a ``d`` with overlapping rows or overlapping ``a`` / ``b``, a ``c``
    overlapping ``d`` without being ``d``, or M, N or K >= 2^31 (as
    :func:`fp8_gemm_nt`).
    """
    sig = _bf16_sig(a, b, d, c, compiled_dims, _config)
    plan = _lookup(_BF16_PLANS, sig)
    if plan is not None:
        plan(a, b, d, c)
        return
    check_tensor("a", a, ndim=2, dtype=torch.bfloat16)
    check_tensor("b", b, ndim=2, dtype=torch.bfloat16)
    check_compiled_dims(compiled_dims)
    m, k = a.shape
    n, kb_ = b.shape
    if kb_ != k:
        raise ValueError(f"a [M, K] and b [N, K] must share K, got {list(a.shape)} and {list(b.shape)}")
    _check_extents(m, n, k)
    _check_out(d, c, m, n, (torch.bfloat16, torch.float32))
    check_no_alias(d, {"a": a, "b": b})
    a_km = b_km = True
    if m and n and k:
        a, a_km = _k_major("a", a, allow_mn_major=True)
        b, b_km = _k_major("b", b, allow_mn_major=True)
        _row_stride("a", a, a_km, k if a_km else m)
        _row_stride("b", b, b_km, k if b_km else n)
    if not use_kernels(a, b, d, c):
        _ref.bf16_gemm_nt(a, b, d, c=c)
        return
    if _early_exit(d, c, m, n, k):
        return
    plan = _bf16_plan(a, a_km, b, b_km, d, c, _config)
    _store_plan(_BF16_PLANS, sig, plan)  # _k_major never copies with allow_mn_major=True
    plan(a, b, d, c)


def bf16_gemm_nn(a, b, d, c=None, compiled_dims: str = "nk") -> None:
    """``d = c + a @ b``: a ``[M, K]``, b ``[K, N]`` bf16 (DeepGEMM ``bf16_gemm_nn``; view onto the NT core)."""
    with _in_caller_layout("bf16_gemm_nn", a, b, "a [M, K], b [K, N]", "bf16_gemm_nt"):
        bf16_gemm_nt(a, _t2(b), d, c, compiled_dims)


def bf16_gemm_tn(a, b, d, c=None, compiled_dims: str = "mn") -> None:
    """``d = c + a.T @ b``: a ``[K, M]``, b ``[K, N]`` bf16 (DeepGEMM ``bf16_gemm_tn``)."""
    with _in_caller_layout("bf16_gemm_tn", a, b, "a [K, M], b [K, N]", "bf16_gemm_nt"):
        bf16_gemm_nt(_t2(a), _t2(b), d, c, compiled_dims)


def bf16_gemm_tt(a, b, d, c=None, compiled_dims: str = "mn") -> None:
    """``d = c + a.T @ b.T``: a ``[K, M]``, b ``[N, K]`` bf16 (DeepGEMM ``bf16_gemm_tt``)."""
    with _in_caller_layout("bf16_gemm_tt", a, b, "a [K, M], b [N, K]", "bf16_gemm_nt"):
        bf16_gemm_nt(_t2(a), b, d, c, compiled_dims)
