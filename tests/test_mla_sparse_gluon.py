"""Gluon sm90 sparse MLA decode kernel (deepkernels.mla._gluon_sparse_decode): compile tier on any machine, GPU tier
through the public op with the proposed dispatch patched in (``sparse_decode._launch_sparse_decode`` -> the Gluon
launcher when ``supported``), FlashMLA's sparse-decode tolerances and the data generation of
tests/test_mla_sparse_kernels.py (NaN in every unreferenced KV token, junk indices, all-invalid rows, zero-length
rows, +-inf sinks, NaN-poisoned out / lse / accumulators, several splits through the SM-count knob)."""
from __future__ import annotations

import contextlib
import inspect
import os
import re

import pytest
import torch
import triton
import triton.language as tl

import deepkernels as dk
import deepkernels.mla.sparse_decode as sd
from deepkernels.mla import _gluon_sparse_decode as G
from deepkernels.testing.numerics import check_is_allclose

from test_mla_sparse_kernels import check_batch_invariant, poison, run_and_check, sass_spill_report, sms  # noqa: F401
from test_mla_sparse_reference import TOL_LSE, TOL_OUT, _public, make_case

pytestmark = pytest.mark.skipif(not G.available(), reason=f"Gluon not importable: {G._IMPORT_ERROR!r}")


# ------------------------------------------------------------------ compile tier (CPU cross-compile for sm90)
@pytest.mark.compile
@pytest.mark.parametrize("fmt,page_shift,has_len,has_sink,xfmt", [
    ("v41", 6, True, True, None), ("v32", 6, False, True, None), ("v41", -1, False, False, None),
    ("v32", -1, True, False, None), ("v41", 6, True, True, "fp4"), ("v41", -1, True, True, "v41"),
    ("v32", 6, True, True, "v32")])
