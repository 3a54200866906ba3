"""The `deepkernels` command and the compat modules."""
import json
import sys

import pytest
import torch

from deepkernels.bench.cases import SUITES, build_cases
from deepkernels.bench.roofline import H200, roofline_time_us
from deepkernels.bench.runner import analytical_rows


@pytest.mark.reference
def test_production_cases_count_work_and_bytes():
    cases = build_cases("cpu", small=False, quick=False)
    assert {c.suite for c in cases} == set(SUITES)
    for c in cases:
        assert c.flops > 0 and c.nbytes > 0, c.name
    rows = analytical_rows(cases)
    # DeepSeek-V3 GEMM at M=64 is memory-bound, at M=4096 compute-bound, on the H200's measured ceilings
    by = {r["name"]: r for r in rows}
    assert by["fp8_gemm_nt M=64 N=7168 K=16384"]["bound"] == "memory"
    assert by["fp8_gemm_nt M=4096 N=7168 K=16384"]["bound"] == "compute"
    r = by["fp8_gemm_nt M=4096 N=7168 K=16384"]
    assert r["roofline_us"] == pytest.approx(2 * 4096 * 7168 * 16384 / (H200.fp8_tflops_datasheet * 1e12) * 1e6)
    assert r["measured_ceiling_us"] == pytest.approx(2 * 4096 * 7168 * 16384 / (H200.fp8_tflops * 1e12) * 1e6)


@pytest.mark.reference
def test_roofline_is_max_of_two_times():
    assert roofline_time_us(0, 4.28e9) == pytest.approx(1e6 * 4.28e9 / (H200.hbm_gbps * 1e9))
    assert roofline_time_us(1e12, 1) == pytest.approx(1e6 / H200.bf16_tflops)


@pytest.mark.reference
def test_cli_help_and_suites(capsys):
    from deepkernels.bench.cli import _parser

    with pytest.raises(SystemExit) as e:
        _parser().parse_args(["bench", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for s in SUITES:
        assert s in out


@pytest.mark.reference
def test_rails_subcommand(capsys):
    from deepkernels.bench.cli import main

    assert main(["rails", "plan"]) == 0
    assert "64×128×256" in capsys.readouterr().out


@pytest.mark.reference
def test_compat_install_resolves_upstream_names():
    import deepkernels
    import deepkernels.compat as compat

    compat.install(force=True)
    try:
        import deep_gemm
        import flash_mla

        assert deep_gemm.fp8_gemm_nt is deepkernels.fp8_gemm_nt
        assert deep_gemm.fp8_fp4_gemm_nt is deepkernels.fp8_gemm_nt
        assert deep_gemm.ceil_div(129, 128) == 2
        assert flash_mla.flash_mla_with_kvcache is deepkernels.flash_mla_with_kvcache
        from flash_mla import get_mla_metadata  # noqa: F401
        with pytest.raises(AttributeError):
            deep_gemm.not_an_upstream_name  # noqa: B018
    finally:
        compat.uninstall()
    assert "deep_gemm" not in sys.modules


@pytest.mark.reference
def test_compat_refuses_to_shadow_a_real_module(monkeypatch):
    import types

    import deepkernels.compat as compat

    monkeypatch.setitem(sys.modules, "deep_gemm", types.ModuleType("deep_gemm"))
    with pytest.raises(RuntimeError, match="already imported"):
        compat.install()


@pytest.mark.interpret
def test_bench_cpu_mode_runs_the_kernels(tmp_path):
    from deepkernels.bench.cli import main

    path = tmp_path / "bench.json"
    assert main(["bench", "--only", "gemm", "--json", str(path)]) == 0
    res = json.loads(path.read_text())
    assert res["mode"] == "cpu-interpreter"
    assert res["rows"] and all(r["status"] == "PASS" for r in res["rows"])
    assert all(r.get("us") is None for r in res["rows"])  # no invented timings without a GPU
    assert res["analytical"] and all(a["kind"] == "analytical" for a in res["analytical"])


@pytest.mark.reference
def test_roofline_subcommand(capsys):
    from deepkernels.bench.cli import main

    assert main(["roofline", "--gpu", "h200", "--heads", "128"]) == 0
    assert "H200" in capsys.readouterr().out


@pytest.mark.reference
def test_bench_refuses_json_into_missing_folder(tmp_path):
    from deepkernels.bench.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "--json", str(tmp_path / "no" / "such" / "x.json")])
    assert e.value.code == 2


@pytest.mark.reference
def test_roofline_bad_argument_is_a_usage_error():
    from deepkernels.bench.cli import main

    with pytest.raises(SystemExit) as e:
        main(["roofline", "--heads", "0"])
    assert e.value.code == 2


def test_paired_row_helpers(tmp_path):
    """deepkernels.bench.paired: nan_variants / errors_text read first_runs' fields, save_rows writes provenance +
    meta + rows (the A/B scripts' shared tail)."""
    import json
    from deepkernels.bench.paired import errors_text, nan_variants, save_rows
    row = {"a_nan": True, "b_nan": False, "c_error": "boom", "x": 1}
    assert nan_variants(row) == ["a_nan"] and errors_text(row) == "  c_error: boom"
    save_rows(str(tmp_path / "r.json"), [row], rounds=3)
    d = json.load(open(tmp_path / "r.json"))
    assert d["rounds"] == 3 and d["rows"] == [row] and "git_sha" in d["provenance"]
