"""deepkernels.quant.kvcache / fp4: FlashMLA KV-cache formats byte for byte, FP4 e2m1 rounding and packing."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import deepkernels as dk
from deepkernels.quant import kvcache as kvc

pytestmark = pytest.mark.reference

D = {"v32": 576, "model1": 512, "v41": 512, "fp4": 512}


def make_kv(nb, bsz, fmt, scale=0.1):
    return (torch.randn(nb, bsz, 1, D[fmt]) * scale).clamp(-1, 1).bfloat16()


def spec_scale(amax: torch.Tensor) -> torch.Tensor:
    """docs/spec/mla.md §2.4 step 2 written the way FlashMLA's tests compute it (float log2 / ceil / pow)."""
    return torch.pow(2, torch.clamp_min(amax / 448.0, 1e-4).log2().ceil()).float()


def token_bytes_ref(x: torch.Tensor, fmt: str):
    """Independent per-token encoder: returns (data_record_bytes, scale_record_bytes) as numpy uint8 arrays."""
    f = dk.get_kv_format(fmt)
    xq = x[: f.d_quant].view(f.num_tiles, f.tile_size)
    s = spec_scale(xq.abs().float().amax(dim=1))
    q = (xq.float() / s[:, None]).to(torch.float8_e4m3fn).view(torch.uint8).flatten().numpy()
    rope = x[f.d_quant:].contiguous().view(torch.uint8).numpy()
    if fmt == "v32":
        return np.concatenate([q, s.numpy().astype("<f4").view(np.uint8), rope]), None
    e = (np.log2(s.numpy()).astype(np.int64) + 127).astype(np.uint8)
    if fmt == "model1":
        return np.concatenate([q, rope]), np.concatenate([e, [0]]).astype(np.uint8)
    return np.concatenate([q, e]), None


@pytest.mark.parametrize("fmt", ["v32", "model1", "v41"])
def test_fp8_formats_byte_exact(fmt):
    nb, bsz = 2, 5
    kv = make_kv(nb, bsz, fmt, scale=3.0)
    kv[0, 1] = 0                                   # all-zero token -> 2^-13 scales
    kv[1, 2, 0, :64] = 448 * 2.0 ** -3             # exact power-of-two amax
    kv[1, 3, 0, 0] = 1e-30
    packed = dk.quantize_kv_cache(kv, fmt)
    f = dk.get_kv_format(fmt)
    assert packed.shape == (nb, bsz, 1, f.bytes_per_token) and packed.dtype == torch.float8_e4m3fn
    assert packed.stride()[1:] == (f.bytes_per_token, f.bytes_per_token, 1)
    flat = packed.view(torch.uint8).as_strided((nb * packed.stride(0),), (1,)).numpy()
    for blk in range(nb):
        for r in range(bsz):
            data, scales = token_bytes_ref(kv[blk, r, 0], fmt)
            a = f.data_address(blk, r, packed.stride(0))
            assert np.array_equal(flat[a:a + len(data)], data), (blk, r)
            if scales is not None:
                sa = f.scale_address(blk, r, packed.stride(0), bsz)
                assert sa == blk * packed.stride(0) + bsz * 576 + r * 8
                assert np.array_equal(flat[sa:sa + 8], scales), (blk, r)
    v = dk.kv_cache_views(packed)
    assert float(v.scales[0, 1, 0].float()) == 2.0 ** -13
    assert (v.data[0, 1] == 0).all()


def test_pow2_scale_equals_flashmla_log2_formula_for_every_bf16():
    bits = torch.arange(0, 0x7F80, dtype=torch.int32).to(torch.int16)      # all non-negative finite bf16
    amax = bits.view(torch.bfloat16).float()
    assert torch.equal(kvc._pow2_scale(amax), spec_scale(amax))


@pytest.mark.parametrize("fmt", ["v32", "model1", "v41", "fp4"])
def test_round_trip_and_dequant_numerics(fmt):
    kv = make_kv(3, 16, fmt, scale=1.0)
    packed = dk.quantize_kv_cache(kv, fmt)
    back = dk.dequantize_kv_cache(packed, fmt)
    assert back.shape == kv.shape and back.dtype == torch.bfloat16
    f = dk.get_kv_format(fmt)
    x = kv.float().squeeze(2)
    err = (back.float().squeeze(2) - x).abs()
    v = dk.kv_cache_views(packed)
    s = v.scales.float().repeat_interleave(f.tile_size, dim=-1)
    if f.data_kind == "e4m3":
        bound = x[..., : f.d_quant].abs() * 2.0 ** -4 + s * 2.0 ** -10
        assert (err[..., : f.d_quant] <= bound).all()
        assert torch.equal(back.squeeze(2)[..., f.d_quant:], kv.squeeze(2)[..., f.d_quant:])  # RoPE copied
        assert dk.testing.calc_diff(back, kv) < 1e-3
    else:
        assert (err <= x.abs() * 0.25 + s * 0.5).all()
        assert dk.testing.calc_diff(back, kv) < 2e-2
    # power-of-two scales: the kernel-side numerics equal the reference
    assert torch.equal(dk.dequantize_kv_cache(packed, numerics="sm90"), back)


