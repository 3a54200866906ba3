"""MLA decode entry points: get_mla_metadata, FlashMLASchedMeta, flash_mla_with_kvcache (FlashMLA).

Semantics: FlashMLA ``flash_mla_interface.py`` at commit 9241ae3 (docs/spec/mla.md §1.1-§1.2, §3, §4). The dense path
(no ``indices``) runs :mod:`deepkernels.mla._dense_decode_kernels` (split-KV) + :mod:`deepkernels.mla.combine`
with the device scheduler of :mod:`deepkernels.mla.metadata`; the sparse path (``indices`` given) is routed to
``deepkernels.mla.sparse_decode._sparse_decode_forward``. CPU tensors without ``TRITON_INTERPRET=1`` run the
PyTorch reference (:mod:`deepkernels.reference.mla`).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Optional

import torch

from .._backend import interpret_mode, use_kernels
from .._launch import KernelLauncher, cached_launcher, spec_key
from .._validate import check_dtype, check_flag, check_int, check_scale, check_tensor, rewrite_nonpositive_scale
from ..gemm import dense as _gemm_dense
from .metadata import FIXED_OVERHEAD_BLOCKS, SCHED_BLOCK, compute_schedule, resolve_schedule

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache", "set_mla_num_sms"]

D_NOPE, D_PE = 512, 64

# Config table: (BLOCK_M, BLOCK_N, num_warps, num_stages, parts_per_sm[, flags]) by query rows per kv head
# (s_q * h_q / h_kv), keyed by the bucket 16 (<= 16 rows), 32 (<= 32), 64 (<= 64), 128 (more). flags (optional
# 6th element, a string): "p" one block-table load per KV tile (tile inside a page; ignored when BLOCK_N does not
# divide the page), "v" split the 512 output columns over 2 programs, "l" lazy rescale, "w" warp_specialize.
# Bandwidth path (<= 32 rows): rows padded to 16/32, 4 warps, 2 programs per SM so more KV bytes are in flight.
# Compute path: 64-row tiles, 8 warps (the 512-wide accumulator split over two warpgroups).
# Chosen by the v2 H200 sweep: benchmarks/results/mla_decode-h200-v2-2026-11-29.json (run 2026-11-29T13:30,
# committed in 623fe1b; its provenance git_sha reads "unknown" (the device copy has no .git): the tree measured was
# e779f51, whose decode kernel/bench are those of dd99ba6). b=128, h_kv=1, varlen,
# s_k 4096 / 32768, every candidate passed the error gate (max |out - torch| <= 2e-3 < 4e-3). Per bucket, the
# config that wins (or ties within 1.2 %) at both s_k — one config per bucket, no s_k threshold needed:
#   16:  (16,64,4,3,2,p) 3020 / 3770 GB/s (v1 (16,32,4,3,2) 1984 / 2260; stages=4 ties)
#   32:  (32,32,4,3,2,p) h_q=32 1959 / 2435 GB/s, s_q=2 h_q=16 1892 / 2388 ((32,64,..,p) +0.4 % at h_q=32 32K only)
#   64:  (64,64,8,2,1,p) h_q=64 1566 / 2044 GB/s, s_q=2 h_q=32 1572 / 2052
#   128: (64,64,8,2,1,p) h_q=128 219.0 / 275.8 TFLOPS, s_q=2 h_q=128 240.4 / 284.0, s_q=2 h_q=64 220.3 / 273.5;
#        (128,32,8,2,1,pv) wins h_q=128 s_q=1 4K by 1.2 % (221.5) but loses 6 % at 32K and every s_q=2 row.
_CONFIGS = {
    16: (16, 64, 4, 3, 2, "p"),
    32: (32, 32, 4, 3, 2, "p"),
    64: (64, 64, 8, 2, 1, "p"),
    128: (64, 64, 8, 2, 1, "p"),
}
_NUM_SMS: Optional[int] = None
_POISON_OUTPUTS = False   # test knob: fill out/lse/accumulators with NaN before launch (checks every element is written)


def set_mla_num_sms(n: Optional[int]) -> None:
    """Override the SM count the MLA split-KV scheduler balances over. FlashMLA has no such knob (it always uses
    the device's count); this one follows DeepGEMM's ``set_num_sms`` (:func:`deepkernels.set_num_sms`) in
    validation and meaning: ``n`` must be an int (bool is not) or None, and ``0`` or ``None`` restores the default
    (the ``set_num_sms`` value when set, else the device's count; 4 under the interpreter without CUDA). One
    difference: the upper bound is 1024 whatever the device, because the count only sizes the schedule (more
    parts than SMs is legal: the tests use it to force many splits).

    Raises TypeError for a non-int (e.g. ``"3"``, ``2.5``, ``True``), ValueError outside ``[0, 1024]``.
    """
    global _NUM_SMS
    if n is None:
        _NUM_SMS = None
        return
    _gemm_dense._check_num_sms(n, cap=1024)
    _NUM_SMS = n or None


def _num_sms(device: torch.device) -> int:
    if _NUM_SMS is not None:
        return _NUM_SMS
    if _gemm_dense._NUM_SMS:
        return _gemm_dense._NUM_SMS
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 4  # interpreter: few parts keep CPU runs cheap while still exercising splits


def _rows_bucket(rows: int) -> int:
    return 16 if rows <= 16 else 32 if rows <= 32 else 64 if rows <= 64 else 128


def _pick_config(rows: int):
    return _CONFIGS[_rows_bucket(rows)]


def _config_flags(config) -> str:
    return config[5] if len(config) > 5 else ""


def _num_sm_parts(device, rows: int, h_kv: int, config=None) -> int:
    """Scheduler parts: ``num_sms * parts_per_sm`` programs in all, shared by the kv heads, the query-row blocks
    and (flag "v") the two output halves."""
    config = config or _pick_config(rows)
    bm, per_sm = config[0], config[4]
    m_blocks = -(-rows // bm) * (2 if "v" in _config_flags(config) else 1)
    return max(_num_sms(device) * per_sm // h_kv // m_blocks, 1)


@dataclass
class FlashMLASchedMeta:
    """Scheduling metadata, filled by the first ``flash_mla_with_kvcache`` call that uses it (FlashMLA contract).

    Fields: ``have_initialized``; ``config`` (the call configuration it was built for; later calls must match it,
    else ValueError); ``tile_scheduler_metadata [num_sm_parts, 8]`` int32; ``num_splits [b + 1]`` int32.
    Reuse with other ``cache_seqlens`` (sparse: ``topk_length`` / ``extra_topk_length``) values gives the right
    answer (unlike FlashMLA, whose docstring forbids it): the kernels clamp each split to the request's actual
    length and extend each request's last split to its actual end; only the load balance of the stale plan is lost.
    """

    @dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int
        causal: bool
        is_fp8_kvcache: bool
        topk: Optional[int]
        extra_page_block_size: Optional[int]
        extra_topk: Optional[int]

    have_initialized: bool = False
    config: Optional["FlashMLASchedMeta.Config"] = None
    tile_scheduler_metadata: Optional[torch.Tensor] = None
    num_splits: Optional[torch.Tensor] = None


def get_mla_metadata(*args, **kwargs):
    """Scheduling metadata for ``flash_mla_with_kvcache``; two call forms.

    Current (FlashMLA ≥ 2026-01): ``get_mla_metadata()`` (any arguments without a tensor are ignored) returns
    ``(FlashMLASchedMeta(), None)``; the schedule is computed on the device by the first decode call.

    Legacy (FlashMLA ≤ 2025-10): ``get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k,
    num_heads_q=None, is_fp8_kvcache=False, topk=None)`` with ``cache_seqlens [b]`` int32 returns
    ``(tile_scheduler_metadata [num_sm_parts, 8] int32, num_splits [b + 1] int32)`` computed on the seqlens'
    device without a host sync (for sparse calls, ``topk`` replaces the per-request length). Pass both back to
    ``flash_mla_with_kvcache``. ``num_q_tokens_per_head_k`` (``s_q * h_q // h_kv``) and ``num_heads_k`` are ints
    >= 1, ``num_heads_q`` None or an int >= 1, ``topk`` None or an int >= 0 (Python or NumPy ints; TypeError naming
    the argument for a float / str / bool, ValueError below the minimum); ``cache_seqlens`` int32 (TypeError).

    A schedule stays valid for any later lengths of the same batch (see ``FlashMLASchedMeta``): every request of
    the planned batch owns >= 1 split, split boundaries are clamped to the actual lengths at run time and the last
    split of each request runs to its actual end. If ``num_splits`` is padded for a larger batch (vLLM CUDA-graph
    replay: ``torch.cat([num_splits, num_splits[-1:]])``), the requests with no split give out 0 / lse +inf where
    they see no key (seqlen 0) and NaN otherwise (never silently wrong values).
    """
    seqlens = kwargs.get("cache_seqlens", args[0] if args else None)
    if not isinstance(seqlens, torch.Tensor):
        return FlashMLASchedMeta(), None
    rest = list(args[1:])
    names = ["num_q_tokens_per_head_k", "num_heads_k", "num_heads_q", "is_fp8_kvcache", "topk"]
    vals = dict(zip(names, rest))
    vals.update({k: v for k, v in kwargs.items() if k in names})
    if "num_q_tokens_per_head_k" not in vals or "num_heads_k" not in vals:
        raise TypeError("legacy get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, ...) needs "
                        "num_q_tokens_per_head_k and num_heads_k")
    check_tensor("cache_seqlens", seqlens, ndim=1, dtype=torch.int32)
    # integers as upstream's C++ signature takes them (Python / NumPy ints; a float, str or bool is a TypeError
    # naming the argument, not a silent int() truncation)
    rows = check_int("num_q_tokens_per_head_k", vals["num_q_tokens_per_head_k"], min_value=1)
    h_kv = check_int("num_heads_k", vals["num_heads_k"], min_value=1)
    if vals.get("num_heads_q") is not None:
        check_int("num_heads_q", vals["num_heads_q"], min_value=1)
    counts = seqlens
    if vals.get("topk") is not None:
        counts = torch.full_like(seqlens, check_int("topk", vals["topk"], min_value=0))
    return compute_schedule(counts, _num_sm_parts(seqlens.device, rows, h_kv))


def _sparse_route(**kw):
    from .sparse_decode import _sparse_decode_forward   # imported here: sparse_decode imports this module
    return _sparse_decode_forward(**kw)


def _validate_dense(q, k_cache, block_table, cache_seqlens, head_dim_v):
    check_tensor("q", q, ndim=4, dtype=(torch.bfloat16, torch.float16))
    check_tensor("k_cache", k_cache, ndim=4)
    check_dtype("k_cache", k_cache, q.dtype)
    check_tensor("block_table", block_table, ndim=2, dtype=torch.int32)
    check_tensor("cache_seqlens", cache_seqlens, ndim=1, dtype=torch.int32)
    b, s_q, h_q, d = q.shape
    nb, page, h_kv, dk = k_cache.shape
    if d != D_NOPE + D_PE:
        raise ValueError(f"q must have head dim d_qk = 576 (512 NoPE + 64 RoPE), got q shape {list(q.shape)}")
    if dk != d:
        raise ValueError(f"k_cache last dim must equal q's d_qk={d}, got k_cache shape {list(k_cache.shape)}")
    if head_dim_v != D_NOPE:
        raise ValueError(f"head_dim_v must be 512, got {head_dim_v}")
    if h_kv < 1 or h_q % h_kv != 0:
        raise ValueError(f"h_q={h_q} (q shape {list(q.shape)}) must be a multiple of h_kv={h_kv} "
                         f"(k_cache shape {list(k_cache.shape)})")
    if page < 1 or nb < 1:
        raise ValueError(f"k_cache must have >= 1 block and page_block_size >= 1, got shape {list(k_cache.shape)}")
    if q.stride(-1) != 1 or k_cache.stride(-1) != 1:
        raise ValueError(f"q and k_cache must have a contiguous last dim, got strides {q.stride()} / "
                         f"{k_cache.stride()}")
    if block_table.shape[0] != b or cache_seqlens.shape[0] != b:
        raise ValueError(f"block_table [b, *] and cache_seqlens [b] must have b={b} rows, got "
                         f"{list(block_table.shape)} and {list(cache_seqlens.shape)}")
    if block_table.shape[1] < 1 and b > 0:
        raise ValueError(f"block_table must have >= 1 column, got shape {list(block_table.shape)}")
    for name, t in (("q", q), ("k_cache", k_cache), ("block_table", block_table)):
        if any(st < 0 for st in t.stride()):
            raise ValueError(f"{name} has negative strides {t.stride()}")


def _check_legacy_metadata(meta, num_splits, b, device):
    """Checks of the legacy ``(tile_scheduler_metadata, num_splits)`` tensors (functions of their dtype, shape and
    device only): both on q's ``device`` (the kernels read them there; the reference ignored a mismatch and the
    kernel launch failed naming neither tensor)."""
    check_tensor("tile_scheduler_metadata", meta, ndim=2, dtype=torch.int32)
    if meta.shape[1] != 8 or meta.shape[0] < 1:
        raise ValueError(f"tile_scheduler_metadata must have shape [num_sm_parts, 8], got {list(meta.shape)}")
    check_tensor("num_splits", num_splits, ndim=1, dtype=torch.int32)
    if num_splits.shape[0] != b + 1:
        raise ValueError(f"num_splits must have shape [b + 1] = [{b + 1}], got {list(num_splits.shape)} "
                         "(tile_scheduler_metadata/num_splits planned for another batch?)")
    for name, t in (("tile_scheduler_metadata", meta), ("num_splits", num_splits)):
        if t.device != device:
            raise ValueError(f"{name} must be on q's device {device} (plan it with get_mla_metadata(cache_seqlens, "
                             f"...) on that device), got {t.device}")


def _check_metadata_empty(meta, num_splits, cfg, legacy, device):
    """Empty work (``b``, ``s_q`` or dense ``h_q`` == 0; dense and sparse paths): the metadata checks of a call with
    work (:func:`deepkernels.mla.metadata.resolve_schedule`: TypeError for an object not from ``get_mla_metadata``,
    ValueError for a ``FlashMLASchedMeta`` filled for another configuration or on another device, or given with
    ``num_splits``; ``legacy`` checks the legacy tensors), but a fresh ``FlashMLASchedMeta`` is left fresh (an empty
    call plans nothing; the next call with work fills it). Nothing is computed or launched; returns None."""
    if isinstance(meta, FlashMLASchedMeta) and not meta.have_initialized:
        meta = FlashMLASchedMeta()         # same checks on a throwaway object: the caller's stays unfilled
    resolve_schedule(meta, num_splits, cfg, lambda: (None, None), legacy, FlashMLASchedMeta, device)


def _get_schedule(meta, num_splits, cfg, cache_seqlens, device, rows, h_kv, legacy_checked=False, empty=False):
    """The (tile_scheduler_metadata, num_splits) pair of a call; validates the metadata argument (ValueError /
    TypeError naming it) and, for a fresh FlashMLASchedMeta, computes the schedule on the device
    (:func:`deepkernels.mla.metadata.resolve_schedule`, shared with the sparse path); ``empty``: see
    :func:`_check_metadata_empty`."""
    def legacy(m):
        if not isinstance(m, torch.Tensor):
            return None
        if not legacy_checked:
            _check_legacy_metadata(m, num_splits, cfg.b, device)
        return m.contiguous(), num_splits.contiguous()

    if empty:
        return _check_metadata_empty(meta, num_splits, cfg, legacy, device)
    return resolve_schedule(meta, num_splits, cfg,
                            lambda: compute_schedule(cache_seqlens, _num_sm_parts(device, rows, h_kv)), legacy,
                            FlashMLASchedMeta, device)


_MAIN_CONSTEXPRS = ("CAUSAL", "PAGE", "SBLOCK", "BLOCK_M", "BLOCK_N", "D_NOPE", "D_PE", "UPCAST", "NUM_STAGES",
                    "TILE_IN_PAGE", "V_SPLIT", "LAZY_RESCALE", "WARP_SPEC")
_LAUNCHERS: dict = {}
_LAUNCHER_LIMIT = 1024


def _main_launcher(fn, constexprs: tuple, warps: int, stages: int, spec) -> KernelLauncher:
    """KernelLauncher of the split-KV kernel for one specialisation ``spec`` (Triton's facts about the non-constexpr
    arguments: dtypes, 16-B alignment, ==1 / %16 of the specialised strides, i32 range). Keyed by the kernel
    object too, so a test's stand-in kernel (monkeypatched module attribute) is what gets called."""
    return cached_launcher(_LAUNCHERS, fn, (constexprs, warps, stages, spec),
                           lambda: dict(zip(_MAIN_CONSTEXPRS, constexprs), num_warps=warps, num_stages=stages),
                           _LAUNCHER_LIMIT)


def _dense_launch(q, k_cache, block_table, cache_seqlens, sched, num_splits, scale, causal, config=None,
                  _spec=None):
    """Launch split-KV kernel + combine (no validation; callers own the arguments). ``_spec``: a hashable object
    standing for the specialisation facts of every kernel argument except sched/num_splits/acc_rows (the public op
    passes its cached ``_CallPlan``: its signature fixes those facts); None computes them here with
    :func:`deepkernels._launch.spec_key`."""
    from . import _dense_decode_kernels as _ddk
    from .combine import combine_splits_

    b, s_q, h_q, _ = q.shape
    nb, page, h_kv, _ = k_cache.shape
    group = h_q // h_kv
    rows = s_q * group
    config_given = config                     # an explicit config (benchmarks, tests) always runs the Triton kernel
    config = config or _pick_config(rows)
    bm, bn, warps, stages = config[:4]
    flags = _config_flags(config)
    v_split = 2 if "v" in flags else 1
    tile_in_page = "p" in flags and page % bn == 0 and SCHED_BLOCK % bn == 0
    parts = sched.shape[0]
    m_blocks = -(-rows // bm)
    dev = q.device
    out = torch.empty(b, s_q, h_q, D_NOPE, dtype=q.dtype, device=dev)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=dev)
    acc_rows = b + parts
    o_acc = torch.empty(acc_rows, s_q, h_q, D_NOPE, dtype=torch.float32, device=dev)
    l_acc = torch.empty(acc_rows, s_q, h_q, dtype=torch.float32, device=dev)
    if _POISON_OUTPUTS:
        for t in (out, lse, o_acc, l_acc):
            t.fill_(float("nan"))
    seqlens = cache_seqlens.contiguous()
    if block_table.stride(1) != 1:
        block_table = block_table.contiguous()
    grid = (parts * h_kv * m_blocks * v_split,)
    qs, ks = q.stride(), k_cache.stride()
    ints = (qs[0], qs[1], qs[2], ks[0], ks[1], ks[2], block_table.stride(0), block_table.shape[1], nb,
            b, s_q, h_q, group, rows, m_blocks, h_kv, acc_rows)
    plan_spec = _spec          # the public op's cached plan (None for direct callers): also keys the combine
    if _spec is None:
        _spec = spec_key(q, k_cache, block_table, seqlens, out, lse, o_acc, l_acc, *ints)
    else:  # sched/num_splits/acc_rows are the only launch facts the public op's signature does not fix
        _spec = (_spec, acc_rows < 2 ** 31)
    spec = (_spec, sched.dtype, sched.data_ptr() & 15 == 0, num_splits.dtype, num_splits.data_ptr() & 15 == 0)
    constexprs = (bool(causal and s_q > 1), page, SCHED_BLOCK, bm, bn, D_NOPE, D_PE, interpret_mode(), stages,
                  tile_in_page, v_split, "l" in flags, "w" in flags)
    if config_given is None and _gluon_ok(q, k_cache, rows):
        # Gluon warp-specialised kernel (same schedule, outputs and combine): 1.98-2.41x the Triton kernel at
        # b=128 and rows >= 64, 1.1-2.0x its GB/s at h_q 16 / 32 (benchmarks/notes/mla_decode_gluon.md).
        # DEEPKERNELS_DISABLE_GLUON=1 keeps the Triton kernel.
        from . import _gluon_dense_decode as _gdd
        _gdd.gluon_dense_launch(q, k_cache, block_table, seqlens, sched, num_splits, scale, causal, out, lse,
                                o_acc, l_acc, _spec=spec)
        # (spec covers the Gluon kernel's arguments: the same tensors, k_cache's dtype for both descriptors, and
        # ints that are the Triton kernel's or, like num_m_blocks, unspecialised there: _gdd._NO_SPEC)
    else:
        launcher = _main_launcher(_ddk._mla_decode_fwd_kernel, constexprs, warps, stages, spec)
        launcher(grid, q, k_cache, block_table, seqlens, sched, num_splits, out, lse, o_acc, l_acc, *ints[:6],
                 *ints[6:], scale, scale * _LOG2E)
    # every request row is written: > 1 split combined; 0 splits (padded num_splits) -> empty or NaN (combine.py)
    combine_splits_(out, lse, o_acc, l_acc, num_splits, lengths=seqlens, causal=bool(causal and s_q > 1),
                    _spec=plan_spec)
    return out, lse


_LOG2E = math.log2(math.e)
_T = torch.Tensor


def _gluon_ok(q, k_cache, rows: int) -> bool:
    """Dense split-KV step on the Gluon kernel? (CUDA sm90, bf16/fp16, page 64, d 576, TMA-able k_cache, Gluon
    importable, DEEPKERNELS_DISABLE_GLUON unset; see ``_gluon_dense_decode.supported``)."""
    if not q.is_cuda:
        return False
    from . import _gluon_dense_decode as _gdd
    return _gdd.supported(q, k_cache, rows)


_PLANS: dict = {}
_PLAN_LIMIT = 1024


class _CallPlan:
    """One validated call signature of the dense public op (see :func:`_call_sig`)."""

    __slots__ = ("cfg", "rows", "h_kv", "kernels", "empty")   # hashed by identity: the launch-spec key


def _tsig(t: torch.Tensor) -> tuple:
    return (t.dtype, t.shape, t.stride(), t.device, t.data_ptr() & 15)


def _call_sig(q, k_cache, block_table, cache_seqlens, head_dim_v, meta, num_splits, causal, is_fp8_kvcache):
    """Hashable signature of a dense call: dtype/shape/strides/device/16-B alignment of every tensor, head_dim_v,
    causal, is_fp8_kvcache, the metadata kind (legacy tensors: their signature too), the interpreter flag and
    DEEPKERNELS_FORCE_REFERENCE (both decide the backend). Every
    argument check of the dense path is a function of it, so a signature that passed once passes again (its verdict
    is cached); it also fixes every specialisation fact of the launches except sched/num_splits (checked per call).
    None for unusual argument types (full path every time)."""
    try:
        if type(q) is not _T or type(k_cache) is not _T or type(block_table) is not _T or \
                type(cache_seqlens) is not _T or type(head_dim_v) is not int:
            return None
        if type(meta) is FlashMLASchedMeta:
            if num_splits is not None:
                return None
            msig = None
        elif type(meta) is _T and type(num_splits) is _T:
            msig = (_tsig(meta), _tsig(num_splits))
        else:
            return None
        sig = (_tsig(q), _tsig(k_cache), _tsig(block_table), _tsig(cache_seqlens), head_dim_v, bool(causal),
               bool(is_fp8_kvcache), msig, interpret_mode(),
               os.environ.get("DEEPKERNELS_FORCE_REFERENCE", "0") not in ("", "0"))
        hash(sig)
        return sig
    except Exception:
        return None


def flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                           num_splits=None, softmax_scale=None, causal=False, is_fp8_kvcache=False, indices=None,
                           attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None,
                           extra_topk_length=None):
    """MLA decode attention over a paged KV cache (FlashMLA ``flash_mla_with_kvcache``).

    Dense path (``indices is None``):
        q: ``[b, s_q, h_q, 576]`` bf16/fp16, last dim contiguous, other strides free.
        k_cache: ``[num_blocks, page_block_size, h_kv, 576]`` same dtype, last dim contiguous; V = ``k[..., :512]``.
            Any page_block_size is supported (FlashMLA requires 64); h_q % h_kv == 0.
        block_table: ``[b, max_blocks_per_seq]`` int32; only entries ``< ceil(seqlen / page_block_size)`` are read
            and they must be page ids in ``[0, num_blocks)``. CPU tensors are checked (ValueError); on CUDA an
            out-of-range id is clamped (never faulting; the result is then unspecified).
        cache_seqlens: ``[b]`` int32, each ``>= 0`` (0 allowed: out 0, lse +inf) and fitting its block-table row.
            Checked for CPU tensors (ValueError for a negative length or one past the row). On CUDA they are not
            checked (a host sync): a negative length counts as 0 (out 0, lse +inf) and the kernels stop at the
            row's end.
        head_dim_v: must be 512 (an int: Python or NumPy; a float, str or bool is a TypeError naming it).
        softmax_scale: default ``576 ** -0.5``; any finite value: ``s = (q . k) * softmax_scale`` as in the
            reference, so 0 gives uniform weights over the visible keys and a negative scale is exact too (the
            kernels run it as ``|scale|`` on ``-q``; one extra elementwise op on q). Non-finite: ValueError.
        tile_scheduler_metadata: a ``FlashMLASchedMeta`` from ``get_mla_metadata()`` (filled on first use; reuse
            with another b, s_q, h_q, h_kv, page size or causal raises ValueError), or the legacy
            ``[num_sm_parts, 8]`` int32 tensor with ``num_splits [b + 1]`` int32, both on q's device.
            **Reuse with other lengths is correct**: the schedule only balances work. Reused after
            ``cache_seqlens`` changed, each split's boundaries are clamped to the request's actual length and the
            last split of each request runs to its actual end, so growth is covered and shrinkage leaves empty
            splits (no host sync; the cost of a stale schedule is load balance only).
            A request that ``num_splits`` gives **no split** (legacy ``num_splits`` planned for a smaller batch and
            padded, the vLLM CUDA-graph pattern; the scheduler itself always gives every request >= 1 split) is
            written by the combine: out 0 / lse +inf for every query row that sees no key (e.g. a seqlen-0 padding
            row), and **NaN** out / lse for a query row that sees keys (it cannot be computed without a split; a
            plausible-looking wrong value never comes out). Plan such a batch with its real length to get values.
        causal: bottom-right aligned (query i of s_q sees keys ``< seqlen - (s_q-1-i)``); ignored when s_q == 1.
            A bool (NumPy bool, 0 / 1 and None = False accepted, as upstream's pybind bool); a str is a TypeError.

    Sparse path (``indices`` given; ``deepkernels.mla.sparse_decode``, FlashMLA sparse decode, docs/spec/mla.md §1.2):
        q: ``[b, s_q, h_q, d_qk]`` bf16, any strides; ``h_q`` in {16, 32, 64, 128}; ``d_qk`` set by the format.
        k_cache: FP8/FP4 byte cache ``[num_blocks, page_block_size, 1, bytes_per_token]`` (float8_e4m3fn, int8 or
            uint8 container, ``h_k == 1``, ``stride(1) == bytes_per_token``, any page_block_size). The format is
            read from bytes_per_token: 656 = DeepSeek V3.2 (d_qk 576: 512 e4m3 + 4 fp32 scales + 64 bf16 RoPE),
            584 = MODEL1 (d_qk 512: 448 e4m3 + 64 bf16 RoPE, UE8M0 scales), 528 = V4.1 (d_qk 512, e4m3 + 16 UE8M0
            scales); 288 = FP4 (e2m1 + e4m3 scales) is allowed only as the extra cache next to V4.1. Build caches
            with ``deepkernels.quantize_kv_cache``.
        block_table, cache_seqlens: ignored (may be None): indices address the cache directly.
        indices: ``[b, s_q, topk]`` int32, token slot ``page_block * page_block_size + offset`` in k_cache (seen
            as ``num_blocks * page_block_size`` slots); -1, any negative value and any value
            ``>= num_blocks * page_block_size`` are invalid: skipped, never read. Any ``topk >= 0``.
        topk_length: optional ``[b]`` int32: request i uses only its first ``clamp(topk_length[i], 0, topk)``
            indices (per request, shared by its s_q positions; 0 allowed).
        extra_k_cache / extra_indices_in_kvcache: optional second cache (same format, or FP4 next to V4.1) and its
            ``[b, s_q, extra_topk]`` int32 indices, attended in the **same** softmax; both or neither.
            extra_topk_length: optional ``[b]`` int32, like topk_length for the extra indices (needs extra_k_cache).
        attn_sink: optional ``[h_q]`` fp32: out *= ``exp(lse) / (exp(lse) + exp(sink))``; lse is unchanged;
            +inf gives out 0, -inf has no effect.
        is_fp8_kvcache must be True, causal must be False, head_dim_v must be 512; softmax_scale: default
            ``d_qk ** -0.5``, any finite value (as for dense).
        tile_scheduler_metadata: ``FlashMLASchedMeta`` as for dense (its config also records topk, extra page size
            and extra_topk); reuse after topk_length / extra_topk_length changed is correct (same clamping).
            Legacy tensors are accepted and re-planned from the actual lengths (num_splits is ignored).
        Batch-invariant mode: ``deepkernels.set_sparse_decode_batch_invariant(True)`` (or
        ``DEEPKERNELS_BATCH_INVARIANT=1``) turns split-KV off, so each request's result is bit-identical whatever
        else is in the batch (slower for small batches).
    Empty work: ``b == 0``, ``s_q == 0`` (dense and sparse) or ``h_q == 0`` (dense) returns empty ``out`` /
    ``lse`` of the shapes below without a launch (FlashMLA asserts ``b > 0``; a documented superset). The metadata
    argument is checked as for a call with work (TypeError for one not from ``get_mla_metadata``, ValueError for a
    ``FlashMLASchedMeta`` of another configuration or legacy tensors of another batch); a fresh
    ``FlashMLASchedMeta`` stays unfilled (the next call with work fills it).

    Returns:
        ``out [b, s_q, h_q, 512]`` in q's dtype and ``lse [b, h_q, s_q]`` fp32, **natural log** (sparse: the
        transposed view of a contiguous ``[b, s_q, h_q]``, strides ``(s_q*h_q, 1, h_q)``); a row with no key
        (no valid index) gives out 0 and lse +inf, with or without a sink.
    Raises:
        TypeError/ValueError naming the argument for bad shapes, dtypes, strides, formats, flags or metadata; a
        dense call over an FP8 cache is a TypeError (k_cache's dtype must be q's; FlashMLA's dense path has the
        same dtype check and ignores ``is_fp8_kvcache``), with a hint to pass ``indices``.
    """
    if type(head_dim_v) is not int:   # NumPy ints as the int they equal; float / str / bool: TypeError naming it
        head_dim_v = check_int("head_dim_v", head_dim_v)
    if type(causal) is not bool:      # NumPy bool / 0 / 1 / None as upstream's pybind bool; a str ("False") is a TypeError
        causal = check_flag("causal", causal)
    if indices is not None:
        if softmax_scale is not None:   # its type here (str, list, multi-element tensor: named error); finiteness there
            softmax_scale = check_scale("softmax_scale", softmax_scale, finite=False)
        return _sparse_route(q=q, k_cache=k_cache, indices=indices, head_dim_v=head_dim_v,
                             tile_scheduler_metadata=tile_scheduler_metadata, num_splits=num_splits,
                             softmax_scale=softmax_scale, is_fp8_kvcache=is_fp8_kvcache, attn_sink=attn_sink,
                             extra_k_cache=extra_k_cache, extra_indices_in_kvcache=extra_indices_in_kvcache,
                             topk_length=topk_length, extra_topk_length=extra_topk_length, causal=causal)
    for name, v in (("attn_sink", attn_sink), ("extra_k_cache", extra_k_cache),
                    ("extra_indices_in_kvcache", extra_indices_in_kvcache), ("topk_length", topk_length),
                    ("extra_topk_length", extra_topk_length)):
        if v is not None:
            raise ValueError(f"{name} is only supported with indices (sparse decode); got it without indices")
    sig = _call_sig(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits, causal,
                    is_fp8_kvcache)
    plan = None if sig is None else _PLANS.get(sig)
    if plan is None:
        plan = _validate_call(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata,
                              num_splits, causal, is_fp8_kvcache, sig)
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else check_scale("softmax_scale", softmax_scale)
    cfg = plan.cfg
    if plan.empty:   # the metadata is checked as for a call with work (a fresh one stays fresh); nothing launched
        _get_schedule(tile_scheduler_metadata, num_splits, cfg, cache_seqlens, q.device, plan.rows, plan.h_kv,
                      legacy_checked=True, empty=True)
        b, s_q, h_q, _ = q.shape
        return (torch.zeros(b, s_q, h_q, head_dim_v, dtype=q.dtype, device=q.device),
                torch.full((b, h_q, s_q), float("inf"), dtype=torch.float32, device=q.device))
    _check_host_pages(block_table, cache_seqlens, k_cache.shape[0], k_cache.shape[1])
    # metadata state (FlashMLASchedMeta: num_splits None, config of a reused schedule) is checked on every call,
    # on both backends; the legacy tensors' checks are part of the cached verdict.
    sched, ns = _get_schedule(tile_scheduler_metadata, num_splits, cfg, cache_seqlens, q.device, plan.rows,
                              plan.h_kv, legacy_checked=True)
    if not plan.kernels:
        from ..reference.mla import dense_decode
        return dense_decode(q, k_cache, block_table, cache_seqlens, head_dim_v, scale, cfg.causal)
    q, scale, exact = rewrite_nonpositive_scale(q, scale)   # scale <= 0: exact (kernel max in raw-score units)
    return _dense_launch(q, k_cache, block_table, cache_seqlens, sched, ns, scale, cfg.causal, None,
                         plan if sig is not None and exact else None)


