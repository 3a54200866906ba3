"""Where each bench row's time goes, kernel by kernel (torch.profiler / CUPTI device timestamps).

For every case of `deepkernels bench` (or the suites named), runs our public op a few times to warm up, then
N times under `torch.profiler` (CUDA activity only) and reports per call: each GPU kernel's name, count and device
time, the sum of kernel time, and the span from the first kernel's start to the last kernel's end (span - sum =
idle gaps between the call's kernels, e.g. host launch latency). No L2 flush between calls (back to back, as in a
serving loop); the bench's timed rows use CUDA graphs, so compare shares here, not absolute times.

Usage (device): python benchmarks/kernel_breakdown.py --suites mla,sparse,prefill --json $OUT/breakdown.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from deepkernels.bench.cases import build_cases  # noqa: E402


def _short(name: str) -> str:
    return name if len(name) <= 90 else name[:87] + "..."


def profile_case(case, iters: int) -> dict:
    t = case.setup()
    for _ in range(3):
        case.ours(t)
    torch.cuda.synchronize()
    act = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=act) as prof:
        for _ in range(iters):
            case.ours(t)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    per = {}
    for e in kernels:
        d = per.setdefault(e.name, [0, 0.0])
        d[0] += 1
        d[1] += e.time_range.end - e.time_range.start
    total = sum(v[1] for v in per.values()) / iters
    span = (max(e.time_range.end for e in kernels) - min(e.time_range.start for e in kernels)) / iters if kernels else 0
    rows = sorted(([_short(k), v[0] / iters, v[1] / iters] for k, v in per.items()), key=lambda r: -r[2])
    return {"name": case.name, "suite": case.suite, "kernel_us": total, "span_us": span,
            "tflops_kernel_sum": case.flops / (total * 1e-6) / 1e12 if total else None,
            "gbps_kernel_sum": case.nbytes / (total * 1e-6) / 1e9 if total else None,
            "kernels": [{"name": n, "count": c, "us": u, "share": u / total if total else 0} for n, c, u in rows]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suites", default="mla,sparse,prefill")
    ap.add_argument("--match", default="", help="only cases whose name contains this text")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    out = {"provenance": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                          "git_sha": os.environ.get("GIT_SHA", "unknown"), "utc": time.strftime("%Y-%m-%d %H:%M:%S",
                                                                                                time.gmtime())},
           "rows": []}
    for suite in a.suites.split(","):
        for case in build_cases("cuda", small=False, quick=False, only=suite):
            if a.match and a.match not in case.name:
                continue
            try:
                r = profile_case(case, a.iters)
            except Exception as e:  # noqa: BLE001 - reported, the other cases still run
                r = {"name": case.name, "suite": suite, "error": f"{type(e).__name__}: {e}"}
            out["rows"].append(r)
            if "error" in r:
                print(f"{r['name']}: ERROR {r['error']}", flush=True)
                continue
            ks = "; ".join(f"{k['name'][:40]} x{k['count']:g} {k['us']:.1f}us" for k in r["kernels"][:4])
            print(f"{r['name'][:60]:60s} sum {r['kernel_us']:8.1f} us span {r['span_us']:8.1f} | {ks}", flush=True)
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
