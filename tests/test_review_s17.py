"""Regression tests of the session-17 fresh-user review (README followed on a CPU machine, then the public MLA ops
probed with the edge-case kinds of shared/cases/edge-cases.md, sparse decode at h_q = 128 -- the call the 2-CTA
cluster kernel now takes on the GPU -- and sparse prefill first).

Finding (fixed as a kind, in ``deepkernels._validate.check_scale``, used by all four MLA ops):

- the scalar scale argument (``softmax_scale`` of ``flash_mla_with_kvcache`` dense and sparse and of
  ``flash_attn_varlen_func``, ``sm_scale`` of ``flash_mla_sparse_fwd``) was converted with ``float()``:
  a NumPy ``float32`` / integer scale (a real number) was *rejected* by ``flash_mla_sparse_fwd`` with a misleading
  "must be a positive finite float, got np.float32(0.04)"; a string such as ``"0.04"`` was silently *accepted* by
  three ops; a multi-element tensor, a list or a complex value raised torch's / Python's own message that does not
  name the argument ("only one element tensors can be converted to Python scalars"); ``True`` was taken as 1.0.
  Now: any real scalar or one-element real tensor is accepted (same result as the equal Python float), everything
  else is a TypeError / ValueError naming the argument, raised before any launch.

The other tests pin what the review found correct at h_q = 128 (sparse decode) and for sparse prefill, so that a
later dispatch change cannot regress it: unsupported h_q (256, 96, 8) and index dtypes are named errors; empty work
(b = 0, s_q = 0, topk = 0, all -1, junk indices, topk_length 0 / negative) gives the contract's empty rows (out 0,
lse +inf; max_logits -inf) next to rows that match the reference; mismatched batch sizes between tensors raise.

Tiers: ``reference`` (CPU reference path) and ``interpret`` (Triton kernels under TRITON_INTERPRET=1); the ``gpu``
test runs the dispatched h_q = 128 kernels (WS3 cluster kernel at >= 24 blocks per CTA) on the same contract.
"""
import math

import numpy as np
import pytest
import torch

import deepkernels as dk
from deepkernels.quant.kvcache import quantize_kv_cache
from deepkernels.reference.mla_prefill import sparse_prefill_ref
from deepkernels.reference.mla_sparse import sparse_decode_ref

REF = pytest.param("reference", marks=pytest.mark.reference)
INT = pytest.param("interpret", marks=pytest.mark.interpret)
TIERS = [REF, INT]
INF = math.inf


# ------------------------------------------------------------------------------------------------ inputs
def _sparse_decode_case(b, s_q, h_q, topk, fmt="v32", nb=4, page=64, device="cpu"):
    d = 576 if fmt == "v32" else 512
    kc = quantize_kv_cache((torch.randn(nb, page, 1, d, device=device) / 10).bfloat16(), fmt)
    q = torch.randn(b, s_q, h_q, d, device=device).clamp(-2, 2).bfloat16()
    ind = torch.randint(0, nb * page, (b, s_q, topk), dtype=torch.int32, device=device)
    return q, kc, ind


def _sparse_decode(q, kc, ind, **kw):
    meta = kw.pop("meta", None) or dk.get_mla_metadata()[0]
    return dk.flash_mla_with_kvcache(q, kc, None, None, 512, meta, is_fp8_kvcache=True, indices=ind, **kw)


def _dense_decode_case():
    b, page = 2, 64
    kc = torch.randn(4, page, 1, 576).bfloat16()
    bt = torch.randperm(4, dtype=torch.int32).view(b, 2)
    sl = torch.tensor([70, 100], dtype=torch.int32)
    q = torch.randn(b, 1, 16, 576).bfloat16()
    return q, kc, bt, sl


def _prefill_case(s_q=3, h_q=64, d=576, s_kv=150, topk=64):
    q = torch.randn(s_q, h_q, d).bfloat16()
    kv = torch.randn(s_kv, 1, d).bfloat16()
    ind = torch.randint(0, s_kv, (s_q, 1, topk), dtype=torch.int32)
    return q, kv, ind


