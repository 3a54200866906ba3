"""``torch.library`` custom ops over the public deepkernels functions, for ``torch.compile`` and CUDA graphs.

``import deepkernels.ops`` registers the ops below in the ``deepkernels`` namespace; call them as
``torch.ops.deepkernels.<name>(...)`` (or through the Python functions of this module, which are the op objects).
Each op calls the public function of the same name (docs/DESIGN.md: public op -> backend dispatch), so CUDA tensors
run the Triton kernels and CPU tensors the PyTorch reference, exactly as the public function does; validation
errors are the public function's. Every op has a fake (meta) implementation giving the output shapes, dtypes and
strides without running anything, so ``torch.compile(fullgraph=True)`` traces through the ops instead of breaking
the graph, and ``torch.library.opcheck`` passes on them (tests/test_ops.py).

Differences from the public functions (torch.library schemas take tensors, ints, floats, bools, lists and
optionals, not tuples of tensors or Python objects):

- FP8 operands are split: ``(A, sfa)`` becomes ``a_data, sfa``; ``(B, sfb)`` becomes ``b_data, sfb``.
- DeepGEMM-style GEMMs write ``d`` in place and return nothing (``mutates_args=("d",)``; ``d`` is the only
  argument written). ``c=d`` (in-place accumulation, as upstream) works in eager mode and under
  ``torch.compile`` (functionalisation hands the op a copy of ``d`` to write and the old ``d`` as ``c``).
- Compatibility-only arguments with no effect on results (``compiled_dims``, ``disable_ue8m0_cast``,
  ``ensure_zero_padding``, ``expected_m_for_psum_layout``, ``is_varlen``) are left out; ``dropout_p`` (must be 0)
  and ``deterministic`` (must be False) are left out of ``flash_attn_varlen_func``.
- MLA decode takes the *legacy* tensor metadata: ``get_mla_metadata`` (op) returns ``(tile_scheduler_metadata
  [num_sm_parts, 8] int32, num_splits [b + 1] int32)`` computed on the device; ``flash_mla_with_kvcache`` (op) is
  the dense path with those two tensors. The current-API ``FlashMLASchedMeta`` object (a mutable Python object
  filled on first use) cannot cross a ``torch.library`` boundary. The sparse path is the separate op
  ``flash_mla_with_kvcache_sparse`` (the public function re-plans the legacy tensors on the device in sparse
  mode, so they are optional and unused there: without them the op passes a fresh ``get_mla_metadata()`` object,
  as the public function requires metadata on both paths).
- Output layouts are those of the public functions and are fixed per op (the fake implementation promises
  them); if a backend ever returns another layout the op copies into the promised one. ``lse`` of
  ``flash_attn_varlen_func`` is ``[total_q, h]`` with strides ``(1, total_q)`` (the transposed view of a
  contiguous ``[h, total_q]``, as upstream); ``lse`` of ``flash_mla_with_kvcache_sparse`` is ``[b, h_q, s_q]``
  with strides ``(s_q*h_q, 1, h_q)`` (transposed view of ``[b, s_q, h_q]``, as upstream); every other output is
  contiguous.
- Forward only: no autograd formula is registered (the public ops have none); backward through an op raises.

``get_mla_metadata``'s first output has ``num_sm_parts`` rows, a function of the device's SM count, of
``num_q_tokens_per_head_k`` / ``num_heads_k`` and of the ``set_num_sms`` / ``set_mla_num_sms`` knobs at *trace*
time: change those knobs before compiling, not after (a compiled graph keeps the row count it was traced with).

Not registered: the ``nn``/``tn``/``tt`` GEMM variants (transposed views onto the NT ops: transpose the inputs
and call the NT op), the k-grouped GEMMs, and the ``FlashMLASchedMeta`` call form (see above).
"""
from typing import List, Optional, Sequence, Tuple

import torch

from .gemm import dense as _dense, grouped as _grouped
from .mla import decode as _decode, dense_prefill as _dense_prefill, prefill as _prefill

__all__ = [
    "fp8_gemm_nt", "bf16_gemm_nt",
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_bf16_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked", "m_grouped_bf16_gemm_nt_masked",
    "get_mla_metadata", "flash_mla_with_kvcache", "flash_mla_with_kvcache_sparse",
    "flash_mla_sparse_fwd", "flash_attn_varlen_func",
    "OPS",
]

_NS = "deepkernels"
_D_V = 512  # MLA value head dim (FlashMLA); the public ops reject anything else


