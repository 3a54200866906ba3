"""Session 20 (second round): the WS3 sparse decode kernel's ``C1_SMEM`` entry (``_gluon_sparse_decode_ws3``,
module docstring "Chunk 1 staged"; run for the formats in ``WS3_C1_SMEM``, V4.1 main cache only, default none; the
default kernel's parameters and PTX untouched). Compile tier
(sm90 cross-compile at the dispatched V4.1 knobs: 0 spills in the softmax / PV / producer loops, chunk 1 by cp.async,
only chunk 0 + the index on the producer loop's register loads, no extra barrier, +8 KB shared), CPU plumbing, and
a GPU tier: bit identity against the dispatched build with NaN-poisoned outputs, NaN in unreferenced cache tokens,
-1 / junk indices, zero lengths, all-invalid rows, several requests per CTA (the shapes of
tests/test_mla_sparse_decode_ws3_s20.py)."""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import re

import pytest
import torch

from deepkernels.mla import _gluon_sparse_decode_ws3 as W3

import test_mla_sparse_kernels as _kernels
from test_mla_sparse_reference import make_case
from test_mla_sparse_decode_ws3_s20 import _SHAPES, _direct, _same
from deepkernels.testing.compile import n_spill, ws_loop_roles

pytestmark = pytest.mark.skipif(not W3.available(), reason=f"Gluon not importable: {W3._IMPORT_ERROR!r}")

poison, sms = _kernels.poison, _kernels.sms     # fixtures (NaN-poisoned public-op outputs; the scheduler's SM count)
TUNED = dict(W3.WS3_MAIN_TUNED["v41"])          # the dispatched V4.1 knobs (q_ahead, asm dequant, producer 144)
_CONFIGS = [(6, False, False), (6, True, True), (-1, True, False)]


@functools.lru_cache(maxsize=None)
def _build(page_shift, has_len, has_sink, c1):
    if c1:
        k = W3.compile_sm90_ws3_c1(page_shift, has_len, has_sink, **TUNED)
    else:
        k = W3.compile_sm90_ws3("v41", page_shift, has_len, has_sink, **TUNED)
    return k.asm["ptx"], int(k.metadata.shared)


@contextlib.contextmanager
def _c1_on():
    old = W3.WS3_C1_SMEM
    W3.WS3_C1_SMEM = frozenset({"v41"})
    try:
        yield
    finally:
        W3.WS3_C1_SMEM = old


def _direct_c1(kw):
    """:func:`_direct` with the chunk-1-staged entry (WS3_C1_SMEM = {"v41"} for the call)."""
    with _c1_on():
        return _direct(kw, "v41")


@functools.lru_cache(maxsize=None)
def _sass(ptx):
    from deepkernels.testing.compile import ptxas_sm90
    rep = ptxas_sm90(ptx, sass=True)
    if rep is None:
        pytest.skip("ptxas not available")
    return rep


def _ldg128(lp):
    return sum(bool(re.match(r"^(@!?P\w+\s+)?LDG\.E\.128", t)) for t in lp)


# ------------------------------------------------------------------ compile tier
@pytest.mark.compile
@pytest.mark.parametrize("page_shift,has_len,has_sink", _CONFIGS)
def test_compile_c1_smem(page_shift, has_len, has_sink):
    """C1_SMEM at the dispatched V4.1 knobs: 0 spill instructions in the softmax, PV and producer loops; the producer
    loop's 16-byte register gathers 8 -> 4 (chunk 0) and 4 LDGSTS + one cp.async group per block instead; no more
    barriers in the producer loop than the dispatched build's; consumer loops unchanged; +8 KB shared memory."""
    ptx, shared = _build(page_shift, has_len, has_sink, True)
    ptx0, shared0 = _build(page_shift, has_len, has_sink, False)
    assert shared0 + 64 * 32 * 4 <= shared <= shared0 + 64 * 32 * 4 + 64
    k = W3.compile_sm90_ws3_c1(page_shift, has_len, has_sink, **TUNED)
    offs = W3.smem_offsets(k.asm["ttgir"])
    assert offs["kv_n"] == 0 and offs["ready"] > offs["c1s"] and offs["empty"] > offs["c1s"]
    soft, pv, prod = ws_loop_roles(_sass(ptx).sass)
    soft0, pv0, prod0 = ws_loop_roles(_sass(ptx0).sass)
    assert len(soft) == len(pv) == len(prod) == 1
    assert n_spill(soft[0]) == 0 and n_spill(pv[0]) == 0 and n_spill(prod[0]) == 0
    assert _ldg128(prod0[0]) == 8 and _ldg128(prod[0]) == 4
    assert sum("LDGSTS" in t for t in prod[0]) == 4 and sum("LDGDEPBAR" in t for t in prod[0]) == 1
    assert sum("DEPBAR.LE SB0" in t for t in prod[0]) == 1
    assert sum("BAR.SYNC" in t for t in prod[0]) == sum("BAR.SYNC" in t for t in prod0[0])
    assert len(soft[0]) <= len(soft0[0]) + 4 and len(pv[0]) == len(pv0[0])
    assert len(prod[0]) < len(prod0[0]) + 40, (len(prod[0]), len(prod0[0]))   # 638 vs 614 at build time
    assert ptx.count("%tid.x") == 1
    assert not any("MEMBAR.ALL.GPU" in t for t in soft[0] + pv[0] + prod[0])