def test_compile_sm90(fmt, page_shift, has_len, has_sink, xfmt):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    k = G.compile_sm90(fmt, page_shift, has_len, has_sink, xfmt=xfmt)
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    # per warpgroup and block: S = d_qk / 16 k-steps (576 V3.2, 512 V4.1), P V = 64 / 16; the [4, 2] layouts split N,
    # so nothing is computed twice across the warpgroups
    # (twice with an extra cache: one token loop per cache)
    assert ptx.count("wgmma.mma_async") == ((576 if fmt == "v32" else 512) // 16 + 4) * (2 if xfmt else 1)
    assert k.metadata.shared <= SM90_SMEM_LIMIT
    # raw records gathered as 16-byte vectors (packed int32 words), dequantised tile stored without a layout
    # conversion through shared memory (the reshape's result already is the store layout)
    assert "ld.global.v4.b32" in ptx or "ld.global.v4.u32" in ptx
    assert not re.search(r"ttg.convert_layout %\S+ : tensor<64x512xbf16, #(\w+)> -> tensor<64x512xbf16, #(?!\1>)",
                         ttgir)
    rep = sass_spill_report(ptx)
    if rep is not None:
        spill_bytes, in_loop = rep
        # main cache alone: none in the token loop; with an extra cache (two token loops in one kernel) ptxas leaves
        # 2-3 spill instructions in each loop (measured: V4.1+FP4 2 + 3, V3.2+V3.2 2 + 2, V4.1+V4.1 0)
        assert in_loop <= (0 if xfmt is None else 6), f"{in_loop} spill instructions inside the token loops"
        assert spill_bytes <= 128, f"{spill_bytes} bytes of spills (request setup / epilogue)"


def test_launcher_has_the_triton_launch_contract():
    """Drop-in for sparse_decode._launch_sparse_decode: same parameters, same defaults, same order."""
    a = inspect.signature(G.launch_sparse_decode_gluon).parameters
    b = inspect.signature(sd._launch_sparse_decode).parameters
    assert [(n, p.default) for n, p in a.items()] == [(n, p.default) for n, p in b.items()]


def test_supported_gate_on_cpu():
    q = torch.zeros(2, 1, 64, 512, dtype=torch.bfloat16)
    c = torch.zeros(4, 64, 1, 528, dtype=torch.uint8)
    assert not G.supported(q, c, "v41")            # CPU tensors: the Triton / reference path keeps the call
    assert G._xfmt(torch.zeros(1, 1, 1, 288)) == "fp4" and "fp4" in G._EXTRA_PAIRS["v41"]
    assert "fp4" not in G._EXTRA_PAIRS["v32"] and "model1" not in G.GLUON_FMTS


# ------------------------------------------------------------------ GPU tier
@contextlib.contextmanager
def _gluon_disabled():
    old = os.environ.get("DEEPKERNELS_DISABLE_GLUON")
    os.environ["DEEPKERNELS_DISABLE_GLUON"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DEEPKERNELS_DISABLE_GLUON")
        else:
            os.environ["DEEPKERNELS_DISABLE_GLUON"] = old


@pytest.fixture
def gluon_dispatch(monkeypatch):
    """Records every Gluon launch (format per call) and makes the public op dispatch to the Gluon kernel whether or
    not sparse_decode.py carries the dispatch edit yet: without it, the edit is patched in here
    (``_launch_sparse_decode`` -> the Gluon launcher when ``supported``); with it, the public op calls
    ``_gluon_sparse_decode.launch_sparse_decode_gluon`` itself, which is the recorded wrapper."""
    calls = []
    gluon_launch, triton_launch = G.launch_sparse_decode_gluon, sd._launch_sparse_decode

    def recorded(*args, **kwargs):
        calls.append(args[8])
        return gluon_launch(*args, **kwargs)

    def launch(out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt, attn_sink=None, extra_k_cache=None,
               extra_indices=None, xfmt=None, topk_length=None, extra_topk_length=None, config=None, _spec=None):
        args = (out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt, attn_sink, extra_k_cache,
                extra_indices, xfmt, topk_length, extra_topk_length, config, _spec)
        if G.supported(q, k_cache, fmt, extra_k_cache):
            return G.launch_sparse_decode_gluon(*args)
        return triton_launch(*args)

    monkeypatch.setattr(G, "launch_sparse_decode_gluon", recorded)
    monkeypatch.setattr(G, "DISPATCH_FMTS", frozenset(G.GLUON_FMTS))   # every format the kernel supports
    from deepkernels.mla import _gluon_sparse_decode_ws as W
    monkeypatch.setattr(W, "DISPATCH", False)   # V3.2 to this (single-partition) kernel, not the WS one
    if not hasattr(sd, "_gsd"):                    # sparse_decode.py without the dispatch edit
        monkeypatch.setattr(sd, "_launch_sparse_decode", launch)
    return calls


# (s_k, topk, page): every GPU test runs with topk_length and a sink, and power-of-two pages are 64, so the whole
# tier needs 4 kernel specialisations (format x shift / division addressing): the device run is compile-bound
_SHAPES = [(2046, 2048, 64), (1024, 576, 61), (512, 64, 64), (650, 576, 53)]
GPU_GRID = [(fmt, h_q, b, s_q, s_k, topk, page)
            for (s_k, topk, page) in _SHAPES for h_q in (64, 128) for (b, s_q) in ((4, 1), (74, 3))
            for fmt in ("v32", "v41")]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,h_q,b,s_q,s_k,topk,page", GPU_GRID[::3])
def test_gpu_grid(fmt, h_q, b, s_q, s_k, topk, page, poison, gluon_dispatch):
    kw = make_case(b, s_q, h_q, fmt, topk, s_k, page, with_len=True, sink=True, device="cuda")
    run_and_check(kw)
    assert gluon_dispatch == [fmt]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["v32", "v41"])
@pytest.mark.parametrize("flags", [dict(all_invalid=True), dict(zero_len=True)])
def test_gpu_corner_cases(fmt, flags, poison, gluon_dispatch):
    kw = make_case(74, 3, 128, fmt, 576, 650, 53, with_len=True, sink=True, **flags, device="cuda")
    o, l_, _ = run_and_check(kw)
    if flags.get("all_invalid"):
        assert (o == 0).all() and torch.isposinf(l_).all()
    assert gluon_dispatch == [fmt]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["v32", "v41"])
@pytest.mark.parametrize("n_sms", [3, 8, 264, 1000])
def test_gpu_split_counts(fmt, n_sms, poison, sms, gluon_dispatch):
    """Few / many scheduler parts: requests spread over many splits (combine) or many requests per part."""
    sms(n_sms)
    kw = make_case(16, 2, 128, fmt, 2048, 4096, 64, with_len=True, sink=True, device="cuda")
    _, _, meta = run_and_check(kw)
    if n_sms >= 264:
        assert int(meta.num_splits[-1]) > 16                        # split-KV + combine really ran
    assert gluon_dispatch == [fmt]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", [("v32", None), ("v41", None), ("v41", "fp4")])
