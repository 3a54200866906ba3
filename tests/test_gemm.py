"""Dense FP8/BF16 GEMM: input validation (any tier), interpreter tier (small shapes), GPU tier (production
shapes and edge cases). The compile tier lives in test_gemm_compile.py."""
import math

import pytest
import torch

import deepkernels as dk
from deepkernels.gemm._configs import BF16_CANDIDATES, FP8_CANDIDATES, FP8_WS_EXPERIMENTAL, GemmConfig
from deepkernels.gemm import dense
from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
from deepkernels.reference import gemm as ref
from deepkernels.testing import calc_diff


def _fp8_inputs(m, n, k, device, per_row_b=False, mn_major_sfa=False):
    a = torch.randn(m, k, device=device).bfloat16()
    b = torch.randn(n, k, device=device).bfloat16()
    A = per_token_cast_to_fp8(a, use_ue8m0=False)
    B = per_token_cast_to_fp8(b, use_ue8m0=False) if per_row_b else per_block_cast_to_fp8(b, use_ue8m0=False)
    if mn_major_sfa:
        A = (A[0], A[1].T.contiguous().T)
    return a, b, A, B


def _poison(m, n, dtype, device):
    return torch.full((m, n), float("nan"), dtype=dtype, device=device)


def _check_written(d):
    assert not torch.isnan(d).any(), "some output elements were never written"


