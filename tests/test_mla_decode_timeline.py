"""TIMELINE instrumentation of the Gluon dense MLA decode kernel (session 21; constexpr TIMELINE, launcher keyword
``timeline=``, never dispatched; ``benchmarks/mla_decode_timeline.py``, notes ``benchmarks/notes/mla_decode_timeline.md``).

Compile tier (CPU): with TIMELINE off the cleaned PTX of 14 builds (every (half, q_tma, trim, pvr) combination in
use, causal and not) is byte-identical to the pinned pre-TIMELINE hashes; with it on, the variant builds keep their
ptxas spill bytes and per-loop spill instructions, 168 registers and wgmma counts; the plain build's softmax / PV
tile loops stay spill-free (its producer loop gains at most one reload). Launch arguments (stubbed kernel, CPU) and
the bench's analysis on a synthetic buffer. GPU tier: the instrumented build's out / lse / accumulators are
bit-identical to the plain build's (NaN-poisoned first), and per CTA the stamps are present and monotone in program
order, with the schedule's piece count, requests, token ranges and split counts.
"""
from __future__ import annotations

import functools
import hashlib
import os
import re
import sys

import pytest
import torch

from deepkernels.mla import _gluon_dense_decode as G
from deepkernels.testing.compile import clean_ptx, n_hgmma, n_spill, ptxas_sm90_or_skip, sass_count, sass_loops

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import mla_decode_timeline as TLB  # noqa: E402

needs_gluon = pytest.mark.skipif(not G.available(), reason=f"gluon not importable: {G._IMPORT_ERROR!r}")
_ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
needs_sm90 = pytest.mark.skipif(not (_ON_GPU and G.available() and torch.cuda.get_device_capability()[0] == 9),
                                reason="needs an sm90 GPU and Gluon")

# sha256 of the cleaned PTX before TIMELINE existed (git 6c7af35, Triton 3.6.0, sm_90a, GLUON_DEFAULT, bf16), per
# (half, q_tma, trim, pvr, causal)
_PTX_SHA = {
    (False, False, False, False, False): "44b1660e2ae43c4303698804d0522b3ef40f376ae29d08837fbf7b77c0c5eef8",
    (False, False, False, False, True): "5a0c2050eef53d97202ee2ce9af456165c48d61c5d8c50990420d4ee3bfb7ce9",
    (False, True, True, True, False): "9ab3c05138a1295f2af90caa66dd7a5861d835708f03b01550b09d066ccc131d",
    (False, True, True, True, True): "cefe821c62c911a11828da273c9e0c2f7940580648edb38d6fb19f0abfcdc7c8",
    (False, True, True, False, False): "3e7f413ad6a39c2706789547244aefab20c8ecfa3265c151cc0ef072ae7a7132",
    (False, True, True, False, True): "d97216ded889d586ac34d592a32795995a7b10c7081ab57946371cba2ee37d86",
    (True, True, True, False, False): "02cac261d6c108ca11d9a33fee2d143f6ef5f2f80feff0aabbbb99139af88c19",
    (True, True, True, False, True): "f113e11ab7f833f9ba0b6836fd5dc127bd6a98d1237b5093a3d8697028b28b22",
    (False, False, True, False, False): "cb6c892bde963c9e482c5a39d5e05034de30f0307bdad49df137fa59ee4ad411",
    (False, False, True, False, True): "02af27ae8b533a6c1dc154946564c1973aabd85b155e748307a4ab69d04661af",
    (False, True, False, False, False): "c51fc182d4450179a51d5842bbc13b76a3a3f91b1a017be30fa7b69cfc839613",
    (False, True, False, False, True): "2be0c5b66144d244cb8c4d24407f2f9496ee3d95b680016bc08865ab6057dcb1",
    (True, True, False, False, False): "e3aa1f8b6e197b87863bd4c846abcada13ca64a86b26d67ee1000d2d59abb412",
    (True, True, False, False, True): "bee9858e6845ed9b9cfb4216741c7b41ce99b29b150e5587d72ccf8ecd668d87",
}


