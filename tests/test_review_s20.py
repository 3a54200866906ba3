"""Regression tests of the session-20 fresh-user review (CPU: reference + interpreter tiers).

1. Strided index tensors of the m-grouped GEMMs: ``masked_m`` / a per-row ``grouped_layout`` passed as a 1-D view
   with a non-unit stride (``counts[:, 0]`` of an ``[G, 2]`` tensor) were read by the kernels as packed int32
   arrays: the masked GEMM wrote rows past ``masked_m[g]`` (documented as never written) and computed other groups'
   rows with the wrong counts, the contiguous GEMM used the wrong expert per row. The public ops now pack such a
   view first (a device copy, no host sync).
"""
import pytest
import torch

import deepkernels as dk
from deepkernels.gemm import grouped
from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
from deepkernels.testing import calc_diff

REF = pytest.mark.reference
INTERP = pytest.mark.interpret


def _strided(values, dtype=torch.int32):
    """``values`` as a 1-D view with stride 2 (the other column holds junk the kernels must never read)."""
    t = torch.tensor(values, dtype=dtype)
    return torch.stack([t, torch.full_like(t, 99)], 1)[:, 0]


def _fp8_b(g, n, k):
    w = torch.randn(g, n, k)
    q = [per_block_cast_to_fp8(w[i], use_ue8m0=False) for i in range(g)]
    return w, (torch.stack([x[0] for x in q]), torch.stack([x[1] for x in q]))


# ------------------------------------------------------------------------------------------------ 1. strided ids
@REF
def test_packed_index_helper():
    t = _strided([3, 0, 1])
    p = grouped._packed_index(t)
    assert p.stride() == (1,) and p.tolist() == [3, 0, 1]
    c = torch.tensor([1, 2], dtype=torch.int32)
    assert grouped._packed_index(c) is c                 # packed: unchanged (no copy)
    one = _strided([5])
    assert grouped._packed_index(one) is one             # one element: any stride is packed
    assert grouped._packed_index(None) is None           # wrong types are left to validation


@INTERP
@pytest.mark.parametrize("fp8", [True, False])
def test_masked_grouped_gemm_strided_masked_m(fp8):
    g, m_max, n, k = 3, 40, 128, 256
    x = torch.randn(g, m_max, k)
    w, b = _fp8_b(g, n, k)
    counts = [40, 0, 17]
    masked_m = _strided(counts)
    d = torch.full((g, m_max, n), 7.0, dtype=torch.bfloat16)
    if fp8:
        a = per_token_cast_to_fp8(x.view(-1, k), use_ue8m0=False)
        dk.m_grouped_fp8_gemm_nt_masked((a[0].view(g, m_max, k), a[1].view(g, m_max, -1)), b, d, masked_m, 16)
    else:
        dk.m_grouped_bf16_gemm_nt_masked(x.bfloat16(), w.bfloat16(), d, masked_m, 16)
    for i, m in enumerate(counts):
        assert (d[i, m:] == 7).all(), f"group {i}: rows >= masked_m[{i}] = {m} were written"
        if m:
            ref = x[i, :m].bfloat16().float() @ w[i].bfloat16().float().T
            assert calc_diff(d[i, :m].float(), ref) < (2e-3 if fp8 else 1e-4)


@INTERP
@pytest.mark.parametrize("fp8", [True, False])
def test_contiguous_grouped_gemm_strided_layout(fp8):
    g, n, k = 3, 128, 256
    ids = [0] * 100 + [-1] * 28 + [2] * 128 + [-1] * 40
    m_sum = len(ids)
    x = torch.randn(m_sum, k)
    w, b = _fp8_b(g, n, k)
    layout = _strided(ids)
    d = torch.full((m_sum, n), float("nan"), dtype=torch.bfloat16)
    if fp8:
        dk.m_grouped_fp8_gemm_nt_contiguous(per_token_cast_to_fp8(x, use_ue8m0=False), b, d, layout)
    else:
        dk.m_grouped_bf16_gemm_nt_contiguous(x.bfloat16(), w.bfloat16(), d, layout)
    xb, wb = x.bfloat16().float(), w.bfloat16().float()
    ref = torch.stack([xb[i] @ wb[j].T if j >= 0 else torch.zeros(n) for i, j in enumerate(ids)])
    pad = torch.tensor(ids) < 0
    assert (d[pad] == 0).all()
    assert calc_diff(d[~pad].float(), ref[~pad]) < (2e-3 if fp8 else 1e-4)
