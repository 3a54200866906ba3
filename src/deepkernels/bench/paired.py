"""Rotated-round paired timing for A/B benchmarks (the H200's clocks drift 10 %+ within a run, so variants timed
one after the other are biased by their position).

Each round times every variant once, in an order rotated by one per round (:func:`rotation`); a variant's
headline against a reference is the median over rounds of the PAIRED ratio t_variant / t_ref of the same round
(:func:`round_stats`), so drift slower than a round cancels. With R a multiple of the number of variants every
cyclic offset occurs equally often and the geometric mean of the paired ratios cancels a steady drift exactly.
Used by ``benchmarks/mla_decode_ring.py``, ``benchmarks/sparse_decode_rowlanes.py``, ``benchmarks/mla_prefill.py
--rounds`` and the WS3 sparse decode benches. :func:`first_runs` / :func:`bit_identical`: the correctness pass
before the timing (each variant once into NaN-poisoned outputs, bit identity between variants).
"""
from __future__ import annotations

import math
import statistics
from typing import Callable

__all__ = ["rotation", "time_rotated", "round_stats", "record_rounds", "first_runs", "bit_identical",
           "nan_variants", "errors_text", "save_rows"]


def record_rounds(row: dict, times: dict, flop: float, pairs=()) -> None:
    """Write a bench row's timing fields from :func:`time_rotated`'s ``times``: per variant ``<name>_ms_rounds``,
    ``<name>_ms`` (median over rounds) and ``<name>_tflops`` (``flop`` / median); per ``(key, variant, ref)`` of
    ``pairs`` with both timed, ``<key>_paired_ratios`` / ``<key>_paired_median`` (t_variant / t_ref of the same
    round, :func:`round_stats`)."""
    for n, st in round_stats(times, None).items():
        row[n + "_ms_rounds"] = st["ms_rounds"]
        row[n + "_ms"] = st["ms"]
        row[n + "_tflops"] = flop / st["ms"] / 1e9
    for key, v, ref in pairs:
        if v in times and ref in times:
            st = round_stats({ref: times[ref], v: times[v]}, ref).get(v, {})
            if "paired_time_ratios" in st:
                row[key + "_paired_ratios"] = st["paired_time_ratios"]
                row[key + "_paired_median"] = st.get("paired_time_ratio_median")


def first_runs(launches: dict, alloc: Callable, row: dict) -> tuple:
    """Each variant once, before any timing: ``launches`` maps a name to ``launch(out, lse)`` (writes its results into
    the given tensors), ``alloc()`` returns a fresh ``(out, lse)`` pair. The pair is filled with NaN, the variant
    runs, the device synchronises. Returns ``(fns, outs)``: ``fns[name]`` a zero-argument callable that repeats the
    launch into its own pair (for timing), ``outs[name]`` clones of its first results; ``row[name + "_nan"]`` says
    whether any NaN is left in them. A variant that raises is left out of both, its message in
    ``row[name + "_error"]``."""
    import torch
    fns, outs = {}, {}
    for name, launch in launches.items():
        out, lse = alloc()
        fn = (lambda o=out, l_=lse, f=launch: f(o, l_))
        try:
            out.fill_(float("nan"))
            lse.fill_(float("nan"))
            fn()
            if out.is_cuda:
                torch.cuda.synchronize()
            outs[name] = (out.clone(), lse.clone())
            row[name + "_nan"] = bool(torch.isnan(out).any() or torch.isnan(lse).any())
            fns[name] = fn
        except Exception as e:  # noqa: BLE001
            row[name + "_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    return fns, outs


def nan_variants(row: dict) -> list:
    """The ``<name>_nan`` fields of a bench row (:func:`first_runs`) that are true: variants that left NaN."""
    return [k for k, v in row.items() if k.endswith("_nan") and v]


def errors_text(row: dict) -> str:
    """The ``<name>_error`` fields of a bench row (:func:`first_runs`) as ``"  name_error: message"`` pieces."""
    return "".join("  %s: %s" % (k, v) for k, v in row.items() if k.endswith("_error"))


def save_rows(path: str, rows: list, **meta) -> None:
    """Write a bench's rows as JSON with :func:`deepkernels.bench.runner.provenance` and ``meta`` (e.g. rounds)."""
    import json
    from .runner import provenance
    with open(path, "w") as f:
        json.dump(dict(provenance=provenance(), **meta, rows=rows), f, indent=1)


def bit_identical(a: tuple, b: tuple) -> bool:
    """Whether two ``(out, lse)`` results are equal bit for bit (NaN / inf in lse compared by position: +inf rows of
    empty work must match too)."""
    import torch
    (o1, l1), (o2, l2) = a, b
    return bool(torch.equal(o1, o2) and torch.equal(l1.nan_to_num(), l2.nan_to_num()))


def rotation(names: list, r: int) -> list:
    """Round r's timing order: ``names`` rotated to start at index r mod n."""
    if not names:
        return []
    k = r % len(names)
    return names[k:] + names[:k]


def time_rotated(fns: dict, rounds: int, timer: Callable[[Callable], float],
                 errors: dict | None = None) -> dict:
    """``{name: [ms per round]}``: ``rounds`` rounds, each calling ``timer(fn)`` (milliseconds) for every entry of
    ``fns`` in :func:`rotation` order. A timing that raises records None (and, when ``errors`` is given, a message
    under ``errors[name]``)."""
    names = list(fns)
    ms = {n: [] for n in names}
    for r in range(rounds):
        for n in rotation(names, r):
            try:
                ms[n].append(timer(fns[n]))
            except Exception as e:  # noqa: BLE001
                if errors is None:
                    raise
                ms[n].append(None)
                errors.setdefault(n, []).append(f"round {r}: {type(e).__name__}: {str(e)[:200]}")
    return ms


def round_stats(ms_rounds: dict, ref) -> dict:
    """Per variant: ms median / min / max over rounds and, against variant ``ref``, the time ratio of medians, the
    paired per-round time ratios (variant / ref in the same round; None where either failed) and their median, min,
    max and geometric mean (< 1: faster than ``ref``). Variants with no successful round are left out."""
    out = {}
    ref_ms = ms_rounds.get(ref, [])
    ref_ok = [t for t in ref_ms if t is not None]
    ref_med = statistics.median(ref_ok) if ref_ok else None
    for n, ts in ms_rounds.items():
        ok = [t for t in ts if t is not None]
        if not ok:
            continue
        d = dict(ms_rounds=ts, ms=statistics.median(ok), ms_min=min(ok), ms_max=max(ok))
        if ref_med is not None:
            d["time_ratio_of_medians"] = d["ms"] / ref_med
            paired = [(t / t0 if t is not None and t0 is not None else None) for t, t0 in zip(ts, ref_ms)]
            d["paired_time_ratios"] = paired
            pok = [p for p in paired if p is not None]
            if pok:
                d["paired_time_ratio_median"] = statistics.median(pok)
                d["paired_time_ratio_min"] = min(pok)
                d["paired_time_ratio_max"] = max(pok)
                d["paired_time_ratio_gmean"] = math.exp(statistics.fmean(math.log(x) for x in pok))
        out[n] = d
    return out
