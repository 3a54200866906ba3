"""Session 20 (second round) paired A/B of the WS3 sparse decode kernel's ``C1_SMEM`` option (chunk 1 staged in
shared memory by cp.async; ``_gluon_sparse_decode_ws3`` module docstring "Chunk 1 staged") against the dispatched
V4.1 build, with an A/A control, in rotated rounds. The harness of ``sparse_decode_s20.py`` (its case builder; the
same timing: ``deepkernels.bench.paired``).

Rows: V4.1 at h_q 128, topk 2048, s_k 8192 per request, (b, s_q) = (64, 1), (128, 1), (128, 2) (the option is V4.1
only). Variants (direct launches of ``launch_sparse_decode_gluon_ws3`` on the public op's schedule and inputs):
``base`` (launcher defaults = the dispatched build: Q ahead, asm dequant, producer 144), ``aa`` (the same build timed
again), ``c1`` (the same call with ``WS3_C1_SMEM = {"v41"}``: the chunk-1-staged entry). Correctness first: every variant once into NaN-poisoned outputs; ``<v>_nan`` and
``<v>_bit`` (bit identity with ``base``; expected). Timing: R rounds (``--rounds``, default 5), each variant once per
round (``do_bench`` warmup 3, rep 15, median) in an order rotated per round; headline = median over rounds of the
paired ratio t_variant / t_base (< 1: faster). JSON with provenance (GPU, driver, torch / triton, GIT_SHA).
Usage (GPU): ``PYTHONPATH=src python benchmarks/sparse_decode_c1.py OUT.json [--rounds R] [--quick]``; without CUDA
it prints one line and exits 0.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CASES = tuple(("v41", None, b, s_q) for b, s_q in ((64, 1), (128, 1), (128, 2)))
QUICK = CASES[:1]
VARIANTS = dict(base=False, aa=False, c1=True)      # name -> WS3_C1_SMEM holds "v41" for the call


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.path.join(os.environ.get("OUT", "."), "sparse_decode_c1.json"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="the b 64 s_q 1 row only")
    args = ap.parse_args(argv)
    cases = QUICK if args.quick else CASES
    if not torch.cuda.is_available():
        print(f"no CUDA device: nothing to time ({len(cases)} cases, variants {sorted(VARIANTS)}, "
              f"{args.rounds} rounds -> {args.out})")
        return 0
    import mla_sparse_decode as B
    from sparse_decode_s20 import H_Q, TOPK, S_K, build_case
    from deepkernels.mla import _gluon_sparse_decode_ws3 as W3
    from deepkernels.bench.paired import (bit_identical, errors_text, first_runs, nan_variants, record_rounds,
                                          save_rows, time_rotated)
    from triton.testing import do_bench

    rows = []
    B.warm_clocks()
    for fmt, xfmt, b, s_q in cases:
        c = build_case(fmt, xfmt, b, s_q)
        blocks = b * s_q * (H_Q // 64) * -(-TOPK // 64)
        row = dict(fmt=fmt, xfmt=xfmt, b=b, s_q=s_q, h_q=H_Q, topk=TOPK, s_k=S_K, parts=c.parts, flop=c.flop,
                   blocks_per_cta=blocks / (c.parts * s_q * (H_Q // 64)),
                   dispatched_ws3=bool(W3.dispatch_on(fmt) and W3.enough_work(b, TOPK, c.parts)),
                   tuned=W3.WS3_MAIN_TUNED.get(fmt))
        def launch(o, l_, c1, c=c, fmt=fmt):
            old = W3.WS3_C1_SMEM
            W3.WS3_C1_SMEM = frozenset({fmt}) if c1 else frozenset()
            try:
                W3.launch_sparse_decode_gluon_ws3(o, l_, c.q, c.cache, c.ind, c.sched, c.ns, c.scale, fmt)
            finally:
                W3.WS3_C1_SMEM = old

        launches = {name: (lambda o, l_, c1=c1: launch(o, l_, c1)) for name, c1 in VARIANTS.items()}
        fns, outs = first_runs(launches, lambda: (torch.empty(b, s_q, H_Q, 512, dtype=torch.bfloat16, device="cuda"),
                                                  torch.empty(b, s_q, H_Q, device="cuda")), row)
        for name in outs:
            if name != "base" and "base" in outs:
                row[name + "_bit"] = bit_identical(outs["base"], outs[name])
        times = time_rotated(fns, args.rounds, lambda f: do_bench(f, warmup=3, rep=15, return_mode="median"),
                             errors=row.setdefault("timing_errors", {}))
        record_rounds(row, times, c.flop, [(n, n, "base") for n in fns if n != "base"])
        rows.append(row)
        print("SUMMARY %-5s b=%3d s_q=%d parts=%2d blocks/CTA %5.1f  base %.1f TFLOPS  %s  bit %s  nan %s%s" % (
            fmt, b, s_q, c.parts, row["blocks_per_cta"], row.get("base_tflops", float("nan")),
            "  ".join("%s %.4f" % (n, row.get(n + "_paired_median", float("nan"))) for n in fns if n != "base"),
            {n: row.get(n + "_bit") for n in outs if n != "base"}, nan_variants(row), errors_text(row)), flush=True)
        save_rows(args.out, rows, rounds=args.rounds)
        del c, outs, fns
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
