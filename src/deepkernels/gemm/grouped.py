"""MoE grouped GEMMs (DeepGEMM ``m_grouped_*_contiguous``, ``m_grouped_*_masked``, ``k_grouped_*_contiguous``).

Semantics: docs/spec/gemm.md §1.5-1.7 and §7 items 7-9, defined by :mod:`deepkernels.reference.grouped_gemm`. All
functions write ``d`` in place and return None. CUDA tensors run the persistent Triton kernels of
``_grouped_kernels.py`` (group-aware schedule computed on the device, TMA loads, per-128-K-block FP32
promotion); CPU tensors run the reference (or the kernels under ``TRITON_INTERPRET=1``). Bad input raises
TypeError/ValueError before any launch.

Documented differences from upstream SM90 (a superset unless noted):

- Padding rows of the contiguous layout (per-row id -1 and psum gaps) are written with exact zeros (upstream:
  zeros for whole padding sub-tiles, ``A_row @ B_g.T`` otherwise).
- ``grouped_layout`` values (undefined upstream when out of contract: an id ``>= G`` reads past B) are checked
  when the layout is a CPU tensor: a per-row id other than -1 outside ``[0, G)``, or a psum layout that decreases
  or leaves ``[0, M_sum]``, raises ValueError. On CUDA they are not checked (that would be a host sync per call):
  a per-row id outside ``[0, G)`` makes its row a padding row (exact zeros, no read of B); a psum layout that
  decreases or leaves ``[0, M_sum]`` gives unspecified rows (every access stays in bounds).
- A per-row layout that breaks the alignment rule still gives the reference result (a tile holding several
  groups is computed once per group); the alignment only matters for speed (and defines psum group starts).
- ``m_grouped_fp8_gemm_nn_contiguous`` works (B is copied to K-major first; upstream SM90 asserts).
- m-grouped ``d`` may also be float32; k-grouped ``c`` may be None (then ``D = A @ B``).
- Masked: ``masked_m`` values are clamped to ``[0, M_max]`` on the device; rows ``>= masked_m[g]`` are never
  written, whatever ``M_max`` is (upstream's TMA store can spill into the next group, issue #268).
- ``k_grouped_fp8_gemm_tn_contiguous`` runs on SM90 (upstream: SM100 only); FP32 scales only.
- K-grouped needs ``use_psum_layout=False`` and every ``k_g % 128 == 0`` (as upstream SM90).
"""
from __future__ import annotations

import numbers

import torch

from .._backend import gluon_disabled, use_kernels
from .._validate import check_compiled_dims, check_no_alias as _check_no_alias, check_tensor, overlaps
from .._validate import output_aliases as _output_aliases
from ..quant.fp8 import ceil_div
from ..reference import grouped_gemm as _ref
from . import _grouped_launch as _L
from . import dense as _dense

__all__ = [
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_contiguous", "m_grouped_fp8_fp4_gemm_nn_contiguous",
    "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nn_contiguous",
    "m_grouped_fp8_gemm_nt_masked", "m_grouped_fp8_fp4_gemm_nt_masked", "m_grouped_bf16_gemm_nt_masked",
    "fp8_m_grouped_gemm_nt_masked", "bf16_m_grouped_gemm_nt_masked",
    "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_fp8_gemm_tn_contiguous", "k_grouped_bf16_gemm_tn_contiguous",
    "get_mk_alignment_for_contiguous_layout", "set_mk_alignment_for_contiguous_layout",
    "get_theoretical_mk_alignment_for_contiguous_layout",
    "get_m_alignment_for_contiguous_layout", "get_k_alignment_for_contiguous_layout",
]

_MK_ALIGNMENT = 128  # DeepGEMM kLegacyMKAlignmentForContiguousLayout; the SM90 BLOCK_M of contiguous layouts


def get_mk_alignment_for_contiguous_layout() -> int:
    """Row alignment of each group's segment in the M-grouped contiguous layout (default 128; DeepGEMM)."""
    return _MK_ALIGNMENT


def set_mk_alignment_for_contiguous_layout(alignment: int) -> None:
    """Set the contiguous-layout group alignment (DeepGEMM ``set_mk_alignment_for_contiguous_layout``).

    Affects the psum layout's group starts (``align(end_{g-1}, alignment)``) and the M tile of the contiguous
    kernels (the largest power of two <= 128 dividing it). Raises TypeError for a non-int, ValueError unless
    ``alignment`` is a positive multiple of 16 (at most 4096).
    """
    global _MK_ALIGNMENT
    if isinstance(alignment, bool) or not isinstance(alignment, numbers.Integral):
        raise TypeError(f"alignment must be an int, got {type(alignment).__name__}")
    if alignment <= 0 or alignment % 16 or alignment > 4096:
        raise ValueError(f"alignment must be a positive multiple of 16 (<= 4096), got {alignment}")
    _MK_ALIGNMENT = int(alignment)   # a NumPy int as the int it equals (it is part of the plan signatures)


def get_theoretical_mk_alignment_for_contiguous_layout(expected_m: int | None = None) -> int:
    """The alignment the SM90 kernels are built around: 128 for any ``expected_m`` (DeepGEMM, SM90 branch)."""
    if expected_m is not None and (isinstance(expected_m, bool) or not isinstance(expected_m, numbers.Integral)
                                   or expected_m < 0):
        raise ValueError(f"expected_m must be None or an int >= 0, got {expected_m!r}")
    return 128


get_m_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout  # v1 name
get_k_alignment_for_contiguous_layout = get_mk_alignment_for_contiguous_layout


# ------------------------------------------------------------------------------------------- host fast path
# A call whose *signature* (dtype, shape, strides, device and 16-B alignment of every tensor; recipe, compiled_dims,
# expected_m, psum flag, contiguous alignment, config override, set_num_sms value, interpreter flag) equals one
# that already passed validation reuses its verdict and launch plan: every check is a function of the signature,
# and the plan calls the compiled kernel directly (deepkernels._launch.KernelLauncher). masked_m / grouped_layout
# *values* are never part of it (read on the device only). Calls whose operands needed a copy (not K-major / not
# packed), the reference path and no-op calls are never cached.
_PLAN_LIMIT = 1024
_PLANS: dict = {}
_T = torch.Tensor


def _tsig(t) -> tuple:
    if type(t) is not _T:
        raise TypeError
    return (t.dtype, t.shape, t.stride(), t.device, t.data_ptr() & 15)


_NOSIG = object()


def _int(x):
    """``x`` for an exact int (NumPy integers as the int they equal), else a marker that sends the call down the
    full (validating) path."""
    if type(x) is int:
        return x
    return int(x) if isinstance(x, numbers.Integral) and not isinstance(x, bool) else _NOSIG


