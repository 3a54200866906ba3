"""Sparse prefill session 20: the WS4 "pair" kernel (deepkernels.mla._gluon_sparse_prefill_ws4, opt-in, not dispatched)
with WS2's dispatched prologue / epilogue (``q_async``, ``o_stage``) and the producer's indices one pair ahead
(``idx_ahead``), all opt-in switches, default off.

* compile tier (sm90 cross-compile + the Triton wheel's ptxas): plumbing (keyword-only bools, default off, the launch
  meta with the switches off equal to the build before them, ``idx_ahead`` needs ``gather_rows4``); per build 0 spill
  bytes, the two math loops unchanged in size against the ``gather_rows4`` build with 0 spill instructions, shared
  memory unchanged; ``q_async``: +36 / +32 16-byte Q cp.async, one commit / wait; ``o_stage``: 32 ``STG.E.128`` and
  only the 4 lse / max_logits 4-byte stores per thread left; ``idx_ahead``: the producer loop's index loads 8 per pair
  (2 blocks x 4 rows per thread, the next pair's) instead of one set per half gather, all before the first ``fre``
  wait;
* GPU tier (``-m gpu``): bit identity (out / lse / max_logits, NaN-poisoned outputs) of each switch set against the
  ``gather_rows4`` WS4 build (the same bytes in the same tiles, the same math order), on the WS4 tests' inputs (junk
  indices -2^31 .. 2^31-1 and >= s_kv, NaN in every KV row no valid in-length index references, topk_length incl. 0,
  sinks incl. +-inf, d_qk 576 / 512, h_q 64 / 128, odd block counts, all-invalid rows, topk 0 / 16); the
  ``q_async`` guard (head stride 584 -> plain loads, same result); and FlashMLA's prefill tolerances against the
  reference for the full switch set (``test_gpu_s20_tolerance``: the device script runs them after, not as a gate:
  WS4's bf16 P0 rescale once missed the absolute tolerance at 2 of 1M elements in session 18).
"""
from __future__ import annotations

import functools
import inspect
import re

import pytest
import torch

from deepkernels.mla import _gluon_sparse_prefill_ws4 as P
from deepkernels.reference.mla_prefill import sparse_prefill_ref
from deepkernels.testing.compile import n_hgmma, n_spill, ptxas_sm90_or_skip, sass_loops
from deepkernels.testing.numerics import check_is_allclose

from test_mla_prefill import make_case

pytestmark = pytest.mark.skipif(not P.available(), reason=f"Gluon not importable: {P._IMPORT_ERROR!r}")

# switch sets (launcher / compile keywords); every one with the 4-rows gather (WS4's session-18 r4 build = BASE)
BASE = dict(gather_rows4=True)
QO = dict(gather_rows4=True, q_async=True, o_stage=True)
QOI = dict(gather_rows4=True, q_async=True, o_stage=True, idx_ahead=True)
SETS = {"qo": QO, "qoi": QOI, "i": dict(gather_rows4=True, idx_ahead=True)}
_Q_CPASYNC = re.compile(r"cp\.async\.cg\.shared\.global \[ %r\d+ \+ 0 \], \[ %rd\d+ \+ 0 \], 0x10, 0x10;")


# ------------------------------------------------------------------ compile tier
@functools.lru_cache(maxsize=None)
def _compiled(d_pe, has_len, has_sink, name):
    kw = BASE if name == "base" else SETS[name]
    k = P.compile_sm90_ws4(d_pe, has_len, has_sink, **kw)
    return k.asm["ptx"], k.metadata.shared


def _loops(ptx, d_pe):
    """(report, [WG0 loop, WG1 loop] sorted by size, producer loop)."""
    rep = ptxas_sm90_or_skip(ptx, sass=True, cached=True)
    loops = sass_loops(rep.sass)
    k_steps = (512 + d_pe) // 16
    math = sorted((lp for lp in loops if n_hgmma(lp) == k_steps + 8), key=len)
    prod = [lp for lp in loops if not n_hgmma(lp) and any("LDGSTS" in t for t in lp)]
    assert len(math) == 2 and len(prod) == 1, ([n_hgmma(lp) for lp in loops], len(prod))
    return rep, math, prod[0]