# --------------------------------------------------------------------------------------------- layout helpers
def _contiguous_strides(sizes: Sequence[int]) -> Tuple[int, ...]:
    """PyTorch's contiguous strides (a size-0/1 dim counts as 1 for the strides of the dims before it)."""
    strides, acc = [], 1
    for s in reversed(list(sizes)):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def _empty_t(sizes_hm, dtype, device):
    """Transposed view (last two dims swapped) of a contiguous ``sizes_hm`` buffer."""
    return torch.empty(sizes_hm, dtype=dtype, device=device).transpose(-1, -2)


def _contig(t: torch.Tensor) -> torch.Tensor:
    if t.stride() == _contiguous_strides(t.shape):
        return t
    out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def _transposed(t: torch.Tensor) -> torch.Tensor:
    """``t`` in the layout 'transposed view of a contiguous buffer' (last two dims)."""
    want = _contiguous_strides(list(t.shape[:-2]) + [t.shape[-1], t.shape[-2]])
    want = want[:-2] + (want[-1], want[-2])
    if t.stride() == want:
        return t
    out = _empty_t(list(t.shape[:-2]) + [t.shape[-1], t.shape[-2]], t.dtype, t.device)
    out.copy_(t)
    return out


def _recipe(recipe: Optional[Sequence[int]]):
    return None if recipe is None else tuple(int(x) for x in recipe)


# --------------------------------------------------------------------------------------------- dense GEMMs
@torch.library.custom_op(f"{_NS}::fp8_gemm_nt", mutates_args=("d",))
def fp8_gemm_nt(a_data: torch.Tensor, sfa: torch.Tensor, b_data: torch.Tensor, sfb: torch.Tensor, d: torch.Tensor,
                c: Optional[torch.Tensor] = None, recipe: Optional[List[int]] = None,
                recipe_a: Optional[List[int]] = None, recipe_b: Optional[List[int]] = None) -> None:
    """``d = c + a @ b.T`` in place (:func:`deepkernels.fp8_gemm_nt` with ``a=(a_data, sfa)``, ``b=(b_data, sfb)``).

    a_data ``[M, K]`` / b_data ``[N, K]`` float8_e4m3fn K-major; sfa ``[M, ceil(K/128)]`` float32 (or packed
    UE8M0 int32); sfb ``[ceil(N/128), ceil(K/128)]`` or ``[N, ceil(K/128)]`` float32 (or packed int32);
    d ``[M, N]`` bf16/fp32 row-major (mutated); c optional like d (``c=d`` accumulates); recipe None,
    ``[1, 128, 128]`` or ``[1, 1, 128]``, or upstream's per-operand spelling ``recipe_a`` + ``recipe_b``
    (``[1, 128]`` + ``[128, 128]`` or ``[1, 128]`` + ``[1, 128]``; together, not with ``recipe``)."""
    _dense.fp8_gemm_nt((a_data, sfa), (b_data, sfb), d, c, _recipe(recipe), _recipe(recipe_a), _recipe(recipe_b))


@fp8_gemm_nt.register_fake
def _(a_data, sfa, b_data, sfb, d, c=None, recipe=None, recipe_a=None, recipe_b=None) -> None:
    return None


@torch.library.custom_op(f"{_NS}::bf16_gemm_nt", mutates_args=("d",))
def bf16_gemm_nt(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, c: Optional[torch.Tensor] = None) -> None:
    """``d = c + a @ b.T`` in place (:func:`deepkernels.bf16_gemm_nt`): a ``[M, K]``, b ``[N, K]`` bf16; d ``[M, N]``
    bf16/fp32 (mutated); c optional like d (``c=d`` accumulates)."""
    _dense.bf16_gemm_nt(a, b, d, c)


@bf16_gemm_nt.register_fake
def _(a, b, d, c=None) -> None:
    return None


