"""deepkernels.rails: the TMEM model and the tcgen05.mma.ws instruction model (float64 checks, CPU)."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from deepkernels.rails import (TMEM_BYTES, TensorMemory, WsInstr, datapath_layout, load_d_groups, mma_ws_gemm,
                               store_a_groups, tcgen05_mma_ws)

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("one_torch_thread")]



def _ints(*shape, lo=-4, hi=4, dtype=torch.bfloat16):
    """Small integers: exact in bf16/f16, and every sum below stays < 2**24, so fp32 results are exact."""
    return torch.randint(lo, hi + 1, shape).to(dtype)


# --- TMEM --------------------------------------------------------------------------------------------------
def test_tmem_geometry():
    t = TensorMemory()
    assert tuple(t.cells.shape) == (128, 512) and t.cells.dtype == torch.int32
    assert TMEM_BYTES == 256 * 1024


def test_tmem_packs_two_16bit_values_per_column_low_half_first():
    t = TensorMemory()
    x = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.bfloat16)
    t.store(7, 100, x)
    bits = x.view(torch.int16).to(torch.int64) & 0xFFFF
    expect = [(bits[0, 0] | bits[0, 1] << 16).item(), (bits[0, 2] | bits[0, 3] << 16).item()]
    assert [(v & 0xFFFFFFFF) for v in t.cells[7, 100:102].tolist()] == expect
    assert torch.equal(t.load(7, 1, 100, 4, torch.bfloat16), x)
    assert t.cells[7, 102].item() == 0 and t.cells[6, 100].item() == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tmem_round_trip_is_bit_exact(dtype):
    t = TensorMemory()
    x = torch.randn(32, 16).to(dtype)
    x[0, 0], x[1, 1] = float("nan"), float("-inf")
    t.store(32, 500 - 16 // (4 // x.element_size()), x)
    y = t.load(32, 32, 500 - 16 // (4 // x.element_size()), 16, dtype)
    assert torch.equal(y.view(torch.int16 if x.element_size() == 2 else torch.int32),
                       x.view(torch.int16 if x.element_size() == 2 else torch.int32))


def test_tmem_bounds_and_warp_restriction():
    t = TensorMemory()
    with pytest.raises(ValueError, match="lane"):
        t.store(120, 0, torch.zeros(16, 2))
    with pytest.raises(ValueError, match="col"):
        t.load(0, 1, 510, 4, torch.float32)
    with pytest.raises(ValueError, match="multiple of 2"):
        t.store(0, 0, torch.zeros(1, 3, dtype=torch.bfloat16))
    t.load(64, 32, 0, 4, torch.float32, warp=2)                      # warp 2 owns lanes 64..95
    with pytest.raises(ValueError, match="warp 1 may only access lanes \\[32, 64\\)"):
        t.load(64, 32, 0, 4, torch.float32, warp=1)
    with pytest.raises(TypeError, match="dtype"):
        t.load(0, 1, 0, 4, torch.float64)


# --- datapath layouts -------------------------------------------------------------------------------------
def test_datapath_layouts_of_the_ptx_tables():
    d, e, g = datapath_layout(128), datapath_layout(64), datapath_layout(32)
    assert (d.name, d.lane_groups, e.name, e.lane_groups, g.name, g.lane_groups) == ("D", 1, "E", 2, "G", 4)
    assert e.d_location(5, 70, 128) == (64 + 5, 6)                  # 2×2: second half of N on lanes 64..127
    assert e.d_location(63, 63, 128) == (63, 63)
    assert g.d_location(3, 200, 256) == (96 + 3, 8)                 # quarter 3 of N on lanes 96..127
    assert d.d_location(127, 255, 256) == (127, 255)
    f = datapath_layout(64, ws=False)                               # without .ws: 4×1, half the datapath
    assert f.name == "F" and f.lanes_used == 64 and f.d_location(20, 9, 64) == (32 + 4, 9)
    assert e.lanes_used == g.lanes_used == d.lanes_used == 128
    with pytest.raises(ValueError, match="m must be 64 or 128"):
        datapath_layout(32, ws=False)


# --- instruction descriptor -------------------------------------------------------------------------------
@pytest.mark.parametrize("kw, exc, match", [
    (dict(m=16, n=64), ValueError, "^m must"),
    (dict(m=256, n=64), ValueError, "^m must"),
    (dict(m=64, n=192), ValueError, "^n must"),
    (dict(m=64, n=32), ValueError, "^n must"),
    (dict(m=64, n=64, kind="tf32"), ValueError, "^kind must"),
    (dict(m=64, n=64, a_dtype=torch.float32), TypeError, "^a_dtype"),
    (dict(m=64, n=64, d_dtype=torch.bfloat16), TypeError, "^d_dtype"),
])
def test_illegal_instruction_shapes_raise_naming_the_argument(kw, exc, match):
    with pytest.raises(exc, match=match):
        WsInstr(**kw)


@pytest.mark.parametrize("m", [32, 64, 128])
@pytest.mark.parametrize("n", [64, 128, 256])
def test_legal_shapes(m, n):
    i = WsInstr(m=m, n=n)
    assert (i.k, i.lane_groups, i.n_per_group, i.a_columns, i.multiplies) == (16, 128 // m, n * m // 128, 8, m * n * 16)
    assert i.ptx == "tcgen05.mma.ws.cta_group::1.kind::f16"


# --- one instruction --------------------------------------------------------------------------------------
@pytest.mark.parametrize("m,n", [(32, 256), (64, 128), (128, 64)])
def test_each_lane_group_multiplies_its_own_a_by_its_n_slice(m, n):
    """Different A per lane group (the hardware does not check they are equal): D_g = A_g · B_gᵀ, written into
    lane group g only; every cell outside D keeps its NaN sentinel."""
    instr, t = WsInstr(m=m, n=n), TensorMemory()
    t.fill(float("nan"))
    a = [_ints(m, 16) for _ in range(instr.lane_groups)]
    b = _ints(n, 16)
    store_a_groups(t, instr, a, a_tmem_col=8)
    tcgen05_mma_ws(t, instr, a_tmem_col=8, b=b, d_tmem_col=64, enable_input_d=False)
    ng = instr.n_per_group
    for g, d_g in enumerate(load_d_groups(t, instr, 64)):
        expect = a[g].double() @ b[g * ng:(g + 1) * ng].double().T
        assert torch.equal(d_g.double(), expect)
    cells = t.cells.view(torch.float32)
    assert torch.isnan(cells[:, :8]).all() and torch.isnan(cells[:, 16:64]).all()
    assert torch.isnan(cells[:, 64 + ng:]).all()


def test_a_is_read_from_the_groups_own_lanes_only():
    """Leave group 1's copy of A as NaN: D_1 is NaN, D_0 is clean (why the official use copies A)."""
    instr, t = WsInstr(m=64, n=128), TensorMemory()
    t.fill(float("nan"))
    a0, b = _ints(64, 16), _ints(128, 16)
    t.store(0, 0, a0)                                               # lanes 0..63 only
    tcgen05_mma_ws(t, instr, a_tmem_col=0, b=b, d_tmem_col=32, enable_input_d=False)
    d0, d1 = load_d_groups(t, instr, 32)
    assert torch.equal(d0.double(), a0.double() @ b[:64].double().T)
    assert torch.isnan(d1).all()


