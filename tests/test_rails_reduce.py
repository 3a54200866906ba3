"""deepkernels.rails: masking and reducing the rails' partial P (mask before reduce, and where NaN leaks)."""
import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from deepkernels.rails import (TensorMemory, mask_then_reduce, masked_scores_reference, multirail_operands,
                               qk_multirail_ws, rail_feature_index, rail_partials, reduce_then_mask,
                               retrieve_mask_and_reduce_p, ws_formula)

pytestmark = [pytest.mark.reference, pytest.mark.usefixtures("one_torch_thread")]



def _ints(*shape):
    return torch.randint(-4, 5, shape).to(torch.bfloat16)


def _decode_block(valid=None):
    """64 heads × 512 features against a 64-token block, run as the 2-rail MMA; TMEM then holds P0 | P1."""
    q, kv = _ints(64, 512), _ints(64, 512)
    valid = torch.rand(64) < 0.7 if valid is None else valid
    return q, kv, valid


def test_retrieve_mask_and_reduce_p_equals_the_masked_scores():
    q, kv, valid = _decode_block()
    res = qk_multirail_ws(q, kv, rails=2)
    p = retrieve_mask_and_reduce_p(res.tmem, p_tmem_col=res.p_tmem_col, valid=valid)
    assert torch.equal(p.double(), masked_scores_reference(q, kv, valid))     # ints: exact, -inf where invalid


def test_retrieve_masks_only_its_own_half():
    """Warps 0–1 (rail 0) mask tokens [0, 32), warps 2–3 (rail 1) mask [32, 64); the peer half is added as is."""
    q, kv, valid = _decode_block()
    res = qk_multirail_ws(q, kv, rails=2)
    p = retrieve_mask_and_reduce_p(res.tmem, p_tmem_col=res.p_tmem_col, valid=valid)
    parts = rail_partials(res.d_groups, 2)
    lo = mask_then_reduce(parts[..., :32], valid[:32], masked_rails=[0])
    hi = mask_then_reduce(parts[..., 32:], valid[32:], masked_rails=[1])
    assert torch.equal(p, torch.cat([lo, hi], dim=1))


@pytest.mark.parametrize("token", [5, 40])
@pytest.mark.parametrize("nan_in", ["own", "peer"])
def test_nan_in_a_masked_k_row_leaks_through_the_peer_half(token, nan_in):
    """docs/spec/mla.md §1.3: mask (one half) before reduce gives -inf + NaN = NaN when the NaN sits in the rail
    that is not masked for that token; in the masked rail it is replaced by -inf and nothing leaks."""
    q, kv, valid = _decode_block()
    valid[token] = False
    own_rail = 0 if token < 32 else 1
    rail = own_rail if nan_in == "own" else 1 - own_rail
    kv[token, rail_feature_index(512, 2)[rail][:3]] = float("nan")
    res = qk_multirail_ws(q, kv, rails=2)
    p = retrieve_mask_and_reduce_p(res.tmem, p_tmem_col=res.p_tmem_col, valid=valid)
    ref = masked_scores_reference(q, kv, valid)
    others = torch.arange(64) != token
    assert torch.equal(p[:, others].double(), ref[:, others])
    if nan_in == "peer":
        assert torch.isnan(p[:, token]).all()
    else:
        assert (p[:, token] == -math.inf).all()
    # masking every rail before the reduce is the fix
    safe = mask_then_reduce(rail_partials(res.d_groups, 2), valid)
    assert torch.equal(safe.double(), ref)


def test_plus_inf_in_the_peer_half_also_becomes_nan():
    t, valid = TensorMemory(), torch.ones(64, dtype=torch.bool)
    valid[3] = False
    part = torch.ones(128, 64)
    part[64:, 3] = math.inf                                   # rail 1's partial for token 3 (kept by rail 0)
    t.store(0, 400, part)
    p = retrieve_mask_and_reduce_p(t, p_tmem_col=400, valid=valid)
    assert torch.isnan(p[:, 3]).all() and (p[:, :3] == 2.0).all()


def test_masking_after_the_reduce():
    """Reduce, then add a -inf bias: a NaN in a masked K row survives (NaN + -inf = NaN), whichever rail holds
    it. Reduce, then select with ``where``: it does not. So the order alone does not decide; select vs add does."""
    q, kv, valid = _decode_block()
    valid[10] = False
    kv[10, 0] = float("nan")
    a, b = multirail_operands(q.double(), kv.double(), lane_groups=2, rails=2)
    parts = rail_partials(ws_formula(a, b), 2)
    leaked = reduce_then_mask(parts, valid, how="additive")
    assert torch.isnan(leaked[:, 10]).all()
    ref = masked_scores_reference(q, kv, valid)
    assert torch.equal(reduce_then_mask(parts, valid, how="select"), ref)
    assert torch.equal(mask_then_reduce(parts, valid), ref)
    with pytest.raises(ValueError, match="^how must be"):
        reduce_then_mask(parts, valid, how="multiply")


@settings(max_examples=20)
@given(rails=st.sampled_from([2, 4]), bad=st.sampled_from([math.nan, math.inf, -math.inf]),
       n_masked=st.integers(1, 8))
def test_mask_before_reduce_on_every_rail_never_leaks(rails, bad, n_masked):
    q, kv = _ints(32, 256).double(), _ints(32, 256).double()
    valid = torch.ones(32, dtype=torch.bool)
    rows = torch.randperm(32)[:n_masked]
    valid[rows] = False
    kv[rows, torch.randint(0, 256, (n_masked,))] = bad
    a, b = multirail_operands(q, kv, lane_groups=rails, rails=rails)
    p = mask_then_reduce(rail_partials(ws_formula(a, b), rails), valid)
    assert torch.equal(p, masked_scores_reference(q, kv, valid))


def test_argument_errors():
    t = TensorMemory()
    with pytest.raises(ValueError, match="^valid must have shape \\[64\\]"):
        retrieve_mask_and_reduce_p(t, p_tmem_col=0, valid=torch.ones(32, dtype=torch.bool))
    with pytest.raises(TypeError, match="^valid must have dtype"):
        retrieve_mask_and_reduce_p(t, p_tmem_col=0, valid=torch.ones(64))
    with pytest.raises(ValueError, match="^b_topk"):
        retrieve_mask_and_reduce_p(t, p_tmem_col=0, valid=torch.ones(7, dtype=torch.bool), b_topk=7)
    with pytest.raises(ValueError, match="^col"):
        retrieve_mask_and_reduce_p(t, p_tmem_col=480, valid=torch.ones(64, dtype=torch.bool))
    with pytest.raises(ValueError, match="^masked_rails"):
        mask_then_reduce(torch.zeros(2, 4, 8), torch.ones(8, dtype=torch.bool), masked_rails=[2])
