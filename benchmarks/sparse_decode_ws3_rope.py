"""WS3's opt-in producer options against the default WS3 build in rotated rounds, same schedule and inputs
(``mla_sparse_decode.kernel_case``): ``ws3_rope`` = ROPE_ROWS (the V3.2 RoPE cp.async gathers 4 tokens x 8 lanes x
16 B per warp instruction; ``_gluon_sparse_decode_ws3`` module docstring, "RoPE rows"), ``ws3_rl`` = ROW_LANES (the
producer's lanes over token rows first: conflict-free dequantised NoPE stores; "Row lanes"), ``ws3_rl_rope`` = both.
V3.2, h_q 128, (b, s_q, topk) in SHAPES, s_k 8192 per request; plus V4.1 at b 128 s_q 1 (ROPE_ROWS is V3.2 only:
there ``ws3_rope`` runs the default kernel, a null control, and ``ws3_rl_rope`` the ``ws3_rl`` one; ROW_LANES does
change V4.1's kernel). Every shape also times the default twice (``ws3`` and ``ws3_aa``, the same launch): the A/A
paired ratio is the noise floor to read the A/B ratios against.

Correctness first: each variant once into NaN-poisoned outputs; each option's out / lse must equal the default's
bit for bit (``<variant>_bit``; ``bit_identical``: all of them). Timing: R rounds (``--rounds``, default 5), each
round times every variant (``triton.testing.do_bench``, warmup 3, rep 15, median) in an order rotated by one per
round; headline = the median over rounds of the PAIRED ratio t_variant / t_ws3 (< 1: the option is faster), so clock
drift cancels. TFLOPS from the per-variant medians (FlashMLA counting). JSON with provenance after every shape.
Usage (GPU): ``PYTHONPATH=src python benchmarks/sparse_decode_ws3_rope.py OUT.json [--rounds R]
[--quick | --v41 | --sweep | --idx | --q]`` (``--idx`` / ``--q``: against the option-off build)
"""
from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# (fmt, b, s_q, topk); the first row is the prediction's shape (module docstring)
SHAPES = (("v32", 128, 1, 2048), ("v32", 128, 2, 2048), ("v32", 64, 1, 2048), ("v32", 32, 4, 2048),
          ("v32", 128, 1, 512), ("v41", 128, 1, 2048))
# --sweep: the producer knobs re-tuned for WS3 (chosen for WS / WS2, whose producers do twice the work)
SHAPES_SWEEP = (("v32", 128, 1, 2048), ("v32", 128, 2, 2048), ("v41", 128, 1, 2048), ("v41", 128, 2, 2048))
# --v41: ROW_LANES on V4.1 (its first run: 0.960 at b 128 s_q 1) over more shapes
SHAPES_V41 = (("v41", 128, 1, 2048), ("v41", 128, 2, 2048), ("v41", 64, 1, 2048), ("v41", 32, 4, 2048),
              ("v41", 128, 1, 512))