def _dense_prefill_case():
    q, k = torch.randn(8, 2, 192).bfloat16(), torch.randn(8, 2, 192).bfloat16()
    v = torch.randn(8, 2, 128).bfloat16()
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    return q, k, v, cu


def _op(op):
    """``call(scale)``: one call of ``op`` on inputs drawn once (fresh per test) with the scalar scale argument
    set to ``scale``; returns the output tensors."""
    if op == "dense_decode":
        q, kc, bt, sl = _dense_decode_case()
        return lambda scale: dk.flash_mla_with_kvcache(q, kc, bt, sl, 512, dk.get_mla_metadata()[0],
                                                       softmax_scale=scale)
    if op == "sparse_decode":
        q, kc, ind = _sparse_decode_case(2, 1, 128, 64, nb=2)
        return lambda scale: _sparse_decode(q, kc, ind, softmax_scale=scale)
    if op == "sparse_prefill":
        q, kv, ind = _prefill_case()
        return lambda scale: dk.flash_mla_sparse_fwd(q, kv, ind, scale)
    q, k, v, cu = _dense_prefill_case()
    return lambda scale: dk.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5, softmax_scale=scale)


def _run_op(op, scale):
    return _op(op)(scale)


OPS = ["dense_decode", "sparse_decode", "sparse_prefill", "dense_prefill"]
ARG = {"sparse_prefill": "sm_scale"}


# ------------------------------------------------------------------------------ 1. the scale argument (fixed)
@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("op", OPS)
def test_scale_accepts_numpy_and_one_element_tensor(tier, op):
    """A NumPy float32 / float64 / integer scale and a one-element tensor are real numbers: the result equals the
    call with the equal Python float (sparse prefill rejected np.float32 and np.int64 before the fix)."""
    call = _op(op)
    x = 0.0625                                      # exact in float32, so np.float32(x) == x
    ref = call(x)
    for s in (np.float32(x), np.float64(x), torch.tensor(x), torch.tensor([x], dtype=torch.float64)):
        got = call(s)
        for g, r in zip(got, ref):
            assert torch.equal(g, r), (op, type(s))
    one = call(1.0)
    for g, r in zip(call(np.int64(1)), one):
        assert torch.equal(g, r)


@pytest.mark.reference
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("bad", ["0.04", "abc", [0.1], 1j, True, None])
def test_scale_wrong_type_is_named_type_error(op, bad):
    """Strings (accepted by three ops before the fix), lists, complex values and bools are a TypeError naming the
    argument; None too where the argument has no default (sparse prefill's sm_scale)."""
    if bad is None and op != "sparse_prefill":
        pytest.skip("softmax_scale=None is the default scale")
    with pytest.raises(TypeError, match=ARG.get(op, "softmax_scale")):
        _run_op(op, bad)


@pytest.mark.reference
@pytest.mark.parametrize("op", OPS)
def test_scale_tensor_errors_name_the_argument(op):
    """A multi-element tensor raised torch's 'only one element tensors can be converted to Python scalars'."""
    name = ARG.get(op, "softmax_scale")
    with pytest.raises(ValueError, match=rf"{name} must be a number or a one-element tensor, got a tensor of shape "
                                         r"\[2\]"):
        _run_op(op, torch.tensor([0.1, 0.2]))
    with pytest.raises(TypeError, match=name):
        _run_op(op, torch.tensor(True))
    with pytest.raises(ValueError, match=name):
        _run_op(op, float("nan"))
    with pytest.raises(ValueError, match=name):
        _run_op(op, np.float32("inf"))


