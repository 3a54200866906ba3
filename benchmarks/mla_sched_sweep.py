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

Variant ``greedy`` (session 21): the same greedy schedule computed on the device by
``compute_schedule(..., algorithm="greedy")`` (one Triton launch, no host sync); its records are checked equal to
``fm5``'s (``greedy_eq_fm5`` per row). ``--sched-timing`` also times the schedule kernels themselves (linear vs greedy,
b x parts grid, CUDA graph of 50 back-to-back calls, rotated rounds, A/A = linear twice). ``--rows greedy`` picks the
six sparse h_q 128 rows, V4.1+FP4 b 64 s_q 1 h_q 128 and three dense h_q 128 rows.

Usage (device): python benchmarks/mla_sched_sweep.py [--rounds 3] [--json out.json] [--match "h_q=128"]
                [--variants lin5,lin5b,fm5,greedy] [--rows s21|greedy] [--sched-timing] [--budget-s 100]
"""
from __future__ import annotations

import argparse
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
from deepkernels.bench.runner import capture_graph  # noqa: E402
from deepkernels.reference.mla import flashmla_schedule  # noqa: E402

DENSE = ["s_q=1 h_q=128 s_k~4096", "s_q=1 h_q=128 s_k~8192", "s_q=1 h_q=128 s_k~16384", "s_q=2 h_q=128 s_k~8192",
         "s_q=1 h_q=128 s_k~32768", "s_q=2 h_q=128 s_k~4096",
         "s_q=1 h_q=64 s_k~4096", "s_q=1 h_q=16 s_k~4096", "s_q=1 h_q=32 s_k~4096", "s_q=1 h_q=16 s_k~16384"]
SPARSE = ["v32 b=64 s_q=1 h_q=128", "v41 b=128 s_q=1 h_q=128", "v32 b=128 s_q=2 h_q=128"]
# --rows greedy: every sparse h_q 128 row of the bench (V3.2 / V4.1 x b 64 s_q 1, b 128 s_q 1, b 128 s_q 2), V4.1+FP4
# b 64 s_q 1 h_q 128, and three dense h_q 128 rows
ROWS_GREEDY_SPARSE = [f"{f} {r} h_q=128 " for f in ("v32", "v41") for r in ("b=64 s_q=1", "b=128 s_q=1", "b=128 s_q=2")]
ROWS_GREEDY_SPARSE.append("v41+fp4 b=64 s_q=1 h_q=128 ")
# h_q 64 (the dispatch rule b <= 2 x parts applies there too: 132 parts at s_q 1): measured after the dispatch
ROWS_GREEDY_SPARSE += [f"{f} {r} h_q=64 " for f in ("v32", "v41") for r in ("b=64 s_q=1", "b=128 s_q=1", "b=128 s_q=2")]
ROWS_GREEDY_DENSE = ["s_q=1 h_q=128 s_k~4096", "s_q=1 h_q=128 s_k~8192", "s_q=2 h_q=128 s_k~4096"]
VARIANTS = {"lin5": 5, "lin5b": 5, "lin10": 10, "lin16": 16, "lin24": 24, "fm5": "flashmla", "greedy": "greedy"}
_ORIG = md.compute_schedule


def _flashmla_on_device(counts, parts, fixed_overhead=md.FIXED_OVERHEAD_BLOCKS, algorithm=None):
    meta, ns = flashmla_schedule(counts.cpu(), int(parts), fixed_overhead)
    return meta.to(counts.device), ns.to(counts.device)


def _forced(algorithm, overhead=None):
    """compute_schedule with the algorithm (and overhead) fixed, whatever the decode path asks for (the sparse path
    asks for "greedy" at b <= 2 x parts since session 21: a "lin" variant must stay linear)."""
    def sched(counts, parts, fixed_overhead=md.FIXED_OVERHEAD_BLOCKS, **_asked):   # the caller's algorithm= ignored
        return _ORIG(counts, parts, fixed_overhead if overhead is None else overhead, algorithm=algorithm)
    return sched


def set_variant(v) -> None:
    """Point both decode paths' schedule at variant ``v`` (an overhead in blocks for the linear schedule,
    "flashmla" (host port) or "greedy" (device port)), overriding the sparse path's own choice."""
    if v == "flashmla":
        dec.compute_schedule = sdec.compute_schedule = _flashmla_on_device
    elif v == "greedy":
        dec.compute_schedule = sdec.compute_schedule = _forced("greedy")
    else:
        dec.compute_schedule = sdec.compute_schedule = _forced("linear", v)
    sdec.FIXED_OVERHEAD_BLOCKS = md.FIXED_OVERHEAD_BLOCKS


