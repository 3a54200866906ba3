"""Benchmark cases of `deepkernels bench`: the ANCHORS.md shapes on a GPU, small shapes on the CPU.

A case builds fresh random inputs, runs our public op, checks the result against an independent reference
(a wrong result is a FAIL row, never a number), and on a GPU also names the in-run anchors to time beside it.
FLOPs and bytes are counted as the upstream benchmarks count them (docs/spec/gemm.md §4.1, docs/spec/mla.md §6.2).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

__all__ = ["Case", "build_cases", "SUITES"]

SUITES = ("gemm", "grouped", "mla", "sparse", "prefill")


@dataclass
class Case:
    suite: str
    name: str
    setup: Callable[[], dict]                       # fresh random inputs on the run's device
    ours: Callable[[dict], Any]                     # runs our public op
    check: Callable[[dict, Any], tuple[bool, str]]  # (ok, metric text) against the reference
    flops: float
    nbytes: float
    mma: str = "bf16"                               # which tensor-core ceiling applies
    anchors: dict[str, Callable[[dict], Any]] = field(default_factory=dict)
    target: str = ""                                # the ANCHORS.md target, as text


# ----------------------------------------------------------------------------------------------- GEMM
GEMM_NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def _gemm_target(m: int, n: int, k: int) -> str:
    if (m, n, k) == (4096, 7168, 16384):
        return ">=1500 TFLOPS"
    return ">=3000 GB/s" if m <= 128 else ">=1.2x cuBLAS"


def _fp8_gemm_case(m: int, n: int, k: int, device: str) -> Case:
    import deepkernels as dk
    from deepkernels.testing import calc_diff

    def setup():
        x = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        y = torch.randn(n, k, device=device, dtype=torch.bfloat16)
        a = dk.per_token_cast_to_fp8(x, use_ue8m0=False)
        b = dk.per_block_cast_to_fp8(y, use_ue8m0=False)
        d = torch.full((m, n), float("nan"), device=device, dtype=torch.bfloat16)
        return dict(x=x, y=y, a=a, b=b, d=d)

    def ours(t):
        dk.fp8_gemm_nt(t["a"], t["b"], t["d"])
        return t["d"]

    def check(t, d):
        ref = t["x"].double() @ t["y"].double().T
        if torch.isnan(d).any():
            return False, "unwritten (NaN) outputs"
        diff = float(calc_diff(d.double(), ref))
        return diff < 1e-3, f"calc_diff {diff:.1e}"

    def cublas(t):
        (a, sfa), (b, sfb) = t["a"], t["b"]
        sfa_mn = sfa.t().contiguous().t()          # [M, K/128], strides (1, M)
        return torch._scaled_mm(a, b.t(), scale_a=sfa_mn, scale_b=sfb.contiguous().t(), out_dtype=torch.bfloat16)

    kb = (k + 127) // 128
    nbytes = m * k + n * k + 2 * m * n + 4 * (m * kb + ((n + 127) // 128) * kb)
    return Case("gemm", f"fp8_gemm_nt M={m} N={n} K={k}", setup, ours, check, 2.0 * m * n * k, nbytes, "fp8",
                {"cuBLAS blockwise": cublas}, _gemm_target(m, n, k))


def _bf16_gemm_case(m: int, n: int, k: int, device: str) -> Case:
    import deepkernels as dk
    from deepkernels.testing import calc_diff

    def setup():
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(n, k, device=device, dtype=torch.bfloat16)
        d = torch.full((m, n), float("nan"), device=device, dtype=torch.bfloat16)
        return dict(a=a, b=b, d=d)

    def ours(t):
        dk.bf16_gemm_nt(t["a"], t["b"], t["d"])
        return t["d"]

    def check(t, d):
        ref = t["a"].double() @ t["b"].double().T
        if torch.isnan(d).any():
            return False, "unwritten (NaN) outputs"
        diff = float(calc_diff(d.double(), ref))
        return diff < 1e-5, f"calc_diff {diff:.1e}"

    return Case("gemm", f"bf16_gemm_nt M={m} N={n} K={k}", setup, ours, check, 2.0 * m * n * k,
                2 * (m * k + n * k + m * n), "bf16", {"torch.matmul": lambda t: t["a"] @ t["b"].T}, ">=1.0x torch")


def gemm_cases(device: str, small: bool, quick: bool) -> list[Case]:
    if small:
        shapes = [(7, 256, 384), (64, 129, 256)]
        return [_fp8_gemm_case(*s, device) for s in shapes] + [_bf16_gemm_case(64, 129, 256, device)]
    ms = (128, 4096) if quick else (64, 128, 4096)
    nks = GEMM_NK[3:5] if quick else GEMM_NK
    cases = [_fp8_gemm_case(m, n, k, device) for m in ms for n, k in nks]
    cases += [_bf16_gemm_case(4096, n, k, device) for n, k in nks[:2]]
    return cases


# ----------------------------------------------------------------------------------------------- registry
def _error_case(suite: str, err: Exception) -> Case:
    """A FAIL row for a selected suite whose cases cannot be built (never a silently empty suite)."""
    def setup():
        raise RuntimeError(f"suite {suite!r} could not be built: {type(err).__name__}: {err}")

    return Case(suite, f"{suite} (suite unavailable)", setup, lambda t: None, lambda t, o: (False, ""), 1.0, 1.0)


def build_cases(device: str, small: bool, quick: bool, only: str | None = None) -> list[Case]:
    """Every case of the selected suites. A suite that cannot be imported or built yields one FAIL row."""
    import importlib

    modules = {"gemm": None, "grouped": "cases_grouped", "mla": "cases_mla", "sparse": "cases_mla",
               "prefill": "cases_mla"}
    out: list[Case] = []
    for suite in SUITES:
        if only and suite != only:
            continue
        try:
            if modules[suite] is None:
                builder = gemm_cases
            else:
                builder = importlib.import_module(f"{__package__}.{modules[suite]}").BUILDERS[suite]
            out += builder(device, small, quick)
        except Exception as e:  # noqa: BLE001 - reported as a FAIL row
            out.append(_error_case(suite, e))
    return out
