"""Split-KV schedule sweep: does the scheduler's per-request cost model (FIXED_OVERHEAD_BLOCKS) fit our kernels?

The device scheduler (`deepkernels.mla.metadata.compute_schedule`) charges each request ``blocks + overhead`` units
(overhead 5 64-token blocks, FlashMLA's value) and gives every part an equal share of the line. If a request piece
really costs our kernels more than 5 blocks (Q load, pipeline refill, epilogue, the fp32 split write), parts with
more pieces finish late and the launch's makespan grows by a constant independent of s_k -- which is what
`kernel_breakdown.py` showed at s_k 4K. This times the same bench cases (`deepkernels bench` inputs, the public
`flash_mla_with_kvcache` call, main kernel + combine, CUDA-graph replay, L2 flushed by do_bench) under schedules
with other overheads, plus FlashMLA's greedy schedule (host port `reference.mla.flashmla_schedule`), in rotated
rounds; ``lin5b`` repeats the production schedule as the A/A control. Each variant's output is checked against the
production schedule's (split points differ, so not bit-identical: max |out diff| and |lse diff| reported).

Usage (device): python benchmarks/mla_sched_sweep.py [--rounds 3] [--json out.json] [--match "h_q=128"]
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import deepkernels as dk  # noqa: E402
import deepkernels.mla.decode as dec  # noqa: E402
import deepkernels.mla.metadata as md  # noqa: E402
import deepkernels.mla.sparse_decode as sdec  # noqa: E402
from deepkernels.bench.cases import build_cases  # noqa: E402
from deepkernels.reference.mla import flashmla_schedule  # noqa: E402

DENSE = ["s_q=1 h_q=128 s_k~4096", "s_q=1 h_q=128 s_k~8192", "s_q=1 h_q=128 s_k~16384", "s_q=2 h_q=128 s_k~8192",
         "s_q=1 h_q=128 s_k~32768", "s_q=2 h_q=128 s_k~4096",
         "s_q=1 h_q=64 s_k~4096", "s_q=1 h_q=16 s_k~4096", "s_q=1 h_q=32 s_k~4096", "s_q=1 h_q=16 s_k~16384"]
SPARSE = ["v32 b=64 s_q=1 h_q=128", "v41 b=128 s_q=1 h_q=128", "v32 b=128 s_q=2 h_q=128"]
VARIANTS = {"lin5": 5, "lin5b": 5, "lin10": 10, "lin16": 16, "lin24": 24, "fm5": "flashmla"}
_ORIG = md.compute_schedule


def _flashmla_on_device(counts, parts, fixed_overhead=md.FIXED_OVERHEAD_BLOCKS):
    meta, ns = flashmla_schedule(counts.cpu(), int(parts), fixed_overhead)
    return meta.to(counts.device), ns.to(counts.device)


def set_variant(v) -> None:
    """Point both decode paths' schedule at variant ``v`` (an overhead in blocks, or "flashmla")."""
    if v == "flashmla":
        dec.compute_schedule = sdec.compute_schedule = _flashmla_on_device
        sdec.FIXED_OVERHEAD_BLOCKS = md.FIXED_OVERHEAD_BLOCKS
    else:
        dec.compute_schedule = functools.partial(_ORIG, fixed_overhead=v)
        sdec.compute_schedule = _ORIG
        sdec.FIXED_OVERHEAD_BLOCKS = v


def graph_of(case, t):
    case.ours(t)                      # fills the fresh schedule object outside the capture
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        case.ours(t)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        res = case.ours(t)
    return g, res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--match", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    cases = [c for c in build_cases("cuda", False, False, only="mla") if any(k in c.name for k in DENSE)]
    cases += [c for c in build_cases("cuda", False, False, only="sparse") if any(k in c.name for k in SPARSE)]
    cases = [c for c in cases if a.match in c.name]
    out = {"provenance": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                          "git_sha": os.environ.get("GIT_SHA", "unknown"),
                          "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())},
           "variants": {k: str(v) for k, v in VARIANTS.items()}, "rows": []}
    for case in cases:
        t = case.setup()
        graphs, scheds, ref = {}, {}, None
        row = {"name": case.name, "flops": case.flops, "err": {}, "us": {k: [] for k in VARIANTS}}
        for k, v in VARIANTS.items():
            set_variant(v)
            # each graph reads its own schedule tensors at replay: keep every variant's metadata object alive
            scheds[k] = t["sched"] = dk.get_mla_metadata()[0]
            g, res = graph_of(case, t)
            g.replay()
            torch.cuda.synchronize()
            o, lse = res[0].float(), res[1]
            if ref is None:
                ref = (o.clone(), lse.clone())
            fin = torch.isfinite(lse) | (lse == float("inf"))
            row["err"][k] = [float((o - ref[0]).abs().max()), float((lse - ref[1]).abs()[fin].max()),
                             bool(torch.isfinite(o).all())]
            graphs[k] = g
        set_variant(md.FIXED_OVERHEAD_BLOCKS)
        names = list(VARIANTS)
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for k in order:
                row["us"][k].append(triton.testing.do_bench(graphs[k].replay, warmup=10, rep=50,
                                                            return_mode="median") * 1e3)
        med = {k: statistics.median(v) for k, v in row["us"].items()}
        row["median_us"] = med
        row["ratio_vs_lin5"] = {k: med[k] / med["lin5"] for k in med}
        row["tflops"] = {k: case.flops / (med[k] * 1e-6) / 1e12 for k in med}
        out["rows"].append(row)
        print(f"{case.name[:52]:52s} " + " ".join(f"{k} {med[k]:7.1f}us({row['ratio_vs_lin5'][k]:.3f})"
                                                   for k in names), flush=True)
        print(f"{'':52s} err " + " ".join(f"{k} {e[0]:.1e}/{e[1]:.1e}{'' if e[2] else ' NONFINITE'}"
                                           for k, e in row["err"].items()), flush=True)
        del graphs, scheds, t
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
