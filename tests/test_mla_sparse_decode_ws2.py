"""Warp-specialised Gluon sparse MLA decode, dense-decode consumer structure (deepkernels.mla._gluon_sparse_decode_ws2;
not dispatched): compile tier on any machine (sm90 cross-compile: m64n64 S wgmmas of the softmax warpgroup, the PV
warpgroup's m64n256 wgmmas, 6 mbarriers, setmaxnreg of the three partitions, shared memory, ptxas spills per
partition loop), CPU launcher checks with the kernel stubbed, and a GPU tier through the public op with its Gluon
launch routed to :func:`launch_sparse_decode_gluon_ws2` (checked against the PyTorch reference with FlashMLA's
tolerances, tests/test_mla_sparse_kernels.run_and_check: NaN in every unreferenced cache token, junk indices,
NaN-poisoned out / lse / accumulators). Not bit-identical to the WS kernel (row sums in another order): tolerance
checks only."""
from __future__ import annotations

import functools
import inspect
import re

import pytest
import torch

import deepkernels as dk
import deepkernels.mla.sparse_decode as sd
from deepkernels.mla import _gluon_sparse_decode as G
from deepkernels.mla import _gluon_sparse_decode_ws as W
from deepkernels.mla import _gluon_sparse_decode_ws2 as W2
from deepkernels.testing.compile import (n_hgmma, n_spill, ptxas_sm90_cached, ptxas_sm90_or_skip, sass_loops,
                                        setmaxnreg_values)

from test_mla_sparse_kernels import poison, run_and_check, sms  # noqa: F401  (fixtures)
from test_mla_sparse_reference import _public, make_case

pytestmark = pytest.mark.skipif(not W2.available(), reason=f"Gluon not importable: {W2._IMPORT_ERROR!r}")

FMTS = ("v32", "v41")


# ------------------------------------------------------------------ compile tier (CPU cross-compile for sm90)
@functools.lru_cache(maxsize=None)
def _compiled(fmt, page_shift, has_len, has_sink):
    k = W2.compile_sm90_ws2(fmt, page_shift, has_len, has_sink)
    return k.asm["ptx"], k.asm["ttgir"], k.metadata.shared


def _loops(ptx):
    """(softmax token loop, PV token loop, producer block loop, spill store bytes, spill load bytes) from ptxas."""
    rep = ptxas_sm90_or_skip(ptx, sass=True, cached=True)
    spill = rep.spills
    assert spill, rep.log
    loops = sass_loops(rep.sass)
    s_loops = [lp for lp in loops if n_hgmma(lp) > 4]          # S (32 / 36 k-steps) + P V_left (4)
    pv_loops = [lp for lp in loops if n_hgmma(lp) == 4]        # P V_right (4 k-steps of m64n256)
    prod = [lp for lp in loops if not n_hgmma(lp) and sum(1 for t in lp if re.match(r"(@!?P\w+\s+)?LDG", t)) >= 16]
    assert len(s_loops) == 1 and len(pv_loops) == 1 and len(prod) == 1, (len(s_loops), len(pv_loops), len(prod))
    return s_loops[0], pv_loops[0], prod[0], spill[0], spill[1]


_SMEM = {"v32": 230064, "v41": 205472}       # measured (Triton 3.6); the WS kernel: 230,052 / 205,476
_S_STEPS = {"v32": 36, "v41": 32}           # S k-steps: 576 / 16 (NoPE + RoPE), 512 / 16
# measured spill instructions in the producer's block loop (the WS kernel's producer, unchanged): 5-6 / 12-14
_PROD_SPILLS = {"v32": 8, "v41": 20}
_CONFIGS = [(6, True, True), (-1, False, False), (6, False, True), (-1, True, False)]


