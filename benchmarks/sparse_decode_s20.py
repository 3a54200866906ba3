"""Session 20 paired A/B of the WS3 sparse decode kernel's ``Q_AHEAD`` option (``_gluon_sparse_decode_ws3``, module
docstring "Q ahead") against the dispatched build, with an A/A control, in rotated rounds.

Rows: V3.2, V4.1 and V4.1 + FP4 (extra topk 512, extra s_k 4096) at h_q 128, topk 2048, s_k 8192 per request,
(b, s_q) = (64, 1), (128, 1), (128, 2) -- all on WS3 through the public op's dispatch (>= 24 blocks per CTA).
Variants (each a direct launch of ``launch_sparse_decode_gluon_ws3`` on the public op's schedule and inputs):
``base`` (launcher defaults = the dispatched build), ``aa`` (the same build timed again: the A/A control), ``qh``
(``q_ahead=True``); V4.1 also ``qa`` (``q_async=True``: session 18's Q by cp.async at the request top, the control
that separates "Q latency" from "Q off the boundary") and ``d144`` (``deq_asm=True, producer_regs=144``: the inline-PTX
dequant, which fits the WS3 producer at 144 registers; the in-request producer lever of the session-20 attribution)
and ``qhd`` (both: do the two levers stack?).

Correctness first (``deepkernels.bench.paired.first_runs``): every variant once into NaN-poisoned outputs; recorded
per variant: NaN left (``<v>_nan``) and bit identity with ``base`` (``<v>_bit``; all are expected bit-identical).
Timing: R rounds (``--rounds``, default 5), each timing every variant once (``triton.testing.do_bench``, warmup 3,
rep 15, median) in an order rotated by one per round; headline per variant = the median over rounds of the PAIRED
ratio t_variant / t_base of the same round (< 1: faster). TFLOPS from per-variant medians (FlashMLA counting). JSON
with provenance (GPU, driver, torch / triton versions, GIT_SHA).
Usage (GPU): ``PYTHONPATH=src python benchmarks/sparse_decode_s20.py OUT.json [--rounds R] [--quick]``; without
CUDA it checks its arguments and case table, prints one line and exits 0.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (main format, extra format or None, b, s_q); h_q 128, topk 2048 (+ 512 extra), s_k 8192
# (V4.1 first: the profiled format; a cap that cuts the run short keeps its rows -- the JSON is rewritten per row)
CASES = tuple((fmt, xfmt, b, s_q) for fmt, xfmt in (("v41", None), ("v32", None), ("v41", "fp4"))
              for b, s_q in ((64, 1), (128, 1), (128, 2)))
QUICK = tuple(c for c in CASES if (c[2], c[3]) == (64, 1))
H_Q, TOPK, XTOPK, S_K = 128, 2048, 512, 8192


def variants(fmt: str, xfmt) -> dict:
    """Variant name -> launcher keywords (module docstring)."""
    v = {"base": {}, "aa": {}, "qh": dict(q_ahead=True)}
    if fmt == "v41" and xfmt is None:
        v.update(qa=dict(q_async=True), d144=dict(deq_asm=True, producer_regs=144),
                 qhd=dict(q_ahead=True, deq_asm=True, producer_regs=144))
    return v


def build_case(fmt, xfmt, b, s_q, device="cuda"):
    """Inputs and schedule (the public op's config / SM parts / schedule) + FLOPs: ``mla_sparse_decode.kernel_case``
    without an extra cache, ``sparse_decode_ws3_extra.extra_case`` with one."""
    if xfmt is None:
        import mla_sparse_decode as B
        c = B.kernel_case(fmt, b, s_q, H_Q, TOPK, S_K, device=device)
        c.xcache = c.xind = None
        return c
    import sparse_decode_ws3_extra as X
    return X.extra_case(fmt, xfmt, b, s_q, H_Q, TOPK, XTOPK, s_k=S_K, device=device)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.path.join(os.environ.get("OUT", "."), "sparse_decode_s20.json"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="the b 64 s_q 1 rows only")
    args = ap.parse_args(argv)
    cases = QUICK if args.quick else CASES
    if not torch.cuda.is_available():
        print(f"no CUDA device: nothing to time ({len(cases)} cases, variants "
              f"{sorted({n for c in cases for n in variants(c[0], c[1])})}, {args.rounds} rounds -> {args.out})")
        return 0
    import mla_sparse_decode as B
    from deepkernels.mla import _gluon_sparse_decode_ws3 as W3
    from deepkernels.bench.paired import (bit_identical, errors_text, first_runs, nan_variants, record_rounds,
                                          save_rows, time_rotated)
    from triton.testing import do_bench

    rows = []
    B.warm_clocks()
    for fmt, xfmt, b, s_q in cases:
        c = build_case(fmt, xfmt, b, s_q)
        blocks = b * s_q * (H_Q // 64) * (-(-TOPK // 64) + (-(-XTOPK // 64) if xfmt else 0))
        row = dict(fmt=fmt, xfmt=xfmt, b=b, s_q=s_q, h_q=H_Q, topk=TOPK, xtopk=XTOPK if xfmt else 0, s_k=S_K,
                   parts=c.parts, flop=c.flop, blocks_per_cta=blocks / (c.parts * s_q * (H_Q // 64)),
                   dispatched_ws3=bool(W3.dispatch_on(fmt, xfmt) and W3.enough_work(b, TOPK, c.parts,
                                                                                  XTOPK if xfmt else 0)))
        launches = {name: (lambda o, l_, kw=kw, c=c, fmt=fmt, xfmt=xfmt: W3.launch_sparse_decode_gluon_ws3(
            o, l_, c.q, c.cache, c.ind, c.sched, c.ns, c.scale, fmt, None, c.xcache, c.xind, xfmt, **kw))
            for name, kw in variants(fmt, xfmt).items()}
        fns, outs = first_runs(launches, lambda: (torch.empty(b, s_q, H_Q, 512, dtype=torch.bfloat16, device="cuda"),
                                                  torch.empty(b, s_q, H_Q, device="cuda")), row)
        for name in outs:
            if name != "base" and "base" in outs:
                row[name + "_bit"] = bit_identical(outs["base"], outs[name])
        times = time_rotated(fns, args.rounds, lambda f: do_bench(f, warmup=3, rep=15, return_mode="median"),
                             errors=row.setdefault("timing_errors", {}))
        record_rounds(row, times, c.flop, [(n, n, "base") for n in fns if n != "base"])
        rows.append(row)
        tag = fmt + ("+" + xfmt if xfmt else "")
        print("SUMMARY %-8s b=%3d s_q=%d parts=%2d blocks/CTA %5.1f  base %.1f TFLOPS  %s  bit %s  nan %s%s" % (
            tag, b, s_q, c.parts, row["blocks_per_cta"], row.get("base_tflops", float("nan")),
            "  ".join("%s %.4f" % (n, row.get(n + "_paired_median", float("nan"))) for n in fns if n != "base"),
            {n: row.get(n + "_bit") for n in outs if n != "base"}, nan_variants(row), errors_text(row)), flush=True)
        save_rows(args.out, rows, rounds=args.rounds)
        del c, outs, fns
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
