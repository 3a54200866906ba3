"""TIMELINE instrumentation of the dispatched sparse MLA decode kernel at h_q 128 (the 2-CTA cluster kernel,
``_gluon_sparse_decode_ws3``; its TIMELINE entry ``_sparse_decode_gluon_ws3_tl_kernel`` behind the launcher keyword
``timeline=``, never dispatched; ``benchmarks/sparse_decode_timeline.py``, notes
``benchmarks/notes/sparse_decode_timeline.md``).

Compile tier (CPU): the dispatched entry's cleaned PTX is byte-identical to the pre-TIMELINE hashes for the dispatched
builds (V3.2, V4.1 with ``WS3_MAIN_TUNED``, with and without lengths + sink; the V4.1 + FP4 extra entry); the
TIMELINE build keeps every innermost loop's SASS instruction count and its 0 spill instructions, 168 registers.
CPU: launcher plumbing (stubbed launch), layout constants, the bench's analysis on a synthetic buffer. GPU tier: the
instrumented launch's out / lse are bit-identical to the plain launch's (NaN-poisoned outputs, NaN in unreferenced
cache tokens, -1 / out-of-range indices, zero lengths, several pieces per CTA, split pieces), and per CTA the stamps
are present and monotone in program order with the schedule's piece count, requests, cluster rank and grid position.
"""
from __future__ import annotations

import functools
import hashlib
import os
import sys
import types

import numpy as np
import pytest
import torch

from deepkernels.mla import _gluon_sparse_decode_ws2 as W2
from deepkernels.mla import _gluon_sparse_decode_ws3 as W3
from deepkernels.testing.compile import clean_ptx, n_spill, ptxas_sm90_or_skip, sass_loops

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import sparse_decode_timeline as TLB  # noqa: E402

needs_gluon = pytest.mark.skipif(not W3.available(), reason=f"gluon not importable: {W3._IMPORT_ERROR!r}")
_ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
needs_sm90 = pytest.mark.skipif(not (_ON_GPU and W3.available() and torch.cuda.get_device_capability()[0] == 9),
                                reason="needs an sm90 GPU and Gluon")
_TUNED41 = dict(q_ahead=True, deq_asm=True, producer_regs=144)   # WS3_MAIN_TUNED["v41"] when the hashes were taken

# sha256 of the cleaned PTX (deepkernels.testing.compile.clean_ptx) of the dispatched builds before TIMELINE existed
# (git 1dccdeb, Triton 3.6.0, sm_90a): (entry, fmt, page_shift, has_len, has_sink) -> hash. "main" =
# compile_sm90_ws3 with the launcher's dispatched knobs (V3.2: the module defaults; V4.1: WS3_MAIN_TUNED), "fp4" =
# compile_sm90_ws3_extra("v41", "fp4", ..., xpage_shift 6, has_xlen False).
_PTX_SHA = {
    ("main", "v32", 6, False, False): "d62a4a4cbadf03e1f91e781c1b8a9481988872949f599e3ee13c5b99ffa14105",
    ("main", "v32", 6, True, True): "82b038a466ed10ed0893c82fb006fae9b780a13cc1a4e64e4e427792e190d63a",
    ("main", "v41", 6, False, False): "4afc3fcce5e7c591b6ddbd9395204cc45acc42dafe0dfba7696e3dc9c48f1767",
    ("main", "v41", 6, True, True): "fc129a5245c50d0cb4862fb28e5fecfe90a277157c1ea82744a091f2f724f202",
    ("fp4", "v41", 6, False, False): "4df746a2ab5e6a597470cd9152b9e53a98ca245ef33f83cda964a6abc9071878",
}


def _knobs(fmt):
    return dict(_TUNED41) if fmt == "v41" else {}


# ------------------------------------------------------------------ compile tier
@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("key", list(_PTX_SHA), ids=lambda k: "-".join(map(str, k)))
def test_timeline_off_ptx_unchanged(key):
    import triton
    if triton.__version__ != "3.6.0":
        pytest.skip(f"hashes taken with Triton 3.6.0, not {triton.__version__}")
    entry, fmt, ps, has_len, has_sink = key
    assert W3.WS3_MAIN_TUNED["v41"] == _TUNED41, "V4.1's dispatched knobs changed: re-take the v41 hashes"
    if entry == "main":
        k = W3.compile_sm90_ws3(fmt, ps, has_len, has_sink, **_knobs(fmt))
    else:
        k = W3.compile_sm90_ws3_extra(fmt, "fp4", ps, has_len, has_sink, 6, False)
    assert hashlib.sha256(clean_ptx(k.asm["ptx"]).encode()).hexdigest() == _PTX_SHA[key]


