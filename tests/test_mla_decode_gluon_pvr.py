"""PVR option of the Gluon dense MLA decode (session 20; ``gluon_dense_launch(pvr=True)``, constexpr PVR, not
dispatched): P V_R_j issued by the PV warpgroup once the softmax warpgroup has issued all of S_{j+1} (``sissued``
mbarrier), ring slots released by column halves (part a: K_nope cols 0-255 + K_rope by the softmax warpgroup after
P V_L, part b: cols 256-511 by the PV warpgroup after P V_R). Same MMA order as the dispatched build.

Compile tier (CPU): both PVR builds (Q by TMA + TRIM, causal or not: what s_q 1 / s_q 2 would launch) compile for
sm_90a within shared memory, 168 registers, no serialised wgmma, the dispatched build's wgmma shapes, 0 spills in the
softmax / PV / producer tile loops; option-off PTX pinned; launch arguments (PVR by position, the [64, 256] K
descriptor, half tiles forced off, needs Q by TMA). GPU tier: PVR vs the dispatched build
on the same inputs and schedule, each against the reference with FlashMLA's tolerances, and the two within 2 ulp
(``test_gpu_pvr_bitid_*`` asserts exact identity separately: the device script does not gate its bench on those).
"""
from __future__ import annotations

import functools
import hashlib
import os
import re

import pytest
import torch

import deepkernels.mla.decode as dec
from deepkernels.mla import _gluon_dense_decode as G
from deepkernels.reference import mla as ref
from deepkernels.testing.compile import (SM90_SMEM_LIMIT, clean_ptx, n_hgmma, n_spill, ptxas_sm90_or_skip,
                                         sass_count, sass_loops)
from deepkernels.testing.numerics import check_is_allclose

from test_mla_decode_reference import make_case
from test_mla_decode_gluon import TOL_OUT, TOL_LSE, _case

needs_gluon = pytest.mark.skipif(not G.available(), reason=f"gluon not importable: {G._IMPORT_ERROR!r}")
_ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
needs_sm90 = pytest.mark.skipif(not (_ON_GPU and G.available() and torch.cuda.get_device_capability()[0] == 9),
                                reason="needs an sm90 GPU and Gluon")

# measured ptxas spill store bytes of the PVR builds (Triton 3.6.0 wheel's ptxas; the dispatched q_tma + trim
# builds: 16 / 16, all outside the tile loops): per causal
_SPILL_BYTES_PVR = {False: 16, True: 16}


# sha256 of the cleaned PTX of the trim-on builds (dispatched at >= 64 rows) before PVR existed (git f4b6ff9,
# Triton 3.6.0, sm_90a, GLUON_DEFAULT, bf16) per (half_tiles, q_tma, causal): with pvr off each must stay
# byte-identical (the trim-off builds are pinned by test_mla_decode_gluon_trim.py)
_PTX_SHA_TRIM = {
    (False, True, False): "3e7f413ad6a39c2706789547244aefab20c8ecfa3265c151cc0ef072ae7a7132",
    (False, True, True): "d97216ded889d586ac34d592a32795995a7b10c7081ab57946371cba2ee37d86",
    (True, True, False): "02cac261d6c108ca11d9a33fee2d143f6ef5f2f80feff0aabbbb99139af88c19",
    (True, True, True): "f113e11ab7f833f9ba0b6836fd5dc127bd6a98d1237b5093a3d8697028b28b22",
    (False, False, False): "cb6c892bde963c9e482c5a39d5e05034de30f0307bdad49df137fa59ee4ad411",
    (False, False, True): "02af27ae8b533a6c1dc154946564c1973aabd85b155e748307a4ab69d04661af",
}


# ------------------------------------------------------------------ compile tier
@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("half,qt,causal", list(_PTX_SHA_TRIM), ids=lambda v: str(int(v)))
def test_pvr_off_ptx_unchanged(half, qt, causal):
    import triton
    if triton.__version__ != "3.6.0":
        pytest.skip(f"hashes taken with Triton 3.6.0, not {triton.__version__}")
    ptx = G._compile_sm90(None, causal, "bf16", half, qt, True).asm["ptx"]
    assert hashlib.sha256(clean_ptx(ptx).encode()).hexdigest() == _PTX_SHA_TRIM[(half, qt, causal)]