def graph_of(case, t):
    case.ours(t)                      # fills the fresh schedule object outside the capture
    torch.cuda.synchronize()
    return capture_graph(lambda: case.ours(t))


SCHED_BS = (1, 64, 128, 1024, 8192)
SCHED_PARTS = (33, 66, 132)


def _sched_counts(kind, b, g):
    if kind == "sparse2048":
        return torch.full((b,), 2048, dtype=torch.int32, device="cuda")
    return torch.randint(0, 16384, (b,), generator=g, dtype=torch.int32).cuda()


def sched_timing(rounds: int, calls: int = 50) -> list[dict]:
    """Per-call device time of the schedule kernels: linear (production) vs greedy, CUDA graph of ``calls``
    back-to-back calls (allocation included, as in a captured decode step), do_bench median / calls; rotated rounds,
    ``linear_b`` = the linear kernel timed twice (A/A). The greedy records are checked against the host port."""
    g = torch.Generator().manual_seed(0)
    algos = {"linear": "linear", "linear_b": "linear", "greedy": "greedy"}
    rows = []
    grid = [("sparse2048", b, parts) for b in SCHED_BS for parts in SCHED_PARTS]
    grid += [("dense_rand", b, parts) for b in (64, 1024, 8192) for parts in (66, 132)]
    for kind, b, parts in grid:
        counts = _sched_counts(kind, b, g)
        graphs, keep = {}, []
        for name, algo in algos.items():
            md.compute_schedule(counts, parts, algorithm=algo)      # compile / bind
            torch.cuda.synchronize()
            gr = torch.cuda.CUDAGraph()
            with torch.cuda.graph(gr):
                keep.append([md.compute_schedule(counts, parts, algorithm=algo) for _ in range(calls)])
            graphs[name] = gr
        meta, ns = md.compute_schedule(counts, parts, algorithm="greedy")
        m_ref, n_ref = flashmla_schedule(counts.cpu(), parts)
        exact = bool(torch.equal(meta.cpu(), m_ref) and torch.equal(ns.cpu(), n_ref))
        us = {k: [] for k in algos}
        names = list(algos)
        for r in range(rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                us[k].append(triton.testing.do_bench(graphs[k].replay, warmup=5, rep=20,
                                                     return_mode="median") * 1e3 / calls)
        med = {k: statistics.median(v) for k, v in us.items()}
        row = {"counts": kind, "b": b, "parts": parts, "us_per_call": med, "us_rounds": us,
               "ratio_greedy_vs_linear": med["greedy"] / med["linear"],
               "ratio_aa": med["linear_b"] / med["linear"], "greedy_exact": exact}
        rows.append(row)
        print(f"sched {kind:10s} b={b:5d} parts={parts:3d}  linear {med['linear']:6.2f}us  "
              f"linear_b {med['linear_b']:6.2f}us  greedy {med['greedy']:6.2f}us  "
              f"({row['ratio_greedy_vs_linear']:.2f}x)  exact={exact}", flush=True)
        del graphs, keep
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--match", default="")
    ap.add_argument("--json", default="")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help=f"comma-separated subset of {list(VARIANTS)}; the first is the ratio base")
    ap.add_argument("--rows", choices=("s21", "greedy"), default="s21",
                    help="s21: the session-21 sweep rows; greedy: sparse h_q 128 rows + V4.1+FP4 + 3 dense rows")
    ap.add_argument("--sched-timing", action="store_true", help="also time the schedule kernels (linear vs greedy)")
    ap.add_argument("--sched-only", action="store_true", help="only time the schedule kernels")
    ap.add_argument("--budget-s", type=float, default=0.0, help="start no new decode row after this many seconds")
    ap.add_argument("--list", action="store_true", help="print the selected rows and variants, run nothing")
    a = ap.parse_args()
    variants = {k: VARIANTS[k] for k in a.variants.split(",")}
    base = next(iter(variants))
    dense_keys, sparse_keys = (DENSE, SPARSE) if a.rows == "s21" else (ROWS_GREEDY_DENSE, ROWS_GREEDY_SPARSE)
    if a.list:
        print("variants:", variants, "base:", base)
        print("dense rows:", dense_keys)
        print("sparse rows:", sparse_keys)
        return 0
    t_start = time.time()
    out = {"provenance": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                          "git_sha": os.environ.get("GIT_SHA", "unknown"),
                          "utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())},
           "variants": {k: str(v) for k, v in variants.items()}, "base": base, "rows": [], "sched": []}

    def dump():
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)

    if a.sched_timing or a.sched_only:
        out["sched"] = sched_timing(a.rounds)
        dump()
        if a.sched_only:
            return 0
    cases = []
    if a.rows == "greedy":        # sparse rows first (the ones the greedy schedule changes most)
        cases += [c for c in build_cases("cuda", False, False, only="sparse") if any(k in c.name + " " for k in sparse_keys)]
        cases += [c for c in build_cases("cuda", False, False, only="mla") if any(k in c.name for k in dense_keys)]
    else:
        cases += [c for c in build_cases("cuda", False, False, only="mla") if any(k in c.name for k in dense_keys)]
        cases += [c for c in build_cases("cuda", False, False, only="sparse") if any(k in c.name for k in sparse_keys)]
    cases = [c for c in cases if a.match in c.name]
    for case in cases:
        if a.budget_s and time.time() - t_start > a.budget_s:
            print(f"budget {a.budget_s:.0f}s spent: skipping {case.name}", flush=True)
            out.setdefault("skipped", []).append(case.name)
            continue
        t = case.setup()
        graphs, scheds, ref = {}, {}, None
        row = {"name": case.name, "flops": case.flops, "err": {}, "us": {k: [] for k in variants}}
        for k, v in variants.items():
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
        dec.compute_schedule = sdec.compute_schedule = _ORIG     # the library's own choice again
        if "greedy" in scheds and "fm5" in scheds:
            sg, sf = scheds["greedy"], scheds["fm5"]
            row["greedy_eq_fm5"] = bool(torch.equal(sg.tile_scheduler_metadata.cpu(), sf.tile_scheduler_metadata.cpu())
                                        and torch.equal(sg.num_splits.cpu(), sf.num_splits.cpu()))
        if "greedy" in scheds:
            m = scheds["greedy"].tile_scheduler_metadata.cpu()
            row["greedy_parts"] = int(m.shape[0])
            row["greedy_split_parts"] = int(((m[:, 5] + m[:, 6]) > 0).sum())
        names = list(variants)
        for r in range(a.rounds):
            order = names[r % len(names):] + names[:r % len(names)]
            for k in order:
                row["us"][k].append(triton.testing.do_bench(graphs[k].replay, warmup=10, rep=50,
                                                            return_mode="median") * 1e3)
        med = {k: statistics.median(v) for k, v in row["us"].items()}
        row["median_us"] = med
        row[f"ratio_vs_{base}"] = {k: med[k] / med[base] for k in med}
        row["tflops"] = {k: case.flops / (med[k] * 1e-6) / 1e12 for k in med}
        out["rows"].append(row)
        print(f"{case.name[:52]:52s} " + " ".join(f"{k} {med[k]:7.1f}us({row[f'ratio_vs_{base}'][k]:.3f})"
                                                   for k in names)
              + (f" greedy==fm5 {row['greedy_eq_fm5']}" if "greedy_eq_fm5" in row else ""), flush=True)
        print(f"{'':52s} err " + " ".join(f"{k} {e[0]:.1e}/{e[1]:.1e}{'' if e[2] else ' NONFINITE'}"
                                           for k, e in row["err"].items()), flush=True)
        del graphs, scheds, t
        torch.cuda.empty_cache()
        dump()
    dump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