def test_v32_kernel_numerics_differ_for_non_power_of_two_scale_b19():
    packed = dk.quantize_kv_cache(make_kv(1, 2, "v32", 1.0), "v32")
    raw = packed.view(torch.uint8)
    raw[0, 0, 0, 512:516] = torch.tensor([0.013], dtype=torch.float32).view(torch.uint8)
    ref = dk.dequantize_kv_cache(packed)
    sm90 = dk.dequantize_kv_cache(packed, numerics="sm90")
    q = raw[0, 0, 0, :128].view(torch.float8_e4m3fn).float()
    assert torch.equal(ref[0, 0, 0, :128], (q * torch.tensor(0.013)).bfloat16())
    assert torch.equal(sm90[0, 0, 0, :128], q.bfloat16() * torch.tensor(0.013).bfloat16())
    assert torch.equal(ref[0, 1], sm90[0, 1])


def test_nan_tile_and_saturation():
    kv = make_kv(1, 2, "v32")
    kv[0, 0, 0, 130] = float("nan")               # tile 1 of token 0
    packed = dk.quantize_kv_cache(kv, "v32")
    v = dk.kv_cache_views(packed)
    assert torch.isnan(v.scales[0, 0, 1]) and torch.isfinite(v.scales[0, 0, [0, 2, 3]]).all()
    back = dk.dequantize_kv_cache(packed)
    assert torch.isnan(back[0, 0, 0, 128:256].float()).all()
    assert not torch.isnan(back[0, 0, 0, :128].float()).any() and not torch.isnan(back[0, 1].float()).any()
    q = v.data.view(torch.float8_e4m3fn).float()
    assert q[torch.isfinite(q)].abs().max() <= 448


def test_fp4_format_bytes():
    kv = make_kv(2, 3, "fp4", 1.0)
    kv[1, 2, 0, 16:32] = float("inf")
    packed = dk.quantize_kv_cache(kv, "fp4")
    raw = packed.view(torch.uint8)
    codes, scales = dk.quantize_fp4_e2m1(kv[0, 0, 0])
    assert torch.equal(raw[0, 0, 0, :256], codes) and torch.equal(raw[0, 0, 0, 256:], scales.view(torch.uint8))
    assert raw[1, 2, 0, 256 + 1] == 0x7F                        # tile with inf -> NaN scale
    back = dk.dequantize_kv_cache(packed)
    assert torch.isnan(back[1, 2, 0, 16:32].float()).all() and not torch.isnan(back[1, 2, 0, :16].float()).any()


def test_block_stride_and_model1_padding():
    kv = make_kv(3, 64, "model1")
    packed = dk.quantize_kv_cache(kv, "model1")
    assert packed.stride(0) == 65 * 576 and packed.stride(0) % 576 == 0
    blk = packed.view(torch.uint8).as_strided((3, packed.stride(0)), (packed.stride(0), 1))
    assert (blk[:, 64 * 576 + 7::8][:, :64] == 0).all()          # pad byte of each scale record
    assert (blk[:, 64 * 584:] == 0).all()                         # block padding
    # FlashMLA-style non-contiguous V3.2 cache: stride(0) = (B+1)*656
    kv32 = make_kv(3, 4, "v32")
    p = dk.quantize_kv_cache(kv32, "v32", block_stride=5 * 656)
    assert p.stride(0) == 5 * 656 and not p.is_contiguous()
    assert torch.equal(dk.dequantize_kv_cache(p), dk.dequantize_kv_cache(dk.quantize_kv_cache(kv32, "v32")))
    with pytest.raises(ValueError, match="block_stride"):
        dk.quantize_kv_cache(kv32, "v32", block_stride=100)


