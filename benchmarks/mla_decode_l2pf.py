"""L2PF option of the Gluon dense MLA decode (``deepkernels.mla._gluon_dense_decode``, launcher keyword ``l2pf``,
session 20b: with PVR, the producer prefetches the next page of the piece into L2) vs the dispatched build (PVR at
>= 128 heads), paired on the same schedule and inputs (the method and helpers of ``benchmarks/mla_decode_pvr.py``:
rotated rounds, per-round paired time ratios, an A/A control).

Shapes: b 128, h_kv 1, varlen s_k (``benchmarks/mla_decode.py`` make_inputs, FlashMLA FLOP counting): h_q 128 s_q 1
at s_k 8192 / 32768 / 4096, s_q 2 (causal) at 8192 (:data:`SHAPES`; ``--only-shapes h_q:s_q:s_k,...`` selects a
subset). Providers: ``default`` = the kernel as decode.py dispatches it (all options None: Q by TMA, TRIM, PVR at
>= 128 heads), ``l2pf`` = the same with ``l2pf=True``, ``default_again`` = A/A control. Each provider runs once
with NaN-poisoned outputs (``nan`` flag), records max |out - default| / |lse - default| (L2PF changes no arithmetic:
expected 0, ``bitid``) and is then timed
in ``--rounds`` rotated rounds of ``do_bench(warmup=3, rep=--rep-ms)`` medians. SUMMARY ``t/def`` = median of the
per-round paired ratios t_provider / t_default (< 1: faster). JSON (rewritten after every shape) with provenance
(GPU, torch / triton versions, GIT_SHA).

Usage (GPU): ``PYTHONPATH=src python benchmarks/mla_decode_l2pf.py OUT.json [--rounds 5] [--rep-ms 15]
[--only-shapes 128:1:8192]``; without CUDA it prints a note and exits 0.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from deepkernels.bench.paired import rotation, round_stats, time_rotated

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# provider -> (half_tiles, q_tma, trim, pvr, l2pf); None = decode.py's dispatched choice (gluon_dense_launch)
PROVIDERS = {"default": (None, None, None, None, None), "l2pf": (None, None, None, None, True),
             "default_again": (None, None, None, None, None)}
SHAPES = [(128, 1, 8192), (128, 1, 32768), (128, 1, 4096), (128, 2, 8192)]


def main(args) -> int:
    from mla_decode_ring import parse_shapes
    path = args.out
    only = parse_shapes(args.only_shapes)
    if not torch.cuda.is_available():
        print("mla_decode_l2pf: no CUDA device; nothing timed", flush=True)
        return 0
    import mla_decode as B                      # make_inputs, FlashMLA counting
    import deepkernels.mla.decode as dec
    from deepkernels.mla import _gluon_dense_decode as G
    from deepkernels.mla.metadata import compute_schedule
    from deepkernels.bench.runner import provenance
    from triton.testing import do_bench

    rounds = max(1, args.rounds)
    names = list(PROVIDERS)
    prov = provenance()
    prov["gluon_config"] = list(G.GLUON_DEFAULT)
    prov["mode"] = "l2pf"
    prov["providers"] = {n: dict(zip(("half_tiles", "q_tma", "trim", "pvr", "l2pf"), PROVIDERS[n])) for n in names}
    prov["dispatch"] = dict(DISPATCH_Q_TMA=G.DISPATCH_Q_TMA, DISPATCH_HALF_MIN_SQ=G.DISPATCH_HALF_MIN_SQ,
                            DISPATCH_MIN_ROWS=G.DISPATCH_MIN_ROWS, DISPATCH_TRIM=G.DISPATCH_TRIM,
                            DISPATCH_PVR=G.DISPATCH_PVR, DISPATCH_PVR_MIN_HEADS=G.DISPATCH_PVR_MIN_HEADS,
                            DISPATCH_L2PF=G.DISPATCH_L2PF)
    prov["timing"] = dict(method="rotated rounds", rounds=rounds, do_bench_warmup_ms=3, do_bench_rep_ms=args.rep_ms,
                          return_mode="median", headline="paired_time_ratio_median (provider ms / default ms)")
    rows = []
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(300):                        # clocks up before the first timing
        x @ x
    del x
    for h_q, s_q, s_k in SHAPES:
        if only is not None and (h_q, s_q, s_k) not in only:
            continue
        causal = s_q > 1
        q, k, bt, sl = B.make_inputs(128, s_q, h_q, 1, s_k)
        flop = 2 * s_q * int(sl.sum()) * h_q * (B.D_QK + B.D_V)
        scale = B.D_QK ** -0.5
        sched, ns = compute_schedule(sl, dec._num_sm_parts(q.device, s_q * h_q, 1))
        rec = dict(b=128, s_q=s_q, h_q=h_q, h_kv=1, s_k=s_k, causal=causal, flop=flop, parts=int(sched.shape[0]),
                   rounds=rounds)
        outs, fns = {}, {}
        for n in names:
            ht, qt, tr, pv, pf = PROVIDERS[n]
            fn = (lambda ht=ht, qt=qt, tr=tr, pv=pv, pf=pf, inp=(q, k, bt, sl): G.gluon_dense_forward(
                *inp, sched, ns, scale, causal, half_tiles=ht, q_tma=qt, trim=tr, pvr=pv, l2pf=pf))
            try:
                dec._POISON_OUTPUTS = True       # outputs NaN-filled first: every element must be written
                o, lse = fn()
                torch.cuda.synchronize()
                dec._POISON_OUTPUTS = False
                outs[n], fns[n] = (o, lse), fn
                rec[n] = dict(nan=bool(torch.isnan(o).any() or torch.isnan(lse).any()))
            except Exception as e:  # noqa: BLE001
                dec._POISON_OUTPUTS = False
                rec[n] = dict(failed=f"{type(e).__name__}: {str(e)[:300]}")
        live = [n for n in names if n in fns]
        errors = {}
        ms_rounds = time_rotated({n: fns[n] for n in live}, rounds,
                                 lambda f: do_bench(f, warmup=3, rep=args.rep_ms, return_mode="median"), errors)
        for n, msgs in errors.items():
            rec[n]["timing_errors"] = msgs
        rec["orders"] = [rotation(live, r) for r in range(rounds)]
        for n, st in round_stats(ms_rounds, "default").items():
            rec[n].update(st)
            rec[n]["tflops"] = flop / st["ms"] / 1e9
        if "default" in outs:
            o_d, l_d = outs["default"]
            for n in names:
                if n == "default" or n not in outs:
                    continue
                o, lse = outs[n]
                rec[n]["max_abs_diff_out"] = float((o.float() - o_d.float()).abs().nan_to_num(float("inf")).max())
                fin = torch.isfinite(lse) & torch.isfinite(l_d)
                rec[n]["max_abs_diff_lse"] = float((lse[fin] - l_d[fin]).abs().max()) if fin.any() else 0.0
                rec[n]["bit_identical"] = bool(torch.equal(o, o_d) and torch.equal(lse.nan_to_num(), l_d.nan_to_num()))
        rows.append(rec)
        with open(path, "w") as f:
            json.dump(dict(provenance=prov, rows=rows), f, indent=1)
        parts = []
        for n in names:
            v = rec[n]
            if "ms" not in v:
                parts.append(f"{n} FAILED {v.get('failed', '')[:80]}")
                continue
            s = f"{n} {v['tflops']:6.1f} TF"
            if n != "default":
                s += (f" t/def {v.get('paired_time_ratio_median', float('nan')):.3f}"
                      f" [{v.get('paired_time_ratio_min', float('nan')):.3f}"
                      f"-{v.get('paired_time_ratio_max', float('nan')):.3f}] d{v.get('max_abs_diff_out', -1):.1e}"
                      f"{' bitid' if v.get('bit_identical') else ''}")
            parts.append(s + (" NaN" if v.get("nan") else ""))
        print(f"SUMMARY h_q={h_q:3d} s_q={s_q} s_k={s_k:5d} parts {rec['parts']:3d} R{rounds}  " + "  ".join(parts),
              flush=True)
        del q, k, bt, sl, outs, fns
        torch.cuda.empty_cache()
    dec._POISON_OUTPUTS = False
    if not rows:
        with open(path, "w") as f:
            json.dump(dict(provenance=prov, rows=rows), f, indent=1)
        print("mla_decode_l2pf: no shape selected", flush=True)
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out", nargs="?", default=os.path.join(os.environ.get("OUT", "/tmp"), "mla_decode_l2pf.json"))
    p.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", "5")))
    p.add_argument("--rep-ms", type=int, default=int(os.environ.get("REP_MS", "15")))
    p.add_argument("--only-shapes", default=os.environ.get("ONLY_SHAPES"), help="h_q:s_q:s_k,... (env ONLY_SHAPES)")
    return p.parse_args(argv)


if __name__ == "__main__":
    sys.exit(main(parse_args()))