def _hashable(x):
    return tuple(x) if isinstance(x, (list, tuple)) else x


def _env_sig():
    env = _dense._ENV
    return (_dense._NUM_SMS, _dense._interp(), env.get("DEEPKERNELS_GROUPED_GLUON"), env.get("DEEPKERNELS_DISABLE_GLUON"),
            env.get("DEEPKERNELS_GROUPED_EPI"))


def _fp8_sig(kind, a, b, d, idx, rest):
    """Signature of an FP8 grouped call, or None (full path) for unusual argument types."""
    try:
        if type(a) not in (tuple, list) or type(b) not in (tuple, list) or len(a) != 2 or len(b) != 2:
            return None
        if any(x is _NOSIG for x in rest):
            return None
        # rest[:3]: recipe, recipe_a, recipe_b -- exact ints only (a (True, 128, 128) hashes like (1, 128, 128))
        rest = tuple(_dense._recipe_sig(x) for x in rest[:3]) + tuple(_hashable(x) for x in rest[3:])
        sig = (kind, True, _tsig(a[0]), _tsig(a[1]), _tsig(b[0]), _tsig(b[1]), _tsig(d), _tsig(idx), rest,
               _env_sig())
        hash(sig)
        if _output_aliases(d, (a[0], a[1], b[0], b[1], idx)):
            return None   # d written over an input: the validating path reports it
        return sig
    except Exception:
        return None


def _bf16_sig(kind, a, b, d, idx, rest):
    try:
        if any(x is _NOSIG for x in rest):
            return None
        rest = tuple(_hashable(x) for x in rest)
        sig = (kind, False, _tsig(a), _tsig(b), _tsig(d), _tsig(idx), rest, _env_sig())
        hash(sig)
        if _output_aliases(d, (a, b, idx)):
            return None   # d written over an input: the validating path reports it
        return sig
    except Exception:
        return None


def _lookup(sig):
    return _dense._lookup(_PLANS, sig)


def _store(sig, plan) -> None:
    if sig is None or plan is None:
        return
    if len(_PLANS) >= _PLAN_LIMIT:
        _PLANS.clear()
    _PLANS[sig] = plan


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    """``x`` is ``y``'s memory with ``y``'s strides (no copy was made)."""
    return x.data_ptr() == y.data_ptr() and x.stride() == y.stride()


def _packed_index(t):
    """A 1-D ``grouped_layout`` / ``masked_m`` view with a non-unit stride (e.g. ``ids[:, 0]`` of an ``[M, 2]``
    tensor) as a packed copy; anything else unchanged (validation reports wrong types / ranks). The kernels index
    these tensors as packed int32 arrays, so a strided view read as packed gave wrong rows (masked: rows past
    ``masked_m[g]`` written). A device copy (no host sync; graph-capturable), done before the plan signature so
    the packed copy's signature is the one cached."""
    if type(t) is _T and t.dim() == 1 and t.shape[0] > 1 and t.stride(0) != 1:
        return t.contiguous()
    return t


# contiguous FP8: normalise sfa to MN-major TMA-aligned before the launch (a copy per call when it is not; both
# kernels read any layout through strides). A module switch so that benchmarks/grouped_gemm.py --ab can time both.
_CONTIG_SFA_COPY = True


def _mn_major_sfa(sfa):
    if not _CONTIG_SFA_COPY:
        return sfa
    from ..quant import get_mn_major_tma_aligned_tensor
    return get_mn_major_tma_aligned_tensor(sfa)


def _gluon_gate(is_fp8, d, cfg):
    """The Gluon grouped kernels' common preconditions: FP8, BF16 ``d`` on CUDA, no config override, not the
    interpreter, not disabled (``DEEPKERNELS_GROUPED_GLUON=0`` / ``DEEPKERNELS_DISABLE_GLUON``), Gluon importable.
    Returns ``(the _gluon_fp8 module, forced)`` -- ``forced``: ``DEEPKERNELS_GROUPED_GLUON=1`` -- or None."""
    import os
    if not is_fp8 or cfg is not None or d.dtype != torch.bfloat16 or not d.is_cuda:
        return None
    from .._backend import interpret_mode
    env = os.environ.get("DEEPKERNELS_GROUPED_GLUON", "")
    if interpret_mode() or env == "0" or gluon_disabled("grouped_gemm"):
        return None
    from . import _gluon_fp8
    if not _gluon_fp8.available():
        return None
    return _gluon_fp8, env == "1"


def _gluon_contiguous_config(m_sum, n, k, is_fp8, b_kmajor, d, alignment, cfg):
    """The Gluon warp-specialised config for an m-grouped contiguous call, or None (Triton kernel).

    Applies where :func:`_gluon_gate` does, with K-major B. Default rule (v3 device run, H200,
    2026-11-29 15:07 UTC, git 011f1befdb5b, ``results/grouped_gemm-h200-v3-contig-2026-11-29.json``): the Gluon
    kernel (128x128, 6 stages, K-major sfa read through its strides) passed all its GPU tests and beat the
    Triton contiguous kernel on all 6 measured shapes -- G=4/8 x 8192/4096 rows, MoE G=32 x 8192 skewed rows;
    N 4096 / 7168, K 7168 / 2048 -- by 1.01-1.14x whole call (geomean 1.06x) and 1.00-1.09x CUDA graph; so it is
    used inside that envelope: alignment a multiple of 128, M_sum >= 8192, N >= 4096, K >= 2048.
    ``DEEPKERNELS_GROUPED_GLUON=1`` forces it wherever it applies, ``=0`` or ``DEEPKERNELS_DISABLE_GLUON=1``
    never uses it.

    The config is the TMA-store-epilogue twin ``GLUON_WS_128_S6_EPI`` (64-row slices whose rows all belong to the
    pass's group go registers -> shared -> TMA store; others the register store) unless
    ``DEEPKERNELS_GROUPED_EPI=0``: on by default since its first device run (session 15, H200, git f4256ee7e1e5,
    results/grouped_gemm_epi-h200-2026-11-29-s15.json): 15/15 GPU tests, bit-identical to the register epilogue on
    the 4 DeepGEMM contiguous shapes and 1.005-1.20x it (whole call; K 2048 shapes 1.19-1.20x, K 7168 1.005-1.03x).
    The switch is part of the cached plan's signature (``_env_sig``).
    Session 19: at K >= 7168 the same config with the scales loaded two blocks ahead (``GLUON_WS_128_S6_EPI_SA1``,
    bit-identical; H200, git 92c8e3d2a05d, paired rotated rounds, A/A 0.997-1.014, results/grouped_sa-h200-2026-11-30-
    s19.json): t / t_S6_EPI 0.926 (4 x 8192 x 4096 x 7168) / 0.929 (8 x 4096 x 4096 x 7168); K 2048 0.98-0.99 (kept
    off there)."""
    gate = _gluon_gate(is_fp8, d, cfg) if b_kmajor else None
    if gate is None:
        return None
    G, forced = gate
    if forced or (alignment % 128 == 0 and m_sum >= 8192 and n >= 4096 and k >= 2048):
        if not _epi_switch():
            return G.GLUON_WS_128_S6
        return G.GLUON_WS_128_S6_EPI_SA1 if k >= 7168 else G.GLUON_WS_128_S6_EPI
    return None


