"""Regression tests of the session-19 API review: two inconsistencies between the MLA ops.

1. softmax scale <= 0. Dense and sparse decode accepted any finite ``softmax_scale`` (a scale <= 0 rewritten exactly
   on the host, because the kernels keep the running max in raw-score units), while the prefill ops rejected it:
   ``flash_mla_sparse_fwd`` ("sm_scale must be a positive finite float") and ``flash_attn_varlen_func`` (+ its packed
   variants). Upstream FlashMLA takes any float for both. Fixed: every attention op takes any finite scale, with the
   one shared rewrite (``deepkernels._validate.rewrite_nonpositive_scale``: ``-q`` with ``|scale|`` for scale < 0,
   ``q * 0`` with scale 1 for scale 0); a non-finite scale is still a ValueError naming the argument. Sparse
   prefill's ``max_logits`` and ``lse`` are in natural-log units of ``(q·k)·sm_scale``: the rewrite keeps them
   (``max((-q)·k)·|scale| == max(q·k·scale)``; scale 0: max_logits 0 and lse = log(#valid) for a row with a valid
   index, out 0 / max_logits -inf / lse +inf for a row without one). The PyTorch reference applies the scale as
   written, so it needed no change; both paths are checked against float64 formulas written here.
2. Sparse decode with ``tile_scheduler_metadata=None`` was silently re-planned, where dense decode raised
   ``TypeError("tile_scheduler_metadata must come from get_mla_metadata(), got NoneType")`` (upstream requires the
   metadata on both paths). Fixed: the same TypeError, before any scheduling or launch. The one internal caller that
   relied on None, the ``torch.library`` op ``deepkernels.ops.flash_mla_with_kvcache_sparse`` (whose metadata
   arguments are optional tensors: a ``FlashMLASchedMeta`` cannot cross the op boundary), now passes a fresh
   ``get_mla_metadata()[0]`` (tests/test_ops.py covers it).

Tiers: ``reference`` (CPU reference path) and ``interpret`` (the Triton kernels under TRITON_INTERPRET=1), the same
test bodies parametrised over both as in tests/test_review_s18.py.
"""
import math

import numpy as np
import pytest
import torch

import deepkernels as dk
from deepkernels._validate import rewrite_nonpositive_scale
from deepkernels.mla import sparse_decode as sd
from deepkernels.mla.dense_prefill import flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func
from deepkernels.quant.kvcache import quantize_kv_cache
from deepkernels.testing.numerics import check_is_allclose

REF = pytest.param("reference", marks=pytest.mark.reference)
INT = pytest.param("interpret", marks=pytest.mark.interpret)
TIERS = [REF, INT]
INF = math.inf
JUNK = [-2**31, -123456, -1, 114514, 2**31 - 1]          # + s_kv: invalid indices, never read
# scales <= 0 plus a tiny positive one (the kernels' path for it is unchanged; it must still be the definition)
SCALES = [-0.5, -24 ** -1, 0.0, -0.0, 1e-30]


# ------------------------------------------------------------------------------------------------ helpers
def _prefill_case(s_q=5, h_q=16, d=576, s_kv=48, topk=40):
    """Fresh random q / kv (randn/10 + offset, FlashMLA style), indices with junk entries; row 0 all invalid, row 1
    a permutation-free mix; every kv row no valid index points at is NaN (a stray read shows up)."""
    q = (torch.randn(s_q, h_q, d) / 10 + (torch.rand(1) - 0.5) / 10).bfloat16()
    kv = (torch.randn(s_kv, 1, d) / 10 + (torch.rand(1) - 0.5) / 10).bfloat16()
    junk = torch.tensor(JUNK + [s_kv], dtype=torch.int32)
    ind = torch.randint(0, s_kv, (s_q, 1, topk), dtype=torch.int32)
    bad = torch.rand(s_q, 1, topk) < 0.3
    ind[bad] = junk[torch.randint(0, len(junk), (int(bad.sum()),))]
    ind[0] = junk[torch.randint(0, len(junk), (topk,))]                       # no valid index at all
    tl = torch.randint(1, topk + 1, (s_q,), dtype=torch.int32)
    tl[2] = 0                                                                  # topk_length 0: no token either
    tl[3] = topk
    valid = (ind[:, 0] >= 0) & (ind[:, 0] < s_kv) & (torch.arange(topk)[None, :] < tl[:, None])
    used = torch.zeros(s_kv, dtype=torch.bool)
    used[ind[:, 0][valid].long()] = True
    kv[~used] = float("nan")
    return q, kv, ind, tl


