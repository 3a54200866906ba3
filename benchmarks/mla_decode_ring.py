"""Default Gluon dense MLA decode vs its opt-in variant (``deepkernels.mla._gluon_dense_decode``, launcher keywords
``half_tiles`` / ``q_tma``) on the same schedule and inputs; ``--trim``: the TRIM option (launcher keyword ``trim``,
session 19: mask only tiles that can hold a masked token, scale folded into one FFMA) off vs on.

Shapes: b 128, h_kv 1, h_q 128 and 64, s_q 1 and 2 (causal when 2), varlen s_k 4096 / 8192 / 32768
(``benchmarks/mla_decode.py`` make_inputs: max(N(s_k, s_k/2), s_q), FlashMLA FLOP counting 2 s_q sum(len) h_q
(576 + 512)); schedule = the one the dispatched path plans (``decode._num_sm_parts`` for the rows, 64-row blocks).
Providers: ``default`` (as dispatched), ``ring`` (half_tiles + q_tma: the variant), ``half`` (half tiles only),
``qtma`` (Q by TMA only), ``default_again`` (the default once more: an A/A control whose paired ratio measures the
noise floor). Each timed on the whole forward (allocation, kernel, combine, as in the existing dense decode benches).
With ``--trim`` the providers are (:data:`TRIM_PROVIDERS`) ``default`` = the kernel as decode.py dispatches it today
(half_tiles / q_tma None: Q by TMA, half tiles from s_q 2 at >= 64 rows) with trim off, ``trim`` = the same with
trim on, ``default_again`` (A/A control); optional ``plain`` / ``plain_trim`` (no half tiles, no Q by TMA, trim off /
on). Default JSON there $OUT/mla_decode_trim.json; it also records max |out - default| and the largest relative lse
difference on finite lse (``max_rel_diff_lse``).

Drift-robust timing (an earlier sequential version saw the repeated default differ by -12 % .. -78 % from the first:
clocks / thermals drift during the run and bias whatever runs later): per shape, inputs are built once and every
provider runs once for correctness (NaN-poisoned outputs, max |out - default|, |lse - default| on finite lse); then
R rounds (``--rounds``, default 5), round r times every provider in the order rotated to start at provider
r mod n, each timing a short ``triton.testing.do_bench(fn, warmup=3, rep=15)`` (median). Reported per provider:
median and min over rounds, TFLOPS of both, the time ratio of medians to the default, the per-round paired time
ratios (provider / default in the same round) and their median -- the headline number of the SUMMARY lines
(``t/def``: < 1 faster than the default; robust to an outlier round). Also stored: the geometric mean of the
paired ratios (with R a multiple of the number of providers every cyclic offset occurs equally often, so a
steady geometric drift cancels exactly in it). ``ratio_vs_default`` keeps its old meaning (default ms / provider ms,
now of the medians). JSON (rewritten after every shape) with ``deepkernels.bench.runner.provenance()``.

Usage (GPU): ``PYTHONPATH=src python benchmarks/mla_decode_ring.py [OUT.json] [--trim] [--rounds 5] [--rep-ms 15]
[--sks 4096,8192,32768] [--variants default,ring,half,qtma,default_again] [--only-shapes 128:1:8192,64:2:32768]``
(env SKS, REP_MS, VARIANTS, ROUNDS, ONLY_SHAPES as defaults; --only-shapes entries are h_q:s_q:s_k).
``--self-test`` checks the rotation / paired-ratio statistics on synthetic drifting timings (no GPU needed).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

from deepkernels.bench.paired import rotation, round_stats, time_rotated

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# provider -> (half_tiles, q_tma, trim); None = decode.py's dispatched choice (gluon_dense_launch)
PROVIDERS = {"default": (False, False, False), "ring": (True, True, False), "half": (True, False, False),
             "qtma": (False, True, False), "default_again": (False, False, False)}
DEFAULT_VARIANTS = "default,ring,half,qtma,default_again"
# --trim: the TRIM option off vs on on the dispatched kernel (+ an A/A control; plain kernel optional)
TRIM_PROVIDERS = {"default": (None, None, False), "trim": (None, None, True), "default_again": (None, None, False),
                  "plain": (False, False, False), "plain_trim": (False, False, True)}
DEFAULT_TRIM_VARIANTS = "default,trim,default_again"


def provider_table(trim: bool) -> dict:
    """The provider table of the mode: :data:`TRIM_PROVIDERS` with ``--trim``, else :data:`PROVIDERS`."""
    return TRIM_PROVIDERS if trim else PROVIDERS


def self_test() -> int:
    """Synthetic check: a monotone clock drift (each timing 1 % slower than the last) makes a sequential A/A
    comparison (default first, default again last) look 4 % off; the rotated rounds' paired medians must recover
    the true ratios within ~ one step of drift (cyclic rotation keeps two providers' relative offset in n - 1 of
    the n rounds, so a residual of one step remains under strictly monotone drift)."""
    names = ["default", "ring", "half", "qtma", "default_again"]
    true = {"default": 1.0, "ring": 0.9, "half": 0.95, "qtma": 1.02, "default_again": 1.0}
    assert [rotation(names, r)[0] for r in range(7)] == names + names[:2] and rotation([], 3) == []
    ms = {n: [] for n in names}
    step = 0
    for r in range(5):
        for n in rotation(names, r):
            ms[n].append(true[n] * (1.01 ** step))
            step += 1
    st = round_stats(ms, "default")
    for n in names:
        p = st[n]["paired_time_ratio_median"]
        print(f"self-test {n:14s} true {true[n]:.3f} paired-median {p:.3f} of-medians "
              f"{st[n]['time_ratio_of_medians']:.3f} gmean {st[n]['paired_time_ratio_gmean']:.3f} "
              f"rounds {['%.3f' % x for x in st[n]['paired_time_ratios']]}")
        assert abs(st[n]["paired_time_ratio_gmean"] / true[n] - 1) < 1e-9, n   # R == n: offsets cancel
        assert abs(p / true[n] - 1) < 0.025, (n, p)
    ms_fail = {"default": [1.0, None, 1.0], "ring": [0.9, 0.9, None]}
    st = round_stats(ms_fail, "default")
    assert st["ring"]["paired_time_ratios"] == [0.9, None, None] and st["ring"]["paired_time_ratio_median"] == 0.9
    assert parse_shapes("128:1:8192, 64:2:32768") == {(128, 1, 8192), (64, 2, 32768)}
    tt = provider_table(True)
    assert [n for n in DEFAULT_TRIM_VARIANTS.split(",")] == ["default", "trim", "default_again"]
    assert tt["default"] == tt["default_again"] == (None, None, False) and tt["trim"] == (None, None, True)
    assert all(v[2] is False for v in provider_table(False).values())
    print("self-test OK")
    return 0


def parse_shapes(s: str | None):
    """``"h_q:s_q:s_k,..."`` -> set of (h_q, s_q, s_k) tuples; None / empty -> None (all shapes)."""
    if not s or not s.strip():
        return None
    out = set()
    for tok in s.split(","):
        tok = tok.strip()
        if not tok:
            continue
        parts = tok.split(":")
        if len(parts) != 3:
            raise ValueError(f"--only-shapes entry {tok!r}: expected h_q:s_q:s_k")
        out.add(tuple(int(p) for p in parts))
    return out


def main(args) -> int:
    path = args.out
    if not torch.cuda.is_available():
        print("mla_decode_ring: no CUDA device; nothing timed (use --self-test for the CPU check)", flush=True)
        return 0
    import mla_decode as B                      # make_inputs, FlashMLA counting
    import deepkernels.mla.decode as dec
    from deepkernels.mla import _gluon_dense_decode as G
    from deepkernels.mla.metadata import compute_schedule
    from deepkernels.bench.runner import provenance
    from triton.testing import do_bench

    rounds = max(1, args.rounds)
    rep_ms = args.rep_ms
    sks = [int(x) for x in args.sks.split(",") if x.strip()]
    table = provider_table(args.trim)
    variants = args.variants or (DEFAULT_TRIM_VARIANTS if args.trim else DEFAULT_VARIANTS)
    names = [n for n in variants.split(",") if n in table]
    names = list(dict.fromkeys(names))          # de-duplicate, keep order
    if "default" not in names:
        names.insert(0, "default")
    only = parse_shapes(args.only_shapes)
    prov = provenance()
    prov["gluon_config"] = list(G.GLUON_DEFAULT)
    prov["mode"] = "trim" if args.trim else "ring"
    prov["providers"] = {n: dict(half_tiles=table[n][0], q_tma=table[n][1], trim=table[n][2]) for n in names}
    prov["dispatch"] = dict(DISPATCH_Q_TMA=G.DISPATCH_Q_TMA, DISPATCH_HALF_MIN_SQ=G.DISPATCH_HALF_MIN_SQ,
                            DISPATCH_MIN_ROWS=G.DISPATCH_MIN_ROWS, DISPATCH_TRIM=G.DISPATCH_TRIM)
    prov["timing"] = dict(method="rotated rounds", rounds=rounds, do_bench_warmup_ms=3, do_bench_rep_ms=rep_ms,
                          return_mode="median", order="round r starts at provider r mod n",
                          headline="paired_time_ratio_median (provider ms / default ms in the same round)")
    if only is not None:
        prov["only_shapes"] = sorted(list(s) for s in only)
    rows = []
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(300):                        # clocks up before the first timing
        x @ x
    del x
    for h_q in (128, 64):
        for s_q in (1, 2):
            for s_k in sks:
                if only is not None and (h_q, s_q, s_k) not in only:
                    continue
                causal = s_q > 1
                q, k, bt, sl = B.make_inputs(128, s_q, h_q, 1, s_k)
                tot = int(sl.sum())
                flop = 2 * s_q * tot * h_q * (B.D_QK + B.D_V)
                scale = B.D_QK ** -0.5
                nrows = s_q * h_q
                sched, ns = compute_schedule(sl, dec._num_sm_parts(q.device, nrows, 1))
                rec = dict(b=128, s_q=s_q, h_q=h_q, h_kv=1, s_k=s_k, causal=causal, total_tokens=tot, flop=flop,
                           parts=int(sched.shape[0]), q_tma_supported=G.q_tma_supported(q, 1), rounds=rounds)
                outs, fns = {}, {}
                # 1. correctness: each provider once, NaN-poisoned outputs
                for n in names:
                    ht, qt, tr = table[n]
                    fn = (lambda ht=ht, qt=qt, tr=tr: G.gluon_dense_forward(q, k, bt, sl, sched, ns, scale, causal,
                                                                             half_tiles=ht, q_tma=qt, trim=tr))
                    try:
                        dec._POISON_OUTPUTS = True       # outputs NaN-filled first: every element must be written
                        o, l = fn()
                        torch.cuda.synchronize()
                        dec._POISON_OUTPUTS = False      # (the fills stay out of the timed calls)
                        outs[n] = (o, l)
                        fns[n] = fn
                        rec[n] = dict(nan=bool(torch.isnan(o).any() or torch.isnan(l).any()))
                    except Exception as e:  # noqa: BLE001
                        dec._POISON_OUTPUTS = False
                        rec[n] = dict(failed=f"{type(e).__name__}: {str(e)[:300]}")
                # 2. timing: R rounds, rotated order, short do_bench each
                live = [n for n in names if n in fns]
                errors = {}
                ms_rounds = time_rotated({n: fns[n] for n in live}, rounds,
                                         lambda f: do_bench(f, warmup=3, rep=rep_ms, return_mode="median"), errors)
                for n, msgs in errors.items():
                    rec[n]["timing_errors"] = msgs
                rec["orders"] = [rotation(live, r) for r in range(rounds)]
                for n, st in round_stats(ms_rounds, "default").items():
                    rec[n].update(st)
                    if "time_ratio_of_medians" in st:
                        rec[n]["ratio_vs_default"] = 1.0 / st["time_ratio_of_medians"]
                    rec[n]["tflops"] = flop / st["ms"] / 1e9
                    rec[n]["tflops_best"] = flop / st["ms_min"] / 1e9
                for n in live:
                    if "ms" not in rec[n]:
                        rec[n]["failed"] = "every timing round failed"
                # backward-compatible fields of the old sequential version
                if "ms" in rec.get("default_again", {}) and "ms" in rec.get("default", {}):
                    rec["default"]["ms_again"] = rec["default_again"]["ms"]
                    rec["default"]["tflops_again"] = rec["default_again"]["tflops"]
                if "default" in outs:
                    o_d, l_d = outs["default"]
                    for n in names:
                        if n == "default" or n not in outs:
                            continue
                        o, l = outs[n]
                        rec[n]["max_abs_diff_out"] = float((o.float() - o_d.float()).abs().nan_to_num(
                            float("inf")).max())
                        fin = torch.isfinite(l) & torch.isfinite(l_d)
                        rec[n]["max_abs_diff_lse"] = float((l[fin] - l_d[fin]).abs().max()) if fin.any() else 0.0
                        rec[n]["max_rel_diff_lse"] = (float(((l[fin] - l_d[fin]).abs() / l_d[fin].abs().clamp_min(
                            1e-6)).max()) if fin.any() else 0.0)
                        rec[n]["lse_inf_pattern_equal"] = bool(torch.equal(torch.isinf(l), torch.isinf(l_d)))
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
                    if n == "default":
                        d = v["ms_max"] / v["ms_min"] - 1
                        s += f" (spread {100 * d:4.1f}%)"
                    else:
                        pr = v.get("paired_time_ratio_median", float("nan"))
                        s += (f" t/def {pr:.3f} [{v.get('paired_time_ratio_min', float('nan')):.3f}"
                              f"-{v.get('paired_time_ratio_max', float('nan')):.3f}]"
                              f" d{v.get('max_abs_diff_out', -1):.1e}")
                    parts.append(s + (" NaN" if v.get("nan") else ""))
                print(f"SUMMARY h_q={h_q:3d} s_q={s_q} s_k={s_k:5d} parts {rec['parts']:3d} R{rounds}  "
                      + "  ".join(parts), flush=True)
                del q, k, bt, sl, outs, fns
                torch.cuda.empty_cache()
    dec._POISON_OUTPUTS = False
    if not rows:
        with open(path, "w") as f:
            json.dump(dict(provenance=prov, rows=rows), f, indent=1)
        print("mla_decode_ring: no shape selected", flush=True)
    return 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out", nargs="?", default=None,
                   help="JSON output path (default $OUT/mla_decode_ring.json, with --trim $OUT/mla_decode_trim.json)")
    p.add_argument("--trim", action="store_true",
                   help="TRIM option off vs on (providers default,trim,default_again; plain,plain_trim optional)")
    p.add_argument("--rounds", type=int, default=int(os.environ.get("ROUNDS", "5")),
                   help="timing rounds per shape, order rotated each round (default 5; env ROUNDS)")
    p.add_argument("--rep-ms", type=int, default=int(os.environ.get("REP_MS", "15")),
                   help="do_bench rep (ms) per timing (default 15; env REP_MS)")
    p.add_argument("--sks", default=os.environ.get("SKS", "4096,8192,32768"), help="s_k list (env SKS)")
    p.add_argument("--variants", default=os.environ.get("VARIANTS"),
                   help=f"providers, from {','.join(PROVIDERS)} (default {DEFAULT_VARIANTS}), with --trim from "
                        f"{','.join(TRIM_PROVIDERS)} (default {DEFAULT_TRIM_VARIANTS}) (env VARIANTS; default always "
                        "included)")
    p.add_argument("--only-shapes", default=os.environ.get("ONLY_SHAPES"),
                   help='subset "h_q:s_q:s_k,...", e.g. "128:1:8192,128:1:32768" (env ONLY_SHAPES)')
    p.add_argument("--self-test", action="store_true", help="CPU check of the rotation / paired statistics")
    a = p.parse_args(argv)
    if a.out is None:
        a.out = os.path.join(os.environ.get("OUT", "."), "mla_decode_trim.json" if a.trim else "mla_decode_ring.json")
    return a


if __name__ == "__main__":
    _a = parse_args()
    sys.exit(self_test() if _a.self_test else main(_a))