def _gluon_masked_config(m_max, n, k, expected_m, is_fp8, d, cfg):
    """The Gluon warp-specialised config for an m-grouped masked call, or None (Triton kernel).

    Applies where :func:`_gluon_gate` does. Default rule (H200, 2026-11-29 16:33 UTC, git
    3ea864ac1545, ``results/grouped_gemm-h200-v3b-masked-2026-11-29.json``): the Gluon masked kernel passed its GPU
    tests (incl. CUDA-graph replay with changing counts) and was 1.05-1.17x the Triton masked kernel on all six
    DeepGEMM masked shapes (G 1/2/4 x M_max 1024/512/256 = expected_m, N 4096 / 7168, K 7168 / 2048); so it is used
    inside that envelope: expected_m >= 256, N >= 4096, K >= 2048 (smaller expected_m, where the Triton table picks
    64-row tiles, was not measured). ``DEEPKERNELS_GROUPED_GLUON=1`` forces it wherever it applies, ``=0`` or
    ``DEEPKERNELS_DISABLE_GLUON`` never uses it.

    The config is the TMA-store-epilogue twin ``GLUON_WS_128_S4_EPI`` (64-row slices wholly below ``masked_m[g]``
    TMA-stored, the slice crossing it through the masked register store) unless ``DEEPKERNELS_GROUPED_EPI=0``: on by
    default since its first device run (session 15, same run as the contiguous one): bit-identical on the 6 DeepGEMM
    masked shapes and faster in CUDA-graph replay at all 6 (1.05-1.28x: 63 vs 67, 34 vs 43, 67 vs 71, 37 vs 45,
    71 vs 74, 40 vs 48 us); the direct launches' whole-call times at these 40-90 us sizes are host-bound and scatter
    (0.58-1.17x); the public op with the switch 0.98-1.65x the public op without it.
    Session 19: at K >= 7168 ``GLUON_WS_128_S4_EPI_SA1`` (scales two blocks ahead, bit-identical; same run as the
    contiguous one): 0.933 / 0.944 / 0.941 at G 1 / 2 / 4 x expected_m 1024 / 512 / 256, N 4096 (A/A 0.962-1.001);
    K 2048 0.97-0.99 (A/A 0.85-0.97: noisy) -> kept off there."""
    gate = _gluon_gate(is_fp8, d, cfg)
    if gate is None:
        return None
    G, forced = gate
    if forced or (expected_m >= 256 and n >= 4096 and k >= 2048):
        if not _epi_switch():
            return G.GLUON_WS_128_S4
        return G.GLUON_WS_128_S4_EPI_SA1 if k >= 7168 else G.GLUON_WS_128_S4_EPI
    return None


def _epi_switch() -> bool:
    """The grouped Gluon configs' TMA-store-epilogue twins: on unless ``DEEPKERNELS_GROUPED_EPI=0`` (measured
    session 15; the register-epilogue configs stay available for A/B)."""
    import os
    return os.environ.get("DEEPKERNELS_GROUPED_EPI", "1") != "0"


class _GluonPlan:
    """m-grouped FP8 (contiguous or masked) on the Gluon warp-specialised loop (gemm/_gluon_fp8.py). One plan per
    call signature, so every launch has the same specialisation: the first call goes through the checked launcher
    and binds a :class:`deepkernels._launch.KernelLauncher`; later calls build the two TMA descriptors and call the
    compiled kernel directly (``_go_m_masked`` / ``_go_m_contiguous``: no re-checks, no argument binding). A
    TMA-store-epilogue config (the default; ``DEEPKERNELS_GROUPED_EPI=0`` turns it off) whose d is not TMA-able
    becomes its register-epilogue twin at the first call (d's strides and alignment are part of the signature)."""

    __slots__ = ("config", "masked", "launcher", "go")

    def __init__(self, config, masked: bool):
        self.config, self.masked, self.launcher, self.go = config, masked, None, None

    def __call__(self, a, b, d, sfa, sfb, rows) -> None:
        get_num_sms = _dense.get_num_sms
        if self.go is not None:
            self.go(a, sfa, b, sfb, d, rows, self.config, get_num_sms(), self.launcher)
            return
        from .._launch import KernelLauncher
        from . import _gluon_fp8 as G
        if self.config.epi_tma and not (G.masked_d_tma_ok(d) if self.masked else G.d_tma_ok(d)):
            # d's strides and 16-B alignment are part of the plan's signature: the register-epilogue twin for good
            self.config = G.grouped_register_twin(self.config)
        if self.masked:
            self.launcher = KernelLauncher(G.m_masked_kernel(self.config), G.m_masked_meta(self.config),
                                           cache_descriptors=True)
            G._launch_fp8_gluon_m_masked(a, sfa, b, sfb, d, rows, self.config, get_num_sms(), self.launcher)
            self.go = G._go_m_masked
        else:
            self.launcher = KernelLauncher(G.m_contiguous_kernel(self.config), G.m_contiguous_meta(self.config),
                                           cache_descriptors=True)
            G._launch_fp8_gluon_m_contiguous(a, sfa, b, sfb, d, rows, self.config, get_num_sms(), self.launcher)
            self.go = G._go_m_contiguous


class _ContiguousRun:
    """A cached m-grouped contiguous launch: normalises FP8 sfa to MN-major for the Triton kernel (whose plan was
    built with those strides; the Gluon kernel reads sfa as given), expands a psum layout to per-row ids on the
    device, then launches."""

    __slots__ = ("plan", "norm_sfa", "psum", "m_sum", "g_num", "alignment", "host_check")

    def __init__(self, plan, norm_sfa, psum, m_sum, g_num, alignment, host_check=False):
        self.plan, self.norm_sfa, self.psum = plan, norm_sfa, psum
        self.m_sum, self.g_num, self.alignment = m_sum, g_num, alignment
        self.host_check = host_check  # layout on the CPU (interpreter): its values are checked on every call

    def __call__(self, a_data, sfa, b_data, sfb, d, layout) -> None:
        if self.host_check:
            _check_host_layout(layout, self.psum, self.m_sum, self.g_num)
        if self.norm_sfa:
            sfa = _mn_major_sfa(sfa)
        gid = layout
        if self.psum:  # expand to per-row ids on the device (searchsorted; no host sync)
            gid = _ref.row_group_ids(layout, self.m_sum, self.g_num, True, self.alignment).to(torch.int32)
        self.plan(a_data, b_data, d, sfa, sfb, gid)


