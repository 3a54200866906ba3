"""Session 20: the WS3 sparse decode kernel's ``Q_AHEAD`` option (``_gluon_sparse_decode_ws3``, module docstring
"Q ahead"; the softmax warpgroup ``_gluon_sparse_decode_ws2._w2_softmax_wg`` with ``Q_AHEAD``). Compile tier (sm90
cross-compile: 0 spills in every token loop, shared memory as the default build, the Q copies in the PTX), CPU
plumbing (keyword, constexpr, gate), and a GPU tier: bit identity against the dispatched build (same Q bytes, same
consumer expressions) with NaN-poisoned outputs, NaN in every unreferenced cache token, -1 / out-of-range indices,
zero lengths, many requests per CTA, split requests through the combine, and the extra-cache entry."""
from __future__ import annotations

import functools
import inspect
import re

import pytest
import torch

import deepkernels.mla.sparse_decode as sd
from deepkernels.mla import _gluon_sparse_decode_ws3 as W3

import test_mla_sparse_kernels as _kernels
from test_mla_sparse_kernels import run_and_check
from test_mla_sparse_reference import make_case
from deepkernels.testing.compile import n_hgmma, n_spill, ws_loop_roles

pytestmark = pytest.mark.skipif(not W3.available(), reason=f"Gluon not importable: {W3._IMPORT_ERROR!r}")

FMTS = ("v32", "v41")
poison, sms = _kernels.poison, _kernels.sms     # fixtures (NaN-poisoned public-op outputs; the scheduler's SM count)
_CONFIGS = [(6, False, False), (6, True, True), (-1, True, False)]
# cp.async per softmax thread and copy site: 8 (9 with V3.2's RoPE part) chunks of [64, 64] bf16 x 4 x 16 B
_Q_CP = {"v32": 36, "v41": 32}


@functools.lru_cache(maxsize=None)
def _build(fmt, page_shift, has_len, has_sink, q_ahead, xfmt=None, **knobs):
    if xfmt is None:
        k = W3.compile_sm90_ws3(fmt, page_shift, has_len, has_sink, q_ahead=q_ahead, **knobs)
    else:
        k = W3.compile_sm90_ws3_extra(fmt, xfmt, page_shift, has_len, has_sink, q_ahead=q_ahead, **knobs)
    return k.asm["ptx"], int(k.metadata.shared)


@functools.lru_cache(maxsize=None)
def _sass(ptx):
    from deepkernels.testing.compile import ptxas_sm90
    rep = ptxas_sm90(ptx, sass=True)
    if rep is None:
        pytest.skip("ptxas not available")
    return rep


# ------------------------------------------------------------------ compile tier
@pytest.mark.compile
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("page_shift,has_len,has_sink", _CONFIGS)
def test_compile_q_ahead(fmt, page_shift, has_len, has_sink):
    """Q_AHEAD compiles with the default build's shared memory, 0 spill instructions in each token loop (softmax,
    PV, producer: the default build's loops have 0 too), the same wgmmas, and the Q copies at two sites (before the
    request loop, during the epilogue) instead of one load per request."""
    ptx, shared = _build(fmt, page_shift, has_len, has_sink, True)
    ptx0, shared0 = _build(fmt, page_shift, has_len, has_sink, False)
    assert shared == shared0
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16") == 8
    assert len(re.findall(r"cp\.async\.cg\.shared\.global(\.L2::\w+)? \[", ptx)) == 2 * _Q_CP[fmt] + (
        len(re.findall(r"cp\.async\.cg\.shared\.global(\.L2::\w+)? \[", ptx0)) - (_Q_CP[fmt] if fmt == "v32" else 0))
    # one commit group per copy site, one wait per request top; the kernel's single %tid.x read (module docstring,
    # "Uniform registers")
    assert ptx.count("cp.async.commit_group;") == 2 and len(re.findall(r"cp\.async\.wait_group\s+0;", ptx)) == 1
    assert ptx.count("%tid.x") == 1
    rep = _sass(ptx)
    soft, pv, prod = ws_loop_roles(rep.sass)
    assert len(soft) == 1 and len(pv) == 1 and len(prod) == 1
    assert n_spill(soft[0]) == 0 and n_spill(pv[0]) == 0 and n_spill(prod[0]) == 0
    assert n_hgmma(soft[0]) == (40 if fmt == "v32" else 36) and n_hgmma(pv[0]) == 4
    assert not any("MEMBAR.ALL.GPU" in t for t in soft[0] + pv[0] + prod[0])