@functools.lru_cache(maxsize=None)
def _compiled(causal, pvr):
    c = G._compile_sm90(None, causal, "bf16", False, True, True, pvr=pvr)
    return c.asm["ptx"], c.metadata.shared


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("causal", [False, True])
def test_pvr_compiles_for_sm90(causal):
    ptx_off, shared_off = _compiled(causal, False)
    ptx, shared = _compiled(causal, True)
    assert shared_off < shared <= SM90_SMEM_LIMIT and shared - shared_off <= 128    # 5 more mbarriers (+ alignment)
    for pat in ("wgmma.mma_async.sync.aligned.m64n64k16", "wgmma.mma_async.sync.aligned.m64n256k16",
                "wgmma.wait_group.sync.aligned", "fence.proxy.async"):
        assert ptx.count(pat) == ptx_off.count(pat), pat
    assert ptx.count("mbarrier.init.shared") == ptx_off.count("mbarrier.init.shared") + 5
    assert ".local" not in ptx
    rep = ptxas_sm90_or_skip(ptx, sass=True, cached=True, reason="no bundled ptxas/nvdisasm")
    assert "C7514" not in rep.log, "ptxas serialised the wgmmas"
    assert re.search(r"Used 168 registers", rep.log), rep.log
    assert rep.spill_bytes <= _SPILL_BYTES_PVR[causal] + 8, rep.log
    loops = sass_loops(rep.sass)
    soft = [lp for lp in loops if n_hgmma(lp) > 4]
    pv = [lp for lp in loops if n_hgmma(lp) == 4]
    prod = [lp for lp in loops if not n_hgmma(lp) and sass_count(lp, r"UTMALDG") >= 9]
    assert len(soft) == 1 and len(pv) == 1 and len(prod) == 1
    soft, pv, prod = soft[0], pv[0], prod[0]
    assert sass_count(soft, r"HGMMA\.64x64x16") == 36 and sass_count(soft, r"HGMMA\.64x256x16") == 4
    assert sass_count(prod, r"UTMALDG") == 9     # [64, 256] (4 boxes) + RoPE (part a), [64, 256] (part b)
    assert n_spill(soft) == 0 and n_spill(pv) == 0 and n_spill(prod) == 0, (n_spill(soft), n_spill(pv),
                                                                             n_spill(prod))
    # the new waits: softmax loop 2 (kready a / b) + pfree, PV loop kready b + pready + sissued
    assert sass_count(pv, r"SYNCS\.PHASECHK") >= 3 and sass_count(soft, r"SYNCS\.PHASECHK") >= 3


@needs_gluon
def test_pvr_compile_arguments():
    with pytest.raises(ValueError):
        G._compile_sm90(None, False, "bf16", True, True, True, pvr=True)      # half tiles and PVR
    with pytest.raises(ValueError):
        G._compile_sm90(None, False, "bf16", False, False, True, pvr=True)    # PVR without Q by TMA


