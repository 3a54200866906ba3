"""WS3 sparse decode (2-CTA cluster producer sharing) with an extra cache: the opt-in extra-cache entry
``_gluon_sparse_decode_ws3._sparse_decode_gluon_ws3_x_kernel`` (module docstring, "Extra cache"; never dispatched).

Compile tier (any machine: sm90 cross-compile + ptxas / nvdisasm of the Triton wheel): per pair (V4.1 + FP4, V4.1 +
V4.1, V3.2 + V3.2) and 4 configs: shared memory, the WS2 wgmmas, the cluster PTX per producer block loop (2 bulk
pushes + 1 expect_tx in each of the main and the extra loop), the uniform-register rules (one ``%tid.x`` read, 3
``global_smem`` reads), SASS per innermost loop (softmax / PV / 2 producer loops) and spills. CPU tier: the
launcher's argument plumbing (cluster launch stubbed), bad pairs raise, h_q 64 goes to the WS kernel's extra entry.
GPU tier (``-m gpu``): through the public op with the WS launch (where extra-cache calls are dispatched) swapped for
the WS3 launcher, checked against the PyTorch reference with FlashMLA's tolerances (run_and_check: NaN in every
unreferenced cache token, junk indices, NaN-poisoned out / lse / accumulators). Not bit-identical to WS (other
consumers: WS2's split softmax / PV warpgroups)."""
from __future__ import annotations

import functools
import inspect
import re

import pytest
import torch

import deepkernels as dk
from deepkernels.mla import _gluon_sparse_decode as G
from deepkernels.mla import _gluon_sparse_decode_ws as W
from deepkernels.mla import _gluon_sparse_decode_ws3 as W3
from deepkernels.testing.compile import n_spill as _n_spill, ws_loop_roles as _ws_loop_roles

from test_mla_sparse_kernels import poison, run_and_check, sms  # noqa: F401  (fixtures)
from test_mla_sparse_reference import _public, make_case

pytestmark = pytest.mark.skipif(not W3.available(), reason=f"Gluon not importable: {W3._IMPORT_ERROR!r}")

PAIRS = [("v41", "fp4"), ("v41", "v41"), ("v32", "v32")]
# (page_shift, has_len, has_sink, xpage_shift, has_xlen)
_CONFIGS = [(6, True, True, 6, True), (-1, False, False, -1, False), (6, False, True, 4, True),
            (-1, True, False, 6, False)]
# measured (Triton 3.6 wheel, ptxas; session 18): spill instructions in the producer's main / extra block loops
# (V3.2 main: 1 in every config, as the no-extra build's 1-3), the consumers' loops 0
_PROD_SPILLS = {("v41", "fp4"): (0, 0), ("v41", "v41"): (0, 0), ("v32", "v32"): (3, 1)}
_SMEM = {"v32": 230144, "v41": 205552}


@functools.lru_cache(maxsize=None)
def _compiled(fmt, xfmt, page_shift, has_len, has_sink, xpage_shift, has_xlen):
    k = W3.compile_sm90_ws3_extra(fmt, xfmt, page_shift, has_len, has_sink, xpage_shift, has_xlen)
    return k.asm["ptx"], k.asm["ttgir"], k.metadata.shared