@pytest.mark.compile
@pytest.mark.parametrize("fmt,xfmt", [("v41", "fp4"), ("v41", "v41"), ("v32", "v32")])
def test_compile_q_ahead_extra(fmt, xfmt):
    """The extra-cache entry with Q_AHEAD: 0 spills in the consumer loops, the producer loops no worse than the
    default build's, the default build's shared memory."""
    ptx, shared = _build(fmt, 6, True, True, True, xfmt)
    _, shared0 = _build(fmt, 6, True, True, False, xfmt)
    assert shared == shared0
    rep = _sass(ptx)
    rep0 = _sass(_build(fmt, 6, True, True, False, xfmt)[0])
    soft, pv, prod = ws_loop_roles(rep.sass)
    soft0, pv0, prod0 = ws_loop_roles(rep0.sass)
    assert len(soft) == 1 and len(pv) == 1 and len(prod) == len(prod0)
    assert n_spill(soft[0]) == 0 and n_spill(pv[0]) == 0
    assert sum(n_spill(lp) for lp in prod) <= sum(n_spill(lp) for lp in prod0)


@pytest.mark.compile
@pytest.mark.parametrize("q_ahead", [False, True], ids=["d144", "qhd"])
def test_compile_q_ahead_v41_deq_asm_144(q_ahead):
    """The V4.1 bench variants ``d144`` (inline-PTX dequant, producer setmaxnreg 144, softmax 200) and ``qhd`` (the
    same with Q_AHEAD): 0 spills in every token loop (at 120 / 136 the producer loop spilled 87 / 10 instructions:
    session 20 notes)."""
    ptx, _ = _build("v41", 6, False, False, q_ahead, deq_asm=True, producer_regs=144)
    soft, pv, prod = ws_loop_roles(_sass(ptx).sass)
    assert n_spill(soft[0]) == 0 and n_spill(pv[0]) == 0 and n_spill(prod[0]) == 0
    assert len(prod[0]) < 700, len(prod[0])       # 587 / 614 at build time (782 with the plain dequant)


# ------------------------------------------------------------------ CPU: plumbing
def test_q_ahead_option_plumbing():
    """q_ahead: keyword after pf_l2, before the session-17 / 18 options (rope_rows, row_lanes, idx_ahead, pf_lines,
    q_async keep their places at the end); Q_AHEAD a constexpr after PF_L2 in both kernel entries (the same
    place in _CONSTEXPRS); off by default; q with strides not 16-element multiples keeps the build without it (the
    16-byte cp.async needs them)."""
    for f in (W3.launch_sparse_decode_gluon_ws3, W3.compile_sm90_ws3, W3.compile_sm90_ws3_extra):
        sig = inspect.signature(f).parameters
        assert list(sig)[-7:] == ["pf_l2", "q_ahead", "rope_rows", "row_lanes", "idx_ahead", "pf_lines", "q_async"]
        assert sig["q_ahead"].default is None
    assert W3._CONSTEXPRS[-7:] == ("PF_L2", "Q_AHEAD", "ROPE_ROWS", "ROW_LANES", "IDX_AHEAD", "PF_LINES", "Q_ASYNC")
    for k in (W3._sparse_decode_gluon_ws3_kernel, W3._sparse_decode_gluon_ws3_x_kernel):
        assert [p.name for p in k.params if p.is_constexpr][:len(W3._CONSTEXPRS)] == list(W3._CONSTEXPRS)
    assert W3.WS3_Q_AHEAD == frozenset()
    for fmt in FMTS:
        assert not W3._q_ahead(fmt, None) and W3._q_ahead(fmt, True) and not W3._q_ahead(fmt, False)
    q = torch.zeros(2, 1, 128, 576, dtype=torch.bfloat16)
    assert W3._q_ahead("v32", True, q)
    q584 = torch.zeros(2, 1, 128, 584, dtype=torch.bfloat16)[..., :576]     # head stride 584: not a 16-multiple
    assert not W3._q_ahead("v32", True, q584)


