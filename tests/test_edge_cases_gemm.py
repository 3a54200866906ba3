"""Edge cases of shared/cases/edge-cases.md for the dense FP8/BF16 GEMMs (kinds 3, 4, 6 and the FP8 GEMM rows).

Named after the row id they cover (``test_B33_...``) or generalise (``test_B48_kind_...``). Tiers:
``reference``: the public op on CPU tensors (the PyTorch reference) against an independent float64 product of the
dequantised operands; ``interpret``: the real Triton kernels through the interpreter against
:func:`deepkernels.reference.gemm.fp8_gemm_ref` (fp32 output, so the comparison is tight); ``gpu``: production
sizes. Outputs sit inside a NaN-filled buffer with guard rows and columns (D may be strided): every element of D
must be written and no guard may change. Operands are quantised with the PyTorch helpers (never by an
interpreter fp8 cast).
"""
import math

import pytest
import torch

import deepkernels as dk
from deepkernels.gemm import dense
from deepkernels.gemm._configs import GemmConfig
from deepkernels.quant import (get_mn_major_tma_aligned_tensor, per_block_cast_to_fp8, per_token_cast_to_fp8,
                               transform_sf_into_required_layout)
from deepkernels.reference import gemm as ref
from deepkernels.testing import calc_diff

REF = pytest.param("reference", marks=pytest.mark.reference)
INT = pytest.param("interpret", marks=pytest.mark.interpret)
TIERS = [REF, INT]
# small tiles keep the interpreter fast (the wgmma >= 64-row rule does not apply there); several tiles per program
CFG = GemmConfig(64, 64, 4, 2)


# ----------------------------------------------------------------------------------------------- helpers
def fp8_operands(m, n, k, device="cpu", per_row_b=False):
    a = (torch.randn(m, k, device=device) * (1 + torch.rand(m, 1, device=device))).bfloat16()
    b = torch.randn(n, k, device=device).bfloat16()
    A = per_token_cast_to_fp8(a)
    B = per_token_cast_to_fp8(b) if per_row_b else per_block_cast_to_fp8(b)
    return A, B


def dequant64(X, gran_rows):
    """float64 dequantisation: every element times the scale of its (row group, 128-wide K block)."""
    data, sf = X
    r, k = data.shape
    full = sf.double().repeat_interleave(gran_rows, 0)[:r].repeat_interleave(128, 1)[:, :k]
    return data.double() * full


def guarded(m, n, dtype, device="cpu"):
    """(buffer, d): d is an [m, n] row-major view at rows 1.., columns 8.. of a NaN buffer (row stride n + 16)."""
    buf = torch.full((m + 2, n + 16), float("nan"), dtype=dtype, device=device)
    return buf, buf[1:m + 1, 8:8 + n]


def check_guarded(buf, m, n):
    d = buf[1:m + 1, 8:8 + n]
    assert not torch.isnan(d).any(), "some elements of d were never written"
    g = buf.clone()
    g[1:m + 1, 8:8 + n] = float("nan")
    assert torch.isnan(g).all(), "a write landed outside d"


def run_fp8(tier, A, B, out_dtype=torch.float32, per_row_b=False, accumulate=False, cfg=CFG, fn=None):
    """Run the public NT op (or ``dense.fp8_gemm_nt`` with a config under the interpreter) into a guarded D and
    check it; returns D."""
    m, n = A[0].shape[0], B[0].shape[0]
    buf, d = guarded(m, n, out_dtype)
    c = None
    if accumulate:
        c = (torch.randn(m, n) * 4).to(out_dtype)
        d.copy_(c)
    kw = dict(c=d if accumulate else None, recipe=(1, 1, 128) if per_row_b else None)
    if fn is not None:
        fn(A, B, d, **kw)
    elif tier == "interpret":
        dense.fp8_gemm_nt(A, B, d, _config=cfg, **kw)
    else:
        dk.fp8_gemm_nt(A, B, d, **kw)
    check_guarded(buf, m, n)
    if tier == "reference":
        want = dequant64(A, 1) @ dequant64(B, 1 if per_row_b else 128).T + (c.double() if accumulate else 0)
        scale = want.abs().max().item() + 1e-30
        if out_dtype == torch.float32:
            torch.testing.assert_close(d.double(), want, rtol=1e-5, atol=1e-5 * scale)
        else:
            torch.testing.assert_close(d.double(), want, rtol=2 ** -8, atol=1e-3 * scale)
    else:
        want = ref.fp8_gemm_ref(A, B, c=c, recipe=(1, 1, 128) if per_row_b else None, out_dtype=torch.float32)
        # Interpreter: FP8 dot products are exact (fp32 result matches the reference to ~1e-9), but its fp32->bf16
        # conversion truncates (docs/spec/triton-hopper.md §2), so a bf16 element can be off by up to 1 ulp (2^-7
        # relative): calc_diff of a 1-element output can reach (2^-7)^2/2 = 3.05e-5. GPU: round-to-nearest bf16
        # (<= 2^-9 relative, calc_diff <= 7.6e-6 < 1e-5), but the FP8 tensor core accumulates each K block with
        # limited precision, so an fp32 output is ~1e-4 relative off the exact product (calc_diff ~1e-8).
        interp = tier == "interpret"
        if out_dtype == torch.float32:
            assert calc_diff(d.float(), want) < (1e-9 if interp else 1e-5)
            if interp:
                torch.testing.assert_close(d.float(), want, rtol=1e-5, atol=1e-5 * (want.abs().max().item() + 1e-30))
        else:
            assert calc_diff(d.float(), want) < (3.1e-5 if interp else 1e-5)
            torch.testing.assert_close(d.float(), want.bfloat16().float(), rtol=2 ** -7, atol=1e-2)
    return d


