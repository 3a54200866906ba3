"""Expert-parallel MoE: a small DeepSeek-style routed-expert layer whose experts are split across ranks.

Layer (:class:`MoELayer`, all experts, one process) — for tokens ``x [T, hidden]``:

    s = sigmoid(x @ W_gate.T) (or softmax)            scores [T, E], float32
    ids = top-k of (s + e_score_correction_bias)      the bias only steers the choice (DeepSeek-V3)
    w = s[ids] (/ Σ w when norm_topk_prob) · routed_scaling_factor
    y_t = Σ_j w_tj · FFN_{ids_tj}(x_t),   FFN_e(x) = W2_e (silu(W1_e x) ⊙ W3_e x)   (SwiGLU)

Expert parallelism (:class:`EPMoE`, rank r of W owns experts ``[r·E/W, (r+1)·E/W)``; the router is replicated and
every rank routes its own tokens):

1. sort the rank's ``T·k`` (token, expert) assignments by expert;
2. exchange the per-expert counts with ``torch.distributed.all_to_all_single`` (one int64 per expert), then read
   them on the host once (the only host sync: it sizes the token exchange and the expert buffer);
3. send the token rows to the experts' owners (``all_to_all_single`` with split sizes);
4. place the received rows in the masked layout ``[E/W, M_max, hidden]`` (``masked_m[e]`` = rows for local expert
   e, from all sources; ``M_max`` = the largest, rounded up) and run the experts with the masked grouped GEMMs
   ``m_grouped_{bf16,fp8}_gemm_nt_masked`` (DeepGEMM signatures; FP8 with per-token activation / 128×128 weight
   scales from :mod:`deepkernels.quant`);
5. send the expert outputs back with ``all_to_all_single`` (splits swapped) and combine them per token with the
   router weights, summing the k contributions in a fixed order (float32), so the result does not depend on how
   the experts are spread over ranks.

No shared expert and no group-limited routing (DeepSeek-V3's ``n_group``/``topk_group``); a shared expert is a
replicated dense FFN added on every rank and does not touch the communication.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

__all__ = ["MoEConfig", "MoELayer", "EPMoE", "route", "masked_grouped_ops", "run_experts_masked", "moe_reference"]


@dataclass(frozen=True)
class MoEConfig:
    """Routed-expert geometry (names as DeepSeek-V3's ``config.json``; defaults are small, not V3's 256 experts).

    ``hidden_size`` and ``moe_intermediate_size`` must be multiples of 64 (BF16 masked GEMM: K % 64 == 0).
    Raises ValueError for bad sizes, ``num_experts_per_tok > n_routed_experts`` or an unknown ``scoring_func``.
    """
    hidden_size: int = 7168
    moe_intermediate_size: int = 2048
    n_routed_experts: int = 16
    num_experts_per_tok: int = 4
    routed_scaling_factor: float = 2.5
    norm_topk_prob: bool = True
    scoring_func: str = "sigmoid"

    def __post_init__(self):
        for f in ("hidden_size", "moe_intermediate_size"):
            v = getattr(self, f)
            if v <= 0 or v % 64:
                raise ValueError(f"{f} must be a positive multiple of 64, got {v}")
        if not 0 < self.num_experts_per_tok <= self.n_routed_experts:
            raise ValueError(f"need 0 < num_experts_per_tok <= n_routed_experts, got {self.num_experts_per_tok}, "
                             f"{self.n_routed_experts}")
        if self.scoring_func not in ("sigmoid", "softmax"):
            raise ValueError(f"scoring_func must be 'sigmoid' or 'softmax', got {self.scoring_func!r}")


def masked_grouped_ops():
    """``(m_grouped_bf16_gemm_nt_masked, m_grouped_fp8_gemm_nt_masked)`` from :mod:`deepkernels`.

    Raises NotImplementedError naming what is missing when the masked grouped GEMMs are not in this build."""
    import deepkernels
    names = ("m_grouped_bf16_gemm_nt_masked", "m_grouped_fp8_gemm_nt_masked")
    ops = tuple(getattr(deepkernels, n, None) for n in names)
    missing = [n for n, o in zip(names, ops) if o is None]
    if missing:
        raise NotImplementedError(f"deepkernels has no {', '.join(missing)} (the masked grouped GEMMs have not "
                                  f"landed in this build)")
    return ops


def _quantize_weights(w: torch.Tensor):
    """``[G, N, K]`` → ``(e4m3 [G, N, K], sf float32 [G, ceil(N/128), ceil(K/128)])`` (128×128 blocks)."""
    from ..quant import per_block_cast_to_fp8
    pairs = [per_block_cast_to_fp8(w[g]) for g in range(w.shape[0])]
    return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def _quantize_tokens(a: torch.Tensor):
    """``[G, M, K]`` → ``(e4m3 [G, M, K], sf float32 [G, M, ceil(K/128)])`` (1×128 per-token groups)."""
    from ..quant import per_token_cast_to_fp8
    g, m, k = a.shape
    q, sf = per_token_cast_to_fp8(a.reshape(g * m, k))
    return q.view(g, m, k), sf.view(g, m, -1)


def run_experts_masked(xg: torch.Tensor, masked_m: torch.Tensor, w13, w2, expected_m: int,
                       backend: str = "bf16") -> torch.Tensor:
    """SwiGLU experts over the masked layout: ``xg [G, M_max, hidden]`` bf16 → ``[G, M_max, hidden]`` bf16.

    ``masked_m [G]`` int32 (rows valid per expert; rows beyond are zero in the output). ``w13``: ``[G, 2·I, hidden]``
    bf16 (gate rows then up rows) — or for ``backend="fp8"`` its ``(e4m3, sf)`` pair from 128×128 block
    quantization; ``w2``: ``[G, hidden, I]`` likewise. ``backend``: ``"bf16"`` / ``"fp8"`` (the masked grouped GEMMs,
    FP8 with per-token activation scales) or ``"bmm"`` (``torch.bmm`` over all ``M_max`` rows: an anchor, no
    deepkernels op). ``expected_m``: the masked GEMMs' tuning hint (> 0).
    Raises ValueError for an unknown backend; NotImplementedError when the masked GEMMs are missing.
    """
    g, m_max, _ = xg.shape
    if backend == "bmm":
        h = torch.bmm(xg, w13.transpose(1, 2))
        act = (F.silu(h[..., :h.shape[-1] // 2].float()) * h[..., h.shape[-1] // 2:].float()).to(xg.dtype)
        return torch.bmm(act, w2.transpose(1, 2))
    if backend not in ("bf16", "fp8"):
        raise ValueError(f"backend must be 'bf16', 'fp8' or 'bmm', got {backend!r}")
    bf16_masked, fp8_masked = masked_grouped_ops()
    n13 = (w13[0] if backend == "fp8" else w13).shape[1]
    n2 = (w2[0] if backend == "fp8" else w2).shape[1]
    h = torch.zeros(g, m_max, n13, dtype=torch.bfloat16, device=xg.device)
    if backend == "fp8":
        fp8_masked(_quantize_tokens(xg), w13, h, masked_m, expected_m)
    else:
        bf16_masked(xg, w13, h, masked_m, expected_m)
    act = (F.silu(h[..., :n13 // 2].float()) * h[..., n13 // 2:].float()).to(torch.bfloat16)
    y = torch.zeros(g, m_max, n2, dtype=torch.bfloat16, device=xg.device)
    if backend == "fp8":
        fp8_masked(_quantize_tokens(act), w2, y, masked_m, expected_m)
    else:
        bf16_masked(act, w2, y, masked_m, expected_m)
    return y


class MoELayer(nn.Module):
    """All E routed experts in one process (the single-GPU layer, and the weights an :class:`EPMoE` shards).

    Parameters: ``gate_weight [E, hidden]``, ``e_score_correction_bias [E]`` float32, ``w13 [E, 2·I, hidden]``
    (each expert's gate_proj rows then up_proj rows), ``w2 [E, hidden, I]`` (down_proj), in ``dtype`` (bf16 for
    the masked GEMMs). :meth:`forward` runs every expert through the masked layout (EP with one rank).
    """

    def __init__(self, cfg: MoEConfig, dtype: torch.dtype = torch.bfloat16, device=None):
        super().__init__()
        self.cfg = cfg
        e, h, i = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        kw = dict(dtype=dtype, device=device)
        self.gate_weight = nn.Parameter(torch.empty(e, h, **kw))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(e, dtype=torch.float32, device=device))
        self.w13 = nn.Parameter(torch.empty(e, 2 * i, h, **kw))
        self.w2 = nn.Parameter(torch.empty(e, h, i, **kw))

    def reset_parameters(self, generator: torch.Generator | None = None, std: float | None = None) -> "MoELayer":
        """Gaussian weights (std ``hidden**-0.5`` unless given; ``w2`` uses ``I**-0.5``), zero bias; returns self."""
        h, i = self.cfg.hidden_size, self.cfg.moe_intermediate_size
        with torch.no_grad():
            for p, s in ((self.gate_weight, std or h ** -0.5), (self.w13, std or h ** -0.5),
                         (self.w2, std or i ** -0.5)):
                p.copy_(torch.randn(p.shape, generator=generator, device=generator.device if generator else None)
                        .to(p.device) * s)
            self.e_score_correction_bias.zero_()
        return self

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x [T, hidden]`` → ``(topk_ids [T, k] int64, topk_weights [T, k] float32)`` (see :func:`route`)."""
        return route(self.cfg, self.gate_weight, self.e_score_correction_bias, x)

    def forward(self, x: torch.Tensor, backend: str = "bf16") -> torch.Tensor:
        """``x [T, hidden]`` → ``[T, hidden]`` in x's dtype, every expert local (:class:`EPMoE` with one rank; built
        per call, so for repeated calls — FP8 quantizes the weights — build ``EPMoE(layer, 0, 1)`` once)."""
        return EPMoE(self, rank=0, world_size=1, backend=backend)(x)