@needs_gluon
def test_pvr_launch_arguments(monkeypatch):
    """PVR passed by position (first variant constexpr), half tiles forced off, off where Q by TMA is off, a
    launcher key of its own; the default launch takes PVR at >= 128 heads per kv head (DISPATCH_PVR_MIN_HEADS)."""
    from test_mla_decode_gluon_ring import launch_case as case, stub_launches
    fn = stub_launches(monkeypatch)
    names = [p.name for p in fn.params]
    assert names.index("HALF") == names.index("PVR") + 1 and names[-5] == "TRIM"
    G.gluon_dense_launch(*case())                                                # dispatched at h_q 128: PVR on
    x = fn.full_args(fn.log[-1])
    assert x[names.index("PVR")] is G.DISPATCH_PVR and x[names.index("QTMA")] is G.DISPATCH_Q_TMA
    G.gluon_dense_launch(*case(s_q=2))                                           # s_q 2: PVR replaces half tiles
    x = fn.full_args(fn.log[-1])
    assert x[names.index("PVR")] is G.DISPATCH_PVR and x[names.index("HALF")] is not G.DISPATCH_PVR
    G.gluon_dense_launch(*case(h_q=64))                                          # h_q 64: measured slower, off
    assert fn.full_args(fn.log[-1])[names.index("PVR")] is False
    G.gluon_dense_launch(*case(h_q=64, s_q=2))                                   # 128 rows, 64 heads: off
    x = fn.full_args(fn.log[-1])
    assert x[names.index("PVR")] is False and x[names.index("HALF")] is True
    monkeypatch.setenv("DEEPKERNELS_DENSE_DECODE_VARIANT", "0")                  # the kill switch
    G.gluon_dense_launch(*case())
    assert fn.full_args(fn.log[-1])[names.index("PVR")] is False
    monkeypatch.delenv("DEEPKERNELS_DENSE_DECODE_VARIANT")
    G.gluon_dense_launch(*case(), pvr=False)                                     # explicit off
    assert fn.full_args(fn.log[-1])[names.index("PVR")] is False
    G.gluon_dense_launch(*case(), pvr=True)
    x = fn.full_args(fn.log[-1])
    assert len(x) == len(fn.params) and x[names.index("PVR")] is True and x[names.index("QTMA")] is True
    assert x[names.index("HALF")] is False and list(x[2].block_shape) == [64, 64]
    assert list(x[names.index("kh_desc")].block_shape) == [64, 256] and x[names.index("kh_desc")].base is x[1].base
    G.gluon_dense_launch(*case(s_q=2), pvr=True)                                 # half tiles forced off
    x = fn.full_args(fn.log[-1])
    assert x[names.index("PVR")] is True and x[names.index("HALF")] is False and list(x[1].block_shape) == [64, 512]
    G.gluon_dense_launch(*case(s_q=2), half_tiles=True, pvr=True)
    assert fn.full_args(fn.log[-1])[names.index("HALF")] is False
    G.gluon_dense_launch(*case(), q_tma=False, pvr=True)                         # no Q by TMA: PVR off
    x = fn.full_args(fn.log[-1])
    assert x[names.index("PVR")] is False and x[names.index("QTMA")] is False and x[names.index("kh_desc")] is None
    G.gluon_dense_launch(*case(s_q=2, h_kv=2, h_q=128), pvr=True)                # q_tma unsupported: off
    assert fn.full_args(fn.log[-1])[names.index("PVR")] is False
    keys = [k[1][0] for k in G._LAUNCHERS]
    assert sum(("PVR", True) in k for k in keys) == 2


# ------------------------------------------------------------------ gpu tier
@pytest.fixture
def poison():
    dec._POISON_OUTPUTS = True
    yield
    dec._POISON_OUTPUTS = False


def _forward(q, k, bt, sl, causal, sched_lens=None, scale=None):
    """(dispatched build, PVR build) outputs on the same inputs and schedule."""
    from deepkernels.mla.metadata import compute_schedule
    b, s_q, h_q, _ = q.shape
    h_kv = k.shape[2]
    rows = s_q * h_q // h_kv
    assert G.supported(q, k, rows)
    scale = 576 ** -0.5 if scale is None else scale
    sched, ns = compute_schedule(sl if sched_lens is None else sched_lens, dec._num_sm_parts(q.device, rows, h_kv))
    causal = causal and s_q > 1
    res = {pvr: G.gluon_dense_forward(q, k, bt, sl, sched, ns, scale, causal, half_tiles=None, q_tma=None,
                                      trim=None, pvr=pvr) for pvr in (False, True)}
    torch.cuda.synchronize()
    return res, scale, causal


def _run(q, k, bt, sl, causal, sched_lens=None, scale=None):
    """Both builds against the reference (FlashMLA's tolerances), then PVR vs dispatched within 2 ulp but for <= 0.01 %
    of the elements (as the TRIM cross-check; exact identity: the bitid tests) (lse 1e-6
    relative, same +inf / -inf pattern)."""
    from test_mla_decode_gluon_trim import _close_ulps
    res, scale, causal = _forward(q, k, bt, sl, causal, sched_lens, scale)
    o_ref, l_ref = ref.dense_decode(q, k, bt, sl, 512, scale, causal)
    for pvr, (o, lse) in res.items():
        name = "pvr" if pvr else "dispatched"
        assert not torch.isnan(o).any() and not torch.isnan(lse).any(), f"{name}: unwritten or NaN outputs"
        assert check_is_allclose(f"out {name}", o, o_ref, *TOL_OUT)
        assert check_is_allclose(f"lse {name}", lse, l_ref, *TOL_LSE)
    (o_d, l_d), (o_p, l_p) = res[False], res[True]
    _close_ulps("out pvr vs dispatched", o_p, o_d, ulps=2, frac=1e-4)
    assert torch.equal(torch.isinf(l_p), torch.isinf(l_d)) and torch.equal(l_p == float("inf"), l_d == float("inf"))
    fin = torch.isfinite(l_d)
    d = (l_p[fin] - l_d[fin]).abs()
    assert (d <= 1e-6 * l_d[fin].abs() + 1e-6).all(), float(d.max()) if d.numel() else 0.0
    return o_p, l_p


