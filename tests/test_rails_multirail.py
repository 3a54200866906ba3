"""deepkernels.rails: official vs multi-rail fillings of tcgen05.mma.ws, the wrong variant, the seed's example."""
import pytest
import torch
from hypothesis import given, settings, strategies as st

from deepkernels.rails import (combine_multirail, combine_official, kv_smem_tiles, merge_rails, multirail_operands,
                               official_operands, qk_multirail_ws, qk_official_ws, qk_resources, DecodeConfig,
                               rail_feature_index, rail_partials, rail_view_kv, split_rails,
                               wrong_multirail_operands, ws_formula)

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("one_torch_thread")]



def _ints(*shape, dtype=torch.bfloat16):
    return torch.randint(-4, 5, shape).to(dtype)


# --- the seed's worked example (§2.5) ------------------------------------------------------------------------
Q = torch.tensor([[1.0, 2.0, 3.0, 4.0]], dtype=torch.float64)
KV = torch.tensor([[5.0, 6.0, 7.0, 8.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)


def test_seed_example_on_the_formula():
    """1 head, 4 features, 2 tokens; the seed splits the features into contiguous halves (block = 2)."""
    a, b = official_operands(Q, KV, lane_groups=2)
    d = ws_formula(a, b)
    assert [x.tolist() for x in d] == [[[70.0]], [[10.0]]]
    assert combine_official(d).tolist() == [[70.0, 10.0]]
    assert sum(x.numel() for x in a) == 8                              # A stores 8 numbers

    a, b = multirail_operands(Q, KV, lane_groups=2, rails=2, block=2)
    assert [x.tolist() for x in a] == [[[1.0, 2.0]], [[3.0, 4.0]]]
    assert b.tolist() == [[5.0, 6.0], [1.0, 1.0], [7.0, 8.0], [1.0, 1.0]]   # [k1[0:2], k2[0:2]; k1[2:4], k2[2:4]]
    d = ws_formula(a, b)
    assert [x.tolist() for x in d] == [[[17.0, 3.0]], [[53.0, 7.0]]]
    assert combine_multirail(d, rails=2).tolist() == [[70.0, 10.0]]
    assert sum(x.numel() for x in a) == 4                              # A stores 4 numbers

    a, b = wrong_multirail_operands(Q, KV, lane_groups=2, rails=2, block=2)
    d = ws_formula(a, b)                                               # group 1: Q_R1 · K_R0ᵀ, a cross term
    assert [x.tolist() for x in d] == [[[17.0, 3.0]], [[39.0, 7.0]]]
    assert combine_multirail(d, rails=2).tolist() == [[56.0, 10.0]]


def test_seed_example_on_the_instruction_model():
    """The same numbers through TMEM and real .ws shapes: pad to M = 64 heads, 32 features (block 16 = the
    contiguous halves) and 64 tokens, k1 at token 0 and k2 at token 32 (the first token of lane group 1)."""
    q = torch.zeros(64, 32, dtype=torch.bfloat16)
    q[0, [0, 1, 16, 17]] = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.bfloat16)
    kv = torch.zeros(64, 32, dtype=torch.bfloat16)
    kv[0, [0, 1, 16, 17]] = torch.tensor([5.0, 6.0, 7.0, 8.0], dtype=torch.bfloat16)
    kv[32, [0, 1, 16, 17]] = 1.0
    off = qk_official_ws(q, kv)
    assert (off.d_groups[0][0, 0].item(), off.d_groups[1][0, 0].item()) == (70.0, 10.0)
    mr = qk_multirail_ws(q, kv, rails=2, block=16)
    assert mr.d_groups[0][0, [0, 32]].tolist() == [17.0, 3.0]
    assert mr.d_groups[1][0, [0, 32]].tolist() == [53.0, 7.0]
    for res in (off, mr):
        assert res.p[0, [0, 32]].tolist() == [70.0, 10.0]
        assert torch.equal(res.p.double(), q.double() @ kv.double().T)
    wrong = qk_multirail_ws(q, kv, rails=2, block=16, rearrange_b=False)
    assert wrong.p[0, [0, 32]].tolist() == [56.0, 10.0]


# --- rails -------------------------------------------------------------------------------------------------
def test_rails_are_interleaved_64_wide_blocks():
    idx = rail_feature_index(512, rails=2)
    assert idx.shape == (2, 256)
    blocks = [sorted(set((idx[r] // 64).tolist())) for r in range(2)]
    assert blocks == [[0, 2, 4, 6], [1, 3, 5, 7]]                     # seed §2.1: rail 0 |0|2|4|6|, rail 1 |1|3|5|7|
    assert idx[1, :3].tolist() == [64, 65, 66] and idx[0, 64].item() == 128
    assert sorted(torch.cat(list(idx)).tolist()) == list(range(512))
    assert [sorted(set((r // 64).tolist())) for r in rail_feature_index(512, 4)] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    with pytest.raises(ValueError, match="^d must be a positive multiple of rails·block"):
        rail_feature_index(576, rails=2)


def test_split_merge_round_trip():
    x = torch.randn(3, 5, 512)
    assert torch.equal(merge_rails(split_rails(x, 2), 64), x)
    assert torch.equal(merge_rails(split_rails(x, 4, 32), 32), x)


@pytest.mark.parametrize("rails,t", [(2, 64), (4, 64), (2, 128)])
def test_rail_view_of_kv_is_a_contiguous_slice_of_the_k_major_tile(rails, t):
    """FlashMLA re-views the K tile instead of copying it: in the K-major tile (64-feature atom columns one
    after another), the multi-rail B of K block i is rows [i·R·T, (i+1)·R·T) — contiguous, a plain view."""
    kv = torch.randn(t, 512)
    b = rail_view_kv(kv, rails)                                       # [R·T, 512/R]
    flat = kv_smem_tiles(kv).reshape(-1, 64)                          # [512/64 · T, 64]
    for i in range(512 // (64 * rails)):
        assert torch.equal(b[:, i * 64:(i + 1) * 64], flat[i * rails * t:(i + 1) * rails * t])


# --- instruction counts and columns, from the model ----------------------------------------------------------
def test_model_counts_agree_with_the_seed_table():
    q, kv = _ints(64, 512), _ints(64, 512)
    off, mr = qk_official_ws(q, kv), qk_multirail_ws(q, kv, rails=2)
    assert (off.instr.m, off.instr.n, off.instructions, off.instr.multiplies) == (64, 64, 32, 65_536)
    assert (mr.instr.m, mr.instr.n, mr.instructions, mr.instr.multiplies) == (64, 128, 16, 131_072)
    assert off.instructions * off.instr.multiplies == mr.instructions * mr.instr.multiplies == 2_097_152
    assert (off.q_columns, off.p_columns, mr.q_columns, mr.p_columns) == (256, 32, 128, 64)
    for res, rails in ((off, 1), (mr, 2)):
        r = qk_resources(DecodeConfig(rails=rails))
        assert (r.n, r.instructions, r.q_columns, r.p_columns) == (res.instr.n, res.instructions, res.q_columns,
                                                                   res.p_columns)
    ref = q.double() @ kv.double().T
    assert torch.equal(off.p.double(), ref) and torch.equal(mr.p.double(), ref)
    assert torch.equal(rail_partials(mr.d_groups, 2).sum(0), mr.p)


def test_wrong_variant_produces_the_cross_terms():
    q, kv = torch.randn(64, 512).bfloat16(), torch.randn(64, 512).bfloat16()
    res = qk_multirail_ws(q, kv, rails=2, rearrange_b=False)
    q_r, k_r = split_rails(q.double(), 2), split_rails(kv.double(), 2)
    cross = q_r[1] @ k_r[0].T                                          # Q_R1 · K_R0ᵀ
    assert torch.allclose(res.d_groups[1].double(), cross, rtol=1e-5, atol=1e-4)
    assert torch.allclose(res.d_groups[0].double(), q_r[0] @ k_r[0].T, rtol=1e-5, atol=1e-4)
    assert not torch.allclose(res.p.double(), q.double() @ kv.double().T, rtol=1e-2, atol=1e-1)


def test_filling_argument_errors():
    q, kv = _ints(64, 512), _ints(64, 512)
    with pytest.raises(ValueError, match="^rails must divide lane_groups = 2"):
        qk_multirail_ws(q, kv, rails=4)
    with pytest.raises(ValueError, match="^kv: T = 96 tokens give N = 96"):
        qk_official_ws(q, _ints(96, 512))
    with pytest.raises(ValueError, match="^kv: T = 256 tokens give N = 512"):
        qk_multirail_ws(q, _ints(256, 512), rails=2)
    with pytest.raises(ValueError, match="^q must have M"):
        qk_official_ws(_ints(48, 512), kv)
    with pytest.raises(ValueError, match="^kv must have shape \\[T, 512\\]"):
        qk_official_ws(q, _ints(64, 256))
    with pytest.raises(TypeError, match="^kv must have the dtype of q"):
        qk_official_ws(q, kv.half())


# --- property: both fillings are Q·Kᵀ ----------------------------------------------------------------------
@st.composite
def _qk_case(draw):
    m = draw(st.sampled_from([32, 64, 128]))
    groups = 128 // m
    rails = draw(st.sampled_from([r for r in (1, 2, 4) if groups % r == 0]))
    t = draw(st.sampled_from([t for t in (16, 32, 64, 128, 256) if rails * t in (64, 128, 256)]))
    block = draw(st.sampled_from([16, 32, 64]))
    d = rails * block * draw(st.integers(1, max(1, 256 // (rails * block))))
    return m, rails, t, block, d


@settings(max_examples=25)
@given(case=_qk_case(), exact=st.booleans())
def test_both_fillings_equal_q_kt(case, exact):
    m, rails, t, block, d = case
    if exact:
        q, kv = _ints(m, d), _ints(t, d)
    else:
        q, kv = torch.randn(m, d).bfloat16(), torch.randn(t, d).bfloat16()
    ref = q.double() @ kv.double().T
    results = [qk_multirail_ws(q, kv, rails=rails, block=block)] if rails > 1 else []
    if t in (64, 128, 256):
        results.append(qk_official_ws(q, kv))
    for res in results:
        assert res.p.shape == (m, t)
        if exact:
            assert torch.equal(res.p.double(), ref)
        else:                                                          # fp32 roundings: per instruction, per rail add
            bound = (res.instructions + rails + 1) * 2.0 ** -24 * (q.double().abs() @ kv.double().abs().T)
            assert ((res.p.double() - ref).abs() <= bound).all()
    # the formula level agrees with the instruction level for the multi-rail filling
    if rails > 1:
        a, b = multirail_operands(q, kv, 128 // m, rails, block)
        assert torch.allclose(combine_multirail(ws_formula(a, b), rails), ref, rtol=1e-12, atol=1e-9)


def test_illegal_heads_named_before_rails():
    with pytest.raises(ValueError, match="^q must have M"):
        qk_multirail_ws(_ints(48, 512), _ints(64, 512), rails=2)
    with pytest.raises(TypeError, match="^q must have dtype"):
        qk_official_ws(_ints(64, 512).float(), _ints(64, 512).float())