def _check_host_pages(block_table, cache_seqlens, num_blocks: int, page: int) -> None:
    """Value checks that need the block table and lengths on the host, done only when both are CPU tensors (no
    device sync on the CUDA hot path): each length must fit its block-table row, and every entry a request reads
    (``j < ceil(len / page)``) must be a page id in ``[0, num_blocks)``; no length may be negative. On CUDA the
    kernels clamp page ids, stop at the row's end and count a negative length as 0 instead (never out of bounds;
    a bad page id's values are then unspecified)."""
    if block_table.device.type != "cpu" or cache_seqlens.device.type != "cpu":
        return
    neg = (cache_seqlens < 0).nonzero()
    if neg.numel():
        i = int(neg[0, 0])
        raise ValueError(f"cache_seqlens[{i}] = {int(cache_seqlens[i])} is negative (cache_seqlens shape "
                         f"{list(cache_seqlens.shape)}); a request with no cached token has length 0")
    cap = block_table.shape[1]
    need = (cache_seqlens.long().clamp(min=0) + page - 1) // page
    over = (need > cap).nonzero()
    if over.numel():
        i = int(over[0, 0])
        raise ValueError(f"cache_seqlens[{i}] = {int(cache_seqlens[i])} needs {int(need[i])} pages of {page} tokens but "
                         f"block_table {list(block_table.shape)} has {cap} columns per request")
    used = torch.arange(cap)[None, :] < need[:, None]
    bad = (used & ((block_table < 0) | (block_table >= num_blocks))).nonzero()
    if bad.numel():
        i, j = int(bad[0, 0]), int(bad[0, 1])
        raise ValueError(f"block_table[{i}, {j}] = {int(block_table[i, j])} is read (request {i} holds "
                         f"{int(cache_seqlens[i])} tokens) but is not a page id in [0, num_blocks={num_blocks})")


