"""The dispatch decision for the 2-CTA cluster sparse decode kernel (WS3) in rotated rounds: WS, WS2 and WS3 on the
same schedule and inputs (``mla_sparse_decode.kernel_case``), V3.2 and V4.1, h_q 128, over batch sizes 1..128,
s_q 1 / 2 / 4 and topk 2048 / 512 (s_k 8192 per request).

Correctness first: each kernel once into NaN-poisoned outputs; WS3 must equal WS2 bit for bit (``bit_identical``).
Timing: R rounds (``--rounds``, default 5), each round times every kernel (``triton.testing.do_bench``, warmup 3,
rep 15, median) in an order rotated by one per round; headline = the median over rounds of the PAIRED ratio t_ws3 /
t_ws2 and t_ws3 / t_ws (< 1: WS3 faster), so clock drift during the run cancels. TFLOPS from per-kernel medians
(FlashMLA counting). JSON with provenance.
Usage (GPU): ``PYTHONPATH=src python benchmarks/sparse_decode_ws3_paired.py OUT.json [--rounds R] [--quick]``
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SHAPES = ((1, 1, 2048), (8, 1, 2048), (32, 1, 2048), (64, 1, 2048), (128, 1, 2048), (128, 2, 2048), (32, 4, 2048),
          (128, 1, 512))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.path.join(os.environ.get("OUT", "."), "sparse_decode_ws3_paired.json"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="3 shapes per format")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time")
        return 0
    import mla_sparse_decode as B
    from deepkernels.mla import _gluon_sparse_decode_ws as W
    from deepkernels.mla import _gluon_sparse_decode_ws2 as W2
    from deepkernels.mla import _gluon_sparse_decode_ws3 as W3
    from deepkernels.bench.paired import (bit_identical, errors_text, first_runs, nan_variants, record_rounds,
                                          save_rows, time_rotated)
    from triton.testing import do_bench

    kernels = {"ws": W.launch_sparse_decode_gluon_ws, "ws2": W2.launch_sparse_decode_gluon_ws2,
               "ws3": W3.launch_sparse_decode_gluon_ws3}
    shapes = SHAPES[2:5] if args.quick else SHAPES
    rows = []
    B.warm_clocks()
    for fmt in ("v32", "v41"):
        for b, s_q, topk in shapes:
            h_q = 128
            c = B.kernel_case(fmt, b, s_q, h_q, topk, 8192)
            row = dict(fmt=fmt, b=b, s_q=s_q, h_q=h_q, topk=topk, s_k=8192, parts=c.parts, flop=c.flop)
            launches = {name: (lambda o, l_, f=launch: f(o, l_, c.q, c.cache, c.ind, c.sched, c.ns, c.scale, fmt))
                        for name, launch in kernels.items()}
            fns, outs = first_runs(launches, lambda: (torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16,
                                                                  device="cuda"),
                                                      torch.empty(b, s_q, h_q, device="cuda")), row)
            if "ws2" in outs and "ws3" in outs:
                row["bit_identical"] = bit_identical(outs["ws2"], outs["ws3"])
            times = time_rotated(fns, args.rounds, lambda f: do_bench(f, warmup=3, rep=15, return_mode="median"))
            record_rounds(row, times, c.flop, [("ws3_vs_" + base, "ws3", base) for base in ("ws", "ws2")])
            rows.append(row)
            print("SUMMARY %s b=%3d s_q=%d topk=%4d parts=%3d  ws %.1f  ws2 %.1f  ws3 %.1f TFLOPS  t_ws3/t_ws %.3f  "
                  "t_ws3/t_ws2 %.3f  bit %s  nan %s%s" % (
                      fmt, b, s_q, topk, c.parts, row.get("ws_tflops", float("nan")),
                      row.get("ws2_tflops", float("nan")), row.get("ws3_tflops", float("nan")),
                      row.get("ws3_vs_ws_paired_median", float("nan")), row.get("ws3_vs_ws2_paired_median", float("nan")),
                      row.get("bit_identical"), nan_variants(row),
                      errors_text(row)), flush=True)
            save_rows(args.out, rows, rounds=args.rounds)
            del c, outs, fns
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