@pytest.mark.compile
def test_s20_plumbing(monkeypatch):
    for fn in (P.launch_sparse_prefill_gluon_ws4, P.compile_sm90_ws4):
        sig = inspect.signature(fn).parameters
        for k in ("q_async", "o_stage", "idx_ahead"):
            assert sig[k].default is False
    sig = inspect.signature(P.launch_sparse_prefill_gluon_ws4).parameters
    assert all(sig[k].kind == inspect.Parameter.KEYWORD_ONLY for k in ("q_async", "o_stage", "idx_ahead"))
    assert P._CONSTEXPRS[-3:] == ("Q_ASYNC", "O_STAGE", "IDX_AHEAD")
    assert tuple(P._sparse_prefill_gluon_ws4_kernel.arg_names[-3:]) == P._CONSTEXPRS[-3:]
    ksig = inspect.signature(P._sparse_prefill_gluon_ws4_kernel.fn).parameters
    assert all(ksig[k].default is False for k in P._CONSTEXPRS[-3:])
    assert P.DISPATCH is False
    seen = []

    def fake_cached(cache, fn, key, meta, limit):
        rec = {"key": key, "meta": meta()}
        seen.append(rec)
        return lambda grid, *args: None
    monkeypatch.setattr(P, "cached_launcher", fake_cached)
    s_q, h_q = 3, 128
    q = torch.zeros(s_q, h_q, 576, dtype=torch.bfloat16)
    kv = torch.zeros(100, 1, 576, dtype=torch.bfloat16)
    ind = torch.zeros(s_q, 1, 192, dtype=torch.int32)
    out = torch.empty(s_q, h_q, 512, dtype=torch.bfloat16)
    ml, lse = torch.empty(s_q, h_q), torch.empty(s_q, h_q)
    P.launch_sparse_prefill_gluon_ws4(out, ml, lse, q, kv, ind, 0.25, gather_rows4=True)
    assert not any(k in seen[-1]["meta"] for k in ("Q_ASYNC", "O_STAGE", "IDX_AHEAD"))   # the build before them
    P.launch_sparse_prefill_gluon_ws4(out, ml, lse, q, kv, ind, 0.25, **QOI)
    m = seen[-1]["meta"]
    assert m["Q_ASYNC"] is True and m["O_STAGE"] is True and m["IDX_AHEAD"] is True and m["ROWS4"] is True
    # a q whose head stride (584 elements) gives no 16-element divisibility: the plain Q loads (WS2's guard)
    q584 = torch.zeros(s_q, h_q, 584, dtype=torch.bfloat16)[:, :, :576]
    P.launch_sparse_prefill_gluon_ws4(out, ml, lse, q584, kv, ind, 0.25, **QO)
    assert seen[-1]["meta"]["Q_ASYNC"] is False and seen[-1]["meta"]["O_STAGE"] is True
    assert len({x["key"] for x in seen}) == 3
    for bad in (dict(idx_ahead=True), dict(idx_ahead=True, gather_rows4=True, whole_slot=True),
                dict(q_async=1), dict(o_stage=None), dict(idx_ahead="1", gather_rows4=True)):
        with pytest.raises(ValueError):
            P.launch_sparse_prefill_gluon_ws4(out, ml, lse, q, kv, ind, 0.25, **bad)


