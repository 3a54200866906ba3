"""Warp-specialised Gluon sparse MLA decode kernel, V3.2 and V4.1 main caches, optionally with an extra cache (V3.2 +
V3.2, V4.1 + V4.1, V4.1 + FP4: dispatched while DISPATCH_EXTRA is set, since their first device run) (deepkernels.mla._gluon_sparse_decode_ws):
compile tier on
any machine (sm90 cross-compile: wgmma, mbarrier ring, setmaxnreg, shared memory, ptxas spills per partition loop),
GPU tier through the public op with the Gluon launcher swapped for a wrapper that runs BOTH the dispatched
single-partition Gluon kernel and the WS kernel on the same schedule: the WS output is what the op returns (checked
against the PyTorch reference with FlashMLA's tolerances, tests/test_mla_sparse_kernels.run_and_check: NaN in every
unreferenced cache token, junk indices, NaN-poisoned out / lse / accumulators) and must equal the single-partition
kernel's output bit for bit (torch.equal on out and lse, split accumulators through the same combine)."""
from __future__ import annotations

import inspect
import re

import pytest
import torch

import deepkernels as dk
import deepkernels.mla.sparse_decode as sd
from deepkernels.mla import _gluon_sparse_decode as G
from deepkernels.mla import _gluon_sparse_decode_ws as W
from deepkernels.testing.compile import n_spill, ptxas_sm90_or_skip, sass_loops, setmaxnreg_values

from test_mla_sparse_kernels import poison, run_and_check, sms  # noqa: F401  (fixtures)
from test_mla_sparse_reference import _public, make_case

pytestmark = pytest.mark.skipif(not W.available(), reason=f"Gluon not importable: {W._IMPORT_ERROR!r}")


@pytest.fixture(autouse=True)
def _ws_route(monkeypatch):
    """These tests are about the WS kernel: the public op keeps V4.1 (no extra cache) on it, not on the
    split-consumer kernel it is dispatched to since session 15 (``_gluon_sparse_decode_ws2.dispatch_on``), and h_q 128
    not on the cluster kernel (``_gluon_sparse_decode_ws3.dispatch_on``, session 17)."""
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS2", "0")
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS3", "0")


# ------------------------------------------------------------------ compile tier (CPU cross-compile for sm90)
def _assert_setmaxnreg(ptx: str, producer_regs: int):
    """Warp specialisation: the producer's register count is set (``inc``), the consumers get the rest of the launch
    cap (``dec``), as Triton splits it."""
    regs = dict(setmaxnreg_values(ptx, skip=(24, 240), unique=False))
    assert regs.get("inc") == producer_regs, regs
    assert regs.get("dec") == (W.WS_MAXNREG * (8 + W.WS_PRODUCER_WARPS) * 32 - producer_regs
                               * W.WS_PRODUCER_WARPS * 32) // 256 // 8 * 8, regs


def _ptxas_loops(ptx: str, is_producer_loop, n_producer_loops: int, max_spill_bytes: int = 256):
    """Assemble with ptxas (skip when it is missing) and check what every WS config must hold: one consumer token
    loop (the HGMMA loop) with no spill and no global load in it, ``n_producer_loops`` producer block loops
    (``is_producer_loop``), at most ``max_spill_bytes`` of spill stores / loads in all. Returns the producer loops."""
    rep = ptxas_sm90_or_skip(ptx, sass=True)
    spill = rep.spills
    assert spill, rep.log
    loops = sass_loops(rep.sass)
    cons = [lp for lp in loops if any("HGMMA" in t for t in lp)]
    prod = [lp for lp in loops if not any("HGMMA" in t for t in lp) and is_producer_loop(lp)]
    assert len(cons) == 1 and len(prod) == n_producer_loops, (len(cons), len(prod))
    assert n_spill(cons[0]) == 0, "spills in the consumers' token loop"
    assert not any(re.match(r"(@!?P\w+\s+)?LDG", t) for t in cons[0]), "global load in the consumers' token loop"
    assert spill[0] <= max_spill_bytes and spill[1] <= max_spill_bytes, rep.log
    return prod


@pytest.mark.compile
@pytest.mark.parametrize("page_shift,has_len,has_sink", [(6, True, True), (-1, False, False), (6, False, True)])
def test_compile_sm90_ws(page_shift, has_len, has_sink):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    k = W.compile_sm90_ws(page_shift, has_len, has_sink)
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    # consumers: S = 576 / 16 k-steps of m64n32 per warpgroup, P V = 64 / 16 of m64n256 (no duplicated work)
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n32k16") == 36
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16") == 4
    assert k.metadata.shared <= SM90_SMEM_LIMIT
    # the ring: 4 mbarriers, a wait on each side, the producer's cp.async arrive (RoPE rows) + both partitions' arrive
    assert ptx.count("mbarrier.init.shared") == 4
    assert ptx.count("mbarrier.try_wait.parity") == 2
    assert "cp.async.mbarrier.arrive" in ptx and ptx.count("mbarrier.arrive.shared::cta") == 2
    # warp specialisation: the producer's register count is set, the consumers get the rest
    _assert_setmaxnreg(ptx, W.WS_PRODUCER_REGS)
    # raw records as 16-byte vectors, RoPE by cp.async, consumers' fence after each ready wait
    assert "ld.global.v4.b32" in ptx or "ld.global.v4.u32" in ptx
    assert ptx.count("cp.async.cg.shared.global") == 4
    assert "fence.proxy.async" in ptx
    # the dequantised tiles go to shared memory without a layout conversion (no bf16 convert_layout at all)
    assert not re.search(r"ttg.convert_layout %\S+ : tensor<[0-9x]+xbf16", ttgir)
    # measured (Triton 3.6, ptxas of the wheel): consumer token loop 0 (and no global load in it: the validity comes
    # from shared memory), producer block loop 5 (of ~1,320 instructions) without the producer options, 10 (of
    # ~1,006) with V3.2's defaults (inline-PTX dequant + L2 prefetch, measured faster with them)
    (prod,) = _ptxas_loops(ptx, lambda lp: any("LDGSTS" in t for t in lp), 1)
    assert n_spill(prod) <= 12, f"{n_spill(prod)} spill instructions in the producer's block loop"
    assert "cp.async.bulk.prefetch.L2" in ptx                          # V3.2 default: the L2 prefetch
    plain = W.compile_sm90_ws(page_shift, has_len, has_sink, deq_asm=False, pf_l2=False).asm["ptx"]
    (prod,) = _ptxas_loops(plain, lambda lp: any("LDGSTS" in t for t in lp), 1)
    assert n_spill(prod) <= 8, f"{n_spill(prod)} spill instructions in the plain producer's block loop"