EDGE = [0, 1, 2, 63, 64, 65, 127, 128, 129, 700, 3001]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("h_q", [64, 128])       # (< 64 rows: no Q by TMA there, so PVR is off)
def test_gpu_pvr_edge_lengths(h_q, s_q, dtype, poison):
    """Lengths 0 / 1 / 2 / 63 / 64 / 65 / 127 / 128 / 129 / ... (NaN past every end: a piece of one tile, a partial
    last tile, empty pieces), causal at s_q 2; empty rows: out 0, lse +inf."""
    torch.manual_seed(h_q * 10 + s_q)
    q, k, bt, sl = make_case(len(EDGE), s_q, h_q, 1, EDGE, dtype=dtype, device="cuda")
    o, lse = _run(q, k, bt, sl, True)
    assert (o[0] == 0).all() and (lse[0] == float("inf")).all()
    if s_q == 2:
        assert (o[1, 0] == 0).all() and (lse[1, :, 0] == float("inf")).all()


PVR_GRID = [
    (s_q, s_k, h_q, h_kv, varlen, causal)
    for s_q in (1, 2) for s_k in (140, 4096)
    for (h_q, h_kv) in ((64, 1), (128, 1), (128, 2))
    for varlen, causal in ((False, False), (True, True))
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("s_q,s_k,h_q,h_kv,varlen,causal", PVR_GRID[::2] + PVR_GRID[1::6])
def test_gpu_pvr_grid(s_q, s_k, h_q, h_kv, varlen, causal, poison):
    """b 64, varlen N(s_k, s_k / 2) with 10 % empty requests, or fixed lengths; h_kv 2 at s_q 2: no Q by TMA, so
    PVR is off there (both sides are the same build)."""
    torch.manual_seed(s_q * 100 + s_k + h_q + h_kv)
    _run(*_case(64, s_q, s_k, h_q, h_kv, varlen, zero_frac=0.1 if varlen else 0.0), causal)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("num_sms", [1, 3, 264])
def test_gpu_pvr_split_requests(num_sms, poison):
    """One CTA walking many pieces (sissued / pready phases carried across pieces, empty pieces between) and
    requests split into many pieces (pieces of one or two tiles)."""
    dec.set_mla_num_sms(num_sms)
    try:
        torch.manual_seed(num_sms)
        _run(*_case(16, 2, 1500, 128, 1, True, zero_frac=0.2), True)
        _run(*_case(5, 1, 5000, 64, 1, True), False)
    finally:
        dec.set_mla_num_sms(None)


@pytest.mark.gpu
@needs_sm90
def test_gpu_pvr_stale_schedule(poison):
    q, k, bt, sl = make_case(4, 2, 128, 1, [100, 3000, 0, 777], device="cuda")
    planned = torch.tensor([2000, 5, 900, 64], dtype=torch.int32, device="cuda")
    _run(q, k, bt, sl, True, sched_lens=planned)


@pytest.mark.gpu
@needs_sm90
def test_gpu_pvr_fp16_padded_q_pitch(poison):
    """fp16, q a [..., :576] view of 704-wide rows (Q descriptors with the 1408-B pitch)."""
    q, k, bt, sl = make_case(4, 1, 128, 1, [300, 1, 5000, 64], dtype=torch.float16)
    qb = torch.randn(4, 1, 128, 704, dtype=torch.float16)
    qb[..., :576] = q
    _run(qb.cuda()[..., :576], k.cuda(), bt.cuda(), sl.cuda(), False)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("s_q,h_q", [(1, 128), (2, 128), (1, 64)])
def test_gpu_pvr_bitid_vs_dispatched(s_q, h_q, poison):
    """Same MMA order as the dispatched build (S: NoPE 0-255, 256-511, RoPE; P V: 4 k-steps per half): out and lse
    bit-identical (informational for the device script: it does not gate the bench)."""
    torch.manual_seed(7 + s_q + h_q)
    res, _, _ = _forward(*_case(32, s_q, 3000, h_q, 1, True, zero_frac=0.1), True)
    (o_d, l_d), (o_p, l_p) = res[False], res[True]
    assert torch.equal(o_p, o_d), float((o_p.float() - o_d.float()).abs().max())
    assert torch.equal(l_p, l_d)
