"""The "W ranks equal 1 rank" checks of the TP MLA and EP MoE layers, run inside a process group.

Shared by the tests (gloo, CPU tensors, 2 spawned processes) and ``benchmarks/parallel_decode.py`` (NCCL, one GPU
per rank). Every rank builds the same full layer and inputs from one seed that rank 0 draws fresh
(``os.urandom``) and broadcasts; rank 0 also computes the single-rank results on its own device. Results are
dicts of plain floats/ints/strings (comparisons on rank 0; other ranks return their own consistency numbers).
"""
from __future__ import annotations

import os

import torch
import torch.distributed as dist

from ..model.config import MLAConfig
from ..model.kv_cache import PagedLatentCache
from ..model.mla import MLAAttention
from .ep_moe import EPMoE, MoEConfig, MoELayer, moe_reference
from .tp_mla import TPMLAAttention

__all__ = ["shared_seed", "rel_l2", "within_bf16_ulp", "small_mla_config", "tp_mla_check", "ep_moe_check", "run_cases"]


def shared_seed(device) -> int:
    """A fresh seed drawn on rank 0 and broadcast to every rank (on ``device``, as NCCL needs CUDA tensors)."""
    s = torch.tensor([int.from_bytes(os.urandom(6), "little")], dtype=torch.int64, device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast(s, 0)
    return int(s.item())


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    """``‖a − b‖ / ‖b‖`` in float64 (0 when both are zero)."""
    a, b = a.double(), b.double()
    n = b.norm().item()
    return (a - b).norm().item() / n if n else float((a - b).norm().item())


def small_mla_config(num_heads: int = 8) -> MLAConfig:
    """A CPU-sized MLA geometry that keeps FlashMLA's widths (kv_lora 512 + rope 64 = 576, d_v 512)."""
    return MLAConfig(hidden_size=256, num_heads=num_heads, q_lora_rank=96, kv_lora_rank=512, qk_nope_head_dim=32,
                     qk_rope_head_dim=64, v_head_dim=32)


def _randn(shape, gen, device, dtype=torch.bfloat16, std=1.0):
    """Gaussian drawn with ``gen`` on its own device (the same seed gives the same numbers on every rank)."""
    return (torch.randn(shape, generator=gen, device=gen.device, dtype=torch.float32) * std).to(device=device,
                                                                                               dtype=dtype)


def _build_mla(cfg: MLAConfig, gen, device, std: float) -> MLAAttention:
    full = MLAAttention(cfg, dtype=torch.bfloat16, device=device)
    with torch.no_grad():
        for name, p in sorted(full.named_parameters()):
            if p.dim() > 1:
                p.copy_(_randn(p.shape, gen, device, std=std))
    return full


def _cmp(a: torch.Tensor, b: torch.Tensor) -> dict:
    a, b = a.float(), b.float()
    return {"rel_l2": rel_l2(a, b), "max_abs": (a - b).abs().max().item() if a.numel() else 0.0,
            "ref_max_abs": b.abs().max().item() if b.numel() else 0.0,
            "identical_frac": (a == b).float().mean().item() if a.numel() else 1.0}


def within_bf16_ulp(cmp: dict, ulps: float = 1.0) -> bool:
    """True when a :func:`_cmp` result differs by at most ``ulps`` bf16 ulps of the reference's largest magnitude
    (2^-7 relative: 8 significant bits) — a rounding flip, not a different computation."""
    return cmp["max_abs"] <= ulps * 2.0 ** -7 * cmp["ref_max_abs"]


def tp_mla_check(rank: int, world_size: int, device, cfg: MLAConfig | None = None, batch: int = 2,
                 prefill: tuple = (70, 5), steps: tuple = (1, 1, 3), fmt: str = "bf16", route: str = "auto",
                 std: float = 0.1, max_seq_len: int = 160, page_block_size: int = 64) -> dict:
    """TP MLA over ``world_size`` ranks vs the same layer on one rank (rank 0 computes both).

    Request i is prefilled with ``prefill[i % len(prefill)]`` tokens on its own (``cache.select``, so requests have
    different lengths), then all requests take the ``steps`` together (1 = a decode step; >1 a causal chunk).
    Rank 0 runs, on its device and with its own caches, (a) the same :class:`TPMLAAttention` code with 1 rank and
    (b) the unsharded :meth:`MLAAttention.forward` (absorbed path); every rank runs its shard with ``fmt`` cache
    and ``route``. Returns per step (prefill steps labelled ``prefill<i>``) ``vs_1rank`` and ``vs_unsharded``
    comparisons (rel_l2, max_abs, identical_frac) on rank 0, ``ranks_agree`` (max |out_r − out_0| over ranks), and
    the route taken.
    """
    cfg = cfg or small_mla_config()
    seed = shared_seed(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    full = _build_mla(cfg, gen, device, std)
    tp = TPMLAAttention.from_full(full, rank, world_size)
    new_cache = lambda: PagedLatentCache(batch, max_seq_len, cfg.kv_cache_dim, fmt, page_block_size, device=device)
    cache = new_cache()
    ref = None
    if rank == 0:
        ref = (TPMLAAttention.from_full(full, 0, 1), new_cache(), full, new_cache())
    if rank != 0:
        del full
    res: dict = {"seed": seed, "fmt": fmt, "route_requested": route, "heads_per_rank": tp.cfg.num_heads, "steps": []}
    plan = [(f"prefill{i}", [i], prefill[i % len(prefill)]) for i in range(batch)]
    plan += [(f"step{j}_s{s}", list(range(batch)), s) for j, s in enumerate(steps)]
    for label, ids, s in plan:
        hidden = _randn((len(ids), s, cfg.hidden_size), gen, device)
        sel = (lambda c: c) if len(ids) == batch else (lambda c: c.select(ids))
        y = tp(hidden, sel(cache), route=route)
        row = {"label": label, "route": tp.last_route}
        y0 = y.clone()
        if world_size > 1:
            dist.broadcast(y0, 0)
        agree = torch.tensor([(y.float() - y0.float()).abs().max().item()], device=device)
        if world_size > 1:
            dist.all_reduce(agree, op=dist.ReduceOp.MAX)
        row["ranks_agree_max_abs"] = agree.item()
        if rank == 0:  # local work only: an error here must not desynchronise the next step's collectives
            try:
                tp1, c1, full_m, c2 = ref
                y1 = tp1(hidden, sel(c1), route=route)
                row["vs_1rank"], row["route_1rank"] = _cmp(y, y1), tp1.last_route
                yu = full_m(hidden, sel(c2), path="absorbed", route=route)
                row["vs_unsharded"] = _cmp(y, yu)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {e}"
        res["steps"].append(row)
    return res


def ep_moe_check(rank: int, world_size: int, device, cfg: MoEConfig | None = None, tokens: tuple = (5, 11),
                 dead_experts: tuple = (3,), backend: str = "bf16", std: float | None = None) -> dict:
    """EP MoE over ``world_size`` ranks vs one process holding every expert (rank 0 compares).

    Rank r routes ``tokens[r]`` tokens (uneven; 0 allowed); the experts in ``dead_experts`` get a routing bias of
    -1e4, so they receive no token (their owner runs the masked GEMM with ``masked_m = 0`` for them). Rank 0 gathers
    the W outputs and compares them with ``EPMoE(layer, 0, 1)`` on all tokens (``vs_1rank``: same code, one rank)
    and with :func:`moe_reference` (``vs_reference``). Returns those comparisons (on rank 0) and every rank's
    ``last_stats`` (rows sent/received, masked_m).
    """
    cfg = cfg or MoEConfig(hidden_size=256, moe_intermediate_size=128, n_routed_experts=8, num_experts_per_tok=2)
    if len(tokens) != world_size:
        raise ValueError(f"tokens needs one count per rank ({world_size}), got {tokens}")
    seed = shared_seed(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    layer = MoELayer(cfg, device=device).reset_parameters(gen, std)
    with torch.no_grad():
        for e in dead_experts:
            layer.e_score_correction_bias[e] = -1e4
    x_all = _randn((sum(tokens), cfg.hidden_size), gen, device)
    start = sum(tokens[:rank])
    x = x_all[start:start + tokens[rank]].contiguous()
    ep = EPMoE(layer, rank, world_size, backend=backend)
    y = ep(x)
    t_max = max(tokens)
    pad = torch.zeros(t_max, cfg.hidden_size, dtype=y.dtype, device=device)
    pad[:y.shape[0]] = y
    stats = [None] * world_size
    if world_size > 1:
        bufs = [torch.empty_like(pad) for _ in range(world_size)]
        dist.all_gather(bufs, pad)
        dist.all_gather_object(stats, ep.last_stats)
    else:
        bufs, stats = [pad], [ep.last_stats]
    res: dict = {"seed": seed, "backend": backend, "tokens": list(tokens), "dead_experts": list(dead_experts),
                 "stats": stats}
    if rank == 0:
        y_ep = torch.cat([bufs[r][:tokens[r]] for r in range(world_size)])
        y1 = EPMoE(layer, 0, 1, backend=backend)(x_all)
        yr = moe_reference(layer, x_all)
        res["vs_1rank"], res["vs_reference"] = _cmp(y_ep, y1), _cmp(y_ep, yr)
        el = cfg.n_routed_experts // world_size
        res["dead_expert_rows"] = [stats[e // el]["masked_m"][e % el] for e in dead_experts]
    return res


def run_cases(rank: int, world_size: int, device, cases: list) -> list:
    """Run ``cases`` — a list of ``(kind, kwargs)`` with kind ``"tp_mla"`` or ``"ep_moe"`` — in order, each wrapped:
    a case that raises gives ``{"error": "<type>: <message>"}`` instead of stopping the rest (every rank raises
    in the same case, since inputs and shapes are shared, so the collectives stay matched). A module-level entry
    point for :func:`deepkernels.parallel.spawn_distributed`. Returns one dict per case (``kind`` added).
    Raises ValueError for an unknown kind.
    """
    fns = {"tp_mla": tp_mla_check, "ep_moe": ep_moe_check}
    out = []
    for kind, kw in cases:
        if kind not in fns:
            raise ValueError(f"case kind must be one of {sorted(fns)}, got {kind!r}")
        try:
            with torch.no_grad():
                r = fns[kind](rank, world_size, device, **kw)
        except Exception as e:  # noqa: BLE001 - recorded, the next case still runs
            r = {"error": f"{type(e).__name__}: {e}"}
        out.append({"kind": kind, **{k: v for k, v in kw.items() if k != "cfg"}, **r})
    return out