@pytest.mark.compile
@pytest.mark.parametrize("fmt,xfmt", PAIRS)
@pytest.mark.parametrize("cfg", _CONFIGS)
def test_compile_sm90_ws3_extra(fmt, xfmt, cfg):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT, ptxas_sm90
    ptx, ttgir, shared = _compiled(fmt, xfmt, *cfg)
    assert shared <= SM90_SMEM_LIMIT and shared <= _SMEM[fmt] + 64, shared
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16") == 8
    assert ".reqnctapercluster" not in ptx and "%clusterid" not in ptx
    # 2 bulk pushes + 1 expect_tx in each producer block loop (main, extra); the consumers' remote arrives and the
    # cluster barriers as without an extra cache
    assert ptx.count("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes") == 4
    assert ptx.count("mbarrier.expect_tx.relaxed.cta.shared::cta.b64") == 2
    assert ptx.count("mbarrier.arrive.shared::cluster.b64") == 2
    assert ptx.count("barrier.cluster.arrive.release.aligned") == 6
    assert ptx.count("fence.mbarrier_init.release.cluster") == 1
    # the uniform-register rules (module docstring): one %tid.x read, global_smem once per partition + Triton's 2
    assert ptx.count("%tid.x") == 1
    assert len(re.findall(r"mov\.u32 %r\d+, global_smem;", ptx)) == 3
    ring, ready, empty = W3._offset_args(ttgir)
    assert ring == 0 and ready + 16 == empty and empty + 16 <= shared
    rep = ptxas_sm90(ptx, sass=True)
    if rep is None:
        pytest.skip("ptxas not available")
    soft, pv, prod = _ws_loop_roles(rep.sass)
    assert len(soft) == 1 and len(pv) == 1 and len(prod) == 2, [len(lp) for lp in loops]
    assert _n_spill(soft[0]) == 0 and _n_spill(pv[0]) == 0
    # the consumers' loops are the no-extra build's (610 / 574 instructions, PV 190 / 186)
    assert len(soft[0]) <= {"v32": 620, "v41": 584}[fmt], len(soft[0])
    lim = _PROD_SPILLS[(fmt, xfmt)]
    assert _n_spill(prod[0]) <= lim[0] and _n_spill(prod[1]) <= lim[1], (_n_spill(prod[0]), _n_spill(prod[1]))
    assert not any("MEMBAR.ALL.GPU" in t for t in soft[0] + pv[0] + prod[0] + prod[1])
    assert all(sum(1 for t in lp if "UBLKCP" in t) == 2 for lp in prod)
    if xfmt == "fp4":     # 2 chunks x 4 8-byte e2m1 vectors per thread in the extra loop
        assert sum(1 for t in prod[1] if re.search(r"LDG\.E\.64", t)) == 8, [t for t in prod[1] if "LDG" in t]


@pytest.mark.compile
def test_compile_extra_bad_pair_raises():
    with pytest.raises(ValueError):
        W3.compile_sm90_ws3_extra("v32", "fp4")
    with pytest.raises(ValueError):
        W3.compile_sm90_ws3_extra("v41", "v32")


# ------------------------------------------------------------------ CPU: kernel signature, launcher plumbing
def test_x_kernel_parameters():
    """The extra entry: the WS x kernel's runtime arguments + the three shared offsets (after ``sm_scale_log2``, where
    the cluster launcher puts them), then the no-extra constexprs, then the extra ones (with defaults); the no-extra
    kernel's parameters unchanged."""
    px = W3._sparse_decode_gluon_ws3_x_kernel.params
    rt = [p.name for p in px if not p.is_constexpr]
    assert rt == [p.name for p in W._sparse_decode_gluon_ws_x_kernel.params if not p.is_constexpr] + [
        "ring_off", "ready_off", "empty_off"]
    assert rt[-4] == "sm_scale_log2"
    assert tuple(p.name for p in px if p.is_constexpr) == W3._CONSTEXPRS_X
    assert W3._CONSTEXPRS_X[:len(W3._CONSTEXPRS)] == W3._CONSTEXPRS
    assert all(p.is_constexpr for p in px[len(rt):])
    sig = inspect.signature(W3._sparse_decode_gluon_ws3_x_kernel.fn).parameters
    assert all(sig[n].default is not inspect.Parameter.empty for n in ("XPAGE_SHIFT", "HAS_XLEN", "XFMT"))
    assert [p.name for p in W3._sparse_decode_gluon_ws3_kernel.params if p.is_constexpr] == list(W3._CONSTEXPRS)
    assert W3._ClusterLauncherX({})._jit_kernel() is W3._sparse_decode_gluon_ws3_x_kernel


@pytest.fixture
def stub_cluster(monkeypatch):
    """The cluster launch and the combine stubbed (CPU): records (launcher class, meta, gx, args, scale) and the
    combine's keywords."""
    import deepkernels.mla.combine as comb
    calls, combines = [], []

    def fake_call(self, gx, args, scale_log2):
        calls.append((type(self), dict(self.meta), gx, args, scale_log2))
    monkeypatch.setattr(W3._ClusterLauncher, "__call__", fake_call)
    monkeypatch.setattr(W3, "_LAUNCHERS", {})
    monkeypatch.setattr(comb, "combine_splits_", lambda *a, **k: combines.append(k))
    return calls, combines