def test_q_ahead_reaches_the_launcher(monkeypatch):
    """The launcher puts Q_AHEAD into the constexprs (and so into the launcher key): None takes V4.1's main-cache
    default, explicit False / True win."""
    import deepkernels.mla.combine as comb
    calls = []
    monkeypatch.setattr(W3._ClusterLauncher, "__call__", lambda self, gx, args, s: calls.append(dict(self.meta)))
    monkeypatch.setattr(W3, "_LAUNCHERS", {})
    monkeypatch.setattr(comb, "combine_splits_", lambda *a, **k: None)
    kw = make_case(3, 1, 128, "v41", 100, 200, 64, with_len=True, sink=True)
    b, s_q, h_q = kw["q"].shape[:3]
    out, lse = torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16), torch.empty(b, s_q, h_q)
    sched, ns = torch.zeros(5, 8, dtype=torch.int32), torch.zeros(b + 1, dtype=torch.int32)
    for q_ahead in (None, False, True):     # None: V4.1's main-cache default (WS3_MAIN_TUNED) is on
        W3.launch_sparse_decode_gluon_ws3(out, lse, kw["q"], kw["k_cache"], kw["indices"], sched, ns, 0.1, "v41",
                                          kw["attn_sink"], topk_length=kw["topk_length"], q_ahead=q_ahead)
    assert [c["Q_AHEAD"] for c in calls] == [W3.WS3_MAIN_TUNED["v41"]["q_ahead"], False, True]
    assert set(calls[0]) - {"num_warps", "maxnreg"} == set(W3._CONSTEXPRS)


# ------------------------------------------------------------------ GPU tier
def _direct(kw, fmt, **knobs):
    """One direct WS3 launch on the public op's schedule into NaN-poisoned outputs; (out, lse)."""
    from deepkernels.mla.metadata import compute_schedule
    q, cache, ind = kw["q"], kw["k_cache"], kw["indices"]
    b, s_q, h_q, _ = q.shape
    xc = kw.get("extra_k_cache")
    xind = kw.get("extra_indices_in_kvcache")
    xtopk = 0 if xind is None else xind.shape[2]
    cfg = sd.sparse_decode_config(h_q, fmt)
    parts = sd._num_sm_parts(q.device, s_q, h_q, cfg)
    sched, ns = compute_schedule(sd._token_counts(b, ind.shape[2], kw["topk_length"], xtopk,
                                                  kw.get("extra_topk_length"), xc is not None, q.device), parts)
    out = torch.full((b, s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((b, s_q, h_q), float("nan"), device="cuda")
    W3.launch_sparse_decode_gluon_ws3(out, lse, q, cache, ind, sched, ns, kw["softmax_scale"], fmt,
                                      kw.get("attn_sink"), xc, xind, None, kw["topk_length"],
                                      kw.get("extra_topk_length"), **knobs)
    torch.cuda.synchronize()
    return out, lse


def _same(a, b):
    (o0, l0), (o1, l1) = a, b
    assert torch.equal(o1, o0) and torch.equal(l1, l0), ((o1.float() - o0.float()).abs().max(), (l1 - l0).abs().max())


# (b, s_q, topk, s_k, page, with_len, sink, flags, n_sms): several requests per CTA (few SMs), split requests through
# the combine, zero lengths (requests without blocks between requests with blocks), page 53, all-invalid rows
_SHAPES = [(8, 2, 1024, 4096, 64, True, True, {}, None),
           (74, 3, 576, 650, 53, True, True, dict(nonpow2=True), None),
           (16, 1, 2048, 4096, 64, False, False, {}, 8),
           (6, 2, 256, 512, 64, True, True, dict(lengths=[0, 256, 0, 1, 0, 65]), 3),
           (74, 3, 576, 650, 53, True, True, dict(all_invalid=True), None),
           (40, 1, 512, 1024, 64, True, True, dict(zero_len=True), 4)]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("b,s_q,topk,s_k,page,with_len,sink,flags,n_sms", _SHAPES)
def test_gpu_q_ahead_bit_identical(b, s_q, topk, s_k, page, with_len, sink, flags, n_sms, fmt, poison, sms):
    """q_ahead=True against the dispatched build (launcher defaults): same Q bytes into the same tile, same consumer
    expressions, so out / lse are bit-identical (NaN in every unreferenced cache token, -1 / junk indices,
    NaN-poisoned outputs, zero lengths, all-invalid rows, several requests per CTA)."""
    if n_sms:
        sms(n_sms)
    kw = make_case(b, s_q, 128, fmt, topk, s_k, page, with_len=with_len, sink=sink, device="cuda", **flags)
    base = _direct(kw, fmt)
    new = _direct(kw, fmt, q_ahead=True)
    if flags.get("all_invalid"):
        assert (new[0] == 0).all() and torch.isposinf(new[1]).all()
    else:
        assert not torch.isnan(base[0]).any() and not torch.isnan(base[1]).any()
    _same(base, new)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_q_ahead_indices_minus_one_and_junk(fmt, poison, sms):
    """Every index -1, then every other index -1 / 1 << 30 (out of range), several requests per CTA: as the
    dispatched build."""
    sms(4)
    kw = make_case(12, 2, 128, fmt, 448, 512, 64, with_len=True, sink=True, device="cuda")
    ind = kw["indices"]
    kw["indices"] = torch.full_like(ind, -1)
    o1, l1 = _direct(kw, fmt, q_ahead=True)
    assert (o1 == 0).all() and torch.isposinf(l1).all()
    junk = ind.clone()
    junk[..., ::2] = torch.where(torch.arange(junk[..., ::2].numel(), device="cuda").view_as(junk[..., ::2]) % 3 == 0,
                                 -1, 1 << 30).to(junk.dtype)
    kw["indices"] = junk
    _same(_direct(kw, fmt), _direct(kw, fmt, q_ahead=True))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt,n_sms,page,lens", [("v41", "fp4", None, 53, True), ("v41", "fp4", 6, 53, True),
                                                      ("v41", "fp4", 6, 64, False), ("v41", "v41", 6, 53, True),
                                                      ("v32", "v32", 6, 53, True)])
