"""TP MLA + EP MoE on 2 ranks: correctness (2 ranks == 1 rank) and a decode step's time per rank vs one GPU.

    torchrun --nproc_per_node=2 benchmarks/parallel_decode.py --out DIR            # 2 GPUs, NCCL
    python -m torch.distributed.run --nproc_per_node=2 benchmarks/parallel_decode.py --cpu --out DIR   # gloo, CPU

Steps (each wrapped: a failing step is recorded and the next one runs; rank 0 decides whether time is left and
broadcasts it, so all ranks take the same steps):
1. provenance: GPU names, driver, torch / triton / NCCL versions, git sha, world size, multicast-off variables.
2. checks (``deepkernels.parallel.checks``): TP MLA at DeepSeek-V3 attention dims (128 heads → 64 per rank) over a
   BF16 cache (dense decode) and a V3.2 FP8 cache (FlashMLA's sparse FP8 decode; and the same cache dequantized
   through the dense decode); EP MoE (16 experts, top-4, hidden 7168, I 2048) with BF16 and FP8 masked grouped
   GEMMs, uneven tokens and an expert with no token.
3. timing (CUDA events, median of ``--iters`` after ``--warmup``): for b in ``--batch``, s_k = ``--seqlen``:
   - ``attn``: one absorbed decode step of the attention layer (projections, cache append, flash_mla_with_kvcache,
     W^UV, o_proj, all_reduce); 1 GPU = 128 heads on rank 0, 2 ranks = 64 heads each;
   - ``attn_v32``: the same over a V3.2 FP8 cache (656 B/token), route ``auto`` = FlashMLA's sparse FP8 decode with
     index lists of every cached token (topk = s_k rounded up to 64) when present (the route is recorded);
   - ``mla_kernel``: flash_mla_with_kvcache alone at h_q = 128 (1 GPU) vs 64 (per rank);
   - ``moe_<backend>``: the MoE layer, 1 GPU = b tokens, all experts; 2 ranks = b/2 tokens each, 8 experts each;
   - ``layer_<backend>``: attention (TP) + MoE (EP; masked bf16 GEMM, or the torch.bmm anchor) + all_gather of the
     MoE outputs = a decode step of one layer;
   - ``all_reduce_fp32``: the TP attention's all_reduce alone ([b, hidden] float32; 2 ranks only).
4. JSON (``--out``/parallel_decode.json, rewritten after every step) and a short table printed last.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
import traceback

for _k, _v in {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}.items():
    os.environ[_k] = _v  # before torch creates any communicator

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))
from deepkernels.model import MLAAttention, MLAConfig, PagedLatentCache  # noqa: E402
from deepkernels.parallel import (EPMoE, MoEConfig, MoELayer, TPMLAAttention, checks, init_distributed,  # noqa: E402
                                  shutdown_distributed)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for parallel_decode.json")
    p.add_argument("--cpu", action="store_true", help="gloo on CPU tensors at small sizes (a dry run)")
    p.add_argument("--batch", type=int, nargs="+", default=None, help="decode batch sizes (default 64 128)")
    p.add_argument("--seqlen", type=int, default=None, help="cached tokens per request (default 4096)")
    p.add_argument("--experts", type=int, default=16)
    p.add_argument("--topk", type=int, default=4)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--iters", type=int, default=None)
    p.add_argument("--budget-s", type=float, default=200.0, help="skip the remaining steps after this many seconds")
    p.add_argument("--skip-checks", action="store_true")
    a = p.parse_args(argv)
    a.batch = a.batch or ([4] if a.cpu else [64, 128])
    a.seqlen = a.seqlen or (128 if a.cpu else 4096)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.cpu else 3)
    a.iters = a.iters if a.iters is not None else (2 if a.cpu else 20)
    return a


def provenance(world_size: int, device) -> dict:
    import deepkernels
    info = {"world_size": world_size, "device": str(device), "torch": torch.__version__, "python": platform.python_version(),
            "host": platform.node(), "deepkernels": deepkernels.__version__,
            "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                   "NVSHMEM_DISABLE_NVLS")}}
    sha = os.environ.get("GIT_SHA")
    if not sha or sha == "unknown":
        try:
            sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10,
                                 cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip() or "unknown"
        except Exception:  # noqa: BLE001
            sha = "unknown"
    info["git_sha"] = sha
    try:
        import triton
        info["triton"] = triton.__version__
    except Exception as e:  # noqa: BLE001
        info["triton"] = f"unavailable: {e}"
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["cuda"] = torch.version.cuda
        try:
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
        except Exception as e:  # noqa: BLE001
            info["nccl"] = f"unknown: {e}"
        try:
            info["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                            capture_output=True, text=True, timeout=20).stdout.split()[0]
        except Exception:  # noqa: BLE001
            info["driver"] = "unknown"
    return info


# ------------------------------------------------------------------------------------------------ timing
def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_fn(fn, device, warmup: int, iters: int) -> dict:
    """Median/min/max µs of ``fn()`` (CUDA events per call on a GPU, perf_counter on the CPU)."""
    for _ in range(warmup):
        fn()
    _sync(device)
    ts = []
    for _ in range(iters):
        if device.type == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ts.append(a.elapsed_time(b) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
    ts.sort()
    return {"median_us": ts[len(ts) // 2], "min_us": ts[0], "max_us": ts[-1], "iters": iters}


def _all_gather_single(out, inp):
    """``all_gather_single`` where this torch has it (2.13+), else ``all_gather_into_tensor`` (same collective)."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    fn(out, inp)