@pytest.mark.compile
@pytest.mark.parametrize("name", ["qo", "qoi"])
@pytest.mark.parametrize("d_pe,has_len,has_sink", [(64, False, False), (64, True, True), (0, True, False)])
def test_compile_s20(d_pe, has_len, has_sink, name):
    ptx0, sh0 = _compiled(d_pe, has_len, has_sink, "base")
    ptx1, sh1 = _compiled(d_pe, has_len, has_sink, name)
    assert sh1 == sh0, (sh1, sh0)
    for pat in ("wgmma.mma_async", "mbarrier.init.shared", "mbarrier.try_wait.parity", "cp.async.mbarrier.arrive",
                "setmaxnreg"):
        assert ptx1.count(pat) == ptx0.count(pat), pat
    n_q = (512 + d_pe) // 64 * 4            # q_async: 16-byte Q copies per thread
    assert len(_Q_CPASYNC.findall(ptx0)) == 0 and len(_Q_CPASYNC.findall(ptx1)) == n_q
    assert ptx1.count("cp.async.commit_group") == 1 and ptx1.count("cp.async.wait_group") == 1
    rep0, math0, prod0 = _loops(ptx0, d_pe)
    rep1, math1, prod1 = _loops(ptx1, d_pe)
    assert rep1.spills == (0, 0), rep1.log
    for a, b in zip(math0, math1):          # the math loops: same size (+-12 instructions of scheduling), no spills
        assert abs(len(b) - len(a)) <= 12 and n_spill(b) == 0, (len(a), len(b))
    assert n_spill(prod1) == 0
    # o_stage: each thread's 64 4-byte output stores -> 16 16-byte stores per warpgroup, only lse / max_logits 4-byte
    stg = [t for t in rep1.sass.splitlines() if re.search(r"\bSTG\.E", t)]
    assert sum("STG.E.128" in t for t in stg) == 32, len(stg)
    assert sum(bool(re.search(r"STG\.E\s", t)) for t in stg) <= 4
    ldg = lambda lp: sum(1 for t in lp if re.search(r"\bLDG\.E", t))   # noqa: E731
    if name == "qoi":
        # the producer's index loads: 2 blocks x 4 rows per thread per pair, all issued (for the NEXT pair) before
        # the pair's first fre wait, none between a fre wait and its first LDGSTS
        assert ldg(prod1) == 8, ldg(prod1)
        assert ldg(prod0) == (24 if d_pe else 16), ldg(prod0)
        assert len(prod1) < len(prod0)
        waits = [i for i, t in enumerate(prod1) if "SYNCS.PHASECHK" in t and "TRYWAIT" in t]
        assert len(waits) == 4
        assert max(i for i, t in enumerate(prod1) if re.search(r"\bLDG\.E", t)) < waits[0]
        for w in waits:
            first = next(i for i in range(w, len(prod1)) if "LDGSTS" in prod1[i])
            assert not any(re.search(r"\bLDG\.E", t) for t in prod1[w:first])
    else:
        assert ldg(prod1) == ldg(prod0)


