"""Small-M (M <= 128) Gluon FP8 GEMM (``deepkernels.gemm._gluon_fp8_small``, session 20, not dispatched).

- compile tier (CPU): every SMALL_CANDIDATES config cross-compiles for sm90 with wgmma + TMA + mbarrier, warp
  specialisation, <= 227 KB shared memory, no local memory, 0 ptxas spills, no serialised wgmma (C7514); the fixup
  configs carry the acq_rel GPU-scope counter atomic; host rules (split plan, config picker, argument checks).
- gpu tier: the 12 issue-#3 shapes and M in {1, 7, 33, 100} x the six DeepSeek-V3 (N, K), NaN-poisoned D, calc_diff
  < 1e-3 against the float64 product and < 1e-6 against the dispatched ``dk.fp8_gemm_nt``; both reduction modes,
  partial N tiles, K tails, strided D, MN-major sfa, a small persistent grid, repeated calls and a CUDA graph (the
  counters must stay zeroed). ``bitident`` tests (reported separately by the device script): D bit-identical to the
  dispatched Triton path when the split and BLOCK_N are the table's.
"""
import re

import pytest
import torch

from deepkernels.gemm import _gluon_fp8_small as S
from deepkernels.testing.compile import SM90_SMEM_LIMIT, ptxas_sm90_or_skip

needs_gluon = pytest.mark.skipif(not S.available(), reason=f"gluon not importable: {S._IMPORT_ERROR!r}")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]
SHAPES_12 = [(m, n, k) for m in (64, 128) for n, k in NK]
SHAPES_ODD_M = [(m, n, k) for m in (1, 7, 33, 100) for n, k in NK]


# ------------------------------------------------------------------------------------------------ compile tier
@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("cfg", S.SMALL_CANDIDATES, ids=lambda c: c.name())
def test_small_config_compiles_for_sm90(cfg):
    c = S._compile_sm90_small(cfg)
    ptx, ttgir = c.asm["ptx"], c.asm["ttgir"]
    assert "wgmma.mma_async" in ptx
    assert "cp.async.bulk.tensor" in ptx
    assert "mbarrier" in ptx
    assert "ttg.warp_specialize" in ttgir
    assert "setmaxnreg" in ptx
    assert int(c.metadata.shared) <= SM90_SMEM_LIMIT
    assert ".local" not in ptx
    if cfg.split > 1 and cfg.mode == "fixup":
        assert "atom.global.gpu.acq_rel.add" in ptx
        assert "ld.global.cg" in ptx
    else:
        assert "atom." not in ptx
    rep = ptxas_sm90_or_skip(ptx, reason="no bundled ptxas")
    assert rep.spill_bytes == 0, rep.log
    assert "C7514" not in rep.log, "ptxas serialised the wgmmas"


def test_split_plan_covers_every_block():
    for num_kb in (1, 2, 3, 4, 12, 16, 56, 57, 128):
        for split in range(1, 20):
            s_eff, kps = S.split_plan(num_kb, split)
            ranges = [(s * kps, min(s * kps + kps, num_kb)) for s in range(s_eff)]
            assert all(b > a for a, b in ranges), (num_kb, split)        # no empty split
            assert ranges[0][0] == 0 and ranges[-1][1] == num_kb
            assert all(ranges[i][1] == ranges[i + 1][0] for i in range(s_eff - 1))
            assert s_eff <= max(1, min(split, num_kb))


