"""DeepSeek-V3 Multi-head Latent Attention: compression, decoupled RoPE, and the naive and absorbed forward paths.

Notation (DeepSeek-V2 paper eq. 9-19; seed article §6). For token t with hidden state h_t:

    c_t^Q  = RMSNorm(W^DQ h_t)                       q_a_proj, q_a_layernorm        [q_lora_rank]
    [q_t^C ; q_t^R] = W^UQ c_t^Q, q_t^R ← RoPE(q_t^R)  q_b_proj                     [H, 128 + 64]
    [c_t^KV ; k_t^R] = W^DKV h_t                      kv_a_proj_with_mqa             [512 + 64]
    c_t^KV ← RMSNorm(c_t^KV), k_t^R ← RoPE(k_t^R)     kv_a_layernorm                 (k_R shared by all heads)
    [W^UK_i ; W^UV_i] = kv_b_proj.weight rows of head i                            [128 + 128, 512]
    u_t = W^O [o_t,1 ; … ; o_t,H]                       o_proj

Naive path (MHA, :meth:`MLAAttention.forward` with ``path="naive"``): K_j,i = [W^UK_i c_j ; k_j^R] and
V_j,i = W^UV_i c_j are materialised per head, then ordinary causal softmax attention.

Absorbed path (``path="absorbed"``): q~_t,i = W^UK_i^T q_t,i^C (512 wide), the query is [q~ ; q^R] (576 wide), and
all H heads attend to the *one* cached row [c_j^KV ; k_j^R] — MQA with d_qk 576, d_v 512 — through
``flash_mla_with_kvcache``. The 512-wide latent output is mapped back per head by W^UV_i, then W^O
(or, ``fold_output=True``, through the per-head products W^O_i W^UV_i precomputed once).

Both paths use ``cfg.softmax_scale`` = 192^-0.5 · mscale² (YaRN), never FlashMLA's default 576^-0.5.
Source of the layer's semantics: DeepSeek-V3's reference inference code and its HF ``config.json``; cross-checked
against Hugging Face transformers' ``DeepseekV3Attention`` (tests/test_model_hf.py).
"""
from __future__ import annotations

import torch
from torch import nn

from .config import MLAConfig
from .fp8_linear import FP8Linear
from .kv_cache import PagedLatentCache
from .rope import apply_rope, rope_cos_sin

__all__ = ["RMSNorm", "MLAAttention", "latent_attention"]