def barrier(world_size):
    if world_size > 1:
        dist.barrier()


def gather_obj(obj, world_size):
    if world_size == 1:
        return [obj]
    out = [None] * world_size
    dist.all_gather_object(out, obj)
    return out


def mla_cfg(cpu: bool) -> MLAConfig:
    return checks.small_mla_config(num_heads=32) if cpu else MLAConfig()  # 32 → 16 per rank: sparse decode runs


def moe_cfg(args) -> MoEConfig:
    if args.cpu:
        return MoEConfig(hidden_size=256, moe_intermediate_size=128, n_routed_experts=8, num_experts_per_tok=2)
    return MoEConfig(hidden_size=7168, moe_intermediate_size=2048, n_routed_experts=args.experts,
                     num_experts_per_tok=args.topk)


def filled_cache(b: int, s_k: int, d_qk: int, device, gen, fmt: str = "bf16") -> PagedLatentCache:
    """A cache with ``s_k`` random rows per request (timing only: content need not come from a prefill); ``"v32"``
    holds the V3.2 FP8 encoding of random rows."""
    cache = PagedLatentCache(b, s_k + 64, d_qk, fmt, 64, device=device)
    rows = torch.randn((cache.num_blocks, 64, 1, d_qk), generator=gen, device=device).to(torch.bfloat16)
    if fmt == "bf16":
        cache.k_cache.copy_(rows)
    else:
        from deepkernels.quant import quantize_kv_cache
        cache.k_cache.copy_(quantize_kv_cache(rows, fmt))
    del rows
    cache.cache_seqlens.fill_(s_k)
    return cache


def attn_step(layer, hidden, cache):
    """One decode step that leaves the cache as it found it (append, then rewind the lengths)."""
    y = layer(hidden, cache)
    cache.cache_seqlens.sub_(hidden.shape[1])
    return y


