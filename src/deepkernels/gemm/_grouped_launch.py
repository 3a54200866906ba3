"""Configs, validation helpers and launchers for the grouped GEMMs of :mod:`deepkernels.gemm.grouped`.

Config choice (no autotuning at call time). Not yet swept on the H200 (see benchmarks/notes/grouped_gemm.md);
the starting points are the dense GEMM's large-M config (128x128 tiles, 8 warps, 4 stages: the largest FP8
tile that compiles without spills with the per-K-block promotion, see ``_configs.py``) and DeepGEMM's SM90
rules: BLOCK_M = the contiguous-layout alignment (128) for m-grouped contiguous, 64 or 128 from
``expected_m`` for masked. BF16 uses BLOCK_K = 64 (DeepGEMM's BF16 block_k).
"""
from __future__ import annotations

import torch

from .._backend import ensure_tma_allocator, interpret_mode
from .._launch import KernelLauncher
from .._validate import (INT32_MAX, check_distinct_elements, check_gemm_recipe,  # noqa: F401 (INT32_MAX re-exported)
                         check_int32_extent, check_tensor)
from ..quant.fp8 import ceil_div
from . import dense as _dense
from ._configs import GemmConfig
from ._grouped_kernels import _k_grouped_mma_kernel, _m_grouped_contiguous_mma_kernel, _m_grouped_masked_mma_kernel


# --------------------------------------------------------------------------------------------- configs
def _pow2_block_m(alignment: int) -> int:
    """BLOCK_M of the contiguous kernels: 128 when it divides ``alignment`` (no tile straddles a group start)."""
    # wgmma needs >= 64 rows per warpgroup, so 64 is the floor; with an alignment that 64 does not divide, a tile
    # may straddle two groups, which the kernel handles per row (one pass per group)
    return 128 if alignment % 128 == 0 else 64


def contiguous_config(alignment: int, is_fp8: bool) -> GemmConfig:
    bm = _pow2_block_m(alignment)
    if is_fp8:
        return GemmConfig(bm, 128, 8 if bm == 128 else 4, 4)
    # BF16 128x128 w8 spilled ~116 B in this kernel (compile tier); 128x64 w4 compiles clean
    return GemmConfig(bm, 64 if bm == 128 else 128, 4, 4, block_k=64)


def masked_config(expected_m: int, is_fp8: bool) -> GemmConfig:
    # 64-row tiles for decode-sized groups; 8 warps split N across two warpgroups (64x128 w4 spilled ~96 B)
    bm = 64 if expected_m <= 64 else 128
    return GemmConfig(bm, 128, 8, 4, block_k=128 if is_fp8 else 64)


def k_grouped_config(is_fp8: bool) -> GemmConfig:
    return GemmConfig(128, 128, 8, 4, block_k=128 if is_fp8 else 64)


def num_progs(tiles_upper: int, cfg: GemmConfig) -> int:
    return max(1, min(tiles_upper, _dense.get_num_sms() * cfg.progs_per_sm))


# --------------------------------------------------------------------------------------------- validation
def check_fp8_pair(name: str, x, ndim: int):
    if not isinstance(x, (tuple, list)) or len(x) != 2:
        raise TypeError(f"{name} must be a (data, scale) pair of tensors, got {type(x).__name__}")
    data, sf = x
    check_tensor(f"{name}[0]", data, ndim=ndim, dtype=torch.float8_e4m3fn)
    check_tensor(f"{name}[1]", sf, dtype=torch.float32)
    return data, sf


def check_m_recipe(recipe, recipe_a, recipe_b) -> None:
    """M-grouped FP8 on SM90: only the (1, 128, 128) recipe (1x128 activations, 128x128 weights), spelled
    ``recipe=(1, 128, 128)`` or ``recipe_a=(1, 128), recipe_b=(128, 128)`` (one rule for both spellings:
    :func:`deepkernels._validate.check_gemm_recipe`, shared with the dense GEMMs)."""
    check_gemm_recipe(recipe, recipe_a, recipe_b, ((1, 128, 128),), "m-grouped FP8 GEMMs")


