"""Paired A/B of the DYN_QUEUE option of the Gluon dense MLA decode kernel (session 21; launcher keyword ``dyn_queue``,
``_gluon_dense_decode.dyn_parts`` for the parts-per-SM knob; notes benchmarks/notes/mla_decode_dyn.md): the static
launch of the dispatched schedule (``decode._num_sm_parts``: 2 parts per SM at < 64 rows) vs the dynamic work queue
on the same schedule (``dyn_same``; at < 64 rows that is ``dyn2``) and on finer ones (``dyn3`` / ``dyn4``: 3 / 4 parts
per SM), the static launch timed twice (A/A control).

Inputs: ``mla_decode_timeline.make_case`` (the public op's bench inputs, cases_mla._dense_decode_case's recipe: b 128,
varlen s_k ~ normal(mean, mean / 2), shuffled pages, NaN past each end; seeded), dispatched build options (None).
Each variant = one main-kernel launch + ``combine_splits_`` (the whole split-KV step but the metadata: finer
schedules have more split pieces to combine), captured in a CUDA graph and replayed by ``do_bench`` (L2 flushed per
replay, median), ``--rounds`` rounds in rotated order, paired per-round ratios t / t_static. Before timing, every dyn
variant's out / lse / accumulators are compared with a static launch of the same schedule on NaN-poisoned buffers
(bit identity expected: ``bit_identical``). JSON rewritten after every shape (a cap hit keeps the shapes done).

Usage (GPU): ``PYTHONPATH=src python benchmarks/mla_decode_dyn.py OUT.json [--rounds 5] [--rep-ms 20]
[--only-shapes 16:1:4096,...] [--variants dyn_same,dyn2,dyn3,dyn4]``; without CUDA it prints a note and exits 0.
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
# the question first (4K, where the two waves cost most), then 32K (where static 1-per-SM lost), h_q 128, 8K
SHAPES = [(16, 1, 4096), (32, 1, 4096), (16, 2, 4096), (32, 2, 4096), (16, 1, 32768), (32, 1, 32768),
          (128, 1, 4096), (128, 1, 32768), (16, 1, 8192), (32, 1, 8192), (16, 2, 8192), (32, 2, 8192),
          (16, 2, 32768), (32, 2, 32768)]
# variant -> parts per SM of its schedule (None: the static launch's schedule)
VARIANTS = {"dyn_same": None, "dyn2": 2, "dyn3": 3, "dyn4": 4}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default=os.path.join(os.environ.get("OUT", "/tmp"), "mla_decode_dyn.json"))
    p.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", "5")))
    p.add_argument("--rep-ms", type=int, default=int(os.environ.get("REP_MS", "20")))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--only-shapes", default=os.environ.get("ONLY_SHAPES"), help="h_q:s_q:s_k,... (env ONLY_SHAPES)")
    p.add_argument("--variants", default=",".join(VARIANTS), help="subset of " + ",".join(VARIANTS))
    return p.parse_args(argv)


def variant_parts(static_parts: int, dyn_parts_of, names) -> dict:
    """``{variant: parts}`` for the selected dyn variants, dropping a ``dynN`` whose schedule equals the static one
    (then ``dyn_same`` is that comparison) and ``dyn_same`` when it is not selected."""
    out = {}
    for n in names:
        per_sm = VARIANTS[n]
        parts = static_parts if per_sm is None else dyn_parts_of(per_sm)
        if per_sm is not None and parts == static_parts and "dyn_same" in names:
            continue
        out[n] = parts
    return out


def main(args) -> int:
    from mla_decode_ring import parse_shapes
    only = parse_shapes(args.only_shapes)
    names = [v for v in args.variants.split(",") if v]
    bad = [v for v in names if v not in VARIANTS]
    if bad:
        raise SystemExit(f"unknown variants {bad}; known {list(VARIANTS)}")
    if not torch.cuda.is_available():
        print("mla_decode_dyn: no CUDA device; nothing measured", flush=True)
        return 0
    import deepkernels.mla.decode as dec
    from deepkernels.mla import _gluon_dense_decode as G
    from deepkernels.mla.combine import combine_splits_
    from deepkernels.mla.metadata import compute_schedule
    from deepkernels.bench.runner import provenance
    from deepkernels.bench.paired import rotation, round_stats, time_rotated
    from mla_decode_epi import _graph
    from triton.testing import do_bench

    prov = provenance()
    prov.update(mode="dyn_queue", gluon_config=list(G.GLUON_DEFAULT), rounds=args.rounds, rep_ms=args.rep_ms,
                git_sha_env=os.environ.get("GIT_SHA"), variants=VARIANTS, num_sms=G._dyn_num_ctas("cuda"),
                timing=dict(method="CUDA-graph replay of main-kernel launch + combine_splits_, do_bench median, L2 "
                                   "flushed per replay, rotated rounds", headline="paired t / t_static median"))
    rows = []
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(300):                  # clocks up before the first timing
        x @ x
    del x

    def save():
        with open(args.out, "w") as f:
            json.dump(dict(provenance=prov, rows=rows), f, indent=1)

    for h_q, s_q, s_k in SHAPES:
        if only is not None and (h_q, s_q, s_k) not in only:
            continue
        causal = s_q > 1
        rec = dict(b=B, s_q=s_q, h_q=h_q, h_kv=1, s_k=s_k, causal=causal)
        q = k = bt = sl = graphs = outs = scheds = None
        try:
            q, k, bt, sl, seqlens = TLB.make_case(B, s_q, h_q, s_k, seed=args.seed)
            rows_q = s_q * h_q
            m_blocks = -(-rows_q // 64)
            p0 = dec._num_sm_parts(q.device, rows_q, 1)
            vparts = variant_parts(p0, lambda ps: G.dyn_parts(q.device, rows_q, 1, ps), names)
            scheds = {p: compute_schedule(sl, p) for p in {p0, *vparts.values()}}
            rec.update(tokens=int(sum(seqlens)), bytes=int(sum(seqlens)) * 576 * 2, static_parts=p0,
                       variant_parts=vparts, items={n: p * m_blocks for n, p in vparts.items()},
                       split_requests={str(p): int(((ns[1:] - ns[:-1]) > 1).sum()) for p, (_, ns) in scheds.items()},
                       pieces_total={str(p): int(ns[-1].item()) for p, (_, ns) in scheds.items()})
            scale = TLB.D_QK ** -0.5

            def step(o, parts, dyn):
                sched, ns = scheds[parts]
                return lambda: (G.gluon_dense_launch(q, k, bt, sl, sched, ns, scale, causal, *o, dyn_queue=dyn),
                                combine_splits_(o[0], o[1], o[2], o[3], ns, lengths=sl, causal=causal))
            # bit identity on NaN-poisoned outputs: each dyn variant vs the static launch of its schedule
            outs = {"static": TLB.alloc_outs(q, p0)}
            rec["bit_identical"] = {}
            for n, p in vparts.items():
                a = TLB.alloc_outs(q, p, poison=True)
                c = TLB.alloc_outs(q, p, poison=True)
                G.gluon_dense_launch(q, k, bt, sl, *scheds[p], scale, causal, *a)
                G.gluon_dense_launch(q, k, bt, sl, *scheds[p], scale, causal, *c, dyn_queue=True)
                torch.cuda.synchronize()
                rec["bit_identical"][n] = all(torch.equal(u.nan_to_num(1234.5), v.nan_to_num(1234.5))
                                              for u, v in zip(a, c))
                outs[n] = c
                a = None
            graphs = {"static": _graph(step(outs["static"], p0, False)),
                      "static_again": _graph(step(outs["static"], p0, False))}
            for n, p in vparts.items():
                graphs[n] = _graph(step(outs[n], p, True))
            errors = {}
            ms = time_rotated({n: g.replay for n, g in graphs.items()}, args.rounds,
                              lambda f: do_bench(f, warmup=5, rep=args.rep_ms, return_mode="median"), errors)
            rec["timing"] = round_stats(ms, "static")
            rec["timing_orders"] = [rotation(list(graphs), r) for r in range(args.rounds)]
            if errors:
                rec["timing_errors"] = errors
            for st in rec["timing"].values():
                st["gbps"] = rec["bytes"] / st["ms"] / 1e6
            rec["counter_after"] = int(G._dyn_counter(q.device).item())
        except Exception as e:  # noqa: BLE001
            import traceback
            rec["failed"] = f"{type(e).__name__}: {str(e)[:300]}"
            rec["traceback"] = traceback.format_exc()[-2000:]
        rows.append(rec)
        save()
        _print_row(rec)
        q = k = bt = sl = graphs = outs = scheds = None      # noqa: F841 (free the case before the next)
        torch.cuda.empty_cache()
    if not rows:
        save()
        print("mla_decode_dyn: no shape selected", flush=True)
    return 0


def _print_row(rec):
    head = f"h_q={rec['h_q']:3d} s_q={rec['s_q']} s_k={rec['s_k']:5d}"
    if "failed" in rec:
        print(f"SUMMARY {head} FAILED {rec['failed'][:200]}", flush=True)
        return
    t = rec["timing"]
    base = t.get("static", {})
    parts = [f"static({rec['static_parts']}) {TLB._f(base.get('ms'), '%.4f')} ms "
             f"({TLB._f(base.get('gbps'), '%.0f')} GB/s)"]
    for n, st in t.items():
        if n == "static":
            continue
        tag = "A/A" if n == "static_again" else f"{n}({rec['variant_parts'].get(n)})"
        bid = "" if n == "static_again" else ("" if rec["bit_identical"].get(n) else " NOT-BITID")
        parts.append(f"{tag} {TLB._f(st.get('paired_time_ratio_median'), '%.3f')} "
                     f"[{TLB._f(st.get('paired_time_ratio_min'), '%.3f')}-"
                     f"{TLB._f(st.get('paired_time_ratio_max'), '%.3f')}]{bid}")
    print(f"SUMMARY {head} " + " | ".join(parts), flush=True)


if __name__ == "__main__":
    sys.exit(main(parse_args()))
