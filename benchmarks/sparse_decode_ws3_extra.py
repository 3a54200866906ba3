"""WS (the dispatched extra-cache kernel) vs WS3's opt-in extra-cache entry (``_gluon_sparse_decode_ws3``, module
docstring "Extra cache") in rotated rounds: V4.1 main + FP4 extra, h_q 128, b 64 / 128, s_q 1 / 2, topk 2048 + extra
512 (s_k 8192, extra s_k 4096 per request); ``--all-pairs`` adds V4.1 + V4.1 and V3.2 + V3.2 at b 128 s_q 1.

Correctness first (``deepkernels.bench.paired.first_runs``): each kernel once into NaN-poisoned outputs on the same
schedule (the public op's, extra tokens counted); recorded: NaN left, bit identity (not expected: WS3's consumers are
WS2's) and the max |out_ws3 - out_ws| and |lse_ws3 - lse_ws|. Timing: R rounds (``--rounds``, default 5), each
timing both kernels (``triton.testing.do_bench``, warmup 3, rep 15, median) in an order rotated by one per round;
headline = the median over rounds of the PAIRED ratio t_ws3x / t_ws (< 1: WS3 faster). TFLOPS from the medians
(FlashMLA counting, extra tokens included). JSON with provenance.
``--idx`` / ``--q``: also the WS3-extra build with the option (``idx_ahead`` / ``q_async``) explicitly off and on,
``ws3x_<tag>0`` / ``ws3x_<tag>1`` (tag ``ia`` / ``qa``), paired on / off as ``ws3x_<tag>_paired_*`` with their bit
identity (session 18's runs, before this form, paired the option on against the then-default build under
``ws3x_ia_*``: results/sparse_decode_ws3_extra_idx-* and _qasync-*).
Usage (GPU): ``PYTHONPATH=src python benchmarks/sparse_decode_ws3_extra.py OUT.json [--rounds R] [--quick]
[--all-pairs] [--sweep] [--idx] [--q]``
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (main, extra, b, s_q, topk, xtopk)
SHAPES = (("v41", "fp4", 64, 1, 2048, 512), ("v41", "fp4", 64, 2, 2048, 512), ("v41", "fp4", 128, 1, 2048, 512),
          ("v41", "fp4", 128, 2, 2048, 512))
MORE = (("v41", "v41", 128, 1, 2048, 512), ("v32", "v32", 128, 1, 2048, 512))
# --sweep: V4.1 + FP4 over batch sizes for the dispatch's work threshold (64-token blocks per CTA at 66 parts:
# 4.8, 9.7, 19.4, 29.1 at topk 2048 + 512; 15.5, 31 at 512 + 512)
SWEEP = tuple(("v41", "fp4", b, 1, 2048, 512) for b in (8, 16, 32, 48)) + (("v41", "fp4", 64, 1, 512, 512),
                                                                           ("v41", "fp4", 128, 1, 512, 512))


def extra_case(fmt, xfmt, b, s_q, h_q, topk, xtopk, s_k=8192, device="cuda"):
    """Inputs and schedule of one extra-cache case (the public op's config, SM parts and schedule with the extra
    tokens counted) + the FLOP count (FlashMLA counting, main + extra tokens)."""
    from types import SimpleNamespace
    import mla_sparse_decode as B
    from deepkernels.mla import sparse_decode as sd
    from deepkernels.mla.metadata import compute_schedule
    d_qk = 576 if fmt == "v32" else 512
    xs_k = max(4 * xtopk, 4096)
    cache = B.make_cache(fmt, b * s_k, device)
    xcache = B.make_cache(xfmt, b * xs_k, device)
    q = torch.randn(b, s_q, h_q, d_qk, device=device).clamp_(-1, 1).bfloat16()
    ind = B.make_indices(b, s_q, topk, s_k, device)
    xind = B.make_indices(b, s_q, xtopk, xs_k, device)
    parts = sd._num_sm_parts(q.device, s_q, h_q, sd.sparse_decode_config(h_q, fmt))
    sched, ns = compute_schedule(sd._token_counts(b, topk, None, xtopk, None, True, q.device), parts)
    return SimpleNamespace(fmt=fmt, xfmt=xfmt, cache=cache, xcache=xcache, q=q, ind=ind, xind=xind, sched=sched,
                           ns=ns, parts=parts, scale=d_qk ** -0.5,
                           flop=2 * h_q * b * s_q * (topk + xtopk) * (d_qk + 512))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.path.join(os.environ.get("OUT", "."), "sparse_decode_ws3_extra.json"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="b 128 s_q 1 only")
    ap.add_argument("--all-pairs", action="store_true", help="also V4.1 + V4.1 and V3.2 + V3.2 at b 128 s_q 1")
    ap.add_argument("--sweep", action="store_true", help="also V4.1 + FP4 at smaller batches / topk (SWEEP)")
    ap.add_argument("--idx", action="store_true", help="also WS3-extra with idx_ahead off / on (ws3x_ia0 / 1)")
    ap.add_argument("--q", action="store_true", help="also WS3-extra with q_async off / on (ws3x_qa0 / 1)")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time")
        return 0
    import mla_sparse_decode as B
    from deepkernels.mla import _gluon_sparse_decode_ws as W
    from deepkernels.mla import _gluon_sparse_decode_ws3 as W3
    from deepkernels.bench.paired import (bit_identical, errors_text, first_runs, nan_variants, record_rounds,
                                          save_rows, time_rotated)
    from triton.testing import do_bench

    kernels = {"ws": W.launch_sparse_decode_gluon_ws, "ws3x": W3.launch_sparse_decode_gluon_ws3}
    options = [(tag, kw) for flag, tag, kw in (("idx", "ia", "idx_ahead"), ("q", "qa", "q_async"))
               if getattr(args, flag)]
    for tag, kw in options:
        for on in (0, 1):
            kernels[f"ws3x_{tag}{on}"] = (lambda *a, _kw={kw: bool(on)}: W3.launch_sparse_decode_gluon_ws3(*a, **_kw))
    shapes = SHAPES[2:3] if args.quick else SHAPES
    if args.all_pairs:
        shapes = shapes + MORE
    if args.sweep:
        shapes = shapes + SWEEP
    rows = []
    B.warm_clocks()
    for fmt, xfmt, b, s_q, topk, xtopk in shapes:
        h_q = 128
        c = extra_case(fmt, xfmt, b, s_q, h_q, topk, xtopk)
        row = dict(fmt=fmt, xfmt=xfmt, b=b, s_q=s_q, h_q=h_q, topk=topk, xtopk=xtopk, s_k=8192, parts=c.parts,
                   flop=c.flop, blocks_per_cta=b * (-(-topk // 64) + -(-xtopk // 64)) / c.parts)
        launches = {name: (lambda o, l_, f=launch: f(o, l_, c.q, c.cache, c.ind, c.sched, c.ns, c.scale, fmt, None,
                                                        c.xcache, c.xind, xfmt))
                    for name, launch in kernels.items()}
        fns, outs = first_runs(launches, lambda: (torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16, device="cuda"),
                                                  torch.empty(b, s_q, h_q, device="cuda")), row)
        if "ws" in outs and "ws3x" in outs:
            (ow, lw), (o3, l3) = outs["ws"], outs["ws3x"]
            row["bit_identical"] = bit_identical(outs["ws"], outs["ws3x"])
            row["max_abs_out_diff"] = float((o3.float() - ow.float()).abs().nan_to_num(float("inf")).max())
            row["max_abs_lse_diff"] = float((l3 - lw).abs().nan_to_num(float("inf")).max())
        times = time_rotated(fns, args.rounds, lambda f: do_bench(f, warmup=3, rep=15, return_mode="median"))
        pairs = [("ws3x_vs_ws", "ws3x", "ws")]
        for tag, _ in options:
            off, on = f"ws3x_{tag}0", f"ws3x_{tag}1"
            pairs.append((f"ws3x_{tag}", on, off))
            if off in outs and on in outs:
                row[f"ws3x_{tag}_bit"] = bit_identical(outs[off], outs[on])
        record_rounds(row, times, c.flop, pairs)
        rows.append(row)
        print("SUMMARY %s+%s b=%3d s_q=%d topk=%d+%d parts=%3d blocks/CTA %5.1f  ws %.1f  ws3x %.1f TFLOPS  "
              "t_ws3x/t_ws %.3f  bit %s  max|dout| %s  max|dlse| %s  nan %s%s" % (
                  fmt, xfmt, b, s_q, topk, xtopk, c.parts, row["blocks_per_cta"], row.get("ws_tflops", float("nan")),
                  row.get("ws3x_tflops", float("nan")), row.get("ws3x_vs_ws_paired_median", float("nan")),
                  row.get("bit_identical"), row.get("max_abs_out_diff"), row.get("max_abs_lse_diff"),
                  nan_variants(row),
                  errors_text(row)), flush=True)
        for tag, kw in options:
            print("SUMMARY-%s %s+%s b=%3d s_q=%d  t_on/t_off %.4f  on %.1f TFLOPS  bit %s" % (
                kw, fmt, xfmt, b, s_q, row.get(f"ws3x_{tag}_paired_median", float("nan")),
                row.get(f"ws3x_{tag}1_tflops", float("nan")), row.get(f"ws3x_{tag}_bit")), flush=True)
        save_rows(args.out, rows, rounds=args.rounds)
        del c, outs, fns
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