def _check_host_layout(grouped_layout: torch.Tensor, use_psum_layout: bool, m_sum: int, g_num: int) -> None:
    """Value checks of an m-grouped contiguous ``grouped_layout`` that need its values on the host: done only for a
    CPU tensor (no device sync on the CUDA hot path; what CUDA does instead is documented on the public ops).

    Per-row: every id is -1 (padding) or a group in ``[0, G)``. Psum: the ends are non-decreasing and in
    ``[0, M_sum]`` (DeepGEMM's layout is a prefix sum)."""
    if grouped_layout.device.type != "cpu" or grouped_layout.numel() == 0:
        return
    v = grouped_layout
    if not use_psum_layout:
        bad = ((v < -1) | (v >= g_num)).nonzero()
        if bad.numel():
            i = int(bad[0, 0])
            raise ValueError(f"grouped_layout[{i}] = {int(v[i])} is neither a group id in [0, G={g_num}) nor -1 "
                             f"(padding); per-row layout of shape {list(v.shape)}")
        return
    bad = ((v < 0) | (v > m_sum)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise ValueError(f"grouped_layout[{i}] = {int(v[i])} (psum layout: cumulative end row of group {i}) must be "
                         f"in [0, M_sum={m_sum}]; got {v.tolist()}")
    if v.numel() > 1:
        dec = (v[1:] < v[:-1]).nonzero()
        if dec.numel():
            i = int(dec[0, 0]) + 1
            raise ValueError(f"grouped_layout (psum layout: cumulative end rows) must be non-decreasing, got "
                             f"grouped_layout[{i - 1}] = {int(v[i - 1])} > grouped_layout[{i}] = {int(v[i])} "
                             f"(layout {v.tolist()}, M_sum {m_sum})")


# ------------------------------------------------------------------------------------------- m-grouped contiguous
def _contiguous(a_data, b_data, sfa, sfb, d, grouped_layout, use_psum_layout, b_kmajor, compiled_dims, _config):
    """Shared validation + dispatch of the m-grouped contiguous GEMMs (b_data is ``[G, N, K]`` in NT form)."""
    is_fp8 = sfa is not None
    check_compiled_dims(compiled_dims)
    m_sum, k = a_data.shape
    g_num, n, kb_ = b_data.shape
    if kb_ != k:
        raise ValueError(f"a [M_sum, K] and b [G, N, K] must share K, got {list(a_data.shape)} and "
                         f"{list(b_data.shape)}")
    if g_num <= 0 or n <= 0 or k <= 0:
        raise ValueError(f"need num_groups > 0, N > 0 and K > 0 (DeepGEMM asserts), got b of shape {list(b_data.shape)}")
    _L.check_out("d", d, [m_sum, n], (torch.bfloat16, torch.float32))
    check_tensor("grouped_layout", grouped_layout, ndim=1, dtype=torch.int32)
    _check_no_alias(d, {"a[0]" if is_fp8 else "a": a_data, "a[1]": sfa, "b[0]" if is_fp8 else "b": b_data,
                        "b[1]": sfb, "grouped_layout": grouped_layout})
    want = [g_num] if use_psum_layout else [m_sum]
    if list(grouped_layout.shape) != want:
        raise ValueError(f"grouped_layout must have shape {want} ({'psum: one end per group' if use_psum_layout else 'one group id per row'}), "
                         f"got {list(grouped_layout.shape)}")
    if not is_fp8 and k % 64:
        raise ValueError(f"BF16 m-grouped GEMMs need K % 64 == 0 (DeepGEMM SM90), got K = {k}")
    if is_fp8:
        from ..quant import check_sf_layout
        check_sf_layout(sfa, m_sum, k, 1, 128, name="a[1]")
        check_sf_layout(sfb, n, k, 128, 128, num_groups=g_num, name="b[1]")
    _L.check_int32_extent("M_sum", m_sum)
    _L.check_int32_extent("G * N" if b_kmajor else "G * K", g_num * (n if b_kmajor else k))
    alignment = get_mk_alignment_for_contiguous_layout()
    _check_host_layout(grouped_layout, use_psum_layout, m_sum, g_num)
    host_check = grouped_layout.device.type == "cpu"
    if not use_kernels(a_data, b_data, d, grouped_layout, sfa, sfb):
        if is_fp8:
            out = _ref.m_grouped_fp8_gemm_contiguous_ref((a_data, sfa), (b_data, sfb), grouped_layout,
                                                         use_psum_layout, alignment, d.dtype)
        else:
            out = _ref.m_grouped_bf16_gemm_contiguous_ref(a_data, b_data, grouped_layout, use_psum_layout,
                                                          alignment, d.dtype)
        d.copy_(out)
        return None
    if m_sum == 0:
        return None
    a_in, b_in = a_data, b_data
    a_data = _L.k_major("a[0]" if is_fp8 else "a", a_data)
    if b_kmajor:
        b_data = _L.k_major("b[0]" if is_fp8 else "b", b_data)
    else:  # BF16 nn: [G, K, N] storage, read MN-major
        b_store = _L.k_major("b", b_data.transpose(1, 2))
        b_data = b_store.transpose(1, 2)
    gcfg = _gluon_contiguous_config(m_sum, n, k, is_fp8, b_kmajor, d, alignment, _config)
    if gcfg is not None:
        run = _ContiguousRun(_GluonPlan(gcfg, False), False, use_psum_layout, m_sum, g_num, alignment, host_check)
    else:
        plan = _L.m_contiguous_plan(a_data, b_data, b_kmajor, d, _mn_major_sfa(sfa) if is_fp8 else None, sfb,
                                    _config, alignment)
        run = _ContiguousRun(plan, is_fp8, use_psum_layout, m_sum, g_num, alignment, host_check)
    run(a_data, sfa, b_data, sfb, d, grouped_layout)
    return run if _same(a_data, a_in) and _same(b_data, b_in) else None


def m_grouped_fp8_gemm_nt_contiguous(a, b, d: torch.Tensor, grouped_layout: torch.Tensor, recipe=None,
                                     recipe_a=None, recipe_b=None, compiled_dims: str = "nk",
                                     disable_ue8m0_cast: bool = False, use_psum_layout: bool = False,
                                     ensure_zero_padding: bool = True, expected_m_for_psum_layout=None,
                                     *, _config=None) -> None:
    """M-grouped contiguous FP8 GEMM ``d[i] = a[i] @ b[g(i)].T`` (DeepGEMM ``m_grouped_fp8_gemm_nt_contiguous``).

    Args:
        a: ``(A, sfa)``: A ``[M_sum, K]`` float8_e4m3fn, K-major (K % 16 == 0, 16-B aligned base); sfa float32
            ``[M_sum, ceil(K/128)]`` 1x128 scales in any layout (normalised to MN-major TMA-aligned).
        b: ``(B, sfb)``: B ``[G, N, K]`` float8_e4m3fn K-major (packed groups, else copied); sfb float32
            ``[G, ceil(N/128), ceil(K/128)]`` 128x128 scales, any strides.
        d: ``[M_sum, N]`` bfloat16 (or float32), row-major; written in place, every row (padding rows get 0).
        grouped_layout: int32 on a's device, any stride (a strided view is packed first). Per-row layout
            (default): ``[M_sum]`` group id of each row, -1 for padding rows; groups should start at multiples
            of :func:`get_mk_alignment_for_contiguous_layout` (speed only: a tile mixing groups is still exact).
            Psum layout (``use_psum_layout=True``): ``[G]`` cumulative end row of each group, non-decreasing, in
            ``[0, M_sum]``; group g starts at ``align(end_{g-1}, alignment)`` (a group with ``end_g`` below that
            start is empty); gap rows -> 0.
            Values are checked for a CPU tensor (ValueError: per-row id other than -1 outside ``[0, G)``; psum
            decreasing or outside ``[0, M_sum]``). On CUDA they are not (no host sync): an out-of-range per-row id
            makes a padding row (0); a bad psum layout gives unspecified rows, never an out-of-bounds access.
        recipe / recipe_a / recipe_b: None, ``recipe=(1, 128, 128)`` or ``recipe_a=(1, 128)`` +
            ``recipe_b=(128, 128)`` (tuples / lists of ints; not both spellings; recipe_a and recipe_b together).
            Anything else (e.g. per-row weight scales, ``(1, 1, 128)`` or ``recipe_b=(1, 128)``) is a ValueError.
        compiled_dims, disable_ue8m0_cast, ensure_zero_padding, expected_m_for_psum_layout: accepted for
            compatibility (compile-cache / SM100 / heuristic knobs upstream; no effect on results here).

    ``M_sum == 0`` is a no-op. Raises TypeError (types, dtypes, a recipe that is not a tuple of ints) or
    ValueError (shapes, scale shapes, recipes, K % 16 != 0, N, K or G == 0, extents >= 2^31, overlapping rows of
    d, grouped_layout values on CPU) before launch.
    """
    grouped_layout = _packed_index(grouped_layout)
    sig = _fp8_sig("contiguous", a, b, d, grouped_layout, (recipe, recipe_a, recipe_b, compiled_dims,
                                                           use_psum_layout, _MK_ALIGNMENT, _config, _CONTIG_SFA_COPY))
    run = _lookup(sig)
    if run is not None:  # same signature as a validated call: same verdict, launch directly
        run(a[0], a[1], b[0], b[1], d, grouped_layout)
        return
    check_tensor("grouped_layout", grouped_layout, ndim=1, dtype=torch.int32)
    a_data, sfa = _L.check_fp8_pair("a", a, 2)
    b_data, sfb = _L.check_fp8_pair("b", b, 3)
    _L.check_m_recipe(recipe, recipe_a, recipe_b)
    _store(sig, _contiguous(a_data, b_data, sfa, sfb, d, grouped_layout, use_psum_layout, True, compiled_dims,
                            _config))


def m_grouped_fp8_gemm_nn_contiguous(a, b, d: torch.Tensor, grouped_layout: torch.Tensor, recipe=None,
                                     recipe_a=None, recipe_b=None, compiled_dims: str = "nk",
                                     disable_ue8m0_cast: bool = False, use_psum_layout: bool = False,
                                     ensure_zero_padding: bool = True) -> None:
    """``d[i] = a[i] @ b[g(i)]`` with b ``([G, K, N], sfb [G, ceil(K/128), ceil(N/128)])``.

    DeepGEMM ``m_grouped_fp8_gemm_nn_contiguous``: the NT op on ``b`` (and its scales) transposed in the last two
    dims. FP8 wgmma needs K-major B, so B is copied to K-major first (upstream SM90 refuses this layout). Other
    arguments and errors as :func:`m_grouped_fp8_gemm_nt_contiguous` (shapes in errors are those of the NT form)."""
    if isinstance(b, (tuple, list)) and len(b) == 2 and all(isinstance(x, torch.Tensor) for x in b):
        b = (b[0].transpose(-1, -2), b[1].transpose(-1, -2))
    m_grouped_fp8_gemm_nt_contiguous(a, b, d, grouped_layout, recipe, recipe_a, recipe_b, compiled_dims,
                                     disable_ue8m0_cast, use_psum_layout, ensure_zero_padding)


def m_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
                                      grouped_layout: torch.Tensor, compiled_dims: str = "nk",
                                      use_psum_layout: bool = False, ensure_zero_padding: bool = True,
                                      expected_m_for_psum_layout=None, *, _config=None) -> None:
    """M-grouped contiguous BF16 GEMM (DeepGEMM ``m_grouped_bf16_gemm_nt_contiguous``).

    a ``[M_sum, K]`` bfloat16 K-major; b ``[G, N, K]`` bfloat16 (K-major, or MN-major: any view whose
    ``[G, K, N]`` transpose is row-major); d ``[M_sum, N]`` bfloat16/float32 row-major; K % 64 == 0.
    grouped_layout and padding rules as :func:`m_grouped_fp8_gemm_nt_contiguous`. FP32 accumulation.
    Raises TypeError (dtypes) or ValueError (shapes, K % 64, N / K / G == 0, extents, overlapping rows of d,
    grouped_layout values on CPU) before launch, as the FP8 op.
    """
    grouped_layout = _packed_index(grouped_layout)
    sig = _bf16_sig("contiguous", a, b, d, grouped_layout, (compiled_dims, use_psum_layout, _MK_ALIGNMENT, _config))
    run = _lookup(sig)
    if run is not None:
        run(a, None, b, None, d, grouped_layout)
        return
    check_tensor("a", a, ndim=2, dtype=torch.bfloat16)
    check_tensor("b", b, ndim=3, dtype=torch.bfloat16)
    b_kmajor = not (b.stride(-2) == 1 and b.stride(-1) != 1)
    _store(sig, _contiguous(a, b, None, None, d, grouped_layout, use_psum_layout, b_kmajor, compiled_dims, _config))