def test_enable_input_d_accumulates():
    instr, t = WsInstr(m=64, n=64), TensorMemory()
    a, b1, b2 = _ints(64, 16), _ints(64, 16), _ints(64, 16)
    store_a_groups(t, instr, [a, a], 0)
    tcgen05_mma_ws(t, instr, a_tmem_col=0, b=b1, d_tmem_col=16, enable_input_d=False)
    tcgen05_mma_ws(t, instr, a_tmem_col=0, b=b2, d_tmem_col=16, enable_input_d=True)
    d = torch.cat(load_d_groups(t, instr, 16), dim=1).double()
    assert torch.equal(d, a.double() @ (b1.double() + b2.double()).T)


def test_instruction_argument_errors():
    instr, t = WsInstr(m=64, n=128), TensorMemory()
    with pytest.raises(ValueError, match="^b must have shape \\[128, 16\\]"):
        tcgen05_mma_ws(t, instr, a_tmem_col=0, b=torch.zeros(128, 32, dtype=torch.bfloat16), d_tmem_col=8,
                       enable_input_d=False)
    with pytest.raises(TypeError, match="^b must have dtype"):
        tcgen05_mma_ws(t, instr, a_tmem_col=0, b=torch.zeros(128, 16, dtype=torch.float16), d_tmem_col=8,
                       enable_input_d=False)
    with pytest.raises(ValueError, match="^d_tmem_col"):
        tcgen05_mma_ws(t, instr, a_tmem_col=0, b=torch.zeros(128, 16, dtype=torch.bfloat16), d_tmem_col=480,
                       enable_input_d=False)
    with pytest.raises(ValueError, match="^d_tmem_col: D columns \\[4, 68\\) overlap"):
        tcgen05_mma_ws(t, instr, a_tmem_col=0, b=torch.zeros(128, 16, dtype=torch.bfloat16), d_tmem_col=4,
                       enable_input_d=False)
    with pytest.raises(ValueError, match="^b: K = 24"):
        mma_ws_gemm(t, instr, a_tmem_col=0, b=torch.zeros(128, 24, dtype=torch.bfloat16), d_tmem_col=100)
    with pytest.raises(ValueError, match="^a_groups must hold 2"):
        store_a_groups(t, instr, [torch.zeros(64, 16, dtype=torch.bfloat16)], 0)


# --- a whole GEMM, random data against float64 --------------------------------------------------------------
@settings(max_examples=12)
@given(m=st.sampled_from([32, 64, 128]), n=st.sampled_from([64, 128, 256]), k_steps=st.integers(1, 6),
       f16=st.booleans())
def test_gemm_matches_float64_matmul(m, n, k_steps, f16):
    """Copied A (the usual use): D = A·Bᵀ within one fp32 rounding per instruction of the float64 product."""
    dtype = torch.float16 if f16 else torch.bfloat16
    instr, t = WsInstr(m=m, n=n, a_dtype=dtype), TensorMemory()
    a, b = torch.randn(m, 16 * k_steps).to(dtype), torch.randn(n, 16 * k_steps).to(dtype)
    store_a_groups(t, instr, [a] * instr.lane_groups, 0)
    assert mma_ws_gemm(t, instr, a_tmem_col=0, b=b, d_tmem_col=8 * k_steps) == k_steps
    d = torch.cat(load_d_groups(t, instr, 8 * k_steps), dim=1).double()
    ref = a.double() @ b.double().T
    bound = (k_steps + 1) * 2.0 ** -24 * (a.double().abs() @ b.double().abs().T)
    assert ((d - ref).abs() <= bound).all()