@pytest.mark.compile
@pytest.mark.parametrize("page_shift,has_len,has_sink", [(6, True, True), (-1, False, False), (6, False, True)])
def test_compile_sm90_ws_v41(page_shift, has_len, has_sink):
    """V4.1 main cache (528 B/token, d_qk 512): no RoPE tiles (no cp.async), UE8M0 dequant in the producer, PSUM
    row sum in the consumers; its own register split (WS_PRODUCER_REGS_V41)."""
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    k = W.compile_sm90_ws(page_shift, has_len, has_sink, fmt="v41")
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n32k16") == 32                 # S: 512 / 16 k-steps
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16") == 4
    # Q 64 KB + ring 2 x 64 KB + P 8 KB + masks, barriers, scratch (measured 205,476 B)
    assert k.metadata.shared <= 206 * 1024 and k.metadata.shared <= SM90_SMEM_LIMIT
    assert ptx.count("mbarrier.init.shared") == 4 and ptx.count("mbarrier.try_wait.parity") == 2
    assert "cp.async" not in ptx and ptx.count("mbarrier.arrive.shared::cta") == 2
    _assert_setmaxnreg(ptx, W.WS_PRODUCER_REGS_V41)
    assert ptx.count("ld.global.v4.b32") + ptx.count("ld.global.v4.u32") >= 16      # 4 chunks x 4 16-B vectors
    assert "fence.proxy.async" in ptx
    assert not re.search(r"ttg.convert_layout %\S+ : tensor<[0-9x]+xbf16", ttgir)
    # measured (Triton 3.6): consumer token loop 0 (producer 136 / consumers 184 gave 5 there), producer block loop
    # 14 (of ~1,380), ~150 B spill stores / ~165 B loads in all
    (prod,) = _ptxas_loops(ptx, lambda lp: sum(1 for t in lp if re.match(r"(@!?P\w+\s+)?LDG\.E\.128", t)) >= 16, 1)
    assert n_spill(prod) <= 20, f"{n_spill(prod)} spill instructions in the producer's block loop"


_WGMMA_S = {"v32": 36, "v41": 32}                 # S k-steps: 576 / 16 (NoPE + RoPE), 512 / 16
_SMEM = {"v32": 230052, "v41": 205476}           # the no-extra kernel's (the extra blocks reuse its ring)
# measured spill instructions (Triton 3.6 ptxas) in the producer's main / extra block loops, bound here with slack
_PROD_SPILLS = {("v32", "v32"): (5, 7), ("v41", "v41"): (14, 14), ("v41", "fp4"): (14, 6)}
EXTRA_PAIRS = [("v41", "fp4"), ("v32", "v32"), ("v41", "v41")]


@pytest.mark.compile
@pytest.mark.parametrize("fmt", ["v32", "v41"])
def test_compile_sm90_ws_profile_variants(fmt):
    """The timing diagnostics (benchmarks/sparse_decode_ws_profile.py) compile for sm90: PROFILE 1 keeps the
    consumers' wgmmas and drops the producer's record gather (fewer 16-byte global loads: the consumers' Q loads remain),
    PROFILE 2 has no wgmma at all; neither is the default (the plain kernel compiles without the constexpr) and
    an extra cache refuses them."""
    plain = W.compile_sm90_ws(fmt=fmt).asm["ptx"]
    p1 = W.compile_sm90_ws(fmt=fmt, profile=1).asm["ptx"]
    p2 = W.compile_sm90_ws(fmt=fmt, profile=2).asm["ptx"]
    assert "wgmma.mma_async" in plain and "wgmma.mma_async" in p1 and "wgmma.mma_async" not in p2
    assert p1.count("ld.global.v4") < plain.count("ld.global.v4")
    assert W.launch_sparse_decode_gluon_ws.__kwdefaults__["_profile"] == 0
    kw = make_case(2, 1, 64, "v41", 64, 80, 16, xfmt="fp4", xtopk=64)
    with pytest.raises(ValueError, match="_profile"):
        W.launch_sparse_decode_gluon_ws(None, None, kw["q"], kw["k_cache"], None, None, None, 1.0, "v41",
                                        extra_k_cache=kw["extra_k_cache"], _profile=1)