def m_grouped_bf16_gemm_nn_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
                                      grouped_layout: torch.Tensor, compiled_dims: str = "nk",
                                      use_psum_layout: bool = False, ensure_zero_padding: bool = True) -> None:
    """``d[i] = a[i] @ b[g(i)]`` with b ``[G, K, N]`` bfloat16 row-major (DeepGEMM ``..._nn_contiguous``; read
    MN-major, no copy). Other arguments and errors as :func:`m_grouped_bf16_gemm_nt_contiguous` (shapes in errors
    are those of the NT form, b as ``[G, N, K]``)."""
    check_tensor("b", b, ndim=3, dtype=torch.bfloat16)
    m_grouped_bf16_gemm_nt_contiguous(a, b.transpose(1, 2), d, grouped_layout, compiled_dims, use_psum_layout,
                                      ensure_zero_padding)


m_grouped_fp8_fp4_gemm_nt_contiguous = m_grouped_fp8_gemm_nt_contiguous
m_grouped_fp8_fp4_gemm_nn_contiguous = m_grouped_fp8_gemm_nn_contiguous


# ------------------------------------------------------------------------------------------- m-grouped masked
def _masked(a_data, b_data, sfa, sfb, d, masked_m, expected_m, compiled_dims, _config):
    is_fp8 = sfa is not None
    check_compiled_dims(compiled_dims)
    g_num, m_max, k = a_data.shape
    if b_data.dim() != 3 or b_data.shape[0] != g_num or b_data.shape[2] != k:
        raise ValueError(f"b must have shape [G={g_num}, N, K={k}] to match a {list(a_data.shape)}, "
                         f"got {list(b_data.shape)}")
    n = b_data.shape[1]
    if min(g_num, m_max, n, k) <= 0:
        raise ValueError(f"need G, M_max, N, K > 0 (DeepGEMM asserts), got a {list(a_data.shape)}, "
                         f"b {list(b_data.shape)}")
    if isinstance(expected_m, bool) or not isinstance(expected_m, numbers.Integral) or expected_m <= 0:
        raise ValueError(f"expected_m must be an int > 0 (a tuning hint; Python or NumPy integer), got "
                         f"{type(expected_m).__name__} {expected_m!r}")
    expected_m = int(expected_m)
    _L.check_out("d", d, [g_num, m_max, n], (torch.bfloat16, torch.float32))
    _L.check_index("masked_m", masked_m, [g_num], a_data.device)
    _check_no_alias(d, {"a[0]" if is_fp8 else "a": a_data, "a[1]": sfa, "b[0]" if is_fp8 else "b": b_data,
                        "b[1]": sfb, "masked_m": masked_m})
    if not is_fp8 and k % 64:
        raise ValueError(f"BF16 masked GEMMs need K % 64 == 0 (DeepGEMM SM90), got K = {k}")
    if is_fp8:
        from ..quant import check_sf_layout
        check_sf_layout(sfa, m_max, k, 1, 128, num_groups=g_num, name="a[1]")
        check_sf_layout(sfb, n, k, 128, 128, num_groups=g_num, name="b[1]")
        # read through its strides by the kernel (any layout): no per-call MN-major copy (a kernel launch + an
        # allocation per call, which also made the call's host path heavier); MN-major TMA-aligned is fastest
    _L.check_int32_extent("G * M_max", g_num * m_max)
    _L.check_int32_extent("G * N", g_num * n)
    if not use_kernels(a_data, b_data, d, masked_m, sfa, sfb):
        if is_fp8:
            _ref.m_grouped_fp8_gemm_masked_ref((a_data, sfa), (b_data, sfb), d, masked_m)
        else:
            _ref.m_grouped_bf16_gemm_masked_ref(a_data, b_data, d, masked_m)
        return None
    a_in, b_in = a_data, b_data
    a_data = _L.k_major("a[0]" if is_fp8 else "a", a_data)
    b_data = _L.k_major("b[0]" if is_fp8 else "b", b_data)
    gcfg = _gluon_masked_config(m_max, n, k, expected_m, is_fp8, d, _config)
    if gcfg is not None:
        plan = _GluonPlan(gcfg, True)
        plan(a_data, b_data, d, sfa, sfb, masked_m)
    else:
        plan = _L.launch_m_masked(a_data, b_data, d, masked_m, expected_m, sfa, sfb, _config)
    return plan if _same(a_data, a_in) and _same(b_data, b_in) else None


