"""Grouped-GEMM benchmark cases: DeepGEMM's published m-grouped contiguous and masked configs (ANCHORS.md).

Anchor: a loop of cuBLAS blockwise FP8 GEMMs (``torch._scaled_mm``), one per group, in the same process.
FLOPs/bytes as DeepGEMM counts them (docs/spec/gemm.md §4.1): contiguous ``2·M_sum·N·K`` and ``count_bytes(a, b, d)``;
masked ``2·Σmasked_m·N·K`` and ``count_bytes(a, d)·Σmasked_m/(G·M_max) + count_bytes(b)``.
"""
from __future__ import annotations

import torch

from .cases import Case

__all__ = ["BUILDERS"]

CONTIGUOUS = [(4, 8192, 4096, 7168, 1346), (4, 8192, 7168, 2048, 1214), (8, 4096, 4096, 7168, 1346),
              (8, 4096, 7168, 2048, 1214)]
MASKED = [(1, 1024, 4096, 7168, 1233), (1, 1024, 7168, 2048, 925), (2, 512, 4096, 7168, 1040),
          (2, 512, 7168, 2048, 916), (4, 256, 4096, 7168, 932), (4, 256, 7168, 2048, 815)]
MASKED_M_MAX = 4096  # DeepGEMM's masked test allocates 4096 rows per group


def _weights(g: int, n: int, k: int, device: str):
    import deepkernels as dk

    w = torch.randn(g, n, k, device=device, dtype=torch.bfloat16)
    parts = [dk.per_block_cast_to_fp8(w[i], use_ue8m0=False) for i in range(g)]
    return w, (torch.stack([p[0] for p in parts]), torch.stack([p[1] for p in parts]))


def _cublas_group(a, sfa, b, sfb):
    return torch._scaled_mm(a, b.t(), scale_a=sfa.t().contiguous().t(), scale_b=sfb.contiguous().t(),
                            out_dtype=torch.bfloat16)


def _check_groups(d_groups, x_groups, w) -> tuple[bool, str]:
    from deepkernels.testing import calc_diff

    worst = 0.0
    for g, (d, x) in enumerate(zip(d_groups, x_groups)):
        if torch.isnan(d).any():
            return False, f"unwritten (NaN) rows in group {g}"
        worst = max(worst, float(calc_diff(d.double(), x.double() @ w[g].double().T)))
    return worst < 1e-3, f"calc_diff {worst:.1e}"


def _contiguous_case(g: int, m: int, n: int, k: int, published: float, device: str) -> Case:
    import deepkernels as dk

    def setup():
        x = torch.randn(g * m, k, device=device, dtype=torch.bfloat16)
        w, b = _weights(g, n, k, device)
        a = dk.per_token_cast_to_fp8(x, use_ue8m0=False)
        layout = torch.arange(g, device=device, dtype=torch.int32).repeat_interleave(m)
        d = torch.full((g * m, n), float("nan"), device=device, dtype=torch.bfloat16)
        return dict(x=x, w=w, a=a, b=b, layout=layout, d=d)

    def ours(t):
        dk.m_grouped_fp8_gemm_nt_contiguous(t["a"], t["b"], t["d"], t["layout"])
        return t["d"]

    def check(t, d):
        return _check_groups(d.view(g, m, n), t["x"].view(g, m, k), t["w"])

    def cublas_loop(t):
        (a, sfa), (b, sfb) = t["a"], t["b"]
        return [_cublas_group(a[i * m:(i + 1) * m], sfa[i * m:(i + 1) * m], b[i], sfb[i]) for i in range(g)]

    kb = k // 128
    nbytes = g * m * k + g * n * k + 2 * g * m * n + 4 * (g * m * kb + g * (n // 128) * kb)
    return Case("grouped", f"m_grouped contiguous G={g} m={m} N={n} K={k}", setup, ours, check, 2.0 * g * m * n * k,
                nbytes, "fp8", {"cuBLAS blockwise per group": cublas_loop}, (f">={published} TFLOPS (DeepGEMM H800)" if published else ""))


def _masked_case(g: int, m: int, n: int, k: int, published: float, device: str, m_max: int) -> Case:
    import deepkernels as dk

    def setup():
        x = torch.randn(g, m_max, k, device=device, dtype=torch.bfloat16)
        w, b = _weights(g, n, k, device)
        a = dk.per_token_cast_to_fp8(x.view(-1, k), use_ue8m0=False)
        a = (a[0].view(g, m_max, k), a[1].view(g, m_max, -1))
        d = torch.full((g, m_max, n), float("nan"), device=device, dtype=torch.bfloat16)
        masked_m = torch.full((g,), m, device=device, dtype=torch.int32)
        return dict(x=x, w=w, a=a, b=b, d=d, masked_m=masked_m)

    def ours(t):
        dk.m_grouped_fp8_gemm_nt_masked(t["a"], t["b"], t["d"], t["masked_m"], m)
        return t["d"]

    def check(t, d):
        return _check_groups(d[:, :m], t["x"][:, :m], t["w"])

    def cublas_loop(t):
        (a, sfa), (b, sfb) = t["a"], t["b"]
        return [_cublas_group(a[i, :m], sfa[i, :m], b[i], sfb[i]) for i in range(g)]

    kb = k // 128
    frac = m / m_max
    nbytes = (g * m_max * k + 4 * g * m_max * kb + 2 * g * m_max * n) * frac + g * n * k + 4 * g * (n // 128) * kb
    return Case("grouped", f"m_grouped masked G={g} m={m} N={n} K={k}", setup, ours, check, 2.0 * g * m * n * k,
                nbytes, "fp8", {"cuBLAS blockwise per group": cublas_loop},
                (f">={published} TFLOPS (DeepGEMM H800)" if published else ""))


def grouped_cases(device: str, small: bool, quick: bool) -> list[Case]:
    if small:
        return [_contiguous_case(2, 128, 256, 256, 0, device), _masked_case(3, 40, 128, 384, 0, device, 64)]
    cont = CONTIGUOUS[:1] if quick else CONTIGUOUS
    mask = MASKED[::3] if quick else MASKED
    return ([_contiguous_case(*c, device) for c in cont] +
            [_masked_case(*c, device, MASKED_M_MAX) for c in mask])


BUILDERS = {"grouped": grouped_cases}
