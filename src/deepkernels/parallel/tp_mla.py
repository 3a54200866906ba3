"""Tensor-parallel MLA attention: heads split across ranks, row-parallel ``o_proj`` with an all-reduce.

Sharding of one DeepSeek-V3 attention layer over ``world_size`` ranks (H heads → ``H_r = H / world_size`` per rank;
rank r owns heads ``[r·H_r, (r+1)·H_r)``):

    replicated          q_a_proj, q_a_layernorm, kv_a_proj_with_mqa, kv_a_layernorm   (the latent path)
    column-parallel     q_b_proj (or q_proj), kv_b_proj: the rows of rank r's heads     (per-head up-projections)
    row-parallel        o_proj: the columns of rank r's heads; partial outputs summed by ``all_reduce``

Each rank runs the absorbed path (q̃ = W^UK_iᵀ q^C_i, MQA over the latent cache through
``flash_mla_with_kvcache`` with ``h_q = H_r`` heads, W^UV_i per head) and its slice of ``o_proj``; the partial
``[b, s, hidden]`` outputs are summed with ``torch.distributed.all_reduce`` (in float32 by default).

The KV cache is **not** sharded: MLA caches one ``[c_KV ‖ k_R]`` row per token (576 wide for V3) that every head
reads, so each rank keeps a full copy of the latent cache (the replicated ``kv_a_proj_with_mqa`` writes the same
rows on every rank). TP over heads divides the attention FLOPs and the per-head weights by ``world_size``, not the
KV-cache bytes (that would need sequence/context parallelism).
"""
from __future__ import annotations

from dataclasses import replace

import torch
import torch.distributed as dist
from torch import nn

from ..model.config import MLAConfig
from ..model.kv_cache import PagedLatentCache
from ..model.mla import MLAAttention, latent_attention

__all__ = ["head_range", "shard_mla_state_dict", "shard_mla_attention", "TPMLAAttention"]