def _sink(h_q):
    s = torch.randn(h_q)
    s[torch.rand(h_q) < 0.3] = INF
    s[torch.rand(h_q) < 0.3] = -INF
    return s


def _sparse_prefill_f64(q, kv, ind, scale, sink=None, tl=None):
    """Float64 definition (FlashMLA ``ref_sparse_attn_fwd``): logits ``(q·k)·scale`` over the valid in-length
    positions (duplicates count), natural-log ``max_logits`` / ``lse``; a sink scales out by
    ``1 / (1 + exp(sink - lse))``; a row with no valid position: out 0, max_logits -inf, lse +inf."""
    s_q, h_q, _ = q.shape
    s_kv, topk = kv.shape[0], ind.shape[-1]
    qd, kvd = q.double(), kv[:, 0].double()
    out = torch.zeros(s_q, h_q, 512, dtype=torch.float64)
    ml = torch.full((s_q, h_q), -INF, dtype=torch.float64)
    lse = torch.full((s_q, h_q), INF, dtype=torch.float64)
    for i in range(s_q):
        n = topk if tl is None else min(max(int(tl[i]), 0), topk)
        idx = [int(x) for x in ind[i, 0, :n].tolist() if 0 <= x < s_kv]
        if not idx:
            continue
        k = kvd[idx]
        s = (qd[i] @ k.T) * scale                                              # [h_q, n_valid]
        m = s.max(dim=-1).values
        ls = m + torch.log(torch.exp(s - m[:, None]).sum(-1))
        o = torch.exp(s - ls[:, None]) @ k[:, :512]
        if sink is not None:
            o = o / (1 + torch.exp(sink.double() - ls))[:, None]
        out[i], ml[i], lse[i] = o, m, ls
    return out, ml, lse


def _n_valid(ind, s_kv, tl):
    topk = ind.shape[-1]
    pos = torch.arange(topk)[None, :] < tl.clamp(0, topk)[:, None]
    return (((ind[:, 0] >= 0) & (ind[:, 0] < s_kv)) & pos).sum(-1)