class _Launched(BaseException):
    pass


class _Boom:
    def __init__(self, *a, **kw):
        raise _Launched("a GEMM kernel was launched before the argument check")

    def __getitem__(self, grid):
        raise _Launched("a GEMM kernel was launched before the argument check")


@pytest.fixture
def no_launch(monkeypatch):
    """Any launch (or launcher construction) of a dense GEMM kernel fails the test."""
    monkeypatch.setattr(dense, "KernelLauncher", _Boom)
    for name in ("_fp8_gemm_nt_kernel", "_fp8_gemm_nt_ws_kernel", "_bf16_gemm_nt_kernel",
                 "_gemm_splitk_reduce_kernel"):
        monkeypatch.setattr(dense, name, _Boom.__new__(_Boom))


def assert_raises_untouched(exc, match, fn, *args, d, **kw):
    before = d.clone()
    with pytest.raises(exc, match=match):
        fn(*args, d, **kw)
    assert torch.equal(before.isnan(), d.isnan()) and torch.equal(before.nan_to_num(), d.nan_to_num()), \
        "d changed although the call was rejected"


# ================================================================================ kind 4: scale layouts
@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("k", [128, 384, 640, 1152])
def test_B33_odd_k_block_counts(tier, k):
    """DeepGEMM PR #25: K/128 odd (1, 3, 5, 9 scale blocks; n = 7168, k = 1152 in the reference and gpu tiers)."""
    n = 7168 if tier == "reference" and k == 1152 else 200
    A, B = fp8_operands(4, n, k)
    run_fp8(tier, A, B)
    run_fp8(tier, A, B, out_dtype=torch.bfloat16)


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 128, 4096])
def test_B33_odd_k_block_counts_gpu(m):
    A, B = fp8_operands(m, 7168, 1152, "cuda")
    d = torch.full((m, 7168), float("nan"), dtype=torch.bfloat16, device="cuda")
    dk.fp8_gemm_nt(A, B, d)
    assert not torch.isnan(d).any()
    assert calc_diff(d.float(), ref.fp8_gemm_ref(A, B, out_dtype=torch.float32)) < 1e-5


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("m", [1, 7, 9])
def test_B37_scale_layout_conversion_any_m(tier, m):
    """DeepGEMM #140: the scale conversion asserted mn % 4 == 0 (m = 7). The converted scales keep the logical
    shape, and the GEMM gives the same result with row-major, MN-major-aligned and transformed scales."""
    A, B = fp8_operands(m, 24, 384)
    sfa_mn = get_mn_major_tma_aligned_tensor(A[1])
    sfa_tr = transform_sf_into_required_layout(A[1], m, 384, (1, 128, 128), is_sfa=True)
    sfb_tr = transform_sf_into_required_layout(B[1], 24, 384, (1, 128, 128), is_sfa=False)
    for sf in (sfa_mn, sfa_tr):
        assert sf.shape == (m, 3) and torch.equal(sf, A[1])
    d0 = run_fp8(tier, A, B)
    for sfa, sfb in ((sfa_mn, B[1]), (sfa_tr, sfb_tr)):
        d = run_fp8(tier, (A[0], sfa), (B[0], sfb))
        assert torch.equal(d, d0)


