"""MLA decode entry points: get_mla_metadata, FlashMLASchedMeta, flash_mla_with_kvcache (FlashMLA).

Semantics: FlashMLA ``flash_mla_interface.py`` at commit 9241ae3 (spec/mla.md §1.1-§1.2, §3, §4). The dense path
(no ``indices``) runs :mod:`deepkernels.mla._dense_decode_kernels` (split-KV) + :mod:`deepkernels.mla.combine`
with the device scheduler of :mod:`deepkernels.mla.metadata`; the sparse path (``indices`` given) is routed to
``deepkernels.mla.sparse_decode._sparse_decode_forward``. CPU tensors without ``TRITON_INTERPRET=1`` run the
PyTorch reference (:mod:`deepkernels.reference.mla`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from .._backend import interpret_mode, use_kernels
from .._validate import check_dtype, check_tensor
from .metadata import FIXED_OVERHEAD_BLOCKS, SCHED_BLOCK, compute_schedule

__all__ = ["FlashMLASchedMeta", "get_mla_metadata", "flash_mla_with_kvcache", "set_mla_num_sms"]

D_NOPE, D_PE = 512, 64

# Config table: (BLOCK_M, BLOCK_N, num_warps, num_stages, parts_per_sm[, flags]) by query rows per kv head
# (s_q * h_q / h_kv), keyed by the bucket 16 (<= 16 rows), 32 (<= 32), 64 (<= 64), 128 (more). flags (optional
# 6th element, a string): "p" one block-table load per KV tile (tile inside a page; ignored when BLOCK_N does not
# divide the page), "v" split the 512 output columns over 2 programs, "l" lazy rescale, "w" warp_specialize.
# Bandwidth path (<= 32 rows): rows padded to 16/32, 4 warps, several programs per SM so more KV bytes are in
# flight. Compute path: 64-row tiles, 8 warps (the 512-wide accumulator split over two warpgroups).
# H200 sweep of 2026-11-29 (benchmarks/mla_decode.py --sweep, benchmarks/results/mla_decode-h200.json, notes in
# benchmarks/notes/mla_decode.md): e.g. h_q=16 s_k=32K (16,32,4,3,2) 2538 GB/s vs (16,64,4,2,1) 1927; h_q=128
# (64,64,8,2,1) 230 TFLOPS vs (64,32,8,3,1) 168.
_CONFIGS = {
    16: (16, 32, 4, 3, 2),
    32: (32, 32, 4, 3, 2),
    64: (64, 64, 8, 2, 1),
    128: (64, 64, 8, 2, 1),
}
_NUM_SMS: Optional[int] = None
_POISON_OUTPUTS = False   # test knob: fill out/lse/accumulators with NaN before launch (checks every element is written)


def set_mla_num_sms(n: Optional[int]) -> None:
    """Override the SM count the MLA split-KV scheduler balances over (None: the device's count, or the GEMM
    knob :func:`deepkernels.set_num_sms` when that is set). FlashMLA has no such knob; the top-level
    ``set_num_sms`` is DeepGEMM's. Raises ValueError if < 1."""
    global _NUM_SMS
    if n is not None and int(n) < 1:
        raise ValueError(f"num_sms must be >= 1 or None, got {n}")
    _NUM_SMS = None if n is None else int(n)


def _num_sms(device: torch.device) -> int:
    if _NUM_SMS is not None:
        return _NUM_SMS
    from ..gemm import dense as _gemm_dense

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
    Reuse is valid only while ``cache_seqlens`` (and for sparse calls ``topk_length``) keep their values; a stale
    schedule is reused silently (never unsafely: kernels clamp every index it yields).
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
    ``flash_mla_with_kvcache``.
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
    rows, h_kv = int(vals["num_q_tokens_per_head_k"]), int(vals["num_heads_k"])
    if rows < 1 or h_kv < 1:
        raise ValueError(f"num_q_tokens_per_head_k and num_heads_k must be >= 1, got {rows}, {h_kv}")
    counts = seqlens
    if vals.get("topk") is not None:
        counts = torch.full_like(seqlens, int(vals["topk"]))
    return compute_schedule(counts, _num_sm_parts(seqlens.device, rows, h_kv))


