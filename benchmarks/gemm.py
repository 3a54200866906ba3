"""Dense GEMM benchmark: deepkernels FP8 block-scaled GEMM vs cuBLAS blockwise (``torch._scaled_mm``) and
deepkernels BF16 GEMM vs ``torch.matmul``, on DeepSeek-V3's 18 dense shapes (M in {64, 128, 4096} x 6 (N, K)).

Timing: ``triton.testing.do_bench`` (median of CUDA-event timings of the whole call, L2 flushed between calls),
as in shared/ANCHORS.md. FLOPs = 2MNK; bytes as DeepGEMM's ``count_bytes(a, b, d)`` (FP8 data + FP32 scale
tensors + BF16 output). ``--sweep`` times every candidate config per shape (after a correctness check) and
reports the best one, which is what ``gemm/_configs.py``'s table is set from.

Every swept candidate gets both the whole-call time (``us``; host overhead included, what users see) and,
with ``--graph``, the CUDA-graph replay time (``graph_us``; kernel only, L2 warm); cuBLAS likewise. ``--host``
measures the host cost per call (no GPU wait: a 200-call loop of a launch-bound shape) for the cached fast
path and for the full validate + ``JITFunction.run`` path. ``--precompile N`` compiles every candidate in N
worker processes first (shared Triton disk cache), so the sweep does not pay compiles serially.

    python benchmarks/gemm.py [--sweep] [--bf16] [--graph] [--host] [--precompile N] [--out FILE.json] [--dry-run]
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time

import torch

SHAPES_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
SHAPES_M = [64, 128, 4096]


def _measure(entry: dict, call, d, ref, tol: float, dry: bool, graph: bool) -> None:
    """Run one candidate into a NaN-poisoned ``d``, check calc_diff < tol and no unwritten element, and only then
    time it (whole call, and CUDA-graph replay when ``graph``); failures are recorded in ``entry``."""
    from deepkernels.testing import calc_diff

    try:
        d.fill_(float("nan"))
        call()
        entry["diff"] = float(calc_diff(d.float(), ref))
        entry["ok"] = bool(entry["diff"] < tol and not torch.isnan(d).any())
        entry["us"] = bench(call, dry) if entry["ok"] else None
        if entry["ok"] and graph and not dry:
            entry["graph_us"] = bench_graph(call)
    except Exception as e:
        entry["ok"], entry["us"], entry["error"] = False, None, f"{type(e).__name__}: {str(e)[:200]}"


def provenance() -> dict:
    import triton
    p = {"torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
         "git_sha": os.environ.get("GIT_SHA") or _git_sha(), "time_utc": datetime.datetime.utcnow().isoformat()}
    if torch.cuda.is_available():
        p["gpu"] = torch.cuda.get_device_name()
        p["num_sms"] = torch.cuda.get_device_properties(0).multi_processor_count
        p["cuda"] = torch.version.cuda
        try:
            p["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         capture_output=True, text=True, timeout=20).stdout.strip()
        except Exception:
            p["driver"] = None
    return p


def _git_sha():
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception:
        return None


def bench(fn, dry: bool, warmup=5, rep=25) -> float:
    """Median µs per call."""
    if dry:
        fn()
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e6
    import triton.testing
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median") * 1e3


def bench_graph(fn):
    """Mean CUDA-graph replay time in µs (host overhead removed; L2 not flushed). None on failure."""
    try:
        import triton.testing
        return triton.testing.do_bench_cudagraph(fn, rep=20) * 1e3
    except Exception as e:  # never let this optional measurement break a run
        print(f"  (graph timing failed: {type(e).__name__}: {str(e)[:120]})", flush=True)
        return None


def fp8_inputs(m, n, k, device):
    from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
    a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, k, device=device, dtype=torch.bfloat16)
    return per_token_cast_to_fp8(a, use_ue8m0=False), per_block_cast_to_fp8(b, use_ue8m0=False)


def fp8_bytes(m, n, k) -> int:
    sfk = math.ceil(k / 128)
    return m * k + m * sfk * 4 + n * k + math.ceil(n / 128) * sfk * 4 + m * n * 2


def cublas_blockwise(A, B, n):
    """torch._scaled_mm with 1x128 (MN-major) x 128x128 (transposed contiguous) scales; None if refused."""
    if n % 128 != 0:
        return None, "refused (N % 128 != 0)"
    sfa = A[1].T.contiguous().T
    sfb = B[1].contiguous().T
    fn = lambda: torch._scaled_mm(A[0], B[0].T, scale_a=sfa, scale_b=sfb, out_dtype=torch.bfloat16)  # noqa: E731
    try:
        return fn, None
    except Exception as e:  # pragma: no cover
        return None, f"refused ({type(e).__name__}: {e})"[:200]


def dequant_ref(A, B, k):
    sa = A[1].repeat_interleave(128, 1)[:, :k]
    sb = B[1].repeat_interleave(128, 0)[:B[0].shape[0]].repeat_interleave(128, 1)[:, :k]
    return (A[0].float() * sa) @ (B[0].float() * sb).T


def host_overhead(device: str) -> dict:
    """Host µs per call (200 back-to-back calls of a launch-bound shape, one sync at the end): the cached
    fast path vs the full path (plan cache cleared before every call: validation + JITFunction.run)."""
    from deepkernels.gemm import dense
    m, n, k = (64, 2112, 7168) if device == "cuda" else (8, 64, 128)
    A, B = fp8_inputs(m, n, k, device)
    d = torch.empty(m, n, dtype=torch.bfloat16, device=device)
    a16, b16 = torch.randn(m, k, device=device).bfloat16(), torch.randn(n, k, device=device).bfloat16()
    out = {}

    def loop(fn, reps=200):
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(reps):
            fn()
        host = (time.perf_counter() - t) / reps * 1e6
        if device == "cuda":
            torch.cuda.synchronize()
        return host

    def full_fp8():
        dense._FP8_PLANS.clear()
        dense.fp8_gemm_nt(A, B, d)

    def full_bf16():
        dense._BF16_PLANS.clear()
        dense.bf16_gemm_nt(a16, b16, d)
    out["fp8_fast"] = loop(lambda: dense.fp8_gemm_nt(A, B, d))
    out["fp8_full"] = loop(full_fp8)
    out["bf16_fast"] = loop(lambda: dense.bf16_gemm_nt(a16, b16, d))
    out["bf16_full"] = loop(full_bf16)
    if device == "cuda":
        sfa, sfb = A[1].T.contiguous().T, B[1].contiguous().T
        out["cublas_scaled_mm"] = loop(lambda: torch._scaled_mm(A[0], B[0].T, scale_a=sfa, scale_b=sfb,
                                                                out_dtype=torch.bfloat16))
    print("host us/call:", {k_: round(v, 1) for k_, v in out.items()}, flush=True)
    return out


def _precompile_one(task):
    kind, cfg_dict, shapes = task
    import deepkernels  # noqa: F401
    from deepkernels.gemm import dense
    from deepkernels.gemm._configs import GemmConfig
    cfg = GemmConfig(**cfg_dict)
    try:
        for m, n, k in shapes:
            if kind == "fp8":
                A, B = fp8_inputs(m, n, k, "cuda")
                dense.fp8_gemm_nt(A, B, torch.empty(m, n, dtype=torch.bfloat16, device="cuda"), _config=cfg)
            else:
                a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
                b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
                dense.bf16_gemm_nt(a, b, torch.empty(m, n, dtype=torch.bfloat16, device="cuda"), _config=cfg)
        torch.cuda.synchronize()
        return None
    except Exception as e:
        return f"{kind} {cfg.name()}: {type(e).__name__}: {str(e)[:150]}"


def precompile(workers: int, bf16: bool) -> None:
    """Compile every candidate (at production-like and test-like specialisations) in parallel processes; the
    Triton disk cache makes the later in-process compiles cache hits."""
    import multiprocessing as mp
    from deepkernels.gemm._configs import BF16_CANDIDATES, BF16_TABLE, FP8_CANDIDATES, FP8_TABLE
    shapes = [(64, 2112, 7168), (300, 1000, 1152)]
    tasks = [("fp8", c.to_dict(), shapes) for c in dict.fromkeys(FP8_CANDIDATES + list(FP8_TABLE.values()))]
    if bf16:
        tasks += [("bf16", c.to_dict(), shapes) for c in dict.fromkeys(BF16_CANDIDATES + list(BF16_TABLE.values()))]
    t = time.perf_counter()
    with mp.get_context("spawn").Pool(workers) as pool:
        errs = [e for e in pool.map(_precompile_one, tasks, chunksize=1) if e]
    print(f"precompiled {len(tasks)} configs in {time.perf_counter() - t:.1f} s with {workers} workers; "
          f"errors: {errs}", flush=True)


def run(args) -> dict:
    import deepkernels as dk
    from deepkernels.gemm import dense
    from deepkernels.gemm._configs import (BF16_CANDIDATES, FP8_LARGE_M_CANDIDATES, FP8_SMALL_M_CANDIDATES,
                                           select_bf16_config, select_fp8_config)
    from deepkernels.testing import calc_diff

    dry = args.dry_run
    device = "cpu" if dry else "cuda"
    ms = [int(x) for x in args.m.split(",")] if args.m else SHAPES_M
    nks = SHAPES_NK if not dry else [(256, 256), (192, 640)]
    if dry:
        ms = [8, 200]
    result = {"provenance": provenance(), "fp8": [], "bf16": [], "args": vars(args)}
    num_sms = dense.get_num_sms()
    if args.host:
        try:
            result["host"] = host_overhead(device)
        except Exception as e:
            print(f"host timing failed: {type(e).__name__}: {e}", flush=True)

    def save():
        if args.out:
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1)

    for m in ms:
        for n, k in nks:
            torch.manual_seed(m * 7 + n + k)
            A, B = fp8_inputs(m, n, k, device)
            d = torch.empty(m, n, dtype=torch.bfloat16, device=device)
            flops, nbytes = 2 * m * n * k, fp8_bytes(m, n, k)
            ref = dequant_ref(A, B, k)
            row = {"op": "fp8_gemm_nt", "m": m, "n": n, "k": k, "flops": flops, "bytes": nbytes}
            fn, why = (None, "dry run") if dry else cublas_blockwise(A, B, n)
            if fn is not None:
                try:
                    out = fn()
                    row["cublas_diff"] = float(calc_diff(out.float(), ref))
                    row["cublas_us"] = bench(fn, dry)
                except Exception as e:
                    row["cublas_us"], why = None, f"refused ({type(e).__name__}: {str(e)[:150]})"
            else:
                row["cublas_us"] = None
            row["cublas_note"] = why
            sel = select_fp8_config(m, n, k, num_sms)
            cands = [sel]
            if args.sweep:
                pool = FP8_SMALL_M_CANDIDATES if m <= 128 else FP8_LARGE_M_CANDIDATES
                cands += [c for c in pool if c != sel]
            sweep = []
            for cfg in cands:
                entry = {"config": cfg.name(), "cfg": cfg.to_dict(), "selected": cfg == sel}
                _measure(entry, lambda cfg=cfg: dense.fp8_gemm_nt(A, B, d, _config=cfg), d, ref, 1e-4, dry,
                         args.graph)
                sweep.append(entry)
            good = [e for e in sweep if e.get("us")]
            best = min(good, key=lambda e: e["us"]) if good else None
            gbest = min((e for e in good if e.get("graph_us")), key=lambda e: e["graph_us"], default=None)
            if gbest:
                row.update(graph_best_config=gbest["config"], graph_best_us=gbest["graph_us"])
            row["sweep"] = sweep
            row["selected_us"] = sweep[0].get("us")
            if best:
                row.update(best_config=best["config"], best_cfg=best["cfg"], us=best["us"],
                           tflops=flops / best["us"] / 1e6, gbps=nbytes / best["us"] / 1e3)
                if row["cublas_us"]:
                    row["cublas_tflops"] = flops / row["cublas_us"] / 1e6
                    row["ratio_vs_cublas"] = row["cublas_us"] / best["us"]
            if args.graph and not dry and best:
                row["graph_us"] = best.get("graph_us")
                if fn is not None:
                    row["cublas_graph_us"] = bench_graph(fn)
                    if row.get("graph_best_us") and row["cublas_graph_us"]:
                        row["graph_ratio_vs_cublas"] = row["cublas_graph_us"] / row["graph_best_us"]
            result["fp8"].append(row)
            print(f"fp8 m={m:5d} n={n:6d} k={k:6d}: ours {row.get('us') or float('nan'):9.1f} us "
                  f"{row.get('tflops', float('nan')):7.1f} TFLOPS {row.get('gbps', float('nan')):7.0f} GB/s "
                  f"[{row.get('best_config')}] | cuBLAS {row['cublas_us'] or float('nan'):9.1f} us "
                  f"ratio {row.get('ratio_vs_cublas', float('nan')):.2f} {why or ''}| graph ours "
                  f"{row.get('graph_best_us') or float('nan'):.1f} [{row.get('graph_best_config')}] cuBLAS "
                  f"{row.get('cublas_graph_us') or float('nan'):.1f}", flush=True)
            save()
    ratios = [r["ratio_vs_cublas"] for r in result["fp8"] if r.get("ratio_vs_cublas")]
    result["fp8_geomean_vs_cublas"] = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None
    result["fp8_graph_geomean_vs_cublas"] = _geo([r["graph_ratio_vs_cublas"] for r in result["fp8"]
                                                  if r.get("graph_ratio_vs_cublas")])
    result["fp8_geomean_selected_vs_cublas"] = _geo([r["cublas_us"] / r["selected_us"] for r in result["fp8"]
                                                     if r.get("cublas_us") and r.get("selected_us")])
    save()

    if args.bf16:
        for m in ms:
            for n, k in nks:
                a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
                b = torch.randn(n, k, device=device, dtype=torch.bfloat16)
                d = torch.empty(m, n, dtype=torch.bfloat16, device=device)
                flops, nbytes = 2 * m * n * k, 2 * (m * k + n * k + m * n)
                ref = torch.matmul(a, b.T)
                row = {"op": "bf16_gemm_nt", "m": m, "n": n, "k": k, "flops": flops, "bytes": nbytes,
                       "torch_us": bench(lambda: torch.matmul(a, b.T), dry)}
                if args.graph and not dry:
                    row["torch_graph_us"] = bench_graph(lambda: torch.matmul(a, b.T))
                sel = select_bf16_config(m, n, k, num_sms)
                cands = [sel] + ([c for c in BF16_CANDIDATES if c != sel] if args.sweep else [])
                sweep = []
                for cfg in cands:
                    entry = {"config": cfg.name(), "cfg": cfg.to_dict(), "selected": cfg == sel}
                    _measure(entry, lambda cfg=cfg: dense.bf16_gemm_nt(a, b, d, _config=cfg), d, ref.float(), 1e-5,
                             dry, args.graph)
                    sweep.append(entry)
                good = [e for e in sweep if e.get("us")]
                row["sweep"] = sweep
                row["selected_us"] = sweep[0].get("us")
                if good:
                    best = min(good, key=lambda e: e["us"])
                    row.update(best_config=best["config"], best_cfg=best["cfg"], us=best["us"],
                               tflops=flops / best["us"] / 1e6, gbps=nbytes / best["us"] / 1e3,
                               ratio_vs_torch=row["torch_us"] / best["us"])
                result["bf16"].append(row)
                print(f"bf16 m={m:5d} n={n:6d} k={k:6d}: ours {row.get('us') or float('nan'):9.1f} us "
                      f"{row.get('tflops', float('nan')):7.1f} TFLOPS [{row.get('best_config')}] | torch "
                      f"{row['torch_us']:9.1f} us ratio {row.get('ratio_vs_torch', float('nan')):.2f}", flush=True)
                save()
        result["bf16_geomean_vs_torch"] = _geo([r["ratio_vs_torch"] for r in result["bf16"]
                                                if r.get("ratio_vs_torch")])
        save()
    summary(result)
    return result


def _geo(xs):
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def summary(result: dict) -> None:
    print("\n== FP8 GEMM summary (best swept config) ==")
    nan = float("nan")
    print(f"{'M':>5} {'N':>6} {'K':>6} {'us':>8} {'TFLOPS':>7} {'GB/s':>6} {'cuBLAS TF':>9} {'ratio':>6} "
          f"{'config':26s} | {'graph us':>8} {'cuBLAS g':>8} {'g ratio':>7} graph config")
    for r in result["fp8"]:
        print(f"{r['m']:5d} {r['n']:6d} {r['k']:6d} {r.get('us') or nan:8.1f} "
              f"{r.get('tflops', nan):7.1f} {r.get('gbps', nan):6.0f} "
              f"{r.get('cublas_tflops', nan):9.1f} {r.get('ratio_vs_cublas', nan):6.2f} "
              f"{str(r.get('best_config')):26s} | {r.get('graph_best_us') or nan:8.1f} "
              f"{r.get('cublas_graph_us') or nan:8.1f} {r.get('graph_ratio_vs_cublas', nan):7.2f} "
              f"{r.get('graph_best_config')}")
    print(f"geomean vs cuBLAS: best {result.get('fp8_geomean_vs_cublas')}, "
          f"selected {result.get('fp8_geomean_selected_vs_cublas')}, graph {result.get('fp8_graph_geomean_vs_cublas')}")
    if result.get("host"):
        print("host us/call:", json.dumps(result["host"]))
    if result.get("bf16"):
        print(f"BF16 geomean vs torch.matmul: {result.get('bf16_geomean_vs_torch')}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sweep", action="store_true", help="time every candidate config per shape")
    p.add_argument("--bf16", action="store_true", help="also benchmark the BF16 GEMM against torch.matmul")
    p.add_argument("--graph", action="store_true",
                   help="also time the best config and cuBLAS under CUDA-graph replay (no host overhead)")
    p.add_argument("--host", action="store_true", help="measure host µs per call (fast vs full path)")
    p.add_argument("--precompile", type=int, default=0, help="compile all candidates in N processes and exit")
    p.add_argument("--m", default="", help="comma-separated M values (default 64,128,4096)")
    p.add_argument("--out", default="", help="write JSON results here")
    p.add_argument("--dry-run", action="store_true", help="CPU check of the script at tiny shapes (no timing)")
    args = p.parse_args(argv)
    if not args.dry_run and not torch.cuda.is_available():
        sys.exit("needs CUDA (use --dry-run to check the script on a CPU)")
    if args.precompile:
        precompile(args.precompile, args.bf16)
        return
    run(args)


if __name__ == "__main__":
    main()