@pytest.mark.compile
@pytest.mark.parametrize("fmt,xfmt", EXTRA_PAIRS)
@pytest.mark.parametrize("page_shift,xpage_shift,has_len,has_xlen,has_sink", [(6, 6, True, True, True),
                                                                             (-1, 1, False, True, False),
                                                                             (6, -1, True, False, True)])
def test_compile_sm90_ws_extra(fmt, xfmt, page_shift, xpage_shift, has_len, has_xlen, has_sink):
    """The extra-cache kernel (_sparse_decode_gluon_ws_x_kernel): the same consumers (same wgmma shapes and counts,
    PSUM for V4.1, no global load in their token loop), the producer's main block loop then its extra block loop
    (FP4: 8-byte e2m1 vectors + 4-byte scale loads, no RoPE), the same ring and shared memory as without."""
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    k = W.compile_sm90_ws(page_shift, has_len, has_sink, fmt=fmt, xfmt=xfmt, xpage_shift=xpage_shift,
                          has_xlen=has_xlen)
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n32k16") == _WGMMA_S[fmt]
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16") == 4
    assert k.metadata.shared == _SMEM[fmt] and k.metadata.shared <= SM90_SMEM_LIMIT
    assert ptx.count("mbarrier.init.shared") == 4
    # one ready wait (consumers), one empty wait per producer block loop (main, extra); one ready arrive per
    # producer loop + the consumers' empty arrive
    assert ptx.count("mbarrier.try_wait.parity") == 3
    assert ptx.count("mbarrier.arrive.shared::cta") == 3
    if fmt == "v32":     # RoPE rows of the main and the extra records by cp.async
        assert ptx.count("cp.async.cg.shared.global") == 8 and ptx.count("cp.async.mbarrier.arrive") == 2
    else:
        assert "cp.async" not in ptx
    if xfmt == "fp4":    # 4 chunks x 4 8-byte e2m1 vectors, prologue + loop
        assert ptx.count("ld.global.v2.b32") + ptx.count("ld.global.v2.u32") >= 32
    _assert_setmaxnreg(ptx, W.WS_PRODUCER_REGS_X[(fmt, xfmt)])
    assert "fence.proxy.async" in ptx
    assert not re.search(r"ttg.convert_layout %\S+ : tensor<[0-9x]+xbf16", ttgir)
    prod = _ptxas_loops(ptx, lambda lp: sum(1 for t in lp if re.match(r"(@!?P\w+\s+)?LDG", t)) >= 16, 2,
                        max_spill_bytes=320)
    lim = _PROD_SPILLS[(fmt, xfmt)]
    got = sorted(n_spill(lp) for lp in prod)
    assert got[0] <= min(lim) + 4 and got[1] <= max(lim) + 4, f"producer block loops spill {got}, measured {lim}"


def test_extra_launch_goes_to_the_extra_kernel(monkeypatch):
    """CPU, kernels stubbed: the launcher takes the extra-cache arguments to the x kernel (the single-partition
    kernel's argument list: every non-constexpr parameter filled, the constexprs of the pair) and the combine gets
    the extra lengths; without an extra cache it is the no-extra kernel, as before; bad pairs raise."""
    import deepkernels.mla.combine as comb
    from deepkernels.mla.metadata import SCHED_BLOCK
    calls, combines = [], []

    def fake_cached(cache, fn, key, meta, limit):
        m = meta()

        def launch(grid, *args):
            calls.append((fn, m, args))
        return launch
    monkeypatch.setattr(W, "cached_launcher", fake_cached)
    monkeypatch.setattr(comb, "combine_splits_", lambda *a, **k: combines.append(k))
    for fmt, xfmt in EXTRA_PAIRS:
        kw = make_case(3, 2, 64, fmt, 100, 200, 64, xfmt=xfmt, xtopk=70, xpage=16, with_len=True, with_xlen=True,
                       sink=True)
        b, s_q, h_q = kw["q"].shape[:3]
        out, lse = torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16), torch.empty(b, s_q, h_q)
        sched, ns = torch.zeros(5, 8, dtype=torch.int32), torch.zeros(b + 1, dtype=torch.int32)
        W.launch_sparse_decode_gluon_ws(out, lse, kw["q"], kw["k_cache"], kw["indices"], sched, ns, 0.1, fmt,
                                        kw["attn_sink"], kw["extra_k_cache"], kw["extra_indices_in_kvcache"], xfmt,
                                        kw["topk_length"], kw["extra_topk_length"])
        fn, meta, args = calls[-1]
        assert fn is W._sparse_decode_gluon_ws_x_kernel
        params = fn.params
        assert len(args) == sum(1 for p in params if not p.is_constexpr)
        assert set(meta) - {"num_warps", "maxnreg"} == {p.name for p in params if p.is_constexpr}
        assert meta["FMT"] == G.GLUON_FMTS[fmt] and meta["XFMT"] == {"v32": 0, "v41": 2, "fp4": 3}[xfmt]
        assert meta["HAS_XLEN"] and meta["HAS_LEN"] and meta["HAS_SINK"] and meta["SBLOCK"] == SCHED_BLOCK
        assert meta["XPAGE_SHIFT"] == 4 and meta["PAGE_SHIFT"] == 6
        assert meta["PRODUCER_REGS"] == W.WS_PRODUCER_REGS_X[(fmt, xfmt)]
        names = [p.name for p in params if not p.is_constexpr]
        a = dict(zip(names, args))
        assert a["xkv_ptr"].data_ptr() == kw["extra_k_cache"].data_ptr() and a["xtopk"] == 70
        assert a["xidx_ptr"] is kw["extra_indices_in_kvcache"] and a["xlen_ptr"] is kw["extra_topk_length"]
        assert a["xpage"] == 16 and a["stride_xkb"] == kw["extra_k_cache"].view(torch.uint8).stride(0)
        assert combines[-1]["extra_lengths"] is kw["extra_topk_length"] and combines[-1]["extra_topk"] == 70
        # no extra cache: the no-extra kernel (its argument list unchanged)
        W.launch_sparse_decode_gluon_ws(out, lse, kw["q"], kw["k_cache"], kw["indices"], sched, ns, 0.1, fmt)
        fn, meta, args = calls[-1]
        assert fn is W._sparse_decode_gluon_ws_kernel and "XFMT" not in meta
        assert len(args) == sum(1 for p in fn.params if not p.is_constexpr)
        assert combines[-1]["extra_lengths"] is None and combines[-1]["extra_topk"] is None
    kw = make_case(2, 1, 64, "v32", 64, 80, 16, xfmt="v32", xtopk=64)
    with pytest.raises(ValueError):
        W.launch_sparse_decode_gluon_ws(None, None, kw["q"], kw["k_cache"], None, None, None, 1.0, "v32",
                                        extra_k_cache=kw["extra_k_cache"], xfmt="fp4")


