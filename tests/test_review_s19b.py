"""Regression tests of the session-19 fresh-user review (/tmp/s19/fresh_user_report.md, P1, P4, P5): GEMM recipes and
integer / scale arguments.

1. The dense FP8 GEMMs ``fp8_gemm_{nt,nn,tn,tt}`` (= ``fp8_fp4_gemm_*``, = ``deep_gemm.fp8_gemm_*`` through the compat
   module) lacked upstream's ``recipe_a`` / ``recipe_b``: a keyword call failed and an upstream positional call bound
   ``recipe_a`` to ``compiled_dims``. Now the upstream signature ``(a, b, d, c=None, recipe=None, recipe_a=None,
   recipe_b=None, compiled_dims='nk'|'mn', disable_ue8m0_cast=False)``; ``(1, 128)`` + ``(128, 128)`` is recipe
   ``(1, 128, 128)`` and ``(1, 128)`` + ``(1, 128)`` is ``(1, 1, 128)``. One parser for every FP8 GEMM
   (``deepkernels._validate.check_gemm_recipe``): the m-grouped ops accepted ``recipe_a=(1, 128), recipe_b=(1, 128)``
   and ignored it while rejecting the equivalent ``recipe=(1, 1, 128)``; both spellings now follow one rule.
2. ``recipe`` was read with ``int()``: ``"abc"`` gave int()'s ValueError, ``5`` "'int' object is not iterable",
   ``(1.9, 128, 128)`` ran as ``(1, 128, 128)``. Now a tuple / list of ``numbers.Integral`` (NumPy ints included; not
   bool, not float), else a TypeError / ValueError naming the argument and showing the value. The plan caches'
   signatures take exact ints only, so ``(True, 128, 128)`` (equal and hash-equal to ``(1, 128, 128)``) can never be
   served a cached plan without validation.
3. ``flash_attn_varlen_*``: ``head_dim_qk`` / ``max_seqlen*`` went through ``int()`` (192.9 and "192" accepted, 5.7
   truncated, None an int() TypeError); a huge Python int scale gave a bare OverflowError. Now integers only
   (TypeError naming the argument) and a scale beyond the float range is "must be finite" (ValueError).
4. ``expected_m=np.int64(4)`` was rejected by the masked GEMMs (upstream's pybind int takes it): any
   ``numbers.Integral`` but bool; a NumPy expected_m uses the plan of the equal int.

Tiers: ``reference`` (CPU, the default run) and one ``interpret`` test of the plan caches (TRITON_INTERPRET=1).
"""
import inspect
import re
from fractions import Fraction

import numpy as np
import pytest
import torch

import deepkernels as dk
from deepkernels._validate import check_gemm_recipe, check_int, check_int_tuple, check_scale
from deepkernels.compat import deep_gemm as dg
from deepkernels.gemm import dense, grouped
from deepkernels.mla.dense_prefill import flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func
from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8

REF = pytest.mark.reference
M, N, K = 7, 33, 256
BAD_RECIPE_TYPES = ["abc", 5, 1.5, None, (1.9, 128, 128), (True, 128, 128), (1, 128.0, 128), (1, "128", 128),
                    (1, None, 128), {1, 128}, torch.tensor([1, 128, 128])]
BAD_INTS = [192.9, 192.0, "192", None, True, np.float64(192.0), torch.tensor(192)]


def _nan(*shape, dtype=torch.bfloat16):
    return torch.full(shape, float("nan"), dtype=dtype)


def _dense_case(per_row_b=False):
    a = per_token_cast_to_fp8(torch.randn(M, K).bfloat16())
    w = torch.randn(N, K).bfloat16()
    return a, per_token_cast_to_fp8(w) if per_row_b else per_block_cast_to_fp8(w)


def _grouped_b(g, n, k, per_row=False):
    w = torch.randn(g, n, k).bfloat16()
    q = [(per_token_cast_to_fp8 if per_row else per_block_cast_to_fp8)(w[i]) for i in range(g)]
    return torch.stack([x[0] for x in q]), torch.stack([x[1] for x in q])


def _masked_case(g=2, m_max=8, n=16, k=128):
    a = torch.randn(g, m_max, k).bfloat16()
    q = [per_token_cast_to_fp8(a[i]) for i in range(g)]
    A = (torch.stack([x[0] for x in q]), torch.stack([x[1] for x in q]))
    return A, _grouped_b(g, n, k), torch.tensor([3, 8], dtype=torch.int32)


