"""EPI options of the Gluon dense MLA decode (session 21; launcher keywords ``epi_nsp`` / ``epi_early`` /
``epi_sis``, constexprs EPI_NSP / EPI_EARLY / EPI_SIS, off by default, not dispatched; module docstring "EPI",
notes ``benchmarks/notes/mla_decode_timeline.md`` "EPI"): cheaper per-piece epilogue with the same math.

Compile tier (CPU): option-off PTX is pinned by tests/test_mla_decode_timeline.py (14 hashes); here every knob
(and the combinations the bench runs) compiles on the dispatched PVR builds (causal and not) and the plain build
within shared memory, 168 registers, no serialised wgmma, the same wgmma counts, and the PV / producer tile loops of
the PVR builds spill-free with EPI_NSP / EPI_EARLY. Launch arguments (kernel stubbed, CPU). GPU tier: each knob's
out / lse / accumulators bit-identical to the dispatched build on NaN-poisoned outputs (h_q 128 s_q 1, s_q 2 causal,
h_q 16; cases with split and non-split pieces, a zero-length request).
"""
from __future__ import annotations

import functools
import os
import re
import sys

import pytest
import torch

from deepkernels.mla import _gluon_dense_decode as G
from deepkernels.testing.compile import SM90_SMEM_LIMIT, n_hgmma, n_spill, ptxas_sm90_or_skip, sass_count, sass_loops

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import mla_decode_timeline as TLB  # noqa: E402

needs_gluon = pytest.mark.skipif(not G.available(), reason=f"gluon not importable: {G._IMPORT_ERROR!r}")
_ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
needs_sm90 = pytest.mark.skipif(not (_ON_GPU and G.available() and torch.cuda.get_device_capability()[0] == 9),
                                reason="needs an sm90 GPU and Gluon")

# knob sets: name -> launcher keywords (the bench's variants)
KNOBS = {"a": dict(epi_nsp=True), "b": dict(epi_early=True), "ab": dict(epi_nsp=True, epi_early=True),
         "sis": dict(epi_sis=True), "abs": dict(epi_nsp=True, epi_early=True, epi_sis=True)}
# (half, q_tma, trim, pvr, causal): the dispatched builds at h_q 128 s_q 1 / 2 and the plain build (h_q 16)
_BUILDS = [(False, True, True, True, False), (False, True, True, True, True), (False, False, False, False, False)]


# ------------------------------------------------------------------ compile tier
@functools.lru_cache(maxsize=None)
def _build(cfg, knob):
    half, qt, trim, pvr, causal = cfg
    c = G._compile_sm90(None, causal, "bf16", half, qt, trim, pvr=pvr, **(KNOBS[knob] if knob else {}))
    rep = ptxas_sm90_or_skip(c.asm["ptx"], sass=True, cached=True, reason="no bundled ptxas/nvdisasm")
    loops = sass_loops(rep.sass)
    prof = sorted((n_hgmma(lp), sass_count(lp, r"UTMALDG"), n_spill(lp)) for lp in loops
                  if n_hgmma(lp) or sass_count(lp, r"UTMALDG") or n_spill(lp))
    return c.asm["ptx"], c.metadata.shared, rep, prof


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("cfg", _BUILDS, ids=lambda c: "h%dq%dt%dp%dc%d" % tuple(map(int, c)))
@pytest.mark.parametrize("knob", list(KNOBS))
def test_epi_builds(cfg, knob):
    ptx0, sh0, rep0, prof0 = _build(cfg, None)
    ptx, sh, rep, prof = _build(cfg, knob)
    assert ptx != ptx0 or (knob == "sis" and not cfg[3])     # EPI_SIS: no effect without PVR
    assert sh == sh0 <= SM90_SMEM_LIMIT
    for pat in ("wgmma.mma_async.sync.aligned.m64n64k16", "wgmma.mma_async.sync.aligned.m64n256k16",
                "mbarrier.init.shared"):
        assert ptx.count(pat) == ptx0.count(pat), pat
    assert "C7514" not in rep.log, "ptxas serialised the wgmmas"
    assert re.search(r"Used 168 registers", rep.log), rep.log
    print(f"{cfg} {knob}: spill bytes {rep0.spill_bytes} -> {rep.spill_bytes}; loops {prof0} -> {prof}")
    if cfg[3] and knob in ("a", "b", "ab"):
        # measured (Triton 3.6.0): the PVR builds keep their spill bytes and spill-free tile loops
        assert rep.spill_bytes <= rep0.spill_bytes and prof == prof0, (rep0.spill_bytes, rep.spill_bytes, prof0, prof)