def test_extra_calls_go_to_ws_only_with_dispatch_extra(monkeypatch):
    """CPU, launches stubbed: with an extra cache the public op sends V3.2 to the single-partition kernel and V4.1 to
    Triton when DISPATCH_EXTRA is False, and every pair to the WS kernel when it is set (the default since the first
    device run); no extra cache: WS."""
    took = []
    for name, mod, attr in (("ws", W, "launch_sparse_decode_gluon_ws"), ("single", G, "launch_sparse_decode_gluon"),
                            ("triton", sd, "_launch_sparse_decode")):
        monkeypatch.setattr(mod, attr, lambda *a, _n=name, **k: took.append(_n))
    monkeypatch.setattr(W, "supported", lambda *a, **k: True)
    monkeypatch.setattr(G, "supported", lambda *a, **k: True)
    monkeypatch.setattr(sd, "use_kernels", lambda *t: True)
    monkeypatch.setattr(sd, "_PLANS", {})
    assert W.DISPATCH_EXTRA is True
    monkeypatch.setattr(W, "DISPATCH_EXTRA", False)
    cases = {p: make_case(2, 1, 64, p[0], 64, 80, 16, xfmt=p[1], xtopk=64, with_xlen=True) for p in EXTRA_PAIRS}
    for p, kw in cases.items():
        _public(kw)
    assert took == ["triton", "single", "triton"], took
    _public(make_case(2, 1, 64, "v41", 64, 80, 16))
    assert took[-1] == "ws"
    monkeypatch.setattr(W, "DISPATCH_EXTRA", True)
    for p, kw in cases.items():
        _public(kw)
    assert took[-3:] == ["ws", "ws", "ws"], took


def test_launcher_has_the_gluon_launch_contract():
    """Drop-in for launch_sparse_decode_gluon: same parameters, defaults and order (the WS launcher only adds
    keyword-only tuning knobs after them)."""
    a = [(n, p.default) for n, p in inspect.signature(W.launch_sparse_decode_gluon_ws).parameters.items()
         if p.kind != p.KEYWORD_ONLY]
    b = [(n, p.default) for n, p in inspect.signature(G.launch_sparse_decode_gluon).parameters.items()]
    assert a == b


def test_supported_ws_gate_on_cpu(monkeypatch):
    q = torch.zeros(2, 1, 64, 576, dtype=torch.bfloat16)
    c = torch.zeros(4, 64, 1, 656, dtype=torch.uint8)
    assert not W.supported_ws(q, c, "v32")                          # CPU tensors
    assert not W.supported_ws(q, c, "v41") and not W.supported_ws(q, c, "v32", extra_k_cache=c)
    # past the single-partition gate: V3.2 and V4.1 main caches, no extra cache or the single-partition kernel's
    # pairs V3.2 + V3.2, V4.1 + V4.1, V4.1 + FP4 (the extra format from the record size)
    monkeypatch.setattr(W, "supported", lambda *a, **k: True)
    c41 = torch.zeros(4, 64, 1, 528, dtype=torch.uint8)
    c4 = torch.zeros(4, 64, 1, 288, dtype=torch.uint8)
    assert W.supported_ws(q, c, "v32") and W.supported_ws(q, c, "v41")
    assert W.supported_ws(q, c, "v32", extra_k_cache=c) and not W.supported_ws(q, c, "v32", extra_k_cache=c4)
    assert W.supported_ws(q, c41, "v41", extra_k_cache=c4) and W.supported_ws(q, c41, "v41", extra_k_cache=c41)
    assert not W.supported_ws(q, c41, "v41", extra_k_cache=c) and not W.supported_ws(q, c, "fp4")
    for fmt, x in (("v41", c), ("v32", c4), ("fp4", None)):
        with pytest.raises(ValueError):
            W.launch_sparse_decode_gluon_ws(None, None, q, c, None, None, None, 1.0, fmt, extra_k_cache=x)
    # both formats are dispatched (V4.1 since its first device run); the public op checks the format set; extra
    # caches: dispatched since their first device run (DISPATCH_EXTRA, checked by the public op)
    assert W.DISPATCH_FMTS == frozenset({"v32", "v41"}) and set(W.WS_FMTS) == {"v32", "v41"}
    assert "plan.fmt in _gsdw.DISPATCH_FMTS" in inspect.getsource(sd)
    assert W.DISPATCH_EXTRA is True and "_gsdw.DISPATCH_EXTRA" in inspect.getsource(sd)
    assert W.WS_EXTRA_PAIRS == {"v32": ("v32", ), "v41": ("v41", "fp4")} == G._EXTRA_PAIRS