def m_grouped_fp8_gemm_nt_masked(a, b, d: torch.Tensor, masked_m: torch.Tensor, expected_m: int, recipe=None,
                                 recipe_a=None, recipe_b=None, compiled_dims: str = "nk",
                                 disable_ue8m0_cast: bool = False, *, _config=None) -> None:
    """M-grouped masked FP8 GEMM ``d[g, :m_g] = a[g, :m_g] @ b[g].T`` (DeepGEMM ``m_grouped_fp8_gemm_nt_masked``).

    Args:
        a: ``(A, sfa)``: A ``[G, M_max, K]`` float8_e4m3fn K-major (K % 16 == 0); sfa float32
            ``[G, M_max, ceil(K/128)]`` any layout (normalised to per-group MN-major TMA-aligned).
        b: ``(B, sfb)``: B ``[G, N, K]`` float8_e4m3fn K-major; sfb float32 ``[G, ceil(N/128), ceil(K/128)]``.
        d: ``[G, M_max, N]`` bfloat16 (or float32), last dim contiguous. Only rows ``< masked_m[g]`` are
            written; all other rows (other groups' included) are never touched.
        masked_m: int32 ``[G]`` on a's device, any stride (a strided view is packed first): valid rows per group
            (0 allowed; clamped to ``[0, M_max]``). Read on the device only, never on the host: the call can be
            captured in a CUDA graph and replayed with new counts (the grid depends on shapes only).
        expected_m: int > 0 (a Python int or NumPy integer; not bool), a tuning hint (tile height); never affects
            results.
        recipe / recipe_a / recipe_b, compiled_dims, disable_ue8m0_cast: as the contiguous op.

    Raises TypeError/ValueError before launch for bad types, shapes, scale shapes, recipes, expected_m <= 0,
    masked_m not int32 ``[G]`` on the same device, G/M_max/N/K == 0, or extents >= 2^31.
    """
    masked_m = _packed_index(masked_m)
    sig = _fp8_sig("masked", a, b, d, masked_m, (recipe, recipe_a, recipe_b, compiled_dims, _int(expected_m), _config))
    plan = _lookup(sig)
    if plan is not None:  # same signature as a validated call: same verdict, launch directly
        plan(a[0], b[0], d, a[1], b[1], masked_m)
        return
    a_data, sfa = _L.check_fp8_pair("a", a, 3)
    b_data, sfb = _L.check_fp8_pair("b", b, 3)
    _L.check_m_recipe(recipe, recipe_a, recipe_b)
    _store(sig, _masked(a_data, b_data, sfa, sfb, d, masked_m, expected_m, compiled_dims, _config))