# clean-PTX sha256 (first 16 hex) of the dispatched V4.1 build at git 92039bb (before C1_SMEM), Triton 3.6.0
_BASE_PTX_SHA = {(6, False, False): "4afc3fcce5e7c591", (6, True, True): "fc129a5245c50d0c",
                 (-1, True, False): "a419e57ccb7f784a"}


@pytest.mark.compile
@pytest.mark.parametrize("page_shift,has_len,has_sink", _CONFIGS)
def test_compile_default_unchanged(page_shift, has_len, has_sink):
    """The dispatched V4.1 build's PTX (debug info stripped) is the one before the C1_SMEM entry existed (the main
    kernel's body moved into a helper both entries inline); no cp.async in its producer (2 commit groups: the softmax
    warpgroup's Q copies)."""
    import triton
    from deepkernels.testing.compile import clean_ptx
    if triton.__version__ != "3.6.0":
        pytest.skip(f"hashes taken with Triton 3.6.0, not {triton.__version__}")
    ptx0, _ = _build(page_shift, has_len, has_sink, False)
    assert hashlib.sha256(clean_ptx(ptx0).encode()).hexdigest()[:16] == _BASE_PTX_SHA[(page_shift, has_len, has_sink)]
    assert ptx0.count("cp.async.commit_group;") == 2


# ------------------------------------------------------------------ CPU: plumbing
def test_c1_smem_plumbing():
    """WS3_C1_SMEM empty (off); the C1 entry takes exactly the default kernel's parameters (the launcher's argument
    tail and _CONSTEXPRS serve both); no launcher keyword; V4.1 main cache only."""
    assert W3.WS3_C1_SMEM == frozenset()
    assert [p.name for p in W3._sparse_decode_gluon_ws3_c1_kernel.params] == \
        [p.name for p in W3._sparse_decode_gluon_ws3_kernel.params]
    assert "c1_smem" not in inspect.signature(W3.launch_sparse_decode_gluon_ws3).parameters
    assert not W3._c1_smem("v41") and not W3._c1_smem("v32")
    with _c1_on():
        assert W3._c1_smem("v41") and not W3._c1_smem("v32")
    assert W3._c1_smem("v41", True) and not W3._c1_smem("v41", False)
    with pytest.raises(ValueError):
        W3._c1_smem("v32", True)


def test_c1_smem_reaches_the_launcher(monkeypatch):
    """The launcher puts C1_SMEM into the main kernel's constexprs (False unless asked), with the tuned knobs."""
    import deepkernels.mla.combine as comb
    calls = []
    monkeypatch.setattr(W3._ClusterLauncher, "__call__",
                        lambda self, gx, args, s: calls.append((type(self).__name__, dict(self.meta))))
    monkeypatch.setattr(W3, "_LAUNCHERS", {})
    monkeypatch.setattr(comb, "combine_splits_", lambda *a, **k: None)
    kw = make_case(3, 1, 128, "v41", 100, 200, 64, with_len=True, sink=True)
    b, s_q, h_q = kw["q"].shape[:3]
    out, lse = torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16), torch.empty(b, s_q, h_q)
    sched, ns = torch.zeros(5, 8, dtype=torch.int32), torch.zeros(b + 1, dtype=torch.int32)
    for c1 in (False, True):
        with contextlib.nullcontext() if not c1 else _c1_on():
            W3.launch_sparse_decode_gluon_ws3(out, lse, kw["q"], kw["k_cache"], kw["indices"], sched, ns, 0.1,
                                              "v41", kw["attn_sink"], topk_length=kw["topk_length"])
    assert [c[0] for c in calls] == ["_ClusterLauncher", "_ClusterLauncherC1"]
    assert calls[0][1] == calls[1][1] and set(calls[0][1]) - {"num_warps", "maxnreg"} == set(W3._CONSTEXPRS)
    assert (calls[0][1]["Q_AHEAD"], calls[0][1]["DEQ_ASM"], calls[0][1]["PRODUCER_REGS"]) == (True, True, 144)
    assert len(W3._LAUNCHERS) == 2          # separate launcher keys
    kw32 = make_case(3, 1, 128, "v32", 100, 200, 64)
    old = W3.WS3_C1_SMEM
    W3.WS3_C1_SMEM = frozenset({"v32"})
    try:
        with pytest.raises(ValueError):
            W3.launch_sparse_decode_gluon_ws3(out, lse, kw32["q"], kw32["k_cache"], kw32["indices"], sched, ns, 0.1,
                                              "v32")
    finally:
        W3.WS3_C1_SMEM = old