# ------------------------------------------------------------------------------------------------ 1. signatures
@REF
@pytest.mark.parametrize("op, dims", [("nt", "nk"), ("nn", "nk"), ("tn", "mn"), ("tt", "mn")])
def test_dense_fp8_signature_is_upstreams(op, dims):
    """docs/spec/gemm.md §1.2: the same parameter order and defaults for deepkernels, the fp8_fp4 alias and the
    compat module's deep_gemm name."""
    want = [("a", None), ("b", None), ("d", None), ("c", None), ("recipe", None), ("recipe_a", None),
            ("recipe_b", None), ("compiled_dims", dims), ("disable_ue8m0_cast", False)]
    for fn in (getattr(dk, f"fp8_gemm_{op}"), getattr(dk, f"fp8_fp4_gemm_{op}"), getattr(dg, f"fp8_gemm_{op}"),
               getattr(dg, f"fp8_fp4_gemm_{op}")):
        params = [p for p in inspect.signature(fn).parameters.values() if p.kind == p.POSITIONAL_OR_KEYWORD]
        got = [(p.name, None if p.default is p.empty else p.default) for p in params]
        assert got == want, fn


@REF
def test_dense_fp8_upstream_positional_and_keyword_calls():
    """The report's calls: keywords, c/recipe/recipe_a/recipe_b positionally, and all nine positionally."""
    a, b = _dense_case()
    want = torch.empty(M, N, dtype=torch.bfloat16)
    dk.fp8_gemm_nt(a, b, want)
    calls = [lambda d: dk.fp8_gemm_nt(a, b, d, recipe_a=(1, 128), recipe_b=(128, 128)),
             lambda d: dk.fp8_gemm_nt(a, b, d, None, None, None, None),
             lambda d: dk.fp8_gemm_nt(a, b, d, None, None, None, None, "nk", True),
             lambda d: dk.fp8_gemm_nt(a, b, d, None, None, (1, 128), (128, 128)),
             lambda d: dk.fp8_gemm_nt(a, b, d, None, (1, 128, 128), None, None, "nk", False),
             lambda d: dg.fp8_gemm_nt(a, b, d, None, None, None, None, "nk", True),
             lambda d: dg.fp8_fp4_gemm_nt(a, b, d, recipe_a=[1, 128], recipe_b=[128, 128])]
    for call in calls:
        d = _nan(M, N)
        call(d)
        assert torch.equal(d, want)
    # the 8th positional argument is compiled_dims (upstream order), checked as such
    with pytest.raises(ValueError, match="compiled_dims"):
        dk.fp8_gemm_nt(a, b, _nan(M, N), None, None, None, None, None)


@REF
def test_dense_fp8_recipe_ab_equals_recipe_per_row_weights():
    """``(1, 128)`` + ``(1, 128)`` is the 1D1D recipe ``(1, 1, 128)``: per-row weight scales, fp32 accumulation."""
    a, b = _dense_case(per_row_b=True)
    c = torch.randn(M, N)
    want = c.clone()
    dk.fp8_gemm_nt(a, b, want, c=want, recipe=(1, 1, 128))
    for kw in (dict(recipe_a=(1, 128), recipe_b=(1, 128)), dict(recipe_a=(np.int64(1), 128), recipe_b=[1, 128]),
               dict(recipe=(np.int32(1), np.int64(1), 128)), dict()):
        d = c.clone()
        dk.fp8_gemm_nt(a, b, d, c=d, **kw)
        assert torch.equal(d, want), kw
    # recipe_b=(1, 128) names per-row weight scales: block scales then fail the scale-shape check
    _, b_block = _dense_case()
    with pytest.raises(ValueError, match=r"b\[1\]"):
        dk.fp8_gemm_nt(a, b_block, c.clone(), recipe_a=(1, 128), recipe_b=(1, 128))


@REF
@pytest.mark.parametrize("op", ["nn", "tn", "tt"])
def test_dense_fp8_transposed_views_take_recipe_ab(op):
    a, b = _dense_case()
    a_op = a if op == "nn" else (a[0].T, a[1].T)                                    # tn / tt: a is [K, M]
    b_op = (b[0].T, b[1].T) if op in ("nn", "tn") else b                            # nn / tn: b is [K, N]
    fn = getattr(dk, f"fp8_gemm_{op}")
    want = _nan(M, N)
    fn(a_op, b_op, want, recipe=(1, 128, 128))
    d = _nan(M, N)
    fn(a_op, b_op, d, None, None, (1, 128), (128, 128))
    assert torch.equal(d, want) and not d.isnan().any()
    d = _nan(M, N)
    with pytest.raises(ValueError, match=r"recipe_a=\(1, 128\), recipe_b=\(64, 128\)"):
        fn(a_op, b_op, d, recipe_a=(1, 128), recipe_b=(64, 128))
    assert d.isnan().all()