@pytest.mark.parametrize("m", [1, 7, 33, 64, 65, 100, 128])
@pytest.mark.parametrize("n, k", NK + [(1000, 1088), (576, 128)])
def test_pick_config_rules(m, n, k):
    cfg = S.pick_config(m, n, k, 132)
    assert cfg.block_m == (64 if m <= 64 else 128)
    assert cfg.block_n in (64, 128) and cfg.mode == "fixup"
    s_eff, _ = S.split_plan(-(-k // 128), cfg.split)
    assert s_eff == cfg.split and s_eff * m * n < 2 ** 31
    assert cfg.smem_bytes() <= SM90_SMEM_LIMIT
    assert cfg.maxnreg() in (136, 168)


def test_pick_config_fills_the_sms():
    """The picked items (N tiles x splits) leave at most 15 % of the last wave idle at the 12 shapes."""
    for m, n, k in SHAPES_12:
        cfg = S.pick_config(m, n, k, 132)
        items = -(-n // cfg.block_n) * cfg.split
        waves = -(-items // 132)
        assert items / (waves * 132) >= 0.84, (m, n, k, cfg, items)


@pytest.mark.parametrize("m, n, k, cfg, mode", [
    (64, 4096, 7168, None, 2), (128, 32768, 512, None, 0), (100, 1000, 3072, S.SmallConfig(128, 64, split=3,
                                                                                          mode="reduce"), 1),
    (1, 2112, 7168, S.SmallConfig(64, 64, split=4), 2), (7, 576, 128, S.SmallConfig(64, 128, split=4), 0)])
def test_small_host_launch_args(monkeypatch, m, n, k, cfg, mode):
    """CPU: the host half of a launch with the TMA descriptor, the compiled-kernel launcher and the reduce stubbed:
    one argument per non-constexpr kernel parameter, in order; grid = min(items, SMs); split / K blocks per split
    from split_plan; the workspace [S, M, N] fp32 only when K is split; counters only in fixup mode; the reduce
    kernel only in reduce mode; the constexprs (split mode, ring depth, registers)."""
    from deepkernels.gemm import dense
    calls = {}

    class Desc:
        def __init__(self, t, shape, strides, block, layout):
            self.args = (shape, strides, block)

    class Launcher:
        def __call__(self, grid, *args):
            calls["grid"], calls["args"] = grid, args

    def fake_cached(cache, fn, key, meta, cache_descriptors=False):
        calls["meta"] = meta() if callable(meta) else meta
        calls["fn"] = fn
        return Launcher()

    monkeypatch.setattr(S, "TensorDescriptor", Desc)
    monkeypatch.setattr(S, "cached_launcher", fake_cached)
    monkeypatch.setattr(S, "_counters", lambda dev, need: torch.zeros(need, dtype=torch.int32))
    monkeypatch.setattr(dense, "_splitk_finish", lambda ws, d, acc, sk: calls.__setitem__("reduce", (ws.shape, sk)))
    kb = -(-k // 128)
    a = torch.zeros(m, k, dtype=torch.float8_e4m3fn)
    b = torch.zeros(n, k, dtype=torch.float8_e4m3fn)
    sfa, sfb = torch.ones(m, kb), torch.ones(-(-n // 128), kb)
    d = torch.empty(m, n, dtype=torch.bfloat16)
    S._go_small(a, sfa, b, sfb, d, cfg, 132)
    cfg = cfg or S.pick_config(m, n, k, 132)
    s_eff, kps = S.split_plan(kb, cfg.split)
    params = [p.name for p in S._fp8_small_kernel.params if not p.is_constexpr] if S.available() else None
    args = calls["args"]
    if params is not None:
        assert len(args) == len(params), (len(args), params)
        named = dict(zip(params, args))
        assert (named["M"], named["N"], named["K"], named["S"], named["KPS"]) == (m, n, k, s_eff, kps)
        assert named["num_progs"] == calls["grid"][0] == min(-(-n // cfg.block_n) * s_eff, 132)
        assert named["d_ptr"] is d and named["sfa_ptr"] is sfa and named["sfb_ptr"] is sfb
        assert named["stride_dm"] == d.stride(0) and named["sfa_sk"] == sfa.stride(1)
        assert named["a_desc"].args[2] == [cfg.block_m, 128] and named["b_desc"].args[2] == [cfg.block_n, 128]
        if s_eff > 1:
            assert tuple(named["ws_ptr"].shape) == (s_eff, m, n) and named["ws_ptr"].dtype == torch.float32
        if mode == 2:
            assert named["cnt_ptr"].dtype == torch.int32
    assert calls["meta"]["SPLIT_MODE"] == mode
    assert calls["meta"]["NUM_STAGES"] == cfg.stages() and calls["meta"]["maxnreg"] == cfg.maxnreg()
    assert ("reduce" in calls) == (mode == 1)
    if mode == 1:
        assert calls["reduce"] == ((s_eff, m, n), s_eff)


def test_small_refuses_bad_inputs():
    if not S.available():
        pytest.skip("gluon not importable")
    a = torch.zeros(64, 128).to(torch.float8_e4m3fn)
    with pytest.raises((ValueError, RuntimeError)):   # CPU tensors
        S.launch_fp8_gemm_small(a, torch.ones(64, 1), a, torch.ones(1, 1), torch.empty(64, 64, dtype=torch.bfloat16))


# ------------------------------------------------------------------------------------------------ gpu tier
def _inputs(m, n, k, seed=0):
    from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g)
    return per_token_cast_to_fp8(a, use_ue8m0=False), per_block_cast_to_fp8(b, use_ue8m0=False)


def _ref64(A, B, k):
    sa = A[1].double().repeat_interleave(128, 1)[:, :k]
    sb = B[1].double().repeat_interleave(128, 0)[:B[0].shape[0]].repeat_interleave(128, 1)[:, :k]
    return (A[0].double() * sa) @ (B[0].double() * sb).T


def _run(A, B, n, cfg=None, sfa=None, d_width=None, num_sms=None):
    m = A[0].shape[0]
    full = torch.full((m, d_width or n), float("nan"), device="cuda", dtype=torch.bfloat16)
    d = full[:, :n]
    S.launch_fp8_gemm_small(A[0], A[1] if sfa is None else sfa, B[0], B[1], d, cfg, num_sms=num_sms)
    torch.cuda.synchronize()
    return d, full


def _check(d, A, B, k, what):
    from deepkernels.testing import calc_diff
    assert not torch.isnan(d).any(), f"{what}: unwritten output elements"
    diff = float(calc_diff(d.double(), _ref64(A, B, k)))
    assert diff < 1e-3, f"{what}: calc_diff {diff}"


def _dispatched(A, B, m, n):
    import deepkernels as dk
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    dk.fp8_gemm_nt(A, B, d)
    torch.cuda.synchronize()
    return d


def _counters_zero():
    return all(int(b.abs().sum()) == 0 for b in S._KEEP)


@pytest.mark.gpu
@needs_gluon
@needs_cuda
@pytest.mark.parametrize("shape", SHAPES_12 + SHAPES_ODD_M, ids=lambda s: "x".join(map(str, s)))
def test_small_vs_reference_and_dispatched(shape):
    from deepkernels.testing import calc_diff
    m, n, k = shape
    A, B = _inputs(m, n, k)
    d, _ = _run(A, B, n)
    _check(d, A, B, k, f"auto {S.pick_config(m, n, k, S._num_sms(d.device)).name()} {shape}")
    ref = _dispatched(A, B, m, n)
    diff = float(calc_diff(d.double(), ref.double()))
    assert diff < 1e-6, f"vs dispatched fp8_gemm_nt: calc_diff {diff}"
    if m in (64, 128):   # the scales-ahead twin of the pick (benchmarks/gemm_small.py's small_sa1): same FMA order
        auto = S.pick_config(m, n, k, S._num_sms(d.device))
        d2, _ = _run(A, B, n, S.SmallConfig(auto.block_m, auto.block_n, split=auto.split, scale_ahead=1))
        assert torch.equal(d2, d), "scale_ahead 1 changed D"
    assert _counters_zero(), "fixup counters left non-zero"


ALT_CFGS = [S.SmallConfig(64, 64, split=3), S.SmallConfig(64, 128, split=2, mode="reduce"),
            S.SmallConfig(64, 128, split=7), S.SmallConfig(128, 64, split=4, mode="reduce"),
            S.SmallConfig(128, 128, split=2), S.SmallConfig(128, 128, split=1),
            S.SmallConfig(128, 128, split=4, scale_ahead=1), S.SmallConfig(64, 64, split=1, scale_ahead=1)]


@pytest.mark.gpu
@needs_gluon
@needs_cuda
@pytest.mark.parametrize("cfg", ALT_CFGS, ids=lambda c: c.name())
@pytest.mark.parametrize("shape", [(1, 1000, 1088), (33, 264, 2048), (65, 576, 576), (100, 2112, 7168)],
                         ids=lambda s: "x".join(map(str, s)))
def test_small_configs_partial_tiles(shape, cfg):
    """Both reduction modes, every tile shape, N not a multiple of the tile (1000, 264, 576, 2112), K tails (1088 =
    8.5 blocks, 576 = 4.5), M = 1 and partial second warpgroups (65, 100), MN-major sfa."""
    m, n, k = shape
    if m > cfg.block_m:
        pytest.skip("config covers 64 rows")
    A, B = _inputs(m, n, k)
    d, _ = _run(A, B, n, cfg, sfa=A[1].T.contiguous().T)
    _check(d, A, B, k, f"{cfg.name()} {shape}")
    assert _counters_zero()


@pytest.mark.gpu
@needs_gluon
@needs_cuda
@pytest.mark.parametrize("cfg", [S.SmallConfig(64, 128, split=4), S.SmallConfig(128, 64, split=3, mode="reduce"),
                                 S.SmallConfig(128, 128, split=1)], ids=lambda c: c.name())
def test_small_strided_d_and_small_grid(cfg):
    """D = the first N columns of a wider poisoned buffer (columns >= N untouched); 5 programs for 4x-6x more items
    (the persistent loop, ring phases and counters across items of one CTA)."""
    m, n, k = 100 if cfg.block_m == 128 else 50, 1000, 3072
    A, B = _inputs(m, n, k)
    d, full = _run(A, B, n, cfg, d_width=1030, num_sms=5)
    _check(d, A, B, k, cfg.name())
    assert torch.isnan(full[:, n:]).all(), "wrote outside D"
    assert _counters_zero()


@pytest.mark.gpu
@needs_gluon
@needs_cuda
def test_small_repeat_and_graph_replay():
    """Three eager calls and a CUDA graph replayed three times give the same D bit for bit (the fixup counters are
    left zeroed by every launch, and the last split's sum does not depend on the arrival order)."""
    m, n, k = 128, 4096, 7168
    A, B = _inputs(m, n, k)
    cfg = S.SmallConfig(128, 128, split=4)
    outs = [_run(A, B, n, cfg)[0] for _ in range(3)]
    assert all(torch.equal(outs[0], o) for o in outs[1:])
    _check(outs[0], A, B, k, "repeat")
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        S.launch_fp8_gemm_small(A[0], A[1], B[0], B[1], d, cfg)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    # captured on the default capture stream (counters allocated + memset inside the graph) and on the warmed-up
    # side stream (its eagerly zeroed counters, as benchmarks/gemm_small.py captures)
    g1 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g1):
        S.launch_fp8_gemm_small(A[0], A[1], B[0], B[1], d, cfg)
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2, stream=side):
        S.launch_fp8_gemm_small(A[0], A[1], B[0], B[1], d, cfg)
    for g in (g1, g2, g1, g2, g2):
        d.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(d, outs[0]), "graph replay differs from the eager call"
    assert _counters_zero()


def _twin(m, n, k):
    """The small-M config with the dispatched Triton table config's BLOCK_N and split-K (its K partition)."""
    from deepkernels.gemm._configs import select_fp8_config
    from deepkernels.gemm.dense import get_num_sms
    t = select_fp8_config(m, n, k, get_num_sms())
    return S.SmallConfig(64 if m <= 64 else 128, t.block_n, split=t.split_k)


@pytest.mark.gpu
@needs_gluon
@needs_cuda
@pytest.mark.parametrize("shape", SHAPES_12 + [(7, 2112, 7168), (100, 4096, 7168)],
                         ids=lambda s: "x".join(map(str, s)))
def test_small_bitident_twin_of_dispatched(shape):
    """Same K partition, BLOCK_N and promotion order as the dispatched Triton table config: D equal bit for bit
    (fixup and reduce modes; the fixup sums the partials in the reduce kernel's order)."""
    m, n, k = shape
    A, B = _inputs(m, n, k)
    ref = _dispatched(A, B, m, n)
    tw = _twin(m, n, k)
    for cfg in (tw, S.SmallConfig(tw.block_m, tw.block_n, split=tw.split, mode="reduce")):
        d, _ = _run(A, B, n, cfg)
        mism = int((d.view(torch.int16) != ref.view(torch.int16)).sum())
        assert mism == 0, f"{cfg.name()}: {mism} of {m * n} elements differ from the dispatched path"


def test_twin_helper_shapes():
    """CPU: the twin of every 12-shape table row is a valid small-M config."""
    for m, n, k in SHAPES_12:
        tw = _twin(m, n, k)
        assert tw.block_n in (64, 128) and tw.split in (1, 2, 4), (m, n, k, tw)
        assert re.match(r"small_\d+x\d+_s\d+_k\d", tw.name())
