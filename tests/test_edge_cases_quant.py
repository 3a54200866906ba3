"""Edge cases of shared/cases/edge-cases.md for quantisation and conversion (kind 8, B51) in every routine.

The quantizers are plain PyTorch (any device), so these tests are ``reference`` tier (plus ``gpu`` for the one real
run past 2^31 elements). Expected FP8 codes come from the independent bit-level e4m3 rounder of tests/test_quant.py
(round to nearest even, saturating), never from an interpreter cast.
"""
import math

import numpy as np
import pytest
import torch

import deepkernels as dk
from deepkernels.quant import fp8 as qfp8
from deepkernels.quant.kvcache import KV_FORMATS, abs_indices_to_kvcache_indices, dequantize_kv_cache, \
    quantize_kv_cache

from test_quant import e4m3_round

pytestmark = pytest.mark.reference

E4M3_SUB = 2.0 ** -9          # smallest e4m3 subnormal


def _fp8_bound(x, deq, sf_full):
    """|deq - x| <= half an e4m3 ulp: 2^-4 |x| for normals, sf * 2^-10 in the subnormal range."""
    err = (deq.double() - x.double()).abs()
    bound = x.double().abs() * 2.0 ** -4 + sf_full.double() * E4M3_SUB / 2 + 1e-30
    assert (err <= bound * (1 + 1e-9)).all(), float((err / bound).max())


def _quantizers(use_ue8m0):
    """(name, fn(x) -> (x_fp8, sf broadcast to x's shape)) for every FP8 quantizer."""
    def per_token(x):
        q, sf = dk.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0)
        return q, sf.repeat_interleave(128, 1)[:, :x.shape[1]]

    def per_block(x):
        q, sf = dk.per_block_cast_to_fp8(x, use_ue8m0=use_ue8m0)
        return q, sf.repeat_interleave(128, 0)[:x.shape[0]].repeat_interleave(128, 1)[:, :x.shape[1]]

    def per_channel(x):
        q, sf = dk.per_channel_cast_to_fp8(x, use_ue8m0=use_ue8m0)
        return q, sf.repeat_interleave(128, 0)

    def per_custom(x):
        q, sf = dk.per_custom_dims_cast_to_fp8(x, (0,), use_ue8m0=use_ue8m0)
        return q, sf[:, None].expand_as(x)
    return [("per_token", per_token), ("per_block", per_block), ("per_channel", per_channel),
            ("per_custom_dims", per_custom)]


QUANT = [(n, u, f) for u in (False, True) for n, f in _quantizers(u)]
QIDS = [f"{n}-{'ue8m0' if u else 'fp32'}" for n, u, _ in QUANT]


# ================================================================================ B49: all-zero blocks
@pytest.mark.parametrize("name,ue8m0,fn", QUANT, ids=QIDS)
def test_B49_all_zero_block_gives_finite_scale(name, ue8m0, fn):
    """kernels-community #681: an all-zero 128-block gave scale 0 and 0/0 = NaN. The amax floor keeps the scale
    finite and positive; zeros quantise to 0 and the other blocks are unaffected."""
    x = torch.randn(256, 384).bfloat16()
    x[:128, :128] = 0                     # one whole zero block (zero token groups, channel groups, block)
    x[5] = 0                              # one whole zero row (per_custom_dims)
    q, sf = fn(x)
    assert torch.isfinite(sf).all() and (sf > 0).all()
    assert not torch.isnan(q.float()).any()
    assert (q.float()[x == 0] == 0).all()
    _fp8_bound(x.float(), q.float() * sf, sf)


@pytest.mark.parametrize("fmt", ["v32", "model1", "v41", "fp4"])
def test_B49_kind_kv_cache_zero_tokens(fmt):
    """The KV-cache quantizers: an all-zero token (and an all-zero tile) gives finite scales and dequantises to 0."""
    f = KV_FORMATS[fmt]
    kv = (torch.randn(2, 8, 1, f.d_qk) / 4).bfloat16()
    kv[0, 3] = 0
    kv[1, 0, 0, :64] = 0
    deq = dequantize_kv_cache(quantize_kv_cache(kv, fmt), fmt)
    assert not torch.isnan(deq.float()).any()
    assert (deq[0, 3] == 0).all() and (deq[1, 0, 0, :64] == 0).all()
    rel = (deq.float() - kv.float()).norm() / kv.float().norm()
    assert rel < (0.15 if fmt == "fp4" else 0.05)