# ------------------------------------------------------------------------------------------------ 2. recipe rules
@REF
def test_check_gemm_recipe_mapping_and_combinations():
    both = ((1, 128, 128), (1, 1, 128))
    assert check_gemm_recipe(None, None, None, both, "x") is None
    assert check_gemm_recipe((1, 128, 128), None, None, both, "x") == (1, 128, 128)
    assert check_gemm_recipe([1, 1, 128], None, None, both, "x") == (1, 1, 128)
    assert check_gemm_recipe(None, (1, 128), (128, 128), both, "x") == (1, 128, 128)
    assert check_gemm_recipe(None, (1, 128), (1, 128), both, "x") == (1, 1, 128)
    r = check_gemm_recipe(None, (np.int64(1), np.uint8(128)), (np.int16(128), 128), both, "x")
    assert r == (1, 128, 128) and all(type(v) is int for v in r)
    with pytest.raises(ValueError, match="not both"):
        check_gemm_recipe((1, 128, 128), (1, 128), (128, 128), both, "x")
    with pytest.raises(ValueError, match="not both"):
        check_gemm_recipe((1, 128, 128), None, (128, 128), both, "x")
    for ra, rb in (((1, 128), None), (None, (128, 128))):
        with pytest.raises(ValueError, match="recipe_a and recipe_b must be given together"):
            check_gemm_recipe(None, ra, rb, both, "x")
    # shared gran_k, and only implemented combinations (the message names both arguments and shows the values)
    for ra, rb in (((1, 128), (128, 64)), ((128, 128), (128, 128)), ((1, 32), (1, 32)), ((1, 128), (32, 128))):
        with pytest.raises(ValueError, match=rf"got recipe_a={re.escape(str(ra))}, recipe_b={re.escape(str(rb))}"):
            check_gemm_recipe(None, ra, rb, both, "x")
    with pytest.raises(ValueError, match=r"got recipe=\(1, 128, 32\)"):
        check_gemm_recipe((1, 128, 32), None, None, both, "x")


@REF
@pytest.mark.parametrize("bad", BAD_RECIPE_TYPES, ids=repr)
def test_recipe_types_rejected_with_the_argument_named(bad):
    a, b = _dense_case()
    for kw, name in ((dict(recipe=bad), "recipe"), (dict(recipe_a=bad, recipe_b=(128, 128)), "recipe_a"),
                     (dict(recipe_a=(1, 128), recipe_b=bad), "recipe_b")):
        if bad is None and name != "recipe":
            continue  # None is "not given": the together-rule, covered above
        d = _nan(M, N)
        if bad is None:
            dk.fp8_gemm_nt(a, b, d, **kw)                   # recipe=None: the default
            continue
        with pytest.raises((TypeError, ValueError), match=rf"^{name} must be a tuple of \d ints, got ") as e:
            dk.fp8_gemm_nt(a, b, d, **kw)
        assert "invalid literal" not in str(e.value) and "not iterable" not in str(e.value)
        assert d.isnan().all()


@REF
def test_recipe_type_errors_show_the_value():
    a, b = _dense_case()
    cases = [("abc", TypeError, "recipe must be a tuple of 3 ints, got str 'abc'"),
             (5, TypeError, "recipe must be a tuple of 3 ints, got int 5"),
             ((1.9, 128, 128), TypeError, "got float 1.9 in (1.9, 128, 128)"),
             ((True, 128, 128), TypeError, "got bool True in (True, 128, 128)"),
             ((1, 128), ValueError, "recipe must be a tuple of 3 ints, got 2 entries: (1, 128)")]
    for bad, exc, msg in cases:
        with pytest.raises(exc) as e:
            dk.fp8_gemm_nt(a, b, _nan(M, N), recipe=bad)
        assert msg in str(e.value)
    assert check_int_tuple("r", [np.int64(3), 4], 2) == (3, 4)