def check_k_recipe(recipe) -> None:
    """K-grouped FP8: only the (1, 1, 128) recipe (per-token scales on both operands)."""
    check_gemm_recipe(recipe, None, None, ((1, 1, 128),), "k-grouped FP8 GEMMs")


def k_major(name: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` with a contiguous last dim and packed leading dims (copied if needed); 16-byte aligned rows."""
    if t.stride(-1) != 1 and t.shape[-1] > 1:
        t = t.contiguous()
    if t.dim() == 3 and t.shape[0] > 1 and t.stride(0) != t.shape[1] * t.stride(1):
        t = t.contiguous()
    if (row_stride(t) * t.element_size()) % 16 or t.data_ptr() % 16:
        raise ValueError(f"{name} (shape {list(t.shape)}, strides {list(t.stride())}) needs 16-byte aligned rows "
                         f"and base for TMA: K must be a multiple of {16 // t.element_size()}")
    return t


def row_stride(t: torch.Tensor) -> int:
    """Row stride of ``t``'s last two dims; a single row gets the smallest 16-byte aligned one."""
    return t.stride(-2) if t.shape[-2] > 1 else ceil_div(t.shape[-1] * t.element_size(), 16) * 16 // t.element_size()


def check_out(name: str, d, shape, dtypes) -> None:
    check_tensor(name, d, ndim=len(shape), dtype=dtypes)
    if list(d.shape) != list(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(d.shape)}")
    if shape[-1] > 1 and d.stride(-1) != 1:
        raise ValueError(f"{name} must be row-major (stride(-1) == 1), got strides {list(d.stride())}")
    # no two output elements may share memory (a padded row / group stride is fine): the kernels write every
    # group's rows independently, so overlapping groups or rows would race
    check_distinct_elements(name, d)


def check_index(name: str, t, shape, device) -> None:
    check_tensor(name, t, ndim=1, dtype=torch.int32)
    if list(t.shape) != list(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} must be on {device} like the operands, got {t.device}")


# --------------------------------------------------------------------------------------------- launchers
class GroupedPlan:
    """One validated grouped launch: the kernel's :class:`~deepkernels._launch.KernelLauncher` (compiled kernel
    called directly after its first launch), grid and integer arguments. ``plan(a, b, d, sfa, sfb, idx)`` runs it
    (``sfa``/``sfb`` None for BF16; ``idx``: per-row group ids or ``masked_m``). Cached by the public ops per call
    signature (see ``grouped.py``), so a repeated call skips validation and Triton's argument binding."""

    __slots__ = ("launcher", "grid", "ints")

    def __call__(self, a, b, d, sfa, sfb, idx) -> None:
        self.launcher(self.grid, a, b, d, d if sfa is None else sfa, d if sfb is None else sfb, idx, *self.ints)


def m_contiguous_plan(a, b, b_kmajor: bool, d, sfa=None, sfb=None, cfg: GemmConfig | None = None,
                      alignment: int = 128) -> GroupedPlan:
    """a ``[M, K]``, b ``[G, N, K]`` (K-major) or its MN-major view, d ``[M, N]``."""
    is_fp8 = sfa is not None
    m, k = a.shape
    g_num, n = b.shape[0], b.shape[1]
    cfg = cfg or contiguous_config(alignment, is_fp8)
    ensure_tma_allocator()
    b_store_stride = b.stride(1) if b_kmajor else b.stride(2)
    tiles = ceil_div(m, cfg.block_m) * ceil_div(n, cfg.block_n)
    plan = GroupedPlan()
    grid = num_progs(tiles, cfg)
    plan.grid = (grid,)
    plan.ints = (m, n, k, g_num, row_stride(a), b_store_stride, d.stride(0),
                 sfa.stride(0) if is_fp8 else 0, sfa.stride(1) if is_fp8 else 0,
                 sfb.stride(0) if is_fp8 else 0, sfb.stride(1) if is_fp8 else 0, sfb.stride(2) if is_fp8 else 0, grid)
    plan.launcher = KernelLauncher(_m_grouped_contiguous_mma_kernel, dict(
        IS_FP8=is_fp8, B_KMAJOR=b_kmajor, UPCAST=interpret_mode() and not is_fp8,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    return plan


def launch_m_contiguous(a, b, b_kmajor: bool, d, gid, sfa=None, sfb=None, cfg: GemmConfig | None = None,
                        alignment: int = 128) -> GroupedPlan:
    """Build the plan of :func:`m_contiguous_plan`, launch it with ``gid`` (int32 ``[M]``), return it."""
    plan = m_contiguous_plan(a, b, b_kmajor, d, sfa, sfb, cfg, alignment)
    plan(a, b, d, sfa, sfb, gid)
    return plan


def m_masked_plan(a, b, d, expected_m: int, sfa=None, sfb=None, cfg: GemmConfig | None = None) -> GroupedPlan:
    """a ``[G, M_max, K]``, b ``[G, N, K]``, d ``[G, M_max, N]``; grid fixed by shapes (graph-replayable)."""
    is_fp8 = sfa is not None
    g_num, m_max, k = a.shape
    n = b.shape[1]
    cfg = cfg or masked_config(expected_m, is_fp8)
    ensure_tma_allocator()
    tiles_upper = g_num * ceil_div(m_max, cfg.block_m) * ceil_div(n, cfg.block_n)
    plan = GroupedPlan()
    grid = num_progs(tiles_upper, cfg)
    plan.grid = (grid,)
    plan.ints = (m_max, n, k, g_num, row_stride(a), row_stride(b), d.stride(1), d.stride(0),
                 *(sfa.stride() if is_fp8 else (0, 0, 0)), *(sfb.stride() if is_fp8 else (0, 0, 0)), grid)
    plan.launcher = KernelLauncher(_m_grouped_masked_mma_kernel, dict(
        IS_FP8=is_fp8, UPCAST=interpret_mode() and not is_fp8,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps, num_stages=cfg.num_stages))
    return plan


def launch_m_masked(a, b, d, masked_m, expected_m: int, sfa=None, sfb=None,
                    cfg: GemmConfig | None = None) -> GroupedPlan:
    """Build the plan of :func:`m_masked_plan`, launch it with ``masked_m`` (int32 ``[G]``), return it."""
    plan = m_masked_plan(a, b, d, expected_m, sfa, sfb, cfg)
    plan(a, b, d, sfa, sfb, masked_m)
    return plan


def launch_k_grouped(a, b, d, ks_dev, sum_k: int, sf_cols: int, mn_major: bool, sfa=None, sfb=None,
                     cfg: GemmConfig | None = None) -> None:
    """d ``[G, M, N]`` fp32 (pre-filled with C) += per-group products; ks_dev: int32 ``[G]`` on the device."""
    is_fp8 = sfa is not None
    g_num, m, n = d.shape
    cfg = cfg or k_grouped_config(is_fp8)
    ensure_tma_allocator()
    # per-group K and scale-column offsets, on the device (no host sync); clamped so that a grouped_layout that
    # disagrees with ks_cpu can never address past the A/B buffers or the scale columns
    ks64 = ks_dev.to(torch.int64).clamp(min=0)
    koff = (torch.cumsum(ks64, 0) - ks64).clamp(max=sum_k)
    ks64 = torch.minimum(ks64, sum_k - koff)
    nsf = (ks64 + 127) // 128
    sfoff = torch.minimum(torch.cumsum(nsf, 0) - nsf, sf_cols - nsf)
    tiles = g_num * ceil_div(m, cfg.block_m) * ceil_div(n, cfg.block_n)
    grid = num_progs(tiles, cfg)
    dummy = d
    _k_grouped_mma_kernel[(grid,)](
        a, b, d, sfa if is_fp8 else dummy, sfb if is_fp8 else dummy, ks64, koff, sfoff,
        m, n, g_num, sum_k, d.stride(0), d.stride(1),
        sfa.stride(0) if is_fp8 else 0, sfa.stride(1) if is_fp8 else 0,
        sfb.stride(0) if is_fp8 else 0, sfb.stride(1) if is_fp8 else 0, grid,
        IS_FP8=is_fp8, MN_MAJOR=mn_major, UPCAST=interpret_mode() and not is_fp8,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        NUM_STAGES=cfg.num_stages, num_warps=cfg.num_warps, num_stages=cfg.num_stages)
