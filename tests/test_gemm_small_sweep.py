"""Small-M rule sweep (session 20, second round): ``benchmarks/gemm_small_sweep.py`` and the opt-in rule
``_gluon_fp8_small.rule_config`` behind ``DEEPKERNELS_GEMM_SMALL_RULE`` / ``SMALL_RULE`` (OFF by default).

- CPU: argument parsing, the shape list (no table row, N / K multiples of 16, extra M only at EXTRA_NK, --max-shapes),
  the variants (deduplicated against the rule), the per-bucket fit of synthetic rows, the dry run; the rule: flag
  off -> ``dense._use_small`` unchanged (table rows only), flag on (env or module flag) -> the rule's config outside
  the table (table rows keep the table; DEEPKERNELS_DISABLE_GLUON still wins), the rule keeps the Triton K split.
- GPU: the public op with the flag on at one shape per build family the rule produces (128x64 k1 sa1, 128x64 split
  reduce, 128x128 split reduce, 64x64 k1), NaN-poisoned D, vs float64 (calc_diff < 1e-3) and vs the
  DEEPKERNELS_DISABLE_GLUON=gemm_small path (< 1e-6); ``bitident``: equal bit for bit (not gating). Run with xdist
  before the sweep, they also compile the rule's builds into the Triton cache.
"""
import importlib.util
import os

import pytest
import torch

from deepkernels.gemm import _gluon_fp8_small as S
from test_gemm_gluon_small import _inputs, _ref64     # GPU inputs and the float64 reference: one copy
from deepkernels.gemm import dense
from deepkernels.gemm._configs import FP8_TABLE, select_fp8_config

_PATH = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gemm_small_sweep.py")
needs_gluon = pytest.mark.skipif(not S.available(), reason=f"gluon not importable: {S._IMPORT_ERROR!r}")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
ENV = "DEEPKERNELS_GEMM_SMALL_RULE"