@REF
def test_grouped_recipe_spellings_follow_one_rule():
    """m-grouped: ``recipe=(1, 1, 128)`` and ``recipe_a=(1, 128), recipe_b=(1, 128)`` are the same (unsupported)
    recipe and are both rejected; ``(1, 128, 128)`` and ``(1, 128)`` + ``(128, 128)`` give the default result.
    k-grouped: its one recipe ``(1, 1, 128)`` with the same type rules."""
    g, n, k = 2, 33, 256
    B, B_row = _grouped_b(g, n, k), _grouped_b(g, n, k, per_row=True)
    lay = torch.tensor([0, 0, 0, 1, 1, 1, 1], dtype=torch.int32)
    A = per_token_cast_to_fp8(torch.randn(7, k).bfloat16())
    want = _nan(7, n)
    dk.m_grouped_fp8_gemm_nt_contiguous(A, B, want, lay)
    for kw in (dict(recipe=(1, 128, 128)), dict(recipe_a=(1, 128), recipe_b=(128, 128)),
               dict(recipe=[np.int64(1), 128, 128])):
        d = _nan(7, n)
        dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, lay, **kw)
        assert torch.equal(d, want), kw
    for bb in (B, B_row):
        for kw in (dict(recipe=(1, 1, 128)), dict(recipe_a=(1, 128), recipe_b=(1, 128))):
            d = _nan(7, n)
            with pytest.raises(ValueError, match="m-grouped FP8 GEMMs support"):
                dk.m_grouped_fp8_gemm_nt_contiguous(A, bb, d, lay, **kw)
            assert d.isnan().all()
    Am, Bm, mm = _masked_case()
    for kw in (dict(recipe=(1, 1, 128)), dict(recipe_a=(1, 128), recipe_b=(1, 128))):
        with pytest.raises(ValueError, match="m-grouped FP8 GEMMs support"):
            dk.m_grouped_fp8_gemm_nt_masked(Am, Bm, _nan(2, 8, 16), mm, 4, **kw)
    for bad in ("x", 5, (1.9, 128, 128), (True, 128, 128)):
        with pytest.raises(TypeError, match="recipe must be a tuple of 3 ints"):
            dk.m_grouped_fp8_gemm_nt_contiguous(A, B, _nan(7, n), lay, recipe=bad)
        with pytest.raises(TypeError, match="recipe must be a tuple of 3 ints"):
            dk.m_grouped_fp8_gemm_nt_masked(Am, Bm, _nan(2, 8, 16), mm, 4, recipe=bad)
        with pytest.raises(TypeError, match="recipe must be a tuple of 3 ints"):
            dk.k_grouped_fp8_gemm_nt_contiguous(A, A, torch.zeros(1, 7, 7), [k], recipe=bad)
    with pytest.raises(TypeError, match=r"recipe_b must be a tuple of 2 ints, got float 128.0"):
        dk.m_grouped_fp8_gemm_nt_masked(Am, Bm, _nan(2, 8, 16), mm, 4, recipe_a=(1, 128), recipe_b=(128.0, 128))
    with pytest.raises(ValueError, match=r"k-grouped FP8 GEMMs support recipe \(1, 1, 128\)"):
        dk.k_grouped_fp8_gemm_nt_contiguous(A, A, torch.zeros(1, 7, 7), [k], recipe=(1, 128, 128))


@REF
def test_plan_signatures_take_exact_int_recipes_only():
    """A recipe that equals and hashes like a valid one but is not made of exact ints (bool, float, NumPy ints) gets
    no plan signature, so it is validated on every call (the plan caches hold validated signatures only)."""
    a, b = _dense_case()
    d = torch.empty(M, N, dtype=torch.bfloat16)

    def sig(recipe=None, ra=None, rb=None):
        return dense._fp8_sig(a, b, d, None, recipe, ra, rb, "nk", None)
    assert sig() is not None and sig((1, 128, 128)) is not None and sig(None, (1, 128), [128, 128]) is not None
    assert sig((1, 128, 128)) != sig(None, (1, 128), (128, 128))
    for bad in ((True, 128, 128), (1.0, 128, 128), (np.int64(1), 128, 128), "abc", 5):
        assert sig(bad) is None and sig(None, bad, (128, 128)) is None and sig(None, (1, 128), bad) is None
    Am, Bm, mm = _masked_case()
    dm = torch.empty(2, 8, 16, dtype=torch.bfloat16)

    def gsig(recipe, em=4):
        return grouped._fp8_sig("masked", Am, Bm, dm, mm, (recipe, None, None, "nk", grouped._int(em), None))
    assert gsig((1, 128, 128)) is not None and gsig((True, 128, 128)) is None and gsig((1.0, 128, 128)) is None
    assert gsig(None, np.int64(4)) == gsig(None, 4)             # a NumPy expected_m shares the int's plan
    assert gsig(None, True) is None and gsig(None, 4.0) is None