def m_grouped_bf16_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, masked_m: torch.Tensor,
                                  expected_m: int, compiled_dims: str = "nk", *, _config=None) -> None:
    """M-grouped masked BF16 GEMM (DeepGEMM ``m_grouped_bf16_gemm_nt_masked``): a ``[G, M_max, K]``, b
    ``[G, N, K]`` bfloat16 K-major, K % 64 == 0; d, masked_m, expected_m as :func:`m_grouped_fp8_gemm_nt_masked`.
    Raises TypeError (a, b not bfloat16 3-D tensors; masked_m not int32) or ValueError (shapes, K % 64, extents,
    expected_m <= 0, overlapping groups of d) before launch, as the FP8 op."""
    masked_m = _packed_index(masked_m)
    sig = _bf16_sig("masked", a, b, d, masked_m, (compiled_dims, _int(expected_m), _config))
    plan = _lookup(sig)
    if plan is not None:
        plan(a, b, d, None, None, masked_m)
        return
    check_tensor("a", a, ndim=3, dtype=torch.bfloat16)
    check_tensor("b", b, ndim=3, dtype=torch.bfloat16)
    _store(sig, _masked(a, b, None, None, d, masked_m, expected_m, compiled_dims, _config))


m_grouped_fp8_fp4_gemm_nt_masked = m_grouped_fp8_gemm_nt_masked
fp8_m_grouped_gemm_nt_masked = m_grouped_fp8_gemm_nt_masked      # legacy name (spec §1.6)
bf16_m_grouped_gemm_nt_masked = m_grouped_bf16_gemm_nt_masked    # legacy name (spec §1.6)


# ------------------------------------------------------------------------------------------- k-grouped
def _ks_args(ks_cpu, grouped_layout, ks, ks_tensor, use_psum_layout, device):
    if ks is not None:
        if ks_cpu is not None:
            raise ValueError("pass ks_cpu or its old name ks, not both")
        ks_cpu = ks
    if ks_tensor is not None:
        if grouped_layout is not None:
            raise ValueError("pass grouped_layout or its old name ks_tensor, not both")
        grouped_layout = ks_tensor
    if use_psum_layout:
        raise ValueError("use_psum_layout=True is not supported by the SM90 k-grouped GEMMs (DeepGEMM asserts)")
    if not isinstance(ks_cpu, (list, tuple)) or len(ks_cpu) == 0 or \
            any(isinstance(x, bool) or not isinstance(x, numbers.Integral) for x in ks_cpu):
        raise TypeError(f"ks_cpu must be a non-empty list of ints (K of each group), got {ks_cpu!r}")
    ks_cpu = [int(x) for x in ks_cpu]   # NumPy ints as the ints they equal (upstream's pybind List[int] takes them)
    bad = [x for x in ks_cpu if x < 0 or x % 128]
    if bad:
        raise ValueError(f"every k_g must be >= 0 and a multiple of 128 (DeepGEMM SM90), got {list(ks_cpu)}")
    if grouped_layout is None:
        grouped_layout = torch.tensor(ks_cpu, dtype=torch.int32, device=device)
    _L.check_index("grouped_layout", grouped_layout, [len(ks_cpu)], device)
    if grouped_layout.device.type == "cpu" and grouped_layout.tolist() != list(ks_cpu):
        # upstream reads ks_cpu on the host and the tensor on the device; both must describe the same groups
        # (a device tensor is not compared: that would be a host sync on the hot path)
        raise ValueError(f"grouped_layout {grouped_layout.tolist()} disagrees with ks_cpu {list(ks_cpu)}: both give "
                         f"each group's K")
    return list(ks_cpu), grouped_layout


def _k_grouped(a_data, b_data, sfa, sfb, d, c, ks_cpu, grouped_layout, mn_major, compiled_dims, _config):
    is_fp8 = sfa is not None
    check_compiled_dims(compiled_dims)
    check_tensor("d", d, ndim=3, dtype=torch.float32)
    g_num, m, n = d.shape
    if g_num != len(ks_cpu):
        raise ValueError(f"d must have shape [G={len(ks_cpu)}, M, N] (one group per ks_cpu entry), got {list(d.shape)}")
    _L.check_out("d", d, [g_num, m, n], torch.float32)
    if c is not None:
        _L.check_out("c", c, [g_num, m, n], torch.float32)
        if c.data_ptr() == d.data_ptr() and c is not d and c.stride() != d.stride():
            # the kernels accumulate into d in place when c starts where d does (no copy): c must then be d's view
            raise ValueError(f"c (strides {list(c.stride())}) shares d's storage (strides {list(d.stride())}) but "
                             f"not its strides; pass c=d for in-place accumulation")
        if c.data_ptr() != d.data_ptr() and overlaps(c, d):
            raise ValueError(f"c (shape {list(c.shape)}, strides {list(c.stride())}) and d (strides "
                             f"{list(d.stride())}) overlap in memory without being the same view; pass c=d or "
                             f"separate buffers")
    _check_no_alias(d, {"a[0]" if is_fp8 else "a": a_data, "a[1]": sfa, "b[0]" if is_fp8 else "b": b_data,
                        "b[1]": sfb, "grouped_layout": grouped_layout})
    sum_k = sum(ks_cpu)
    sf_cols = sum(ceil_div(k, 128) for k in ks_cpu)
    name = "a[0]" if is_fp8 else "a"
    if mn_major:
        for nm, t, mn in ((name, a_data, m), (name.replace("a", "b"), b_data, n)):
            check_tensor(nm, t, ndim=2)
            if list(t.shape) != [sum_k, mn]:
                raise ValueError(f"{nm} must have shape [sum_k={sum_k}, {mn}], got {list(t.shape)}")
            if (mn * t.element_size()) % 16:
                raise ValueError(f"{nm} [sum_k, {mn}] needs 16-byte rows for TMA: {mn} must be a multiple of "
                                 f"{16 // t.element_size()}")
    else:
        for nm, t, mn in ((name, a_data, m), (name.replace("a", "b"), b_data, n)):
            if t.numel() != sum_k * mn:
                raise ValueError(f"{nm} must hold the per-group [{mn}, k_g] chunks: {mn} * sum_k = {sum_k * mn} "
                                 f"elements, got shape {list(t.shape)}")
    if is_fp8:
        want_a, want_b = ([sf_cols, m], [sf_cols, n]) if mn_major else ([m, sf_cols], [n, sf_cols])
        for nm, sf, want in (("a[1]", sfa, want_a), ("b[1]", sfb, want_b)):
            check_tensor(nm, sf, ndim=2, dtype=torch.float32)
            if list(sf.shape) != want:
                raise ValueError(f"{nm} must have shape {want} (per-token scales, sum ceil(k_g/128) = {sf_cols} "
                                 f"columns), got {list(sf.shape)}")
        if mn_major:  # the kernel indexes scales as [MN, sum_sf]
            sfa, sfb = sfa.T, sfb.T
    if not use_kernels(a_data, b_data, d, c, grouped_layout, sfa, sfb):
        if is_fp8:
            out = _ref.k_grouped_fp8_gemm_ref((a_data, sfa.T if mn_major else sfa),
                                              (b_data, sfb.T if mn_major else sfb),
                                              ks_cpu, c, m, n, "tn" if mn_major else "nt")
        else:
            out = _ref.k_grouped_bf16_gemm_ref(a_data, b_data, ks_cpu, c)
        d.copy_(out)
        return
    if m == 0 or n == 0:
        return
    if c is None:
        d.zero_()
    elif c.data_ptr() != d.data_ptr():
        d.copy_(c)
    if sum_k == 0:
        return
    a_data, b_data = a_data.contiguous(), b_data.contiguous()
    _L.check_int32_extent("sum_k", sum_k)
    _L.launch_k_grouped(a_data, b_data, d, grouped_layout, sum_k, sf_cols, mn_major, sfa, sfb, _config)