def test_extra_launch_goes_to_the_x_kernel(stub_cluster):
    from deepkernels.mla.metadata import SCHED_BLOCK
    calls, combines = stub_cluster
    names = [p.name for p in W3._sparse_decode_gluon_ws3_x_kernel.params if not p.is_constexpr]
    for fmt, xfmt in PAIRS:
        kw = make_case(3, 2, 128, fmt, 100, 200, 64, xfmt=xfmt, xtopk=70, xpage=16, with_len=True, with_xlen=True,
                       sink=True)
        b, s_q, h_q = kw["q"].shape[:3]
        out, lse = torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16), torch.empty(b, s_q, h_q)
        sched, ns = torch.zeros(5, 8, dtype=torch.int32), torch.zeros(b + 1, dtype=torch.int32)
        W3.launch_sparse_decode_gluon_ws3(out, lse, kw["q"], kw["k_cache"], kw["indices"], sched, ns, 0.1, fmt,
                                          kw["attn_sink"], kw["extra_k_cache"], kw["extra_indices_in_kvcache"], None,
                                          kw["topk_length"], kw["extra_topk_length"])
        cls, meta, gx, args, _ = calls[-1]
        assert cls is W3._ClusterLauncherX and gx == 5 * s_q * 2 // 2
        assert len(args) == len(names) - 4          # the scale and the 3 offsets follow in the launcher
        assert set(meta) - {"num_warps", "maxnreg"} == set(W3._CONSTEXPRS_X)
        assert meta["FMT"] == G.GLUON_FMTS[fmt] and meta["XFMT"] == {"v32": 0, "v41": 2, "fp4": 3}[xfmt]
        assert meta["HAS_XLEN"] and meta["HAS_LEN"] and meta["HAS_SINK"] and meta["SBLOCK"] == SCHED_BLOCK
        assert meta["XPAGE_SHIFT"] == 4 and meta["PAGE_SHIFT"] == 6
        assert meta["PRODUCER_REGS"] == W3.WS3_PRODUCER_REGS[fmt]
        a = dict(zip(names, args))
        assert a["xkv_ptr"].data_ptr() == kw["extra_k_cache"].data_ptr() and a["xtopk"] == 70
        assert a["xidx_ptr"] is kw["extra_indices_in_kvcache"] and a["xlen_ptr"] is kw["extra_topk_length"]
        assert a["xpage"] == 16 and a["stride_xkb"] == kw["extra_k_cache"].view(torch.uint8).stride(0)
        assert a["xnum_tok"] == kw["extra_k_cache"].shape[0] * 16 and a["topk"] == 100
        assert a["stride_xib"] == kw["extra_indices_in_kvcache"].stride(0)
        assert combines[-1]["extra_lengths"] is kw["extra_topk_length"] and combines[-1]["extra_topk"] == 70
        # without an extra cache: the no-extra entry, as before
        W3.launch_sparse_decode_gluon_ws3(out, lse, kw["q"], kw["k_cache"], kw["indices"], sched, ns, 0.1, fmt)
        cls, meta, gx, args, _ = calls[-1]
        assert cls is W3._ClusterLauncher and "XFMT" not in meta
        assert combines[-1]["extra_lengths"] is None and combines[-1]["extra_topk"] is None
    # no extra lengths: HAS_XLEN off, the dummy in its place
    kw = make_case(2, 1, 128, "v41", 64, 80, 16, xfmt="fp4", xtopk=64)
    out, lse = torch.empty(2, 1, 128, 512, dtype=torch.bfloat16), torch.empty(2, 1, 128)
    W3.launch_sparse_decode_gluon_ws3(out, lse, kw["q"], kw["k_cache"], kw["indices"],
                                      torch.zeros(3, 8, dtype=torch.int32), torch.zeros(3, dtype=torch.int32), 0.1,
                                      "v41", None, kw["extra_k_cache"], kw["extra_indices_in_kvcache"])
    assert not calls[-1][1]["HAS_XLEN"] and combines[-1]["extra_lengths"] is None


