"""Paired A/B of the Gluon m-grouped kernels' ``scale_ahead`` (session 19; ``gemm/_gluon_fp8.py`` module docstring,
"Scales ahead") against the dispatched TMA-store configs: contiguous S6 EPI vs S6 EPI + scale_ahead 1, masked S4 EPI
vs S4 EPI + scale_ahead 1, each with an A/A control (the base config timed twice), at DeepGEMM's published shapes
(``grouped_gemm.CONTIGUOUS`` / ``MASKED``: aligned groups of m rows; masked: every group's masked_m = m of M_max
4096). Each variant once into a NaN-poisoned D first (the variant's D must equal the base's bit for bit:
``<variant>_bit``), then R rotated rounds (``triton.testing.do_bench`` median, whole call); headline: the median over
rounds of the paired ratio t_variant / t_base (< 1: faster). JSON with provenance.
Usage (GPU): ``PYTHONPATH=src python benchmarks/grouped_sa_ab.py OUT.json [--rounds R]``.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.path.join(os.environ.get("OUT", "."), "grouped_sa_ab.json"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time")
        return 0
    from dataclasses import replace
    from triton.testing import do_bench
    from deepkernels.bench.paired import record_rounds, save_rows, time_rotated
    from deepkernels.gemm import _gluon_fp8 as G
    from grouped_gemm import CONTIGUOUS, MASKED, MASKED_M_MAX, fp8_rows, fp8_weights

    rows = []
    for kind, shapes in (("contiguous", CONTIGUOUS), ("masked", MASKED)):
        base = G.GLUON_WS_128_S6_EPI if kind == "contiguous" else G.GLUON_WS_128_S4_EPI
        variants = {"base": base, "base_aa": base, "sa1": replace(base, scale_ahead=1)}
        for g, m, n, k in shapes:
            torch.manual_seed(0)
            b, sfb = fp8_weights(g, n, k, "cuda")
            if kind == "contiguous":
                a, sfa = fp8_rows(g * m, k, "cuda")
                gid = torch.arange(g, device="cuda", dtype=torch.int32).repeat_interleave(m)
                d = {v: torch.empty(g * m, n, device="cuda", dtype=torch.bfloat16) for v in variants}
                launch = {v: (lambda v=v, c=c: G._launch_fp8_gluon_m_contiguous(a, sfa, b, sfb, d[v], gid, c))
                          for v, c in variants.items()}
                flop = 2.0 * g * m * n * k
            else:
                q = [fp8_rows(MASKED_M_MAX, k, "cuda") for _ in range(g)]
                a, sfa = torch.stack([x[0] for x in q]), torch.stack([x[1] for x in q])
                mm = torch.full((g, ), m, device="cuda", dtype=torch.int32)
                d = {v: torch.empty(g, MASKED_M_MAX, n, device="cuda", dtype=torch.bfloat16) for v in variants}
                launch = {v: (lambda v=v, c=c: G._launch_fp8_gluon_m_masked(a, sfa, b, sfb, d[v], mm, c))
                          for v, c in variants.items()}
                flop = 2.0 * g * m * n * k
            row = dict(kind=kind, g=g, m=m, n=n, k=k, base=base.name())
            for v, fn in launch.items():
                d[v].fill_(float("nan"))
                try:
                    fn()
                except Exception as e:       # recorded, not timed
                    row[v + "_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            torch.cuda.synchronize()
            fns = {v: fn for v, fn in launch.items() if v + "_error" not in row}
            valid = (slice(None), ) if kind == "contiguous" else (slice(None), slice(0, m))
            for v in fns:
                row[v + "_nan"] = bool(torch.isnan(d[v][valid]).any())
                if v != "base" and "base" in fns:
                    row[v + "_bit"] = bool(torch.equal(d[v][valid], d["base"][valid]))
            times = time_rotated(fns, args.rounds, lambda f: do_bench(f, warmup=5, rep=40, return_mode="median"))
            record_rounds(row, times, flop, [("aa", "base_aa", "base"), ("sa1", "sa1", "base")])
            rows.append(row)
            print("SUMMARY %s g=%d m=%d n=%d k=%d  base %.0f TFLOPS  sa1 %.4f (%.0f)  A/A %.4f  bit %s  nan %s%s" % (
                kind, g, m, n, k, row.get("base_tflops", float("nan")), row.get("sa1_paired_median", float("nan")),
                row.get("sa1_tflops", float("nan")), row.get("aa_paired_median", float("nan")), row.get("sa1_bit"),
                [x for x in row if x.endswith("_nan") and row[x]],
                "".join("  %s: %s" % (x, row[x]) for x in row if x.endswith("_error"))), flush=True)
            save_rows(args.out, rows, rounds=args.rounds)
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
