"""Gluon sm90 FP8 1D2D GEMM (``deepkernels.gemm._gluon_fp8``, experimental, not wired into dense.py).

- compile tier: every candidate cross-compiles for sm90 on the CPU with wgmma + TMA + mbarrier, fits 227 KB of
  shared memory, no local memory, no ptxas spills, and (WS configs) is warp-specialised; ptxas must not report
  C7514 (wgmma serialised) for the warp-specialised configs.
- gpu tier: the 6 M = 4096 production shapes and partial tiles, poisoned output, calc_diff < 1e-3 against the
  dequantised float64 product.
Everything skips cleanly on a CPU box, under the interpreter, or when Gluon is not importable.
"""

import dataclasses
import os
import re

import pytest
import torch

from deepkernels.gemm import _gluon_fp8 as G
from deepkernels.testing.compile import SM90_SMEM_LIMIT, ptxas_sm90_or_skip

needs_gluon = pytest.mark.skipif(not G.available(), reason=f"gluon not importable: {G._IMPORT_ERROR!r}")


SHAPES_4096 = [(4096, 2112, 7168), (4096, 24576, 1536), (4096, 32768, 512),
               (4096, 7168, 16384), (4096, 4096, 7168), (4096, 7168, 2048)]





@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("cfg", G.GLUON_CANDIDATES + G.GLUON_RETIRED, ids=lambda c: c.name())
def test_gluon_config_compiles_for_sm90(cfg):
    c = G._compile_sm90(cfg)
    ptx, ttgir = c.asm["ptx"], c.asm["ttgir"]
    assert "wgmma.mma_async" in ptx
    assert "cp.async.bulk.tensor" in ptx
    assert "mbarrier" in ptx
    assert int(c.metadata.shared) <= SM90_SMEM_LIMIT
    assert ".local" not in ptx
    rep = ptxas_sm90_or_skip(ptx, reason="no bundled ptxas")
    info = rep.log
    assert rep.spill_bytes == 0, info
    if cfg.warp_spec:
        assert "ttg.warp_specialize" in ttgir
        assert "setmaxnreg" in ptx
        assert "C7514" not in info, "ptxas serialised the wgmmas"


@pytest.mark.compile
@needs_gluon
def test_gluon_overlap_128x128_serialises_or_spills():
    """Documented limit: wgmma kb+1 in flight during kb's promotion needs 3 x 64 accumulator registers per thread
    at 64x128 per warpgroup; with 384 threads ptxas caps registers at 168, so it spills."""
    cfg = G.GluonConfig(128, 128, 4, overlap=True)
    assert ptxas_sm90_or_skip(G._compile_sm90(cfg).asm["ptx"], reason="no bundled ptxas").spill_bytes > 0


def test_gluon_refuses_cpu_tensors():
    if not G.available():
        pytest.skip("gluon not importable")
    a = torch.zeros(128, 128).to(torch.float8_e4m3fn)
    sf = torch.ones(128, 1)
    with pytest.raises((ValueError, RuntimeError)):
        G._launch_fp8_gluon(a, sf, a, torch.ones(1, 1), torch.empty(128, 128, dtype=torch.bfloat16))


def _inputs(m, n, k):
    from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    return per_token_cast_to_fp8(a, use_ue8m0=False), per_block_cast_to_fp8(b, use_ue8m0=False)


def _ref64(A, B, k):
    sa = A[1].double().repeat_interleave(128, 1)[:, :k]
    sb = B[1].double().repeat_interleave(128, 0)[:B[0].shape[0]].repeat_interleave(128, 1)[:, :k]
    return (A[0].double() * sa) @ (B[0].double() * sb).T