@pytest.mark.compile
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("page_shift,has_len,has_sink", _CONFIGS)
def test_compile_sm90_ws2(fmt, page_shift, has_len, has_sink):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    ptx, ttgir, shared = _compiled(fmt, page_shift, has_len, has_sink)
    # softmax WG: the full S as m64n64k16 (no m64n32 split), P V_left 4 x m64n256k16; PV WG: P V_right 4 x m64n256k16
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k16") == _S_STEPS[fmt]
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n32k16") == 0
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16") == 8
    assert shared <= SM90_SMEM_LIMIT and shared <= _SMEM[fmt] + 64, shared
    # 6 mbarriers: ready x 2, empty x 2, pready, pfree; waits: producer empty, softmax ready + pfree (loop and
    # epilogue), PV ready + pready (loop and epilogue) = 7
    assert ptx.count("mbarrier.init.shared") == 6
    assert ptx.count("mbarrier.try_wait.parity") == 7
    # arrives: producer ready, softmax pready x 2 + empty, PV pfree x 2 + empty = 7
    assert ptx.count("mbarrier.arrive.shared::cta") == 7
    assert ("cp.async.mbarrier.arrive" in ptx) == (fmt == "v32")
    assert "fence.proxy.async" in ptx
    # partitions' registers: producer (the WS kernel's value), PV warpgroup, softmax warpgroup gets the rest
    prod = W.WS_PRODUCER_REGS_V41 if fmt == "v41" else W.WS_PRODUCER_REGS
    soft = (W.WS_MAXNREG * 12 * 32 - (prod + W2.WS2_PV_REGS) * 128) // 128 // 8 * 8
    # the setmaxnreg values besides Triton's 256 / 120 entry and exit dance: the producer's and the PV warpgroup's
    # ``inc`` (which may be 120), the softmax warpgroup's ``dec``
    regs = setmaxnreg_values(ptx, keep=[("inc", 120)])
    assert ("inc", prod) in regs and ("inc", W2.WS2_PV_REGS) in regs and ("dec", soft) in regs, regs
    assert not re.search(r"ttg.convert_layout %\S+ : tensor<[0-9x]+xbf16", ttgir)
    # ptxas (Triton 3.6 wheel), measured: 0 spill instructions in both consumer token loops (PV_REGS 160: softmax WG
    # 208 / 224 registers), producer block loop 5-6 (V3.2) / 12-14 (V4.1), 56-92 B spill stores in all
    s_loop, pv_loop, prod_loop, st, ld = _loops(ptx)
    assert n_hgmma(s_loop) == _S_STEPS[fmt] + 4 and n_spill(s_loop) == 0, n_spill(s_loop)
    assert n_spill(pv_loop) == 0, n_spill(pv_loop)
    for lp in (s_loop, pv_loop):     # the validity comes from shared memory: no global load in the token loops
        assert not any(re.match(r"(@!?P\w+\s+)?LDG", t) for t in lp)
    assert n_spill(prod_loop) <= _PROD_SPILLS[fmt], n_spill(prod_loop)
    assert st <= 160 and ld <= 192, (st, ld)


@pytest.mark.compile
@pytest.mark.parametrize("fmt", FMTS)
def test_compile_sm90_ws2_producer_no_worse_than_ws(fmt):
    """The producer is the WS kernel's: its block loop spills no more than there (same config), +1 for ptxas noise."""
    ptx = _compiled(fmt, 6, True, True)[0]
    _, _, prod, _, _ = _loops(ptx)
    old = W.compile_sm90_ws(6, True, True, fmt=fmt).asm["ptx"]
    rep = ptxas_sm90_cached(old)
    old_prod = [lp for lp in sass_loops(rep.sass) if not n_hgmma(lp)
                and sum(1 for t in lp if re.match(r"(@!?P\w+\s+)?LDG", t)) >= 16]
    assert len(old_prod) == 1
    assert n_spill(prod) <= n_spill(old_prod[0]) + 1, (n_spill(prod), n_spill(old_prod[0]))


# ------------------------------------------------------------------ CPU: launcher contract (kernel stubbed)
def test_launcher_has_the_ws_launch_contract():
    """Drop-in for launch_sparse_decode_gluon_ws: same positional parameters, defaults and order."""
    a = [(n, p.default) for n, p in inspect.signature(W2.launch_sparse_decode_gluon_ws2).parameters.items()
         if p.kind != p.KEYWORD_ONLY]
    b = [(n, p.default) for n, p in inspect.signature(W.launch_sparse_decode_gluon_ws).parameters.items()
         if p.kind != p.KEYWORD_ONLY]
    assert a == b
    # the kernel's parameters: the WS kernel's runtime arguments in its order, its constexprs (+ PV_REGS)
    pw, p2 = W._sparse_decode_gluon_ws_kernel.params, W2._sparse_decode_gluon_ws2_kernel.params
    assert [p.name for p in p2 if not p.is_constexpr] == [p.name for p in pw if not p.is_constexpr]
    assert {p.name for p in p2 if p.is_constexpr} >= {"PAGE_SHIFT", "HAS_LEN", "HAS_SINK", "SBLOCK", "PRODUCER_REGS",
                                                       "PRODUCER_FENCE", "FMT", "PROFILE", "DEQ_ASM", "PV_REGS"}
    assert W2.DISPATCH is True and W2.DISPATCH_FMTS == frozenset({"v41"})