def test_gpu_q_ahead_extra_bit_identical(fmt, xfmt, n_sms, page, lens, poison, sms):
    """The extra-cache entry with q_ahead against its dispatched build: bit-identical (lengths on both caches and
    sink, or neither -- the bench's specialisation --, page 53 / 64 main, 64 extra, NaN in unreferenced tokens of both
    caches, junk indices, several requests per CTA)."""
    if n_sms:
        sms(n_sms)
    kw = make_case(16, 2, 128, fmt, 576, 1024, page, xfmt=xfmt, xtopk=192, xs_k=512, xpage=64, with_len=lens,
                   with_xlen=lens, sink=lens, device="cuda")
    base = _direct(kw, fmt)
    assert not torch.isnan(base[0]).any() and not torch.isnan(base[1]).any()
    _same(base, _direct(kw, fmt, q_ahead=True))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_q_ahead_public_op(fmt, poison, monkeypatch):
    """Through the public op (FlashMLA tolerances against the reference, its own NaN-poisoned outputs) with the
    option made the default for the format (WS3 forced)."""
    monkeypatch.setattr(W3, "WS3_Q_AHEAD", frozenset({fmt}))
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS3", "1")
    kw = make_case(74, 3, 128, fmt, 576, 1024, 64, with_len=True, sink=True, device="cuda")
    run_and_check(kw)


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [dict(deq_asm=True, producer_regs=144), dict(q_async=True),
                                   dict(q_ahead=True, deq_asm=True, producer_regs=144)], ids=["d144", "qa", "qhd"])
def test_gpu_bench_variants_v41_bit_identical(knobs, poison, sms):
    """The bench's other V4.1 variants, in its specialisation (page 64, no lengths, no sink): ``d144`` (the WS
    kernel's inline-PTX dequant at producer setmaxnreg 144: the same exact conversions, one multiply, one RNE
    rounding) and ``qa`` (session 18's Q by cp.async) give the dispatched build's out / lse bit for bit."""
    sms(8)
    kw = make_case(16, 1, 128, "v41", 2048, 4096, 64, device="cuda")
    _same(_direct(kw, "v41"), _direct(kw, "v41", **knobs))


_PRE_S20 = dict(q_ahead=False, deq_asm=False, producer_regs=120)     # V4.1's main-cache build before session 20


