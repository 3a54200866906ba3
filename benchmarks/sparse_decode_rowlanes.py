"""The sparse decode producer's ROW_LANES option (lanes over token rows first: conflict-free 16-byte shared stores of
the dequantised tile; ``_gluon_sparse_decode_ws.WS_ROW_LANES``) against the default lane order, on the WS and the
split-consumer (WS2) kernels, same schedule and inputs (``mla_sparse_decode.kernel_case``): V3.2 and V4.1,
(b, s_q, h_q) in (128, 1, 128), (128, 2, 128), (64, 1, 128), topk 2048, s_k 8192 per request.

Correctness first: each variant once into NaN-poisoned outputs; the ROW_LANES output must equal its kernel's default
output bit for bit (``bit_identical``). Timing: R rounds (``--rounds``, default 5), each round times every variant
(``triton.testing.do_bench``, warmup 3, rep 15, median) in an order rotated by one per round; headline = the median
over rounds of the PAIRED ratio (variant time / its kernel's default time in the same round; < 1 is faster), so clock
drift during the run cancels. TFLOPS from the per-variant median (FlashMLA counting). JSON with provenance.
Usage (GPU): ``PYTHONPATH=src python benchmarks/sparse_decode_rowlanes.py OUT.json [--rounds R]``
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.path.join(os.environ.get("OUT", "."), "sparse_decode_rowlanes.json"))
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time")
        return 0
    import mla_sparse_decode as B
    from deepkernels.mla import _gluon_sparse_decode_ws as W
    from deepkernels.mla import _gluon_sparse_decode_ws2 as W2
    from deepkernels.bench.paired import (bit_identical, errors_text, first_runs, nan_variants, record_rounds,
                                          save_rows, time_rotated)
    from triton.testing import do_bench

    variants = [("ws", W.launch_sparse_decode_gluon_ws, False, "ws"),
                ("ws_rl", W.launch_sparse_decode_gluon_ws, True, "ws"),
                ("ws2", W2.launch_sparse_decode_gluon_ws2, False, "ws2"),
                ("ws2_rl", W2.launch_sparse_decode_gluon_ws2, True, "ws2")]
    rows = []
    B.warm_clocks()
    for fmt in ("v32", "v41"):
        for b, s_q, h_q in ((128, 1, 128), (128, 2, 128), (64, 1, 128)):
            c = B.kernel_case(fmt, b, s_q, h_q, 2048, 8192)
            row = dict(fmt=fmt, b=b, s_q=s_q, h_q=h_q, topk=2048, s_k=8192, parts=c.parts, flop=c.flop)
            launches = {name: (lambda o, l_, f=launch, r=rl:
                               f(o, l_, c.q, c.cache, c.ind, c.sched, c.ns, c.scale, fmt, row_lanes=r))
                        for name, launch, rl, _ in variants}
            fns, outs = first_runs(launches, lambda: (torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16,
                                                                  device="cuda"),
                                                      torch.empty(b, s_q, h_q, device="cuda")), row)
            for base in ("ws", "ws2"):
                if base in outs and base + "_rl" in outs:
                    row[base + "_rl_bit_identical"] = bit_identical(outs[base], outs[base + "_rl"])
            times = time_rotated(fns, args.rounds, lambda f: do_bench(f, warmup=3, rep=15, return_mode="median"))
            record_rounds(row, times, c.flop, [(base + "_rl", base + "_rl", base) for base in ("ws", "ws2")])
            rows.append(row)
            print("SUMMARY %s b=%3d s_q=%d h_q=%d  ws %.1f  ws_rl %.1f (t/ws %.3f, bit %s)  ws2 %.1f  ws2_rl %.1f "
                  "(t/ws2 %.3f, bit %s)  nan %s%s" % (
                      fmt, b, s_q, h_q, row.get("ws_tflops", float("nan")), row.get("ws_rl_tflops", float("nan")),
                      row.get("ws_rl_paired_median", float("nan")), row.get("ws_rl_bit_identical"),
                      row.get("ws2_tflops", float("nan")), row.get("ws2_rl_tflops", float("nan")),
                      row.get("ws2_rl_paired_median", float("nan")), row.get("ws2_rl_bit_identical"),
                      nan_variants(row),
                      errors_text(row)), flush=True)
            save_rows(args.out, rows, rounds=args.rounds)
            del c, outs, fns
            torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