def test_supported_ws2_gate_on_cpu(monkeypatch):
    q = torch.zeros(2, 1, 64, 576, dtype=torch.bfloat16)
    c = torch.zeros(4, 64, 1, 656, dtype=torch.uint8)
    assert not W2.supported_ws2(q, c, "v32")                          # CPU tensors
    monkeypatch.setattr(W2, "supported", lambda *a, **k: True)
    c41 = torch.zeros(4, 64, 1, 528, dtype=torch.uint8)
    assert W2.supported_ws2(q, c, "v32") and W2.supported_ws2(q, c41, "v41")
    assert not W2.supported_ws2(q, c, "v32", extra_k_cache=c) and not W2.supported_ws2(q, c41, "v41", c41)
    assert not W2.supported_ws2(q, c, "fp4")
    for fmt, x in (("v32", c), ("v41", c41), ("fp4", None)):
        with pytest.raises(ValueError):
            W2.launch_sparse_decode_gluon_ws2(None, None, q, c, None, None, None, 1.0, fmt, extra_k_cache=x)


def test_launch_args_on_cpu(monkeypatch):
    """Kernel and combine stubbed: every non-constexpr kernel parameter filled (the WS kernel's order), the
    constexprs of the call, grid parts * s_q * h_q / 64, the combine called as the WS launcher calls it."""
    import deepkernels.mla.combine as comb
    from deepkernels.mla.metadata import SCHED_BLOCK
    calls, combines = [], []

    def fake_cached(cache, fn, key, meta, limit):
        m = meta()

        def launch(grid, *args):
            calls.append((fn, m, grid, args))
        return launch
    monkeypatch.setattr(W2, "cached_launcher", fake_cached)
    monkeypatch.setattr(comb, "combine_splits_", lambda *a, **k: combines.append((a, k)))
    for fmt in FMTS:
        kw = make_case(3, 2, 128, fmt, 100, 200, 64, with_len=True, sink=True)
        b, s_q, h_q = kw["q"].shape[:3]
        out, lse = torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16), torch.empty(b, s_q, h_q)
        sched, ns = torch.zeros(5, 8, dtype=torch.int32), torch.zeros(b + 1, dtype=torch.int32)
        W2.launch_sparse_decode_gluon_ws2(out, lse, kw["q"], kw["k_cache"], kw["indices"], sched, ns, 0.1, fmt,
                                          kw["attn_sink"], topk_length=kw["topk_length"])
        fn, meta, grid, args = calls[-1]
        assert fn is W2._sparse_decode_gluon_ws2_kernel and grid == (5 * s_q * 2, )
        assert len(args) == sum(1 for p in fn.params if not p.is_constexpr)
        assert set(meta) - {"num_warps", "maxnreg"} == {p.name for p in fn.params if p.is_constexpr}
        assert meta["PROFILE"] == 0
        # the producer options follow the WS kernel's per-format choice (V3.2: inline-PTX dequant + L2 prefetch)
        assert meta["DEQ_ASM"] == (fmt in W.WS_DEQ_ASM) and meta["PF_L2"] == (fmt in W.WS_PF_L2)
        assert meta["num_warps"] == 4 and meta["maxnreg"] == W.WS_MAXNREG
        assert meta["FMT"] == G.GLUON_FMTS[fmt] and meta["SBLOCK"] == SCHED_BLOCK and meta["PAGE_SHIFT"] == 6
        assert meta["HAS_LEN"] and meta["HAS_SINK"] and meta["PV_REGS"] == W2.WS2_PV_REGS
        assert meta["PRODUCER_REGS"] == (W.WS_PRODUCER_REGS_V41 if fmt == "v41" else W.WS_PRODUCER_REGS)
        a = dict(zip([p.name for p in fn.params if not p.is_constexpr], args))
        assert a["idx_ptr"] is kw["indices"] and a["len_ptr"] is kw["topk_length"] and a["topk"] == 100
        assert a["acc_rows"] == b + 5 and abs(a["sm_scale_log2"] - 0.1 * 1.4426950408889634) < 1e-12
        (ca, ck) = combines[-1]
        assert ca[0] is out and ck["lengths"] is kw["topk_length"] and ck["topk"] == 100
        assert ck["extra_lengths"] is None and ck["rne"] is False