def test_format_table_and_detection():
    assert {n: f.bytes_per_token for n, f in dk.KV_FORMATS.items()} == \
        {"v32": 656, "model1": 584, "v41": 528, "fp4": 288}
    for n, f in dk.KV_FORMATS.items():
        assert dk.kv_format_from_bytes_per_token(f.bytes_per_token) == n
        assert f.d_nope + f.d_rope == f.d_qk
        assert f.num_tiles * f.tile_size == f.d_quant
        per_token = f.data_stride + (f.scale_stride if f.split_block else 0)
        assert per_token == f.bytes_per_token
    m1 = dk.get_kv_format("MODEL1")
    assert (m1.scales_start(64), m1.rope_offset, m1.data_stride, m1.scale_stride) == (64 * 576, 448, 576, 8)
    assert dk.get_kv_format("v3.2").rope_address(2, 3, 10_000) == 20_000 + 3 * 656 + 528
    assert dk.get_kv_format("v4.1").rope_address(0, 0, 528) is None
    with pytest.raises(ValueError, match="bytes_per_token"):
        dk.kv_format_from_bytes_per_token(576)
    with pytest.raises(ValueError, match="fmt"):
        dk.get_kv_format("v40")


def test_bad_inputs():
    with pytest.raises(ValueError, match=r"\[num_blocks, page_block_size, 1, 576\]"):
        dk.quantize_kv_cache(make_kv(1, 2, "model1"), "v32")
    with pytest.raises(TypeError, match="bfloat16"):
        dk.quantize_kv_cache(make_kv(1, 2, "v32").float(), "v32")
    with pytest.raises(ValueError, match="1, 512"):
        dk.quantize_kv_cache(torch.zeros(1, 2, 2, 512, dtype=torch.bfloat16), "v41")
    packed = dk.quantize_kv_cache(make_kv(2, 4, "v41"), "v41")
    with pytest.raises(ValueError, match="528"):
        dk.dequantize_kv_cache(packed, "v32")
    with pytest.raises(ValueError, match="numerics"):
        dk.dequantize_kv_cache(packed, numerics="sm100")
    with pytest.raises(ValueError, match="stride"):
        dk.dequantize_kv_cache(packed.view(torch.uint8)[:, :, :, :].transpose(0, 1).contiguous().transpose(0, 1)
                               .as_strided(packed.shape, (528, 2 * 528, 528, 1)))


def test_zero_size_caches():
    for fmt in D:
        kv = torch.empty(0, 64, 1, D[fmt], dtype=torch.bfloat16)
        p = dk.quantize_kv_cache(kv, fmt)
        assert p.shape[0] == 0 and dk.dequantize_kv_cache(p).shape == kv.shape


# ---------------------------------------------------------------------------------------------------------------
# abs_indices -> cache rows

def test_abs_indices_to_kvcache_indices():
    B = 4
    block_table = torch.tensor([[7, 2, 2147480000], [1, 0, 5]], dtype=torch.int32)
    abs_idx = torch.tensor([[[0, 5, -1, 7]], [[11, -1, 3, 8]]], dtype=torch.int32)
    out = dk.abs_indices_to_kvcache_indices(abs_idx, block_table, B)
    assert out.dtype == torch.int32 and out.shape == abs_idx.shape
    assert out.tolist() == [[[28, 9, -1, 11]], [[23, -1, 7, 20]]]
    # junk beyond the table, other negatives: invalid (-1), never an address
    junk = torch.tensor([[[12, -5, 2 ** 31 - 1]], [[100, 0, -2 ** 31]]], dtype=torch.int32)
    assert (dk.abs_indices_to_kvcache_indices(junk, block_table, B) == -1).sum() == 5
    with pytest.raises(ValueError, match="share b"):
        dk.abs_indices_to_kvcache_indices(abs_idx[:1], block_table, B)
    with pytest.raises(ValueError, match="page_block_size"):
        dk.abs_indices_to_kvcache_indices(abs_idx, block_table, 0)