# ================================================================================ B52: quantise with the final scale
@pytest.mark.parametrize("name,fn", [(n, f) for n, u, f in QUANT if u], ids=[i for i in QIDS if "ue8m0" in i])
def test_B52_ue8m0_data_quantised_with_rounded_scale(name, fn):
    """transformers #47030: a 0.75 scale rounded up to 1.0 while the data kept its 0.75 quantisation (values inflated
    by 4/3). Here the block amax is 336 (336/448 = 0.75): the stored scale is 1.0 and the codes are exactly
    e4m3(x / 1.0); dequantised values stay within e4m3 rounding of the input."""
    x = (torch.rand(128, 128) * 600 - 300).clamp(-335, 335)
    x[7, 9] = 336.0
    x[9, 7] = -336.0
    x = x.bfloat16()
    q, sf = fn(x)
    assert (sf == 1.0).all()
    assert np.array_equal(q.float().numpy(), e4m3_round(x.float().numpy()).astype(np.float32))
    _fp8_bound(x.float(), q.float() * sf, sf)
    assert q.float()[7, 9] in (320.0, 352.0)                             # not 448 (= 336 / 0.75)


@pytest.mark.parametrize("name,fn", [(n, f) for n, u, f in QUANT], ids=QIDS)
def test_B52_kind_codes_are_rne_of_x_over_final_scale(name, fn):
    """Every quantizer, random scales (powers of two or not): codes == bit-level RNE e4m3 of x * (1/sf) with the
    scale that is stored."""
    x = (torch.randn(256, 260) * torch.logspace(-3, 3, 260)).bfloat16()
    q, sf = fn(x)
    want = e4m3_round((x.float() * (1.0 / sf)).numpy())
    assert np.array_equal(q.float().numpy(), want.astype(np.float32))


@pytest.mark.parametrize("fmt", ["v32", "model1", "v41", "fp4"])
def test_B52_kind_kv_cache_dequant_uses_stored_scale(fmt):
    """KV caches: dequantising with the stored scales stays within the format's rounding of the input."""
    f = KV_FORMATS[fmt]
    kv = (torch.randn(3, 16, 1, f.d_qk) * torch.logspace(-2, 2, f.d_qk)).bfloat16()
    deq = dequantize_kv_cache(quantize_kv_cache(kv, fmt), fmt).float()
    x = kv.float()
    tiles = x[..., :f.d_quant].reshape(3, 16, 1, f.num_tiles, -1) if fmt != "fp4" else None
    if fmt == "fp4":     # e2m1 (1 mantissa bit) with the stored e4m3 scale (amax/6 rounded, >= 2^-9): half the 4..6
        from deepkernels.quant.kvcache import kv_cache_views     # step, or saturation at 6 * scale when the scale
        packed = quantize_kv_cache(kv, fmt)                        # rounded down (coarse subnormal scales)
        deq = dequantize_kv_cache(packed, fmt).float()
        sc = kv_cache_views(packed, fmt).scales.float().reshape(3, 16, 1, -1, 1)
        xt = x.reshape(3, 16, 1, -1, 16)
        err = (deq.reshape_as(xt) - xt).abs()
        sat = (xt.abs() - 6 * sc).clamp(min=0)
        assert (err <= torch.maximum(xt.abs() * 0.25 + sc * 0.25, sat + 1e-30) * 1.01 + 2 ** -8 * xt.abs()).all()
        return
    s = torch.tensor(2.0) ** torch.ceil(torch.log2((tiles.abs().amax(-1, keepdim=True) / 448).clamp(min=1e-4)))
    d = deq[..., :f.d_quant].reshape_as(tiles)
    err = (d - tiles).abs()
    bound = tiles.abs() * (2.0 ** -4 + 2.0 ** -8) + s * E4M3_SUB / 2 + 1e-30      # + bf16 rounding of the output
    assert (err <= bound).all()


# ================================================================================ B54: saturation at +-448
def test_B54_values_above_448_saturate():
    """ml_dtypes #260/#400: 464 -> 448 but 465 and beyond -> NaN without saturation. The cast clamps first."""
    x = torch.tensor([448, 464, 465, 1000, -1000, 449, 1e30, -1e30, math.inf, -math.inf, 0.0, -0.0])
    got = qfp8.cast_to_e4m3(x).float()
    assert torch.equal(got, torch.tensor([448, 448, 448, 448, -448, 448, 448, -448, 448, -448, 0.0, -0.0]))
    assert torch.isnan(qfp8.cast_to_e4m3(torch.tensor([math.nan])).float()).all()


@pytest.mark.parametrize("name,fn", [(n, f) for n, u, f in QUANT], ids=QIDS)
def test_B54_kind_quantizers_never_exceed_448(name, fn):
    """x * (1/sf) can land a hair above 448 for the amax element; every quantizer saturates, never NaN, with
    amaxes over many magnitudes (up to near the bf16 maximum)."""
    x = torch.randn(128, 512) * torch.logspace(-30, 38, 512).clamp(max=3e38)
    x = x.clamp(-3e38, 3e38).bfloat16()
    q, sf = fn(x)
    qf = q.float()
    assert not torch.isnan(qf).any() and (qf.abs() <= 448).all()
    assert torch.isfinite(sf).all()