def test_extra_bad_pairs_raise_and_h_q_64_goes_to_ws(stub_cluster, monkeypatch):
    calls, _ = stub_cluster
    kw = make_case(2, 1, 128, "v32", 64, 80, 16, xfmt="v32", xtopk=64)
    for fmt, x in (("v32", "fp4"), ("v32", "v41"), ("fp4", None)):
        with pytest.raises(ValueError):
            W3.launch_sparse_decode_gluon_ws3(None, None, kw["q"], kw["k_cache"], None, None, None, 1.0, fmt,
                                              extra_k_cache=kw["extra_k_cache"], xfmt=x)
    k41 = make_case(2, 1, 128, "v41", 64, 80, 16, xfmt="v32", xtopk=64)
    with pytest.raises(ValueError):       # V4.1 main + V3.2 extra (format from the record size)
        W3.launch_sparse_decode_gluon_ws3(None, None, k41["q"], k41["k_cache"], None, None, None, 1.0, "v41",
                                          extra_k_cache=k41["extra_k_cache"])
    seen = []
    monkeypatch.setattr(W, "launch_sparse_decode_gluon_ws", lambda *a, **k: seen.append(a))
    k64 = make_case(2, 1, 64, "v41", 64, 80, 16, xfmt="fp4", xtopk=64)
    W3.launch_sparse_decode_gluon_ws3("o", "l", k64["q"], k64["k_cache"], k64["indices"], "s", "n", 1.0, "v41",
                                      None, k64["extra_k_cache"], k64["extra_indices_in_kvcache"], "fp4")
    assert len(seen) == 1 and seen[0][10] is k64["extra_k_cache"] and not calls
    assert not W3.supported_ws3(kw["q"], kw["k_cache"], "v32", extra_k_cache=kw["extra_k_cache"])  # not dispatched


# ------------------------------------------------------------------ GPU tier
@pytest.fixture
def ws3x_route(monkeypatch):
    """The public op's extra-cache calls (dispatched to the WS launcher) go to the WS3 launcher; the WS3 launcher's own
    call of the WS launcher (h_q not a multiple of 128) reaches the real one. Each WS3 launcher call is counted (its
    ``num_splits``)."""
    calls, inside = [], []
    ws_launch = W.launch_sparse_decode_gluon_ws

    def route(out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt, attn_sink=None, extra_k_cache=None,
              extra_indices=None, xfmt=None, topk_length=None, extra_topk_length=None, config=None, _spec=None):
        args = (out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt, attn_sink, extra_k_cache,
                extra_indices, xfmt, topk_length, extra_topk_length, config, _spec)
        if extra_k_cache is None or inside:
            return ws_launch(*args)
        inside.append(q.shape[2])
        try:
            W3.launch_sparse_decode_gluon_ws3(*args)
        finally:
            inside.pop()
        calls.append(num_splits)

    monkeypatch.setattr(W, "launch_sparse_decode_gluon_ws", route)
    monkeypatch.setattr(W, "DISPATCH", True)
    monkeypatch.setattr(W, "DISPATCH_EXTRA", True)
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS2", "0")
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS3", "0")
    return calls


def _ran(calls, n=1):
    assert len(calls) == n, f"{len(calls)} WS3 extra-cache launches, expected {n}"


# (h_q, b, s_q, topk, s_k, page, xtopk, xs_k, xpage, with_len, with_xlen, sink): the WS extra grid at h_q 128
_XGRID = [(128, 4, 1, 2048, 2046, 64, 512, 1024, 64, True, True, True),
          (128, 16, 2, 576, 1024, 53, 100, 300, 64, False, True, False),
          (128, 8, 1, 100, 650, 64, 650, 700, 69, True, False, True),
          (128, 74, 3, 192, 256, 64, 64, 128, 16, True, True, True)]
XPAIRS = [("v41", "fp4"), ("v32", "v32")]


def _xcase(fmt, xfmt, h_q, b, s_q, topk, s_k, page, xtopk, xs_k, xpage, with_len, with_xlen, sink, **kw):
    return make_case(b, s_q, h_q, fmt, topk, s_k, page, xfmt=xfmt, xtopk=xtopk, xs_k=xs_k, xpage=xpage,
                     with_len=with_len, with_xlen=with_xlen, sink=sink, device="cuda", **kw)


@pytest.mark.gpu
def test_gpu_ws3_extra_smoke(ws3x_route):
    """One small V4.1 + FP4 call at h_q 128 (the device script runs this first, under a hang guard)."""
    kw = _xcase("v41", "fp4", 128, 4, 1, 256, 512, 64, 128, 256, 64, True, True, True)
    run_and_check(kw)
    torch.cuda.synchronize()
    _ran(ws3x_route)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", XPAIRS)