# --------------------------------------------------------------------------------------------- grouped GEMMs
@torch.library.custom_op(f"{_NS}::m_grouped_fp8_gemm_nt_contiguous", mutates_args=("d",))
def m_grouped_fp8_gemm_nt_contiguous(a_data: torch.Tensor, sfa: torch.Tensor, b_data: torch.Tensor,
                                     sfb: torch.Tensor, d: torch.Tensor, grouped_layout: torch.Tensor,
                                     use_psum_layout: bool = False, recipe: Optional[List[int]] = None,
                                     recipe_a: Optional[List[int]] = None,
                                     recipe_b: Optional[List[int]] = None) -> None:
    """:func:`deepkernels.m_grouped_fp8_gemm_nt_contiguous`: a_data ``[M_sum, K]`` fp8 + sfa ``[M_sum, ceil(K/128)]``;
    b_data ``[G, N, K]`` fp8 + sfb ``[G, ceil(N/128), ceil(K/128)]``; d ``[M_sum, N]`` (mutated, every row);
    grouped_layout int32 ``[M_sum]`` group ids (-1 padding) or ``[G]`` psum ends (``use_psum_layout``); recipe /
    recipe_a + recipe_b as the public function."""
    _grouped.m_grouped_fp8_gemm_nt_contiguous((a_data, sfa), (b_data, sfb), d, grouped_layout, _recipe(recipe),
                                              _recipe(recipe_a), _recipe(recipe_b), use_psum_layout=use_psum_layout)


@m_grouped_fp8_gemm_nt_contiguous.register_fake
def _(a_data, sfa, b_data, sfb, d, grouped_layout, use_psum_layout=False, recipe=None, recipe_a=None,
      recipe_b=None) -> None:
    return None


@torch.library.custom_op(f"{_NS}::m_grouped_bf16_gemm_nt_contiguous", mutates_args=("d",))
def m_grouped_bf16_gemm_nt_contiguous(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor,
                                      grouped_layout: torch.Tensor, use_psum_layout: bool = False) -> None:
    """:func:`deepkernels.m_grouped_bf16_gemm_nt_contiguous`: a ``[M_sum, K]``, b ``[G, N, K]`` bf16, K % 64 == 0;
    d ``[M_sum, N]`` (mutated); grouped_layout as the FP8 op."""
    _grouped.m_grouped_bf16_gemm_nt_contiguous(a, b, d, grouped_layout, use_psum_layout=use_psum_layout)


@m_grouped_bf16_gemm_nt_contiguous.register_fake
def _(a, b, d, grouped_layout, use_psum_layout=False) -> None:
    return None


@torch.library.custom_op(f"{_NS}::m_grouped_fp8_gemm_nt_masked", mutates_args=("d",))
def m_grouped_fp8_gemm_nt_masked(a_data: torch.Tensor, sfa: torch.Tensor, b_data: torch.Tensor, sfb: torch.Tensor,
                                 d: torch.Tensor, masked_m: torch.Tensor, expected_m: int,
                                 recipe: Optional[List[int]] = None, recipe_a: Optional[List[int]] = None,
                                 recipe_b: Optional[List[int]] = None) -> None:
    """:func:`deepkernels.m_grouped_fp8_gemm_nt_masked`: a_data ``[G, M_max, K]`` fp8 + sfa
    ``[G, M_max, ceil(K/128)]``; b_data ``[G, N, K]`` fp8 + sfb ``[G, ceil(N/128), ceil(K/128)]``; d
    ``[G, M_max, N]`` (mutated: rows ``< masked_m[g]`` only); masked_m int32 ``[G]`` on the device (never read on
    the host); expected_m int > 0, a tuning hint; recipe / recipe_a + recipe_b as the public function."""
    _grouped.m_grouped_fp8_gemm_nt_masked((a_data, sfa), (b_data, sfb), d, masked_m, expected_m, _recipe(recipe),
                                          _recipe(recipe_a), _recipe(recipe_b))


@m_grouped_fp8_gemm_nt_masked.register_fake
def _(a_data, sfa, b_data, sfb, d, masked_m, expected_m, recipe=None, recipe_a=None, recipe_b=None) -> None:
    return None


@torch.library.custom_op(f"{_NS}::m_grouped_bf16_gemm_nt_masked", mutates_args=("d",))
def m_grouped_bf16_gemm_nt_masked(a: torch.Tensor, b: torch.Tensor, d: torch.Tensor, masked_m: torch.Tensor,
                                  expected_m: int) -> None:
    """:func:`deepkernels.m_grouped_bf16_gemm_nt_masked`: a ``[G, M_max, K]``, b ``[G, N, K]`` bf16, K % 64 == 0;
    d, masked_m, expected_m as the FP8 op."""
    _grouped.m_grouped_bf16_gemm_nt_masked(a, b, d, masked_m, expected_m)


@m_grouped_bf16_gemm_nt_masked.register_fake
def _(a, b, d, masked_m, expected_m) -> None:
    return None


# --------------------------------------------------------------------------------------------- MLA decode
def _num_sm_parts(device: torch.device, rows: int, h_kv: int) -> int:
    return _decode._num_sm_parts(device, rows, h_kv)