# ------------------------------------------------------------------ GPU tier
def _launch(q, kv, ind, sk, tl, sm_scale=0.5, gate=True, **kw):
    s_q, h_q, _ = q.shape
    out = torch.full((s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device=q.device)
    ml = torch.full((s_q, h_q), float("nan"), device=q.device)
    lse = torch.full((s_q, h_q), float("nan"), device=q.device)
    assert P.supported_ws4(q, kv) or not gate
    P.launch_sparse_prefill_gluon_ws4(out, ml, lse, q, kv, ind, sm_scale, sk, tl, **kw)
    return out, ml, lse


def _same(a, b):
    (o0, m0, l0), (o1, m1, l1) = a, b
    assert not torch.isnan(o0).any() and not torch.isnan(l0).any() and not torch.isnan(m0).any()
    assert torch.equal(o1, o0), (o1.float() - o0.float()).abs().max().item()
    assert torch.equal(m1, m0) and torch.equal(l1, l0)


@pytest.mark.gpu
def test_gpu_s20_smoke():
    """One small call with every switch (the device script runs it first, alone, under a hang guard): 3 blocks (one
    padded pair), sink, lengths, an all-invalid row."""
    q, kv, ind, sk, tl = make_case(5, 300, 192, h_q=128, sink=True, with_len=True, all_invalid=True, device="cuda")
    _same(_launch(q, kv, ind, sk, tl, **BASE), _launch(q, kv, ind, sk, tl, **QOI))


_CASES = [  # (s_q, s_kv, topk, h_q, d_qk, sink, with_len)
    (64, 4096, 2048, 128, 576, False, False),
    (37, 3000, 1000, 128, 576, True, True),      # odd block count (16), per-row lengths
    (29, 1592, 448, 64, 576, True, False),       # h_q 64, 7 blocks
    (16, 700, 576, 128, 512, True, True),        # d_qk 512
    (9, 5000, 1088, 128, 512, False, False),
    (6, 64, 16, 128, 576, True, False),          # one partial block, s_kv << topk
    (1024, 32, 2048, 128, 576, False, False),    # blocks with no valid index
]


@pytest.mark.gpu
@pytest.mark.parametrize("name,s_q,s_kv,topk,h_q,d_qk,sink,with_len",
                         [("qoi", ) + c for c in _CASES] + [("qo", ) + c for c in _CASES[:3]])
def test_gpu_s20_bit_identical(s_q, s_kv, topk, h_q, d_qk, sink, with_len, name):
    q, kv, ind, sk, tl = make_case(s_q, s_kv, topk, h_q=h_q, d_qk=d_qk, sink=sink, with_len=with_len,
                                   all_invalid=True, device="cuda")
    _same(_launch(q, kv, ind, sk, tl, **BASE), _launch(q, kv, ind, sk, tl, **SETS[name]))


@pytest.mark.gpu
@pytest.mark.parametrize("d_qk", [576, 512])
def test_gpu_s20_topk_length_zero_all_invalid_topk0(d_qk):
    q, kv, ind, sk, _ = make_case(7, 500, 256, h_q=128, d_qk=d_qk, sink=True, device="cuda")
    tl = torch.zeros(7, dtype=torch.int32, device="cuda")
    r = _launch(q, kv, ind, sk, tl, **QOI)
    _same(_launch(q, kv, ind, sk, tl, **BASE), r)
    assert (r[0] == 0).all() and (r[2] == float("inf")).all() and (r[1] == float("-inf")).all()
    bad = torch.where(torch.rand(ind.shape, device="cuda") < 0.5, -1, 500 + 7).to(torch.int32)
    r = _launch(q, kv, bad, sk, None, **QOI)
    assert (r[0] == 0).all() and (r[2] == float("inf")).all() and (r[1] == float("-inf")).all()
    q0, kv0, ind0, sk0, _ = make_case(3, 64, 0, h_q=128, d_qk=d_qk, sink=True, device="cuda")
    r = _launch(q0, kv0, ind0, sk0, None, **QOI)
    assert (r[0] == 0).all() and (r[2] == float("inf")).all()


@pytest.mark.gpu
def test_gpu_s20_q_stride_guard():
    """q with head stride 584 (16-byte rows, no 16-element divisibility; the public op's gate keeps such a q off the
    Gluon path, a direct launch must still be right): q_async falls back to the plain loads; results equal to the
    contiguous q's (WS2's test of its guard, tests/test_gluon_sparse_prefill_ws2.py)."""
    q, kv, ind, sk, tl = make_case(11, 900, 320, h_q=128, sink=True, with_len=True, device="cuda", noncontig=False)
    q584 = torch.zeros(11, 128, 584, dtype=torch.bfloat16, device="cuda")[:, :, :576]
    q584.copy_(q)
    assert not P.supported_ws4(q584, kv)
    _same(_launch(q, kv, ind, sk, tl, **BASE), _launch(q584, kv, ind, sk, tl, gate=False, **QOI))


@pytest.mark.gpu
@pytest.mark.parametrize("s_q,s_kv,topk,h_q,d_qk,sink,with_len", _CASES[:5])
def test_gpu_s20_tolerance(s_q, s_kv, topk, h_q, d_qk, sink, with_len):
    """The full switch set against the PyTorch reference with FlashMLA's prefill tolerances (WS4's tests'). Not a
    bench gate (module docstring)."""
    torch.manual_seed(20)
    q, kv, ind, sk, tl = make_case(s_q, s_kv, topk, h_q=h_q, d_qk=d_qk, sink=sink, with_len=with_len,
                                   all_invalid=True, device="cuda")
    out, ml, lse = _launch(q, kv, ind, sk, tl, **QOI)
    ro, rml, rlse = sparse_prefill_ref(q, kv, ind, 0.5, 512, sk, tl)
    assert check_is_allclose("out", out.float(), ro, abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose("lse", lse, rlse, abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert check_is_allclose("max_logits", ml, rml, abs_tol=1e-6, rel_tol=2.01 / 65536)