class EPMoE(nn.Module):
    """Rank ``rank``'s part of an expert-parallel MoE layer (module docstring).

    Args:
        full: the :class:`MoELayer` whose router is replicated and whose experts ``[rank·E/W, (rank+1)·E/W)`` this
            rank keeps (copied; the other experts are not referenced).
        rank, world_size: this rank and the number of ranks (``world_size`` must divide E; with 1 no collective is
            issued). group: the process group (None = default).
        backend: ``"bf16"`` (masked BF16 grouped GEMM), ``"fp8"`` (weights quantized once, 128×128 blocks;
            activations per token) or ``"bmm"`` (torch.bmm anchor).
        m_align: ``M_max`` is the largest per-expert row count rounded up to this (>= 1).
    Raises:
        ValueError for an indivisible expert count, a bad rank, backend or m_align, or a group of another size.
    """

    def __init__(self, full: MoELayer, rank: int, world_size: int, group=None, backend: str = "bf16",
                 m_align: int = 64):
        super().__init__()
        c = full.cfg
        if world_size < 1 or not 0 <= rank < world_size or c.n_routed_experts % world_size:
            raise ValueError(f"need 0 <= rank < world_size dividing n_routed_experts ({c.n_routed_experts}), got "
                             f"rank {rank}, world_size {world_size}")
        if backend not in ("bf16", "fp8", "bmm"):
            raise ValueError(f"backend must be 'bf16', 'fp8' or 'bmm', got {backend!r}")
        if m_align < 1:
            raise ValueError(f"m_align must be >= 1, got {m_align}")
        if world_size > 1 and dist.is_initialized() and dist.get_world_size(group) != world_size:
            raise ValueError(f"world_size {world_size} != process group size {dist.get_world_size(group)}")
        self.cfg, self.rank, self.world_size, self.group = c, rank, world_size, group
        self.backend, self.m_align = backend, m_align
        # the router is replicated (copies, so the full layer can be freed)
        self.register_buffer("gate_weight", full.gate_weight.detach().clone())
        self.register_buffer("e_score_correction_bias", full.e_score_correction_bias.detach().clone())
        el = c.n_routed_experts // world_size
        self.num_local_experts, self.first_expert = el, rank * el
        w13 = full.w13.detach()[rank * el:(rank + 1) * el].contiguous()
        w2 = full.w2.detach()[rank * el:(rank + 1) * el].contiguous()
        if backend == "fp8":
            self.w13, self.w2 = _quantize_weights(w13), _quantize_weights(w2)
        else:
            self.w13, self.w2 = w13, w2
        self.last_stats: dict = {}

    def _a2a(self, out: torch.Tensor, inp: torch.Tensor, out_splits=None, in_splits=None) -> None:
        if self.world_size == 1:
            out.copy_(inp)
            return
        # gloo's all_to_all takes no 16-bit types: move 16-bit floats as bytes ([n, 2·h] uint8, same rows)
        if out.device.type == "cpu" and out.dtype in (torch.bfloat16, torch.float16):
            out, inp = out.view(torch.uint8), inp.view(torch.uint8)
        dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, hidden]`` (this rank's tokens; T may differ across ranks, 0 allowed) → ``[T, hidden]`` in x's
        dtype: Σ_j w_tj · FFN_{e_tj}(x_t) over the experts of all ranks. Every rank must call it (collectives).
        ``self.last_stats`` records the rows sent/received and the masked_m of the local experts.
        Raises ValueError for a bad x shape; NotImplementedError when the masked grouped GEMMs are missing.
        """
        c, W, el = self.cfg, self.world_size, self.num_local_experts
        if x.dim() != 2 or x.shape[1] != c.hidden_size:
            raise ValueError(f"x must have shape [T, {c.hidden_size}], got {list(x.shape)}")
        t, k, dev = x.shape[0], c.num_experts_per_tok, x.device
        if self.backend != "bmm":
            masked_grouped_ops()  # fail before the first collective on every rank, not only where rows arrive
        ids, w = route(c, self.gate_weight, self.e_score_correction_bias, x)   # [T, k]
        flat = ids.flatten()
        order = torch.sort(flat, stable=True).indices                      # assignments grouped by expert
        send_counts = torch.bincount(flat, minlength=c.n_routed_experts)   # [E] int64
        recv_counts = torch.empty_like(send_counts)                        # [W · el]: source s, local expert e
        self._a2a(recv_counts, send_counts)
        host = torch.cat([send_counts, recv_counts]).tolist()              # the one host sync
        send_e, recv_e = host[:c.n_routed_experts], host[c.n_routed_experts:]
        in_splits = [sum(send_e[d * el:(d + 1) * el]) for d in range(W)]
        out_splits = [sum(recv_e[s * el:(s + 1) * el]) for s in range(W)]
        n_recv = sum(out_splits)
        recv_x = torch.empty(n_recv, c.hidden_size, dtype=x.dtype, device=dev)
        self._a2a(recv_x, x[order // k].contiguous(), out_splits, in_splits)
        # masked layout: row i of the received buffer goes to (local expert le[i], slot pos[i])
        per_e = [sum(recv_e[s * el + e] for s in range(W)) for e in range(el)]
        m_max = max(self.m_align, -(-max(per_e, default=0) // self.m_align) * self.m_align)
        rc = recv_counts.view(W, el)
        masked_m = rc.sum(0).to(torch.int32)
        block_start = torch.cumsum(recv_counts, 0) - recv_counts           # start of block (s, e) in recv_x
        slot_base = (torch.cumsum(rc, 0) - rc).flatten()                   # rows of e from sources before s
        le = torch.repeat_interleave(torch.arange(el, device=dev).repeat(W), recv_counts, output_size=n_recv)
        pos = torch.arange(n_recv, device=dev) + torch.repeat_interleave(slot_base - block_start, recv_counts,
                                                                         output_size=n_recv)
        self.last_stats = {"sent": in_splits, "received": out_splits, "masked_m": per_e, "m_max": m_max}
        y_recv = torch.empty(n_recv, c.hidden_size, dtype=torch.bfloat16, device=dev)
        if n_recv:
            xg = torch.zeros(el, m_max, c.hidden_size, dtype=torch.bfloat16, device=dev)
            xg[le, pos] = recv_x.to(torch.bfloat16)
            expected = max(1, -(-n_recv // el))
            yg = run_experts_masked(xg, masked_m, self.w13, self.w2, expected, self.backend)
            y_recv = yg[le, pos]
        y_sorted = torch.empty(t * k, c.hidden_size, dtype=torch.bfloat16, device=dev)
        self._a2a(y_sorted, y_recv, in_splits, out_splits)
        y = torch.empty_like(y_sorted)
        y[order] = y_sorted
        out = (y.view(t, k, c.hidden_size).float() * w[..., None]).sum(1)             # fixed order over the k experts
        return out.to(x.dtype)


def route(cfg: MoEConfig, gate_weight: torch.Tensor, bias: torch.Tensor, x: torch.Tensor):
    """DeepSeek-V3 routing of ``x [T, hidden]`` with ``gate_weight [E, hidden]`` and ``bias [E]``: float32 scores
    (sigmoid or softmax of ``x @ gate_weight.T``), top-k of ``scores + bias``, weights = the chosen scores
    (normalised when ``norm_topk_prob``) × ``routed_scaling_factor``. Returns ``(ids [T, k] int64, w [T, k] float32)``.
    """
    logits = x.float() @ gate_weight.float().t()
    scores = logits.sigmoid() if cfg.scoring_func == "sigmoid" else logits.softmax(-1)
    ids = torch.topk(scores + bias.float(), cfg.num_experts_per_tok, dim=-1).indices
    w = scores.gather(1, ids)
    if cfg.norm_topk_prob:
        w = w / w.sum(-1, keepdim=True).clamp_min(1e-20)
    return ids, w * cfg.routed_scaling_factor


def moe_reference(layer: MoELayer, x: torch.Tensor) -> torch.Tensor:
    """Float64 definition of :class:`MoELayer` (per expert, dense torch math on the bf16 weights, with the same
    bf16 rounding of the two GEMM outputs and the activation as the masked path); ``[T, hidden]`` in x's dtype."""
    ids, w = layer.route(x)
    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float64, device=x.device)
    i = layer.cfg.moe_intermediate_size
    for e in range(layer.cfg.n_routed_experts):
        tok, slot = (ids == e).nonzero(as_tuple=True)
        if tok.numel() == 0:
            continue
        h = (x[tok].double() @ layer.w13[e].double().t()).to(torch.bfloat16).double()
        act = (F.silu(h[:, :i]) * h[:, i:]).to(torch.bfloat16).double()
        y = (act @ layer.w2[e].double().t()).to(torch.bfloat16).double()
        out.index_add_(0, tok, y * w[tok, slot, None].double())
    return out.to(x.dtype)