def test_gpu_dequant_bit_identical(fmt, xfmt, gluon_dispatch):
    """One valid token per row: p = exp2(0) = 1 exactly, so out = V = the dequantised record, bit for bit equal to
    bf16(fp32(e4m3) * fp32 scale) (V3.2 with non-power-of-two scales, B19), e2m1 * e4m3 (FP4 extra cache, main
    length 0). (No Triton call here: this is the device run's smoke test, it should compile only Gluon kernels.)"""
    from deepkernels.quant.kvcache import dequantize_kv_cache
    b, s_q, h_q = 8, 2, 64
    x = dict(xfmt=xfmt, xtopk=64, xpage=64, lengths=[0] * b, xlengths=[1] * b) if xfmt else dict(lengths=[1] * b)
    kw = make_case(b, s_q, h_q, fmt, 64, 4096, 64, nonpow2=fmt == "v32", device="cuda", **x)
    kw["attn_sink"] = torch.full((h_q, ), float("-inf"), device="cuda")   # a sink that changes nothing, exactly
    o, _ = _public(kw)
    assert gluon_dispatch == [fmt]
    cache, ind, f = ((kw["extra_k_cache"], kw["extra_indices_in_kvcache"], xfmt) if xfmt else
                     (kw["k_cache"], kw["indices"], fmt))
    deq = dequantize_kv_cache(cache, f).view(cache.shape[0] * cache.shape[1], -1)[:, :512]
    i0 = ind[:, :, 0].long()                                           # the one in-length position
    ok = (i0 >= 0) & (i0 < deq.shape[0])                               # (invalid when seqlen < topk drew junk)
    want = torch.where(ok[..., None], deq[i0.clamp(0, deq.shape[0] - 1)], torch.zeros_like(deq[:1]))
    assert torch.equal(o, want[:, :, None, :].expand_as(o))


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", [("v41", "fp4"), ("v41", "v41"), ("v32", "v32")])
@pytest.mark.parametrize("b,s_q,h_q,topk,xtopk,s_k", [(4, 1, 128, 2048, 512, 2046), (74, 3, 64, 576, 128, 650)])
def test_gpu_extra_cache(fmt, xfmt, b, s_q, h_q, topk, xtopk, s_k, poison, sms, gluon_dispatch):
    """Main + extra cache in one softmax (virtual line: main blocks, then extra blocks from 64 * ceil(n / 64)),
    split over several parts (the line boundary falls inside and between splits)."""
    sms(40)
    kw = make_case(b, s_q, h_q, fmt, topk, s_k, 64, xfmt=xfmt, xtopk=xtopk, xpage=64, with_len=True,
                   with_xlen=True, sink=True, device="cuda")
    run_and_check(kw)
    assert gluon_dispatch == [fmt]


@pytest.mark.gpu
def test_gpu_vs_triton_and_batch_invariant(gluon_dispatch):
    kw = make_case(74, 2, 128, "v41", 2048, 4096, 64, with_len=True, sink=True, device="cuda")
    o1, l1 = _public(kw)
    o2, l2 = _public(kw)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)                 # deterministic
    with _gluon_disabled():
        o_t, l_t = _public(kw)
    assert check_is_allclose("out vs triton", o1.float(), o_t.float(), **TOL_OUT)
    assert check_is_allclose("lse vs triton", l1, l_t, **TOL_LSE)
    check_batch_invariant(kw, o1)
    assert gluon_dispatch == ["v41"] * 4                              # the DISABLE_GLUON call took Triton


@pytest.mark.gpu
def test_gpu_stale_schedule_and_huge_logits(poison, sms, gluon_dispatch):
    sms(8)
    kw = make_case(3, 1, 64, "v32", 192, 250, 64, lengths=[192, 100, 0], sink=True, device="cuda")
    meta = dk.get_mla_metadata()[0]
    _public(dict(kw, topk_length=torch.tensor([1, 2, 3], dtype=torch.int32, device="cuda")), meta)
    run_and_check(kw, meta=meta)                                       # schedule planned for other lengths
    kw = make_case(2, 1, 64, "v41", 64, 64, 64, lengths=[64, 64], sink=True, device="cuda")
    kw["q"] = (kw["q"] * 0 + 1).bfloat16()
    kw["softmax_scale"] = 1e3
    o, l_, _ = run_and_check(kw)
    assert torch.isfinite(o).all() and torch.isfinite(l_).all()
    assert len(gluon_dispatch) == 3


@pytest.mark.gpu
def test_gpu_cuda_graph_capture(gluon_dispatch):
    kw = make_case(16, 2, 128, "v41", 512, 1024, 64, with_len=True, sink=True, device="cuda")
    meta = dk.get_mla_metadata()[0]
    o_ref, l_ref = _public(kw, meta)
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
    assert len(gluon_dispatch) == 3


# ------------------------------------------------------------------ interpreter tier: the dequant arithmetic
# Gluon has no interpreter, so this mirrors the kernel's dequant (_g_gather / _g_byte / _g_dequant_store) with tl ops
# of the same semantics (tt.join / tt.reshape are the same ops in both): packed int32 words, byte k of word w =
# element 4w + k, join(join(b0, b2), join(b1, b3)) + reshape, UE8M0 / fp32 scales per group. The final fp32 -> bf16
# rounding is done in torch (RNE, as cvt.rn.bf16x2.f32 on the GPU; the interpreter's cast truncates).
@triton.jit
def _ue8m0_mirror(e):
    e32 = e.to(tl.int32)
    bits = tl.where(e32 == 0, 0x00400000, e32 << 23)
    return tl.where(e32 == 255, float("nan"), bits.to(tl.float32, bitcast=True))