def k_grouped_fp8_gemm_nt_contiguous(a, b, d: torch.Tensor, ks_cpu=None, grouped_layout=None, c=None,
                                     recipe=(1, 1, 128), compiled_dims: str = "mn", use_psum_layout: bool = False,
                                     *, ks=None, ks_tensor=None, _config=None) -> None:
    """K-grouped FP8 GEMM ``d[g] = c[g] + A_g @ B_g.T`` (DeepGEMM SM90 ``k_grouped_fp8_gemm_nt_contiguous``).

    Args:
        a: ``(A, sfa)``: A float8_e4m3fn holding the per-group row-major ``[M, k_g]`` chunks back to back
            (``M * sum_k`` elements, any shape, e.g. 1-D); sfa float32 ``[M, sum_g ceil(k_g/128)]`` per-token
            scales, any strides (upstream: MN-major).
        b: ``(B, sfb)``: likewise with N.
        d: ``[G, M, N]`` float32 row-major; written in place.
        ks_cpu: list / tuple of G ints (Python or NumPy), each ``k_g >= 0`` and a multiple of 128 (0:
            ``d[g] = c[g]``). Old name: ``ks``.
        grouped_layout: int32 ``[G]`` on the device with the same values (old name ``ks_tensor``; None: built from
            ks_cpu). Offsets are derived from it on the device and clamped to the buffers.
        c: ``[G, M, N]`` float32 or None (zeros); ``c is d`` accumulates in place (a view of d's storage with
            other strides, or one overlapping d, is a ValueError).
        recipe: None or ``(1, 1, 128)`` (a tuple / list of ints). use_psum_layout: must be False (SM90).

    Deterministic: every output tile is owned by one program and summed in a fixed order (bit-identical runs).
    Raises TypeError/ValueError before launch for bad types, shapes, ks values or scale shapes.
    """
    a_data, sfa = _L.check_fp8_pair("a", a, None)
    b_data, sfb = _L.check_fp8_pair("b", b, None)
    _L.check_k_recipe(recipe)
    ks_cpu, grouped_layout = _ks_args(ks_cpu, grouped_layout, ks, ks_tensor, use_psum_layout, a_data.device)
    _k_grouped(a_data, b_data, sfa, sfb, d, c, ks_cpu, grouped_layout, False, compiled_dims, _config)


def k_grouped_fp8_gemm_tn_contiguous(a, b, d: torch.Tensor, ks_cpu=None, grouped_layout=None, c=None,
                                     recipe=(1, 1, 128), compiled_dims: str = "mn", use_psum_layout: bool = False,
                                     *, ks=None, ks_tensor=None, _config=None) -> None:
    """K-grouped FP8 GEMM ``d[g] = c[g] + A_g.T @ B_g`` (DeepGEMM ``k_grouped_fp8_gemm_tn_contiguous``, SM100
    upstream; here on SM90 too, with the operand transpose done in shared memory).

    a: ``(A [sum_k, M] float8_e4m3fn row-major, sfa float32 [sum_g ceil(k_g/128), M])`` (per-channel scales, e.g.
    :func:`deepkernels.quant.per_channel_cast_to_fp8` per group); b likewise with N. Other arguments as
    :func:`k_grouped_fp8_gemm_nt_contiguous`; M and N must give 16-byte rows (multiples of 16). Raises
    TypeError/ValueError before launch for bad types, shapes, ks values or scale shapes.
    """
    a_data, sfa = _L.check_fp8_pair("a", a, 2)
    b_data, sfb = _L.check_fp8_pair("b", b, 2)
    _L.check_k_recipe(recipe)
    ks_cpu, grouped_layout = _ks_args(ks_cpu, grouped_layout, ks, ks_tensor, use_psum_layout, a_data.device)
    _k_grouped(a_data, b_data, sfa, sfb, d, c, ks_cpu, grouped_layout, True, compiled_dims, _config)


def k_grouped_bf16_gemm_tn_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, ks_cpu=None,
                                      grouped_layout=None, c=None, compiled_dims: str = "mn",
                                      use_psum_layout: bool = False, *, ks=None, ks_tensor=None,
                                      _config=None) -> None:
    """K-grouped BF16 GEMM ``d[g] = c[g] + A_g.T @ B_g`` (DeepGEMM ``k_grouped_bf16_gemm_tn_contiguous``).

    a ``[sum_k, M]``, b ``[sum_k, N]`` bfloat16 row-major (group g owns rows ``[sum_{j<g} k_j, +k_g)``); d, c,
    ks_cpu, grouped_layout as :func:`k_grouped_fp8_gemm_nt_contiguous`; M and N multiples of 8 (16-byte rows).
    FP32 accumulation. Raises TypeError/ValueError before launch for bad types, shapes or ks values.
    """
    check_tensor("a", a, ndim=2, dtype=torch.bfloat16)
    check_tensor("b", b, ndim=2, dtype=torch.bfloat16)
    ks_cpu, grouped_layout = _ks_args(ks_cpu, grouped_layout, ks, ks_tensor, use_psum_layout, a.device)
    _k_grouped(a, b, None, None, d, c, ks_cpu, grouped_layout, True, compiled_dims, _config)
