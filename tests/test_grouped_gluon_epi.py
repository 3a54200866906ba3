"""TMA-store epilogue (``EPI_TMA``) of the Gluon m-grouped FP8 kernels (``deepkernels.gemm._gluon_fp8``): configs
``GLUON_WS_128_S6_EPI`` (contiguous) / ``GLUON_WS_128_S4_EPI`` (masked), not dispatched by default
(``DEEPKERNELS_GROUPED_EPI=1`` swaps them in through the public ops), not yet run on a GPU when written.

- host tier (CPU): config selection (the env switch), kernel / meta selection, the D descriptor the launchers build
  (and the register-epilogue fallback for a D that TMA cannot address), the public plan's fallback.
- compile tier: both EPI kernels cross-compile for sm90 with the TMA store (``cp.async.bulk.tensor ... global.
  shared::cta``), bulk-group commit / wait and the async-proxy fence, fit the shared-memory limit, no local memory,
  no ptxas spills, no serialised wgmma; the register-epilogue configs' PTX has none of the TMA-store instructions.
- gpu tier: EPI output bit-identical to the register-epilogue config's output (both NaN-poisoned before the
  launch), padding rows exact zeros, rows >= masked_m[g] never written, calc_diff < 1e-3 against the dequantised
  product; aligned / 64-row-block / unaligned / per-row random group ids, all-padding tiles, N % 128 != 0,
  N % 8 != 0 (no descriptor: fallback), masked_m 0, 1, 63, 64, 65, 127, M_max (and clamped values), a non-packed
  masked D (fallback), a 3-program persistent grid, the public ops through the env switch, a CUDA graph.
"""
from dataclasses import replace

import pytest
import torch

from deepkernels.gemm import _gluon_fp8 as G
from deepkernels.testing import calc_diff
from deepkernels.testing.compile import SM90_SMEM_LIMIT, ptxas_sm90_or_skip
from test_grouped_gemm import contiguous_case, fp8_a3, fp8_b, nan

needs_gluon = pytest.mark.skipif(not G.available(), reason=f"gluon not importable: {G._IMPORT_ERROR!r}")

CONTIG_EPI = [G.GLUON_WS_128_S6_EPI]
MASKED_EPI = [G.GLUON_WS_128_S4_EPI, G.GLUON_WS_128_S6_EPI, G.GluonConfig(64, 128, 8, overlap=False, epi_tma=True)]
TMA_STORE = "cp.async.bulk.tensor.2d.global.shared::cta"


def _reg(cfg):
    """The register-epilogue twin of an EPI config."""
    return replace(cfg, epi_tma=False)



# ----------------------------------------------------------------------------------------------- host tier
@needs_gluon
def test_epi_config_switch(monkeypatch):
    """The grouped configs are their EPI twins by default (unset, "1", or anything but "0"; same envelope);
    DEEPKERNELS_GROUPED_EPI=0: the register-epilogue configs."""
    from deepkernels.gemm import grouped
    monkeypatch.setattr(grouped, "_gluon_gate", lambda is_fp8, d, cfg: (G, False))
    contig = lambda: grouped._gluon_contiguous_config(8192, 4096, 2048, True, True, None, 128, None)  # noqa: E731
    masked = lambda: grouped._gluon_masked_config(1024, 4096, 2048, 1024, True, None, None)  # noqa: E731
    for env in (None, "1"):
        if env is None:
            monkeypatch.delenv("DEEPKERNELS_GROUPED_EPI", raising=False)
        else:
            monkeypatch.setenv("DEEPKERNELS_GROUPED_EPI", env)
        assert contig() is G.GLUON_WS_128_S6_EPI and masked() is G.GLUON_WS_128_S4_EPI
    monkeypatch.setenv("DEEPKERNELS_GROUPED_EPI", "0")
    assert contig() is G.GLUON_WS_128_S6 and masked() is G.GLUON_WS_128_S4
    # K >= 7168 (session 19): the scales-ahead twins; with the switch off the register configs
    assert grouped._gluon_contiguous_config(8192, 4096, 7168, True, True, None, 128, None) is G.GLUON_WS_128_S6
    monkeypatch.delenv("DEEPKERNELS_GROUPED_EPI")
    assert grouped._gluon_contiguous_config(8192, 4096, 7168, True, True, None, 128, None) is G.GLUON_WS_128_S6_EPI_SA1
    assert grouped._gluon_masked_config(1024, 4096, 7168, 1024, True, None, None) is G.GLUON_WS_128_S4_EPI_SA1
    # outside the envelope: still the Triton kernel
    assert grouped._gluon_contiguous_config(4096, 4096, 7168, True, True, None, 128, None) is None
    assert grouped._gluon_masked_config(1024, 4096, 7168, 128, True, None, None) is None