@torch.library.custom_op(f"{_NS}::get_mla_metadata", mutates_args=())
def get_mla_metadata(cache_seqlens: torch.Tensor, num_q_tokens_per_head_k: int, num_heads_k: int,
                     topk: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    """Legacy :func:`deepkernels.get_mla_metadata` form: ``(tile_scheduler_metadata [num_sm_parts, 8] int32,
    num_splits [b + 1] int32)`` on cache_seqlens' device, computed there without a host sync.
    ``num_q_tokens_per_head_k = s_q * h_q // h_kv``; ``topk`` (sparse) replaces the per-request lengths."""
    meta, ns = _decode.get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, topk=topk)
    return _contig(meta), _contig(ns)


@get_mla_metadata.register_fake
def _(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, topk=None):
    # the real op's range checks first (a 0 here was a ZeroDivisionError in _num_sm_parts under torch.compile)
    for name, v in (("num_q_tokens_per_head_k", num_q_tokens_per_head_k), ("num_heads_k", num_heads_k)):
        if int(v) < 1:
            raise ValueError(f"{name} must be >= 1, got {int(v)}")
    parts = _num_sm_parts(cache_seqlens.device, int(num_q_tokens_per_head_k), int(num_heads_k))
    b = cache_seqlens.shape[0]
    return (cache_seqlens.new_empty((parts, 8), dtype=torch.int32),
            cache_seqlens.new_empty((b + 1,), dtype=torch.int32))