def _run_and_check(m, n, k, cfg, sfa_mn_major=False, num_sms=None, d_width=None):
    """Poisoned d, launch, calc_diff < 1e-3 vs the float64 product. ``d_width``: d is the first n columns of a
    poisoned [m, d_width] buffer (a strided D); the columns >= n must stay untouched."""
    from deepkernels.testing import calc_diff
    A, B = _inputs(m, n, k)
    sfa = A[1].T.contiguous().T if sfa_mn_major else A[1]
    full = torch.full((m, d_width or n), float("nan"), device="cuda", dtype=torch.bfloat16)  # poisoned
    d = full[:, :n]
    G._launch_fp8_gluon(A[0], sfa, B[0], B[1], d, cfg, num_sms=num_sms)
    torch.cuda.synchronize()
    assert not torch.isnan(d).any(), "unwritten output elements"
    if d_width:
        assert torch.isnan(full[:, n:]).all(), "wrote outside D"
    diff = float(calc_diff(d.double(), _ref64(A, B, k)))
    assert diff < 1e-3, f"{cfg.name()} {m}x{n}x{k}: calc_diff {diff}"


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("cfg", G.GLUON_CANDIDATES, ids=lambda c: c.name())
@pytest.mark.parametrize("shape", SHAPES_4096, ids=lambda s: "x".join(map(str, s)))
def test_gluon_fp8_m4096(shape, cfg):
    _run_and_check(*shape, cfg)


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("cfg", G.GLUON_CANDIDATES, ids=lambda c: c.name())
@pytest.mark.parametrize("shape", [(300, 1000, 576), (1, 128, 128), (129, 200, 256), (64, 64, 384)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gluon_fp8_partial_tiles(shape, cfg):
    _run_and_check(*shape, cfg, sfa_mn_major=True)


@pytest.mark.gpu
@needs_gluon
def test_gluon_fp8_small_grid_persistent():
    """More tiles than programs: the persistent loop and ring phases carry across tiles."""
    from deepkernels.testing import calc_diff
    m, n, k = 1024, 1024, 1280
    A, B = _inputs(m, n, k)
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    G._launch_fp8_gluon(A[0], A[1], B[0], B[1], d, G.GLUON_DEFAULT, num_sms=3)
    torch.cuda.synchronize()
    assert float(calc_diff(d.double(), _ref64(A, B, k))) < 1e-3


def test_dense_gluon_dispatch_rule(monkeypatch):
    """CPU: dense.py's Gluon envelope -- the TMA-store-epilogue config (S4) from M = 1024 at any K when D is
    TMA-able; otherwise the register-epilogue config at K >= 7168 (S4 for N <= 2112, S6 above) and the Triton table
    below; the Triton table for M < 1024, C, per-row weight scales, fp32 out, and when Gluon is disabled."""
    from deepkernels.gemm import dense

    def dd(n, dtype=torch.bfloat16, offset=0):
        # a stand-in D: what the rule reads (dtype, device, strides, base alignment)
        class D:
            is_cuda = True

            def stride(self, i=None):
                st = (n, 1)
                return st if i is None else st[i]

            def data_ptr(self):
                return 1 << 20 | offset
        D.dtype = dtype
        return D()

    monkeypatch.setattr(dense, "interpret_mode", lambda: False)
    monkeypatch.setattr(G, "available", lambda: True)
    monkeypatch.delenv("DEEPKERNELS_DISABLE_GLUON", raising=False)
    rule = dense._use_gluon
    monkeypatch.setattr(dense, "get_num_sms", lambda: 132)
    for m, n, k in ((4096, 32768, 512), (1024, 24576, 1536), (2048, 2112, 7168), (8192, 576, 128),
                    (1024, 7168, 16384), (1024, 4096, 7168), (4096, 7168, 1024)):
        assert rule(m, n, k, dd(n), None, False) is G.GLUON_WS_128_S4_EPI, (m, n, k)
    # session 19: M >= 2048, K >= 1536 with >= 3 waves of tiles (396 at 132 SMs): the 6-stage scales-ahead twin
    for m, n, k in ((4096, 2112, 7168), (4096, 7168, 16384), (2048, 4096, 7168), (4096, 24576, 1536),
                    (2048, 7168, 2048)):
        assert rule(m, n, k, dd(n), None, False) is G.GLUON_WS_128_S6_EPI_SA1, (m, n, k)
    monkeypatch.setattr(dense, "get_num_sms", lambda: 200)          # set_num_sms: the wave count follows it
    assert rule(2048, 4096, 7168, dd(4096), None, False) is G.GLUON_WS_128_S4_EPI
    monkeypatch.setattr(dense, "get_num_sms", lambda: 132)
    # D not TMA-able (N % 8 != 0, or a base offset of 2 bytes): register epilogue at K >= 7168, else Triton
    assert rule(4096, 1030, 7168, dd(1030), None, False) is G.GLUON_WS_128_S4
    assert rule(4096, 4100, 7168, dd(4100), None, False) is G.GLUON_WS_128_S6
    assert rule(4096, 4096, 7168, dd(4096, offset=2), None, False) is G.GLUON_WS_128_S6
    assert rule(4096, 1030, 512, dd(1030), None, False) is None
    for m, n, k in ((1023, 7168, 16384), (128, 7168, 16384), (64, 2112, 7168)):
        assert rule(m, n, k, dd(n), None, False) is None, (m, n, k)
    assert rule(4096, 7168, 2048, dd(7168), object(), False) is None                 # C accumulation: Triton
    assert rule(4096, 7168, 2048, dd(7168), None, True) is None                      # 1D1D: Triton
    assert rule(4096, 7168, 2048, dd(7168, torch.float32), None, False) is None      # fp32 out: Triton
    monkeypatch.setenv("DEEPKERNELS_DISABLE_GLUON", "gemm")
    assert rule(4096, 7168, 2048, dd(7168), None, False) is None


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("m, n, k", [(1024, 2112, 7168), (4096, 7168, 2048), (4096, 576, 1088), (4096, 1000, 640),
                                     (1024, 1030, 7168), (2048, 32768, 512)])
def test_gluon_public_dispatch_fast_launch(monkeypatch, m, n, k):
    """The public fp8_gemm_nt inside the Gluon envelope (M >= 1024): one cached _GluonPlan, repeat calls on the fast
    launch path (compiled kernel called directly, descriptors rebuilt per call), bit-identical to the direct launch
    and within DeepGEMM's calc_diff of the float64 reference, and a CUDA graph of the public call replays
    correctly. N 1030: D's row stride (2060 B) is not TMA-able, so the plan holds the register-epilogue config;
    N 1000 and K 1088: partial last tiles in N and K (K 1088 = 8.5 scale blocks)."""
    import deepkernels as dk
    from deepkernels.gemm import dense
    from deepkernels.testing import calc_diff
    monkeypatch.delenv("DEEPKERNELS_DISABLE_GLUON", raising=False)
    A, B = _inputs(m, n, k)
    dense._FP8_PLANS.clear()
    outs = []
    for _ in range(3):
        d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        dk.fp8_gemm_nt(A, B, d)
        outs.append(d)
    torch.cuda.synchronize()
    (plan,) = dense._FP8_PLANS.values()
    assert isinstance(plan, dense._GluonPlan)
    assert (plan.launcher.fast_calls, plan.launcher.slow_calls) == (2, 1)
    direct = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    G._launch_fp8_gluon(A[0], A[1], B[0], B[1], direct, plan.config, num_sms=dense.get_num_sms())
    torch.cuda.synchronize()
    for d in outs:
        assert torch.equal(d, direct)
    assert float(calc_diff(direct.double(), _ref64(A, B, k))) < 1e-3
    d = outs[0]
    d.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dk.fp8_gemm_nt(A, B, d)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(d, direct)


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("cfg", [G.GLUON_WS_128_S6, G.GLUON_WS_128_S6_PF, G.GLUON_WS_128_S4],
                         ids=lambda c: c.name())
def test_gluon_m_contiguous_compiles_for_sm90(cfg):
    """The m-grouped contiguous Gluon kernel (flat pass loop): wgmma + TMA, warp-specialised, no spills."""
    c = G._compile_sm90_m_contiguous(cfg)
    ptx = c.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert "ttg.warp_specialize" in c.asm["ttgir"]
    assert int(c.metadata.shared) <= SM90_SMEM_LIMIT
    rep = ptxas_sm90_or_skip(ptx, reason="no bundled ptxas")
    assert rep.spill_bytes == 0, rep.log
    assert "C7514" not in rep.log


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("cfg", [G.GLUON_WS_128_S4, G.GLUON_WS_128_S6, G.GluonConfig(64, 128, 8, overlap=False)],
                         ids=lambda c: c.name())
def test_gluon_m_masked_compiles_for_sm90(cfg):
    """The m-grouped masked Gluon kernel (device-side schedule from masked_m): wgmma + TMA, WS, no spills."""
    c = G._compile_sm90_m_masked(cfg)
    ptx = c.asm["ptx"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert "ttg.warp_specialize" in c.asm["ttgir"]
    assert int(c.metadata.shared) <= SM90_SMEM_LIMIT
    rep = ptxas_sm90_or_skip(ptx, reason="no bundled ptxas")
    assert rep.spill_bytes == 0, rep.log


# ------------------------------------------------- issue #3: TMA-store epilogue variant (EPI_TMA), not dispatched

@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("cfg", G.GLUON_EPI, ids=lambda c: c.name())
def test_gluon_epi_tma_compiles_for_sm90(cfg):
    """The TMA-store epilogue: a bulk tensor store global <- shared (plus the load direction), bulk-group waits,
    the async-proxy fence, shared memory = ring + 2 x 16 KB epilogue buffers <= 227 KB, no spills, no C7514."""
    c = G._compile_sm90(cfg)
    ptx, ttgir = c.asm["ptx"], c.asm["ttgir"]
    assert "wgmma.mma_async" in ptx
    assert "cp.async.bulk.tensor.2d.global.shared::cta" in ptx        # TMA store (global destination)
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in ptx    # TMA loads
    assert "cp.async.bulk.wait_group.read" in ptx and "fence.proxy.async" in ptx
    assert "st.global" not in ptx                                     # no register epilogue left
    assert "ttg.warp_specialize" in ttgir and "setmaxnreg" in ptx
    shared = int(c.metadata.shared)
    assert cfg.smem_bytes() <= shared <= SM90_SMEM_LIMIT
    assert shared - G.GluonConfig(128, 128, cfg.num_stages, overlap=False).smem_bytes() >= 2 * 64 * 128 * 2
    assert ".local" not in ptx
    rep = ptxas_sm90_or_skip(ptx, reason="no bundled ptxas")
    assert rep.spill_bytes == 0, rep.log
    assert "C7514" not in rep.log, "ptxas serialised the wgmmas"


def test_gluon_epi_host_rules():
    """Names, smem accounting, launch meta (existing configs' meta has no EPI_TMA key: their launches are unchanged),
    the TMA-ability test of D, and refusal of EPI_TMA on overlap/prefetch/pipe configs (before any CUDA check)."""
    if not G.available():
        pytest.skip("gluon not importable")
    assert G.GLUON_WS_128_S6_EPI.name() == "gluon_ws_128x128x128_s6_epi"
    assert G.GLUON_WS_128_S6_EPI.smem_bytes() == G.GLUON_WS_128_S6.smem_bytes() + 32768 <= SM90_SMEM_LIMIT
    for cfg in G.GLUON_CANDIDATES + G.GLUON_RETIRED:
        assert "EPI_TMA" not in G.ws_meta(cfg)
    assert G.ws_meta(G.GLUON_WS_128_S4_EPI)["EPI_TMA"] is True
    assert G.d_tma_ok(torch.empty(8, 1000, dtype=torch.bfloat16))
    assert not G.d_tma_ok(torch.empty(8, 1001, dtype=torch.bfloat16))
    assert not G.d_tma_ok(torch.empty(8, 1001, dtype=torch.bfloat16)[:, 1:])
    assert G.d_tma_ok(torch.empty(8, 1024, dtype=torch.bfloat16)[:, :1000])
    a = torch.zeros(128, 128).to(torch.float8_e4m3fn)
    d = torch.empty(128, 128, dtype=torch.bfloat16)
    for bad in (G.GluonConfig(128, 128, 4, overlap=True, epi_tma=True),
                G.GluonConfig(128, 128, 4, overlap=False, prefetch=True, epi_tma=True),
                G.GluonConfig(128, 128, 4, warp_spec=False, epi_tma=True)):
        with pytest.raises(ValueError, match="TMA-store epilogue"):
            G._launch_fp8_gluon(a, torch.ones(128, 1), a, torch.ones(1, 1), d, bad)
    # (the grouped kernels' TMA-store epilogue and its refusals: tests/test_grouped_gluon_epi.py)


@pytest.mark.parametrize("n, width, tma", [(1000, 1000, True), (1000, 1024, True), (1001, 1001, False),
                                           (203, 203, False)])
def test_gluon_epi_launch_args(monkeypatch, n, width, tma):
    """The launch _go_dense makes (kernel replaced by a recorder, CPU tensors): a TMA-able D goes in as a bf16
    TensorDescriptor (shape [M, N], row stride of D, block [64, 128], the kernel's signature string) with
    EPI_TMA=True; any other D as the tensor itself, without EPI_TMA (= the register-epilogue kernel of the same
    config) and without the caller's launcher (built for the TMA variant)."""
    if not G.available():
        pytest.skip("gluon not importable")
    calls = []

    class _Rec:
        def __getitem__(self, grid):
            return lambda *args, **meta: calls.append(("kernel", grid, args, meta))

    monkeypatch.setattr(G, "_fp8_gluon_ws_kernel", _Rec())
    m, k = 300, 256
    a = torch.zeros(m, k).to(torch.float8_e4m3fn)
    b = torch.zeros(n, k).to(torch.float8_e4m3fn)
    sfa, sfb = torch.ones(m, 2), torch.ones((n + 127) // 128, 2)
    d = torch.empty(m, width, dtype=torch.bfloat16)[:, :n]
    launcher = lambda grid, *args: calls.append(("launcher", grid, args, {}))  # noqa: E731
    for cfg in G.GLUON_EPI:
        calls.clear()
        G._go_dense(a, sfa, b, sfb, d, cfg, 3, launcher)
        ((kind, grid, args, meta),) = calls
        assert grid == (3, )
        if tma:
            assert kind == "launcher"
            desc = args[2]
            assert isinstance(desc, G.TensorDescriptor) and desc.base is d
            assert list(desc.shape) == [m, n] and list(desc.strides) == [width, 1]
            assert list(desc.block_shape) == [64, 128]
            from triton._C.libtriton import native_specialize_impl
            from triton.backends.compiler import BaseBackend
            ty = native_specialize_impl(BaseBackend, desc, False, True, True)[0]
            assert ty == f"tensordesc<bf16[64, 128],{G._d_smem_layout()!r}>"
        else:
            assert kind == "kernel" and args[2] is d
            assert "EPI_TMA" not in meta and meta["NUM_STAGES"] == cfg.num_stages
        calls.clear()
        G._go_dense(a, sfa, b, sfb, d, cfg, 3, None)
        ((kind, grid, args, meta),) = calls
        assert kind == "kernel" and (meta.get("EPI_TMA", False) is tma)


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("cfg", G.GLUON_EPI, ids=lambda c: c.name())
@pytest.mark.parametrize("shape", SHAPES_4096, ids=lambda s: "x".join(map(str, s)))
def test_gluon_epi_m4096(shape, cfg):
    _run_and_check(*shape, cfg)


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("cfg", G.GLUON_EPI, ids=lambda c: c.name())
@pytest.mark.parametrize("shape", [(300, 1000, 576), (1, 128, 128), (129, 200, 256), (64, 64, 384),
                                   (300, 1001, 576), (129, 203, 256)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gluon_epi_partial_tiles(shape, cfg):
    """Partial tiles clipped by the TMA unit (M 300 / 129 / 1: whole 64-row halves outside D; N 1000 / 200 / 64);
    N 1001 / 203 (N % 8 != 0, no descriptor possible): the register-epilogue fallback of the same config."""
    _run_and_check(*shape, cfg, sfa_mn_major=True)


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("cfg", G.GLUON_EPI, ids=lambda c: c.name())
def test_gluon_epi_strided_d(cfg):
    """D = the first 1000 columns of a [300, 1024] buffer (TMA-able, row stride 1024): the descriptor's shape clips
    the last N tile at column 1000, so the 24 columns after it stay poisoned."""
    _run_and_check(300, 1000, 576, cfg, d_width=1024)


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("cfg", G.GLUON_EPI, ids=lambda c: c.name())
@pytest.mark.parametrize("shape", [(1024, 1024, 1280), (1000, 1000, 256)], ids=lambda s: "x".join(map(str, s)))
def test_gluon_epi_small_grid_persistent(shape, cfg):
    """3 programs for 64 / 64 tiles: every warpgroup's epilogue buffer is rewritten ~21 times, the store_wait(0)
    before each rewrite is what keeps the previous tile's TMA store from reading a half-written buffer (K 256: only
    two K blocks between consecutive stores, the tightest case)."""
    _run_and_check(*shape, cfg, num_sms=3)


def _check_same_as_s4_epi(m, n, k, cfg):
    """``cfg`` passes :func:`_run_and_check` (poisoned D, calc_diff) and its D equals the S4 EPI build's bit for bit."""
    _run_and_check(m, n, k, cfg, sfa_mn_major=True)
    A, B = _inputs(m, n, k)
    d0 = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    d1 = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    G._launch_fp8_gluon(A[0], A[1], B[0], B[1], d0, G.GLUON_WS_128_S4_EPI)
    G._launch_fp8_gluon(A[0], A[1], B[0], B[1], d1, cfg)
    torch.cuda.synchronize()
    assert torch.equal(d0, d1), float((d0.float() - d1.float()).abs().max())


# ------------------------------------------------------------------ session 19: scales two blocks ahead (opt-in)
@pytest.mark.compile
@pytest.mark.parametrize("cfg", G.GLUON_SA + [dataclasses.replace(G.GLUON_WS_128_S4, scale_ahead=1)], ids=lambda c: c.name())
def test_scale_ahead_compiles_without_spills(cfg):
    """scale_ahead 1 / 2 (module docstring, "Scales ahead"): the K loop unrolled by two (8 QGMMA per innermost loop of
    each math warpgroup), no spills (ptxas), the shared memory of the same config without it."""
    from deepkernels.testing.compile import ptxas_sm90, sass_count, sass_loops
    k = G._compile_sm90(cfg)
    assert k.metadata.shared == G._compile_sm90(dataclasses.replace(cfg, scale_ahead=0)).metadata.shared
    rep = ptxas_sm90(k.asm["ptx"], sass=True)
    if rep is None:
        pytest.skip("ptxas not available")
    assert rep.spills == (0, 0), rep.spills
    loops = [lp for lp in sass_loops(rep.sass) if sass_count(lp, "QGMMA")]
    assert len(loops) == 2 and all(sass_count(lp, "QGMMA") == 8 for lp in loops)


def test_scale_ahead_launch_rules():
    """scale_ahead is an opt-in of the plain WS loop (not with overlap / prefetch, values 1 or 2 only), passed to the
    kernel only when set (the existing configs' launches and constexprs stay as they were)."""
    assert "SCALE_AHEAD" not in G.ws_meta(G.GLUON_WS_128_S4_EPI)
    assert G.ws_meta(G.GLUON_WS_128_S4_EPI_SA2)["SCALE_AHEAD"] == 2
    assert G.GLUON_WS_128_S4_EPI_SA1.name().endswith("_epi_sa1")
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0") or not G.available():
        pytest.skip("the launcher refuses before its config checks under the interpreter / without Gluon")
    a = torch.zeros(1, 128, dtype=torch.float8_e4m3fn)
    for bad in (dataclasses.replace(G.GLUON_WS_128_S4, scale_ahead=3), dataclasses.replace(G.GLUON_WS_128_S4_PF, scale_ahead=1)):
        with pytest.raises(ValueError, match="scale_ahead"):
            G._launch_fp8_gluon(a, torch.ones(1, 1), a, torch.ones(1, 1), torch.zeros(1, 1, dtype=torch.bfloat16),
                                bad)


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("cfg", G.GLUON_SA, ids=lambda c: c.name())
@pytest.mark.parametrize("shape", SHAPES_4096 + [(300, 1000, 576), (1, 128, 128), (129, 200, 256), (64, 64, 384),
                                                 (300, 1001, 576), (1000, 1000, 640)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gluon_scale_ahead_bit_identical(shape, cfg):
    """scale_ahead 1 / 2 change only when scales are loaded and when the ready barrier is waited for: D bit-identical
    to the S4 EPI build (poisoned outputs, 1-5 K blocks incl. odd counts and a masked K tail, partial tiles, N 1001
    on the register-epilogue fallback), and within the FP8 calc_diff bound of the float64 product."""
    _check_same_as_s4_epi(*shape, cfg)


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("cfg", G.GLUON_SA, ids=lambda c: c.name())
@pytest.mark.parametrize("shape", [(1024, 1024, 1280), (1000, 1000, 256), (1000, 1000, 384)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gluon_scale_ahead_small_grid_persistent(shape, cfg):
    """3 programs for 64 tiles: the ring phase and the two register sets carry across tiles (K 256 / 384: 2 / 3 K
    blocks per tile, the even / odd tails)."""
    _run_and_check(*shape, cfg, num_sms=3)


# ------------------------------------------------------------------ session 19: three math warpgroups (UNVERIFIED)
@pytest.mark.compile
@pytest.mark.parametrize("cfg", G.GLUON_3WG, ids=lambda c: c.name())
def test_three_wg_compiles_without_spills(cfg):
    """192-row tiles (BLOCK_M 192 of _fp8_gluon_ws_kernel; module docstring, "Three math warpgroups"): 512 threads at .maxnreg
    128, setmaxnreg 152 for the three math warpgroups (56 for the producer), 0 spills, one innermost K loop per math
    warpgroup (4 QGMMA plain, 8 with scale_ahead), shared memory within the sm90 limit and as accounted."""
    from deepkernels.testing.compile import ptxas_sm90, sass_count, sass_loops
    k = G._compile_sm90(cfg)
    ptx = k.asm["ptx"]
    assert ".reqntid 512" in ptx and ".maxnreg 128" in ptx
    assert re.findall(r"setmaxnreg\.inc\.sync\.aligned\.u32\s+(\d+)", ptx).count("152") == 3
    assert "setmaxnreg.dec.sync.aligned.u32 \t56" in ptx
    assert k.metadata.shared <= SM90_SMEM_LIMIT and k.metadata.shared >= cfg.smem_bytes()
    rep = ptxas_sm90(ptx, sass=True)
    if rep is None:
        pytest.skip("ptxas not available")
    assert rep.spills == (0, 0), rep.spills
    loops = [lp for lp in sass_loops(rep.sass) if sass_count(lp, "QGMMA")]
    assert len(loops) == 3 and all(sass_count(lp, "QGMMA") == 4 * (1 + (cfg.scale_ahead > 0)) for lp in loops)


def test_three_wg_kernel_selection():
    """The 192-row configs use a [64, 128] A box (one per math warpgroup); every other config a [block_m, 128] box."""
    assert G.GLUON_WS_192_S4_EPI.a_box() == 64
    for cfg in G.GLUON_CANDIDATES + G.GLUON_EPI + G.GLUON_SA:
        assert cfg.a_box() == cfg.block_m
    assert (G.GLUON_WS_192_S4_EPI.producer_regs + 3 * G.GLUON_WS_192_S4_EPI.math_regs) == 4 * 128


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("cfg", G.GLUON_3WG, ids=lambda c: c.name())
@pytest.mark.parametrize("shape", SHAPES_4096 + [(300, 1000, 576), (1, 128, 128), (129, 200, 256), (193, 64, 384),
                                                 (300, 1001, 576), (1000, 1000, 640)],
                         ids=lambda s: "x".join(map(str, s)))
def test_gluon_three_wg_bit_identical(shape, cfg):
    """Three math warpgroups on 192-row tiles: every row's accumulation is the S4 EPI build's (same K blocks, same
    products and FMA order), so D is bit-identical to it; poisoned outputs; partial tiles (M 300 / 129 / 193 / 1:
    rows past M zero-filled by TMA, stores clipped), N 1001 on the register-epilogue fallback."""
    _check_same_as_s4_epi(*shape, cfg)


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("cfg", G.GLUON_3WG, ids=lambda c: c.name())
def test_gluon_three_wg_small_grid_persistent(cfg):
    """3 programs for 6 x 8 tiles of 192 x 128: the ring phases (empty counting 3 arrivals) and the three epilogue
    buffers carry across tiles."""
    _run_and_check(1000, 1000, 640, cfg, num_sms=3)