@pytest.mark.parametrize("fmt", ["v32", "model1", "v41", "fp4"])
def test_B54_kind_kv_cache_huge_values_saturate(fmt):
    f = KV_FORMATS[fmt]
    kv = (torch.randn(1, 4, 1, f.d_qk) * 1e30).bfloat16()
    kv[0, 1, 0, :] = 3e38
    deq = dequantize_kv_cache(quantize_kv_cache(kv, fmt), fmt).float()
    assert not torch.isnan(deq[..., :f.d_quant]).any()
    assert (deq[0, 1, 0, :f.d_quant] > 0).all()


# ================================================================================ B50 kind: empty inputs
def test_B50_kind_every_quantizer_on_empty_input():
    """Zero rows (and zero columns) in every quantizer: correctly shaped empty outputs, no division by the count."""
    e = torch.empty(0, 128).bfloat16()
    q, sf = dk.per_token_cast_to_fp8(e)
    assert q.shape == (0, 128) and sf.shape == (0, 1)
    q, sf = dk.per_block_cast_to_fp8(e)
    assert q.shape == (0, 128) and sf.shape == (0, 1)
    q, sf = dk.per_token_cast_to_fp8(torch.empty(3, 0).bfloat16())
    assert q.shape == (3, 0) and sf.shape == (3, 0)
    q, sf = dk.per_channel_cast_to_fp8(torch.empty(0, 16).bfloat16())
    assert q.shape == (0, 16) and sf.shape == (0, 16)
    for fmt in ("v32", "model1", "v41", "fp4"):
        c = quantize_kv_cache(torch.empty(0, 64, 1, KV_FORMATS[fmt].d_qk, dtype=torch.bfloat16), fmt)
        assert c.shape == (0, 64, 1, KV_FORMATS[fmt].bytes_per_token)
        assert dequantize_kv_cache(c, fmt).shape[0] == 0
    ind = abs_indices_to_kvcache_indices(torch.empty(2, 1, 0, dtype=torch.int32), torch.zeros(2, 3, dtype=torch.int32),
                                         64)
    assert ind.shape == (2, 1, 0)


# ================================================================================ B51: 32-bit offsets
def test_B51_offsets_past_2_31_elements():
    """vllm #42173: M*N > 2^31 wrapped 32-bit offsets. Rows of a (lazily allocated, untouched) 4 GiB buffer sit
    more than 2^31 elements apart; the quantizer reads each row where it is."""
    try:
        storage = torch.empty(2 ** 31 + 2 ** 20, dtype=torch.bfloat16)
    except RuntimeError:
        pytest.skip("cannot reserve 4 GiB of address space here")
    x = storage.as_strided((3, 256), (2 ** 30 + 64, 1))          # row 2 starts at element 2^31 + 128
    src = torch.randn(3, 256).bfloat16()
    x.copy_(src)
    for fn in (dk.per_token_cast_to_fp8, dk.per_block_cast_to_fp8):
        q, sf = fn(x)
        q2, sf2 = fn(src)
        assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(sf, sf2)
    del x, storage


def test_B51_kind_kvcache_indices_do_not_wrap_int32():
    """abs_indices_to_kvcache_indices computes rows in 64-bit; with int32 indices a row past 2^31 (a junk block-table
    entry such as FlashMLA's 2147480000 filler, or block 2^26 + 1 of 64-token pages) is invalid (-1), never wrapped
    into a real-looking row."""
    a = torch.tensor([[[0, 64, 65, 1]]], dtype=torch.int32)
    for junk in (2 ** 26 + 1, 2147480000, 2 ** 31 - 1):
        bt = torch.tensor([[3, junk]], dtype=torch.int32)
        assert abs_indices_to_kvcache_indices(a, bt, 64).tolist() == [[[192, -1, -1, 193]]]
        got64 = abs_indices_to_kvcache_indices(a.long(), bt, 64)
        assert got64[0, 0, 1] == junk * 64 and got64.dtype == torch.int64


def test_B51_kind_layout_sizes_are_python_ints():
    """TMA-aligned sizes for MN past 2^31 are exact."""
    from deepkernels.quant.layout import get_tma_aligned_size
    for x in (2 ** 31 - 1, 2 ** 31 + 1, 2 ** 33 + 3):
        a = get_tma_aligned_size(x, 4)
        assert a % 4 == 0 and 0 <= a - x < 4


@pytest.mark.gpu
def test_B51_per_token_quant_past_2_31_elements_gpu():
    """The reported size (M = 524,416, N = 4,096): the last rows quantise exactly like the same rows alone."""
    m, n = 524416, 4096
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    q, sf = dk.per_token_cast_to_fp8(x)
    tail = slice(m - 7, m)
    q2, sf2 = dk.per_token_cast_to_fp8(x[tail].clone())
    assert torch.equal(q[tail].view(torch.uint8), q2.view(torch.uint8)) and torch.equal(sf[tail], sf2)