# ------------------------------------------------------------------ GPU tier
@pytest.fixture
def ws2_route(monkeypatch):
    """The public op's Gluon launch goes to launch_sparse_decode_gluon_ws2 (the WS kernel's dispatch off, V4.1
    forced through the Gluon launch too); each launch is counted."""
    calls = []

    def route(out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt, attn_sink=None, extra_k_cache=None,
              extra_indices=None, xfmt=None, topk_length=None, extra_topk_length=None, config=None, _spec=None):
        assert W2.supported_ws2(q, k_cache, fmt, extra_k_cache)
        W2.launch_sparse_decode_gluon_ws2(out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt,
                                          attn_sink, extra_k_cache, extra_indices, xfmt, topk_length,
                                          extra_topk_length, config, _spec)
        calls.append(num_splits)

    monkeypatch.setattr(G, "launch_sparse_decode_gluon", route)
    monkeypatch.setattr(W, "DISPATCH", False)      # the public op calls G.launch_sparse_decode_gluon (= route)
    monkeypatch.setattr(G, "DISPATCH_FMTS", frozenset({"v32", "v41"}))
    assert hasattr(sd, "_gsd"), "sparse_decode.py dispatches to _gluon_sparse_decode"
    return calls


def _ran(calls, n=1):
    assert len(calls) == n, f"{len(calls)} WS2 launches, expected {n}"


# (h_q, b, s_q, topk, s_k, page, with_len, sink): topk a multiple of 64 and not (576 = 9 x 64, 100, 650 > s_k),
# page 64 (shift addressing) and 53 (division), lengths and sinks on and off
_GRID = [(128, 4, 1, 2048, 2046, 64, True, True), (64, 74, 3, 576, 1024, 64, True, True),
         (128, 16, 2, 100, 650, 53, False, False), (64, 3, 1, 2048, 4096, 53, True, False),
         (128, 74, 2, 650, 512, 64, False, True), (64, 4, 2, 64, 64, 64, True, True),
         (128, 32, 1, 2048, 2048, 16, False, False)]


@pytest.mark.gpu
def test_gpu_ws2_smoke(ws2_route):
    """One small V3.2 call (the device script runs this first, under a hang guard)."""
    kw = make_case(4, 1, 64, "v32", 256, 512, 64, with_len=True, sink=True, device="cuda")
    run_and_check(kw)
    torch.cuda.synchronize()
    _ran(ws2_route)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("h_q,b,s_q,topk,s_k,page,with_len,sink", _GRID)
def test_gpu_ws2_grid(h_q, b, s_q, topk, s_k, page, with_len, sink, fmt, poison, ws2_route):
    kw = make_case(b, s_q, h_q, fmt, topk, s_k, page, with_len=with_len, sink=sink, device="cuda")
    run_and_check(kw)
    _ran(ws2_route)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("flags", [dict(all_invalid=True), dict(zero_len=True), dict(nonpow2=True)])