@pytest.fixture(scope="module")
def sweep():
    spec = importlib.util.spec_from_file_location("gemm_small_sweep", _PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _D:
    def __init__(self, dtype=torch.bfloat16, cuda=True):
        self.dtype, self.is_cuda = dtype, cuda


@pytest.fixture
def rule_env(monkeypatch):
    monkeypatch.setattr(dense, "interpret_mode", lambda: False)
    monkeypatch.setattr(dense, "get_num_sms", lambda: 132)
    monkeypatch.setattr(S, "available", lambda: True)
    monkeypatch.setattr(S, "SMALL_RULE", False)
    monkeypatch.delenv("DEEPKERNELS_DISABLE_GLUON", raising=False)
    monkeypatch.delenv(ENV, raising=False)
    return monkeypatch


# ------------------------------------------------------------------------------------------------ bench script

def test_parse_args_defaults_and_lists(sweep):
    a = sweep.parse_args([])
    assert (a.rounds, a.rep_ms, a.ms, a.extra_ms, a.max_shapes, a.dry_run) == (3, 4, [16, 64, 128], [1, 96], 0, False)
    a = sweep.parse_args(["--ms", "64", "--extra-ms", "", "--budget-s", "5", "--max-shapes", "3", "--out", "/x.json"])
    assert (a.ms, a.extra_ms, a.budget_s, a.max_shapes, a.out) == ([64], [], 5.0, 3, "/x.json")
    with pytest.raises(SystemExit):
        sweep.parse_args(["--ms", "256"])


def test_shape_list(sweep):
    shapes = sweep.shape_list([16, 64, 128], [1, 96])
    assert 25 <= len(sweep.NK) <= 35 and len({(n, k) for n, k, _ in sweep.NK}) == len(sweep.NK)
    assert len(shapes) == 3 * len(sweep.NK) + 2 * len(sweep.EXTRA_NK)
    assert sweep.EXTRA_NK <= {(n, k) for n, k, _ in sweep.NK}
    for m, n, k, _ in shapes:
        assert n % 16 == 0 and k % 16 == 0 and 1 <= m <= 128
        assert (64 if m <= 64 else 128, n, k) not in S.SMALL_FP8_TABLE and (64 if m <= 64 else 128, n, k) not in FP8_TABLE
        if m in (1, 96):
            assert (n, k) in sweep.EXTRA_NK
    # per (N, K): M descending, pairs in NK order
    assert [s[:3] for s in shapes[:5]] == [(128, 1536, 7168), (96, 1536, 7168), (64, 1536, 7168), (16, 1536, 7168),
                                           (1, 1536, 7168)]
    assert sweep.shape_list([16, 64, 128], [1, 96], max_shapes=4) == shapes[:4]


def test_variants_dedup_against_the_rule(sweep):
    for m, n, k, _ in sweep.shape_list([16, 64, 128], [1, 96]):
        vs = sweep.small_variants(m, n, k, 132)
        rule = S.rule_config(m, n, k, 132)
        cfgs = list(vs.values()) + ([rule] if rule else [])
        assert len(cfgs) == len(set(cfgs)), (m, n, k)
        assert all(c.block_m == (64 if m <= 64 else 128) and c.block_n in (64, 128) for c in cfgs)
        assert "auto" in vs or S.pick_config(m, n, k, 132) in cfgs
        # the rule is the twin (or its BLOCK_N-64 sibling at M <= 64)
        if rule:
            twin = sweep.twin_config(m, n, k, 132)
            assert (rule.split, rule.mode) == (twin.split, twin.mode)


def test_fit_buckets(sweep):
    def row(shape, best, rule, aa, split=1, mc=64, wave=True, kb=16):
        f = dict(m_class=mc, triton_split=split, one_wave64=wave, num_kb=kb, triton_config="x")
        ims = {"triton": {"graph_paired_vs_triton": 1.0}, "triton_aa": {"graph_paired_vs_triton": aa},
               "twin": {"graph_paired_vs_triton": best}}
        if rule is not None:
            ims["rule"] = {"graph_paired_vs_triton": rule}
        return {"shape": list(shape), "features": f, "bucket": sweep.bucket(f), "impls": ims}
    rows = [row((64, 1, 1), 0.9, 0.92, 1.0), row((16, 1, 1), 0.95, 1.02, 0.99), row((128, 2, 2), 0.96, None, 1.01,
                                                                                 mc=128),
            {"shape": [1, 1, 1], "skipped": "time budget"}]
    fitd = sweep.fit(rows)
    g = fitd["M<=64 split1 tiles64<=SMs K<=2304"]
    assert g["shapes"] == ["64x1x1", "16x1x1"] and g["best"] == [0.9, 0.95]   # min over small variants incl. the rule
    assert (g["best_wins"], g["rule_n"], g["rule_wins"], g["rule_losses"], g["aa_min"]) == (2, 2, 1, 1, 0.99)
    g = fitd["M>64 split1 tiles64<=SMs K<=2304"]
    assert g["rule_n"] == 0 and g["best_median"] == 0.96
    sweep.print_fit(fitd)
    assert sweep.summary_line(dict(rows[0], rule_config=None, wall_s=1.0)).startswith("SUMMARY 64x1x1")


def test_dry_run_and_cpu_skip(sweep, capsys):
    assert sweep.main(["--dry-run", "--max-shapes", "6"]) == 0
    out = capsys.readouterr().out
    assert "128x1536x7168" in out and "6 shapes" in out
    if not torch.cuda.is_available():
        assert sweep.main(["--budget-s", "1"]) == 0
        assert "no CUDA device" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------------ the rule

OUTSIDE = [(128, 7168, 4096), (96, 4096, 4096), (128, 24576, 4096), (128, 1536, 7168), (64, 3072, 1536),
           (16, 7168, 2304), (1, 4096, 4096), (64, 12288, 2048), (128, 8192, 512), (100, 5120, 8192)]


@pytest.mark.parametrize("m, n, k", OUTSIDE)
def test_flag_off_dispatch_unchanged(rule_env, m, n, k):
    assert not S.rule_enabled()
    assert dense._use_small(m, n, k, _D(), None, False) is None


@pytest.mark.parametrize("how", ["env", "env_true", "flag"])
@pytest.mark.parametrize("m, n, k", OUTSIDE)
def test_flag_on_picks_the_rule(rule_env, how, m, n, k):
    if how == "flag":
        rule_env.setattr(S, "SMALL_RULE", True)
    else:
        rule_env.setenv(ENV, "1" if how == "env" else "TRUE")
    assert S.rule_enabled()
    want = S.rule_config(m, n, k, 132)
    assert dense._use_small(m, n, k, _D(), None, False) == want
    # never for C / FP32 out / per-row sfb / non-CUDA D, and the disable switch wins
    assert dense._use_small(m, n, k, _D(), object(), False) is None
    assert dense._use_small(m, n, k, _D(torch.float32), None, False) is None
    assert dense._use_small(m, n, k, _D(), None, True) is None
    assert dense._use_small(m, n, k, _D(cuda=False), None, False) is None
    for v in ("gemm_small", "gemm", "1"):
        rule_env.setenv("DEEPKERNELS_DISABLE_GLUON", v)
        assert dense._use_small(m, n, k, _D(), None, False) is None
    rule_env.delenv("DEEPKERNELS_DISABLE_GLUON")


def test_flag_values(rule_env):
    for v, on in (("0", False), ("", False), ("no", False), ("1", True), ("on", True), (" True ", True)):
        rule_env.setenv(ENV, v)
        assert S.rule_enabled() is on
    rule_env.setattr(S, "SMALL_RULE", True)          # the module default since the sweep: env 0 still turns it off
    for v, on in (("", True), ("junk", True), ("0", False), ("off", False), ("false", False)):
        rule_env.setenv(ENV, v)
        assert S.rule_enabled() is on


def test_rule_on_by_default():
    assert S.SMALL_RULE is True


def test_flag_on_table_rows_keep_the_table(rule_env):
    rule_env.setenv(ENV, "1")
    for (mc, n, k), cfg in S.SMALL_FP8_TABLE.items():
        assert dense._use_small(mc, n, k, _D(), None, False) is cfg
    # table shapes whose row is not in the table: the rule decides
    assert dense._use_small(128, 32768, 512, _D(), None, False) is None        # K 512 < RULE_MIN_K
    assert dense._use_small(128, 4096, 7168, _D(), None, False) is None        # Triton splits K there


def test_rule_config_pattern():
    # reproduces the split-1 one-wave table rows (the rule's derivation); the split rows and 24576 (384 tiles of
    # 64) stay table-only (the sweep: the rule's split / many-tile branches lost at 0.875-1.102, dropped)
    assert S.rule_config(64, 7168, 2048, 132) == S.SMALL_FP8_TABLE[(64, 7168, 2048)]
    assert S.rule_config(128, 7168, 2048, 132) == S.SMALL_FP8_TABLE[(128, 7168, 2048)]
    assert S.rule_config(128, 2112, 7168, 132) is None and S.rule_config(128, 7168, 16384, 132) is None
    assert S.rule_config(128, 24576, 1536, 132) is None
    # the measured losses stay on Triton
    assert S.rule_config(64, 24576, 1536, 132) is None          # 384 tiles of 64
    assert S.rule_config(64, 32768, 512, 132) is None and S.rule_config(128, 32768, 512, 132) is None
    assert S.rule_config(64, 7168, 16384, 132) is None          # M <= 64 with split
    assert S.rule_config(129, 4096, 4096, 132) is None and S.rule_config(0, 4096, 4096, 132) is None
    for m in (1, 16, 64, 65, 96, 128):
        for n in (1536, 2048, 4096, 7168, 12288, 24576):
            for k in (1024, 2048, 4096, 7168, 10944):
                c = S.rule_config(m, n, k, 132)
                if c is None:
                    continue
                t = select_fp8_config(m, n, k, 132)
                assert c.split == S.split_plan((k + 127) // 128, t.split_k)[0], "keeps the Triton K split"
                assert c.block_m == (64 if m <= 64 else 128)
                assert c.split == 1 and c.mode == "fixup" and c.block_n == 64 and -(-n // 64) <= 132


# ------------------------------------------------------------------------------------------------ GPU

# one shape per build family of the rule (sweep.py's dry run lists them)
GPU_CASES = [(96, 4096, 2048), (128, 7168, 4096), (128, 3072, 1536), (16, 8192, 2048), (1, 7168, 2304)]




def _public(A, B, m, n, env: dict, monkeypatch):
    import deepkernels as dk
    for key in (ENV, "DEEPKERNELS_DISABLE_GLUON"):
        monkeypatch.delenv(key, raising=False)
    for key, v in env.items():
        monkeypatch.setenv(key, v)
    dense._FP8_PLANS.clear()
    try:
        d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        dk.fp8_gemm_nt(A, B, d)
        torch.cuda.synchronize()
        return d, {type(p) for p in dense._FP8_PLANS.values()}
    finally:
        dense._FP8_PLANS.clear()
        for key in env:
            monkeypatch.delenv(key, raising=False)


@pytest.mark.gpu
@needs_gluon
@needs_cuda
@pytest.mark.parametrize("shape", GPU_CASES, ids=lambda s: "x".join(map(str, s)))
def test_gpu_rule_public_op(shape, monkeypatch):
    from deepkernels.testing import calc_diff
    m, n, k = shape
    assert S.rule_config(m, n, k, 132) is not None
    A, B = _inputs(m, n, k)
    d, kinds = _public(A, B, m, n, {ENV: "1"}, monkeypatch)
    assert kinds == {dense._SmallPlan}
    assert not torch.isnan(d).any(), "unwritten output elements"
    diff = float(calc_diff(d.double(), _ref64(A, B, k)))
    assert diff < 1e-3, f"vs float64: calc_diff {diff}"
    t, tk = _public(A, B, m, n, {ENV: "1", "DEEPKERNELS_DISABLE_GLUON": "gemm_small"}, monkeypatch)
    assert tk == {dense._Plan}
    diff = float(calc_diff(d.double(), t.double()))
    assert diff < 1e-6, f"vs the Triton path: calc_diff {diff}"
    off, ok = _public(A, B, m, n, {ENV: "0"}, monkeypatch)
    assert ok == {dense._Plan}, "rule off (env 0): Triton plan"


@pytest.mark.gpu
@needs_gluon
@needs_cuda
@pytest.mark.parametrize("shape", GPU_CASES, ids=lambda s: "x".join(map(str, s)))
def test_gpu_rule_bitident_vs_triton(shape, monkeypatch):
    """The rule keeps the Triton K split and the per-K-block promotion order: D equal bit for bit (not gating)."""
    m, n, k = shape
    A, B = _inputs(m, n, k, seed=1)
    d, _ = _public(A, B, m, n, {ENV: "1"}, monkeypatch)
    t, _ = _public(A, B, m, n, {"DEEPKERNELS_DISABLE_GLUON": "gemm_small"}, monkeypatch)
    assert torch.equal(d, t)


def test_run_loop_on_cpu_fakes(sweep, monkeypatch, tmp_path):
    """The sweep's measuring loop end to end with the GPU parts faked (inputs on the CPU, launches = a float matmul,
    graphs / timing stubbed): rows, variants, checks, paired ratios, the JSON after every shape, the fit, the budget."""
    import json
    import types

    calls = {"save": 0}

    def inputs(m, n, k):
        kb = (k + 127) // 128
        a = torch.randn(m, k).clamp(-4, 4).to(torch.float8_e4m3fn)
        b = torch.randn(n, k).clamp(-4, 4).to(torch.float8_e4m3fn)
        return (a, torch.ones(m, kb)), (b, torch.ones((n + 127) // 128, kb))

    def prod(A, B, d):
        d.copy_((A[0].float() @ B[0].float().T).to(torch.bfloat16))

    def public_impls(m, n, k, A, B):
        outs = {nm: torch.empty(m, n, dtype=torch.bfloat16) for nm in ("triton", "triton_aa", "public")}
        fns = {nm: (lambda d=d: prod(A, B, d)) for nm, d in outs.items()}
        assert os.environ.get(ENV) == "1"
        return fns, outs, {"triton": "_Plan", "triton_aa": "_Plan", "public": "_SmallPlan"}

    def save(res, path):
        calls["save"] += 1
        json.dump(res, open(path, "w"))

    real = sweep._gemm_small()
    fake = types.SimpleNamespace(_inputs=inputs, public_impls=public_impls, nbytes=real.nbytes, _save=save,
                                 dequant_ref=real.dequant_ref, check_then_graph=real.check_then_graph,
                                 _graph=lambda fn: types.SimpleNamespace(replay=fn),
                                 _result=lambda args, timing: dict(provenance={}, rounds=args.rounds, rows=[]))
    monkeypatch.setattr(sweep, "_gemm_small", lambda: fake)

    class _Plan:
        def __init__(self, cfg):
            self.cfg = cfg

        def __call__(self, a, sfa, b, sfb, d):
            prod((a, sfa), (b, sfb), d)
    monkeypatch.setattr(S.SmallPlan, "checked", classmethod(lambda cls, a, sfa, b, sfb, d, cfg: _Plan(cfg)))
    # the sweep's first (pre-narrowing) rule, so that row 0 has a rule variant to time (the loop's mechanics)
    monkeypatch.setattr(S, "rule_config", lambda m, n, k, sms: S.SmallConfig(128, 64, split=4, mode="reduce")
                        if m > 64 else None)
    speed = {"triton": 1.0, "triton_aa": 1.0, "rule": 0.9, "twin": 0.95, "twin_bn": 1.1, "auto": 1.2,
             "auto_reduce": 1.05}
    monkeypatch.setattr(sweep, "_time_rounds", lambda graphs, names, rounds, rep: {
        nm: [speed[nm] * 1e-2 * (1 + 0.01 * r) for r in range(rounds)] for nm in names})
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: types.SimpleNamespace(multi_processor_count=132))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    real_empty = torch.empty
    monkeypatch.setattr(torch, "empty", lambda *a, device=None, **kw: real_empty(*a, **kw))
    out = tmp_path / "sweep.json"
    args = sweep.parse_args(["--out", str(out), "--max-shapes", "3", "--extra-ms", "", "--ms", "16,128"])
    assert sweep.run(args) == 0
    res = json.load(open(out))
    assert calls["save"] == 3 + 1 and len(res["rows"]) == 3
    r0 = res["rows"][0]
    assert r0["shape"] == [128, 1536, 7168] and r0["rule_config"] == "small_128x64_s8_k4_reduce"
    assert r0["rule_plan"] == "_SmallPlan" and "twin" not in r0["impls"]          # the twin is the rule here
    e = r0["impls"]["rule"]
    assert e["diff"] < 1e-3 and not e["nan"] and e["bit_identical_to_triton"]
    assert abs(e["graph_paired_vs_triton"] - 0.9) < 1e-9 and len(e["graph_us_rounds"]) == 3
    assert abs(r0["impls"]["triton_aa"]["graph_paired_vs_triton"] - 1.0) < 1e-9
    r1 = res["rows"][1]
    assert r1["shape"] == [16, 1536, 7168] and r1["rule_config"] is None and "rule" not in r1["impls"]
    assert set(r1["impls"]) >= {"triton", "triton_aa", "twin", "twin_bn"}
    assert sum(g["rule_n"] for g in res["fit"].values()) == 2
    # the budget: nothing started after it
    args = sweep.parse_args(["--out", str(out), "--max-shapes", "2", "--budget-s", "-1"])
    assert sweep.run(args) == 0
    assert all(r.get("skipped") == "time budget" for r in json.load(open(out))["rows"])