# --idx: the index-ahead producer (IDX_AHEAD) and the per-thread L2 prefetch (PF_LINES), session 18's profile
# (benchmarks/notes/profiling.md, "WS3 sparse decode, V3.2 (session 18)"): the producer stalls ~1,100 cycles per
# block on just-issued index loads and ~950 on the bulk prefetch's uniform-address loop
SHAPES_IDX = (("v32", 128, 1, 2048), ("v32", 128, 2, 2048), ("v32", 64, 1, 2048), ("v41", 128, 1, 2048),
              ("v41", 128, 2, 2048), ("v41", 64, 1, 2048))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.path.join(os.environ.get("OUT", "."), "sparse_decode_ws3_rope.json"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="the first 2 shapes only")
    ap.add_argument("--v41", action="store_true", help="V4.1 shapes only (SHAPES_V41)")
    ap.add_argument("--q", action="store_true",
                    help="instead of the options: q_async (Q by cp.async) at SHAPES_IDX")
    ap.add_argument("--idx", action="store_true",
                    help="instead of the options: idx_ahead / pf_lines / pf_l2 variants at SHAPES_IDX")
    ap.add_argument("--sweep", action="store_true",
                    help="instead of the options: the producer knobs (pf_l2 flipped; V3.2 also deq_asm off and "
                         "the producer setmaxnreg -16, the softmax warpgroup getting them) against each format's "
                         "default, at SHAPES_SWEEP")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time")
        return 0
    import mla_sparse_decode as B
    from deepkernels.mla import _gluon_sparse_decode_ws3 as W3
    from deepkernels.bench.paired import (bit_identical, errors_text, first_runs, nan_variants, record_rounds,
                                          save_rows, time_rotated)
    from triton.testing import do_bench

    def variants_for(fmt):
        """(name, knobs) per variant: the base build twice ("ws3", "ws3_aa": the A/A control), then the options, each
        the base with its overrides. --idx / --q time against their option OFF (the session-17 producer / Q by plain
        loads), not against the current defaults, which include them."""
        base = {}
        if args.q:
            opts = [("ws3_qa", dict(q_async=True))]
            base = dict(q_async=False)
        elif args.idx:
            base = dict(idx_ahead=False, pf_lines=False, pf_l2=fmt == "v32")
            if fmt == "v32":     # session 17: bulk L2 prefetch on
                opts = [("ws3_ia", dict(idx_ahead=True)), ("ws3_ia_pfl", dict(idx_ahead=True, pf_lines=True)),
                        ("ws3_ia_nopf", dict(idx_ahead=True, pf_l2=False)), ("ws3_pfl", dict(pf_lines=True))]
            else:                # V4.1, session 17: no L2 prefetch (the bulk one measured 1.05-1.07x slower)
                opts = [("ws3_ia", dict(idx_ahead=True)),
                        ("ws3_ia_pfl", dict(idx_ahead=True, pf_l2=True, pf_lines=True)),
                        ("ws3_pfl", dict(pf_l2=True, pf_lines=True))]
        elif not args.sweep:
            opts = [("ws3_rope", dict(rope_rows=True)), ("ws3_rl", dict(row_lanes=True)),
                    ("ws3_rl_rope", dict(row_lanes=True, rope_rows=True))]
        else:
            # cross-compiled first (sm90 ptxas, page shift 6 + lengths + sink): left out are V4.1 deq_asm (87 spill
            # instructions in the producer loop), V3.2 producer +16 (5 in the softmax loop), V4.1 producer -16 (same
            # SASS) and +16 (2 producer spills)
            opts = [("ws3_pfl2", dict(pf_l2=fmt not in W3.WS3_PF_L2))]
            if fmt == "v32":
                opts += [("ws3_deq", dict(deq_asm=False)),
                         ("ws3_pr-16", dict(producer_regs=W3.WS3_PRODUCER_REGS[fmt] - 16))]
        return (("ws3", base), ("ws3_aa", base), *((n, {**base, **k}) for n, k in opts))

    shapes = (SHAPES_IDX if (args.idx or args.q) else SHAPES_SWEEP if args.sweep else SHAPES_V41 if args.v41
              else SHAPES[:2] if args.quick else SHAPES)
    rows = []
    B.warm_clocks()
    for fmt, b, s_q, topk in shapes:
        variants = variants_for(fmt)
        options = [n for n, _ in variants[2:]]
        h_q = 128
        c = B.kernel_case(fmt, b, s_q, h_q, topk, 8192)
        row = dict(fmt=fmt, b=b, s_q=s_q, h_q=h_q, topk=topk, s_k=8192, parts=c.parts, flop=c.flop)
        launches = {name: (lambda o, l_, k=knobs: W3.launch_sparse_decode_gluon_ws3(
            o, l_, c.q, c.cache, c.ind, c.sched, c.ns, c.scale, fmt, **k)) for name, knobs in variants}
        fns, outs = first_runs(launches, lambda: (torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16, device="cuda"),
                                                  torch.empty(b, s_q, h_q, device="cuda")), row)
        for v in options:
            if "ws3" in outs and v in outs:
                row[v + "_bit"] = bit_identical(outs["ws3"], outs[v])
        row["bit_identical"] = all(row.get(v + "_bit", False) for v in options)
        times = time_rotated(fns, args.rounds, lambda f: do_bench(f, warmup=3, rep=15, return_mode="median"))
        record_rounds(row, times, c.flop, [(v, v, "ws3") for v in ["ws3_aa"] + options])
        rows.append(row)
        nan = float("nan")
        print("SUMMARY %s b=%3d s_q=%d topk=%4d parts=%3d  ws3 %.1f TFLOPS  t/t_ws3: %s  (A/A %.4f)  bit %s  "
              "nan %s%s" % (
                  fmt, b, s_q, topk, c.parts, row.get("ws3_tflops", nan),
                  "  ".join("%s %.4f (%.1f)" % (v[4:], row.get(v + "_paired_median", nan), row.get(v + "_tflops", nan))
                            for v in options),
                  row.get("ws3_aa_paired_median", nan),
                  "".join("%s=%s " % (v[4:], row.get(v + "_bit")) for v in options).strip(),
                  nan_variants(row),
                  errors_text(row)), flush=True)
        save_rows(args.out, rows, rounds=args.rounds)
        del c, outs, fns
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
