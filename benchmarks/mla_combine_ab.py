"""Paired A/B of the MLA decode split-KV combine: the current kernel vs the fast one (same results bit for bit) vs the
fast one launched with programmatic dependent launch (PDL). Session 21, benchmarks/notes/mla_combine.md.

Inputs are the bench cases' own (``deepkernels.bench.cases_mla`` builders: dense b 128 h_q 16/64/128 s_q 1/2 s_k ~4K
and ~32K; sparse V3.2 / V4.1 b 64/128 s_q 1/2 h_q 128 topk 2048). For each case:

(a) ``combine``: the combine alone on the real partials of one public call (``combine_splits_``'s arguments recorded
    from ``flash_mla_with_kvcache``, cloned), ``--n-launch`` launches back to back in one CUDA graph (partials hot in
    L2, as after the decode kernel; with PDL each launch waits on the previous one), timed with CUDA events over
    ``--reps`` replays -> us per launch. Variants: ``cur`` and ``cur_b`` (the current kernel twice: the A/A
    control), ``fast`` (FastCombineConfig default), ``fast_pdl``, and the other fast configs of ``FAST_CONFIGS``.
(b) ``call``: the whole public call (main kernel + combine), one call per CUDA graph, ``triton.testing.do_bench`` of
    its replay (median, L2 flushed), variants ``cur``, ``cur_b``, ``fast``, ``fast_pdl`` (module switch
    ``set_fast_combine`` while capturing).

Rounds are rotated (variant order shifted each round); ratios are per round, paired against ``cur`` of the same
round, summarised by their median. Every variant's out / lse is compared bit for bit with ``cur``'s (NaN-aware):
``identical`` in the JSON. Split statistics of each case (how many requests have 1, 2, 3, >3 splits) are recorded.

Usage (device): python benchmarks/mla_combine_ab.py --out res.json [--rounds 5] [--budget-s 90] [--match v32]
                python benchmarks/mla_combine_ab.py --list        (CPU: prints the cases and variants)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import deepkernels.mla.combine as comb  # noqa: E402
from deepkernels.mla.combine import FastCombineConfig  # noqa: E402

# (kind, args): dense (b, s_q, h_q, mean_s_k), sparse (fmt, b, s_q, h_q, topk); interleaved so that a budget cut
# still leaves both paths covered
CASES = [
    ("dense", (128, 1, 128, 4096)), ("sparse", ("v32", 64, 1, 128, 2048)), ("dense", (128, 1, 16, 4096)),
    ("sparse", ("v41", 128, 1, 128, 2048)), ("dense", (128, 2, 64, 4096)), ("sparse", ("v32", 128, 2, 128, 2048)),
    ("dense", (128, 2, 128, 4096)), ("sparse", ("v41", 64, 1, 128, 2048)), ("dense", (128, 1, 64, 4096)),
    ("sparse", ("v32", 128, 1, 128, 2048)), ("dense", (128, 2, 16, 4096)), ("sparse", ("v41", 128, 2, 128, 2048)),
    ("dense", (128, 1, 128, 32768)), ("dense", (128, 2, 128, 32768)), ("dense", (128, 1, 16, 32768)),
    ("dense", (128, 2, 64, 32768)), ("dense", (128, 1, 64, 32768)), ("dense", (128, 2, 16, 32768)),
]
# combine-alone variants: name -> None (current kernel) or (FastCombineConfig, pdl)
FAST_CONFIGS = {
    "cur": None, "cur_b": None,
    "fast": (FastCombineConfig(), False),
    "fast_pdl": (FastCombineConfig(), True),
    "fast_ch1": (FastCombineConfig(8, 4, 1), False),
    "fast_h16w8": (FastCombineConfig(16, 8, 2), False),
    "fast_r4": (FastCombineConfig(8, 4, 2, 4), False),
}
# more configs for --variants (each costs one compile per flag set: 4 sets in the default cases)
EXTRA_CONFIGS = {
    "fast_ch4w8": (FastCombineConfig(8, 8, 4), False),
    "fast_r2": (FastCombineConfig(8, 4, 2, 2), False),
    "fast_ch3": (FastCombineConfig(8, 4, 3), False),
    "fast_r4_pdl": (FastCombineConfig(8, 4, 2, 4), True),
}
CALL_VARIANTS = ("cur", "cur_b", "fast", "fast_pdl")


def _case(kind, args):
    from deepkernels.bench import cases_mla as cm
    if kind == "dense":   # small=True only drops the plain-PyTorch anchor (same shapes, no 10 GB padded K copy)
        return cm._dense_decode_case(*args, "cuda", True)
    fmt, b, s_q, h_q, topk = args
    return cm._sparse_decode_case(fmt, b, s_q, h_q, topk, 1024, "cuda", False)


def _case_name(kind, args):
    if kind == "dense":
        b, s_q, h_q, sk = args
        return f"dense decode b={b} s_q={s_q} h_q={h_q} s_k~{sk}"
    fmt, b, s_q, h_q, topk = args
    return f"sparse decode {fmt} b={b} s_q={s_q} h_q={h_q} topk={topk}"


class _Recorder:
    """Patches ``combine_splits_`` in every loaded deepkernels.mla module and records (clones) the last call."""

    def __init__(self):
        self.calls = []
        self._saved = []

    def __enter__(self):
        orig = comb.combine_splits_

        def rec(*a, **k):
            self.calls.append(([x.clone() if isinstance(x, torch.Tensor) else x for x in a],
                               {n: (v.clone() if isinstance(v, torch.Tensor) else v) for n, v in k.items()}))
            return orig(*a, **k)

        for name, mod in list(sys.modules.items()):
            if name.startswith("deepkernels.mla") and getattr(mod, "combine_splits_", None) is orig:
                self._saved.append((mod, orig))
                mod.combine_splits_ = rec
        return self

    def __exit__(self, *exc):
        for mod, orig in self._saved:
            mod.combine_splits_ = orig
        return False


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, NaN-aware (any NaN matches any NaN)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    na, nb = torch.isnan(a), torch.isnan(b)
    if not torch.equal(na, nb):
        return False
    iv = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(a.masked_fill(na, 0).view(iv), b.masked_fill(nb, 0).view(iv))


def _split_stats(ns: torch.Tensor) -> dict:
    n = (ns[1:] - ns[:-1]).cpu()
    return {"requests": int(n.numel()), "n1": int((n == 1).sum()), "n2": int((n == 2).sum()),
            "n3": int((n == 3).sum()), "n_gt3": int((n > 3).sum()), "n0": int((n <= 0).sum()),
            "max": int(n.max()), "rows": int(ns[-1])}


def _combine_launch(args, kw, variant):
    spec = FAST_CONFIGS[variant]
    out, lse = args[0], args[1]
    if spec is None:
        comb.combine_splits_(*args, **kw, fast=False)
    else:
        comb.combine_splits_(*args, **kw, fast=True, pdl=spec[1], fast_config=spec[0])
    return out, lse


def _graph(fn, n: int):
    from deepkernels.bench.runner import capture_graph
    fn()
    torch.cuda.synchronize()
    return capture_graph(fn, n)


def _time_graph(g, reps: int) -> float:
    """ms per replay (CUDA events around ``reps`` replays, one warm-up replay)."""
    g.replay()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(reps):
        g.replay()
    e1.record()
    e1.synchronize()
    return e0.elapsed_time(e1) / reps


def _rounds(timers: dict, rounds: int) -> dict:
    names = list(timers)
    us = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            us[k].append(timers[k]())
    ratio = {k: statistics.median(u / c for u, c in zip(us[k], us["cur"])) for k in names}
    return {"us": us, "median_us": {k: statistics.median(v) for k, v in us.items()}, "ratio_vs_cur": ratio}


def run_case(kind, args, a) -> dict:
    import importlib

    import triton
    for m in ("deepkernels.mla.decode", "deepkernels.mla.sparse_decode"):   # loaded before the recorder patches
        importlib.import_module(m)
    case = _case(kind, args)
    t = case.setup()
    row = {"name": case.name, "kind": kind}
    prev = comb.set_fast_combine(False)
    try:
        case.ours(t)
        torch.cuda.synchronize()
        with _Recorder() as rec:
            case.ours(t)
            torch.cuda.synchronize()
        cargs, ckw = rec.calls[-1]
        row["splits"] = _split_stats(cargs[4])
        # (a) the combine alone, variants on their own out/lse buffers
        graphs, ref, ident = {}, None, {}
        for v in FAST_CONFIGS:
            va = list(cargs)
            va[0], va[1] = torch.full_like(cargs[0], float("nan")), torch.full_like(cargs[1], float("nan"))
            g, _ = _graph(lambda va=va, v=v: _combine_launch(va, ckw, v), a.n_launch)
            g.replay()
            torch.cuda.synchronize()
            if ref is None:
                ref = (va[0].clone(), va[1].clone())
            ident[v] = _same(va[0], ref[0]) and _same(va[1], ref[1])
            graphs[v] = g
        n = a.n_launch
        row["combine"] = _rounds({v: (lambda g=g: _time_graph(g, a.reps) * 1e3 / n) for v, g in graphs.items()},
                                 a.rounds)
        row["combine"]["identical"] = ident
        del graphs
        # (b) the whole public call
        cgraphs, cref, cident, keep = {}, None, {}, []
        for v in CALL_VARIANTS:
            spec = FAST_CONFIGS[v]
            if spec is None:
                comb.set_fast_combine(False)
            else:
                comb.set_fast_combine(True, pdl=spec[1], config=spec[0])
            g, res = _graph(lambda: case.ours(t), 1)
            comb.set_fast_combine(False)
            g.replay()
            torch.cuda.synchronize()
            if cref is None:
                cref = (res[0].clone(), res[1].clone())
            cident[v] = _same(res[0], cref[0]) and _same(res[1], cref[1])
            cgraphs[v] = g
            keep.append(res)
        row["call"] = _rounds({v: (lambda g=g: triton.testing.do_bench(g.replay, warmup=5, rep=a.rep_ms,
                                                                       return_mode="median") * 1e3)
                               for v, g in cgraphs.items()}, a.rounds)
        row["call"]["identical"] = cident
        del cgraphs, keep
    finally:
        comb.set_fast_combine(*prev)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--n-launch", type=int, default=20, help="combine launches per CUDA graph (a)")
    ap.add_argument("--reps", type=int, default=20, help="graph replays per timing (a)")
    ap.add_argument("--rep-ms", type=int, default=40, help="do_bench rep (ms) per timing (b)")
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no new case after this many seconds")
    ap.add_argument("--match", default="")
    ap.add_argument("--no-pdl", action="store_true", help="drop the fast_pdl variants (PDL tests failed)")
    ap.add_argument("--variants", default="", help="combine variants besides cur/cur_b (comma list of FAST_CONFIGS / "
                                                   "EXTRA_CONFIGS names; default: FAST_CONFIGS)")
    ap.add_argument("--list", action="store_true", help="print the cases and variants and exit (no GPU needed)")
    a = ap.parse_args()
    global CALL_VARIANTS
    if a.variants:
        pool = {**FAST_CONFIGS, **EXTRA_CONFIGS}
        want = ["cur", "cur_b"] + [v for v in a.variants.split(",") if v not in ("cur", "cur_b")]
        bad = [v for v in want if v not in pool]
        if bad:
            ap.error(f"unknown variants {bad}; known: {sorted(pool)}")
        FAST_CONFIGS.clear()
        FAST_CONFIGS.update({v: pool[v] for v in want})
        CALL_VARIANTS = tuple(v for v in CALL_VARIANTS if v in FAST_CONFIGS)
    if a.no_pdl:
        for k in [k for k, v in FAST_CONFIGS.items() if v is not None and v[1]]:
            del FAST_CONFIGS[k]
        CALL_VARIANTS = tuple(v for v in CALL_VARIANTS if v in FAST_CONFIGS)
    cases = [(k, c) for k, c in CASES if a.match in _case_name(k, c)]
    if a.list:
        for k, c in cases:
            print(_case_name(k, c))
        print("combine variants:", ", ".join(f"{k}={v}" for k, v in FAST_CONFIGS.items()))
        print("call variants:", ", ".join(CALL_VARIANTS))
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time (use --list on the CPU)")
        return 0
    import triton
    from deepkernels.bench.runner import provenance
    prov = provenance()
    prov["git_sha_env"] = os.environ.get("GIT_SHA", "unknown")
    res = {"provenance": prov, "combine_variants": {k: (None if v is None else [vars(v[0]), v[1]])
                                                    for k, v in FAST_CONFIGS.items()},
           "call_variants": list(CALL_VARIANTS), "args": vars(a), "triton": triton.__version__, "rows": [],
           "skipped": []}
    t0 = time.time()
    for k, c in cases:
        if time.time() - t0 > a.budget_s:
            res["skipped"].append(_case_name(k, c))
            continue
        try:
            row = run_case(k, c, a)
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001 - reported, the other cases still run
            row = {"name": _case_name(k, c), "error": f"{type(e).__name__}: {e}"}
            print(f"{row['name']}: ERROR {row['error']}", flush=True)
        res["rows"].append(row)
        if "error" not in row:
            cm, cl = row["combine"], row["call"]
            print(f"{row['name'][:50]:50s} splits {row['splits']} ({time.time() - t0:.0f} s)", flush=True)
            print("   combine us " + " ".join(f"{v} {cm['median_us'][v]:.2f}({cm['ratio_vs_cur'][v]:.3f})"
                                              f"{'' if cm['identical'][v] else ' DIFF'}" for v in FAST_CONFIGS),
                  flush=True)
            print("   call    us " + " ".join(f"{v} {cl['median_us'][v]:.1f}({cl['ratio_vs_cur'][v]:.4f})"
                                              f"{'' if cl['identical'][v] else ' DIFF'}" for v in CALL_VARIANTS),
                  flush=True)
        if a.out:
            with open(a.out, "w") as f:
                json.dump(res, f, indent=1)
    ok = [r for r in res["rows"] if "error" not in r]
    for part, names in (("combine", list(FAST_CONFIGS)), ("call", list(CALL_VARIANTS))):
        for v in names:
            rs = [r[part]["ratio_vs_cur"][v] for r in ok]
            if rs:
                print(f"SUMMARY {part} {v}: ratio vs cur median {statistics.median(rs):.3f} "
                      f"[{min(rs):.3f}, {max(rs):.3f}] over {len(rs)} cases; identical "
                      f"{sum(r[part]['identical'][v] for r in ok)}/{len(ok)}", flush=True)
    if res["skipped"]:
        print(f"SUMMARY skipped (budget): {len(res['skipped'])} cases", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