@functools.lru_cache(maxsize=None)
def _build(fmt, timeline):
    fn = W3.compile_sm90_ws3_tl if timeline else W3.compile_sm90_ws3
    c = fn(fmt, 6, False, False, **_knobs(fmt))
    rep = ptxas_sm90_or_skip(c.asm["ptx"], sass=True, cached=True, reason="no bundled ptxas/nvdisasm")
    return c.asm["ptx"], int(c.metadata.shared), rep, sass_loops(rep.sass)


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("fmt", ["v32", "v41"])
def test_timeline_build_keeps_loops(fmt):
    """TIMELINE on: the same innermost loops of more than 10 instructions (instruction and spill counts equal, loop by
    loop), 0 spill instructions in the token loops, 168 registers, shared memory + <= 64 B, whole-kernel spill stores + <= 16 B; the stamps are
    there (red.global.max.u64 + %globaltimer) and no extra %tid.x read."""
    ptx0, sh0, rep0, loops0 = _build(fmt, False)
    ptx1, sh1, rep1, loops1 = _build(fmt, True)
    big = lambda loops: [(len(lp), n_spill(lp)) for lp in loops if len(lp) > 10]     # noqa: E731
    assert big(loops1) == big(loops0)      # (+ one 2-instruction mbarrier try-wait loop: the first-K stamp's wait)
    assert max(len(lp) for lp in loops1) > 500 and all(n_spill(lp) == 0 for lp in loops1 if len(lp) > 100)
    assert "Used 168 registers" in rep1.log and "Used 168 registers" in rep0.log
    assert sh0 <= sh1 <= sh0 + 64 and sh1 <= 232448
    assert rep1.spills[0] <= rep0.spills[0] + 16, (rep0.spills, rep1.spills)
    assert "red.global.max.u64" in ptx1 and "%globaltimer" in ptx1 and "%globaltimer" not in ptx0
    assert ptx1.count("%tid.x") == ptx0.count("%tid.x")


# ------------------------------------------------------------------ CPU
def test_layout_matches_bench():
    assert (W2.TL_HEADER, W2.TL_PIECE, W2.TL_MAX_PIECES) == (TLB.TL_HEADER, TLB.TL_PIECE, TLB.TL_MAX_PIECES)
    assert W2.TL_WORDS == TLB.TL_WORDS == 256 and W3.TL_WORDS == W2.TL_WORDS


def test_dispatched_entry_parameters_unchanged():
    """The TIMELINE entry = the dispatched entry's parameters + a trailing runtime ``tl_ptr``."""
    p0 = [p.name for p in W3._sparse_decode_gluon_ws3_kernel.params]
    p1 = [p.name for p in W3._sparse_decode_gluon_ws3_tl_kernel.params]
    assert p1 == p0 + ["tl_ptr"] and "tl_ptr" not in p0 and "TIMELINE" not in p0
    assert W3._ClusterLauncherTL({})._jit_kernel() is W3._sparse_decode_gluon_ws3_tl_kernel