# ------------------------------------------------------------------ compile tier
@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("half,qt,trim,pvr,causal", list(_PTX_SHA), ids=lambda v: str(int(v)))
def test_timeline_off_ptx_unchanged(half, qt, trim, pvr, causal):
    import triton
    if triton.__version__ != "3.6.0":
        pytest.skip(f"hashes taken with Triton 3.6.0, not {triton.__version__}")
    ptx = G._compile_sm90(None, causal, "bf16", half, qt, trim, pvr=pvr).asm["ptx"]
    assert hashlib.sha256(clean_ptx(ptx).encode()).hexdigest() == _PTX_SHA[(half, qt, trim, pvr, causal)]


@functools.lru_cache(maxsize=None)
def _build(half, qt, trim, pvr, causal, timeline):
    c = G._compile_sm90(None, causal, "bf16", half, qt, trim, pvr=pvr, timeline=timeline)
    ptx = c.asm["ptx"]
    rep = ptxas_sm90_or_skip(ptx, sass=True, cached=True, reason="no bundled ptxas/nvdisasm")
    loops = sass_loops(rep.sass)
    prof = sorted((n_hgmma(lp), sass_count(lp, r"UTMALDG"), n_spill(lp)) for lp in loops
                  if n_hgmma(lp) or sass_count(lp, r"UTMALDG") or n_spill(lp))
    return ptx, c.metadata.shared, rep, prof


# the builds the bench and the dispatch use: (half, q_tma, trim, pvr, causal)
_VARIANTS = [(False, True, True, True, False), (False, True, True, True, True), (False, True, True, False, False),
             (True, True, True, False, True)]
_PLAIN = [(False, False, False, False, False), (False, False, False, False, True)]


def _common(cfg):
    ptx0, sh0, rep0, prof0 = _build(*cfg, False)
    ptx, sh, rep, prof = _build(*cfg, True)
    assert sh0 <= sh <= sh0 + 64
    for pat in ("wgmma.mma_async.sync.aligned.m64n64k16", "wgmma.mma_async.sync.aligned.m64n256k16",
                "mbarrier.init.shared"):
        assert ptx.count(pat) == ptx0.count(pat), pat
    # 8 softmax + 1 PV stamps (LLVM may duplicate the stamp after the O stores into both store branches)
    n_tm = ptx.count("%globaltimer")
    assert n_tm in (9, 10) and ptx.count("red.global.max.u64") == n_tm
    assert ptx.count("%smid") == 1 and ptx.count("%clock64") == 2
    assert "C7514" not in rep.log, "ptxas serialised the wgmmas"
    assert re.search(r"Used 168 registers", rep.log), rep.log
    return rep0, prof0, rep, prof


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("cfg", _VARIANTS, ids=lambda c: "h%dq%dt%dp%dc%d" % tuple(map(int, c)))
def test_timeline_variant_builds_keep_spills(cfg):
    rep0, prof0, rep, prof = _common(cfg)
    assert rep.spill_bytes <= rep0.spill_bytes, (rep0.spill_bytes, rep.spill_bytes)
    assert prof == prof0, (prof0, prof)          # (wgmma, TMA, spill instructions) of every loop unchanged


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("cfg", _PLAIN, ids=lambda c: "causal%d" % c[-1])
def test_timeline_plain_builds(cfg):
    """The plain build (h_q 16 / 32): softmax and PV tile loops spill-free; the producer loop gains <= 1 reload."""
    rep0, prof0, rep, prof = _common(cfg)
    assert rep.spill_bytes <= rep0.spill_bytes + 24, (rep0.spill_bytes, rep.spill_bytes)
    soft = [p for p in prof if p[0] > 4]
    pv = [p for p in prof if p[0] == 4]
    prod = [p for p in prof if p[0] == 0 and p[1] >= 9]
    assert len(soft) == 1 and len(pv) == 1 and len(prod) == 1
    assert soft[0][2] == 0 and pv[0][2] == 0 and prod[0][2] <= 1, prof