@needs_gluon
def test_epi_launch_arguments(monkeypatch):
    """The EPI keywords go by position between tl_ptr and TIMELINE (defaults: False, the dispatched launch unchanged); a plain
    build with one of them on launches through the variant path with every other option off."""
    from test_mla_decode_gluon_ring import launch_case as case, stub_launches
    fn = stub_launches(monkeypatch)
    names = [p.name for p in fn.params]
    i = names.index("tl_ptr")
    assert names[i + 1: i + 5] == ["EPI_NSP", "EPI_EARLY", "EPI_SIS", "TIMELINE"] and names[-1] == "PRODUCER_REGS"
    assert G._CONSTEXPRS_EPI == ("EPI_NSP", "EPI_EARLY", "EPI_SIS")
    G.gluon_dense_launch(*case())
    x = fn.full_args(fn.log[-1])
    assert not any(x[names.index(n)] for n in ("EPI_NSP", "EPI_EARLY", "EPI_SIS"))
    for knob, kw in KNOBS.items():
        G.gluon_dense_launch(*case(), **kw)
        x = fn.full_args(fn.log[-1])
        assert len(x) == len(fn.params)
        assert [x[names.index(n)] for n in ("EPI_NSP", "EPI_EARLY", "EPI_SIS")] == \
            [kw.get("epi_nsp", False), kw.get("epi_early", False), kw.get("epi_sis", False)], knob
        assert x[names.index("PVR")] is G.DISPATCH_PVR
    G.gluon_dense_launch(*case(h_q=16), epi_early=True)                       # plain build + a knob
    x = fn.full_args(fn.log[-1])
    assert x[names.index("EPI_EARLY")] is True
    assert not any(x[names.index(n)] for n in ("PVR", "HALF", "QTMA", "TRIM", "EPI_NSP", "EPI_SIS"))


# ------------------------------------------------------------------ gpu tier
# (h_q, s_q, b, mean s_k, parts or None = the public op's schedule, zero-length request); the first three have
# split and non-split requests in the public op's schedule, the 4th mostly whole requests, the last only split ones
GPU_CASES = [(128, 1, 32, 1500, None, True), (128, 2, 32, 1500, None, False), (16, 1, 48, 3000, None, True),
             (128, 1, 80, 300, 4, False), (128, 1, 8, 5000, None, False)]


