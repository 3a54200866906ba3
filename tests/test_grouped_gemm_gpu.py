"""GPU tier of the MoE grouped GEMMs: production shapes (DeepGEMM's grouped configs), edge cases at their reported
sizes (named after their row id in shared/cases/edge-cases.md), CUDA-graph capture and replay of the masked GEMM
with changing ``masked_m``, bit-identical repeated runs. Helpers come from test_grouped_gemm.py."""
import pytest
import torch

import deepkernels as dk
from deepkernels.reference import grouped_gemm as R
from deepkernels.testing import calc_diff
from test_grouped_gemm import (assert_rounded_close, check_contiguous, check_masked, contiguous_case, fp8_a3,
                               fp8_b, k_grouped_case, nan)

pytestmark = pytest.mark.gpu


def _dequant_groups(X, gran_rows):
    data, sf = X
    k = data.shape[-1]
    sf = sf.float().repeat_interleave(gran_rows, -2)[..., :data.shape[-2], :].repeat_interleave(128, -1)[..., :k]
    return data.float() * sf


def _contiguous_layout(g, m_per_group, device, align=128):
    ms = [int(m_per_group * (0.7 + 0.6 * torch.rand(1).item())) for _ in range(g)]
    layout = []
    for i, mg in enumerate(ms):
        layout += [i] * mg + [-1] * (-(-mg // align) * align - mg)
    return torch.tensor(layout, dtype=torch.int32, device=device)


def replay_masked_graph(A, B, d, mm, counts_list, launch=None):
    """Capture one masked grouped GEMM (``launch()``; default the public op with expected_m 64) in a CUDA graph, then
    replay it with each list of per-group counts written into the device tensor ``mm`` (never read on the host);
    ``d`` is NaN-poisoned before every replay and checked."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        if launch is None:
            dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, 64)
        else:
            launch()
    for counts in counts_list:
        mm.copy_(torch.tensor(counts, dtype=torch.int32))
        d.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_masked(d, lambda out: R.m_grouped_fp8_gemm_masked_ref(A, B, out, mm), mm)


@pytest.mark.parametrize("g,m,n,k", [(4, 8192, 4096, 7168), (8, 4096, 7168, 2048), (5, 384, 576, 7296)])
def test_contiguous_fp8_gpu_production(g, m, n, k):
    gl = _contiguous_layout(g, m, "cuda")
    A, B, gl = contiguous_case(gl, g, n, k, "cuda")
    d = nan(gl.numel(), n, device="cuda")
    dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl)
    torch.cuda.synchronize()
    assert not torch.isnan(d).any()
    assert (d[gl < 0] == 0).all()
    bq = _dequant_groups(B, 128)
    aq = _dequant_groups(A, 1)
    want = torch.zeros_like(d, dtype=torch.float32)
    for i in range(g):
        rows = gl == i
        want[rows] = aq[rows] @ bq[i].T
    assert calc_diff(d.float(), want) < 1e-5
    d2 = torch.empty_like(d)
    dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d2, gl)
    assert torch.equal(d, d2), "repeated runs must be bit-identical"


@pytest.mark.parametrize("g,m_max,expected,n,k", [(4, 4096, 256, 7168, 2048), (6, 1000, 20, 4096, 7168),
                                                  (32, 192, 192, 576, 2048), (3, 40, 16, 4096, 7168)])
def test_masked_fp8_gpu_production(g, m_max, expected, n, k):
    _, A = fp8_a3(g, m_max, k, "cuda")
    _, B = fp8_b(g, n, k, "cuda")
    mm = (expected * (0.7 + 0.6 * torch.rand(g, device="cuda"))).int().clamp(max=m_max)
    mm[0] = 0
    d = nan(g, m_max, n, device="cuda")
    dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, int(expected * 1.2))
    aq, bq = _dequant_groups(A, 1), _dequant_groups(B, 128)
    for i, mg in enumerate(mm.tolist()):
        assert torch.isnan(d[i, mg:]).all()
        if mg:
            assert not torch.isnan(d[i, :mg]).any()
            assert calc_diff(d[i, :mg].float(), aq[i, :mg] @ bq[i].T) < 1e-5


def test_masked_cuda_graph_replay_gpu():
    g, m_max, n, k = 4, 300, 1024, 2048  # M_max not a multiple of the tile
    _, A = fp8_a3(g, m_max, k, "cuda")
    _, B = fp8_b(g, n, k, "cuda")
    A = (A[0], dk.get_mn_major_tma_aligned_tensor(A[1]))  # pre-aligned scales: no copy inside the graph
    mm = torch.tensor([5, 0, 300, 77], dtype=torch.int32, device="cuda")
    d = nan(g, m_max, n, device="cuda")
    dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, 64)  # compile outside the capture
    torch.cuda.synchronize()
    replay_masked_graph(A, B, d, mm, ([5, 0, 300, 77], [300, 299, 1, 0], [0, 0, 0, 0], [64, 65, 128, 129]))


def test_bf16_gpu():
    gl = _contiguous_layout(4, 512, "cuda")
    a = torch.randn(gl.numel(), 2048, device="cuda").bfloat16()
    b = torch.randn(4, 1024, 2048, device="cuda").bfloat16()
    for nn in (False, True):
        d = nan(gl.numel(), 1024, device="cuda")
        if nn:
            dk.m_grouped_bf16_gemm_nn_contiguous(a, b.transpose(1, 2).contiguous(), d, gl)
        else:
            dk.m_grouped_bf16_gemm_nt_contiguous(a, b, d, gl)
        assert_rounded_close(d, R.m_grouped_bf16_gemm_contiguous_ref(a, b, gl, out_dtype=torch.float32))
    a3 = torch.randn(4, 200, 2048, device="cuda").bfloat16()
    mm = torch.tensor([200, 0, 3, 150], dtype=torch.int32, device="cuda")
    d = nan(4, 200, 1024, device="cuda")
    dk.m_grouped_bf16_gemm_nt_masked(a3, b, d, mm, 100)
    check_masked(d, lambda out: R.m_grouped_bf16_gemm_masked_ref(a3, b, out, mm), mm)
    ks = [1024, 0, 384]
    x = torch.randn(sum(ks), 512, device="cuda").bfloat16()
    y = torch.randn(sum(ks), 768, device="cuda").bfloat16()
    c = torch.randn(3, 512, 768, device="cuda")
    d = c.clone()
    dk.k_grouped_bf16_gemm_tn_contiguous(x, y, d, ks, c=d)
    assert calc_diff(d, R.k_grouped_bf16_gemm_ref(x, y, ks, c)) < 1e-9


@pytest.mark.parametrize("layout", ["nt", "tn"])
def test_k_grouped_fp8_gpu(layout):
    ks, m, n = [4096, 0, 2048, 6144], 4096, 7168
    A, B = k_grouped_case(ks, m, n, "cuda", layout)
    c = torch.randn(4, m, n, device="cuda") * 32
    fn = dk.k_grouped_fp8_gemm_nt_contiguous if layout == "nt" else dk.k_grouped_fp8_gemm_tn_contiguous
    outs = []
    for _ in range(3):
        d = c.clone()
        fn(A, B, d, ks, torch.tensor(ks, dtype=torch.int32, device="cuda"), c=d)
        outs.append(d)
    assert all(torch.equal(o, outs[0]) for o in outs), "repeated runs must be bit-identical"
    assert torch.equal(outs[0][1], c[1])
    off = R.k_grouped_offsets(ks)[0]
    for i, k in enumerate(ks):
        if not k:
            continue
        s0 = R.k_grouped_offsets(ks)[1][i]
        if layout == "tn":
            aq = A[0][off[i]:off[i] + k].float() * A[1][s0:s0 + k // 128].repeat_interleave(128, 0)
            bq = B[0][off[i]:off[i] + k].float() * B[1][s0:s0 + k // 128].repeat_interleave(128, 0)
            want = c[i] + aq.T @ bq
        else:
            ag = A[0][m * off[i]: m * (off[i] + k)].view(m, k).float()
            bg = B[0][n * off[i]: n * (off[i] + k)].view(n, k).float()
            want = c[i] + (ag * A[1][:, s0:s0 + k // 128].repeat_interleave(128, 1)) @ \
                (bg * B[1][:, s0:s0 + k // 128].repeat_interleave(128, 1)).T
        assert calc_diff(outs[0][i], want) < 1e-6


def test_B28_padding_runs_between_groups_gpu():
    layout = [0] * 100 + [-1] * 28 + [1] * 128 + [-1] * 1024
    A, B, gl = contiguous_case(layout, 2, 4096, 7168, "cuda")
    d = nan(len(layout), 4096, device="cuda")
    dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl)
    check_contiguous(d, A, B, gl)


def test_B27_one_row_group_gpu():
    A, B, gl = contiguous_case([0], 1, 24576, 1536, "cuda")
    d = nan(1, 24576, device="cuda")
    dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl)
    check_contiguous(d, A, B, gl)


@pytest.mark.parametrize("m,n,ks", [(2048, 768, [4096] * 16), (768, 1536, [256] * 40), (1408, 1408, [384, 256])],
                         ids=["B31_n768", "B31_m768", "B32_odd_tiles"])
def test_B31_B32_k_grouped_gpu(m, n, ks):
    A, B = k_grouped_case(ks, m, n, "cuda")
    c = torch.randn(len(ks), m, n, device="cuda")
    d = c.clone()
    dk.k_grouped_fp8_gemm_nt_contiguous(A, B, d, ks, c=d)
    d2 = c.clone()
    dk.k_grouped_fp8_gemm_nt_contiguous(A, B, d2, ks, c=d2)
    assert torch.equal(d, d2)
    assert calc_diff(d, R.k_grouped_fp8_gemm_ref(A, B, ks, c, m, n)) < 1e-6


def test_B30_bit_identical_20_runs_gpu():
    ks, m, n = [256, 128, 128, 256], 1024, 1024
    A, B = k_grouped_case(ks, m, n, "cuda", "tn")
    A[0][256:384] = 0
    A[1][2] = 1e-30
    c = torch.randn(4, m, n, device="cuda")
    first = None
    for _ in range(20):
        d = c.clone()
        dk.k_grouped_fp8_gemm_tn_contiguous(A, B, d, ks, c=d)
        first = d if first is None else first
        assert torch.equal(d, first)
    assert torch.equal(first[1], c[1])


def test_B38_B48_masked_odd_groups_gpu():
    for g, counts in ((6, None), (8, [1] * 8)):
        _, A = fp8_a3(g, 256, 2048, "cuda")
        _, B = fp8_b(g, 4096, 2048, "cuda")
        mm = torch.tensor(counts or [256, 3, 0, 129, 1, 64], dtype=torch.int32, device="cuda")
        d = nan(g, 256, 4096, device="cuda")
        dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, 64)
        check_masked(d, lambda out: R.m_grouped_fp8_gemm_masked_ref(A, B, out, mm), mm)


def test_masked_fast_launch_path_and_graph_gpu():
    """Repeated masked calls take the cached plan and launch the compiled kernel directly (KernelLauncher fast
    path), with K-major activation scales read through their strides (no per-call copy); the fast path captures
    into a CUDA graph that replays correctly with new masked_m."""
    from deepkernels.gemm import grouped
    g, m_max, n, k = 4, 300, 1024, 2048
    _, A = fp8_a3(g, m_max, k, "cuda")  # sfa [G, M_max, K/128] K-major, as per_token_cast_to_fp8 returns it
    _, B = fp8_b(g, n, k, "cuda")
    mm = torch.tensor([5, 0, 300, 77], dtype=torch.int32, device="cuda")
    d = nan(g, m_max, n, device="cuda")
    grouped._PLANS.clear()
    for _ in range(3):
        dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, 64)
    torch.cuda.synchronize()
    (plan,) = grouped._PLANS.values()
    assert plan.launcher.fast_calls == 2 and plan.launcher.slow_calls == 1
    check_masked(d, lambda out: R.m_grouped_fp8_gemm_masked_ref(A, B, out, mm), mm)
    replay_masked_graph(A, B, d, mm, ([300, 299, 1, 0], [64, 65, 128, 129]))


def test_contiguous_fast_launch_path_gpu():
    from deepkernels.gemm import grouped
    gl = _contiguous_layout(3, 300, "cuda")
    A, B, gl = contiguous_case(gl, 3, 512, 1024, "cuda")
    grouped._PLANS.clear()
    for _ in range(3):
        d = nan(gl.numel(), 512, device="cuda")
        dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl)
    torch.cuda.synchronize()
    (run,) = grouped._PLANS.values()
    assert run.plan.launcher.fast_calls == 2
    check_contiguous(d, A, B, gl)


# ------------------------------------------------------------------------- Gluon m-grouped contiguous (v3)
def _gluon_contig_or_skip():
    from deepkernels.gemm import _gluon_fp8 as G
    if not G.available():
        pytest.skip(f"gluon not importable: {G._IMPORT_ERROR!r}")
    return G


@pytest.mark.parametrize("cfg_name", ["GLUON_WS_128_S6", "GLUON_WS_128_S6_PF", "GLUON_WS_128_S4"])
@pytest.mark.parametrize("case", ["production", "mixed", "odd"])
def test_gluon_contiguous_fp8_gpu(case, cfg_name):
    """The Gluon warp-specialised m-grouped contiguous kernel: aligned production layout with padding rows,
    a layout that mixes groups inside 128-row tiles (plus ids outside [0, G) and all-padding tiles), and odd
    N / K tails with a small persistent grid. Output NaN-poisoned; padding rows must be exact zeros."""
    G = _gluon_contig_or_skip()
    cfg = getattr(G, cfg_name)
    if case == "production":
        g, n, k, gl, sms = 4, 4096, 7168, _contiguous_layout(4, 2048, "cuda"), None
    elif case == "mixed":
        g, n, k, sms = 3, 256, 512, None
        gl = torch.tensor(([0, 1, 1, -1, 2, 0, 2, 2] * 40) + [-1] * 128 + [99] * 5 + [1] * 60, dtype=torch.int32,
                          device="cuda")
    else:
        g, n, k, gl, sms = 5, 576, 1040, _contiguous_layout(5, 300, "cuda"), 7
    A, B, gl = contiguous_case(gl, g, n, k, "cuda")
    d = nan(gl.numel(), n, device="cuda")
    G._launch_fp8_gluon_m_contiguous(A[0], A[1], B[0], B[1], d, gl, cfg, num_sms=sms)
    torch.cuda.synchronize()
    assert not torch.isnan(d).any(), "unwritten output rows"
    pad = (gl < 0) | (gl >= g)
    assert (d[pad] == 0).all(), "padding rows must be exactly zero"
    bq = _dequant_groups(B, 128)
    aq = _dequant_groups(A, 1)
    want = torch.zeros_like(d, dtype=torch.float32)
    for i in range(g):
        rows = gl == i
        want[rows] = aq[rows] @ bq[i].T
    assert calc_diff(d.float(), want) < 1e-5


def test_gluon_contiguous_public_dispatch_gpu(monkeypatch):
    """DEEPKERNELS_GROUPED_GLUON=1 routes the public op through the Gluon kernel (cached plan, repeat calls)."""
    G = _gluon_contig_or_skip()
    from deepkernels.gemm import grouped
    monkeypatch.setenv("DEEPKERNELS_GROUPED_GLUON", "1")
    gl = _contiguous_layout(3, 300, "cuda")
    A, B, gl = contiguous_case(gl, 3, 512, 1024, "cuda")
    grouped._PLANS.clear()
    for _ in range(2):
        d = nan(gl.numel(), 512, device="cuda")
        dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl)
    torch.cuda.synchronize()
    (run,) = grouped._PLANS.values()
    assert isinstance(run.plan, grouped._GluonPlan)
    check_contiguous(d, A, B, gl)


# ------------------------------------------------------------------ Gluon m-grouped masked (dispatched for expected_m >= 256)
@pytest.mark.parametrize("cfg_name", ["GLUON_WS_128_S4", "GLUON_WS_128_S6"])
@pytest.mark.parametrize("case", ["production", "odd", "empty"])
def test_gluon_masked_fp8_gpu(case, cfg_name):
    """Gluon warp-specialised masked kernel: rows < masked_m[g] equal the dequantized product, every other row
    (NaN-poisoned) untouched; odd N / K tails, M_max not a multiple of the tile, m_g = 0 and m_g = M_max groups,
    a small persistent grid."""
    G = _gluon_contig_or_skip()
    cfg = getattr(G, cfg_name)
    if case == "production":
        g, m_max, n, k, counts, sms = 4, 4096, 7168, 2048, [0, 256, 300, 4096], None
    elif case == "odd":
        g, m_max, n, k, counts, sms = 3, 300, 576, 1040, [5, 300, 129], 5
    else:
        g, m_max, n, k, counts, sms = 2, 64, 256, 512, [0, 0], None
    _, A = fp8_a3(g, m_max, k, "cuda")
    _, B = fp8_b(g, n, k, "cuda")
    mm = torch.tensor(counts, dtype=torch.int32, device="cuda")
    d = nan(g, m_max, n, device="cuda")
    G._launch_fp8_gluon_m_masked(A[0], A[1], B[0], B[1], d, mm, cfg, num_sms=sms)
    torch.cuda.synchronize()
    aq, bq = _dequant_groups(A, 1), _dequant_groups(B, 128)
    for i, mg in enumerate(counts):
        assert torch.isnan(d[i, mg:]).all(), f"group {i}: rows >= masked_m written"
        if mg:
            assert not torch.isnan(d[i, :mg]).any(), f"group {i}: valid rows not written"
            assert calc_diff(d[i, :mg].float(), aq[i, :mg] @ bq[i].T) < 1e-5


def test_gluon_masked_cuda_graph_replay_gpu():
    G = _gluon_contig_or_skip()
    g, m_max, n, k = 4, 300, 1024, 2048
    _, A = fp8_a3(g, m_max, k, "cuda")
    _, B = fp8_b(g, n, k, "cuda")
    mm = torch.tensor([5, 0, 300, 77], dtype=torch.int32, device="cuda")
    d = nan(g, m_max, n, device="cuda")
    G._launch_fp8_gluon_m_masked(A[0], A[1], B[0], B[1], d, mm)  # compile outside the capture
    torch.cuda.synchronize()
    replay_masked_graph(A, B, d, mm, ([300, 299, 1, 0], [64, 65, 128, 129]),
                        launch=lambda: G._launch_fp8_gluon_m_masked(A[0], A[1], B[0], B[1], d, mm))


def test_gluon_masked_public_dispatch_gpu(monkeypatch):
    """The public masked op inside the Gluon envelope (expected_m 256, N 4096, K 2048): cached _GluonPlan, the second
    call on the fast launch path, results equal to the reference and bit-identical to the direct launch; a CUDA graph
    of the public call replays with new counts."""
    G = _gluon_contig_or_skip()
    from deepkernels.gemm import grouped
    monkeypatch.delenv("DEEPKERNELS_GROUPED_GLUON", raising=False)
    monkeypatch.delenv("DEEPKERNELS_DISABLE_GLUON", raising=False)
    g, m_max, n, k = 3, 384, 4096, 2048
    _, A = fp8_a3(g, m_max, k, "cuda")
    _, B = fp8_b(g, n, k, "cuda")
    mm = torch.tensor([256, 0, 383], dtype=torch.int32, device="cuda")
    grouped._PLANS.clear()
    outs = []
    for _ in range(3):
        d = nan(g, m_max, n, device="cuda")
        dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, 256)
        outs.append(d)
    torch.cuda.synchronize()
    (plan,) = grouped._PLANS.values()
    assert isinstance(plan, grouped._GluonPlan) and plan.masked
    assert plan.launcher.fast_calls >= 1, (plan.launcher.fast_calls, plan.launcher.slow_calls)
    check_masked(outs[-1], lambda out: R.m_grouped_fp8_gemm_masked_ref(A, B, out, mm), mm)
    direct = nan(g, m_max, n, device="cuda")
    G._launch_fp8_gluon_m_masked(A[0], A[1], B[0], B[1], direct, mm)
    torch.cuda.synchronize()
    for d in outs:
        assert torch.equal(torch.nan_to_num(d, nan=7.0), torch.nan_to_num(direct, nan=7.0))
    d = outs[-1]
    replay_masked_graph(A, B, d, mm, ([384, 1, 0], [0, 255, 257]),
                        launch=lambda: dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, 256))