@needs_gluon
def test_timeline_launch_arguments(monkeypatch):
    """timeline= goes by position (tl_ptr, TIMELINE before the variant constexprs), also for the plain build; a
    wrong buffer raises; without it the launch is as before (tl_ptr None, TIMELINE False)."""
    from test_mla_decode_gluon_ring import launch_case as case, stub_launches
    fn = stub_launches(monkeypatch)
    names = [p.name for p in fn.params]
    assert names.index("TIMELINE") == names.index("tl_ptr") + 4 == names.index("PVR") - 1    # EPI_* in between
    assert names.index("tl_ptr") == names.index("kh_desc") + 1
    G.gluon_dense_launch(*case())
    x = fn.full_args(fn.log[-1])
    assert x[names.index("tl_ptr")] is None and x[names.index("TIMELINE")] is False
    grid = 4 * 2                                                     # launch_case: 4 parts, h_q 128 -> 2 row blocks
    buf = torch.zeros(grid, G.TL_WORDS, dtype=torch.int64)
    G.gluon_dense_launch(*case(), timeline=buf)
    x = fn.full_args(fn.log[-1])
    assert len(x) == len(fn.params) and x[names.index("tl_ptr")] is buf and x[names.index("TIMELINE")] is True
    assert x[names.index("PVR")] is G.DISPATCH_PVR
    G.gluon_dense_launch(*case(h_q=16), timeline=torch.zeros(4, G.TL_WORDS, dtype=torch.int64))   # plain build
    x = fn.full_args(fn.log[-1])
    assert x[names.index("TIMELINE")] is True and not any(x[names.index(n)] for n in ("PVR", "HALF", "QTMA", "TRIM"))
    for bad in (torch.zeros(grid + 1, G.TL_WORDS, dtype=torch.int64), torch.zeros(grid, G.TL_WORDS),
                torch.zeros(G.TL_WORDS, grid, dtype=torch.int64).t()):
        with pytest.raises(ValueError):
            G.gluon_dense_launch(*case(), timeline=bad)


def test_timeline_layout_matches_bench():
    assert (G.TL_HEADER, G.TL_PIECE, G.TL_MAX_PIECES) == (TLB.TL_HEADER, TLB.TL_PIECE, TLB.TL_MAX_PIECES)
    assert G.TL_WORDS == 520        # the literal in _tl_put / _tl_stamp


def test_timeline_analysis_synthetic():
    """The bench's analysis recovers the fabricated per-tile (2 us) and per-piece (3 us) costs."""
    r = TLB.analyse(TLB.synthetic(n_parts=12, m_blocks=2, tile_ns=2000, piece_ns=3000), 2)
    fit = r["cta"]["fit_busy"]
    assert abs(fit["tiles"] - 2.0) < 1e-6 and abs(fit["pieces"] - 3.0) < 0.05, fit
    assert r["ctas_recorded"] == 24 and r["piece_us"]["per_tile"]["median"] == pytest.approx(2.0)
    assert r["makespan_us"] >= r["busy_us"]["max"] and r["tail_us"] >= 0 and r["ramp_us"] <= 2.0
    d = r["decomposition_us"]
    assert d["mean_start_offset"] + d["mean_busy"] + d["imbalance"] == pytest.approx(r["makespan_us"])
    assert r["sm_clock_mhz"]["median"] == pytest.approx(1600, rel=0.01)
    fine = r["piece_us"]["epi_fine"]
    assert fine["pfree_split"]["median"] == pytest.approx(0.1) and fine["after_ostore_single"]["median"] == \
        pytest.approx(0.05)
    s = TLB.summarize([r, r])
    assert s["fit_tile_us"] == pytest.approx(2.0) and s["makespan_us"] == pytest.approx(r["makespan_us"])


def test_timeline_bench_cli_cpu(tmp_path):
    """The bench's argument parsing and its no-CUDA path (what the device script calls)."""
    a = TLB.parse_args([str(tmp_path / "x.json"), "--reps", "2", "--rounds", "3", "--only-shapes", "128:1:4096"])
    assert a.reps == 2 and a.rounds == 3 and a.only_shapes == "128:1:4096"
    if not torch.cuda.is_available():
        assert TLB.main(a) == 0