# ------------------------------------------------------------------ GPU tier
@pytest.fixture
def ws_pair(monkeypatch):
    """The public op's Gluon launch (V3.2 dispatches there; V4.1 too, forced here; with or without an extra cache:
    every argument goes to both) becomes: the single-partition kernel into fresh buffers, then the WS kernel into
    the op's own buffers (so the op returns the WS result); each pair is recorded."""
    pairs = []
    gluon_launch = G.launch_sparse_decode_gluon

    def both(out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt, attn_sink=None, extra_k_cache=None,
             extra_indices=None, xfmt=None, topk_length=None, extra_topk_length=None, config=None, _spec=None):
        assert W.supported_ws(q, k_cache, fmt, extra_k_cache)
        assert extra_k_cache is None or extra_indices is not None
        args = (q, k_cache, indices, sched, num_splits, scale, fmt, attn_sink, extra_k_cache, extra_indices, xfmt,
                topk_length, extra_topk_length, config, _spec)
        out_g, lse_g = torch.empty_like(out), torch.empty_like(lse_buf)
        gluon_launch(out_g, lse_g, *args)
        W.launch_sparse_decode_gluon_ws(out, lse_buf, *args)
        pairs.append((out_g, lse_g, out, lse_buf, num_splits))     # (no host sync here: graph capture)

    monkeypatch.setattr(G, "launch_sparse_decode_gluon", both)
    monkeypatch.setattr(W, "DISPATCH", False)      # the public op calls G.launch_sparse_decode_gluon (= both)
    monkeypatch.setattr(G, "DISPATCH_FMTS", frozenset({"v32", "v41"}))    # V4.1 through the Gluon launch too
    assert hasattr(sd, "_gsd"), "sparse_decode.py dispatches to _gluon_sparse_decode"
    return pairs


def _bit_identical(pairs, n=1):
    assert len(pairs) == n, f"{len(pairs)} Gluon launches, expected {n}"
    # exact equality (rtol = atol = 0) with NaN equal to NaN at the same positions: a call whose valid indices point
    # at NaN-filled cache rows legitimately yields NaN in both kernels (torch.equal says NaN != NaN)
    for i, (out_g, lse_g, out_w, lse_w, _) in enumerate(pairs):
        torch.testing.assert_close(out_w, out_g, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"launch {i}: out: {m}")
        torch.testing.assert_close(lse_w, lse_g, rtol=0, atol=0, equal_nan=True, msg=lambda m: f"launch {i}: lse: {m}")


# (h_q, b, s_q, topk, s_k, page, with_len, sink): topk a multiple of 64 and not (576 = 9 x 64, 100, 650 > s_k),
# page 64 (shift addressing) and 53 (division), lengths and sinks on and off
_GRID = [(128, 4, 1, 2048, 2046, 64, True, True), (64, 74, 3, 576, 1024, 64, True, True),
         (128, 16, 2, 100, 650, 53, False, False), (64, 3, 1, 2048, 4096, 53, True, False),
         (128, 74, 2, 650, 512, 64, False, True), (64, 4, 2, 64, 64, 64, True, True),
         (128, 32, 1, 2048, 2048, 64, False, False)]
FMTS = ("v32", "v41")


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("h_q,b,s_q,topk,s_k,page,with_len,sink", _GRID)
def test_gpu_ws_grid(h_q, b, s_q, topk, s_k, page, with_len, sink, fmt, poison, ws_pair):
    kw = make_case(b, s_q, h_q, fmt, topk, s_k, page, with_len=with_len, sink=sink, device="cuda")
    run_and_check(kw)
    _bit_identical(ws_pair)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("flags", [dict(all_invalid=True), dict(zero_len=True), dict(nonpow2=True)])
def test_gpu_ws_corner_cases(flags, fmt, poison, ws_pair):
    kw = make_case(74, 3, 128, fmt, 576, 650, 53, with_len=True, sink=True, **flags, device="cuda")
    o, l_, _ = run_and_check(kw)
    if flags.get("all_invalid"):
        assert (o == 0).all() and torch.isposinf(l_).all()
    _bit_identical(ws_pair)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws_all_indices_minus_one(fmt, poison, ws_pair):
    kw = make_case(8, 2, 64, fmt, 192, 256, 64, sink=True, device="cuda")
    kw["indices"] = torch.full_like(kw["indices"], -1)
    o, l_ = _public(kw)
    assert (o == 0).all() and torch.isposinf(l_).all()
    _bit_identical(ws_pair)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n_sms", [3, 8, 264, 1000])