@pytest.mark.parametrize("shape", _XGRID)
def test_gpu_ws3_extra_grid(shape, fmt, xfmt, poison, ws3x_route):
    kw = _xcase(fmt, xfmt, *shape)
    run_and_check(kw)
    _ran(ws3x_route)


@pytest.mark.gpu
def test_gpu_ws3_extra_v41_v41(poison, ws3x_route):
    kw = _xcase("v41", "v41", 128, 8, 2, 576, 1024, 64, 192, 512, 53, True, True, True)
    run_and_check(kw)
    _ran(ws3x_route)


@pytest.mark.gpu
def test_gpu_ws3_extra_h_q_64_goes_to_ws(poison, ws3x_route, monkeypatch):
    """h_q 64 (no head-block pair for a cluster): the WS3 launcher runs the call on the WS kernel's extra entry."""
    seen = []
    real = W3._ClusterLauncher.__call__
    monkeypatch.setattr(W3._ClusterLauncher, "__call__", lambda self, *a: (seen.append(1), real(self, *a)))
    kw = _xcase("v41", "fp4", 64, 16, 2, 576, 1024, 53, 100, 300, 64, False, True, False)
    run_and_check(kw)
    _ran(ws3x_route)
    assert not seen


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", XPAIRS)
@pytest.mark.parametrize("corner", ["extra_all_invalid", "main_len_zero", "extra_len_zero", "zero_len",
                                    "all_invalid"])
def test_gpu_ws3_extra_corner_cases(corner, fmt, xfmt, poison, ws3x_route):
    """All extra indices invalid (-1 / junk), main length 0 with extra tokens (the line is the extra part only),
    extra_topk_length 0 (the extra part empty), half the rows of both lists empty, everything invalid."""
    b = 16
    flags = dict(zero_len=corner == "zero_len", all_invalid=corner == "all_invalid")
    if corner == "main_len_zero":
        flags["lengths"] = [0] * b
    if corner == "extra_len_zero":
        flags["xlengths"] = [0] * b
    kw = _xcase(fmt, xfmt, 128, b, 2, 576, 650, 53, 192, 400, 64, True, True, True, **flags)
    if corner == "extra_all_invalid":
        x = kw["extra_indices_in_kvcache"]
        x.copy_(torch.where(torch.rand(x.shape, device=x.device) < 0.5, -1, 2 ** 31 - 1).to(x.dtype))
    o, l_, _ = run_and_check(kw)
    if corner == "all_invalid":
        assert (o == 0).all() and torch.isposinf(l_).all()
    _ran(ws3x_route)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", XPAIRS)