@torch.library.custom_op(f"{_NS}::flash_mla_with_kvcache", mutates_args=())
def flash_mla_with_kvcache(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor,
                           cache_seqlens: torch.Tensor, head_dim_v: int, tile_scheduler_metadata: torch.Tensor,
                           num_splits: torch.Tensor, softmax_scale: Optional[float] = None,
                           causal: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Dense MLA decode (:func:`deepkernels.flash_mla_with_kvcache` without ``indices``), legacy metadata tensors.

    q ``[b, s_q, h_q, 576]`` bf16/fp16; k_cache ``[num_blocks, page_block_size, h_kv, 576]``; block_table
    ``[b, max_blocks]`` int32; cache_seqlens ``[b]`` int32; head_dim_v 512; tile_scheduler_metadata / num_splits
    from the ``get_mla_metadata`` op (``num_q_tokens_per_head_k = s_q * h_q // h_kv``). Returns ``out [b, s_q,
    h_q, 512]`` (q's dtype) and ``lse [b, h_q, s_q]`` fp32 natural log, both contiguous."""
    out, lse = _decode.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, head_dim_v,
                                              tile_scheduler_metadata, num_splits, softmax_scale, causal)
    return _contig(out), _contig(lse)


@flash_mla_with_kvcache.register_fake
def _(q, k_cache, block_table, cache_seqlens, head_dim_v, tile_scheduler_metadata, num_splits, softmax_scale=None,
      causal=False):
    b, s_q, h_q, _ = q.shape
    return q.new_empty((b, s_q, h_q, head_dim_v)), q.new_empty((b, h_q, s_q), dtype=torch.float32)


@torch.library.custom_op(f"{_NS}::flash_mla_with_kvcache_sparse", mutates_args=())
def flash_mla_with_kvcache_sparse(q: torch.Tensor, k_cache: torch.Tensor, indices: torch.Tensor, head_dim_v: int,
                                  tile_scheduler_metadata: Optional[torch.Tensor] = None,
                                  num_splits: Optional[torch.Tensor] = None, softmax_scale: Optional[float] = None,
                                  attn_sink: Optional[torch.Tensor] = None,
                                  extra_k_cache: Optional[torch.Tensor] = None,
                                  extra_indices_in_kvcache: Optional[torch.Tensor] = None,
                                  topk_length: Optional[torch.Tensor] = None,
                                  extra_topk_length: Optional[torch.Tensor] = None
                                  ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sparse MLA decode over an FP8/FP4 cache (:func:`deepkernels.flash_mla_with_kvcache` with ``indices``,
    ``is_fp8_kvcache=True``, ``causal=False``). The legacy metadata tensors are accepted and unused (the
    public op re-plans on the device in sparse mode). Returns ``out [b, s_q, h_q, 512]`` bf16 and
    ``lse [b, h_q, s_q]`` fp32 natural log, strides ``(s_q*h_q, 1, h_q)`` (transposed view, as upstream).
    Without metadata (None: a ``FlashMLASchedMeta`` cannot cross the op boundary) the op plans with a fresh
    ``get_mla_metadata()`` object, which the public function requires (a ``num_splits`` alone is unused there)."""
    if tile_scheduler_metadata is None:
        tile_scheduler_metadata, num_splits = _decode.get_mla_metadata()   # (FlashMLASchedMeta(), None)
    out, lse = _decode.flash_mla_with_kvcache(
        q, k_cache, None, None, head_dim_v, tile_scheduler_metadata, num_splits, softmax_scale, False, True,
        indices=indices, attn_sink=attn_sink, extra_k_cache=extra_k_cache,
        extra_indices_in_kvcache=extra_indices_in_kvcache, topk_length=topk_length,
        extra_topk_length=extra_topk_length)
    return _contig(out), _transposed(lse)


@flash_mla_with_kvcache_sparse.register_fake
def _(q, k_cache, indices, head_dim_v, tile_scheduler_metadata=None, num_splits=None, softmax_scale=None,
      attn_sink=None, extra_k_cache=None, extra_indices_in_kvcache=None, topk_length=None, extra_topk_length=None):
    b, s_q, h_q, _ = q.shape
    return (q.new_empty((b, s_q, h_q, _D_V)), _empty_t((b, s_q, h_q), torch.float32, q.device))


# --------------------------------------------------------------------------------------------- MLA prefill
@torch.library.custom_op(f"{_NS}::flash_mla_sparse_fwd", mutates_args=())
def flash_mla_sparse_fwd(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float,
                         d_v: int = 512, attn_sink: Optional[torch.Tensor] = None,
                         topk_length: Optional[torch.Tensor] = None
                         ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse top-k MLA prefill (:func:`deepkernels.flash_mla_sparse_fwd`): q ``[s_q, h_q, d_qk]``, kv
    ``[s_kv, 1, d_qk]`` bf16, indices ``[s_q, 1, topk]`` int32. Returns ``out [s_q, h_q, 512]`` bf16,
    ``max_logits [s_q, h_q]`` and ``lse [s_q, h_q]`` fp32 (natural log), all contiguous."""
    out, max_logits, lse = _prefill.flash_mla_sparse_fwd(q, kv, indices, sm_scale, d_v, attn_sink, topk_length)
    return _contig(out), _contig(max_logits), _contig(lse)


@flash_mla_sparse_fwd.register_fake
def _(q, kv, indices, sm_scale, d_v=512, attn_sink=None, topk_length=None):
    s_q, h_q, _ = q.shape
    return (q.new_empty((s_q, h_q, d_v)), q.new_empty((s_q, h_q), dtype=torch.float32),
            q.new_empty((s_q, h_q), dtype=torch.float32))


@torch.library.custom_op(f"{_NS}::flash_attn_varlen_func", mutates_args=())
def flash_attn_varlen_func(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens_qo: torch.Tensor,
                           cu_seqlens_kv: torch.Tensor, max_seqlen_qo: int, max_seqlen_kv: int,
                           softmax_scale: Optional[float] = None, causal: bool = False
                           ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Dense varlen prefill (:func:`deepkernels.flash_attn_varlen_func`, ``dropout_p=0``, not deterministic):
    q ``[total_q, h, d_qk]``, k ``[total_k, h_k, d_qk]``, v ``[total_k, h_k, 128]``; cu_seqlens int32 ``[b + 1]``.
    Returns ``out [total_q, h, 128]`` (contiguous) and ``lse [total_q, h]`` fp32 natural log with strides
    ``(1, total_q)``: the transposed view of a contiguous ``[h, total_q]``, as upstream."""
    out, lse = _dense_prefill.flash_attn_varlen_func(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo,
                                                     max_seqlen_kv, 0.0, softmax_scale, causal)
    return _contig(out), _transposed(lse)


@flash_attn_varlen_func.register_fake
def _(q, k, v, cu_seqlens_qo, cu_seqlens_kv, max_seqlen_qo, max_seqlen_kv, softmax_scale=None, causal=False):
    total_q, h, _ = q.shape
    return q.new_empty((total_q, h, v.shape[-1])), _empty_t((h, total_q), torch.float32, q.device)


OPS = {name: getattr(torch.ops.deepkernels, name) for name in __all__ if name != "OPS"}
"""name -> ``torch.ops.deepkernels.<name>`` (OpOverloadPacket) for every op this module registers."""