# ----------------------------------------------------------------------------------------------- validation
class TestValidation:
    def _args(self, m=4, n=8, k=128):
        _, _, A, B = _fp8_inputs(m, n, k, "cpu")
        return A, B, torch.empty(m, n, dtype=torch.bfloat16)

    def test_bad_dtype(self):
        A, B, d = self._args()
        with pytest.raises(TypeError, match="a\\[0\\]"):
            dk.fp8_gemm_nt((A[0].float(), A[1]), B, d)
        with pytest.raises(TypeError, match="d must have dtype"):
            dk.fp8_gemm_nt(A, B, d.half())
        with pytest.raises(TypeError, match="pair"):
            dk.fp8_gemm_nt(A[0], B, d)
        with pytest.raises(TypeError):
            dk.bf16_gemm_nt(A[0], B[0], d)

    def test_shape_mismatch(self):
        A, B, d = self._args()
        with pytest.raises(ValueError, match="share K"):
            dk.fp8_gemm_nt(A, (B[0][:, :64], B[1]), d)
        with pytest.raises(ValueError, match="d must have shape"):
            dk.fp8_gemm_nt(A, B, torch.empty(4, 9, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="c must have shape"):
            dk.fp8_gemm_nt(A, B, d, c=torch.empty(3, 8, dtype=torch.bfloat16))

    def test_wrong_scale_shape(self):
        A, B, d = self._args(k=256)
        with pytest.raises(ValueError, match="a\\[1\\]"):
            dk.fp8_gemm_nt((A[0], A[1][:, :1]), B, d)
        with pytest.raises(ValueError, match="b\\[1\\]"):
            dk.fp8_gemm_nt(A, (B[0], torch.ones(2, 2)), d)
        with pytest.raises(ValueError, match="recipe"):
            dk.fp8_gemm_nt(A, B, d, recipe=(1, 64, 128))

    def test_misaligned_strides(self):
        a8 = torch.randn(4, 200).to(torch.float8_e4m3fn)  # K=200: rows not 16-byte aligned
        b8 = torch.randn(8, 200).to(torch.float8_e4m3fn)
        with pytest.raises(ValueError, match="16-byte"):
            dk.fp8_gemm_nt((a8, torch.ones(4, 2)), (b8, torch.ones(1, 2)), torch.empty(4, 8, dtype=torch.bfloat16))
        a = torch.randn(4, 70).bfloat16()[:, 1:69]  # base misaligned
        with pytest.raises(ValueError, match="16-byte"):
            dk.bf16_gemm_nt(a, torch.randn(8, 68).bfloat16(), torch.empty(4, 8, dtype=torch.bfloat16))
        with pytest.raises(ValueError, match="row-major"):
            dk.bf16_gemm_nt(torch.randn(4, 64).bfloat16(), torch.randn(8, 64).bfloat16(),
                            torch.empty(8, 4, dtype=torch.bfloat16).T)
        with pytest.raises(ValueError, match="compiled_dims"):
            dk.bf16_gemm_nt(torch.randn(4, 64).bfloat16(), torch.randn(8, 64).bfloat16(),
                            torch.empty(4, 8, dtype=torch.bfloat16), compiled_dims="x")

    def test_num_sms_knob(self):
        old = dense.get_num_sms()
        with pytest.raises(ValueError):
            dense.set_num_sms(-1)
        with pytest.raises(TypeError):
            dense.set_num_sms(1.5)
        dense.set_num_sms(8)
        assert dense.get_num_sms() == 8
        dense.set_num_sms(0)
        assert dense.get_num_sms() == old


# ----------------------------------------------------------------------------------------------- interpreter
def _run_fp8(m, n, k, device, cfg=None, out_dtype=torch.bfloat16, per_row_b=False, accumulate=False,
             mn_major_sfa=False):
    a, b, A, B = _fp8_inputs(m, n, k, device, per_row_b, mn_major_sfa)
    c = (torch.randn(m, n, device=device) * 4).to(out_dtype) if accumulate else None
    d = c.clone() if accumulate else _poison(m, n, out_dtype, device)
    dense.fp8_gemm_nt(A, B, d, c=d if accumulate else None, recipe=(1, 1, 128) if per_row_b else None,
                      _config=cfg)
    _check_written(d)
    want = ref.fp8_gemm_ref(A, B, c=c, out_dtype=torch.float32)
    if out_dtype == torch.bfloat16:
        tol = 1e-5   # the final BF16 rounding alone gives calc_diff ~ 1e-6
    elif device == "cpu":
        tol = 1e-9   # interpreter: exact FP32 dots, only summation order differs from the float64 reference
    else:
        tol = FP8_TC_FP32_TOL
    assert calc_diff(d.float(), want) < tol
    true = _dequant(A, k) @ _dequant(B, k, 1 if per_row_b else 128).T + (c.float() if c is not None else 0)
    assert calc_diff(d.float(), true) < 1e-3
    if m * n >= 4096:  # against the unquantized product: DeepGEMM's own criterion (statistical, large shapes)
        assert calc_diff(d.float(), a.float() @ b.float().T + (c.float() if c is not None else 0)) < 1e-3
    return d


# FP32 output on the GPU: the reference sums each 128-wide K block exactly, but the Hopper FP8 wgmma accumulates
# inside a K block with limited precision (~13-14 mantissa bits, DeepSeek-V3 report sec. 3.3.2; that is why the
# per-block FP32 promotion exists at all), so an FP8 GEMM with FP32 output carries a relative error ~1e-4 no kernel
# can remove. calc_diff = |x - y|^2 / (|x|^2 + |y|^2) ~ eps^2 / 2 for relative RMS error eps: the H200 measured
# 6.6e-9 .. 8.1e-9 on all seven 1D1D edge shapes (eps ~ 1.3e-4 ~ 2^-13), so 1e-9 cannot hold. Bound: eps <= 2^-11
# (4x the measured error) -> calc_diff < 2^-23 ~ 1.2e-7; a real bug (a wrong scale, a missed K block or row) gives
# calc_diff >= 1e-4. The interpreter keeps 1e-9 and every other check (BF16 1e-5, dequantized 1e-3) is unchanged.
FP8_TC_FP32_TOL = 1e-7


def _dequant(X, k, gran_rows=1):
    data, sf = X
    sf = sf.float().repeat_interleave(gran_rows, 0)[:data.shape[0]].repeat_interleave(128, 1)[:, :k]
    return data.float() * sf


_I_CFGS = [GemmConfig(64, 64, 4, 2), GemmConfig(64, 64, 4, 2, split_k=2, progs_per_sm=2),
           GemmConfig(64, 256, 8, 2), GemmConfig(64, 64, 4, 2, tma_store=True),
           GemmConfig(64, 64, 4, 2, warp_spec=True), GemmConfig(64, 64, 4, 2, progs_per_sm=2, flatten=True),
           GemmConfig(128, 64, 4, 2, warp_spec=True)]  # 128-row ws tile, partial in M and N (the H200 NaN config)


@pytest.mark.interpret
@pytest.mark.parametrize("m,n,k", [(1, 64, 128), (7, 33, 576), (65, 130, 1152)])
def test_fp8_interpret_shapes(m, n, k, device):
    dense.set_num_sms(2)  # several tiles per persistent program
    try:
        _run_fp8(m, n, k, device, cfg=GemmConfig(64, 64, 4, 2))
    finally:
        dense.set_num_sms(0)


@pytest.mark.interpret
@pytest.mark.parametrize("cfg", _I_CFGS, ids=lambda c: c.name())
def test_fp8_interpret_configs(cfg, device):
    _run_fp8(70, 300, 640, device, cfg=cfg)


@pytest.mark.interpret
def test_fp8_interpret_ws_kernel_per_row(device):
    _run_fp8(9, 72, 384, device, cfg=GemmConfig(64, 64, 4, 2, warp_spec=True), out_dtype=torch.float32,
             per_row_b=True)
    _run_fp8(130, 72, 384, device, cfg=GemmConfig(128, 64, 4, 2, warp_spec=True), per_row_b=True)


@pytest.mark.interpret
def test_fp8_ws_config_never_used_with_c(device):
    """C accumulation is never routed to the autoWS kernel (its 64-row consumers duplicate the tile, so both would
    read-add-store D); a ws config with c runs the plain kernel and stays correct."""
    cfg = GemmConfig(64, 64, 4, 2, warp_spec=True)
    _run_fp8(9, 72, 384, device, cfg=cfg, out_dtype=torch.float32, per_row_b=True, accumulate=True)
    plans = [p for key, p in dense._FP8_PLANS.items() if cfg in key]
    assert plans and not any(p.ws_kernel for p in plans if p.accumulate)


@pytest.mark.interpret
def test_fp8_interpret_cached_plan_reused(device):
    """A second call with the same signature runs the cached plan (including the copy of a separate c)."""
    m, n, k = 9, 72, 384
    _, _, A, B = _fp8_inputs(m, n, k, device)
    cfg = GemmConfig(64, 64, 4, 2)
    c = torch.randn(m, n, device=device).bfloat16()
    want = ref.fp8_gemm_ref(A, B, c=c, out_dtype=torch.float32)
    for _ in range(2):
        d = _poison(m, n, torch.bfloat16, device)
        dense.fp8_gemm_nt(A, B, d, c=c, _config=cfg)
        assert calc_diff(d.float(), want) < 1e-5
    assert any(cfg in key for key in dense._FP8_PLANS)


@pytest.mark.interpret
def test_fp8_interpret_1d1d_fp32_accumulate_and_default_config(device):
    _run_fp8(9, 72, 384, device, out_dtype=torch.float32, per_row_b=True, accumulate=True)
    _run_fp8(9, 72, 384, device, accumulate=True, mn_major_sfa=True)  # 1D2D with C (superset)


@pytest.mark.interpret
def test_fp8_interpret_layouts(device):
    m, n, k = 5, 40, 256
    a, b, A, B = _fp8_inputs(m, n, k, device)
    want = ref.fp8_gemm_ref(A, B, out_dtype=torch.float32)
    at = (A[0].T.contiguous(), A[1].T)     # [K, M] data, [SFK, M] scales
    bt = (B[0].T.contiguous(), B[1].T)     # [K, N] data, [SFK, NB] scales
    for fn, x, y in ((dk.fp8_gemm_nn, A, bt), (dk.fp8_gemm_tn, at, bt), (dk.fp8_gemm_tt, at, B)):
        d = _poison(m, n, torch.float32, device)
        fn(x, y, d)
        assert calc_diff(d, want) < 1e-9, fn.__name__


@pytest.mark.interpret
@pytest.mark.parametrize("layout", ["nt", "nn", "tn", "tt"])
def test_bf16_interpret_layouts(layout, device):
    m, n, k = 40, 72, 200
    a = torch.randn(m, k, device=device).bfloat16()
    b = torch.randn(n, k, device=device).bfloat16()
    want = ref.bf16_gemm_ref(a, b, out_dtype=torch.float32)
    x = a if layout[0] == "n" else a.T.contiguous()
    y = b if layout[1] == "t" else b.T.contiguous()
    d = _poison(m, n, torch.float32, device)
    getattr(dk, f"bf16_gemm_{layout}")(x, y, d)
    assert calc_diff(d, want) < 1e-10


@pytest.mark.interpret
def test_bf16_interpret_split_k_accumulate(device):
    m, n, k = 20, 50, 256
    a = torch.randn(m, k, device=device).bfloat16()
    b = torch.randn(n, k, device=device).bfloat16()
    c = torch.randn(m, n, device=device)
    d = c.clone()
    dense.bf16_gemm_nt(a, b, d, c=d, _config=GemmConfig(64, 64, 4, 2, split_k=2, block_k=64))
    assert calc_diff(d, ref.bf16_gemm_ref(a, b, c=c, out_dtype=torch.float32)) < 1e-10


@pytest.mark.interpret
def test_empty_work_interpret(device):
    _, _, A, B = _fp8_inputs(3, 8, 128, device)
    d = torch.full((3, 8), 5.0, dtype=torch.bfloat16, device=device)
    empty = (torch.empty(3, 0, dtype=torch.float8_e4m3fn, device=device), torch.empty(3, 0, device=device))
    dk.fp8_gemm_nt(empty, (torch.empty(8, 0, dtype=torch.float8_e4m3fn, device=device),
                           torch.empty(1, 0, device=device)), d)
    assert torch.all(d == 0)
    d0 = torch.empty(0, 8, dtype=torch.bfloat16, device=device)
    dk.fp8_gemm_nt((A[0][:0], A[1][:0]), B, d0)


# ----------------------------------------------------------------------------------------------- GPU
_V3 = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


@pytest.mark.gpu
@pytest.mark.parametrize("m", [64, 128, 4096])
@pytest.mark.parametrize("n,k", _V3)
def test_fp8_gpu_production(m, n, k):
    _, _, A, B = _fp8_inputs(m, n, k, "cuda")
    d = _poison(m, n, torch.bfloat16, "cuda")
    dk.fp8_gemm_nt(A, B, d)
    _check_written(d)
    want = ref.fp8_gemm_ref(A, B, out_dtype=torch.float32) if m * n * k <= 2**36 else None
    if want is not None:
        assert calc_diff(d.float(), want) < 1e-5
    assert calc_diff(d.float(), _dequant(A, k) @ _dequant(B, k, 128).T) < 1e-3


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 2112, 7168), (7, 33, 576), (133, 7168, 1152), (4097, 576, 7296),
                                   (129, 2112, 128), (63, 256, 256), (128, 128, 147456)])