def _check_prefill(out, ml, lse, ro, rml, rlse):
    assert out.dtype == torch.bfloat16 and ml.dtype == lse.dtype == torch.float32
    assert not out.isnan().any() and not ml.isnan().any() and not lse.isnan().any()
    assert check_is_allclose("out", out.float(), ro.float(), abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose("max_logits", ml, rml.float(), abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert check_is_allclose("lse", lse, rlse.float(), abs_tol=1e-6, rel_tol=2.01 / 65536)


def _varlen_case(seq_q, seq_k, h=4, h_k=2, d=128):
    cq = torch.tensor([0] + np.cumsum(seq_q).tolist(), dtype=torch.int32)
    ck = torch.tensor([0] + np.cumsum(seq_k).tolist(), dtype=torch.int32)
    q = torch.randn(int(cq[-1]), h, d + 32).bfloat16()[..., :d]                # non-contiguous views
    k = torch.randn(int(ck[-1]), h_k, d).bfloat16()
    v = (torch.randn(int(ck[-1]), h_k, 128) / 4).bfloat16()
    return q, k, v, cq, ck


def _varlen_f64(q, k, v, cq, ck, scale, causal):
    """Float64 definition: per sequence, GQA head j -> kv head j // (h / h_k), bottom-right causal mask
    (query i sees keys j <= i + s_k - s_q); a row that sees no key: out 0, lse +inf."""
    total_q, h, _ = q.shape
    g = h // k.shape[1]
    out = torch.zeros(total_q, h, 128, dtype=torch.float64)
    lse = torch.full((total_q, h), INF, dtype=torch.float64)
    for b in range(len(cq) - 1):
        q0, q1, k0, k1 = int(cq[b]), int(cq[b + 1]), int(ck[b]), int(ck[b + 1])
        s_q, s_k = q1 - q0, k1 - k0
        for i in range(s_q):
            n = s_k if not causal else max(0, min(s_k, i + s_k - s_q + 1))
            if n == 0:
                continue
            for hh in range(h):
                kk = k[k0:k0 + n, hh // g].double()
                s = (kk @ q[q0 + i, hh].double()) * scale
                m = s.max()
                ls = m + torch.log(torch.exp(s - m).sum())
                out[q0 + i, hh] = torch.exp(s - ls) @ v[k0:k0 + n, hh // g].double()
                lse[q0 + i, hh] = ls
    return out, lse


# --------------------------------------------------------------------------- 1. sparse prefill, scale <= 0
@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("with_sink", [False, True])
def test_sparse_prefill_any_finite_scale_matches_float64(tier, scale, with_sink):
    """Negative, zero (+-0.0) and tiny positive sm_scale: out / max_logits / lse against the float64 definition,
    with junk indices, an all-invalid row, a topk_length-0 row and NaN in every unreferenced kv row."""
    q, kv, ind, tl = _prefill_case()
    sink = _sink(q.shape[1]) if with_sink else None
    q0 = q.clone()
    out, ml, lse = dk.flash_mla_sparse_fwd(q, kv, ind, scale, attn_sink=sink, topk_length=tl)
    assert torch.equal(q, q0)                                  # the rewrite never touches the caller's q
    ro, rml, rlse = _sparse_prefill_f64(q, kv, ind, scale, sink, tl)
    _check_prefill(out, ml, lse, ro, rml, rlse)
    for r in (0, 2):                                          # no valid index / topk_length 0
        assert (out[r] == 0).all() and (ml[r] == -INF).all() and (lse[r] == INF).all()
    if scale == 0:
        n = _n_valid(ind, kv.shape[0], tl)
        has = n > 0
        assert (ml[has] == 0).all()                            # every logit is 0 (exactly)
        want = torch.log(n[has].double())[:, None].expand(-1, q.shape[1])
        torch.testing.assert_close(lse[has].double(), want, atol=1e-6, rtol=2.01 / 65536)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("d", [576, 512])
def test_sparse_prefill_negative_scale_is_positive_scale_on_negated_q(tier, d):
    """softmax(s·q·k) = softmax(|s|·(-q)·k) with the same logits: out, max_logits (max of q·k·s, i.e. -|s| times
    the *min* of q·k) and lse are bit-identical to the call on -q with |s|, and max_logits is not the positive-scale
    one (the sign matters)."""
    q, kv, ind, tl = _prefill_case(d=d)
    q = q.contiguous()
    s = 0.3
    neg = dk.flash_mla_sparse_fwd(q, kv, ind, -s, topk_length=tl)
    flip = dk.flash_mla_sparse_fwd(q.neg(), kv, ind, s, topk_length=tl)
    pos = dk.flash_mla_sparse_fwd(q, kv, ind, s, topk_length=tl)
    for a, b in zip(neg, flip):
        assert torch.equal(a, b)
    has = torch.isfinite(pos[2])
    assert has.any() and not torch.equal(neg[1][has], pos[1][has])
    ro, rml, rlse = _sparse_prefill_f64(q, kv, ind, -s, None, tl)
    _check_prefill(*neg, ro, rml, rlse)


@pytest.mark.parametrize("tier", TIERS)
def test_sparse_prefill_scale_forms_nonpositive(tier):
    """NumPy / one-element tensor scales <= 0 give the Python-float result (check_scale converts them first)."""
    q, kv, ind, tl = _prefill_case(s_q=4)
    want = dk.flash_mla_sparse_fwd(q, kv, ind, -0.25, topk_length=tl)
    for s in (np.float32(-0.25), np.float64(-0.25), torch.tensor(-0.25), torch.tensor([-0.25], dtype=torch.float64)):
        for a, b in zip(dk.flash_mla_sparse_fwd(q, kv, ind, s, topk_length=tl), want):
            assert torch.equal(a, b)
    zero = dk.flash_mla_sparse_fwd(q, kv, ind, 0.0, topk_length=tl)
    for s in (np.int64(0), torch.tensor(0.0), -0.0):
        for a, b in zip(dk.flash_mla_sparse_fwd(q, kv, ind, s, topk_length=tl), zero):
            assert torch.equal(a, b)


@pytest.mark.reference
@pytest.mark.parametrize("bad", [float("nan"), INF, -INF, np.float32("nan"), torch.tensor(-INF)])
def test_sparse_prefill_nonfinite_scale_raises_named(bad):
    q, kv, ind, _ = _prefill_case(s_q=4)
    with pytest.raises(ValueError, match=r"sm_scale must be finite"):
        dk.flash_mla_sparse_fwd(q, kv, ind, bad)


# ------------------------------------------------------------------ 2. dense varlen prefill, scale <= 0
@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_any_finite_scale_matches_float64(tier, scale, causal):
    """flash_attn_varlen_func, GQA (h 4, h_k 2), d_qk 128: a sequence with s_k < s_q (causal: its first rows see
    no key), one with s_k > s_q, an empty-k sequence; out / lse against the float64 definition."""
    q, k, v, cq, ck = _varlen_case([5, 3, 2], [3, 6, 0])
    q0 = q.clone()
    out, lse = dk.flash_attn_varlen_func(q, k, v, cq, ck, 5, 6, softmax_scale=scale, causal=causal)
    assert torch.equal(q, q0)
    ro, rl = _varlen_f64(q, k, v, cq, ck, scale, causal)
    assert not out.isnan().any() and not lse.isnan().any()
    assert lse.shape == (10, 4) and lse.stride() == (1, 10)
    assert check_is_allclose("out", out.float(), ro.float(), abs_tol=1e-3, rel_tol=8.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose("lse", lse, rl.float(), abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert (out[8:] == 0).all() and (lse[8:] == INF).all()   # sequence with no key
    if causal:
        assert (out[:2] == 0).all() and (lse[:2] == INF).all()  # rows 0, 1 of sequence 0 see no key
    if scale == 0:
        seen = torch.isfinite(rl)
        # every logit 0: uniform attention, lse = log(#keys seen)
        n = torch.tensor([3, 3, 3, 3, 3, 6, 6, 6]).double() if not causal else \
            torch.tensor([0, 0, 1, 2, 3, 4, 5, 6]).double()
        want = torch.log(n)[:, None].expand(-1, 4)
        torch.testing.assert_close(lse[:8].double()[seen[:8]], want[seen[:8]], atol=1e-6, rtol=2.01 / 65536)


@pytest.mark.parametrize("tier", TIERS)
def test_varlen_packed_variants_take_nonpositive_scale(tier):
    """The packed variants pass the scale through: same result as the unpacked call (d_qk 192 here)."""
    q, k, v, cq, _ = _varlen_case([4, 3], [4, 3], h=2, h_k=2, d=192)
    q = q.contiguous()
    for scale in (-0.1, 0.0):
        want = dk.flash_attn_varlen_func(q, k, v, cq, cq, 4, 4, softmax_scale=scale, causal=True)
        got = flash_attn_varlen_qkvpacked_func(torch.cat([q, k, v], -1), cq, 4, 192, softmax_scale=scale,
                                               causal=True)
        got2 = flash_attn_varlen_kvpacked_func(q, torch.cat([k, v], -1), cq, cq, 4, 4, 192, softmax_scale=scale,
                                               causal=True)
        for a, b, c in zip(got, got2, want):
            assert torch.equal(a, c) and torch.equal(b, c)
        ro, rl = _varlen_f64(q, k, v, cq, cq, scale, True)
        assert check_is_allclose("out", want[0].float(), ro.float(), abs_tol=1e-3, rel_tol=8.01 / 128,
                                 cos_diff_tol=7e-6)
        assert check_is_allclose("lse", want[1], rl.float(), abs_tol=1e-6, rel_tol=2.01 / 65536)


@pytest.mark.reference
@pytest.mark.parametrize("bad", [float("nan"), INF, -INF, np.float64("-inf")])
def test_varlen_nonfinite_scale_raises_named(bad):
    q, k, v, cq, _ = _varlen_case([4, 3], [4, 3], h=2, h_k=2, d=128)
    with pytest.raises(ValueError, match=r"softmax_scale must be finite"):
        dk.flash_attn_varlen_func(q, k, v, cq, cq, 4, 4, softmax_scale=bad)
    with pytest.raises(ValueError, match=r"softmax_scale must be finite"):
        flash_attn_varlen_qkvpacked_func(torch.cat([q, k, v], -1), cq, 4, 128, softmax_scale=bad)
    with pytest.raises(ValueError, match=r"softmax_scale must be finite"):
        flash_attn_varlen_kvpacked_func(q, torch.cat([k, v], -1), cq, cq, 4, 4, 128, softmax_scale=bad)


# ----------------------------------------------------------------------------- 3. the shared rewrite itself
@pytest.mark.reference
def test_rewrite_nonpositive_scale():
    q = torch.randn(3, 4).bfloat16()
    r, s, same = rewrite_nonpositive_scale(q, 0.5)
    assert r is q and s == 0.5 and same
    r, s, same = rewrite_nonpositive_scale(q, -0.5)
    assert torch.equal(r, -q) and s == 0.5 and not same
    for z in (0.0, -0.0):
        r, s, same = rewrite_nonpositive_scale(q, z)
        assert (r == 0).all() and s == 1.0 and not same
    qn = q.clone()
    qn[0, 0], qn[1, 1] = float("nan"), INF
    r, _, _ = rewrite_nonpositive_scale(qn, 0.0)             # 0 * NaN / 0 * inf stay NaN, like scale·(q·k)
    assert r[0, 0].isnan() and r[1, 1].isnan() and (r[2] == 0).all()


# ------------------------------------------------------------- 4. sparse decode: metadata None is a TypeError
def _sparse_decode_case(b=2, s_q=1, h_q=16, topk=32, nb=2, page=64):
    kc = quantize_kv_cache((torch.randn(nb, page, 1, 576) / 10).bfloat16(), "v32")
    q = torch.randn(b, s_q, h_q, 576).clamp(-2, 2).bfloat16()
    ind = torch.randint(0, nb * page, (b, s_q, topk), dtype=torch.int32)
    return q, kc, ind


@pytest.mark.parametrize("tier", TIERS)
def test_sparse_decode_none_metadata_raises_like_dense(tier, monkeypatch):
    """tile_scheduler_metadata=None: the dense path's TypeError, word for word, with no schedule computed and no
    kernel launched (the scheduler and every launcher are stubbed to fail)."""
    q, kc, ind = _sparse_decode_case()

    def boom(*a, **k):
        raise AssertionError("reached a schedule / launch with tile_scheduler_metadata=None")
    monkeypatch.setattr(sd, "compute_schedule", boom)
    monkeypatch.setattr(sd, "_launch_sparse_decode", boom)
    monkeypatch.setattr(sd, "sparse_decode_ref", boom)
    msg = r"^tile_scheduler_metadata must come from get_mla_metadata\(\), got NoneType$"
    with pytest.raises(TypeError, match=msg):
        dk.flash_mla_with_kvcache(q, kc, None, None, 512, None, is_fp8_kvcache=True, indices=ind)
    with pytest.raises(TypeError, match=msg):                # keyword form, with the other optional arguments
        dk.flash_mla_with_kvcache(q, kc, None, None, 512, tile_scheduler_metadata=None, is_fp8_kvcache=True,
                                  indices=ind, attn_sink=torch.randn(16),
                                  topk_length=torch.tensor([5, 32], dtype=torch.int32))
    # the dense path's message, for comparison
    dq = torch.randn(2, 1, 16, 576).bfloat16()
    dkc = torch.randn(2, 64, 1, 576).bfloat16()
    bt = torch.tensor([[0], [1]], dtype=torch.int32)
    sl = torch.tensor([30, 64], dtype=torch.int32)
    with pytest.raises(TypeError, match=msg):
        dk.flash_mla_with_kvcache(dq, dkc, bt, sl, 512, None)
    for bad in ("meta", 3, object()):
        with pytest.raises(TypeError, match=r"tile_scheduler_metadata must come from get_mla_metadata\(\)"):
            dk.flash_mla_with_kvcache(q, kc, None, None, 512, bad, is_fp8_kvcache=True, indices=ind)


@pytest.mark.parametrize("tier", TIERS)
def test_sparse_decode_metadata_forms_still_accepted(tier):
    """get_mla_metadata()[0] and the legacy tensors still work and agree; the torch.library op without metadata
    (its documented optional tensors) plans with a fresh FlashMLASchedMeta and gives the same result."""
    from deepkernels import ops
    q, kc, ind = _sparse_decode_case()
    o1, l1 = dk.flash_mla_with_kvcache(q, kc, None, None, 512, dk.get_mla_metadata()[0], is_fp8_kvcache=True,
                                       indices=ind)
    md, ns = dk.get_mla_metadata(torch.tensor([64, 64], dtype=torch.int32), 16, 1, topk=32)
    o2, l2 = dk.flash_mla_with_kvcache(q, kc, None, None, 512, md, ns, is_fp8_kvcache=True, indices=ind)
    o3, l3 = ops.flash_mla_with_kvcache_sparse(q, kc, ind, 512)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)
    assert torch.equal(o1, o3) and torch.equal(l1, l3)


@pytest.mark.reference
def test_sparse_decode_none_metadata_empty_work_as_dense():
    """Empty work (b == 0 / s_q == 0) checks the metadata like a call with work, on both paths alike: None is the
    TypeError (session 21 review: empty work used to return without looking at the metadata)."""
    q, kc, ind = _sparse_decode_case()
    msg = r"tile_scheduler_metadata must come from get_mla_metadata\(\), got NoneType"
    with pytest.raises(TypeError, match=msg):
        dk.flash_mla_with_kvcache(q[:0], kc, None, None, 512, None, is_fp8_kvcache=True, indices=ind[:0])
    with pytest.raises(TypeError, match=msg):
        dk.flash_mla_with_kvcache(q[:, :0], kc, None, None, 512, None, is_fp8_kvcache=True, indices=ind[:, :0])
    o, lse = dk.flash_mla_with_kvcache(q[:, :0], kc, None, None, 512, dk.get_mla_metadata()[0], is_fp8_kvcache=True,
                                       indices=ind[:, :0])
    assert o.shape == (2, 0, 16, 512) and lse.shape == (2, 16, 0)
    dkc = torch.randn(2, 64, 1, 576).bfloat16()
    with pytest.raises(TypeError, match=msg):
        dk.flash_mla_with_kvcache(torch.randn(0, 1, 16, 576).bfloat16(), dkc, torch.zeros(0, 1, dtype=torch.int32),
                                  torch.zeros(0, dtype=torch.int32), 512, None)