# ------------------------------------------------------------- 2. sparse decode at h_q = 128: named errors
@pytest.mark.reference
@pytest.mark.parametrize("h_q", [256, 96, 8, 0])
def test_sparse_decode_unsupported_heads_named(h_q):
    q, kc, ind = _sparse_decode_case(2, 1, 128, 64, nb=2)
    q2 = torch.randn(2, 1, h_q, 576).bfloat16()
    with pytest.raises(ValueError, match=rf"q: h_q must be one of \[16, 32, 64, 128\], got shape "
                                         rf"\[2, 1, {h_q}, 576\]"):
        _sparse_decode(q2, kc, ind)


@pytest.mark.reference
def test_sparse_decode_h128_bad_arguments_named():
    b, s_q = 3, 2
    q, kc, ind = _sparse_decode_case(b, s_q, 128, 64, nb=2)
    cases = [
        (TypeError, r"indices must have dtype torch.int32, got torch.int64 \(shape \(3, 2, 64\)\)",
         dict(ind=ind.long())),
        (ValueError, r"indices must have shape \[b=3, s_q=2, topk\], got \[2, 2, 64\]", dict(ind=ind[:2])),
        (ValueError, r"indices must have shape \[b=3, s_q=2, topk\], got \[3, 1, 64\]", dict(ind=ind[:, :1])),
        (ValueError, r"topk_length must have shape \[b=3\], got \[2\]",
         dict(topk_length=torch.zeros(2, dtype=torch.int32))),
        (TypeError, r"topk_length must have dtype torch.int32", dict(topk_length=torch.zeros(b, dtype=torch.int64))),
        (ValueError, r"attn_sink must have shape \[h_q=128\], got \[64\]", dict(attn_sink=torch.zeros(64))),
        (TypeError, r"q must have dtype torch.bfloat16, got torch.float16", dict(q=q.half())),
        (ValueError, r"q: d_qk must be 576 for a 656-byte \(v32\) cache", dict(q=q[..., :512])),
        (ValueError, r"k_cache must have h_k = 1", dict(kc=torch.zeros(2, 64, 2, 656, dtype=torch.uint8))),
        (ValueError, r"k_cache must have >= 1 block", dict(kc=kc[:0])),
        (ValueError, r"extra_indices_in_kvcache must have shape \[b=3, s_q=2, topk\], got \[1, 2, 64\]",
         dict(extra_k_cache=kc, extra_indices_in_kvcache=ind[:1])),
    ]
    for exc, pat, over in cases:
        args = dict(q=q, kc=kc, ind=ind)
        args.update({k: over.pop(k) for k in ("q", "kc", "ind") if k in over})
        with pytest.raises(exc, match=pat):
            _sparse_decode(args["q"], args["kc"], args["ind"], **over)
    meta = dk.get_mla_metadata()[0]
    _sparse_decode(q, kc, ind, meta=meta)
    with pytest.raises(ValueError, match="tile_scheduler_metadata was built for"):
        _sparse_decode(q[:2], kc, ind[:2], meta=meta)          # reused for another batch size


# ---------------------------------------------------------- 3. sparse decode at h_q = 128: empty work
def _check_decode_rows(out, lse, ref_out, ref_lse, empty_rows):
    """empty_rows: bool [b, s_q]; those rows must be exactly out 0 / lse +inf, the others match the reference."""
    lse_bs = lse.transpose(1, 2)                        # [b, s_q, h_q]
    rlse_bs = ref_lse.transpose(1, 2)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    e = empty_rows
    assert (out[e] == 0).all() and (lse_bs[e] == INF).all()
    ne = ~e
    if ne.any():
        torch.testing.assert_close(out[ne].float(), ref_out[ne].float(), atol=2e-3, rtol=2.01 / 128)
        torch.testing.assert_close(lse_bs[ne], rlse_bs[ne], atol=1e-5, rtol=1e-4)
    assert lse.shape == (out.shape[0], out.shape[2], out.shape[1])
    assert lse.stride() == (out.shape[1] * out.shape[2], 1, out.shape[2])   # transposed view of [b, s_q, h_q]