# ------------------------------------------------------------------ gpu tier
# (h_q, s_q, b, mean s_k, parts or None = the public op's): the dispatched PVR build (s_q 1 / 2 causal), the plain
# build (h_q 16), and 2 parts over 80 short requests (~41 pieces per CTA: past TL_MAX_PIECES, the last record shared)
GPU_CASES = [(128, 1, 32, 1500, None), (128, 2, 32, 1500, None), (16, 1, 48, 3000, None), (128, 1, 80, 300, 2)]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("h_q,s_q,b,s_k,parts", GPU_CASES, ids=lambda v: str(v))
def test_gpu_timeline_bitid_and_monotone(h_q, s_q, b, s_k, parts):
    import numpy as np
    import deepkernels.mla.decode as dec
    from deepkernels.mla.metadata import compute_schedule
    q, k, bt, sl, seqlens = TLB.make_case(b, s_q, h_q, s_k, seed=h_q + s_q + b)
    sl_cpu = sl.cpu()
    if parts is None:
        parts = dec._num_sm_parts(q.device, s_q * h_q, 1)
    sched, ns = compute_schedule(sl, parts)
    m_blocks = -(-s_q * h_q // 64)
    grid = parts * m_blocks
    causal = s_q > 1
    scale = 576 ** -0.5
    o0 = TLB.alloc_outs(q, parts, poison=True)
    o1 = TLB.alloc_outs(q, parts, poison=True)
    tl = torch.zeros(grid, G.TL_WORDS, dtype=torch.int64, device="cuda")
    G.gluon_dense_launch(q, k, bt, sl, sched, ns, scale, causal, *o0)
    G.gluon_dense_launch(q, k, bt, sl, sched, ns, scale, causal, *o1, timeline=tl)
    torch.cuda.synchronize()
    for a, c in zip(o0, o1):
        assert torch.equal(a.nan_to_num(1234.5), c.nan_to_num(1234.5))
    buf = tl.cpu().numpy()
    hdr, pieces = TLB.decode(buf)
    meta = sched.cpu()
    nsc = ns.cpu()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    by = {}
    for pc in pieces:
        by.setdefault(pc["cta"], []).append(pc)
    for c in range(grid):
        part = c // m_blocks
        br, er = max(int(meta[part, 0]), 0), min(int(meta[part, 1]), b - 1)
        assert hdr["npieces"][c] == er - br + 1, (c, hdr["npieces"][c], br, er)   # the kernel's count
        n = max(er - br + 1, 0)
        assert hdr["start"][c] > 0 and hdr["end_s"][c] >= hdr["start"][c] and hdr["end_pv"][c] >= hdr["start"][c]
        assert 0 <= hdr["smid"][c] < sms and hdr["clk1"][c] > hdr["clk0"][c]
        plist = sorted(by.get(c, []), key=lambda d: d["p"])
        assert len(plist) == min(n, G.TL_MAX_PIECES)
        full = plist if n <= G.TL_MAX_PIECES else plist[:-1]      # the last record is shared past the cap
        t = int(hdr["start"][c])
        for pc in full:
            req = br + pc["p"]
            assert pc["req"] == req
            assert 0 <= pc["k0"] <= pc["k1"] <= int(sl_cpu[req]) and pc["k0"] % 64 == 0
            assert pc["nsp"] == int(nsc[req + 1] - nsc[req])
            stamps = [pc["ps"], pc["fk"], pc["le"], pc["pe"]]
            assert min(stamps) >= t and stamps == sorted(stamps), (c, pc, t)
            # the finer epilogue stamps (pfree wait done, own O half's stores issued) lie inside the epilogue
            assert pc["le"] <= pc["pf"] <= pc["pe"] and pc["le"] <= pc["os"] <= pc["pe"], (c, pc)
            t = pc["pe"]
        assert int(hdr["end_s"][c]) >= t
    # per request: the token ranges of its pieces cover [0, seqlen) exactly once (row block 0's CTAs)
    cover = {}
    for pc in pieces:
        if pc["cta"] % m_blocks == 0 and hdr["npieces"][pc["cta"]] <= G.TL_MAX_PIECES:
            cover.setdefault(pc["req"], []).append((pc["k0"], pc["k1"]))
    for req, rngs in cover.items():
        rngs.sort()
        assert rngs[0][0] == 0 and rngs[-1][1] == int(sl_cpu[req]), (req, rngs)
        assert all(a[1] == b_[0] for a, b_ in zip(rngs, rngs[1:])), (req, rngs)
    r = TLB.analyse(buf, m_blocks)
    assert r["ctas_recorded"] == grid and r["makespan_us"] > 0 and np.isfinite(r["tail_us"])