def test_v41_main_tuned_reaches_the_launcher(monkeypatch):
    """Without an extra cache V4.1 launches with WS3_MAIN_TUNED's knobs (Q ahead, asm dequant, producer 144) unless
    the caller sets them; V3.2 keeps the tables."""
    assert W3.WS3_MAIN_TUNED == {"v41": dict(q_ahead=True, deq_asm=True, producer_regs=144)}
    calls = []

    class Stub:
        def __init__(self, meta):
            calls.append(meta)

        def __call__(self, *a):
            pass

    monkeypatch.setattr(W3, "_ClusterLauncher", Stub)
    monkeypatch.setattr(W3, "combine_splits_", lambda *a, **k: None, raising=False)
    import deepkernels.mla.combine as C
    monkeypatch.setattr(C, "combine_splits_", lambda *a, **k: None)
    W3._LAUNCHERS.clear()
    for fmt in ("v41", "v32"):
        kw = make_case(2, 1, 128, fmt, 128, 256, 64, device="cpu")
        sched = torch.zeros(4, 8, dtype=torch.int32)
        ns = torch.zeros(3, dtype=torch.int32)
        out = torch.empty(2, 1, 128, 512, dtype=torch.bfloat16)
        lse = torch.empty(2, 1, 128)
        for knobs in ({}, _PRE_S20):
            W3.launch_sparse_decode_gluon_ws3(out, lse, kw["q"], kw["k_cache"], kw["indices"], sched, ns, 0.1, fmt,
                                              **knobs)
    got = [(c["Q_AHEAD"], c["DEQ_ASM"], c["PRODUCER_REGS"]) for c in calls]
    assert got == [(True, True, 144), (False, False, 120),
                   (False, "v32" in W3.WS3_DEQ_ASM, W3.WS3_PRODUCER_REGS["v32"]), (False, False, 120)], got


@pytest.mark.gpu
@pytest.mark.parametrize("b,s_q,topk,s_k,page,with_len,sink,flags,n_sms", _SHAPES)
def test_gpu_v41_main_tuned_bit_identical(b, s_q, topk, s_k, page, with_len, sink, flags, n_sms, poison, sms):
    """The dispatched V4.1 main-cache build (WS3_MAIN_TUNED) against the build before session 20: bit-identical."""
    if n_sms:
        sms(n_sms)
    kw = make_case(b, s_q, 128, "v41", topk, s_k, page, with_len=with_len, sink=sink, device="cuda", **flags)
    _same(_direct(kw, "v41", **_PRE_S20), _direct(kw, "v41"))


@pytest.mark.gpu
def test_gpu_q_ahead_smoke(poison):
    """One small V4.1 call per build with several requests per CTA (the device script runs this first, alone, under
    a short cap: a hang here costs seconds, not the run)."""
    from deepkernels.mla import decode as dec
    dec.set_mla_num_sms(4)
    try:
        kw = make_case(6, 1, 128, "v41", 256, 512, 64, device="cuda")
        _same(_direct(kw, "v41"), _direct(kw, "v41", q_ahead=True))
    finally:
        dec.set_mla_num_sms(None)


def test_bench_s20_cases_on_cpu():
    """benchmarks/sparse_decode_s20.py (CPU): its case table, variants and case builder (b 1, so the caches stay
    small), and its no-CUDA path."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    try:
        import sparse_decode_s20 as S
    finally:
        sys.path.pop(0)
    assert len(S.CASES) == 9 and {(c[2], c[3]) for c in S.CASES} == {(64, 1), (128, 1), (128, 2)}
    assert {(c[0], c[1]) for c in S.CASES} == {("v32", None), ("v41", None), ("v41", "fp4")}
    assert S.variants("v41", None) == dict(base={}, aa={}, qh=dict(q_ahead=True), qa=dict(q_async=True),
                                           d144=dict(deq_asm=True, producer_regs=144),
                                           qhd=dict(q_ahead=True, deq_asm=True, producer_regs=144))
    assert set(S.variants("v32", None)) == set(S.variants("v41", "fp4")) == {"base", "aa", "qh"}
    for fmt, xfmt in (("v41", None), ("v32", None), ("v41", "fp4")):
        c = S.build_case(fmt, xfmt, 1, 1, device="cpu")
        d_qk = 576 if fmt == "v32" else 512
        assert c.q.shape == (1, 1, 128, d_qk) and c.ind.shape == (1, 1, 2048)
        assert c.flop == 2 * 128 * (2048 + (512 if xfmt else 0)) * (d_qk + 512)
        assert (c.xcache is None) == (xfmt is None) and c.sched.shape[0] == c.parts
    if not torch.cuda.is_available():
        assert S.main(["/dev/null", "--quick"]) == 0