def test_gpu_ws_split_counts(n_sms, fmt, poison, sms, ws_pair):
    """Few / many scheduler parts: a CTA walks several requests (the producer's and the consumers' ring counters
    run on across requests) or a request spreads over many splits (accumulators + combine)."""
    sms(n_sms)
    kw = make_case(16, 2, 128, fmt, 2048, 4096, 64, with_len=True, sink=True, device="cuda")
    run_and_check(kw)
    _bit_identical(ws_pair)
    if n_sms >= 264:
        assert int(ws_pair[0][4][-1]) > 16                                     # split-KV + combine really ran


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws_dequant_exact(fmt, ws_pair):
    """One valid token per row: p = exp2(0) = 1 exactly, so out = V = the dequantised record, bit for bit
    bf16(fp32(e4m3) * fp32 scale) with non-power-of-two scales (V3.2; V4.1: UE8M0 2^(e-127))."""
    from deepkernels.quant.kvcache import dequantize_kv_cache
    b, s_q, h_q = 8, 2, 64
    kw = make_case(b, s_q, h_q, fmt, 64, 4096, 64, nonpow2=True, lengths=[1] * b, device="cuda")
    kw["attn_sink"] = torch.full((h_q, ), float("-inf"), device="cuda")
    o, _ = _public(kw)
    cache, ind = kw["k_cache"], kw["indices"]
    deq = dequantize_kv_cache(cache, fmt).view(cache.shape[0] * cache.shape[1], -1)[:, :512]
    i0 = ind[:, :, 0].long()
    ok = (i0 >= 0) & (i0 < deq.shape[0])
    want = torch.where(ok[..., None], deq[i0.clamp(0, deq.shape[0] - 1)], torch.zeros_like(deq[:1]))
    assert torch.equal(o, want[:, :, None, :].expand_as(o))
    _bit_identical(ws_pair)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws_stale_schedule_and_huge_logits(fmt, poison, sms, ws_pair):
    sms(8)
    kw = make_case(3, 1, 64, fmt, 192, 250, 64, lengths=[192, 100, 0], sink=True, device="cuda")
    meta = dk.get_mla_metadata()[0]
    _public(dict(kw, topk_length=torch.tensor([1, 2, 3], dtype=torch.int32, device="cuda")), meta)
    run_and_check(kw, meta=meta)                                       # schedule planned for other lengths
    kw = make_case(2, 1, 64, fmt, 64, 64, 64, lengths=[64, 64], sink=True, device="cuda")
    kw["q"] = (kw["q"] * 0 + 1).bfloat16()
    kw["softmax_scale"] = 1e3
    o, l_, _ = run_and_check(kw)
    assert torch.isfinite(o).all() and torch.isfinite(l_).all()
    _bit_identical(ws_pair, 3)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws_deterministic_and_graph_capture(fmt, ws_pair):
    kw = make_case(16, 2, 128, fmt, 512, 1024, 64, with_len=True, sink=True, device="cuda")
    meta = dk.get_mla_metadata()[0]
    o_ref, l_ref = _public(kw, meta)
    o2, l2 = _public(kw, meta)
    assert torch.equal(o_ref, o2) and torch.equal(l_ref, l2)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        _public(kw, meta)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o_g, l_g = _public(kw, meta)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_g, o_ref) and torch.equal(l_g, l_ref)
    _bit_identical(ws_pair, 4)                                        # the captured pair: after the replay


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("producer_fence", [True])
def test_gpu_ws_knobs_same_bits(producer_fence, fmt, ws_pair, monkeypatch):
    """The launcher's tuning knobs (producer-side proxy fence, other register splits) change no bit."""
    monkeypatch.setattr(W, "WS_PRODUCER_FENCE", producer_fence)
    kw = make_case(16, 2, 128, fmt, 2048, 4096, 64, with_len=True, sink=True, device="cuda")
    run_and_check(kw)
    _bit_identical(ws_pair)


# ------------------------------------------------------------------ GPU tier: extra cache (V4.1 + FP4, V3.2 + V3.2)
# (h_q, b, s_q, topk, s_k, page, xtopk, xs_k, xpage, with_len, with_xlen, sink): main and extra lengths, pages with
# shift (64, 16) and division (53, 69) addressing on either cache, extra topk a multiple of 64 and not
_XGRID = [(128, 4, 1, 2048, 2046, 64, 512, 1024, 64, True, True, True),
          (64, 16, 2, 576, 1024, 53, 100, 300, 64, False, True, False),
          (128, 8, 1, 100, 650, 64, 650, 700, 69, True, False, True),
          (64, 74, 3, 192, 256, 64, 64, 128, 16, True, True, True)]
XPAIRS = [("v41", "fp4"), ("v32", "v32")]


def _xcase(fmt, xfmt, h_q, b, s_q, topk, s_k, page, xtopk, xs_k, xpage, with_len, with_xlen, sink, **kw):
    return make_case(b, s_q, h_q, fmt, topk, s_k, page, xfmt=xfmt, xtopk=xtopk, xs_k=xs_k, xpage=xpage,
                     with_len=with_len, with_xlen=with_xlen, sink=sink, device="cuda", **kw)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", XPAIRS)
@pytest.mark.parametrize("shape", _XGRID)
def test_gpu_ws_extra_grid(shape, fmt, xfmt, poison, ws_pair):
    kw = _xcase(fmt, xfmt, *shape)
    run_and_check(kw)
    _bit_identical(ws_pair)