def _empty_work_case(b, s_q, h_q, topk, fmt, device):
    """Requests 0-3 attend to nothing (all -1; only junk indices; topk_length 0; negative topk_length), the others
    to topk random tokens (request 4 with topk_length past topk); every cache token no full request reads is NaN."""
    d, nb, page = (576 if fmt == "v32" else 512), max(2, topk // 32), 64
    n_tok = nb * page
    q = torch.randn(b, s_q, h_q, d, device=device).clamp(-2, 2).bfloat16()
    ind = torch.randint(0, n_tok, (b, s_q, topk), dtype=torch.int32, device=device)
    kv = (torch.randn(n_tok, d, device=device) / 10).bfloat16()
    used = torch.zeros(n_tok, dtype=torch.bool, device=device)
    used[ind[4:].reshape(-1).long()] = True
    kv[~used] = float("nan")
    kc = quantize_kv_cache(kv.view(nb, page, 1, d), fmt)
    ind[0] = -1                                             # request 0: every index -1
    ind[1] = torch.tensor([n_tok, 2**31 - 1, -2**31, -123456], dtype=torch.int32, device=device).repeat(
        topk // 4 + 1)[:topk]                               # request 1: only junk (>= num tokens, negative)
    tl_ = torch.full((b,), topk, dtype=torch.int32, device=device)
    tl_[2] = 0                                              # request 2: topk_length 0
    tl_[3] = -7                                             # request 3: negative length (clamped to 0)
    tl_[4] = 2**31 - 1                                      # request 4: length past topk (clamped to topk)
    empty = torch.zeros(b, s_q, dtype=torch.bool, device=device)
    empty[:4] = True
    return q, kc, ind, tl_, empty


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("fmt", ["v32", "v41"])
def test_sparse_decode_h128_empty_requests_next_to_full_ones(tier, fmt):
    q, kc, ind, tl_, empty = _empty_work_case(6, 2, 128, 64, fmt, "cpu")
    out, lse = _sparse_decode(q, kc, ind, topk_length=tl_)
    ro, rl = sparse_decode_ref(q, kc, ind, 512, None, None, None, None, tl_, None, out_dtype=torch.float32)
    _check_decode_rows(out, lse, ro, rl, empty)


@pytest.mark.parametrize("tier", TIERS)
def test_sparse_decode_h128_empty_shapes(tier):
    q, kc, ind = _sparse_decode_case(2, 2, 128, 64, nb=2)
    for qq, ii in ((q[:0], ind[:0]), (q[:, :0], ind[:, :0])):            # b = 0, s_q = 0
        out, lse = _sparse_decode(qq, kc, ii)
        assert out.shape == (*qq.shape[:3], 512) and lse.shape == (qq.shape[0], 128, qq.shape[1])
    for ii, kw in ((ind[..., :0], {}),                                    # topk = 0
                   (torch.full_like(ind, -1), {}),                         # all -1
                   (ind, dict(topk_length=torch.zeros(2, dtype=torch.int32)))):   # topk_length 0
        out, lse = _sparse_decode(q, kc, ii, **kw)
        assert (out == 0).all() and (lse == INF).all()
        sink = torch.randn(128)
        out, lse = _sparse_decode(q, kc, ii, attn_sink=sink, **kw)       # with a sink too
        assert (out == 0).all() and (lse == INF).all()


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["v32", "v41"])
def test_sparse_decode_h128_empty_requests_dispatched_gpu(fmt):
    """b = 128, topk = 2048, h_q = 128: enough blocks per CTA for the cluster kernel (WS3) dispatch."""
    q, kc, ind, tl_, empty = _empty_work_case(128, 1, 128, 2048, fmt, "cuda")
    out, lse = _sparse_decode(q, kc, ind, topk_length=tl_)
    ro, rl = sparse_decode_ref(q, kc, ind, 512, None, None, None, None, tl_, None, out_dtype=torch.float32)
    _check_decode_rows(out, lse, ro, rl, empty)


# ------------------------------------------------------------------------- 4. sparse prefill edge cases
@pytest.mark.reference
def test_sparse_prefill_bad_arguments_named():
    q, kv, ind = _prefill_case(h_q=128)
    cases = [
        (ValueError, r"q: h_q must be one of \[16, 32, 64, 128\], got shape \[3, 256, 576\]",
         (torch.randn(3, 256, 576).bfloat16(), kv, ind), {}),
        (TypeError, r"indices must have dtype torch.int32, got torch.int64", (q, kv, ind.long()), {}),
        (ValueError, r"indices must have shape \[3, 1, topk\], got \[2, 1, 64\]", (q, kv, ind[:2]), {}),
        (ValueError, r"indices must have shape \[3, 1, topk\], got \[3, 2, 64\]",
         (q, kv, ind.expand(3, 2, 64)), {}),
        (ValueError, r"kv must have shape \[s_kv, 1, 576\], got \[150, 1, 512\]", (q, kv[..., :512], ind), {}),
        (ValueError, r"topk_length must have shape \[3\], got \[4\]", (q, kv, ind),
         dict(topk_length=torch.zeros(4, dtype=torch.int32))),
        (ValueError, r"attn_sink must have shape \[128\], got \[64\]", (q, kv, ind), dict(attn_sink=torch.zeros(64))),
        # any finite sm_scale is accepted (FlashMLA; <= 0 exact since session 19, tests/test_review_s19.py)
        (ValueError, r"sm_scale must be finite, got nan", (q, kv, ind, float("nan")), {}),
    ]
    for exc, pat, args, kw in cases:
        if len(args) == 3:
            args = (*args, 0.05)
        with pytest.raises(exc, match=pat):
            dk.flash_mla_sparse_fwd(*args, **kw)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("h_q", [64, 128])
def test_sparse_prefill_empty_rows_next_to_full_ones(tier, h_q):
    s_q, s_kv, topk = 6, 150, 64
    q, kv, ind = _prefill_case(s_q=s_q, h_q=h_q, s_kv=s_kv, topk=topk)
    kv_nan = kv.clone()
    used = torch.zeros(s_kv, dtype=torch.bool)
    ind[0] = -1
    ind[1] = torch.tensor([s_kv, 2**31 - 1, -2**31, -1], dtype=torch.int32).repeat(topk // 4)
    tl_ = torch.full((s_q,), topk, dtype=torch.int32)
    tl_[2], tl_[3], tl_[4] = 0, -5, 2**31 - 1
    for i in (4, 5):
        used[ind[i, 0].long()] = True
    kv_nan[~used] = float("nan")                      # nothing an empty / clamped row may read is finite
    out, ml, lse = dk.flash_mla_sparse_fwd(q, kv_nan, ind, 0.05, topk_length=tl_)
    ro, rml, rlse = sparse_prefill_ref(q, kv_nan, ind, 0.05, 512, None, tl_)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any() and not torch.isnan(ml).any()
    assert (out[:4] == 0).all() and (lse[:4] == INF).all() and (ml[:4] == -INF).all()
    torch.testing.assert_close(out[4:].float(), ro[4:].float(), atol=2e-3, rtol=2.01 / 128)
    torch.testing.assert_close(lse[4:], rlse[4:].float(), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(ml[4:], rml[4:].float(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("tier", TIERS)
def test_sparse_prefill_empty_shapes(tier):
    q, kv, ind = _prefill_case(h_q=128)
    out, ml, lse = dk.flash_mla_sparse_fwd(q[:0], kv, ind[:0], 0.05)                 # s_q = 0
    assert out.shape == (0, 128, 512) and ml.shape == lse.shape == (0, 128)
    for args in ((q, kv[:0], ind), (q, kv, ind[..., :0])):                           # s_kv = 0, topk = 0
        out, ml, lse = dk.flash_mla_sparse_fwd(*args, 0.05)
        assert (out == 0).all() and (lse == INF).all() and (ml == -INF).all()