@triton.jit
def _byte_mirror(raw, sc, K: tl.constexpr):
    b = ((raw >> (8 * K)) & 0xFF).to(tl.uint8)
    return b.to(tl.float8e4nv, bitcast=True).to(tl.float32) * sc[:, :, None]


@triton.jit
def _nib_mirror(raw, sc, K: tl.constexpr, C: tl.constexpr):
    r = raw >> (8 * K + 4 * C)
    v = (((r & 7) << 22) | ((r & 8) << 28)).to(tl.float32, bitcast=True) * 8.507059173023462e37
    return v * sc[:, :, None]


@triton.jit
def _dequant_mirror_kernel(kv_ptr, idx_ptr, out_ptr, stride_kb, PAGE_SHIFT: tl.constexpr, FMT: tl.constexpr):
    G: tl.constexpr = 4 if FMT == 0 else (16 if FMT == 2 else 32)
    W: tl.constexpr = 128 // G if FMT != 3 else 2
    RB: tl.constexpr = 656 if FMT == 0 else (528 if FMT == 2 else 288)
    idx = tl.load(idx_ptr + tl.arange(0, 64))
    rec = (idx >> PAGE_SHIFT).to(tl.int64) * stride_kb + (idx & ((1 << PAGE_SHIFT) - 1)).to(tl.int64) * RB
    g = tl.arange(0, G)
    wp = (kv_ptr + rec).to(tl.pointer_type(tl.int32))
    raw = tl.load((wp[:, None] + (g * W)[None, :])[:, :, None] + tl.arange(0, W)[None, None, :])
    if FMT == 0:
        sc = tl.load((kv_ptr + rec + 512).to(tl.pointer_type(tl.float32))[:, None] + g[None, :])
    elif FMT == 2:
        sc = _ue8m0_mirror(tl.load(kv_ptr + (rec + 512)[:, None] + g[None, :]))
    else:
        sc = tl.load(kv_ptr + (rec + 256)[:, None] + g[None, :]).to(tl.float8e4nv, bitcast=True).to(tl.float32)
    if FMT == 3:
        x = tl.join(tl.join(tl.join(_nib_mirror(raw, sc, 0, 0), _nib_mirror(raw, sc, 2, 0)),
                            tl.join(_nib_mirror(raw, sc, 1, 0), _nib_mirror(raw, sc, 3, 0))),
                    tl.join(tl.join(_nib_mirror(raw, sc, 0, 1), _nib_mirror(raw, sc, 2, 1)),
                            tl.join(_nib_mirror(raw, sc, 1, 1), _nib_mirror(raw, sc, 3, 1))))
    else:
        x = tl.join(tl.join(_byte_mirror(raw, sc, 0), _byte_mirror(raw, sc, 2)),
                    tl.join(_byte_mirror(raw, sc, 1), _byte_mirror(raw, sc, 3)))
    tl.store(out_ptr + tl.arange(0, 64)[:, None] * 512 + tl.arange(0, 512)[None, :], tl.reshape(x, [64, 512]))


@pytest.mark.interpret
@pytest.mark.parametrize("fmt", ["v32", "v41", "fp4"])
def test_interpret_dequant_mirror_bit_identical(fmt):
    from deepkernels.quant.kvcache import dequantize_kv_cache
    if fmt == "fp4":   # FP4 exists only as an extra cache next to V4.1
        kw = make_case(2, 1, 64, "v41", 64, 4096, 64, xfmt="fp4", xtopk=64)
        c, ind = kw["extra_k_cache"], kw["extra_indices_in_kvcache"]
    else:
        kw = make_case(2, 1, 64, fmt, 64, 4096, 64, nonpow2=fmt == "v32")  # V3.2: non-power-of-two scales (B19)
        c, ind = kw["k_cache"], kw["indices"]
    nt = c.shape[0] * c.shape[1]
    ii = ind.flatten()
    ii = ii[(ii >= 0) & (ii < nt)]                                           # referenced tokens (others hold NaN)
    idx = ii[torch.randperm(ii.numel())[:64]].int().contiguous()
    out = torch.empty(64, 512, dtype=torch.float32)
    u = c.view(torch.uint8)
    _dequant_mirror_kernel[(1, )](u, idx, out, u.stride(0), 6, G._XFMT_CODES[fmt])
    ref = dequantize_kv_cache(c, fmt).view(nt, -1)[idx.long(), :512]
    assert torch.equal(out.bfloat16().view(torch.int16), ref.view(torch.int16))
