"""CPU checks of benchmarks/gemm_small.py's session-20 additions (no GPU): the kernel-only attribution of a profiler
trace to calls (split_calls), and the --public variants' plan handling (public_impls: the dispatch plan vs the
DEEPKERNELS_DISABLE_GLUON=gemm_small plan under one call signature, the env restored)."""
import importlib.util
import os

import pytest
import torch

from deepkernels.gemm import _gluon_fp8_small as S
from deepkernels.gemm import dense

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gemm_small.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("gemm_small_bench", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _ev(ts, dur, name, cat="kernel"):
    return {"ph": "X", "cat": cat, "ts": ts, "dur": dur, "name": name}


def test_split_calls_sums_each_calls_kernels(bench):
    F = "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<signed char>>"
    evs = [{"ph": "M", "name": "process_name"}, _ev(0.5, 1.0, "cudaLaunchKernel", "cuda_runtime")]
    order, t = [], 10.0
    for i, (nm, ks) in enumerate([("a", [("_fp8_small_kernel", 5.0), ("_gemm_splitk_reduce_kernel", 1.5)]),
                                  ("b", [("_fp8_gemm_nt_kernel", 7.0)]), ("b", [("_fp8_gemm_nt_kernel", 9.0)]),
                                  ("a", [("_fp8_small_kernel", 4.0), ("_gemm_splitk_reduce_kernel", 1.0)])]):
        evs.append(_ev(t, 60.0, F))
        t += 61
        for k, d in ks:
            evs.append(_ev(t, d, k))
            t += d + 1
        order.append(nm)
    got = bench.split_calls(list(reversed(evs)), order, ["a", "b"])      # any event order: sorted by start
    assert got["a"]["us"] == [6.5, 5.0] and got["b"]["us"] == [7.0, 9.0]
    assert got["a"]["kernels"] == ["_fp8_small_kernel", "_gemm_splitk_reduce_kernel"]
    # a memset flush works the same way
    mevs = [dict(e, cat="gpu_memset", name="Memset (Device)") if e.get("name") == F else e for e in evs]
    assert bench.split_calls(mevs, order, ["a", "b"])["b"]["us"] == [7.0, 9.0]
    # one call too few / an empty segment / no kernels: an error, never a guess
    assert "error" in bench.split_calls(evs, order + ["a"], ["a", "b"])
    assert "error" in bench.split_calls(evs + [_ev(t + 5, 60.0, F)], order + ["b"], ["a", "b"])
    assert "error" in bench.split_calls([evs[0]], [], ["a"])


def test_public_impls_swap_the_two_plans(bench, monkeypatch):
    """CPU tensors routed to the kernel path with launches recorded: 'public' runs the small-M plan, 'triton' /
    'triton_aa' the Triton plan of the same signature; the env is restored; each call leaves its own plan cached."""
    from deepkernels import _launch
    log = []
    real_rule = dense._use_small

    class _D:
        def __init__(self, d):
            self.dtype, self.is_cuda = d.dtype, True
    monkeypatch.setattr(dense, "use_kernels", lambda *t: True)
    monkeypatch.setattr(dense, "interpret_mode", lambda: False)
    monkeypatch.setattr(dense, "_use_small", lambda m, n, k, d, c, p: real_rule(m, n, k, _D(d), c, p))
    monkeypatch.setattr(S, "_check_small", lambda *a: None)
    monkeypatch.setattr(_launch.KernelLauncher, "__call__", lambda self, grid, *args: log.append(self.fn))
    monkeypatch.setattr(dense, "_splitk_finish", lambda *a: log.append("reduce"))
    monkeypatch.setenv("DEEPKERNELS_DISABLE_GLUON", "dense_decode")
    m, n, k = 100, 2112, 7168
    kb = k // 128
    A = (torch.zeros(m, k, dtype=torch.float8_e4m3fn), torch.ones(m, kb))
    B = (torch.zeros(n, k, dtype=torch.float8_e4m3fn), torch.ones(-(-n // 128), kb))
    try:
        fns, outs, kinds = bench.public_impls(m, n, k, A, B, device="cpu")
        assert kinds == {"triton": "_Plan", "triton_aa": "_Plan", "public": "_SmallPlan"}
        assert os.environ["DEEPKERNELS_DISABLE_GLUON"] == "dense_decode"
        assert not dense._FP8_PLANS
        log.clear()
        fns["public"]()
        assert log == [S._fp8_small_kernel, "reduce"] and len(dense._FP8_PLANS) == 1
        assert type(next(iter(dense._FP8_PLANS.values()))) is dense._SmallPlan
        log.clear()
        fns["triton"]()
        fns["triton_aa"]()
        assert S._fp8_small_kernel not in log and log.count("reduce") == 2 and len(dense._FP8_PLANS) == 1
        assert type(next(iter(dense._FP8_PLANS.values()))) is dense._Plan
        # a non-dispatched shape: all three run the Triton plan
        A2 = (torch.zeros(m, 4096, dtype=torch.float8_e4m3fn), torch.ones(m, 32))
        B2 = (torch.zeros(1024, 4096, dtype=torch.float8_e4m3fn), torch.ones(8, 32))
        assert set(bench.public_impls(m, 1024, 4096, A2, B2, device="cpu")[2].values()) == {"_Plan"}
    finally:
        dense._FP8_PLANS.clear()


def test_cli_dry_runs(bench, capsys):
    assert bench.main(["--dry-run", "--public"]) == 0
    out = capsys.readouterr().out
    assert out.count("public small_") == len(S.SMALL_FP8_TABLE) and out.count("(Triton table)") == 12 - 5
    assert bench.main(["--dry-run", "--ms", "64"]) == 0


def test_check_then_graph_and_dequant_ref(bench, monkeypatch):
    """The shared check of the bench's three loops (public, variants, sweep): NaN-poisoned outputs, calc_diff gate,
    bit identity against the named base (skipping the listed ones), a graph only for what passed, errors recorded.
    ``dequant_ref`` is benchmarks/gemm.py's."""
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
    m, n, k = 4, 130, 256
    A = per_token_cast_to_fp8(torch.randn(m, k).bfloat16(), use_ue8m0=False)
    B = per_block_cast_to_fp8(torch.randn(n, k).bfloat16(), use_ue8m0=False)
    ref = bench.dequant_ref(A, B, k)
    good = ref.bfloat16()
    outs = {nm: torch.empty(m, n, dtype=torch.bfloat16) for nm in ("base", "same", "other", "bad", "boom")}
    fns = {"base": lambda: outs["base"].copy_(good), "same": lambda: outs["same"].copy_(good),
           "other": lambda: outs["other"].copy_((ref * (1 + 2 ** -7)).bfloat16()),
           "bad": lambda: None, "boom": lambda: 1 / 0, "aa": lambda: outs["aa"].copy_(good)}
    outs["aa"] = torch.empty(m, n, dtype=torch.bfloat16)
    row = {"impls": {"base": {"plan": "p"}}}
    ok, graphs = bench.check_then_graph(fns, outs, ref, row, graph=lambda fn: ("graph", fn), ident_to="base",
                                        skip_ident=("aa",))
    assert ok == ["base", "same", "other", "aa"] and set(graphs) == set(ok)
    e = row["impls"]
    assert e["base"]["plan"] == "p" and "bit_identical_to_base" not in e["base"]
    assert e["same"]["bit_identical_to_base"] is True and e["other"]["bit_identical_to_base"] is False
    assert "bit_identical_to_base" not in e["aa"]
    assert e["bad"]["nan"] and e["bad"]["error"] == "failed its check: not timed"
    assert e["boom"]["error"].startswith("ZeroDivisionError")
