"""Session 20 paired A/B: the WS4 "pair" kernel with WS2's prologue / epilogue and the producer's indices one pair
ahead (mla/_gluon_sparse_prefill_ws4.py ``q_async`` / ``o_stage`` / ``idx_ahead``) against the dispatched WS2 build.

Labels (timing order of round 0; rotated by one per round):
  ws2      the dispatched WS2 launch (``launch_sparse_prefill_gluon_ws2`` defaults: GATHER_ROWS4 + Q_ASYNC + O_STAGE) = base
  ws2-aa   the same launch again (A/A control)
  ws4-r4   WS4 with the 4-rows gather (session 18's best WS4 build)
  ws4-qo   + q_async + o_stage
  ws4-qoi  + q_async + o_stage + idx_ahead (the candidate)
Shapes: s_q 4096, h_q 128, d_qk 576, topk 2048 (FlashMLA's benchmark inputs: unique random indices per row), s_kv
--s-kv (default 8K, 64K, 32K, 128K, in this order: the most-cited first if the cap cuts the run) without sink, plus (``--extra``) s_kv 8K with a sink and s_kv 8K with
topk_length (per row uniform in [1024, 2048]) for ws2 / ws2-aa / ws4-qoi only.
Method (benchmarks/mla_prefill.py ``_paired_rounds``): each label once with NaN-poisoned outputs (error on 4 rows
against the reference, NaN check, bit identity: ws2-aa vs ws2, ws4-qo / ws4-qoi vs ws4-r4; max |out - out_ws2|),
then --rounds rotated rounds of do_bench medians (warmup 10, rep --rep ms); per label the median over rounds and
the median of the paired per-round ratios t / t_ws2. JSON rows with provenance (GIT_SHA) after every shape.

Usage: python benchmarks/sparse_prefill_s20.py [--rounds 5] [--s-kv 8192,...] [--no-extra] [--out F.json]
       python benchmarks/sparse_prefill_s20.py --dry-run     (CPU: argument parsing and labels only)
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))
sys.path.insert(0, os.path.dirname(__file__))

import mla_prefill as mp  # noqa: E402
from deepkernels.bench.paired import round_stats, time_rotated  # noqa: E402
from deepkernels.mla import _gluon_sparse_prefill_ws2 as _gsp2  # noqa: E402
from deepkernels.mla import _gluon_sparse_prefill_ws4 as _gsp4  # noqa: E402
from deepkernels.reference.mla_prefill import sparse_prefill_ref  # noqa: E402

BASE = "ws2"
_WS4 = {"ws4-r4": dict(gather_rows4=True), "ws4-qo": dict(gather_rows4=True, q_async=True, o_stage=True),
        "ws4-qoi": dict(gather_rows4=True, q_async=True, o_stage=True, idx_ahead=True)}
LABELS = ("ws2", "ws2-aa", "ws4-r4", "ws4-qo", "ws4-qoi")
EXTRA_LABELS = ("ws2", "ws2-aa", "ws4-qoi")
# bit-identity reference per label
SAME_AS = {"ws2-aa": "ws2", "ws4-qo": "ws4-r4", "ws4-qoi": "ws4-r4"}


def launcher(label):
    if label in ("ws2", "ws2-aa"):
        return _gsp2.launch_sparse_prefill_gluon_ws2
    kw = _WS4[label]
    return lambda out, ml, lse, q, kv, ind, scale, sk, tl: _gsp4.launch_sparse_prefill_gluon_ws4(
        out, ml, lse, q, kv, ind, scale, sk, tl, **kw)


def run_shape(rows, labels, s_kv, sink, with_len, rounds, rep, s_q=4096, topk=2048, timer=None):
    h_q, d_qk = 128, 576
    q, kv, ind, sk = mp.sparse_inputs(s_q, s_kv, topk, h_q, d_qk, sink)
    dev = q.device
    tl = None
    if with_len:
        g = torch.Generator(device=dev).manual_seed(20)
        tl = torch.randint(topk // 2, topk + 1, (s_q, ), device=dev, dtype=torch.int32, generator=g)
    shape = dict(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, sink=sink, topk_length=with_len)
    flops = 2 * s_q * topk * h_q * (d_qk + 512)      # FlashMLA's count (topk, not the lengths)
    out = torch.empty(s_q, h_q, 512, dtype=torch.bfloat16, device=dev)
    ml = torch.empty(s_q, h_q, device=dev)
    lse = torch.empty(s_q, h_q, device=dev)
    chk = torch.tensor([0, 1, s_q // 2, s_q - 1], device=dev)
    ro, _, rlse = sparse_prefill_ref(q[chk], kv, ind[chk], 0.5, 512, sk, None if tl is None else tl[chk])
    fns, res, info = {}, {}, {}
    for lab in labels:
        try:
            f = launcher(lab)
            fn = (lambda f=f: f(out, ml, lse, q, kv, ind, 0.5, sk, tl))
            for t in (out, ml, lse):
                t.fill_(float("nan"))
            fn()
            if dev.type == "cuda":
                torch.cuda.synchronize()
            res[lab] = (out.clone(), ml.clone(), lse.clone())
            info[lab] = dict(max_abs_err_rows=(out[chk].float() - ro).abs().max().item(),
                             lse_err_rows=(lse[chk] - rlse).abs().max().item(),
                             nan=bool(torch.isnan(out).any() or torch.isnan(lse).any() or torch.isnan(ml).any()))
            fns[lab] = fn
        except Exception as e:  # noqa: BLE001
            rows.append(dict(op="flash_mla_sparse_fwd", config=lab, shape=shape, error=repr(e)[:400]))
            print(json.dumps(rows[-1]), flush=True)
    for lab, ref in SAME_AS.items():
        if lab in res and ref in res:
            info[lab]["bit_identical_to"] = ref
            info[lab]["bit_identical"] = all(torch.equal(x, y) for x, y in zip(res[lab], res[ref]))
    for lab in res:
        if BASE in res and lab != BASE:
            info[lab]["max_abs_diff_out_vs_ws2"] = (res[lab][0].float() - res[BASE][0].float()).abs().max().item()
    if timer is None:
        import triton.testing
        timer = lambda f: triton.testing.do_bench(f, warmup=10, rep=rep, return_mode="median")  # noqa: E731
    errors = {}
    times = time_rotated(fns, rounds, timer, errors)
    stats = round_stats(times, BASE)
    for lab in times:
        st = stats.get(lab)
        if not st:
            rows.append(dict(op="flash_mla_sparse_fwd", config=lab, shape=shape, error=str(errors.get(lab))[:400]))
            continue
        row = dict(op="flash_mla_sparse_fwd", provider="deepkernels", config=lab, shape=shape,
                   median_us=st["ms"] * 1e3, tflops=flops / st["ms"] / 1e9, ms_rounds=times[lab], rounds=rounds,
                   anchor="FlashMLA H200 (ANCHORS.md, no sink)", anchor_tflops=mp.FLASHMLA_H200.get(s_kv),
                   **info[lab])
        if lab != BASE and "paired_time_ratios" in st:
            row.update(paired_base=BASE, paired_ratios=st["paired_time_ratios"],
                       paired_median=st.get("paired_time_ratio_median"))
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "ms_rounds"}), flush=True)
    fns.clear()
    res.clear()
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rep", type=int, default=50, help="do_bench rep (ms) per timing")
    ap.add_argument("--s-kv", default="8192,65536,32768,131072", help="no-sink shapes, in timing order")
    ap.add_argument("--no-extra", action="store_true", help="skip the sink / topk_length shapes at s_kv 8K")
    ap.add_argument("--out", default=None)
    ap.add_argument("--dry-run", action="store_true", help="print the plan and exit (no GPU needed)")
    args = ap.parse_args(argv)
    s_kvs = [int(x) for x in args.s_kv.split(",") if x]
    plan = [(s, False, False, LABELS) for s in s_kvs]
    if not args.no_extra:
        plan += [(8192, True, False, EXTRA_LABELS), (8192, False, True, EXTRA_LABELS)]
    if args.dry_run or not torch.cuda.is_available():
        for s, sink, wl, labs in plan:
            print(f"plan: s_kv {s} sink {sink} topk_length {wl}: {', '.join(labs)} x {args.rounds} rounds")
        if not args.dry_run:
            print("no CUDA device: nothing timed")
        return 0
    prov = mp.provenance()
    print(json.dumps(prov), flush=True)
    rows = []
    for s, sink, wl, labs in plan:
        run_shape(rows, labs, s, sink, wl, args.rounds, args.rep)
        if args.out:
            with open(args.out, "w") as f:
                json.dump(dict(provenance=prov, rounds=args.rounds, rows=rows), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