@pytest.mark.parametrize("tier", TIERS)
def test_B39_aligned_scales_passed_through(tier):
    """DeepGEMM #64: an already MN-major, TMA-aligned scale tensor (also with a batch dim added) is used as it is,
    same storage, no copy; and a column-major (2, 4) SFA with stride (1, 2) runs without a copy."""
    sf = torch.randn(2, 4).abs().T                         # [MN=4, SFK=2], stride (1, 4): aligned
    assert get_mn_major_tma_aligned_tensor(sf) is sf
    sf3 = sf.unsqueeze(0)
    out3 = get_mn_major_tma_aligned_tensor(sf3)
    assert out3.data_ptr() == sf3.data_ptr() and out3.stride()[1:] == (1, 4)
    assert transform_sf_into_required_layout(sf, 4, 256, (1, 128, 128), is_sfa=True).data_ptr() == sf.data_ptr()
    # the GEMM reads any SFA layout through its strides: the reported (2, 4) stride (1, 2) SFA is not copied
    A, B = fp8_operands(2, 64, 512)
    sfa = torch.empty(4, 2).T
    sfa.copy_(A[1])
    assert sfa.stride() == (1, 2)
    if tier == "interpret":
        dense._FP8_PLANS.clear()
    run_fp8(tier, (A[0], sfa), B, fn=dk.fp8_gemm_nt)
    if tier == "interpret":       # a plan is cached only for a call that made no copy of any operand
        assert any(sig[1][2] == (1, 2) for sig in dense._FP8_PLANS), "the SFA was copied"


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("kb", [5, 6, 7, 13])
def test_B42_k_block_count_not_multiple_of_4(tier, kb):
    """pytorch/ao PR #4209: 1,001 K blocks went wrong while 1,000 worked. Any block count, with FP32 and with packed
    UE8M0 scales (packed 4 per int32, the last word padded)."""
    A, B = fp8_operands(3, 40, 128 * kb)
    run_fp8(tier, A, B)
    a = torch.randn(3, 128 * kb).bfloat16()
    Ap = per_token_cast_to_fp8(a, use_ue8m0=True, use_packed_ue8m0=True)
    Af = per_token_cast_to_fp8(a, use_ue8m0=True)
    assert Ap[1].dtype == torch.int32 and Ap[1].shape == (3, -(-kb // 4))
    buf, d = guarded(3, 40, torch.float32)
    if tier == "interpret":
        dense.fp8_gemm_nt(Ap, B, d, _config=CFG)
    else:
        dk.fp8_gemm_nt(Ap, B, d)
    check_guarded(buf, 3, 40)
    assert torch.equal(d, run_fp8(tier, Af, B))


@pytest.mark.reference
@pytest.mark.parametrize("kb", [1001])
def test_B42_thousand_k_blocks(kb):
    A, B = fp8_operands(2, 16, 128 * kb)
    run_fp8("reference", A, B)


@pytest.mark.gpu
@pytest.mark.parametrize("k", [128000, 128128, 128256])
def test_B42_thousand_k_blocks_gpu(k):
    A, B = fp8_operands(128, 256, k, "cuda")
    d = torch.full((128, 256), float("nan"), device="cuda")
    dk.fp8_gemm_nt(A, B, d)
    # FP8 tensor cores accumulate each K block with limited precision (~2^-13 relative measured on the H200,
    # calc_diff ~8e-9): the GPU bound is 1e-7 as in tests/test_gemm.py (FP8_TC_FP32_TOL); a real bug gives >= 1e-4
    assert calc_diff(d, ref.fp8_gemm_ref(A, B, out_dtype=torch.float32)) < 1e-7


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("per_row_b", [False, True])
def test_B43_column_major_scales_both_operands(tier, per_row_b):
    """pytorch #193802: 1x128 SFA and 128x128 SFB both column-major (strides (1, M) and (1, N/128)); row- and
    column-major scales give the same result, equal to the reference."""
    m, n, k = (128, 256, 2048) if tier == "reference" else (40, 256, 512)     # 512 x 1024 x 2048 in the gpu tier
    A, B = fp8_operands(m, n, k, per_row_b=per_row_b)
    col = lambda s: s.T.contiguous().T                                     # noqa: E731
    Ac, Bc = (A[0], col(A[1])), (B[0], col(B[1]))
    assert Ac[1].stride() == (1, m) and Bc[1].stride(0) == 1
    d_row = run_fp8(tier, A, B, per_row_b=per_row_b)
    d_col = run_fp8(tier, Ac, Bc, per_row_b=per_row_b)
    assert torch.equal(d_row, d_col)


@pytest.mark.gpu
def test_B43_column_major_scales_gpu():
    A, B = fp8_operands(512, 1024, 2048, "cuda")
    col = lambda s: s.T.contiguous().T                                     # noqa: E731
    d1 = torch.empty(512, 1024, device="cuda", dtype=torch.bfloat16)
    d2 = torch.empty_like(d1)
    dk.fp8_gemm_nt(A, B, d1)
    dk.fp8_gemm_nt((A[0], col(A[1])), (B[0], col(B[1])), d2)
    assert torch.equal(d1, d2)
    assert calc_diff(d1.float(), ref.fp8_gemm_ref(A, B, out_dtype=torch.float32)) < 1e-5


@pytest.mark.reference
def test_B44_scale_groups_other_than_128_rejected(no_launch):
    """sglang #39626: [32, 32] quantisation blocks against a 64-wide K tile. The FP8 GEMMs take 128-wide scale groups
    only: other recipes and 32-wide scale tensors are rejected before launch, d untouched."""
    A, B = fp8_operands(4, 64, 256)
    _, d = guarded(4, 64, torch.bfloat16)
    for recipe in ((1, 128, 32), (1, 32, 32), (1, 128, 64)):
        assert_raises_untouched(ValueError, "recipe", dk.fp8_gemm_nt, A, B, d=d, recipe=recipe)
    b = torch.randn(64, 256).bfloat16()
    B32 = per_block_cast_to_fp8(b, gran_k=32)                            # sf [2, 8]
    assert_raises_untouched(ValueError, r"b\[1\]", dk.fp8_gemm_nt, A, B32, d=d)
    A32 = per_token_cast_to_fp8(torch.randn(4, 256).bfloat16(), gran_k=32)   # sf [4, 8]
    assert_raises_untouched(ValueError, r"a\[1\]", dk.fp8_gemm_nt, A32, B, d=d)


@pytest.mark.interpret
def test_B44_kernel_k_tile_is_one_scale_group():
    """A config asking for a 64-wide K tile cannot make one scale cover two groups (or half a group): FP8 GEMMs
    always step K by the 128-wide scale group."""
    A, B = fp8_operands(5, 72, 384)
    run_fp8("interpret", A, B, cfg=GemmConfig(64, 64, 4, 2, block_k=64))
    A, B = fp8_operands(5, 72, 384, per_row_b=True)
    run_fp8("interpret", A, B, per_row_b=True, cfg=GemmConfig(64, 64, 4, 2, block_k=64))


# ================================================================================ kind 3: tile tails
@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("k", [16, 48, 144, 576])
def test_B34_k_not_multiple_of_128(tier, k):
    """DeepGEMM #93: K = 576 (input gradient of 7168 -> 576): the partial last K block is masked and ceil(K/128)
    scale columns are used."""
    A, B = fp8_operands(5, 72, k)
    assert A[1].shape == (5, -(-k // 128))
    run_fp8(tier, A, B)
    A, B = fp8_operands(5, 72, k, per_row_b=True)
    run_fp8(tier, A, B, per_row_b=True, accumulate=True)


@pytest.mark.reference
def test_B34_k_not_multiple_of_16_rejected(no_launch):
    """K rows that TMA cannot address (K % 16 != 0 for FP8) are rejected before launch with a clear message."""
    a = torch.randn(4, 200).bfloat16()
    A, B = per_token_cast_to_fp8(a), per_block_cast_to_fp8(torch.randn(8, 200).bfloat16())
    _, d = guarded(4, 8, torch.bfloat16)
    assert_raises_untouched(ValueError, "16-byte", dk.fp8_gemm_nt, A, B, d=d)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n", [(4096, 7168), (128, 7168)])
def test_B34_k_576_gpu(m, n):
    A, B = fp8_operands(m, n, 576, "cuda")
    d = torch.full((m, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    dk.fp8_gemm_nt(A, B, d)
    assert not torch.isnan(d).any()
    assert calc_diff(d.float(), ref.fp8_gemm_ref(A, B, out_dtype=torch.float32)) < 1e-5


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("m", [1, 133])
def test_B35_weight_gradient_recipe_small_and_odd_m(tier, m):
    """DeepGEMM #165/#110/#121: 1x128 scales on both operands, FP32 output accumulated into C, m = 1 or 133."""
    A, B = fp8_operands(m, 40, 256, per_row_b=True)
    run_fp8(tier, A, B, per_row_b=True, accumulate=True)


@pytest.mark.parametrize("tier", TIERS)
def test_B35_weight_gradient_long_k(tier):
    """Very long K (40 blocks here; 147,456 in the gpu tier)."""
    A, B = fp8_operands(3, 16, 128 * 40, per_row_b=True)
    run_fp8(tier, A, B, per_row_b=True, accumulate=True)


@pytest.mark.gpu
@pytest.mark.parametrize("m,n,k", [(1, 1024, 2048), (133, 1024, 2048), (512, 1024, 147456), (1536, 256, 2048)])
def test_B35_weight_gradient_gpu(m, n, k):
    A, B = fp8_operands(m, n, k, "cuda", per_row_b=True)
    c = torch.randn(m, n, device="cuda")
    d = c.clone()
    dk.fp8_gemm_nt(A, B, d, c=d, recipe=(1, 1, 128))
    assert calc_diff(d, ref.fp8_gemm_ref(A, B, c=c, recipe=(1, 1, 128), out_dtype=torch.float32)) < 1e-7  # as above


def _nan_tail_operand(X, k, kpad, sfk_pad):
    """The same FP8 operand as views of wider buffers: data columns k..kpad and scale columns past ceil(k/128)
    hold NaN, so an unmasked load past K (or past the last scale column) poisons the result."""
    data, sf = X
    dbuf = torch.full((data.shape[0], kpad), float("nan")).to(torch.float8_e4m3fn)
    dbuf[:, :k] = data
    sbuf = torch.full((sf.shape[0], sfk_pad), float("nan"))
    sbuf[:, :sf.shape[1]] = sf
    return dbuf[:, :k], sbuf[:, :sf.shape[1]]


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("k", [576, 1088])
@pytest.mark.parametrize("per_row_b", [False, True])
def test_B46_k_tail_never_reads_past_k_or_last_scale_column(tier, k, per_row_b):
    """vllm PR #29438: on the last K iteration the scale column index ran past ceil(K/group_k) - 1. A and B past K and
    the scale columns past the last one hold NaN here; the result must not see them."""
    A, B = fp8_operands(6, 80, k, per_row_b=per_row_b)
    kpad = (k // 128 + 1) * 128
    An = _nan_tail_operand(A, k, kpad, A[1].shape[1] + 3)
    Bn = _nan_tail_operand(B, k, kpad, B[1].shape[1] + 3)
    assert An[0].stride(0) == kpad and torch.isnan(An[0].as_strided((6, kpad), (kpad, 1)).float()).any()
    d = run_fp8(tier, An, Bn, per_row_b=per_row_b)
    assert torch.equal(d, run_fp8(tier, A, B, per_row_b=per_row_b))


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("m,n,k", [(1, 1, 16), (63, 65, 112), (64, 64, 128), (65, 129, 144), (2, 127, 272)])
def test_B48_kind_fp8_tile_edges(tier, m, n, k):
    """Tile edges of the 64x64x128 tile in every dimension: 1, tile - 1, tile, tile + 1 (kind 3). Stores stay
    inside D (guard rows and columns)."""
    A, B = fp8_operands(m, n, k)
    run_fp8(tier, A, B, out_dtype=torch.bfloat16)
    run_fp8(tier, A, B, per_row_b=False, accumulate=True)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("m,n,k", [(1, 1, 8), (63, 65, 72), (65, 129, 136)])
@pytest.mark.parametrize("layout", ["nt", "tn"])
def test_B48_kind_bf16_tile_edges(tier, m, n, k, layout):
    a = torch.randn(m, k).bfloat16()
    b = torch.randn(n, k).bfloat16()
    buf, d = guarded(m, n, torch.float32)
    def kmn(t):   # [K, MN] storage with a 16-byte aligned row stride (TMA), viewed as [K, MN]
        buf = torch.full((t.shape[1], -(-t.shape[0] // 8) * 8), float("nan"), dtype=t.dtype)
        buf[:, :t.shape[0]] = t.T
        return buf[:, :t.shape[0]]
    x, y = (a, b) if layout == "nt" else (kmn(a), kmn(b))
    if tier == "interpret" and layout == "nt":
        dense.bf16_gemm_nt(x, y, d, _config=GemmConfig(64, 64, 4, 2, block_k=64))
    else:
        getattr(dk, f"bf16_gemm_{layout}")(x, y, d)
    check_guarded(buf, m, n)
    want = a.double() @ b.double().T
    torch.testing.assert_close(d.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())


# ================================================================================ kind 1: empty work
@pytest.mark.parametrize("tier", TIERS)
def test_B50_kind_gemm_empty_dims(tier):
    """m = 0 / n = 0: no-op (d untouched); k = 0: d = c exactly, or zeros without c -- FP8 (both recipes) and BF16."""
    A, B = fp8_operands(3, 8, 128)
    e8 = lambda r: torch.empty(r, 0, dtype=torch.float8_e4m3fn)           # noqa: E731
    c = torch.randn(3, 8)
    for per_row in (False, True):
        d = torch.full((3, 8), float("nan"))
        sfb = torch.empty(8 if per_row else 1, 0)
        dk.fp8_gemm_nt((e8(3), torch.empty(3, 0)), (e8(8), sfb), d, c=c, recipe=(1, 1, 128) if per_row else None)
        assert torch.equal(d, c)
        d = torch.full((3, 8), float("nan"), dtype=torch.bfloat16)
        dk.fp8_gemm_nt((e8(3), torch.empty(3, 0)), (e8(8), sfb), d, recipe=(1, 1, 128) if per_row else None)
        assert (d == 0).all()
    d0 = torch.full((0, 8), float("nan"))
    dk.fp8_gemm_nt((A[0][:0], A[1][:0]), B, d0)
    buf, dn = guarded(3, 0, torch.float32)
    dk.fp8_gemm_nt(A, (B[0][:0], B[1][:0]), dn)
    assert torch.isnan(buf).all()
    d = torch.full((3, 8), float("nan"))
    dk.bf16_gemm_nt(torch.empty(3, 0, dtype=torch.bfloat16), torch.empty(8, 0, dtype=torch.bfloat16), d, c=c)
    assert torch.equal(d, c)


# ================================================================================ kind 6: launch geometry
@pytest.mark.reference
@pytest.mark.parametrize("m,n", [(2 ** 20 + 1, 129280), (16384, 129280), (1, 2 ** 31 - 1)])
def test_B51_kind_gemm_grid_is_one_axis(m, n):
    """Launch planning with sizes past the grid-axis and 32-bit limits, as plain integers: one grid axis, tile count
    computed exactly (Python ints), persistent grids capped by the SM count."""
    from deepkernels.gemm._configs import BF16_CANDIDATES, FP8_CANDIDATES
    for cfg in FP8_CANDIDATES + BF16_CANDIDATES:
        tiles, grid = dense._grid(m, n, cfg)
        assert tiles == -(-m // cfg.block_m) * -(-n // cfg.block_n) * cfg.split_k
        assert 1 <= grid < 2 ** 31
        if cfg.progs_per_sm:
            assert grid <= dense.get_num_sms() * cfg.progs_per_sm


# ================================================================================ performance row
@pytest.mark.gpu
def test_B40_v2_slow_shapes_correct_gpu():
    """DeepGEMM #160 (performance row; the timing is in benchmarks/): (128, 2112, 7168) and an m-grouped contiguous
    case are correct on the same input."""
    A, B = fp8_operands(128, 2112, 7168, "cuda")
    d = torch.full((128, 2112), float("nan"), dtype=torch.bfloat16, device="cuda")
    dk.fp8_gemm_nt(A, B, d)
    assert calc_diff(d.float(), ref.fp8_gemm_ref(A, B, out_dtype=torch.float32)) < 1e-5
    if not hasattr(dk, "m_grouped_fp8_gemm_nt_contiguous"):
        pytest.skip("m_grouped_fp8_gemm_nt_contiguous not available yet (gemm/grouped.py in progress)")
    from deepkernels.reference import grouped_gemm as R
    g, m_per, n, k = 4, 256, 2112, 7168
    a = torch.randn(g * m_per, k, device="cuda").bfloat16()
    b = torch.randn(g, n, k, device="cuda").bfloat16()
    Aq = per_token_cast_to_fp8(a)
    qb = [per_block_cast_to_fp8(b[i]) for i in range(g)]
    Bq = (torch.stack([x[0] for x in qb]), torch.stack([x[1] for x in qb]))
    gl = torch.arange(g, device="cuda", dtype=torch.int32).repeat_interleave(m_per)
    d = torch.full((g * m_per, n), float("nan"), dtype=torch.bfloat16, device="cuda")
    dk.m_grouped_fp8_gemm_nt_contiguous(Aq, Bq, d, gl)
    want = R.m_grouped_fp8_gemm_contiguous_ref(Aq, Bq, gl)
    assert calc_diff(d.float(), want.float()) < 1e-5