@needs_gluon
def test_epi_kernels_meta_and_tma_rules():
    """EPI configs run their own entry points with the same constexpr keys (the register-epilogue kernels, their
    meta and parameter lists are unchanged); shared-memory accounting; which D is TMA-able."""
    for cfg in (G.GLUON_WS_128_S4, G.GLUON_WS_128_S6, G.GLUON_WS_128_S6_PF):
        assert G.m_contiguous_kernel(cfg) is G._fp8_gluon_m_contiguous_kernel
        assert G.m_masked_kernel(cfg) is G._fp8_gluon_m_masked_kernel
        assert "EPI_TMA" not in G.m_contiguous_meta(cfg) and "EPI_TMA" not in G.m_masked_meta(cfg)
    for cfg in CONTIG_EPI:
        assert G.m_contiguous_kernel(cfg) is G._fp8_gluon_m_contiguous_epi_kernel
        assert G.m_contiguous_meta(cfg) == G.m_contiguous_meta(_reg(cfg))
    for cfg in MASKED_EPI:
        assert G.m_masked_kernel(cfg) is G._fp8_gluon_m_masked_epi_kernel
        assert G.m_masked_meta(cfg) == G.m_masked_meta(_reg(cfg))
        assert cfg.smem_bytes() == _reg(cfg).smem_bytes() + cfg.block_m * cfg.block_n * 2 <= SM90_SMEM_LIMIT
    # the EPI entries: the register entry's parameters + d_desc, and (session 19) a trailing SCALE_AHEAD constexpr
    old = [p.name for p in G._fp8_gluon_m_contiguous_kernel.params]
    new = [p.name for p in G._fp8_gluon_m_contiguous_epi_kernel.params]
    assert new == old[:3] + ["d_desc"] + old[3:] + ["SCALE_AHEAD"]
    old = [p.name for p in G._fp8_gluon_m_masked_kernel.params]
    new = [p.name for p in G._fp8_gluon_m_masked_epi_kernel.params]
    assert new == old[:3] + ["d_desc"] + old[3:] + ["SCALE_AHEAD"]
    bf = torch.bfloat16
    assert G.masked_d_tma_ok(torch.empty(3, 40, 1000, dtype=bf))
    assert not G.masked_d_tma_ok(torch.empty(3, 40, 1001, dtype=bf))                # row stride % 8 != 0
    assert not G.masked_d_tma_ok(torch.empty(3, 48, 1000, dtype=bf)[:, :40])         # groups not packed
    assert G.masked_d_tma_ok(torch.empty(1, 48, 1000, dtype=bf)[:, :40])             # one group: no packing needed
    assert G.masked_d_tma_ok(torch.empty(3, 40, 1024, dtype=bf)[:, :, :1000])        # column slice, packed rows
    assert not G.masked_d_tma_ok(torch.empty(3, 40, 1001, dtype=bf)[:, :, 1:])       # unaligned base


class _Rec:
    def __init__(self, calls, name):
        self.calls, self.name = calls, name

    def __getitem__(self, grid):
        return lambda *args, **meta: self.calls.append((self.name, grid, args, meta))


