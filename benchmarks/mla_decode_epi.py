"""Paired A/B of the EPI options of the Gluon dense MLA decode kernel (session 21; launcher keywords ``epi_nsp`` (a),
``epi_early`` (b), ``epi_sis``; notes benchmarks/notes/mla_decode_timeline.md "EPI"): the dispatched build vs a / b /
a+b (+ sis, a+b+sis on the PVR builds), the dispatched build timed twice (A/A control).

Inputs and schedule as benchmarks/mla_decode_timeline.py (``make_case``: b 128, varlen s_k ~ normal(mean, mean / 2),
shuffled pages, NaN past each end; ``compute_schedule(seqlens, decode._num_sm_parts(...))``), main kernel only (no
combine), each variant's launch captured in a CUDA graph and replayed by ``do_bench`` (L2 flushed before each
replay, median), ``--rounds`` rounds in rotated order, paired per-round ratios t / t_dispatched. Before timing, each
variant's outputs are compared with the dispatched build's on NaN-poisoned buffers (bit identity expected). After
the first shape's A/B (h_q 128 s_q 1 4K), ``--tl-reps`` instrumented launches (TIMELINE, after L2 flushes) of the
dispatched build and of each variant, analysed by ``mla_decode_timeline.analyse`` (epilogue medians, finer stamps).
JSON rewritten after every shape (a cap hit keeps the shapes done).

Usage (GPU): ``PYTHONPATH=src python benchmarks/mla_decode_epi.py OUT.json [--rounds 5] [--rep-ms 20]
[--only-shapes 128:1:4096,...] [--tl-reps 3]``; without CUDA it prints a note and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mla_decode_timeline as TLB  # noqa: E402

B = 128
# first shape first: the timeline of the variants runs after it
SHAPES = [(128, 1, 4096), (128, 1, 32768), (128, 2, 4096), (16, 1, 4096), (128, 1, 8192), (16, 1, 32768)]
VARIANTS = {"a": dict(epi_nsp=True), "b": dict(epi_early=True), "ab": dict(epi_nsp=True, epi_early=True),
            "sis": dict(epi_sis=True), "abs": dict(epi_nsp=True, epi_early=True, epi_sis=True)}
PVR_ONLY = ("sis", "abs")       # EPI_SIS has no effect without PVR (h_q 16: the plain build)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default=os.path.join(os.environ.get("OUT", "/tmp"), "mla_decode_epi.json"))
    p.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", "5")))
    p.add_argument("--rep-ms", type=int, default=int(os.environ.get("REP_MS", "20")))
    p.add_argument("--tl-reps", type=int, default=int(os.environ.get("TL_REPS", "3")))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only-shapes", default=os.environ.get("ONLY_SHAPES"), help="h_q:s_q:s_k,... (env ONLY_SHAPES)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="subset of " + ",".join(VARIANTS))
    return p.parse_args(argv)


def _graph(fn):
    """fn captured in a CUDA graph (:func:`deepkernels.bench.runner.capture_graph`)."""
    from deepkernels.bench.runner import capture_graph
    g, _ = capture_graph(fn)
    torch.cuda.synchronize()
    return g


def main(args) -> int:
    from mla_decode_ring import parse_shapes
    only = parse_shapes(args.only_shapes)
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variants {bad}; known {list(VARIANTS)}")
    if not torch.cuda.is_available():
        print("mla_decode_epi: no CUDA device; nothing measured", flush=True)
        return 0
    import deepkernels.mla.decode as dec
    from deepkernels.mla import _gluon_dense_decode as G
    from deepkernels.mla.metadata import compute_schedule
    from deepkernels.bench.runner import provenance
    from deepkernels.bench.paired import rotation, round_stats, time_rotated
    from triton.testing import do_bench

    prov = provenance()
    prov.update(mode="epi", gluon_config=list(G.GLUON_DEFAULT), rounds=args.rounds, rep_ms=args.rep_ms,
                tl_reps=args.tl_reps, git_sha_env=os.environ.get("GIT_SHA"), variants=VARIANTS,
                timing=dict(method="CUDA-graph replay of one main-kernel launch (no combine), do_bench median, L2 "
                                   "flushed per replay, rotated rounds", headline="paired t / t_dispatched median"))
    rows = []
    flush = torch.empty(int(256e6 // 4), dtype=torch.int32, device="cuda")
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(300):                  # clocks up before the first timing
        x @ x
    del x

    def save():
        with open(args.out, "w") as f:
            json.dump(dict(provenance=prov, rows=rows), f, indent=1)

    for si, (h_q, s_q, s_k) in enumerate(SHAPES):
        if only is not None and (h_q, s_q, s_k) not in only:
            continue
        causal = s_q > 1
        rec = dict(b=B, s_q=s_q, h_q=h_q, h_kv=1, s_k=s_k, causal=causal)
        q = k = bt = sl = graphs = outs = None
        try:
            q, k, bt, sl, seqlens = TLB.make_case(B, s_q, h_q, s_k, seed=args.seed)
            rows_q = s_q * h_q
            sched, ns = compute_schedule(sl, dec._num_sm_parts(q.device, rows_q, 1))
            parts = int(sched.shape[0])
            m_blocks = -(-rows_q // 64)
            nsp = (ns[1:] - ns[:-1]).cpu()
            rec.update(parts=parts, grid=parts * m_blocks, tokens=int(sum(seqlens)),
                       flop=2.0 * s_q * sum(seqlens) * h_q * (TLB.D_QK + TLB.D_V), pieces_total=int(ns[-1].item()),
                       split_requests=int((nsp > 1).sum()))
            scale = TLB.D_QK ** -0.5
            names = [v for v in variants if h_q >= G.DISPATCH_PVR_MIN_HEADS or v not in PVR_ONLY]
            kws = {"dispatched": {}, **{v: VARIANTS[v] for v in names}}

            def launch(outs_, kw, timeline=None):
                return lambda: G.gluon_dense_launch(q, k, bt, sl, sched, ns, scale, causal, *outs_,
                                                    timeline=timeline, **kw)
            # bit identity on NaN-poisoned outputs
            outs = {n: TLB.alloc_outs(q, parts, poison=True) for n in kws}
            for n, kw in kws.items():
                launch(outs[n], kw)()
            torch.cuda.synchronize()
            rec["bit_identical"] = {n: all(torch.equal(a.nan_to_num(1234.5), b_.nan_to_num(1234.5))
                                           for a, b_ in zip(outs["dispatched"], outs[n])) for n in names}
            # CUDA graphs: dispatched (twice: A/A), each variant
            graphs = {"dispatched": _graph(launch(outs["dispatched"], {})),
                      "dispatched_again": _graph(launch(outs["dispatched"], {}))}
            for n in names:
                graphs[n] = _graph(launch(outs[n], kws[n]))
            errors = {}
            ms = time_rotated({n: g.replay for n, g in graphs.items()}, args.rounds,
                              lambda f: do_bench(f, warmup=5, rep=args.rep_ms, return_mode="median"), errors)
            rec["timing"] = round_stats(ms, "dispatched")
            rec["timing_orders"] = [rotation(list(graphs), r) for r in range(args.rounds)]
            if errors:
                rec["timing_errors"] = errors
            for st in rec["timing"].values():
                st["tflops"] = rec["flop"] / st["ms"] / 1e9
            graphs = None
            if si == 0 and args.tl_reps > 0:      # timeline of every variant at the first shape
                rec["timeline"] = {}
                tl = torch.zeros(parts * m_blocks, G.TL_WORDS, dtype=torch.int64, device="cuda")
                for n, kw in kws.items():
                    reps = []
                    for _ in range(args.tl_reps):
                        tl.zero_()
                        flush.zero_()
                        torch.cuda.synchronize()
                        launch(outs[n], kw, tl)()
                        torch.cuda.synchronize()
                        reps.append(TLB.analyse(tl.cpu().numpy(), m_blocks))
                    rec["timeline"][n] = dict(summary=TLB.summarize(reps), reps=reps)
                    s = rec["timeline"][n]["summary"]
                    _print_tl(n, s)
                tl = None
        except Exception as e:  # noqa: BLE001
            import traceback
            rec["failed"] = f"{type(e).__name__}: {str(e)[:300]}"
            rec["traceback"] = traceback.format_exc()[-2000:]
        rows.append(rec)
        save()
        _print_row(rec)
        q = k = bt = sl = graphs = outs = None      # noqa: F841 (free the case before the next)
        torch.cuda.empty_cache()
    if not rows:
        save()
        print("mla_decode_epi: no shape selected", flush=True)
    return 0


def _print_tl(n, s):
    print(f"TIMELINE {n:10s} makespan {TLB._f(s['makespan_us'])} epi "
          f"{TLB._f(s['epilogue_median_us'], '%.2f')} (single "
          f"{TLB._f(s['epilogue_single_median_us'], '%.2f')} split "
          f"{TLB._f(s['epilogue_split_median_us'], '%.2f')}) le->pfree "
          f"{TLB._f(s['epi_pfree_single_us'], '%.2f')}/{TLB._f(s['epi_pfree_split_us'], '%.2f')} "
          f"le->O {TLB._f(s['epi_ostore_single_us'], '%.2f')}/"
          f"{TLB._f(s['epi_ostore_split_us'], '%.2f')} O->end "
          f"{TLB._f(s['epi_after_ostore_single_us'], '%.2f')}/"
          f"{TLB._f(s['epi_after_ostore_split_us'], '%.2f')} gap "
          f"{TLB._f(s['gap_median_us'], '%.2f')} fixed/CTA {TLB._f(s['fixed_per_cta_mean_us'])} "
          f"fit piece {TLB._f(s['fit_piece_us'], '%.2f')} split {TLB._f(s['fit_split_us'], '%.2f')} "
          f"tail {TLB._f(s['tail_us'])}", flush=True)


def _print_row(rec):
    head = f"h_q={rec['h_q']:3d} s_q={rec['s_q']} s_k={rec['s_k']:5d}"
    if "failed" in rec:
        print(f"SUMMARY {head} FAILED {rec['failed'][:200]}", flush=True)
        return
    t = rec["timing"]
    base = t.get("dispatched", {})
    parts = [f"dispatched {TLB._f(base.get('ms'), '%.4f')} ms ({TLB._f(base.get('tflops'), '%.0f')} TF)"]
    for n, st in t.items():
        if n == "dispatched":
            continue
        tag = "A/A" if n == "dispatched_again" else n
        bid = "" if n == "dispatched_again" else ("" if rec["bit_identical"].get(n) else " NOT-BITID")
        parts.append(f"{tag} {TLB._f(st.get('paired_time_ratio_median'), '%.3f')} "
                     f"[{TLB._f(st.get('paired_time_ratio_min'), '%.3f')}-"
                     f"{TLB._f(st.get('paired_time_ratio_max'), '%.3f')}]{bid}")
    print(f"SUMMARY {head} parts {rec['parts']} splitreq {rec['split_requests']} | " + " | ".join(parts), flush=True)


if __name__ == "__main__":
    sys.exit(main(parse_args()))