# ------------------------------------------------------------------------------------------------ 3. ints, scales
def _packed_case(d_qk=192):
    cu = torch.tensor([0, 3, 8], dtype=torch.int32)
    qkv = (torch.randn(8, 2, 2 * d_qk + 128) / 4).bfloat16()
    return qkv, cu


@REF
@pytest.mark.parametrize("bad", BAD_INTS, ids=repr)
def test_dense_prefill_integer_arguments(bad):
    qkv, cu = _packed_case()
    q, k, v = qkv[..., :192], qkv[..., 192:384], qkv[..., 384:]
    kv = qkv[..., 192:]
    calls = [("head_dim_qk", lambda: flash_attn_varlen_qkvpacked_func(qkv, cu, 5, bad)),
             ("max_seqlen", lambda: flash_attn_varlen_qkvpacked_func(qkv, cu, bad, 192)),
             ("head_dim_qk", lambda: flash_attn_varlen_kvpacked_func(q, kv, cu, cu, 5, 5, bad)),
             ("max_seqlen_qo", lambda: flash_attn_varlen_kvpacked_func(q, kv, cu, cu, bad, 5, 192)),
             ("max_seqlen_qo", lambda: dk.flash_attn_varlen_func(q, k, v, cu, cu, bad, 5)),
             ("max_seqlen_kv", lambda: dk.flash_attn_varlen_func(q, k, v, cu, cu, 5, bad))]
    for name, call in calls:
        with pytest.raises(TypeError, match=rf"^{name} must be an int, got ") as e:
            call()
        assert "int() argument" not in str(e.value)


@REF
def test_dense_prefill_integer_arguments_accept_numpy_and_reject_negative():
    qkv, cu = _packed_case()
    want = flash_attn_varlen_qkvpacked_func(qkv, cu, 5, 192, causal=True)
    for hd, ms in ((np.int64(192), np.int32(5)), (np.int16(192), 5), (192, np.uint8(5))):
        got = flash_attn_varlen_qkvpacked_func(qkv, cu, ms, hd, causal=True)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    q, kv = qkv[..., :192], qkv[..., 192:]
    got = flash_attn_varlen_kvpacked_func(q, kv, cu, cu, np.int64(5), np.int64(5), np.int64(192), causal=True)
    assert torch.equal(got[0], want[0])
    with pytest.raises(ValueError, match="max_seqlen must be >= 0, got -1"):
        flash_attn_varlen_qkvpacked_func(qkv, cu, -1, 192)
    with pytest.raises(ValueError, match="head_dim_qk must be >= 1, got 0"):
        flash_attn_varlen_qkvpacked_func(qkv, cu, 5, 0)
    with pytest.raises(ValueError, match="max_seqlen_kv must be >= 0, got -2"):
        dk.flash_attn_varlen_func(q, kv[..., :192], kv[..., 192:], cu, cu, 5, -2)
    with pytest.raises(ValueError, match="max_seqlen_qo=4 is smaller"):     # unchanged: checked against cu_seqlens
        flash_attn_varlen_qkvpacked_func(qkv, cu, np.int64(4), 192)


@REF
def test_huge_scale_is_not_finite():
    """A Python int (or Fraction) beyond the float range: ValueError "must be finite", not a bare OverflowError; the
    message must not print the number itself (``str`` of an int over 4300 digits raises)."""
    for v in (10**400, -10**400, 10**5000, Fraction(10**400, 3)):
        with pytest.raises(ValueError, match="^softmax_scale must be finite") as e:
            check_scale("softmax_scale", v)
        assert len(str(e.value)) < 200
    assert check_scale("s", 10**300) == 1e300 and check_scale("s", Fraction(1, 4)) == 0.25
    qkv, cu = _packed_case()
    with pytest.raises(ValueError, match="^softmax_scale must be finite"):
        flash_attn_varlen_qkvpacked_func(qkv, cu, 5, 192, softmax_scale=10**400)
    q = torch.randn(2, 16, 512).bfloat16()
    kv = torch.randn(10, 1, 512).bfloat16()
    idx = torch.randint(0, 10, (2, 1, 4), dtype=torch.int32)
    with pytest.raises(ValueError, match="^sm_scale must be finite"):
        dk.flash_mla_sparse_fwd(q, kv, idx, 10**400)