def _sparse_route(**kw):
    try:
        from .sparse_decode import _sparse_decode_forward  # type: ignore[attr-defined]
    except ImportError:
        raise NotImplementedError("sparse / FP8 MLA decode (indices=...) is not implemented yet in deepkernels "
                                  "(deepkernels.mla.sparse_decode._sparse_decode_forward is missing)") from None
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
    if s_q < 1:
        raise ValueError(f"q must have s_q >= 1, got shape {list(q.shape)}")
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


def _get_schedule(meta, num_splits, cfg, cache_seqlens, device, rows, h_kv):
    if isinstance(meta, FlashMLASchedMeta):
        if num_splits is not None:
            raise ValueError("num_splits must be None when tile_scheduler_metadata is a FlashMLASchedMeta")
        if meta.have_initialized:
            if meta.config != cfg:
                raise ValueError(f"tile_scheduler_metadata was built for {meta.config}, reused with {cfg}; "
                                 "call get_mla_metadata() again for a new configuration")
            return meta.tile_scheduler_metadata, meta.num_splits
        sched, ns = compute_schedule(cache_seqlens, _num_sm_parts(device, rows, h_kv))
        meta.config, meta.tile_scheduler_metadata, meta.num_splits, meta.have_initialized = cfg, sched, ns, True
        return sched, ns
    if isinstance(meta, torch.Tensor):
        check_tensor("tile_scheduler_metadata", meta, ndim=2, dtype=torch.int32)
        if meta.shape[1] != 8 or meta.shape[0] < 1:
            raise ValueError(f"tile_scheduler_metadata must have shape [num_sm_parts, 8], got {list(meta.shape)}")
        check_tensor("num_splits", num_splits, ndim=1, dtype=torch.int32)
        if num_splits.shape[0] != cfg.b + 1:
            raise ValueError(f"num_splits must have shape [b + 1] = [{cfg.b + 1}], got {list(num_splits.shape)}")
        return meta.contiguous(), num_splits.contiguous()
    raise TypeError(f"tile_scheduler_metadata must come from get_mla_metadata(), got {type(meta).__name__}")


