"""L2PF option of the Gluon dense MLA decode (session 20b; ``gluon_dense_launch(l2pf=True)``, constexpr L2PF, with the
PVR build only, not dispatched: :data:`DISPATCH_L2PF`): after issuing part a of tile t's K loads, the producer
prefetches the next page of the piece into L2 (``cp.async.bulk.prefetch.L2``, 64 rows x 1,152 B, two per lane), so
the later TMA loads of that page (part a one tile on, part b ~1.6 tiles on) hit L2 instead of DRAM. No math changes:
the outputs must be bit-identical to the PVR build without it (gating here).

Compile tier (CPU): both L2PF builds (Q by TMA + TRIM + PVR, causal or not) compile for sm_90a within shared memory,
168 registers, 0 spills in the three tile loops, 9 UTMALDG + 2 UBLKPF in the producer loop; the PVR build's PTX with
L2PF off pinned (= git 92039bb); launch arguments (L2PF / kpf_ptr by position, off without PVR, off by default).
GPU tier: PVR + L2PF vs PVR on the same inputs and schedule: exact identity, both against the reference with
FlashMLA's tolerances, NaN-poisoned outputs, edge lengths with NaN past every end, varlen with empty requests, split
requests, stale schedule, fp16 padded q pitch.
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

# sha256 of the cleaned PTX of the PVR builds (q_tma + trim + pvr, bf16, GLUON_DEFAULT, Triton 3.6.0) at git 92039bb,
# before L2PF existed, per causal: with l2pf off each must stay byte-identical
_PTX_SHA_PVR = {
    False: "9ab3c05138a1295f2af90caa66dd7a5861d835708f03b01550b09d066ccc131d",
    True: "cefe821c62c911a11828da273c9e0c2f7940580648edb38d6fb19f0abfcdc7c8",
}


# ------------------------------------------------------------------ compile tier
@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("causal", [False, True])
def test_l2pf_off_ptx_unchanged(causal):
    import triton
    if triton.__version__ != "3.6.0":
        pytest.skip(f"hashes taken with Triton 3.6.0, not {triton.__version__}")
    ptx = G._compile_sm90(None, causal, "bf16", False, True, True, pvr=True).asm["ptx"]
    assert hashlib.sha256(clean_ptx(ptx).encode()).hexdigest() == _PTX_SHA_PVR[causal]


@functools.lru_cache(maxsize=None)
def _compiled(causal, l2pf):
    c = G._compile_sm90(None, causal, "bf16", False, True, True, pvr=True, l2pf=l2pf)
    return c.asm["ptx"], c.metadata.shared


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("causal", [False, True])
def test_l2pf_compiles_for_sm90(causal):
    ptx_off, shared_off = _compiled(causal, False)
    ptx, shared = _compiled(causal, True)
    assert shared_off <= shared <= SM90_SMEM_LIMIT and shared - shared_off <= 64
    for pat in ("wgmma.mma_async.sync.aligned.m64n64k16", "wgmma.mma_async.sync.aligned.m64n256k16",
                "wgmma.wait_group.sync.aligned", "mbarrier.init.shared", "mbarrier.try_wait",
                "mbarrier.arrive", "cp.async.bulk.tensor"):
        assert ptx.count(pat) == ptx_off.count(pat), pat
    assert ptx.count("cp.async.bulk.prefetch.L2.global") == 2 and "cp.async.bulk.prefetch.L2" not in ptx_off
    assert ".local" not in ptx
    rep = ptxas_sm90_or_skip(ptx, sass=True, cached=True, reason="no bundled ptxas/nvdisasm")
    assert "C7514" not in rep.log, "ptxas serialised the wgmmas"
    assert re.search(r"Used 168 registers", rep.log), rep.log
    assert rep.spill_bytes <= 16 + 8, rep.log
    loops = sass_loops(rep.sass)
    soft = [lp for lp in loops if n_hgmma(lp) > 4]
    pv = [lp for lp in loops if n_hgmma(lp) == 4]
    prod = [lp for lp in loops if not n_hgmma(lp) and sass_count(lp, r"UTMALDG") >= 9]
    assert len(soft) == 1 and len(pv) == 1 and len(prod) == 1
    soft, pv, prod = soft[0], pv[0], prod[0]
    assert sass_count(soft, r"HGMMA\.64x64x16") == 36 and sass_count(soft, r"HGMMA\.64x256x16") == 4
    assert sass_count(prod, r"UTMALDG") == 9 and sass_count(prod, r"UBLKPF") == 2
    assert n_spill(soft) == 0 and n_spill(pv) == 0 and n_spill(prod) == 0, (n_spill(soft), n_spill(pv),
                                                                             n_spill(prod))


@needs_gluon
def test_l2pf_compile_arguments():
    with pytest.raises(ValueError):
        G._compile_sm90(None, False, "bf16", False, True, True, pvr=False, l2pf=True)   # L2PF without PVR


@needs_gluon
def test_l2pf_launch_arguments(monkeypatch):
    """L2PF and the cache pointer passed by position (just before PVR), off by default, off without PVR, a launcher
    key of its own."""
    from test_mla_decode_gluon_ring import launch_case as case, stub_launches
    fn = stub_launches(monkeypatch)
    names = [p.name for p in fn.params]
    assert names.index("PVR") == names.index("L2PF") + 1 and names.index("L2PF") == names.index("kpf_ptr") + 1
    assert names[-5] == "TRIM" and G.DISPATCH_L2PF is False
    G.gluon_dense_launch(*case())                                                # dispatched: PVR on, L2PF off
    x = fn.full_args(fn.log[-1])
    assert x[names.index("PVR")] is G.DISPATCH_PVR and x[names.index("L2PF")] is False
    assert x[names.index("kpf_ptr")] is None
    c = case()
    G.gluon_dense_launch(*c, pvr=True, l2pf=True)
    x = fn.full_args(fn.log[-1])
    assert len(x) == len(fn.params) and x[names.index("L2PF")] is True and x[names.index("PVR")] is True
    assert x[names.index("kpf_ptr")] is c[1]
    G.gluon_dense_launch(*case(), pvr=False, l2pf=True)                          # no PVR: off
    x = fn.full_args(fn.log[-1])
    assert x[names.index("L2PF")] is False and x[names.index("kpf_ptr")] is None
    G.gluon_dense_launch(*case(h_q=64), l2pf=True)                               # h_q 64: PVR not dispatched
    assert fn.full_args(fn.log[-1])[names.index("L2PF")] is False
    monkeypatch.setenv("DEEPKERNELS_DENSE_DECODE_VARIANT", "0")
    G.gluon_dense_launch(*case())
    assert fn.full_args(fn.log[-1])[names.index("L2PF")] is False
    keys = [k[1][0] for k in G._LAUNCHERS]
    assert sum(("L2PF", True) in k for k in keys) == 1


# ------------------------------------------------------------------ gpu tier
@pytest.fixture
def poison():
    dec._POISON_OUTPUTS = True
    yield
    dec._POISON_OUTPUTS = False


def _run(q, k, bt, sl, causal, sched_lens=None, scale=None, bitid=True):
    """PVR (l2pf off) and PVR + L2PF on the same inputs and schedule: each against the reference (FlashMLA's
    tolerances, no NaN left), then exact identity (the prefetch changes no arithmetic)."""
    from deepkernels.mla.metadata import compute_schedule
    b, s_q, h_q, _ = q.shape
    h_kv = k.shape[2]
    rows = s_q * h_q // h_kv
    assert G.supported(q, k, rows)
    scale = 576 ** -0.5 if scale is None else scale
    sched, ns = compute_schedule(sl if sched_lens is None else sched_lens, dec._num_sm_parts(q.device, rows, h_kv))
    causal = causal and s_q > 1
    res = {pf: G.gluon_dense_forward(q, k, bt, sl, sched, ns, scale, causal, half_tiles=False, q_tma=True,
                                     trim=True, pvr=True, l2pf=pf) for pf in (False, True)}
    torch.cuda.synchronize()
    o_ref, l_ref = ref.dense_decode(q, k, bt, sl, 512, scale, causal)
    for pf, (o, lse) in res.items():
        name = "l2pf" if pf else "pvr"
        assert not torch.isnan(o).any() and not torch.isnan(lse).any(), f"{name}: unwritten or NaN outputs"
        assert check_is_allclose(f"out {name}", o, o_ref, *TOL_OUT)
        assert check_is_allclose(f"lse {name}", lse, l_ref, *TOL_LSE)
    (o_0, l_0), (o_1, l_1) = res[False], res[True]
    if bitid:
        assert torch.equal(o_1, o_0), float((o_1.float() - o_0.float()).abs().max())
        assert torch.equal(l_1, l_0)
    return o_1, l_1


EDGE = [0, 1, 2, 63, 64, 65, 127, 128, 129, 700, 3001]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("h_q", [64, 128])
def test_gpu_l2pf_edge_lengths(h_q, s_q, dtype, poison):
    """Lengths 0 / 1 / 2 / 63 / 64 / 65 / 127 / 128 / 129 / 700 / 3001 (NaN past every end: pieces of one tile,
    no next page to prefetch, partial last tiles), causal at s_q 2; empty rows: out 0, lse +inf."""
    torch.manual_seed(h_q * 10 + s_q)
    q, k, bt, sl = make_case(len(EDGE), s_q, h_q, 1, EDGE, dtype=dtype, device="cuda")
    o, lse = _run(q, k, bt, sl, True)
    assert (o[0] == 0).all() and (lse[0] == float("inf")).all()
    if s_q == 2:
        assert (o[1, 0] == 0).all() and (lse[1, :, 0] == float("inf")).all()


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("s_q,s_k,h_q,varlen,causal", [
    (1, 4096, 128, True, False), (2, 4096, 128, True, True), (1, 140, 64, True, False), (2, 4096, 64, False, False),
    (1, 4096, 128, False, False)])
def test_gpu_l2pf_grid(s_q, s_k, h_q, varlen, causal, poison):
    """b 64, varlen N(s_k, s_k / 2) with 10 % empty requests, or fixed lengths."""
    torch.manual_seed(s_q * 100 + s_k + h_q)
    _run(*_case(64, s_q, s_k, h_q, 1, varlen, zero_frac=0.1 if varlen else 0.0), causal)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("num_sms", [1, 3, 264])
def test_gpu_l2pf_split_requests(num_sms, poison):
    """One CTA walking many pieces (empty pieces between) and requests split into pieces of one or two tiles (the
    prefetch stays inside the piece)."""
    dec.set_mla_num_sms(num_sms)
    try:
        torch.manual_seed(num_sms)
        _run(*_case(16, 2, 1500, 128, 1, True, zero_frac=0.2), True)
        _run(*_case(5, 1, 5000, 64, 1, True), False)
    finally:
        dec.set_mla_num_sms(None)


@pytest.mark.gpu
@needs_sm90
def test_gpu_l2pf_stale_schedule(poison):
    q, k, bt, sl = make_case(4, 2, 128, 1, [100, 3000, 0, 777], device="cuda")
    planned = torch.tensor([2000, 5, 900, 64], dtype=torch.int32, device="cuda")
    _run(q, k, bt, sl, True, sched_lens=planned)


@pytest.mark.gpu
@needs_sm90
def test_gpu_l2pf_fp16_padded_q_pitch(poison):
    """fp16, q a [..., :576] view of 704-wide rows (Q descriptors with the 1408-B pitch)."""
    q, k, bt, sl = make_case(4, 1, 128, 1, [300, 1, 5000, 64], dtype=torch.float16)
    qb = torch.randn(4, 1, 128, 704, dtype=torch.float16)
    qb[..., :576] = q
    _run(qb.cuda()[..., :576], k.cuda(), bt.cuda(), sl.cuda(), False)


@pytest.mark.gpu
@needs_sm90
def test_gpu_l2pf_block_table_past_end(poison):
    """Block-table columns past ceil(len / 64) hold huge / negative page ids (never read, nor prefetched); the
    pages not referenced are NaN-filled."""
    torch.manual_seed(5)
    q, k, bt, sl = make_case(6, 1, 128, 1, [64, 65, 1, 0, 2000, 129], device="cuda")
    bt = bt.clone()
    for i, n in enumerate(sl.tolist()):
        bt[i, -(-n // 64):] = 2 ** 30 if i % 2 else -(2 ** 30)
    used = set(int(p) for i, n in enumerate(sl.tolist()) for p in bt[i, :-(-n // 64)].tolist())
    unused = [p for p in range(k.shape[0]) if p not in used]
    if unused:
        k[torch.tensor(unused, device=k.device)] = float("nan")
    _run(q, k, bt, sl, False)
