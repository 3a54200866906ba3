"""deepkernels.quant FP8 quantizers and SF layouts: bit-exact against an independent numpy/bit-level reference."""
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

import deepkernels as dk
from deepkernels.quant import fp8 as qfp8

pytestmark = pytest.mark.reference

# ---------------------------------------------------------------------------------------------------------------
# independent references (numpy float32 arithmetic + a bit-level e4m3 rounder written from the format definition)

_E4M3_POS = np.array(sorted({(1 + m / 8) * 2.0 ** (e - 7) if e else (m / 8) * 2.0 ** -6
                             for e in range(16) for m in range(8) if not (e == 15 and m == 7)}))


def e4m3_round(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even onto e4m3fn values, saturating at 448; NaN stays NaN. float64 math (exact)."""
    x = np.asarray(x, dtype=np.float64)
    out = np.empty_like(x)
    for i, v in np.ndenumerate(x):
        if math.isnan(v):
            out[i] = np.nan
            continue
        a = min(abs(v), 448.0)
        j = np.searchsorted(_E4M3_POS, a)
        if j < len(_E4M3_POS) and _E4M3_POS[j] == a:
            r = a
        else:
            lo, hi = _E4M3_POS[j - 1], _E4M3_POS[j]
            if a - lo < hi - a:
                r = lo
            elif hi - a < a - lo:
                r = hi
            else:  # tie: the code with an even mantissa LSB; codes are consecutive, index parity = LSB parity
                r = lo if (j - 1) % 2 == 0 else hi
        out[i] = math.copysign(r, v)
    return out


def ue8m0_ref(v: float) -> float:
    """Smallest power of two >= |v|, clamped to [2^-126, 2^127] (NaN, inf -> 2^127)."""
    v = abs(float(np.float32(v)))
    if math.isnan(v) or math.isinf(v):
        return 2.0 ** 127
    if v == 0:
        return 2.0 ** -126
    m, e = math.frexp(v)  # v = m * 2^e, m in [0.5, 1)
    p = e - 1 if m == 0.5 else e
    return 2.0 ** min(max(p, -126), 127)


def per_token_ref(x: np.ndarray, use_ue8m0: bool, gran_k: int):
    x = x.astype(np.float32)
    m, n = x.shape
    g = -(-n // gran_k)
    xp = np.zeros((m, g * gran_k), np.float32)
    xp[:, :n] = x
    xv = xp.reshape(m, g, gran_k)
    with np.errstate(invalid="ignore"):
        amax = np.abs(xv).max(axis=2)
    sf = np.maximum(amax, np.float32(1e-4)).astype(np.float32)
    bad = ~np.isfinite(amax)                 # a group holding +-inf or NaN (deepkernels rule, quant/fp8.py)
    sf = np.where(bad, np.float32(np.nan), sf)
    sf = (sf / np.float32(448.0)).astype(np.float32)
    if use_ue8m0:
        sf = np.vectorize(ue8m0_ref)(sf).astype(np.float32)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        inv = (np.float32(1.0) / sf).astype(np.float32)
        inv = np.where(bad, np.float32(np.nan), inv)   # its data is all NaN (also with UE8M0's 2^127 scale)
        q = e4m3_round((xv * inv[:, :, None]).astype(np.float32)).reshape(m, -1)[:, :n]
    return q, sf


def q_np(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy().astype(np.float64)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return np.array_equal(a, b, equal_nan=True)


# ---------------------------------------------------------------------------------------------------------------
# ceil_to_ue8m0, e4m3 cast

HAND_VALUES = [1.0, 2.0, 0.5, 2.0 ** -126, 2.0 ** -130, 0.0, -0.0, 1e-30, 448.0, 464.0, 465.0, 3.0, -4.0,
               float(np.nextafter(np.float32(1.0), np.float32(2.0))), float(np.nextafter(np.float32(4.0), np.float32(0))),
               2.0 ** 127, 3.0e38, float("inf"), float("nan"), 1e-4, 1e-4 / 448]


def test_ceil_to_ue8m0_hand_values():
    x = torch.tensor(HAND_VALUES, dtype=torch.float32)
    got = dk.ceil_to_ue8m0(x)
    assert got.dtype == torch.float32 and got.shape == x.shape
    exp = np.array([ue8m0_ref(v) for v in HAND_VALUES])
    assert same(q_np(got), exp)
    # exact powers stay, just above goes up one power, 0 -> 2^-126
    assert got[0] == 1.0 and got[13] == 2.0 and got[5] == 2.0 ** -126 and got[7] == 2.0 ** -99


def test_ceil_to_ue8m0_bf16_input_and_type_error():
    assert torch.equal(dk.ceil_to_ue8m0(torch.tensor([3.0], dtype=torch.bfloat16)), torch.tensor([4.0]))
    with pytest.raises(TypeError):
        dk.ceil_to_ue8m0(torch.tensor([3]))
    with pytest.raises(TypeError):
        dk.ceil_to_ue8m0([3.0])


def test_cast_to_e4m3_saturates_never_nan():
    x = torch.tensor([448.0, 456.0, 464.0, 465.0, 479.0, 480.0, 1000.0, -465.0, -1000.0, float("inf"),
                      float("-inf"), float("nan"), 1e-30, -0.0, 126.24, 2.0 ** -10, 3 * 2.0 ** -10])
    got = qfp8.cast_to_e4m3(x)
    assert same(q_np(got), e4m3_round(x.numpy()))
    assert not torch.isnan(got.float()[:11]).any()
    assert got.float()[14] == 128.0  # carry (B55): 126.24 -> 128, not 64


def test_e4m3_all_float32_grid_matches_bit_reference():
    # a dense sweep over magnitudes, including every midpoint between e4m3 values (ties)
    mids = (_E4M3_POS[1:] + _E4M3_POS[:-1]) / 2
    vals = np.concatenate([_E4M3_POS, mids, mids * (1 + 2.0 ** -20), mids * (1 - 2.0 ** -20)])
    vals = np.concatenate([vals, -vals]).astype(np.float32)
    got = q_np(qfp8.cast_to_e4m3(torch.from_numpy(vals)))
    assert same(got, e4m3_round(vals))


# ---------------------------------------------------------------------------------------------------------------
# per-token / per-block / per-channel

@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_token_hand_picked_rows(use_ue8m0):
    gk = 4
    rows = [
        [448.0, 1.0, -2.0, 0.5],          # amax 448 -> sf 1 (or 1 with ue8m0)
        [464.0, 448.0, 1.0, 0.0],
        [465.0, -465.0, 232.5, 1e-30],
        [1e-30, -1e-30, 0.0, 0.0],        # below the 1e-4 floor
        [0.0, 0.0, 0.0, 0.0],             # all-zero tile: finite scale, zeros
        [1.0, 2.0, 4.0, 0.25],            # exact powers of two
        [float(np.nextafter(np.float32(1), np.float32(2))), 1.0, 0.0, 0.0],  # just above a power
        [float("nan"), 1.0, 2.0, 3.0],    # NaN tile
    ]
    x = torch.tensor(rows, dtype=torch.float32)
    q, sf = dk.per_token_cast_to_fp8(x, use_ue8m0=use_ue8m0, gran_k=gk)
    q_ref, sf_ref = per_token_ref(x.numpy(), use_ue8m0, gk)
    assert q.dtype == torch.float8_e4m3fn and q.shape == x.shape and q.is_contiguous()
    assert sf.dtype == torch.float32 and sf.shape == (len(rows), 1)
    assert same(sf.numpy().astype(np.float64), sf_ref.astype(np.float64))
    assert same(q_np(q), q_ref)
    assert torch.isfinite(sf[:7]).all() and (sf[:7] > 0).all()
    assert not torch.isnan(q.float()[:7]).any()
    assert q.float()[:7].abs().max() <= 448
    assert torch.isnan(q.float()[7]).any()


@given(st.integers(1, 9), st.integers(1, 300), st.sampled_from([32, 128]), st.booleans(),
       st.sampled_from([torch.float32, torch.bfloat16]), st.floats(-30, 30))
@settings(max_examples=15, deadline=None)
def test_per_token_matches_reference(m, n, gran_k, use_ue8m0, dtype, log_scale):
    x = (torch.randn(m, n) * 2.0 ** log_scale).to(dtype)
    q, sf = dk.per_token_cast_to_fp8(x, use_ue8m0, gran_k)
    q_ref, sf_ref = per_token_ref(x.float().numpy(), use_ue8m0, gran_k)
    assert same(sf.numpy().astype(np.float64), sf_ref.astype(np.float64))
    assert same(q_np(q), q_ref)


def test_per_token_noncontiguous_and_zero_padding():
    base = torch.randn(5, 400, dtype=torch.bfloat16)
    x = base[:, 7:7 + 200]                   # strided rows, n % 128 != 0
    q, sf = dk.per_token_cast_to_fp8(x, False)
    q2, sf2 = dk.per_token_cast_to_fp8(x.contiguous(), False)
    assert torch.equal(q.view(torch.uint8), q2.view(torch.uint8)) and torch.equal(sf, sf2)
    # the tail group's amax only sees real columns
    assert torch.equal(sf[:, 1], x[:, 128:].abs().float().amax(1).clamp(min=1e-4) / 448.0)


def test_per_token_packed_ue8m0():
    x = torch.randn(3, 128 * 6)
    q, sf = dk.per_token_cast_to_fp8(x, True, use_packed_ue8m0=True)
    _, sf_fp32 = dk.per_token_cast_to_fp8(x, True)
    assert sf.dtype == torch.int32 and sf.shape == (3, 2)
    unpacked = dk.unpack_ue8m0_from_int(sf)
    assert torch.equal(unpacked[:, :6], sf_fp32) and torch.equal(unpacked[:, 6:], torch.ones(3, 2))
    with pytest.raises(ValueError, match="use_ue8m0"):
        dk.per_token_cast_to_fp8(x, False, use_packed_ue8m0=True)


@pytest.mark.parametrize("use_ue8m0", [False, True])
def test_per_block_matches_reference(use_ue8m0):
    m, n, gk = 130, 200, 64
    x = torch.randn(m, n, dtype=torch.bfloat16) * 3
    x[:64, :64] = 0  # an all-zero block
    q, sf = dk.per_block_cast_to_fp8(x, use_ue8m0, gk)
    assert q.shape == (m, n) and sf.shape == (3, 4) and q.is_contiguous()
    xf = x.float().numpy()
    for bi in range(3):
        for bj in range(4):
            blk = xf[bi * gk:(bi + 1) * gk, bj * gk:(bj + 1) * gk]
            s = np.float32(max(np.abs(blk).max(), np.float32(1e-4))) / np.float32(448)
            s = np.float32(ue8m0_ref(s)) if use_ue8m0 else np.float32(s)
            assert sf[bi, bj].item() == s
            ref = e4m3_round((blk * (np.float32(1) / s)).astype(np.float32))
            assert same(q_np(q[bi * gk:(bi + 1) * gk, bj * gk:(bj + 1) * gk]), ref)
    assert sf[0, 0] > 0 and torch.isfinite(sf).all()


def test_per_channel_matches_per_token_of_transpose():
    x = torch.randn(256, 50)
    q, sf = dk.per_channel_cast_to_fp8(x, True)
    qt, sft = dk.per_token_cast_to_fp8(x.T.contiguous(), True)
    assert sf.shape == (2, 50)
    assert torch.equal(q.T.contiguous().view(torch.uint8), qt.view(torch.uint8)) and torch.equal(sf.T, sft)
    with pytest.raises(ValueError, match="multiple of gran_k"):
        dk.per_channel_cast_to_fp8(torch.randn(100, 4), False)


def test_per_custom_dims():
    x = torch.randn(10, 64)
    q, sf = dk.per_custom_dims_cast_to_fp8(x, (0,), False)
    assert sf.shape == (10,)
    assert torch.equal(sf, x.abs().amax(1).clamp(min=1e-4) / 448.0)
    with pytest.raises(ValueError):
        dk.per_custom_dims_cast_to_fp8(x, (2,), False)
    q, sf = dk.per_custom_dims_cast_to_fp8(torch.empty(3, 0), (0,), False)   # empty reduction: floor scale
    assert q.shape == (3, 0) and torch.equal(sf, torch.full((3,), 1e-4) / 448.0)


@pytest.mark.parametrize("shape", [(0, 128), (0, 0), (4, 0), (0, 300)])
def test_zero_size_inputs(shape):  # B50
    x = torch.empty(shape, dtype=torch.bfloat16)
    q, sf = dk.per_token_cast_to_fp8(x, True)
    assert q.shape == shape and sf.shape == (shape[0], -(-shape[1] // 128))
    q, sf = dk.per_block_cast_to_fp8(x, False)
    assert q.shape == shape and sf.shape == (-(-shape[0] // 128), -(-shape[1] // 128))
    assert dk.cast_back_from_fp8(q, sf).shape == shape


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="x must have 2 dims"):
        dk.per_token_cast_to_fp8(torch.randn(2, 3, 4))
    with pytest.raises(TypeError, match="dtype"):
        dk.per_token_cast_to_fp8(torch.ones(2, 3, dtype=torch.int32))
    with pytest.raises(ValueError, match="gran_k"):
        dk.per_block_cast_to_fp8(torch.randn(2, 3), False, 0)


# ---------------------------------------------------------------------------------------------------------------
# cast_back / round trips

@given(st.integers(1, 200), st.integers(1, 300), st.booleans(), st.sampled_from(["token", "block", "channel"]))
@settings(max_examples=12, deadline=None)
def test_round_trip_error_bound(m, n, use_ue8m0, kind):
    gk = 128
    if kind == "channel":
        m = -(-m // gk) * gk
    x = torch.randn(m, n) * 10
    cast = {"token": dk.per_token_cast_to_fp8, "block": dk.per_block_cast_to_fp8,
            "channel": dk.per_channel_cast_to_fp8}[kind]
    q, sf = cast(x, use_ue8m0, gk)
    back = dk.cast_back_from_fp8(q, sf, gk)
    # e4m3: 3 mantissa bits -> relative half-ulp 2^-4; subnormal spacing 2^-9 times the scale
    rows = torch.arange(m) // (1 if kind == "token" else gk)
    cols = torch.arange(n) // (1 if kind == "channel" else gk)
    s = sf[rows][:, cols]
    assert ((back - x).abs() <= x.abs() * 2.0 ** -4 + s * 2.0 ** -10).all()
    assert dk.testing.calc_diff(back, x) < 1e-3


def test_cast_back_packed_and_mn_major_sf():
    x = torch.randn(6, 256 * 3)
    q, sfp = dk.per_token_cast_to_fp8(x, True, use_packed_ue8m0=True)
    _, sf = dk.per_token_cast_to_fp8(x, True)
    a = dk.cast_back_from_fp8(q, sfp, use_packed_ue8m0=True)
    b = dk.cast_back_from_fp8(q, dk.get_mn_major_tma_aligned_tensor(sf))
    assert torch.equal(a, b)
    assert dk.cast_back_from_fp8(q, sf, out_dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="does not fit"):
        dk.cast_back_from_fp8(q, sf[:, :2])


# ---------------------------------------------------------------------------------------------------------------
# UE8M0 packing

def test_pack_unpack_ue8m0_byte_order():
    sf = torch.tensor([[1.0, 2.0, 0.5, 2.0 ** -126, 2.0 ** 127, 4.0, 8.0, 16.0]])
    packed = dk.pack_ue8m0_to_int(sf)
    assert packed.dtype == torch.int32 and packed.shape == (1, 2)
    b = packed.view(torch.uint8).tolist()[0]
    assert b == [127, 128, 126, 1, 254, 129, 130, 131]  # byte j of word w = element 4w+j
    assert torch.equal(dk.unpack_ue8m0_from_int(packed), sf)
    assert torch.equal(dk.unpack_ue8m0_from_int(packed.T.contiguous().T), sf)


@pytest.mark.parametrize("bad", [[1.5, 1, 1, 1], [-1.0, 1, 1, 1], [float("nan"), 1, 1, 1]])
def test_pack_ue8m0_rejects_non_powers(bad):
    with pytest.raises(ValueError, match="powers of two"):
        dk.pack_ue8m0_to_int(torch.tensor([bad]))


def test_pack_ue8m0_bad_shape_dtype():
    with pytest.raises(ValueError, match="multiple of 4"):
        dk.pack_ue8m0_to_int(torch.ones(2, 3))
    with pytest.raises(TypeError):
        dk.pack_ue8m0_to_int(torch.ones(2, 4, dtype=torch.float64))