@functools.lru_cache(maxsize=None)
def _gpu_case(h_q, s_q, b, s_k, parts, zero):
    import deepkernels.mla.decode as dec
    from deepkernels.mla.metadata import compute_schedule
    q, k, bt, sl, _ = TLB.make_case(b, s_q, h_q, s_k, seed=7 * h_q + s_q + b)
    if zero:
        sl[1] = 0           # a zero-length request (out 0, lse +inf) and a one-token one
        sl[2] = 1
    if parts is None:
        parts = dec._num_sm_parts(q.device, s_q * h_q, 1)
    sched, ns = compute_schedule(sl, parts)
    return q, k, bt, sl, sched, ns, parts


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("knob", list(KNOBS))
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda v: "h%d_sq%d_b%d_sk%d_p%s_z%d" % v)
def test_gpu_epi_bitid(case, knob):
    q, k, bt, sl, sched, ns, parts = _gpu_case(*case)
    s_q = q.shape[1]
    causal = s_q > 1
    nsp = (ns[1:] - ns[:-1]).cpu()
    # split and non-split pieces: 80 short requests over 4 parts are mostly whole, 8 long ones over ~66 parts all split
    scale = 576 ** -0.5
    o0 = TLB.alloc_outs(q, parts, poison=True)
    o1 = TLB.alloc_outs(q, parts, poison=True)
    G.gluon_dense_launch(q, k, bt, sl, sched, ns, scale, causal, *o0)
    G.gluon_dense_launch(q, k, bt, sl, sched, ns, scale, causal, *o1, **KNOBS[knob])
    torch.cuda.synchronize()
    for name, a, c in zip(("out", "lse", "o_acc", "l_acc"), o0, o1):
        assert torch.equal(a.isnan(), c.isnan()), name               # same elements written
        assert torch.equal(a.nan_to_num(1234.5), c.nan_to_num(1234.5)), name
    single = (nsp <= 1).nonzero().flatten().tolist()                  # written directly (no combine)
    assert not o0[0][single].isnan().any() and not o0[1][single].isnan().any()
    if case[5] and int(nsp[1]) == 1:
        assert (o1[0][1] == 0).all() and torch.isinf(o1[1][1]).all()


@pytest.mark.gpu
@needs_sm90
def test_gpu_epi_timeline_stamps():
    """The instrumented build with all EPI options: bit-identical to the plain knob build, the finer epilogue stamps
    inside [tile loop done, piece end] (EPI_EARLY order: O stores before the pfree wait)."""
    q, k, bt, sl, sched, ns, parts = _gpu_case(*GPU_CASES[0])
    m_blocks = 2
    tl = torch.zeros(parts * m_blocks, G.TL_WORDS, dtype=torch.int64, device="cuda")
    o0 = TLB.alloc_outs(q, parts, poison=True)
    o1 = TLB.alloc_outs(q, parts, poison=True)
    kw = KNOBS["abs"]
    G.gluon_dense_launch(q, k, bt, sl, sched, ns, 576 ** -0.5, False, *o0, **kw)
    G.gluon_dense_launch(q, k, bt, sl, sched, ns, 576 ** -0.5, False, *o1, timeline=tl, **kw)
    torch.cuda.synchronize()
    for a, c in zip(o0, o1):
        assert torch.equal(a.nan_to_num(1234.5), c.nan_to_num(1234.5))
    hdr, pieces = TLB.decode(tl.cpu().numpy())
    assert pieces
    for pc in pieces:
        if hdr["npieces"][pc["cta"]] <= G.TL_MAX_PIECES:
            assert pc["le"] <= pc["os"] <= pc["pf"] <= pc["pe"], pc


def test_epi_bench_cli_cpu(tmp_path, capsys):
    """The bench's argument parsing, its no-CUDA path and its printers (what the device script calls)."""
    import mla_decode_epi as EB
    a = EB.parse_args([str(tmp_path / "x.json"), "--rounds", "3", "--only-shapes", "128:1:4096", "--variants", "a,ab"])
    assert a.rounds == 3 and a.variants == "a,ab" and set(EB.VARIANTS) == set(KNOBS)
    assert all(EB.VARIANTS[k] == KNOBS[k] for k in KNOBS)
    if not torch.cuda.is_available():
        assert EB.main(a) == 0
    s = TLB.summarize([TLB.analyse(TLB.synthetic(n_parts=6), 2)])
    EB._print_tl("ab", s)
    st = dict(ms=0.27, tflops=500.0, paired_time_ratio_median=0.98, paired_time_ratio_min=0.97,
              paired_time_ratio_max=0.99)
    EB._print_row(dict(h_q=128, s_q=1, s_k=4096, parts=66, split_requests=60, bit_identical={"a": True},
                       timing={"dispatched": st, "dispatched_again": st, "a": st}))
    EB._print_row(dict(h_q=128, s_q=1, s_k=4096, failed="x"))
    out = capsys.readouterr().out
    assert "TIMELINE ab" in out and "SUMMARY h_q=128" in out and "A/A 0.980" in out and "FAILED" in out