# ------------------------------------------------------------------ GPU tier
@pytest.mark.gpu
def test_gpu_c1_smoke(poison):
    """One small V4.1 call per build with several requests per CTA (the device script runs this first, alone, under
    a short cap: a hang here costs seconds, not the run)."""
    from deepkernels.mla import decode as dec
    dec.set_mla_num_sms(4)
    try:
        kw = make_case(6, 1, 128, "v41", 256, 512, 64, device="cuda")
        _same(_direct(kw, "v41"), _direct_c1(kw))
    finally:
        dec.set_mla_num_sms(None)


@pytest.mark.gpu
@pytest.mark.parametrize("b,s_q,topk,s_k,page,with_len,sink,flags,n_sms", _SHAPES)
def test_gpu_c1_bit_identical(b, s_q, topk, s_k, page, with_len, sink, flags, n_sms, poison, sms):
    """The C1 entry against the dispatched V4.1 build (launcher defaults): the same bytes into the same dequant, so
    out / lse are bit-identical (NaN in every unreferenced cache token, NaN-poisoned outputs, zero lengths, all-invalid
    rows, page 53, several requests per CTA, split requests through the combine)."""
    if n_sms:
        sms(n_sms)
    kw = make_case(b, s_q, 128, "v41", topk, s_k, page, with_len=with_len, sink=sink, device="cuda", **flags)
    base = _direct(kw, "v41")
    new = _direct_c1(kw)
    if flags.get("all_invalid"):
        assert (new[0] == 0).all() and torch.isposinf(new[1]).all()
    else:
        assert not torch.isnan(base[0]).any() and not torch.isnan(base[1]).any()
    _same(base, new)


@pytest.mark.gpu
def test_gpu_c1_indices_minus_one_and_junk(poison, sms):
    """Every index -1, then every other index -1 / 1 << 30 (out of range), several requests per CTA: as the
    dispatched build (invalid tokens are zero-filled by the cp.async's src-size 0)."""
    sms(4)
    kw = make_case(12, 2, 128, "v41", 448, 512, 64, with_len=True, sink=True, device="cuda")
    ind = kw["indices"]
    kw["indices"] = torch.full_like(ind, -1)
    o1, l1 = _direct_c1(kw)
    assert (o1 == 0).all() and torch.isposinf(l1).all()
    junk = ind.clone()
    junk[..., ::2] = torch.where(torch.arange(junk[..., ::2].numel(), device="cuda").view_as(junk[..., ::2]) % 3 == 0,
                                 -1, 1 << 30).to(junk.dtype)
    kw["indices"] = junk
    _same(_direct(kw, "v41"), _direct_c1(kw))


@pytest.mark.gpu
def test_gpu_c1_bench_specialisation(poison, sms):
    """The bench's specialisation (page 64, no lengths, no sink, topk 2048, 8 SMs: ~16 requests per CTA)."""
    sms(8)
    kw = make_case(16, 1, 128, "v41", 2048, 4096, 64, device="cuda")
    _same(_direct(kw, "v41"), _direct_c1(kw))


def test_bench_c1_cases_on_cpu():
    """benchmarks/sparse_decode_c1.py (CPU): its case table and variants, and its no-CUDA path."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    try:
        import sparse_decode_c1 as S
    finally:
        sys.path.pop(0)
    assert S.CASES == (("v41", None, 64, 1), ("v41", None, 128, 1), ("v41", None, 128, 2))
    assert S.VARIANTS == dict(base=False, aa=False, c1=True)
    if not torch.cuda.is_available():
        assert S.main(["/dev/null", "--quick"]) == 0