@given(st.integers(1, 3), st.integers(1, 5), st.sampled_from([1, 4, 64]))
@settings(max_examples=10, deadline=None)
def test_abs_indices_matches_loop(b, topk, B):
    max_blocks = 3
    table = torch.randint(0, 50, (b, max_blocks), dtype=torch.int32)
    a = torch.randint(-1, max_blocks * B, (b, 2, topk), dtype=torch.int32)
    out = dk.abs_indices_to_kvcache_indices(a, table, B)
    for i in range(b):
        for j in range(2):
            for t in range(topk):
                v = int(a[i, j, t])
                exp = -1 if v == -1 else int(table[i, v // B]) * B + v % B
                assert int(out[i, j, t]) == exp


# ---------------------------------------------------------------------------------------------------------------
# FP4 e2m1

def test_round_to_e2m1_ties_saturation_sign():
    x = torch.tensor([0.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 0.26, 4.9, 6.0, 7.0, float("inf"),
                      -float("inf"), -0.1, -0.0, -1.25, 2.9])
    codes = dk.round_to_e2m1(x).tolist()
    assert codes == [0, 0, 2, 2, 4, 4, 6, 6, 1, 6, 7, 7, 7, 15, 8, 8, 10, 5]
    assert dk.round_to_e2m1(torch.tensor([float("nan")])).item() & 7 == 0
    vals = dk.e2m1_to_float(torch.arange(16, dtype=torch.uint8))
    assert vals[:8].tolist() == list(dk.E2M1_VALUES) and vals[9:].tolist() == [-v for v in dk.E2M1_VALUES[1:]]


def test_round_to_e2m1_is_nearest_even_exhaustive_grid():
    mags = torch.tensor(dk.E2M1_VALUES)
    y = torch.linspace(-7, 7, 20001)
    codes = dk.round_to_e2m1(y)
    got = dk.e2m1_to_float(codes)
    d = (y.abs().clamp(max=6)[:, None] - mags[None]).abs()
    best = d.min(dim=1).values
    assert torch.allclose((got.abs() - y.abs().clamp(max=6)).abs(), best)   # always a nearest value
    ties = (d == best[:, None]).sum(1) > 1
    assert ((codes[ties] & 1) == 0).all()                                   # ties -> even code


def test_pack_unpack_e2m1_nibble_order():
    codes = torch.tensor([1, 2, 3, 4, 15, 0], dtype=torch.uint8)
    packed = dk.pack_e2m1(codes)
    assert packed.tolist() == [0x21, 0x43, 0x0F]                           # even index low nibble
    assert torch.equal(dk.unpack_e2m1(packed), codes)
    with pytest.raises(ValueError, match="even"):
        dk.pack_e2m1(codes[:5])


def test_quantize_fp4_scale_rule():
    x = torch.zeros(4, 16)
    x[0, 0] = 6.0                                   # amax/6 = 1 -> scale 1
    x[1] = 0                                        # all zero -> clamp to 2^-9
    x[2, 3] = 1e6                                   # amax/6 > 448 -> 448
    x[3, 5] = float("nan")                          # NaN tile -> NaN scale
    packed, scales = dk.quantize_fp4_e2m1(x)
    assert packed.shape == (4, 8) and scales.shape == (4, 1) and scales.dtype == torch.float8_e4m3fn
    s = scales.float().flatten()
    assert s[0] == 1.0 and s[1] == 2.0 ** -9 and s[2] == 448.0 and torch.isnan(s[3])
    assert scales.view(torch.uint8)[3, 0] == 0x7F
    back = dk.dequantize_fp4_e2m1(packed, scales)
    assert back[0, 0] == 6.0 and (back[1] == 0).all() and back[2, 3] == 6 * 448


def test_deepgemm_per_token_fp4_rounds_ties_down():
    x = torch.full((1, 128), 0.75 * 6 / 6)          # amax 0.75 -> sf 0.125 -> x/sf = 6 (saturating top)
    x[0, 1:] = 0.75 / 8 * 6 / 6                     # x/sf = 0.75: a tie, DeepGEMM bucketize -> 0.5
    packed, sf = dk.per_token_cast_to_fp4(x, use_ue8m0=False)
    back = dk.cast_back_from_fp4(packed, sf)
    assert packed.dtype == torch.int8 and packed.shape == (1, 64)
    assert back[0, 0] == pytest.approx(0.75) and back[0, 1] == pytest.approx(0.5 * float(sf[0, 0]))
    p2, sf2 = dk.per_token_cast_to_fp4(torch.randn(3, 512), use_ue8m0=True, use_packed_ue8m0=True)
    assert sf2.dtype == torch.int32 and sf2.shape == (3, 1)


def test_deepgemm_fp4_codes_match_bucketize():
    from deepkernels.quant.fp4 import _deepgemm_fp4_codes
    x = torch.cat([torch.linspace(-7, 7, 2001), torch.tensor([0.25, 0.75, 5.0, -0.75, float("nan"), float("inf"),
                                                              -float("inf"), -0.0])])
    mids = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    idx = torch.bucketize(x.abs().clamp(max=6.0), mids)
    exp = idx.to(torch.uint8) | (((x < 0) & (idx != 0)).to(torch.uint8) << 3)
    assert torch.equal(_deepgemm_fp4_codes(x), exp)