def _dense_launch(q, k_cache, block_table, cache_seqlens, sched, num_splits, scale, causal, config=None):
    import triton

    from ._dense_decode_kernels import _mla_decode_fwd_kernel
    from .combine import combine_splits_

    b, s_q, h_q, _ = q.shape
    nb, page, h_kv, _ = k_cache.shape
    group = h_q // h_kv
    rows = s_q * group
    config = config or _pick_config(rows)
    bm, bn, warps, stages = config[:4]
    flags = _config_flags(config)
    v_split = 2 if "v" in flags else 1
    tile_in_page = "p" in flags and page % bn == 0 and SCHED_BLOCK % bn == 0
    parts = sched.shape[0]
    m_blocks = triton.cdiv(rows, bm)
    out = torch.empty(b, s_q, h_q, D_NOPE, dtype=q.dtype, device=q.device)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    acc_rows = b + parts
    o_acc = torch.empty(acc_rows, s_q, h_q, D_NOPE, dtype=torch.float32, device=q.device)
    l_acc = torch.empty(acc_rows, s_q, h_q, dtype=torch.float32, device=q.device)
    if _POISON_OUTPUTS:
        for t in (out, lse, o_acc, l_acc):
            t.fill_(float("nan"))
    seqlens = cache_seqlens.contiguous()
    if block_table.stride(1) != 1:
        block_table = block_table.contiguous()
    grid = (parts * h_kv * m_blocks * v_split,)
    _mla_decode_fwd_kernel[grid](
        q, k_cache, block_table, seqlens, sched, num_splits, out, lse, o_acc, l_acc,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        block_table.stride(0), block_table.shape[1], nb,
        b, s_q, h_q, group, rows, m_blocks, h_kv, acc_rows,
        scale, scale * math.log2(math.e),
        CAUSAL=bool(causal and s_q > 1), PAGE=page, SBLOCK=SCHED_BLOCK, BLOCK_M=bm, BLOCK_N=bn,
        D_NOPE=D_NOPE, D_PE=D_PE, UPCAST=interpret_mode(), NUM_STAGES=stages,
        TILE_IN_PAGE=tile_in_page, V_SPLIT=v_split, LAZY_RESCALE="l" in flags, WARP_SPEC="w" in flags,
        num_warps=warps, num_stages=stages)
    combine_splits_(out, lse, o_acc, l_acc, num_splits)
    return out, lse


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
            (out-of-range entries are clamped, never faulting).
        cache_seqlens: ``[b]`` int32 (0 allowed: out 0, lse +inf).
        head_dim_v: must be 512. softmax_scale: default ``576 ** -0.5``.
        tile_scheduler_metadata: a ``FlashMLASchedMeta`` from ``get_mla_metadata()`` (filled on first use; reuse
            with another b, s_q, h_q, h_kv, page size or causal raises ValueError), or the legacy
            ``[num_sm_parts, 8]`` int32 tensor with ``num_splits [b + 1]`` int32.
        causal: bottom-right aligned (query i of s_q sees keys ``< seqlen - (s_q-1-i)``); ignored when s_q == 1.
    Sparse path (``indices [b, s_q, topk]`` int32): routed to ``deepkernels.mla.sparse_decode``.
    Returns:
        ``out [b, s_q, h_q, 512]`` in q's dtype and ``lse [b, h_q, s_q]`` fp32, **natural log**; a row with no key
        gives out 0 and lse +inf.
    Raises:
        TypeError/ValueError naming the argument for bad shapes, dtypes, strides or metadata;
        NotImplementedError for a sparse call when the sparse path is not available.
    """
    if indices is not None:
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
    if isinstance(k_cache, torch.Tensor) and isinstance(q, torch.Tensor) and k_cache.dtype != q.dtype and \
            is_fp8_kvcache:
        raise NotImplementedError("dense decode over an FP8 KV cache is not supported (FlashMLA neither); "
                                  "pass indices for sparse FP8 decode")
    _validate_dense(q, k_cache, block_table, cache_seqlens, head_dim_v)
    b, s_q, h_q, d = q.shape
    _, page, h_kv, _ = k_cache.shape
    causal = bool(causal) and s_q > 1
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    if not math.isfinite(scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    cfg = FlashMLASchedMeta.Config(b=b, s_q=s_q, h_q=h_q, page_block_size=page, h_k=h_kv, causal=causal,
                                   is_fp8_kvcache=bool(is_fp8_kvcache), topk=None, extra_page_block_size=None,
                                   extra_topk=None)
    dev = q.device
    rows = s_q * (h_q // h_kv)
    if b == 0 or h_q == 0:
        return (torch.zeros(b, s_q, h_q, head_dim_v, dtype=q.dtype, device=dev),
                torch.full((b, h_q, s_q), float("inf"), dtype=torch.float32, device=dev))
    kernels = use_kernels(q, k_cache, block_table, cache_seqlens)
    if not kernels:
        if isinstance(tile_scheduler_metadata, FlashMLASchedMeta):
            _get_schedule(tile_scheduler_metadata, num_splits, cfg, cache_seqlens, dev, rows, h_kv)
        from ..reference.mla import dense_decode
        return dense_decode(q, k_cache, block_table, cache_seqlens, head_dim_v, scale, causal)
    sched, ns = _get_schedule(tile_scheduler_metadata, num_splits, cfg, cache_seqlens, dev, rows, h_kv)
    return _dense_launch(q, k_cache, block_table, cache_seqlens, sched, ns, scale, causal)