def _cpu_call(monkeypatch, fmt="v41", timeline="auto", h_q=128, **kw):
    import deepkernels.mla.combine as comb
    calls = []

    def fake(self, gx, args, s, timeline=None):
        calls.append((type(self), dict(self.meta), gx, timeline))
    monkeypatch.setattr(W3._ClusterLauncher, "__call__", fake)
    monkeypatch.setattr(W3, "_LAUNCHERS", {})
    monkeypatch.setattr(comb, "combine_splits_", lambda *a, **k: None)
    b, s_q, parts = 3, 2, 5
    d = 576 if fmt == "v32" else 512
    bpt = 656 if fmt == "v32" else 528
    q = torch.zeros(b, s_q, h_q, d, dtype=torch.bfloat16)
    cache = torch.zeros(4, 64, 1, bpt, dtype=torch.float8_e4m3fn)
    ind = torch.zeros(b, s_q, 128, dtype=torch.int32)
    sched, ns = torch.zeros(parts, 8, dtype=torch.int32), torch.zeros(b + 1, dtype=torch.int32)
    out, lse = torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16), torch.empty(b, s_q, h_q)
    if timeline == "auto":
        timeline = torch.zeros(parts * s_q * (h_q // 64), W2.TL_WORDS, dtype=torch.int64)
    W3.launch_sparse_decode_gluon_ws3(out, lse, q, cache, ind, sched, ns, 0.1, fmt, timeline=timeline, **kw)
    return calls, timeline


@pytest.mark.parametrize("fmt", ["v32", "v41"])
def test_launcher_timeline_plumbing(monkeypatch, fmt):
    calls, tl = _cpu_call(monkeypatch, fmt)
    assert len(calls) == 1 and calls[0][0] is W3._ClusterLauncherTL and calls[0][3] is tl
    assert calls[0][2] == 5 * 2 * 2 // 2
    calls0, _ = _cpu_call(monkeypatch, fmt, timeline=None)
    assert calls0[0][0] is W3._ClusterLauncher and calls0[0][3] is None
    assert calls0[0][1] == calls[0][1]          # same constexprs (the dispatched knobs): only the entry differs


def test_launcher_timeline_rejects(monkeypatch):
    with pytest.raises(ValueError):
        _cpu_call(monkeypatch, timeline=torch.zeros(3, W2.TL_WORDS, dtype=torch.int64))        # wrong CTA count
    with pytest.raises(ValueError):
        _cpu_call(monkeypatch, timeline=torch.zeros(20, W2.TL_WORDS, dtype=torch.int32))       # wrong dtype
    with pytest.raises(ValueError):
        _cpu_call(monkeypatch, h_q=64, timeline=torch.zeros(10, W2.TL_WORDS, dtype=torch.int64))  # WS2 path
    with pytest.raises(ValueError):
        W3._compile_ws3("v41", 6, False, False, None, None, None, None, None, None, None, xfmt="fp4", timeline=True)


def test_cluster_launcher_passes_the_buffer_last(monkeypatch):
    """The TL launcher compiles once (the buffer as ``tl_ptr`` in warmup) and passes each call's buffer last."""
    runs, warm = [], []

    class Compiled:
        asm = {"ttgir": "t"}
        metadata = types.SimpleNamespace(num_warps=4, shared=1000)
        function = object()

        def run(self, *a):
            runs.append(a)

    class Jit:
        params = [types.SimpleNamespace(name=n, default=d) for n, d in
                  (("x", None), ("scale_log2", None), ("ring_off", None), ("ready_off", None), ("empty_off", None),
                   ("A", None), ("tl_ptr", None))]

        def warmup(self, *a, grid, **meta):
            warm.append((a, meta))
            return Compiled()

    monkeypatch.setattr(W3, "_sparse_decode_gluon_ws3_tl_kernel", Jit())
    monkeypatch.setattr(W3, "_offset_args", lambda t: (0, 1, 2))
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: types.SimpleNamespace(cuda_stream=7))
    la = W3._ClusterLauncherTL(dict(A=3, num_warps=4))
    la(4, ("px", ), 0.5, "buf1")
    la(4, ("py", ), 0.5, "buf2")
    assert len(warm) == 1 and warm[0][1]["tl_ptr"] == "buf1" and warm[0][1]["A"] == 3
    assert runs[0][9:] == ("px", 0.5, 0, 1, 2, 3, "buf1") and runs[1][9:] == ("py", 0.5, 0, 1, 2, 3, "buf2")


def test_analysis_synthetic():
    r = TLB.analyse(TLB.synthetic())
    s = TLB.summarize([r])
    assert r["ctas_recorded"] == r["ctas"] == 12 and not TLB.monotone_violations(TLB.synthetic())
    assert abs(s["per_block_us"] - 2.6) < 1e-6 and abs(s["fit_block_us"] - 2.6) < 1e-3
    assert abs(s["fit_piece_us"] - 3.6) < 1e-3                  # gap 0.1 + Q 0.2 + first K 0.3 + epilogue 3.0
    assert abs(s["one_fixed_us"] - 8.2) < 1e-6                  # 1 + 0.1 + 1.5 + 2.0 + 3.0 + 0.1 + 0.5
    assert abs(s["q_first_us"] - 1.5) < 1e-6 and abs(s["fk_first_us"] - 2.0) < 1e-6
    assert abs(s["end_barrier_us"] - 0.5) < 1e-6 and abs(s["start_barrier_us"] - 1.0) < 1e-6
    assert abs(s["ramp_us"] - 0.2) < 1e-6 and abs(s["sm_clock_mhz"] - 1800) < 1
    assert r["cluster_pairs_us"]["rank_ok"]
    bad = TLB.synthetic()
    bad[0, TLB.TL_HEADER + 1] = bad[0, TLB.TL_HEADER + 2] + 5   # Q stamp after the first-K stamp
    assert TLB.monotone_violations(bad)


def test_bench_cli_cpu(tmp_path):
    """The bench's CPU paths (argument parsing, no-CUDA exit) cannot die on a typo."""
    a = TLB.parse_args([str(tmp_path / "x.json"), "--reps", "2", "--only", "v41:128:2,v32:64:1"])
    assert TLB.parse_only(a.only) == {("v41", 128, 2), ("v32", 64, 1)} and a.reps == 2
    if not torch.cuda.is_available():
        assert TLB.main(a) == 0


# ------------------------------------------------------------------ GPU
def _case(kind, fmt):
    """(make_case kwargs, SM parts or None = the public op's): bench-like greedy row, multi-piece linear row with
    lengths / sink / junk indices, a 3-part schedule with zero-length requests (many pieces per CTA)."""
    from test_mla_sparse_reference import make_case
    if kind == "b64":
        return make_case(64, 1, 128, fmt, 2048, 4096, 64, device="cuda"), None, True
    if kind == "b24":
        kw = make_case(24, 2, 128, fmt, 512, 2048, 64, with_len=True, sink=True, device="cuda")
        ind = kw["indices"]
        ind[:, :, 3::7] = 1 << 30           # out of range: never dereferenced, K/V row zero
        return kw, None, False
    return make_case(6, 2, 128, fmt, 256, 512, 64, lengths=[0, 256, 0, 1, 0, 65], sink=True, device="cuda"), 3, False


def _schedule(kw, fmt, parts, greedy):
    import deepkernels.mla.sparse_decode as sd
    from deepkernels.mla.metadata import FIXED_OVERHEAD_BLOCKS, compute_schedule
    q, ind = kw["q"], kw["indices"]
    b, s_q, h_q, _ = q.shape
    if parts is None:
        parts = sd._num_sm_parts(q.device, s_q, h_q, sd.sparse_decode_config(h_q, fmt))
    alg = "greedy" if greedy and sd._use_greedy(b, parts) else "linear"
    counts = sd._token_counts(b, ind.shape[2], kw["topk_length"], 0, None, False, q.device)
    return compute_schedule(counts, parts, FIXED_OVERHEAD_BLOCKS, algorithm=alg)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("kind", ["b64", "b24", "p3"])
@pytest.mark.parametrize("fmt", ["v32", "v41"])
def test_gpu_timeline_bitid_and_monotone(fmt, kind):
    kw, parts, greedy = _case(kind, fmt)
    sched, ns = _schedule(kw, fmt, parts, greedy)
    q = kw["q"]
    b, s_q, h_q, _ = q.shape
    ctas = sched.shape[0] * s_q * (h_q // 64)
    outs = []
    tl = torch.zeros(ctas, W2.TL_WORDS, dtype=torch.int64, device="cuda")
    for timeline in (None, tl):
        out = torch.full((b, s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((b, s_q, h_q), float("nan"), device="cuda")
        W3.launch_sparse_decode_gluon_ws3(out, lse, q, kw["k_cache"], kw["indices"], sched, ns, kw["softmax_scale"],
                                          fmt, kw.get("attn_sink"), None, None, None, kw["topk_length"],
                                          timeline=timeline)
        outs.append((out, lse))
    torch.cuda.synchronize()
    (o0, l0), (o1, l1) = outs
    assert not torch.isnan(o0).any() and not torch.isnan(l0).any()
    assert torch.equal(o0, o1) and torch.equal(l0.nan_to_num(7.0), l1.nan_to_num(7.0))
    buf = tl.cpu().numpy()
    assert TLB.monotone_violations(buf) == []
    hdr, pieces = TLB.decode(buf)
    meta = sched.cpu().numpy()
    c = np.arange(ctas)
    part, si, hb = c // (2 * s_q), (c // 2) % s_q, c % 2
    begin = np.maximum(meta[part, 0], 0)
    end = np.minimum(meta[part, 1], b - 1)
    assert (hdr["npieces"] == end - begin + 1).all()
    assert (hdr["rank"] == hb).all() and (hdr["hb"] == hb).all() and (hdr["si"] == si).all()
    assert (hdr["smid"] >= 0).all() and (hdr["smid"] < torch.cuda.get_device_properties(0).multi_processor_count).all()
    nsplits = ns.cpu().numpy()
    for pc in pieces:
        assert pc["req"] == begin[pc["cta"]] + pc["p"]
        assert pc["nsp"] == nsplits[pc["req"] + 1] - nsplits[pc["req"]]
        assert pc["t_lo"] % 64 == 0 and 0 <= pc["t_end"] <= kw["indices"].shape[2]   # t_end < t_lo: an empty slice
    r = TLB.analyse(buf)
    assert r["ctas_recorded"] == ctas and r["makespan_us"] > 0
    assert r["cluster_pairs_us"]["rank_ok"]