@pytest.mark.gpu
def test_gpu_ws_extra_v41_v41(poison, ws_pair):
    """V4.1 + V4.1 (the third pair the single-partition kernel takes; same producer loop as the V4.1 main cache)."""
    kw = _xcase("v41", "v41", 128, 8, 2, 576, 1024, 64, 192, 512, 53, True, True, True)
    run_and_check(kw)
    _bit_identical(ws_pair)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", XPAIRS)
@pytest.mark.parametrize("corner", ["extra_all_invalid", "main_len_zero", "zero_len", "all_invalid"])
def test_gpu_ws_extra_corner_cases(corner, fmt, xfmt, poison, ws_pair):
    """All extra indices invalid (-1 / junk), main length 0 with extra tokens (the line is the extra part only), half
    the rows of both lists empty, everything invalid."""
    b = 16
    flags = dict(zero_len=corner == "zero_len", all_invalid=corner == "all_invalid")
    if corner == "main_len_zero":
        flags["lengths"] = [0] * b
    kw = _xcase(fmt, xfmt, 128, b, 2, 576, 650, 53, 192, 400, 64, True, True, True, **flags)
    if corner == "extra_all_invalid":
        x = kw["extra_indices_in_kvcache"]
        x.copy_(torch.where(torch.rand(x.shape, device=x.device) < 0.5, -1, 2 ** 31 - 1).to(x.dtype))
    o, l_, _ = run_and_check(kw)
    if corner == "all_invalid":
        assert (o == 0).all() and torch.isposinf(l_).all()
    _bit_identical(ws_pair)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", XPAIRS)
@pytest.mark.parametrize("n_sms", [3, 264, 1000])
def test_gpu_ws_extra_split_counts(n_sms, fmt, xfmt, poison, sms, ws_pair):
    """Few parts (a CTA walks several requests: main + extra blocks, the ring counters running on) and many (splits of
    1-2 blocks: split boundaries inside the main part, at its padded end 64 * ceil(n / 64), and inside the extra
    part; main lengths not multiples of 64)."""
    sms(n_sms)
    kw = _xcase(fmt, xfmt, 128, 16, 2, 2048, 4096, 64, 512, 2048, 64, True, True, True)
    run_and_check(kw)
    _bit_identical(ws_pair)
    if n_sms >= 264:
        assert int(ws_pair[0][4][-1]) > 16                                     # split-KV + combine really ran


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", XPAIRS)
def test_gpu_ws_extra_dequant_exact(fmt, xfmt, ws_pair):
    """Main length 0, one valid extra token per row: p = exp2(0) = 1, so out = the dequantised extra record bit for
    bit (FP4: e2m1 x e4m3 scale, exact in bf16; V3.2: bf16(fp32(e4m3) * fp32 scale))."""
    from deepkernels.quant.kvcache import dequantize_kv_cache
    b, s_q, h_q = 8, 2, 64
    kw = make_case(b, s_q, h_q, fmt, 64, 256, 64, xfmt=xfmt, xtopk=64, xs_k=4096, xpage=64, lengths=[0] * b,
                   xlengths=[1] * b, device="cuda")
    kw["attn_sink"] = torch.full((h_q, ), float("-inf"), device="cuda")
    o, _ = _public(kw)
    cache, ind = kw["extra_k_cache"], kw["extra_indices_in_kvcache"]
    deq = dequantize_kv_cache(cache, xfmt).view(cache.shape[0] * cache.shape[1], -1)[:, :512]
    i0 = ind[:, :, 0].long()
    ok = (i0 >= 0) & (i0 < deq.shape[0])
    want = torch.where(ok[..., None], deq[i0.clamp(0, deq.shape[0] - 1)], torch.zeros_like(deq[:1]))
    assert torch.equal(o, want[:, :, None, :].expand_as(o).to(o.dtype))
    _bit_identical(ws_pair)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", XPAIRS)
def test_gpu_ws_extra_deterministic_and_graph_capture(fmt, xfmt, ws_pair):
    kw = _xcase(fmt, xfmt, 128, 16, 2, 512, 1024, 64, 128, 512, 64, True, True, True)
    meta = dk.get_mla_metadata()[0]
    o_ref, l_ref = _public(kw, meta)
    o2, l2 = _public(kw, meta)
    assert torch.equal(o_ref, o2) and torch.equal(l_ref, l2)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        _public(kw, meta)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        o_g, l_g = _public(kw, meta)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_g, o_ref) and torch.equal(l_g, l_ref)
    _bit_identical(ws_pair, 4)


# ------------------------------------------------------------------ inline-PTX dequantisation (WS_DEQ_ASM)
@pytest.mark.compile
@pytest.mark.parametrize("fmt", FMTS)
def test_compile_sm90_ws_deq_asm(fmt):
    """The producer's inline-PTX dequant (``deq_asm``) compiles for sm90: the pair conversion is fed straight from
    the words' 16-bit halves (no byte shifts in the PTX of the dequant), the consumer's instruction stream is the
    same kernel's, shared memory unchanged; the default for V3.2 only (measured: ``WS_DEQ_ASM``)."""
    plain = W.compile_sm90_ws(fmt=fmt, deq_asm=False)
    asm = W.compile_sm90_ws(fmt=fmt, deq_asm=True)
    assert asm.metadata.shared == plain.metadata.shared
    p, a = plain.asm["ptx"], asm.asm["ptx"]
    assert p.count("cvt.rn.f16x2.e4m3x2") == a.count("cvt.rn.f16x2.e4m3x2") == 128
    assert a.count("shr.u32") < p.count("shr.u32") and a.count("and.b16") < p.count("and.b16")
    assert a.count("wgmma.mma_async") == p.count("wgmma.mma_async")
    assert W.WS_DEQ_ASM == frozenset({"v32"})