def head_range(num_heads: int, rank: int, world_size: int) -> tuple[int, int]:
    """``(first, last + 1)`` of the heads rank ``rank`` owns. Raises ValueError unless ``world_size`` divides
    ``num_heads`` and ``0 <= rank < world_size``."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank {rank}, world_size {world_size}")
    if num_heads % world_size:
        raise ValueError(f"num_heads ({num_heads}) must be divisible by world_size ({world_size})")
    h = num_heads // world_size
    return rank * h, (rank + 1) * h


def shard_mla_state_dict(state_dict: dict, cfg: MLAConfig, rank: int, world_size: int) -> dict:
    """Rank ``rank``'s slice of a full attention state dict (keys as :class:`MLAAttention`'s, optionally with a
    ``self_attn.``-style prefix stripped by the caller).

    ``q_b_proj.weight [H·192, q_lora]`` / ``q_proj.weight [H·192, hidden]`` and ``kv_b_proj.weight [H·256, 512]``
    keep the rows of the rank's heads; ``o_proj.weight [hidden, H·128]`` keeps their columns; everything else is
    shared (returned as the same tensors, not copies). Raises ValueError for an indivisible head count (see
    :func:`head_range`) or KeyError for a missing per-head key.
    """
    h0, h1 = head_range(cfg.num_heads, rank, world_size)
    qk, kv_rows, v = cfg.qk_head_dim, cfg.qk_nope_head_dim + cfg.v_head_dim, cfg.v_head_dim
    rows = {"kv_b_proj.weight": kv_rows, ("q_proj.weight" if cfg.q_lora_rank is None else "q_b_proj.weight"): qk}
    out = dict(state_dict)
    for key, per_head in rows.items():
        if key not in state_dict:
            raise KeyError(f"state dict has no {key!r} (needed to shard heads)")
        out[key] = state_dict[key][h0 * per_head:h1 * per_head].contiguous()
    if "o_proj.weight" not in state_dict:
        raise KeyError("state dict has no 'o_proj.weight' (needed to shard heads)")
    out["o_proj.weight"] = state_dict["o_proj.weight"][:, h0 * v:h1 * v].contiguous()
    return out


def shard_mla_attention(full: MLAAttention, rank: int, world_size: int) -> MLAAttention:
    """A new :class:`MLAAttention` with ``num_heads / world_size`` heads holding rank ``rank``'s weights of
    ``full`` (same dtype and device). ``world_size == 1`` gives a copy. Raises ValueError as :func:`head_range`."""
    cfg = full.cfg
    head_range(cfg.num_heads, rank, world_size)
    local_cfg = replace(cfg, num_heads=cfg.num_heads // world_size)
    p = next(full.parameters())
    local = MLAAttention(local_cfg, dtype=p.dtype, device=p.device)
    with torch.no_grad():
        local.load_state_dict(shard_mla_state_dict(full.state_dict(), cfg, rank, world_size))
    return local


class TPMLAAttention(nn.Module):
    """One rank's part of a tensor-parallel MLA layer (see the module docstring for the sharding).

    Args:
        local: the rank's :class:`MLAAttention` with ``num_heads = H / world_size`` heads (from
            :func:`shard_mla_attention` or loaded with :func:`shard_mla_state_dict`); bf16/fp16 parameters.
        world_size: ranks sharing the heads (must match ``group``'s size when reducing).
        group: the ``torch.distributed`` process group to all-reduce over; None = the default group. With
            ``world_size == 1`` no collective is issued.
        reduce_dtype: dtype the partial ``o_proj`` outputs are computed in and all-reduced in (float32: only the
            summation order differs from a single rank; bfloat16: what serving engines send, half the bytes).
        o_proj_backend: ``"deepkernels"`` (``bf16_gemm_nt`` with a float32 ``d``) or ``"torch"`` (float32 matmul).
    Raises:
        ValueError for float32/float64 parameters (the absorbed path runs FlashMLA in bf16/fp16) or a
        ``world_size`` that disagrees with the group.
    """

    def __init__(self, local: MLAAttention, world_size: int, group=None, reduce_dtype: torch.dtype = torch.float32,
                 o_proj_backend: str = "deepkernels"):
        super().__init__()
        p = next(local.parameters())
        if p.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"TP MLA runs the absorbed path (bf16/fp16 parameters), got {p.dtype}")
        if reduce_dtype not in (torch.float32, torch.bfloat16, torch.float16):
            raise ValueError(f"reduce_dtype must be float32, bfloat16 or float16, got {reduce_dtype}")
        if o_proj_backend not in ("deepkernels", "torch"):
            raise ValueError(f"o_proj_backend must be 'deepkernels' or 'torch', got {o_proj_backend!r}")
        if world_size > 1 and dist.is_initialized() and dist.get_world_size(group) != world_size:
            raise ValueError(f"world_size {world_size} != process group size {dist.get_world_size(group)}")
        self.local, self.world_size, self.group, self.reduce_dtype = local, world_size, group, reduce_dtype
        self.o_proj_backend = o_proj_backend
        self.last_route: str | None = None

    @classmethod
    def from_full(cls, full: MLAAttention, rank: int | None = None, world_size: int | None = None, group=None,
                  reduce_dtype: torch.dtype = torch.float32, o_proj_backend: str = "deepkernels") -> "TPMLAAttention":
        """Shard ``full`` for ``rank`` of ``world_size`` (default: this process's rank and the group size, or
        0 of 1 without an initialised process group)."""
        if world_size is None:
            world_size = dist.get_world_size(group) if dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank(group) if dist.is_initialized() else 0
        return cls(shard_mla_attention(full, rank, world_size), world_size, group, reduce_dtype, o_proj_backend)

    @property
    def cfg(self) -> MLAConfig:
        """The local config (``num_heads`` = heads on this rank)."""
        return self.local.cfg

    def forward(self, hidden: torch.Tensor, cache: PagedLatentCache, route: str = "auto",
                reduce: bool = True) -> torch.Tensor:
        """Attend ``hidden [b, s, hidden_size]`` (the same tokens on every rank) and return ``[b, s, hidden_size]``
        in the parameters' dtype: the full layer's output after the all-reduce (identical on every rank).

        ``cache``: this rank's full copy of the paged latent cache (``d_qk`` 576 for V3); the new tokens' rows are
        appended at ``cache.cache_seqlens`` and attention is causal within the new tokens (bottom-right), as
        :meth:`MLAAttention.forward`. ``route``: ``"dense"``, ``"sparse"`` (packed FP8 cache, FlashMLA's sparse
        decode at ``h_q = H / world_size``) or ``"auto"`` (see :func:`deepkernels.model.latent_attention`; the route
        taken is in ``self.last_route``). ``reduce=False`` returns this rank's partial sum in ``reduce_dtype``
        (no collective; for tests and for fusing the reduction elsewhere).
        Raises ValueError for a hidden of the wrong width or a cache of the wrong shape; NotImplementedError for
        ``route="sparse"`` when the sparse path is unavailable for this cache or head count.
        """
        m, c = self.local, self.local.cfg
        if hidden.dim() != 3 or hidden.shape[-1] != c.hidden_size:
            raise ValueError(f"hidden must have shape [b, s, {c.hidden_size}], got {list(hidden.shape)}")
        b, s, _ = hidden.shape
        if cache.d_qk != c.kv_cache_dim or cache.batch != b:
            raise ValueError(f"cache holds batch {cache.batch} × d_qk {cache.d_qk}, layer needs batch {b} × "
                             f"d_qk {c.kv_cache_dim}")
        if c.kv_lora_rank > 512 or cache.d_qk < 512:
            raise ValueError(f"the absorbed path needs kv_lora_rank <= 512 <= kv_cache_dim, got {c.kv_lora_rank}, "
                             f"{cache.d_qk}")
        dtype, wide = m.o_proj.weight.dtype, torch.float32
        positions = cache.cache_seqlens.long()[:, None] + torch.arange(s, device=hidden.device)
        q_nope, q_rope, latent = m.project(hidden, positions)               # [b, s, H_r, 128], [.., 64], [b, s, 576]
        cache.append(latent)
        q_lat = torch.einsum("bshd,hdc->bshc", q_nope.to(wide), m.w_uk().to(wide))
        q = torch.cat([q_lat.to(dtype), q_rope], dim=-1).contiguous()      # [b, s, H_r, 576]
        out, _, self.last_route = latent_attention(q, cache, c.softmax_scale, 512, route)
        o_lat = out[..., :c.kv_lora_rank].to(wide)                           # [b, s, H_r, 512]
        o = torch.einsum("bshc,hdc->bshd", o_lat, m.w_uv().to(wide)).to(dtype).reshape(b * s, -1)
        y = self._row_parallel_o_proj(o)                                     # [b·s, hidden] partial
        if reduce and self.world_size > 1:
            dist.all_reduce(y, op=dist.ReduceOp.SUM, group=self.group)
        return y.view(b, s, -1) if not reduce else y.view(b, s, -1).to(dtype)

    def _row_parallel_o_proj(self, o: torch.Tensor) -> torch.Tensor:
        """``o [b·s, H_r·128] @ o_proj_r.T`` with FP32 accumulation, written in ``reduce_dtype``; bf16 goes through
        ``deepkernels.bf16_gemm_nt`` (the Triton GEMM on CUDA, its reference on the CPU)."""
        w = self.local.o_proj.weight
        if self.o_proj_backend == "deepkernels" and o.dtype == torch.bfloat16 and o.shape[1] % 8 == 0:
            from ..gemm import bf16_gemm_nt
            d = torch.empty(o.shape[0], w.shape[0], dtype=torch.float32, device=o.device)
            bf16_gemm_nt(o.contiguous(), w, d)
            return d.to(self.reduce_dtype)
        return torch.nn.functional.linear(o.float(), w.float()).to(self.reduce_dtype)