def _check_desc(desc, base, shape, row_stride):
    assert isinstance(desc, G.TensorDescriptor) and desc.base is base
    assert list(desc.shape) == shape and list(desc.strides) == [row_stride, 1]
    assert list(desc.block_shape) == [64, 128]


@needs_gluon
@pytest.mark.parametrize("n, width, tma", [(1000, 1000, True), (4160, 4160, True), (1000, 1024, True),
                                           (1001, 1001, False)])
def test_epi_contiguous_launch_args(monkeypatch, n, width, tma):
    """The launch _go_m_contiguous makes (kernels replaced by recorders, CPU tensors): a TMA-able D goes to the EPI
    kernel as (d, descriptor [M, N] / row stride / block [64, 128]) through the caller's launcher; any other D to the
    register-epilogue kernel with the pre-existing argument list, without the caller's launcher."""
    calls = []
    monkeypatch.setattr(G, "_fp8_gluon_m_contiguous_kernel", _Rec(calls, "reg"))
    monkeypatch.setattr(G, "_fp8_gluon_m_contiguous_epi_kernel", _Rec(calls, "epi"))
    m, k, g = 300, 256, 3
    a = torch.zeros(m, k).to(torch.float8_e4m3fn)
    b = torch.zeros(g, n, k).to(torch.float8_e4m3fn)
    sfa, sfb = torch.ones(m, 2), torch.ones(g, (n + 127) // 128, 2)
    gid = torch.zeros(m, dtype=torch.int32)
    d = torch.empty(m, width, dtype=torch.bfloat16)[:, :n]
    launcher = lambda grid, *args: calls.append(("launcher", grid, args, {}))  # noqa: E731
    for cfg in CONTIG_EPI:
        for lch in (launcher, None):
            calls.clear()
            G._go_m_contiguous(a, sfa, b, sfb, d, gid, cfg, 3, lch)
            ((kind, grid, args, meta),) = calls
            assert grid == (3, ) and args[2] is d
            if tma:
                assert kind == ("launcher" if lch else "epi")
                _check_desc(args[3], d, [m, n], width)
                assert args[4] is sfa and len(args) == 18
            else:
                assert kind == "reg" and args[3] is sfa and len(args) == 17
            if kind != "launcher":
                assert meta == G.m_contiguous_meta(cfg)


@needs_gluon
@pytest.mark.parametrize("case", ["packed", "one_group_strided", "strided_groups", "odd_n"])
def test_epi_masked_launch_args(monkeypatch, case):
    """_go_m_masked: the descriptor is over D viewed as [G * M_max, N] (row stride d.stride(1)); a D whose groups are
    not packed, or whose rows TMA cannot address, runs the register-epilogue kernel."""
    calls = []
    monkeypatch.setattr(G, "_fp8_gluon_m_masked_kernel", _Rec(calls, "reg"))
    monkeypatch.setattr(G, "_fp8_gluon_m_masked_epi_kernel", _Rec(calls, "epi"))
    g, m_max, k, n = (1 if case == "one_group_strided" else 3), 200, 256, (1001 if case == "odd_n" else 1000)
    a = torch.zeros(g, m_max, k).to(torch.float8_e4m3fn)
    b = torch.zeros(g, n, k).to(torch.float8_e4m3fn)
    sfa, sfb = torch.ones(g, m_max, 2), torch.ones(g, (n + 127) // 128, 2)
    mm = torch.zeros(g, dtype=torch.int32)
    rows = m_max + (64 if "strided" in case else 0)
    d = torch.empty(g, rows, n, dtype=torch.bfloat16)[:, :m_max]
    tma = case in ("packed", "one_group_strided")
    for cfg in MASKED_EPI:
        calls.clear()
        G._go_m_masked(a, sfa, b, sfb, d, mm, cfg, 5, None)
        ((kind, grid, args, meta),) = calls
        assert grid == (5, ) and args[2] is d and meta == G.m_masked_meta(cfg)
        if tma:
            assert kind == "epi" and len(args) == 20
            _check_desc(args[3], d, [g * m_max, n], n)
        else:
            assert kind == "reg" and len(args) == 19 and args[3] is sfa


@needs_gluon
@pytest.mark.parametrize("masked", [False, True])
def test_epi_public_plan_falls_back_for_untmaable_d(monkeypatch, masked):
    """_GluonPlan with an EPI config: TMA-able d -> the EPI kernel's KernelLauncher and the EPI config; otherwise the
    register-epilogue twin and its kernel, for good (d's strides / alignment are in the plan's signature)."""
    from deepkernels.gemm import grouped
    seen = []
    rec = lambda *a, **k: seen.append((a[6], a[-1]))  # noqa: E731  (config, launcher)
    monkeypatch.setattr(G, "_launch_fp8_gluon_m_masked" if masked else "_launch_fp8_gluon_m_contiguous", rec)
    z = torch.zeros(1, 1)
    for n, tma in ((1024, True), (1001, False)):
        d = torch.empty((2, 64, n) if masked else (64, n), dtype=torch.bfloat16)
        cfg = G.GLUON_WS_128_S4_EPI if masked else G.GLUON_WS_128_S6_EPI
        plan = grouped._GluonPlan(cfg, masked)
        seen.clear()
        plan(z, z, d, z, z, z)
        ((used, launcher),) = seen
        assert used.epi_tma is tma and plan.config is used
        want = (G.m_masked_kernel if masked else G.m_contiguous_kernel)(used)
        assert launcher.fn is want and launcher.cache_descriptors
        assert (want is (G._fp8_gluon_m_masked_epi_kernel if masked else G._fp8_gluon_m_contiguous_epi_kernel)) is tma


@needs_gluon
def test_epi_launchers_refuse_prefetch_and_overlap():
    a = torch.zeros(128, 128).to(torch.float8_e4m3fn)
    d = torch.empty(128, 128, dtype=torch.bfloat16)
    for bad in (G.GluonConfig(128, 128, 6, overlap=False, prefetch=True, epi_tma=True),
                G.GluonConfig(128, 128, 4, overlap=True, epi_tma=True)):
        with pytest.raises(ValueError, match="contiguous"):
            G._launch_fp8_gluon_m_contiguous(a, torch.ones(128, 1), a[None], torch.ones(1, 1, 1), d,
                                             torch.zeros(128, dtype=torch.int32), bad)
        with pytest.raises(ValueError, match="masked"):
            G._launch_fp8_gluon_m_masked(a[None], torch.ones(1, 128, 1), a[None], torch.ones(1, 1, 1), d[None],
                                         torch.zeros(1, dtype=torch.int32), bad)


# ----------------------------------------------------------------------------------------------- compile tier
def _check_epi_compiled(c, cfg):
    ptx, ttgir = c.asm["ptx"], c.asm["ttgir"]
    assert "wgmma.mma_async" in ptx
    assert TMA_STORE in ptx                                           # TMA store (global destination)
    assert "cp.async.bulk.tensor.2d.shared::cluster.global" in ptx    # TMA loads
    assert "cp.async.bulk.commit_group" in ptx and "cp.async.bulk.wait_group.read" in ptx
    assert "fence.proxy.async" in ptx
    assert "st.global" in ptx                                         # the register store of mixed slices stays
    assert "ttg.warp_specialize" in ttgir and "setmaxnreg" in ptx
    shared = int(c.metadata.shared)
    assert cfg.smem_bytes() <= shared <= SM90_SMEM_LIMIT, shared
    assert ".local" not in ptx
    rep = ptxas_sm90_or_skip(ptx, reason="no bundled ptxas")
    assert rep.spill_bytes == 0, rep.log
    assert "C7514" not in rep.log, "ptxas serialised the wgmmas"
    return shared


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("cfg", CONTIG_EPI, ids=lambda c: c.name())
def test_epi_contiguous_compiles_for_sm90(cfg):
    c = G._compile_sm90_m_contiguous(cfg)
    shared = _check_epi_compiled(c, cfg)
    ref = int(G._compile_sm90_m_contiguous(_reg(cfg)).metadata.shared)
    assert shared - ref >= 2 * 64 * cfg.block_n * 2                  # two bf16 [64, BLOCK_N] buffers


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("cfg", MASKED_EPI, ids=lambda c: c.name())
def test_epi_masked_compiles_for_sm90(cfg):
    c = G._compile_sm90_m_masked(cfg)
    shared = _check_epi_compiled(c, cfg)
    ref = int(G._compile_sm90_m_masked(_reg(cfg)).metadata.shared)
    assert shared - ref >= (cfg.block_m // 64) * 64 * cfg.block_n * 2


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("kind, cfg", [("contiguous", G.GLUON_WS_128_S6), ("contiguous", G.GLUON_WS_128_S6_PF),
                                       ("contiguous", G.GLUON_WS_128_S4), ("masked", G.GLUON_WS_128_S4),
                                       ("masked", G.GLUON_WS_128_S6),
                                       ("masked", G.GluonConfig(64, 128, 8, overlap=False))],
                         ids=lambda x: x if isinstance(x, str) else x.name())
def test_register_epilogue_configs_have_no_tma_store(kind, cfg):
    """EPI_TMA defaults to False: the existing configs' kernels contain none of the TMA-store instructions (their
    cleaned PTX was also compared before/after the change by hand: identical)."""
    c = (G._compile_sm90_m_contiguous if kind == "contiguous" else G._compile_sm90_m_masked)(cfg)
    ptx = c.asm["ptx"]
    assert "global.shared::cta" not in ptx and "cp.async.bulk.commit_group" not in ptx
    assert "cp.async.bulk.wait_group" not in ptx and "fence.proxy.async" not in ptx
    assert "st.global" in ptx


# ----------------------------------------------------------------------------------------------- gpu tier
def _deq(X, gran_rows):
    data, sf = X
    k = data.shape[-1]
    sf = sf.float().repeat_interleave(gran_rows, -2)[..., :data.shape[-2], :].repeat_interleave(128, -1)[..., :k]
    return data.float() * sf


def _same(x, y):
    torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)


def _layout(case, g):
    """Per-row group ids (int32 list) for the contiguous cases."""
    gen = torch.Generator().manual_seed(1234)
    if case == "aligned":       # production: 128-aligned groups with -1 padding
        out = []
        for i in range(g):
            c = int(torch.randint(300, 900, (1,), generator=gen))
            out += [i] * c + [-1] * (-(-c // 128) * 128 - c)
        return out + [-1] * 256                       # two all-padding tiles: TMA-stored zero tiles
    if case == "blocks64":      # shuffled 64-row blocks: pure slices, tiles mixing two groups (two passes)
        blocks = [i % (g + 1) - 1 for i in range(4 * (g + 1))]
        perm = torch.randperm(len(blocks), generator=gen).tolist()
        return [x for j in perm for x in [blocks[j]] * 64]
    if case == "unaligned":     # groups back to back, no padding, sizes not multiples of 64 (last tile partial)
        out = []
        for i, c in enumerate((100, 37, 200, 5, 131)[:g]):
            out += [i] * c
        return out
    if case == "random":        # every row its own id, ids outside [0, G) included: almost no pure slice
        return torch.randint(-1, g + 1, (700, ), generator=gen).tolist()
    raise ValueError(case)


def _contig_run(cfg, A, B, gl, n, sms=None, d=None):
    d = nan(gl.numel(), n, device="cuda") if d is None else d.fill_(float("nan"))
    G._launch_fp8_gluon_m_contiguous(A[0], A[1], B[0], B[1], d, gl, cfg, num_sms=sms)
    torch.cuda.synchronize()
    return d


def _contig_check(d, A, B, gl, g):
    assert not torch.isnan(d).any(), "unwritten output rows"
    pad = (gl < 0) | (gl >= g)
    assert (d[pad] == 0).all(), "padding rows must be exactly zero"
    aq, bq = _deq(A, 1), _deq(B, 128)
    want = torch.zeros(d.shape, dtype=torch.float32, device=d.device)
    for i in range(g):
        rows = gl == i
        want[rows] = aq[rows] @ bq[i].T
    assert calc_diff(d.float(), want) < 1e-3


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("cfg", CONTIG_EPI, ids=lambda c: c.name())
@pytest.mark.parametrize("case, g, n, k, sms", [
    ("aligned", 4, 4096, 2048, None), ("aligned", 3, 1000, 512, 3), ("blocks64", 3, 4160, 1024, None),
    ("unaligned", 5, 4160, 1024, None), ("unaligned", 5, 1001, 512, None), ("random", 3, 1000, 512, None)])
def test_epi_contiguous_bit_identical(cfg, case, g, n, k, sms):
    """Direct launches: EPI == register epilogue bit for bit, every row written, padding rows exactly zero, calc_diff
    < 1e-3. N 4160 / 1000: last N tile clipped by the TMA unit; N 1001: no descriptor (the same config with the
    register epilogue); 3 programs: each epilogue buffer reused many times."""
    gl = torch.tensor(_layout(case, g), dtype=torch.int32, device="cuda")
    A, B, gl = contiguous_case(gl, g, n, k, "cuda")
    ref = _contig_run(_reg(cfg), A, B, gl, n, sms)
    out = _contig_run(cfg, A, B, gl, n, sms)
    _same(out, ref)
    _contig_check(out, A, B, gl, g)


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("case, n", [("aligned", 4160), ("unaligned", 4096), ("random", 1001)])
def test_epi_contiguous_public_switch(monkeypatch, case, n):
    """The public op with DEEPKERNELS_GROUPED_EPI=1 (and DEEPKERNELS_GROUPED_GLUON=1 where the layout is outside the
    default envelope): the cached plan runs the EPI config (N 1001: its register twin), repeat calls on the fast
    launch path, bit-identical to the register-epilogue public call."""
    import deepkernels as dk
    from deepkernels.gemm import grouped
    g, k = 4, 1024
    gl = torch.tensor(_layout(case, g), dtype=torch.int32, device="cuda")
    A, B, gl = contiguous_case(gl, g, n, k, "cuda")
    monkeypatch.setenv("DEEPKERNELS_GROUPED_GLUON", "1")
    monkeypatch.delenv("DEEPKERNELS_DISABLE_GLUON", raising=False)
    outs = {}
    for epi in ("0", "1"):
        monkeypatch.setenv("DEEPKERNELS_GROUPED_EPI", epi)
        grouped._PLANS.clear()
        for _ in range(3):
            d = nan(gl.numel(), n, device="cuda")
            dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl)
        torch.cuda.synchronize()
        (run,) = grouped._PLANS.values()
        assert isinstance(run.plan, grouped._GluonPlan)
        assert run.plan.config.epi_tma is (epi == "1" and n % 8 == 0)
        assert run.plan.launcher.fast_calls >= 1
        outs[epi] = d
    grouped._PLANS.clear()
    _same(outs["1"], outs["0"])
    _contig_check(outs["1"], A, B, gl, g)


MASKED_COUNTS = [0, 1, 63, 64, 65, 127, 320, -3, 999]   # M_max = 320; -3 and 999 are clamped to 0 and M_max


def _masked_run(cfg, A, B, mm, sms, d):
    d.fill_(float("nan"))
    G._launch_fp8_gluon_m_masked(A[0], A[1], B[0], B[1], d, mm, cfg, num_sms=sms)
    torch.cuda.synchronize()
    return d


def _masked_check(d, A, B, counts):
    m_max = d.shape[1]
    aq, bq = _deq(A, 1), _deq(B, 128)
    for i, mg in enumerate(counts):
        mg = min(max(mg, 0), m_max)
        assert torch.isnan(d[i, mg:]).all(), f"group {i}: rows >= masked_m written"
        if mg:
            assert not torch.isnan(d[i, :mg]).any(), f"group {i}: valid rows not written"
            assert calc_diff(d[i, :mg].float(), aq[i, :mg] @ bq[i].T) < 1e-3


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("cfg, n, k, sms, d_rows", [
    (MASKED_EPI[0], 4096, 1024, None, None), (MASKED_EPI[0], 1088, 512, 3, None), (MASKED_EPI[0], 1000, 512, None, 384),
    (MASKED_EPI[1], 1088, 512, 3, None), (MASKED_EPI[2], 4096, 1024, None, None)],
    ids=lambda x: x.name() if hasattr(x, "name") else str(x))
def test_epi_masked_bit_identical(cfg, n, k, sms, d_rows):
    """masked_m 0 / 1 / 63 / 64 / 65 / 127 / M_max / clamped: EPI == register epilogue bit for bit, rows >= m_g still
    NaN, calc_diff < 1e-3. N 1088 / 1000: clipped last N tile; 3 programs; d_rows 384: D's groups are rows
    [0, 320) of a [G, 384, N] buffer (not one [G * M_max, N] matrix: the register-epilogue fallback), the rows
    320..383 must stay NaN too."""
    g, m_max = len(MASKED_COUNTS), 320
    _, A = fp8_a3(g, m_max, k, "cuda")
    _, B = fp8_b(g, n, k, "cuda")
    mm = torch.tensor(MASKED_COUNTS, dtype=torch.int32, device="cuda")
    bufs = [nan(g, d_rows or m_max, n, device="cuda") for _ in range(2)]
    ref = _masked_run(_reg(cfg), A, B, mm, sms, bufs[0][:, :m_max])
    out = _masked_run(cfg, A, B, mm, sms, bufs[1][:, :m_max])
    _same(out, ref)
    _masked_check(out, A, B, MASKED_COUNTS)
    assert torch.isnan(bufs[1][:, m_max:]).all()


@pytest.mark.gpu
@needs_gluon
def test_epi_masked_public_switch_and_graph(monkeypatch):
    """The public masked op inside the Gluon envelope with DEEPKERNELS_GROUPED_EPI=1: the plan runs
    GLUON_WS_128_S4_EPI on the fast launch path, bit-identical to the register-epilogue call; a CUDA graph of the
    call replays with new counts (rows >= masked_m stay NaN every time)."""
    import deepkernels as dk
    from deepkernels.gemm import grouped
    from deepkernels.reference import grouped_gemm as R
    from test_grouped_gemm import check_masked
    monkeypatch.delenv("DEEPKERNELS_GROUPED_GLUON", raising=False)
    monkeypatch.delenv("DEEPKERNELS_DISABLE_GLUON", raising=False)
    g, m_max, n, k = 3, 384, 4096, 2048
    _, A = fp8_a3(g, m_max, k, "cuda")
    _, B = fp8_b(g, n, k, "cuda")
    mm = torch.tensor([256, 0, 383], dtype=torch.int32, device="cuda")
    outs = {}
    for epi in ("0", "1"):
        monkeypatch.setenv("DEEPKERNELS_GROUPED_EPI", epi)
        grouped._PLANS.clear()
        for _ in range(3):
            d = nan(g, m_max, n, device="cuda")
            dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, 256)
        torch.cuda.synchronize()
        (plan,) = grouped._PLANS.values()
        assert isinstance(plan, grouped._GluonPlan) and plan.masked
        assert plan.config is (G.GLUON_WS_128_S4_EPI if epi == "1" else G.GLUON_WS_128_S4)
        assert plan.launcher.fast_calls >= 1
        outs[epi] = d
    _same(outs["1"], outs["0"])
    check_masked(outs["1"], lambda out: R.m_grouped_fp8_gemm_masked_ref(A, B, out, mm), mm)
    d = outs["1"]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, 256)
    for counts in ([384, 1, 0], [0, 255, 257], [64, 65, 127]):
        mm.copy_(torch.tensor(counts, dtype=torch.int32))
        d.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check_masked(d, lambda out: R.m_grouped_fp8_gemm_masked_ref(A, B, out, mm), mm)
    grouped._PLANS.clear()


# ------------------------------------------------------------------ session 19: scales two blocks ahead (opt-in)
CONTIG_SA = replace(G.GLUON_WS_128_S6_EPI, scale_ahead=1)
MASKED_SA = replace(G.GLUON_WS_128_S4_EPI, scale_ahead=1)


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("kind", ["contiguous", "masked"])
def test_scale_ahead_grouped_compiles(kind):
    """scale_ahead=1 on the grouped TMA-store entries: the unrolled K loop (8 QGMMA per innermost loop), no spills,
    the shared memory of the same config without it; on the register entries the launchers refuse it."""
    from deepkernels.testing.compile import sass_count, sass_loops
    comp = G._compile_sm90_m_contiguous if kind == "contiguous" else G._compile_sm90_m_masked
    cfg = CONTIG_SA if kind == "contiguous" else MASKED_SA
    c = comp(cfg)
    assert c.metadata.shared == comp(replace(cfg, scale_ahead=0)).metadata.shared
    rep = ptxas_sm90_or_skip(c.asm["ptx"], sass=True)
    assert rep.spills == (0, 0), rep.spills
    loops = [lp for lp in sass_loops(rep.sass) if sass_count(lp, "QGMMA")]
    assert len(loops) == 2 and all(sass_count(lp, "QGMMA") == 8 for lp in loops)


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("case, g, n, k, sms", [
    ("aligned", 4, 4096, 7168, None), ("aligned", 3, 1000, 384, 3), ("blocks64", 3, 4160, 1024, None),
    ("unaligned", 5, 4160, 1152, None), ("unaligned", 5, 1001, 512, None), ("random", 3, 1000, 640, None)])
def test_scale_ahead_contiguous_bit_identical(case, g, n, k, sms):
    """Contiguous with scale_ahead=1: bit-identical to S6 EPI (odd / even K block counts 3, 5, 8, 9, 56; tiles mixing
    groups, padding rows exactly zero; N 1001: the register fallback, which drops scale_ahead)."""
    gl = torch.tensor(_layout(case, g), dtype=torch.int32, device="cuda")
    A, B, gl = contiguous_case(gl, g, n, k, "cuda")
    ref = _contig_run(G.GLUON_WS_128_S6_EPI, A, B, gl, n, sms)
    out = _contig_run(CONTIG_SA, A, B, gl, n, sms)
    _same(out, ref)
    _contig_check(out, A, B, gl, g)


@pytest.mark.gpu
@needs_gluon
@pytest.mark.parametrize("n, k, sms, d_rows", [(4096, 7168, None, None), (1088, 384, 3, None), (1000, 640, None, 384)])
def test_scale_ahead_masked_bit_identical(n, k, sms, d_rows):
    """Masked with scale_ahead=1: masked_m 0 / 1 / 63 / 64 / 65 / 127 / M_max / clamped, bit-identical to S4 EPI, rows
    >= m_g still NaN; d_rows 384: the register fallback."""
    g, m_max = len(MASKED_COUNTS), 320
    _, A = fp8_a3(g, m_max, k, "cuda")
    _, B = fp8_b(g, n, k, "cuda")
    mm = torch.tensor(MASKED_COUNTS, dtype=torch.int32, device="cuda")
    bufs = [nan(g, d_rows or m_max, n, device="cuda") for _ in range(2)]
    ref = _masked_run(G.GLUON_WS_128_S4_EPI, A, B, mm, sms, bufs[0][:, :m_max])
    out = _masked_run(MASKED_SA, A, B, mm, sms, bufs[1][:, :m_max])
    _same(out, ref)
    _masked_check(out, A, B, MASKED_COUNTS)
    assert torch.isnan(bufs[1][:, m_max:]).all()