def bench_rows(args, rank, world_size, device, seed, rows: list, save=lambda: None, go=lambda: True) -> list[dict]:
    """Timing rows for every batch size, appended to ``rows`` (rank 0) and saved after each one; ``go()`` (the same
    answer on every rank) says whether time is left. 1-GPU timings run on rank 0 while the others wait."""
    import deepkernels
    mcfg, ecfg = mla_cfg(args.cpu), moe_cfg(args)
    gen = torch.Generator(device=device).manual_seed(seed)  # draws on the device
    full = checks._build_mla(mcfg, gen, device, 0.02)
    tp = TPMLAAttention.from_full(full, rank, world_size)
    moe_full = MoELayer(ecfg, device=device).reset_parameters(gen)
    eps = {be: EPMoE(moe_full, rank, world_size, backend=be) for be in ("bf16", "fp8", "bmm")}
    one = (TPMLAAttention.from_full(full, 0, 1), {be: EPMoE(moe_full, 0, 1, backend=be) for be in ("bf16", "fp8",
                                                                                                     "bmm")}) \
        if rank == 0 else None
    del full, moe_full
    for b in args.batch:
        t_local = b // world_size
        hidden = torch.randn(b, 1, mcfg.hidden_size, generator=gen, device=device).to(torch.bfloat16)
        x_moe = torch.randn(b, ecfg.hidden_size, generator=gen, device=device).to(torch.bfloat16)
        cache = filled_cache(b, args.seqlen, mcfg.kv_cache_dim, device, gen)
        cache_v32 = None
        if mcfg.kv_cache_dim == 576:
            try:  # every rank builds it (same generator draws) or none does
                cache_v32 = filled_cache(b, args.seqlen, mcfg.kv_cache_dim, device, gen, "v32")
            except Exception as e:  # noqa: BLE001
                cache_v32 = f"{type(e).__name__}: {e}"
        # every rank draws the same tensors in the same order (the generator must stay in step across ranks)
        q_full, q_local = (torch.randn(b, 1, h, mcfg.kv_cache_dim, generator=gen, device=device).to(torch.bfloat16)
                           for h in (mcfg.num_heads, mcfg.num_heads // world_size))
        reduce_buf = torch.randn(b, mcfg.hidden_size, generator=gen, device=device)

        def kernel_fn(q):
            meta, _ = deepkernels.get_mla_metadata()
            return lambda: deepkernels.flash_mla_with_kvcache(q, cache.k_cache, cache.block_table, cache.cache_seqlens,
                                                              512, meta, softmax_scale=mcfg.softmax_scale)

        def layer_fn(attn, moe, ws):
            def f():
                h = attn_step(attn, hidden, cache).view(b, -1)
                if ws == 1:
                    return moe(h)
                part = moe(h[rank * t_local:(rank + 1) * t_local].contiguous())
                full_out = torch.empty(t_local * ws, h.shape[1], dtype=part.dtype, device=device)
                _all_gather_single(full_out, part)
                return full_out
            return f

        def v32_step(m):
            if isinstance(cache_v32, str):
                raise RuntimeError(f"no V3.2 cache: {cache_v32}")
            return lambda: attn_step(m[0], hidden, cache_v32)

        # most telling first, in case the time budget runs out
        ops = [("attn", lambda m: (lambda: attn_step(m[0], hidden, cache))), ("attn_v32", v32_step),
               ("layer_bf16", "bf16"), ("moe_bf16", "bf16"), ("all_reduce_fp32", None), ("mla_kernel", None),
               ("moe_fp8", "fp8"), ("moe_bmm", "bmm"), ("layer_bmm", "bmm")]
        for name, spec in ops:
            if not go():
                if rank == 0:
                    rows.append({"op": name, "b": b, "skipped": f"past --budget-s {args.budget_s}"})
                continue
            row = {"op": name, "b": b, "s_k": args.seqlen, "h_q_total": mcfg.num_heads,
                   "h_q_per_rank": mcfg.num_heads // world_size, "experts": ecfg.n_routed_experts,
                   "topk": ecfg.num_experts_per_tok, "hidden": ecfg.hidden_size}
            # 1 GPU (rank 0 alone)
            if rank == 0 and name != "all_reduce_fp32":  # the collective alone has no 1-GPU counterpart
                try:
                    if name.startswith("attn"):
                        fn = spec(one)
                    elif name == "mla_kernel":
                        fn = kernel_fn(q_full)
                    elif name.startswith("layer"):
                        fn = layer_fn(one[0], one[1][spec], 1)
                    else:
                        fn = (lambda m, x=x_moe: (lambda: m(x)))(one[1][spec])
                    row["one_gpu"] = time_fn(fn, device, args.warmup, args.iters)
                    if name.startswith("attn"):
                        row["one_gpu"]["route"] = one[0].last_route
                except Exception as e:  # noqa: BLE001
                    row["one_gpu"] = {"error": f"{type(e).__name__}: {e}"}
            barrier(world_size)
            # W ranks, timed together
            try:
                if name.startswith("attn"):
                    fn = spec((tp, eps))
                elif name == "mla_kernel":
                    fn = kernel_fn(q_local)
                elif name.startswith("layer"):
                    fn = layer_fn(tp, eps[spec], world_size)
                elif name == "all_reduce_fp32":  # the TP attention's collective: [b, hidden] float32
                    fn = (lambda: dist.all_reduce(reduce_buf)) if world_size > 1 else (lambda: None)
                else:
                    xl = x_moe[rank * t_local:(rank + 1) * t_local].contiguous()
                    fn = (lambda m, x=xl: (lambda: m(x)))(eps[spec])
                barrier(world_size)
                mine = time_fn(fn, device, args.warmup, args.iters)
                if name.startswith("attn"):
                    mine["route"] = tp.last_route
            except Exception as e:  # noqa: BLE001
                mine = {"error": f"{type(e).__name__}: {e}"}
            row["per_rank"] = gather_obj(mine, world_size)
            if rank == 0:
                ok = [r["median_us"] for r in row["per_rank"] if "median_us" in r]
                if "median_us" in row.get("one_gpu", {}) and len(ok) == world_size:
                    row["speedup_vs_one_gpu"] = row["one_gpu"]["median_us"] / max(ok)
                rows.append(row)
                save()
            barrier(world_size)
        del cache, cache_v32
    return rows


def check_cases(args) -> list:
    if args.cpu:
        return [("tp_mla", dict(fmt="bf16")),
                ("tp_mla", dict(cfg=checks.small_mla_config(32), fmt="v32", route="sparse", prefill=(9, 66),
                                steps=(1, 2))),
                ("ep_moe", dict(tokens=(5, 11), dead_experts=(3,))),
                ("ep_moe", dict(tokens=(7, 4), dead_experts=(2,), backend="fp8"))]
    v3 = dict(cfg=MLAConfig(), batch=4, prefill=(300, 77, 129, 5), steps=(1, 1, 2), std=0.02, max_seq_len=320)
    moe = dict(cfg=moe_cfg(args), tokens=(37, 91), dead_experts=(5,))
    return [("tp_mla", dict(v3, fmt="bf16", route="dense")),
            ("tp_mla", dict(v3, fmt="v32", route="sparse")),     # FlashMLA sparse FP8 decode at 64 heads per rank
            ("tp_mla", dict(v3, fmt="v32", route="dense")),      # the same cache dequantized, dense decode
            ("ep_moe", dict(moe, backend="bf16")),
            ("ep_moe", dict(moe, backend="fp8"))]


def verdict(case: dict) -> str:
    """'ok' / 'FAIL' / 'error' for one check case (GPU tolerances: kernels may pick other tiles per head count)."""
    if "error" in case:
        return "error"
    if case["kind"] == "tp_mla":
        rows = case["steps"]
        if any("error" in r for r in rows):
            return "error"
        good = all(r["ranks_agree_max_abs"] == 0 and r["vs_1rank"]["rel_l2"] < 5e-3 and
                   r["vs_unsharded"]["rel_l2"] < 2e-2 for r in rows)
    else:
        tol = 0.12 if case["backend"] == "fp8" else 1e-2
        good = case["vs_1rank"]["rel_l2"] < 1e-3 and case["vs_reference"]["rel_l2"] < tol and \
            case["dead_expert_rows"] == [0] * len(case["dead_experts"])
    return "ok" if good else "FAIL"


def main(argv=None) -> int:
    args = parse_args(argv)
    t_start = time.time()
    rank, world_size, device = init_distributed(backend="gloo" if args.cpu else None, timeout_s=180)
    if args.cpu:
        torch.set_num_threads(1)
    report: dict = {"args": {k: v for k, v in vars(args).items()}, "steps": {}}
    out_path = os.path.join(args.out, "parallel_decode.json")

    def save():
        if rank == 0:
            os.makedirs(args.out, exist_ok=True)
            with open(out_path, "w") as f:
                json.dump(report, f, indent=1, default=str)

    def time_left() -> bool:  # rank 0 decides, everyone follows (same collectives on every rank)
        go = torch.tensor([1 if time.time() - t_start < args.budget_s else 0], device=device)
        if world_size > 1:
            dist.broadcast(go, 0)
        return bool(go.item())

    def step(name, fn):
        if not time_left():
            report["steps"][name] = {"skipped": f"past --budget-s {args.budget_s}"}
            save()
            return None
        t0 = time.time()
        try:
            res = fn()
            report["steps"][name] = {"ok": True, "seconds": round(time.time() - t0, 2)}
        except Exception as e:  # noqa: BLE001
            res = None
            report["steps"][name] = {"ok": False, "seconds": round(time.time() - t0, 2),
                                     "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
        if rank == 0:
            print(f"[{time.time() - t_start:6.1f}s] {name}: {report['steps'][name].get('error', 'done')}",
                  flush=True)
        save()
        return res

    report["provenance"] = step("provenance", lambda: provenance(world_size, device))
    seed = checks.shared_seed(device)
    report["seed"] = seed
    if not args.skip_checks:
        report["checks"] = step("checks", lambda: checks.run_cases(rank, world_size, device, check_cases(args)))
        for c in (report["checks"] or []) if rank == 0 else []:
            try:
                c["verdict"] = verdict(c)
            except Exception as e:  # noqa: BLE001
                c["verdict"] = f"error: {type(e).__name__}: {e}"
    report["timing"] = []
    step("timing", lambda: bench_rows(args, rank, world_size, device, seed, report["timing"], save, time_left))
    report["total_s"] = round(time.time() - t_start, 1)
    save()
    if rank == 0:
        try:
            print_table(report)
        except Exception:  # noqa: BLE001 - the JSON is written; say why the table is not
            traceback.print_exc()
    shutdown_distributed()
    return 0


def print_table(report: dict) -> None:
    print("\n== checks (2 ranks vs 1 rank)")
    for c in report.get("checks") or []:
        if c["kind"] == "tp_mla":
            detail = "" if "steps" not in c else "worst vs_1rank rel {:.2e}, vs_unsharded rel {:.2e}, routes {}".format(
                max(r.get("vs_1rank", {}).get("rel_l2", float("nan")) for r in c["steps"]),
                max(r.get("vs_unsharded", {}).get("rel_l2", float("nan")) for r in c["steps"]),
                sorted({r["route"] for r in c["steps"]}))
            print(f"  tp_mla fmt={c.get('fmt', 'bf16'):5s} route={c.get('route', c.get('route_requested', 'auto')):6s} "
                  f"{c.get('verdict', '?'):5s} {detail}"
                  f"{c.get('error', '')[:160]}")
        else:
            detail = "" if "vs_1rank" not in c else (f"vs_1rank rel {c['vs_1rank']['rel_l2']:.2e}, vs_reference rel "
                                                     f"{c['vs_reference']['rel_l2']:.2e}")
            print(f"  ep_moe backend={c.get('backend', 'bf16'):4s} {c.get('verdict', '?'):5s} {detail}{c.get('error', '')[:160]}")
    print(f"\n== decode-step time per rank vs one GPU (median µs; total {report.get('total_s')} s)")
    print(f"  {'op':15s} {'b':>4s} {'1 GPU':>10s} {'rank 0':>10s} {'rank 1':>10s} {'speedup':>8s}")
    for r in report.get("timing") or []:
        if "skipped" in r:
            print(f"  {r['op']:15s} {r['b']:4d} skipped ({r['skipped']})")
            continue
        one = r.get("one_gpu", {})
        per = [p.get("median_us", "err") for p in r.get("per_rank", [])]
        fmt = lambda v: f"{v:10.1f}" if isinstance(v, (int, float)) else f"{'-' if v is None else 'err':>10s}"
        sp = r.get("speedup_vs_one_gpu")
        print(f"  {r['op']:15s} {r['b']:4d} {fmt(one.get('median_us', 'err' if one else None))} "
              + " ".join(fmt(p) for p in (per + [None, None])[:2])
              + (f" {sp:7.2f}x" if sp else "        -"))
        for where, v in [("1gpu", one)] + [(f"rank{i}", p) for i, p in enumerate(r.get("per_rank", []))]:
            if "error" in v:
                print(f"      {where}: {v['error'][:200]}")
    for name, s in report.get("steps", {}).items():
        if not s.get("ok", True) or "skipped" in s:
            print(f"  step {name}: {s.get('error') or s.get('skipped')}")


if __name__ == "__main__":
    with torch.no_grad():
        rc = main()
    sys.exit(rc)