def _validate_call(q, k_cache, block_table, cache_seqlens, head_dim_v, meta, num_splits, causal, is_fp8_kvcache,
                   sig) -> _CallPlan:
    """Every argument check of the dense path that depends only on the call signature (all of them except the
    FlashMLASchedMeta state and softmax_scale), once per new signature; returns (and caches) the plan."""
    if isinstance(k_cache, torch.Tensor) and isinstance(q, torch.Tensor) and k_cache.dtype != q.dtype and \
            q.dtype in (torch.bfloat16, torch.float16):
        # FlashMLA's dense path ignores is_fp8_kvcache and requires k_cache.dtype == q.dtype: a dtype error,
        # whatever the flag says (docs/spec/mla.md §1.2)
        fp8 = k_cache.dtype in (torch.float8_e4m3fn, torch.int8, torch.uint8) or bool(is_fp8_kvcache)
        hint = ("; dense decode over an FP8 KV cache is not supported (FlashMLA neither): pass indices for sparse "
                "FP8 decode") if fp8 else ""
        raise TypeError(f"k_cache must have q's dtype {q.dtype} for dense decode (no indices), got {k_cache.dtype} "
                        f"(k_cache shape {list(k_cache.shape)}){hint}")
    _validate_dense(q, k_cache, block_table, cache_seqlens, head_dim_v)
    b, s_q, h_q, _ = q.shape
    _, page, h_kv, _ = k_cache.shape
    plan = _CallPlan()
    plan.cfg = FlashMLASchedMeta.Config(b=b, s_q=s_q, h_q=h_q, page_block_size=page, h_k=h_kv,
                                        causal=bool(causal) and s_q > 1, is_fp8_kvcache=bool(is_fp8_kvcache),
                                        topk=None, extra_page_block_size=None, extra_topk=None)
    plan.rows = s_q * (h_q // h_kv)
    plan.h_kv = h_kv
    plan.empty = b == 0 or h_q == 0 or s_q == 0
    plan.kernels = use_kernels(q, k_cache, block_table, cache_seqlens)
    # empty work too (b, s_q or h_q == 0): the metadata argument is checked as for a call with work
    if isinstance(meta, torch.Tensor):
        _check_legacy_metadata(meta, num_splits, b, q.device)
    elif not isinstance(meta, FlashMLASchedMeta):
        raise TypeError(f"tile_scheduler_metadata must come from get_mla_metadata(), got {type(meta).__name__}")
    if sig is not None:
        if len(_PLANS) >= _PLAN_LIMIT:
            _PLANS.clear()
        _PLANS[sig] = plan
    return plan