def test_gpu_ws3_extra_sink_only_rows(fmt, xfmt, poison, ws3x_route):
    """Sink with rows whose main and extra lengths are both 0 (out 0 from the sink's denominator, lse +inf) beside
    full rows."""
    b = 8
    kw = _xcase(fmt, xfmt, 128, b, 1, 256, 512, 64, 128, 256, 64, True, True, True, lengths=[0, 256] * (b // 2),
                xlengths=[0, 128] * (b // 2))
    o, l_, _ = run_and_check(kw)
    assert (o[0::2] == 0).all() and torch.isposinf(l_[0::2]).all()
    _ran(ws3x_route)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", XPAIRS)
@pytest.mark.parametrize("n_sms", [3, 264, 1000])
def test_gpu_ws3_extra_split_counts(n_sms, fmt, xfmt, poison, sms, ws3x_route):
    """Few parts (a CTA walks several requests: main + extra blocks, the ring counters running on in both CTAs) and
    many (splits of 1-2 blocks: boundaries inside the main part, at its padded end, inside the extra part)."""
    sms(n_sms)
    kw = _xcase(fmt, xfmt, 128, 16, 2, 2048, 4096, 64, 512, 2048, 64, True, True, True)
    run_and_check(kw)
    _ran(ws3x_route)
    if n_sms >= 264:
        assert int(ws3x_route[0][-1]) > 16                                     # split-KV + combine really ran


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", XPAIRS)
def test_gpu_ws3_extra_dequant_exact(fmt, xfmt, ws3x_route):
    """Main length 0, one valid extra token per row: p = 1, so out = the dequantised extra record bit for bit (both
    CTAs' halves of the columns: the local dequant and the peer's push)."""
    from deepkernels.quant.kvcache import dequantize_kv_cache
    b, s_q, h_q = 8, 2, 128
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
    _ran(ws3x_route)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", XPAIRS)
def test_gpu_ws3_extra_deterministic_and_graph_capture(fmt, xfmt, ws3x_route):
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
    _ran(ws3x_route, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", XPAIRS)
def test_gpu_ws3_extra_close_to_ws(fmt, xfmt, poison, monkeypatch):
    """Direct launches on one schedule: WS3-extra against the WS kernel (not bit-identical: other consumers) within
    FlashMLA's tolerances, no NaN."""
    kw = _xcase(fmt, xfmt, 128, 16, 1, 2048, 4096, 64, 512, 1024, 64, True, True, True)
    seen = []
    ws_launch = W.launch_sparse_decode_gluon_ws

    def both(out, lse_buf, *args):
        o3, l3 = torch.empty_like(out), torch.empty_like(lse_buf)
        ws_launch(out, lse_buf, *args)
        W3.launch_sparse_decode_gluon_ws3(o3, l3, *args)
        seen.append((out, lse_buf, o3, l3))
    monkeypatch.setattr(W, "launch_sparse_decode_gluon_ws", both)
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS3", "0")
    _public(kw)
    torch.cuda.synchronize()
    assert len(seen) == 1
    ow, lw, o3, l3 = seen[0]
    assert not torch.isnan(o3).any() and not torch.isnan(l3).any()
    torch.testing.assert_close(o3.float(), ow.float(), rtol=2e-2, atol=8e-3)
    torch.testing.assert_close(l3, lw, rtol=1e-4, atol=1e-4)


_S17 = dict(idx_ahead=False, pf_lines=False, q_async=False)     # + pf_l2 = (fmt == "v32"): the session-17 build


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", XPAIRS)
@pytest.mark.parametrize("base,variant", [("s17", "default"), ("default", "q_async")], ids=["s18_defaults", "q_async"])
def test_gpu_ws3_extra_options_bit_identical(fmt, xfmt, base, variant, poison, monkeypatch):
    """Session-18 producer / Q options through the public op's extra-cache call (forced onto WS3): the defaults
    (idx_ahead, main and extra loops; V4.1's main loop also the per-thread L2 prefetch; V3.2 Q by cp.async) against
    the session-17 build, and q_async on against off: out / lse bit-identical (lengths, sink, page 53, NaN-poisoned
    outputs)."""
    knobs = {"s17": dict(_S17, pf_l2=fmt == "v32"), "default": {}, "q_async": dict(q_async=True)}
    if base == "default" and variant == "q_async":
        knobs["default"] = dict(q_async=False)
    kw = _xcase(fmt, xfmt, 128, 16, 2, 576, 1024, 53, 192, 512, 64, True, True, True)
    seen = []
    launch = W3.launch_sparse_decode_gluon_ws3

    def both(out, lse_buf, *args):
        o1, l1 = torch.full_like(out, float("nan")), torch.full_like(lse_buf, float("nan"))
        launch(out, lse_buf, *args, **knobs[base])
        launch(o1, l1, *args, **knobs[variant])
        seen.append((out, lse_buf, o1, l1))
    monkeypatch.setattr(W3, "launch_sparse_decode_gluon_ws3", both)
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS3", "1")
    _public(kw)
    torch.cuda.synchronize()
    assert len(seen) == 1
    o0, l0, o1, l1 = seen[0]
    assert not torch.isnan(o0).any() and not torch.isnan(l0).any()
    assert torch.equal(o1, o0) and torch.equal(l1, l0)


def test_bench_extra_case_on_cpu():
    """benchmarks/sparse_decode_ws3_extra.py's case builder (CPU, tiny): the schedule counts the extra tokens, FLOPs
    FlashMLA-counted over main + extra tokens; the script does nothing without a GPU."""
    import os
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    try:
        import sparse_decode_ws3_extra as X
    finally:
        sys.path.pop(0)
    c = X.extra_case("v41", "fp4", 2, 1, 128, 256, 128, s_k=512, device="cpu")
    assert c.xcache.shape[-1] == 288 and c.xind.shape == (2, 1, 128) and c.ind.shape == (2, 1, 256)
    assert c.flop == 2 * 128 * 2 * 1 * (256 + 128) * (512 + 512)
    assert int(c.ns[-1]) >= 2 and c.sched.shape[0] == c.parts
    if not torch.cuda.is_available():
        assert X.main(["/dev/null"]) == 0