def test_gpu_ws2_corner_cases(flags, fmt, poison, ws2_route):
    kw = make_case(74, 3, 128, fmt, 576, 650, 53, with_len=True, sink=True, **flags, device="cuda")
    o, l_, _ = run_and_check(kw)
    if flags.get("all_invalid"):
        assert (o == 0).all() and torch.isposinf(l_).all()
    _ran(ws2_route)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws2_all_indices_minus_one(fmt, poison, ws2_route):
    kw = make_case(8, 2, 64, fmt, 192, 256, 64, sink=True, device="cuda")
    kw["indices"] = torch.full_like(kw["indices"], -1)
    o, l_ = _public(kw)
    assert (o == 0).all() and torch.isposinf(l_).all()
    _ran(ws2_route)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws2_topk_length_zero(fmt, poison, ws2_route):
    """Every request's length 0 (and some > 0 mixed in a second call): empty rows give out 0, lse +inf."""
    kw = make_case(6, 2, 128, fmt, 256, 512, 64, lengths=[0] * 6, sink=True, device="cuda")
    o, l_ = _public(kw)
    assert (o == 0).all() and torch.isposinf(l_).all()
    kw = make_case(6, 2, 128, fmt, 256, 512, 64, lengths=[0, 256, 0, 1, 0, 65], sink=True, device="cuda")
    run_and_check(kw)
    _ran(ws2_route, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n_sms", [3, 8, 264, 1000])
def test_gpu_ws2_split_counts(n_sms, fmt, poison, sms, ws2_route):
    """Few / many scheduler parts: a CTA walks several requests (the ring and handshake counters run on across
    requests) or a request spreads over many splits (accumulators + combine)."""
    sms(n_sms)
    kw = make_case(16, 2, 128, fmt, 2048, 4096, 64, with_len=True, sink=True, device="cuda")
    run_and_check(kw)
    _ran(ws2_route)
    if n_sms >= 264:
        assert int(ws2_route[0][-1]) > 16                                      # split-KV + combine really ran


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws2_dequant_exact(fmt, ws2_route):
    """One valid token per row: p = exp2(0) = 1 exactly, so out = V = the dequantised record, bit for bit (both
    value halves: the softmax warpgroup's columns [0, 256) and the PV warpgroup's [256, 512))."""
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
    _ran(ws2_route)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws2_stale_schedule_and_huge_logits(fmt, poison, sms, ws2_route):
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
    _ran(ws2_route, 3)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws2_deterministic_and_graph_capture(fmt, ws2_route):
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
    _ran(ws2_route, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws2_close_to_ws(fmt, poison):
    """Direct launches on one schedule: WS2 and the WS kernel agree within bf16 rounding (not bit for bit)."""
    from deepkernels.mla.metadata import compute_schedule
    b, s_q, h_q, topk = 8, 2, 128, 1024
    kw = make_case(b, s_q, h_q, fmt, topk, 4096, 64, with_len=True, sink=True, device="cuda")
    q, cache, ind = kw["q"], kw["k_cache"], kw["indices"]
    cfg = sd.sparse_decode_config(h_q, fmt)
    parts = sd._num_sm_parts(q.device, s_q, h_q, cfg)
    sched, ns = compute_schedule(sd._token_counts(b, topk, kw["topk_length"], 0, None, False, q.device), parts)
    res = []
    for launch in (W.launch_sparse_decode_gluon_ws, W2.launch_sparse_decode_gluon_ws2):
        out = torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(b, s_q, h_q, device="cuda")
        launch(out, lse, q, cache, ind, sched, ns, q.shape[-1] ** -0.5, fmt, kw["attn_sink"],
               topk_length=kw["topk_length"])
        res.append((out.float(), lse))
    torch.cuda.synchronize()
    (o1, l1), (o2, l2) = res
    assert not torch.isnan(o2).any() and not torch.isnan(l2).any()
    torch.testing.assert_close(o2, o1, rtol=2e-2, atol=2e-3)
    fin = torch.isfinite(l1)
    assert torch.equal(fin, torch.isfinite(l2)) and torch.equal(l1[~fin], l2[~fin])
    torch.testing.assert_close(l2[fin], l1[fin], rtol=1e-5, atol=1e-5)


def test_public_op_dispatch_switch(monkeypatch):
    """CPU, launches stubbed: the public op sends the calls the WS kernel takes (no extra cache) to WS2 for the formats
    in DISPATCH_FMTS (V4.1, measured faster; V3.2 stays on WS); DEEPKERNELS_SPARSE_WS2=1 / =0 override that for every
    format; calls with an extra cache stay on the WS kernel; with the WS kernel switched off (its DISPATCH False)
    WS2 is not chosen either."""
    took = []
    for name, mod, attr in (("ws", W, "launch_sparse_decode_gluon_ws"), ("ws2", W2, "launch_sparse_decode_gluon_ws2"),
                            ("single", G, "launch_sparse_decode_gluon"), ("triton", sd, "_launch_sparse_decode")):
        monkeypatch.setattr(mod, attr, lambda *a, _n=name, **k: took.append(_n))
    monkeypatch.setattr(W, "supported", lambda *a, **k: True)
    monkeypatch.setattr(W2, "supported", lambda *a, **k: True)
    monkeypatch.setattr(G, "supported", lambda *a, **k: True)
    monkeypatch.setattr(sd, "use_kernels", lambda *t: True)
    monkeypatch.setattr(sd, "_PLANS", {})
    monkeypatch.delenv("DEEPKERNELS_SPARSE_WS2", raising=False)
    plain = {f: make_case(2, 1, 64, f, 64, 80, 16) for f in ("v32", "v41")}
    extra = make_case(2, 1, 64, "v41", 64, 80, 16, xfmt="fp4", xtopk=64)
    assert W2.DISPATCH_FMTS == frozenset({"v41"}) and W2.dispatch_on("v41") and not W2.dispatch_on("v32")
    for kw in (*plain.values(), extra):
        _public(kw)
    assert took == ["ws", "ws2", "ws"], took
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS2", "1")
    for kw in (*plain.values(), extra):
        _public(kw)
    assert took[-3:] == ["ws2", "ws2", "ws"], took
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS2", "0")
    for kw in plain.values():
        _public(kw)
    assert took[-2:] == ["ws", "ws"], took
    monkeypatch.delenv("DEEPKERNELS_SPARSE_WS2")
    monkeypatch.setattr(W, "DISPATCH", False)
    _public(plain["v41"])
    assert took[-1] == "triton"          # V4.1 without the WS kernels: Triton (the single-partition kernel is V3.2's)