class RMSNorm(nn.Module):
    """``weight · (x / sqrt(mean(x²) + eps))``, normalised in float32 (float64 for float64 inputs)."""

    def __init__(self, dim: int, eps: float = 1e-6, dtype=None, device=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        wide = torch.float64 if x.dtype == torch.float64 else torch.float32
        xf = x.to(wide)
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * y.to(x.dtype)


def _flash_mla():
    """(flash_mla_with_kvcache, get_mla_metadata) from the package, or None before the public op lands."""
    import deepkernels
    fn, meta = getattr(deepkernels, "flash_mla_with_kvcache", None), getattr(deepkernels, "get_mla_metadata", None)
    return (fn, meta) if fn is not None and meta is not None else None


def latent_attention(q: torch.Tensor, cache: PagedLatentCache, softmax_scale: float, d_v: int,
                     route: str = "auto") -> tuple[torch.Tensor, torch.Tensor, str]:
    """MQA of ``q [b, s_q, h_q, d_qk]`` over the cache's latent rows, causal (bottom-right) when ``s_q > 1``.

    Routes: ``"dense"`` — ``flash_mla_with_kvcache`` in its dense mode over ``cache.k_cache`` (a packed cache is
    first dequantized to BF16 pages, since FlashMLA has no FP8 dense path; 512-wide rows are zero-padded to 576);
    ``"sparse"`` — FlashMLA's FP8 sparse
    decode (``is_fp8_kvcache=True``) with per-query index lists of the visible tokens (packed formats only);
    ``"auto"`` — dense for a dense cache, sparse for a packed one when the sparse path is present, else dense.
    Returns ``(out [b, s_q, h_q, d_v] in q's dtype, lse [b, h_q, s_q] float32 natural log, route taken)``.
    Before the public op is available, the dense route calls ``deepkernels.reference.mla.dense_decode``.
    """
    if route not in ("auto", "dense", "sparse"):
        raise ValueError(f"route must be 'auto', 'dense' or 'sparse', got {route!r}")
    b, s_q = q.shape[:2]
    ops = _flash_mla()
    if route == "sparse" or (route == "auto" and cache.is_packed and ops is not None):
        if not cache.is_packed:
            raise ValueError(f"the sparse route needs a packed FP8/FP4 cache, got fmt={cache.fmt!r}")
        try:
            return (*_sparse_route(q, cache, softmax_scale, d_v, ops), "sparse")
        except NotImplementedError:
            if route == "sparse":
                raise
    k_cache = cache.dense_pages(q.dtype) if cache.is_packed else cache.k_cache
    if q.shape[-1] == 512:
        # MODEL1/V4.1/FP4 geometry (448 NoPE + 64 RoPE): FlashMLA's dense mode only takes d_qk = 576, so append 64
        # zero columns to q and K; scores are unchanged and V (the first 512 columns) is the same row.
        q = torch.nn.functional.pad(q, (0, 64))
        k_cache = torch.nn.functional.pad(k_cache, (0, 64))
    causal = s_q > 1
    if ops is not None:
        fn, get_meta = ops
        meta, _ = get_meta()
        out, lse = fn(q, k_cache, cache.block_table, cache.cache_seqlens, d_v, meta,
                      softmax_scale=softmax_scale, causal=causal)
    else:
        from deepkernels.reference.mla import dense_decode
        out, lse = dense_decode(q, k_cache, cache.block_table, cache.cache_seqlens, head_dim_v=d_v,
                                softmax_scale=softmax_scale, causal=causal)
    return out, lse, "dense"


def _sparse_route(q, cache: PagedLatentCache, softmax_scale: float, d_v: int, ops):
    """Causal attention over a packed cache through the sparse FP8 path: query position i of request r sees
    its tokens ``[0, len_r - s_q + i]``, given as physical indices ``page·B + row`` padded with -1 to a multiple
    of 64."""
    fn, get_meta = ops
    b, s_q = q.shape[:2]
    lens = cache.cache_seqlens.long()
    topk = max(64, -(-int(lens.max()) // 64) * 64)
    j = torch.arange(topk, device=q.device)
    page_idx = torch.gather(cache.block_table.long(), 1,
                            (j // cache.page_block_size).clamp(max=cache.block_table.shape[1] - 1)
                            .expand(b, -1))
    phys = page_idx * cache.page_block_size + j % cache.page_block_size               # [b, topk]
    visible = lens[:, None] - (s_q - 1) + torch.arange(s_q, device=q.device)[None, :]  # [b, s_q]
    indices = torch.where(j[None, None, :] < visible[..., None], phys[:, None, :], -1).to(torch.int32)
    meta, _ = get_meta()
    try:
        return fn(q, cache.k_cache, cache.block_table, cache.cache_seqlens, d_v, meta, softmax_scale=softmax_scale,
                  is_fp8_kvcache=True, indices=indices.contiguous())
    except (NotImplementedError, ValueError) as e:  # path absent, or this head count/format unsupported
        raise NotImplementedError(f"sparse FP8 route unavailable: {e}") from e


class MLAAttention(nn.Module):
    """One DeepSeek-V3 attention layer (weights only; no residual or input norm).

    Parameter names are the checkpoint's (``self_attn.q_a_proj.weight`` …), so
    ``load_state_dict`` takes a DeepSeek-V3/transformers attention state dict as is.

    Args:
        cfg: :class:`MLAConfig`. dtype/device: of the parameters (bf16 for the absorbed path through FlashMLA;
            float64 for references).
    """

    def __init__(self, cfg: MLAConfig, dtype: torch.dtype | None = None, device=None):
        super().__init__()
        self.cfg = cfg
        H, kw = cfg.num_heads, dict(bias=False, dtype=dtype, device=device)
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(cfg.hidden_size, H * cfg.qk_head_dim, **kw)
        else:
            self.q_a_proj = nn.Linear(cfg.hidden_size, cfg.q_lora_rank, **kw)
            self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_norm_eps, dtype=dtype, device=device)
            self.q_b_proj = nn.Linear(cfg.q_lora_rank, H * cfg.qk_head_dim, **kw)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden_size, cfg.kv_cache_dim, **kw)
        self.kv_a_layernorm = RMSNorm(cfg.kv_lora_rank, cfg.rms_norm_eps, dtype=dtype, device=device)
        self.kv_b_proj = nn.Linear(cfg.kv_lora_rank, H * (cfg.qk_nope_head_dim + cfg.v_head_dim), **kw)
        self.o_proj = nn.Linear(H * cfg.v_head_dim, cfg.hidden_size, **kw)
        self.last_route: str | None = None

    # ---- weight views ------------------------------------------------------------------------------
    def w_uk(self) -> torch.Tensor:
        """W^UK per head, ``[H, qk_nope_head_dim, kv_lora_rank]`` (a view of kv_b_proj.weight)."""
        c = self.cfg
        return self.kv_b_proj.weight.view(c.num_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)[
            :, :c.qk_nope_head_dim]

    def w_uv(self) -> torch.Tensor:
        """W^UV per head, ``[H, v_head_dim, kv_lora_rank]`` (a view of kv_b_proj.weight)."""
        c = self.cfg
        return self.kv_b_proj.weight.view(c.num_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)[
            :, c.qk_nope_head_dim:]

    def w_ouv(self) -> torch.Tensor:
        """W^O_i W^UV_i for every head, ``[H, hidden_size, kv_lora_rank]``: W^UV folded into the output projection."""
        c = self.cfg
        w_o = self.o_proj.weight
        if isinstance(self.o_proj, FP8Linear):
            w_o = self.o_proj.dequantized_weight(self.kv_b_proj.weight.dtype)
        w_o = w_o.view(c.hidden_size, c.num_heads, c.v_head_dim).transpose(0, 1)            # [H, hid, v]
        wide = torch.float64 if w_o.dtype == torch.float64 else torch.float32
        return torch.matmul(w_o.to(wide), self.w_uv().to(wide)).to(w_o.dtype)

    # ---- FP8 projections ----------------------------------------------------------------------------
    FP8_PROJECTIONS = ("q_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj")

    def quantize_projections_(self) -> "MLAAttention":
        """Replace the dense projections (q / q_a / q_b, kv_a_proj_with_mqa, o_proj) by :class:`FP8Linear`:
        e4m3 weights with 128×128 ``weight_scale_inv`` (quantised here with ``per_block_cast_to_fp8``), run through
        deepkernels' FP8 GEMM with per-token activation scales — DeepSeek-V3's serving numerics. ``kv_b_proj``
        stays dense: the absorbed path uses its per-head halves (W^UK, W^UV) as small matrices. In place; returns
        self. Outputs of the projections become bf16."""
        for name in self.FP8_PROJECTIONS:
            mod = getattr(self, name, None)
            if isinstance(mod, nn.Linear):
                setattr(self, name, FP8Linear.from_linear(mod))
        return self

    # ---- projections ---------------------------------------------------------------------------------
    def project(self, hidden: torch.Tensor, positions: torch.Tensor):
        """Eq. 9-16: ``hidden [b, s, hidden_size]``, ``positions [b, s]`` int → q_nope ``[b, s, H, 128]``,
        q_rope ``[b, s, H, 64]`` (rotated), latent ``[b, s, 576]`` = [RMSNorm(c_KV) ‖ RoPE(k_R)]."""
        c = self.cfg
        b, s, _ = hidden.shape
        if c.q_lora_rank is None:
            q = self.q_proj(hidden)
        else:
            q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(hidden)))
        q = q.view(b, s, c.num_heads, c.qk_head_dim)
        q_nope, q_rope = q.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        cos, sin = rope_cos_sin(positions, c)                                   # [b, s, d_r/2]
        q_rope = apply_rope(q_rope, cos[:, :, None], sin[:, :, None])
        c_kv, k_rope = self.kv_a_proj_with_mqa(hidden).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        latent = torch.cat([self.kv_a_layernorm(c_kv), apply_rope(k_rope, cos, sin)], dim=-1)
        return q_nope, q_rope, latent

    # ---- forward -------------------------------------------------------------------------------------
    def forward(self, hidden: torch.Tensor, cache: PagedLatentCache | None = None, path: str = "absorbed",
                route: str = "auto", fold_output: bool = False) -> torch.Tensor:
        """Attend ``hidden [b, s, hidden_size]`` (the next s tokens of each of b requests) and return
        ``[b, s, hidden_size]`` in the parameters' dtype.

        ``cache``: the request's latent rows are appended at positions ``cache.cache_seqlens + [0, s)`` (prefill
        when empty, decode for s = 1) and attention reads every cached row, causal within the new tokens.
        Without a cache the s tokens attend among themselves from position 0 (a temporary cache of the
        parameters' dtype is used). ``path``: ``"naive"`` (MHA with per-head K/V) or ``"absorbed"`` (MQA over the
        latent through FlashMLA; needs bf16/fp16 parameters). ``route``: see :func:`latent_attention`.
        Raises ValueError for a bad path, a hidden of the wrong width, or a cache of the wrong row width.
        """
        c = self.cfg
        if hidden.dim() != 3 or hidden.shape[-1] != c.hidden_size:
            raise ValueError(f"hidden must have shape [b, s, {c.hidden_size}], got {list(hidden.shape)}")
        if path not in ("naive", "absorbed"):
            raise ValueError(f"path must be 'naive' or 'absorbed', got {path!r}")
        b, s, _ = hidden.shape
        if cache is None:
            fmt = {torch.float64: "fp64", torch.float32: "fp32", torch.float16: "fp16"}.get(hidden.dtype, "bf16")
            cache = PagedLatentCache(b, s, c.kv_cache_dim, fmt, device=hidden.device)
        if cache.d_qk != c.kv_cache_dim or cache.batch != b:
            raise ValueError(f"cache holds batch {cache.batch} × d_qk {cache.d_qk}, layer needs batch {b} × "
                             f"d_qk {c.kv_cache_dim}")
        positions = cache.cache_seqlens.long()[:, None] + torch.arange(s, device=hidden.device)
        q_nope, q_rope, latent = self.project(hidden, positions)
        cache.append(latent)
        if path == "naive":
            o = self._attend_naive(q_nope, q_rope, cache)                   # [b, s, H, v_head_dim]
            self.last_route = "naive"
            return self.o_proj(o.flatten(2))
        return self._forward_absorbed(q_nope, q_rope, cache, route, fold_output)

    def _attend_naive(self, q_nope, q_rope, cache: PagedLatentCache) -> torch.Tensor:
        c = self.cfg
        b, s = q_nope.shape[:2]
        wide = torch.float64 if q_nope.dtype == torch.float64 else torch.float32
        w_uk, w_uv = self.w_uk().to(wide), self.w_uv().to(wide)
        outs = []
        for i in range(b):
            lat = cache.read(i, wide)                                       # [n, 576]
            n = lat.shape[0]
            c_kv, k_rope = lat[:, :c.kv_lora_rank], lat[:, c.kv_lora_rank:]
            k_nope = torch.einsum("nc,hdc->nhd", c_kv, w_uk)                # K^C per head  [n, H, 128]
            v = torch.einsum("nc,hdc->nhd", c_kv, w_uv)                     # V per head    [n, H, 128]
            k = torch.cat([k_nope, k_rope[:, None].expand(-1, c.num_heads, -1)], dim=-1)
            q = torch.cat([q_nope[i], q_rope[i]], dim=-1).to(wide)          # [s, H, 192]
            scores = torch.einsum("shd,nhd->hsn", q, k) * c.softmax_scale
            limit = n - s + torch.arange(s, device=q.device)                # query i sees keys j <= n - s + i
            mask = torch.arange(n, device=q.device)[None, :] <= limit[:, None]
            scores = scores.masked_fill(~mask, float("-inf"))
            p = torch.softmax(scores, dim=-1)
            outs.append(torch.einsum("hsn,nhd->shd", p, v).to(q_nope.dtype))
        return torch.stack(outs)

    def _forward_absorbed(self, q_nope, q_rope, cache, route, fold_output) -> torch.Tensor:
        c = self.cfg
        if q_nope.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"the absorbed path runs FlashMLA in bf16/fp16; parameters are {q_nope.dtype} "
                             f"(use path='naive' for float references)")
        wide = torch.float32
        q_lat = torch.einsum("bshd,hdc->bshc", q_nope.to(wide), self.w_uk().to(wide))    # W^UK into q
        q = torch.cat([q_lat.to(q_nope.dtype), q_rope], dim=-1).contiguous()            # [b, s, H, 576]
        d_v = 512  # FlashMLA's fixed head_dim_v; V = the first 512 columns of the row
        if cache.d_qk < d_v or c.kv_lora_rank > d_v:
            raise ValueError(f"the absorbed path needs kv_lora_rank <= 512 <= kv_lora_rank + qk_rope_head_dim "
                             f"(FlashMLA's d_v is 512), got {c.kv_lora_rank} + {c.qk_rope_head_dim}")
        out, _, self.last_route = latent_attention(q, cache, c.softmax_scale, d_v, route)
        o_lat = out[..., :c.kv_lora_rank].to(wide)                                       # Σ_j p_ij c_j
        if fold_output:
            y = torch.einsum("bshc,hnc->bsn", o_lat, self.w_ouv().to(wide))
            return y.to(q_nope.dtype)
        o = torch.einsum("bshc,hdc->bshd", o_lat, self.w_uv().to(wide)).to(q_nope.dtype)  # W^UV per head
        return self.o_proj(o.flatten(2))