@pytest.mark.parametrize("variant", ["1d2d", "1d1d_fp32_acc", "1d2d_c"])
def test_fp8_gpu_edges(m, n, k, variant):
    _run_fp8(m, n, k, "cuda", out_dtype=torch.float32 if variant == "1d1d_fp32_acc" else torch.bfloat16,
             per_row_b=variant == "1d1d_fp32_acc", accumulate=variant != "1d2d")


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", FP8_CANDIDATES, ids=lambda c: c.name())
def test_fp8_gpu_every_candidate(cfg):
    for m, n, k in ((64, 2112, 7168), (300, 1000, 1152)):
        _run_fp8(m, n, k, "cuda", cfg=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", FP8_WS_EXPERIMENTAL, ids=lambda c: c.name())
def test_fp8_gpu_ws_experimental(cfg):
    """Not selectable: 128-row autoWS tiles left NaN (unwritten) outputs on the H200 (Triton 3.6; see
    benchmarks/notes/gemm.md). Kept as a non-strict xfail so a Triton upgrade that fixes it shows up as XPASS."""
    if cfg.block_m == 128:
        pytest.xfail("Triton 3.6 autoWS with 128-row tiles leaves outputs unwritten on sm90 (H200, 2026-11-29)")
    for m, n, k in ((64, 2112, 7168), (300, 1000, 1152)):
        _run_fp8(m, n, k, "cuda", cfg=cfg)


@pytest.mark.gpu
@pytest.mark.parametrize("cfg", BF16_CANDIDATES, ids=lambda c: c.name())
@pytest.mark.parametrize("layout", ["nt", "nn", "tn", "tt"])
def test_bf16_gpu(cfg, layout):
    for m, n, k in ((128, 2112, 7168), (4096, 4096, 1536), (8, 40, 200)):
        a = torch.randn(m, k, device="cuda").bfloat16()
        b = torch.randn(n, k, device="cuda").bfloat16()
        x = a if layout[0] == "n" else a.T.contiguous()
        y = b if layout[1] == "t" else b.T.contiguous()
        d = _poison(m, n, torch.bfloat16, "cuda")
        dense.bf16_gemm_nt(x if layout[0] == "n" else x.T, y if layout[1] == "t" else y.T, d, _config=cfg)
        _check_written(d)
        assert calc_diff(d.float(), a.float() @ b.float().T) < 1e-5
        d = _poison(m, n, torch.bfloat16, "cuda")
        getattr(dk, f"bf16_gemm_{layout}")(x, y, d)
        _check_written(d)
        assert calc_diff(d.float(), a.float() @ b.float().T) < 1e-5


@pytest.mark.gpu
def test_fp8_gpu_fast_launch_path():
    """Repeated calls take the cached-plan fast path (direct CompiledKernel launch), stay correct, capture
    into a CUDA graph, and a changed signature (other alignment) is validated again."""
    m, n, k = 64, 2112, 7168
    _, _, A, B = _fp8_inputs(m, n, k, "cuda")
    want = _dequant(A, k) @ _dequant(B, k, 128).T
    d = _poison(m, n, torch.bfloat16, "cuda")
    dense._FP8_PLANS.clear()
    for _ in range(3):
        d.fill_(float("nan"))
        dk.fp8_gemm_nt(A, B, d)
        assert calc_diff(d.float(), want) < 1e-3
    (plan,) = dense._FP8_PLANS.values()
    assert plan.launcher.fast_calls == 2 and plan.launcher.slow_calls == 1
    d.fill_(float("nan"))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dk.fp8_gemm_nt(A, B, d)
    g.replay()
    torch.cuda.synchronize()
    assert calc_diff(d.float(), want) < 1e-3
    big = torch.empty(m * k + 16, dtype=torch.float8_e4m3fn, device="cuda")
    with pytest.raises(ValueError, match="16-byte"):
        dk.fp8_gemm_nt((big[8:8 + m * k].view(m, k), A[1]), B, d)


@pytest.mark.gpu
def test_fp8_gpu_huge_output_int64():
    m, n, k = 16384, 131200, 128   # M*N > 2^31 elements
    _, _, A, B = _fp8_inputs(m, n, k, "cuda")
    d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
    d[-1].fill_(float("nan"))
    dk.fp8_gemm_nt(A, B, d)
    for rows in (slice(0, 64), slice(m - 64, m)):
        want = ref.fp8_gemm_ref((A[0][rows], A[1][rows]), B, out_dtype=torch.float32)
        assert calc_diff(d[rows].float(), want) < 1e-5
    _check_written(d[-1:])
    del d