@pytest.mark.compile
@pytest.mark.parametrize("fmt", FMTS)
def test_compile_sm90_ws_pf_l2(fmt):
    """The producer's L2 prefetch option compiles: one ``cp.async.bulk.prefetch.L2`` of the format's record size
    per token in the prologue and in the block loop; off: none; the default for V3.2 only (measured)."""
    rb = {"v32": 656, "v41": 528}[fmt]
    assert "cp.async.bulk.prefetch" not in W.compile_sm90_ws(fmt=fmt, pf_l2=False).asm["ptx"]
    ptx = W.compile_sm90_ws(fmt=fmt, pf_l2=True).asm["ptx"]
    assert len(re.findall(r"cp\.async\.bulk\.prefetch\.L2\.global \[[^\]]+\], %d;" % rb, ptx)) == 2
    assert W.WS_PF_L2 == frozenset({"v32"})


@pytest.mark.compile
@pytest.mark.parametrize("fmt", FMTS)
def test_compile_sm90_ws_row_lanes(fmt):
    """The producer's ROW_LANES option (lanes over token rows first) compiles for WS and WS2 with the same shared
    memory, the same number of 16-byte shared stores and global loads, the same wgmma count; on for V3.2."""
    from deepkernels.mla import _gluon_sparse_decode_ws2 as W2
    for comp in (W.compile_sm90_ws, W2.compile_sm90_ws2):
        off, on = comp(fmt=fmt, row_lanes=False), comp(fmt=fmt, row_lanes=True)
        assert on.metadata.shared == off.metadata.shared
        p, a = off.asm["ptx"], on.asm["ptx"]
        assert p != a
        for op in ("st.shared.v4.b32", "ld.global.v4.b32", "wgmma.mma_async", "cp.async.cg.shared.global"):
            assert a.count(op) == p.count(op), op
    assert W.WS_ROW_LANES == frozenset({"v32"})    # measured: V3.2 1.5-3.9 % faster, V4.1 1.4-2.3 % slower


@pytest.mark.gpu
@pytest.mark.parametrize("knob", ["WS_DEQ_ASM", "WS_PF_L2", "WS_ROW_LANES"])
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("b,s_q,h_q,topk,s_k,page,nonpow2", [(4, 2, 128, 576, 4096, 64, True),
                                                            (3, 1, 64, 100, 300, 16, True),
                                                            (2, 2, 64, 128, 200, 64, False)])
def test_gpu_ws_deq_asm_bit_identical(knob, fmt, b, s_q, h_q, topk, s_k, page, nonpow2, poison, monkeypatch):
    """The producer options -- inline-PTX dequant (same ops: e4m3 pair -> f16x2, f16 -> f32, mul.rn.f32,
    cvt.rn.bf16x2.f32) and the L2 prefetch of block j+2 -- give the default kernel's output bit for bit, through the
    public op on the WS kernel; and pass the reference check (NaN in every unreferenced cache token, junk indices,
    non-power-of-two V3.2 scales)."""
    kw = make_case(b, s_q, h_q, fmt, topk, s_k, page, nonpow2=nonpow2, with_len=True, device="cuda")
    took = []
    real = W.launch_sparse_decode_gluon_ws

    def spy(*a, **k):
        took.append(fmt in getattr(W, knob))
        return real(*a, **k)
    monkeypatch.setattr(W, "launch_sparse_decode_gluon_ws", spy)
    monkeypatch.setattr(sd, "_PLANS", {})
    outs = []
    for on in (False, True):
        monkeypatch.setattr(W, knob, frozenset({fmt}) if on else frozenset())
        outs.append(_public(kw))
    assert took == [False, True], took
    for x, y in zip(outs[1], outs[0]):
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)
    run_and_check(kw)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("b,s_q,h_q,topk,s_k,page,nonpow2", [(4, 2, 128, 576, 4096, 64, True),
                                                            (3, 1, 64, 100, 300, 16, True)])
def test_gpu_ws2_row_lanes_bit_identical(fmt, b, s_q, h_q, topk, s_k, page, nonpow2, poison, monkeypatch):
    """ROW_LANES on the split-consumer kernel (public op routed to it): bit-identical to it without, and passes the
    reference check."""
    from deepkernels.mla import _gluon_sparse_decode_ws2 as W2
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS2", "1")
    kw = make_case(b, s_q, h_q, fmt, topk, s_k, page, nonpow2=nonpow2, with_len=True, device="cuda")
    took = []
    real = W2.launch_sparse_decode_gluon_ws2

    def spy(*a, **k):
        took.append(fmt in W.WS_ROW_LANES)
        return real(*a, **k)
    monkeypatch.setattr(W2, "launch_sparse_decode_gluon_ws2", spy)
    monkeypatch.setattr(sd, "_PLANS", {})
    outs = []
    for on in (False, True):
        monkeypatch.setattr(W, "WS_ROW_LANES", frozenset({fmt}) if on else frozenset())
        outs.append(_public(kw))
    assert took == [False, True], took
    for x, y in zip(outs[1], outs[0]):
        torch.testing.assert_close(x, y, rtol=0, atol=0, equal_nan=True)
    run_and_check(kw)
