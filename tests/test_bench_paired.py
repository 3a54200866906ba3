"""deepkernels.bench.paired: the rotated-round paired timing the A/B benchmarks use (CPU, synthetic timings)."""
from __future__ import annotations

import pytest

from deepkernels.bench.paired import rotation, round_stats, time_rotated


def test_rotation():
    names = ["a", "b", "c"]
    assert [rotation(names, r) for r in range(4)] == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"],
                                                      ["a", "b", "c"]]
    assert rotation([], 3) == []


def test_paired_ratios_cancel_drift():
    """A clock that slows 1 % per timing: the geometric mean of the paired ratios recovers the true ratios exactly
    when the round count is a multiple of the variant count, the median within one drift step; the plain ratio of
    medians does not."""
    true = {"ref": 1.0, "fast": 0.9, "slow": 1.05, "ref_again": 1.0}
    step = [0]

    def timer(name):
        step[0] += 1
        return true[name] * 1.01 ** step[0]

    ms = time_rotated({n: n for n in true}, 8, timer)
    assert all(len(v) == 8 for v in ms.values())
    st = round_stats(ms, "ref")
    for n, t in true.items():
        assert st[n]["paired_time_ratio_gmean"] == pytest.approx(t, rel=1e-9)
        assert abs(st[n]["paired_time_ratio_median"] / t - 1) < 0.025


def test_failed_timings():
    errors = {}

    def timer(fn):
        return fn()

    def boom():
        raise RuntimeError("x")
    ms = time_rotated({"ref": lambda: 1.0, "bad": boom}, 2, timer, errors)
    assert ms["bad"] == [None, None] and len(errors["bad"]) == 2
    st = round_stats(ms, "ref")
    assert "bad" not in st and st["ref"]["paired_time_ratio_median"] == 1.0
    st = round_stats({"ref": [1.0, None, 1.0], "v": [0.9, 0.9, None]}, "ref")
    assert st["v"]["paired_time_ratios"] == [0.9, None, None] and st["v"]["paired_time_ratio_median"] == 0.9
    with pytest.raises(RuntimeError):
        time_rotated({"bad": boom}, 1, timer)


def test_first_runs_and_bit_identity():
    """first_runs poisons, runs, records NaN / errors and returns repeatable callables; bit_identical compares the
    pairs exactly (a one-ulp change is a difference; an inf lse at the same place is not)."""
    import torch
    from deepkernels.bench.paired import bit_identical, first_runs
    x = torch.randn(4, 8)

    def good(out, lse):
        out.copy_(x)
        lse.copy_(x[:, 0])
        lse[1] = float("inf")

    def half(out, lse):
        out[:2].copy_(x[:2])                  # leaves NaN in rows 2, 3
        lse.zero_()

    def bad(out, lse):
        raise ValueError("unsupported shape")
    row, calls = {}, []

    def counted(out, lse):
        calls.append(1)
        good(out, lse)
    fns, outs = first_runs(dict(a=good, b=half, c=bad, d=counted), lambda: (torch.empty(4, 8), torch.empty(4)), row)
    assert set(fns) == set(outs) == {"a", "b", "d"} and "ValueError: unsupported shape" == row["c_error"]
    assert row["a_nan"] is False and row["b_nan"] is True and row["d_nan"] is False
    fns["d"]()
    assert len(calls) == 2
    assert bit_identical(outs["a"], outs["d"]) and not bit_identical(outs["a"], outs["b"])
    o, l_ = outs["a"]
    o2 = o.clone()
    o2[0, 0] = torch.nextafter(o2[0, 0], torch.tensor(float("inf")))
    assert not bit_identical((o, l_), (o2, l_))


def test_record_rounds_fields():
    """record_rounds: medians, TFLOPS from the median, and the paired ratios of the named pairs only (same round)."""
    from deepkernels.bench.paired import record_rounds
    times = {"a": [2.0, 4.0, 3.0], "b": [1.0, 2.2, 1.5], "c": [None, None, None]}
    row = {}
    record_rounds(row, times, 3e9, [("b_vs_a", "b", "a"), ("c_vs_a", "c", "a"), ("x", "missing", "a")])
    assert row["a_ms"] == 3.0 and row["b_ms"] == 1.5 and row["a_ms_rounds"] == [2.0, 4.0, 3.0]
    assert abs(row["a_tflops"] - 1.0) < 1e-12 and abs(row["b_tflops"] - 2.0) < 1e-12
    assert row["b_vs_a_paired_ratios"] == [0.5, 0.55, 0.5] and row["b_vs_a_paired_median"] == 0.5
    assert "c_ms" not in row and "c_vs_a_paired_median" not in row and "x_paired_ratios" not in row