@REF
def test_check_int():
    assert check_int("x", np.int64(7)) == 7 and type(check_int("x", np.int64(7))) is int
    for bad in (True, np.bool_(True), 7.0, "7", None, torch.tensor(7)):
        with pytest.raises(TypeError, match="^x must be an int, got "):
            check_int("x", bad)
    with pytest.raises(ValueError, match="^x must be >= 0, got -1"):
        check_int("x", -1, min_value=0)
    with pytest.raises(ValueError, match="^x must be an int"):
        check_int("x", 1.0, exc=ValueError)


# ------------------------------------------------------------------------------------------------ 4. expected_m
@REF
def test_masked_expected_m_accepts_numpy_integers():
    A, B, mm = _masked_case()
    want = _nan(2, 8, 16)
    dk.m_grouped_fp8_gemm_nt_masked(A, B, want, mm, 4)
    for em in (np.int64(4), np.int32(4), np.uint16(4)):
        d = _nan(2, 8, 16)
        dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, em)
        assert torch.equal(d.nan_to_num(7.0), want.nan_to_num(7.0))
        d = _nan(2, 8, 16)
        dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, expected_m=em)
        assert torch.equal(d.nan_to_num(7.0), want.nan_to_num(7.0))
    a16, b16 = torch.randn(2, 8, 128).bfloat16(), torch.randn(2, 16, 128).bfloat16()
    w16 = _nan(2, 8, 16)
    dk.m_grouped_bf16_gemm_nt_masked(a16, b16, w16, mm, 4)
    d16 = _nan(2, 8, 16)
    dk.m_grouped_bf16_gemm_nt_masked(a16, b16, d16, mm, np.int64(4))
    assert torch.equal(d16.nan_to_num(7.0), w16.nan_to_num(7.0))
    for bad in (True, np.bool_(True), 4.0, np.float64(4), "4", np.int64(0), np.int64(-1)):
        with pytest.raises(ValueError, match="expected_m must be an int > 0"):
            dk.m_grouped_fp8_gemm_nt_masked(A, B, _nan(2, 8, 16), mm, bad)
    assert dk.get_theoretical_mk_alignment_for_contiguous_layout(np.int64(4)) == \
        dk.get_theoretical_mk_alignment_for_contiguous_layout(4)


# ------------------------------------------------------------------------------------------------ plan caches
@pytest.mark.interpret
def test_plan_caches_never_serve_an_unvalidated_recipe_interpret():
    """Kernel path (interpreter): after a cached call with recipe ``(1, 128, 128)``, a hash-equal ``(True, 128, 128)``
    or ``(1.0, 128, 128)`` is still rejected; recipe_a/recipe_b give the same result; a NumPy expected_m reuses the
    masked plan of the equal int."""
    a, b = _dense_case()
    dense._FP8_PLANS.clear()
    want = _nan(M, N)
    dk.fp8_gemm_nt(a, b, want, recipe=(1, 128, 128))
    dk.fp8_gemm_nt(a, b, want, recipe=(1, 128, 128))
    assert len(dense._FP8_PLANS) == 1
    for bad in ((True, 128, 128), (1.0, 128, 128)):
        d = _nan(M, N)
        with pytest.raises(TypeError, match="recipe must be a tuple of 3 ints"):
            dk.fp8_gemm_nt(a, b, d, recipe=bad)
        assert d.isnan().all()
    d = _nan(M, N)
    dk.fp8_gemm_nt(a, b, d, None, None, (1, 128), (128, 128))
    assert torch.equal(d, want)
    with pytest.raises(TypeError, match="recipe_b must be a tuple of 2 ints"):
        dk.fp8_gemm_nt(a, b, _nan(M, N), recipe_a=(1, 128), recipe_b=(True, 128))
    A, B, mm = _masked_case()
    grouped._PLANS.clear()
    wm = _nan(2, 8, 16)
    dk.m_grouped_fp8_gemm_nt_masked(A, B, wm, mm, 4, recipe=(1, 128, 128))
    assert len(grouped._PLANS) == 1
    dm = _nan(2, 8, 16)
    dk.m_grouped_fp8_gemm_nt_masked(A, B, dm, mm, np.int64(4), recipe=(1, 128, 128))
    assert len(grouped._PLANS) == 1 and torch.equal(dm.nan_to_num(7.0), wm.nan_to_num(7.0))
    with pytest.raises(TypeError, match="recipe must be a tuple of 3 ints"):
        dk.m_grouped_fp8_gemm_nt_masked(A, B, _nan(2, 8, 16), mm, 4, recipe=(True, 128, 128))
