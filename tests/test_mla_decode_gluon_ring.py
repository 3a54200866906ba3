"""The opt-in variant of the Gluon dense MLA decode (``deepkernels.mla._gluon_dense_decode``, launcher keywords
``half_tiles`` / ``q_tma``, constexprs HALF / QTMA; not dispatched).

- compile tier (CPU cross-compile for sm90): the default kernel's cleaned PTX is unchanged (hashes taken before the
  variant was added, Triton 3.6.0); every variant combination compiles with the expected barriers, TMA copies,
  wgmma counts and waits, shared memory within 227 KB, bounded ptxas spills, none in the PV loop; the launcher passes
  32-token K descriptors / Q descriptors and keys the variant apart from the default (kernel stubbed, CPU tensors).
- gpu tier: the variant against ``deepkernels.reference.mla.dense_decode`` AND against the default kernel on the same
  inputs and schedule, with the tolerances of tests/test_mla_decode_gluon.py (FlashMLA's): NaN-poisoned outputs,
  NaN in unused pages / past each end, page-boundary lengths, varlen with zero-length requests, causal s_q 2, split
  requests (few / many scheduler parts), a stale schedule, h_kv 2 (Q-by-TMA fallback), fp16 with a padded q row
  pitch, fewer than 64 rows.
"""
import functools
import hashlib
import os
import re

import pytest
import torch

import deepkernels.mla.decode as dec
from deepkernels.mla import _gluon_dense_decode as G
from deepkernels.reference import mla as ref
from deepkernels.testing.compile import (SM90_SMEM_LIMIT, clean_ptx, n_hgmma, n_spill, ptxas_sm90_or_skip, sass_count,
                                        sass_loops)
from deepkernels.testing.numerics import check_is_allclose

from test_mla_decode_reference import make_case
from test_mla_decode_gluon import TOL_OUT, TOL_LSE

needs_gluon = pytest.mark.skipif(not G.available(), reason=f"gluon not importable: {G._IMPORT_ERROR!r}")
_ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
needs_sm90 = pytest.mark.skipif(not (_ON_GPU and G.available() and torch.cuda.get_device_capability()[0] == 9),
                                reason="needs an sm90 GPU and Gluon")

VARIANTS = [(True, True), (True, False), (False, True)]       # (half_tiles, q_tma); the first is "the variant"
VID = "h{:d}q{:d}".format


# ------------------------------------------------------------------ compile tier
# sha256 of the cleaned PTX of the default kernel (GLUON_DEFAULT) before the variant existed (git 1c39d4c, Triton
# 3.6.0, sm_90a): the option must leave it byte-identical.
_BASE_PTX_SHA = {
    ("bf16", False): "44b1660e2ae43c4303698804d0522b3ef40f376ae29d08837fbf7b77c0c5eef8",
    ("bf16", True): "5a0c2050eef53d97202ee2ce9af456165c48d61c5d8c50990420d4ee3bfb7ce9",
    ("fp16", False): "f27ebc96d19c02c9008e320dfec25036776f59e300ebf0977f37596387ed8b99",
    ("fp16", True): "9ce893ed1ad8f2c6c42a9db1d9296de9bc51b53c28af33b83e0109cd20f0a30b",
}


@functools.lru_cache(maxsize=None)
def _compiled(half, qt, causal, dtype="bf16"):
    c = G._compile_sm90(None, causal, dtype, half, qt)
    return c.asm["ptx"], c.asm["ttgir"], int(c.metadata.shared)


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True])
def test_default_ptx_unchanged(dtype, causal):
    import triton
    if triton.__version__ != "3.6.0":
        pytest.skip(f"hashes taken with Triton 3.6.0, not {triton.__version__}")
    ptx, _, shared = _compiled(False, False, causal, dtype)
    assert shared == 229936
    assert hashlib.sha256(clean_ptx(ptx).encode()).hexdigest() == _BASE_PTX_SHA[(dtype, causal)]


# measured (Triton 3.6.0 wheel's ptxas, GLUON_DEFAULT config): spill store bytes per (half, q_tma, causal) and the
# spill instructions in the softmax WG's token loop / the producer's tile loop (PV loop: 0 everywhere)
_SMEM = {(True, True): 230064, (True, False): 229968, (False, True): 230032}    # measured; default 229,936
_SPILL_BYTES = {(True, True, False): 0, (True, True, True): 20, (True, False, False): 56, (True, False, True): 60,
                (False, True, False): 0, (False, True, True): 4}


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("half,qt", VARIANTS, ids=lambda v: str(v))
def test_variant_compiles_for_sm90(half, qt, causal):
    ptx, ttgir, shared = _compiled(half, qt, causal)
    assert shared <= SM90_SMEM_LIMIT and shared == _SMEM[(half, qt)], shared
    # S: 36 x m64n64k16 (576 / 16, N = 64 over both halves); P V: 4 x m64n256k16 per consumer warpgroup
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k16") == 36
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n32k16") == 0
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16") == 8
    # half tiles: P V in two commit groups, first half-slot released at wait_group 1 (once per consumer WG)
    assert ptx.count("wgmma.wait_group.sync.aligned 1") == (2 if half else 0)
    # barriers: ready/empty x (4 if half else 2) + pready/pfree (+ qready/qempty)
    assert ptx.count("mbarrier.init.shared") == (8 if half else 4) + 2 + (2 if qt else 0)
    # TMA: K = 8 NoPE boxes + 1 RoPE box per load (x2 halves), Q the same once per piece
    assert ptx.count("cp.async.bulk.tensor") == 9 * (2 if half else 1) + (9 if qt else 0)
    tx = sorted(int(x) for x in re.findall(r"expect_tx\.shared\.b64 _, \[%r\d+\], (\d+)", ptx))
    assert tx == sorted(([36864, 36864] if half else [73728]) + ([73728] if qt else []))
    # the Q stores (plain loads -> smem) and their proxy fence are gone with q_tma
    assert ptx.count("fence.proxy.async") == (2 if qt else 3)
    if half:   # both halves land inside the [64, 512] / [64, 64] slot tiles (rows 0-31 / 32-63)
        assert len(re.findall(r"async_tma_copy_global_to_local[^\n]*-> !ttg.memdesc<32x512x", ttgir)) == 2
        assert len(re.findall(r"async_tma_copy_global_to_local[^\n]*-> !ttg.memdesc<32x64x", ttgir)) == 2
    assert ".local" not in ptx
    rep = ptxas_sm90_or_skip(ptx, sass=True, cached=True, reason="no bundled ptxas/nvdisasm")
    assert "C7514" not in rep.log, "ptxas serialised the wgmmas"
    assert re.search(r"Used 168 registers", rep.log), rep.log
    assert rep.spill_bytes <= _SPILL_BYTES[(half, qt, causal)] + 8, rep.log
    loops = sass_loops(rep.sass)
    soft = [lp for lp in loops if n_hgmma(lp) > 4]
    pv = [lp for lp in loops if n_hgmma(lp) == 4]
    prod = [lp for lp in loops if not n_hgmma(lp) and sass_count(lp, r"UTMALDG") >= 9]
    assert len(soft) == 1 and len(pv) == 1 and len(prod) == 1, [len(x) for x in (soft, pv, prod)]
    assert n_spill(pv[0]) == 0
    assert n_spill(soft[0]) <= 2           # measured 0 (q_tma, non-causal) .. 2
    assert n_spill(prod[0]) <= 2           # measured 0 .. 2 (the 40-register producer)
    assert sass_count(prod[0], r"UTMALDG") == (18 if half else 9)
    assert any("HGMMA.64x64x16" in t for t in soft[0]) and any("HGMMA.64x256x16" in t for t in pv[0])


def test_q_tma_supported_layouts():
    q = torch.zeros(4, 2, 64, 576, dtype=torch.bfloat16)
    assert G.q_tma_supported(q, 1)
    assert not G.q_tma_supported(q, 2)                       # h_kv 2 with s_q 2: a block's rows are not one run
    assert G.q_tma_supported(torch.zeros(4, 1, 64, 576, dtype=torch.bfloat16), 2)   # s_q 1: a kv head's rows
    assert not G.q_tma_supported(q[:, :1], 1)                # batch stride != s_q * h_q * pitch: no row view
    wide = torch.zeros(4, 2, 64, 704, dtype=torch.bfloat16)
    assert G.q_tma_supported(wide[..., :576], 1)             # padded row pitch (1408 B)
    assert not G.q_tma_supported(q.transpose(1, 2), 1)       # [b, h, s] order: not viewable as rows
    odd = torch.zeros(4 * 2 * 64 * 577 + 1, dtype=torch.bfloat16)[1:].view(4, 2, 64, 577)[..., :576]
    assert not G.q_tma_supported(odd, 1)                     # pitch / base not 16-B aligned


def stub_launches(monkeypatch):
    """The dense decode Gluon kernel replaced by a recorder (test_launch_cache's _StandIn) and the launcher cache
    emptied, so launches run on CPU tensors: returns the stand-in (``fn.log``, ``fn.full_args``)."""
    from deepkernels import _launch
    from test_launch_cache import _StandIn
    monkeypatch.setattr(_launch, "_bindable", lambda args: True)
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(_launch, "_stream_getter", lambda: (lambda dev: 0))
    fn = _StandIn(G._mla_decode_gluon_kernel)
    monkeypatch.setattr(G, "_mla_decode_gluon_kernel", fn)
    monkeypatch.setattr(G, "_LAUNCHERS", {})
    return fn


def launch_case(b=2, s_q=1, h_q=128, h_kv=1, nb=6):
    """gluon_dense_launch's positional arguments for a CPU call against :func:`stub_launches`."""
    q = torch.randn(b, s_q, h_q, 576).to(torch.bfloat16)
    k = torch.randn(nb, 64, h_kv, 576).to(torch.bfloat16)
    bt = torch.arange(b * 3, dtype=torch.int32).view(b, 3)
    sl = torch.full((b,), 100, dtype=torch.int32)
    sched = torch.zeros(4, 8, dtype=torch.int32)
    ns = torch.zeros(b + 1, dtype=torch.int32)
    acc = b + 4
    return (q, k, bt, sl, sched, ns, 0.04, False, torch.empty(b, s_q, h_q, 512, dtype=q.dtype),
            torch.empty(b, h_q, s_q), torch.empty(acc, s_q, h_q, 512), torch.empty(acc, s_q, h_q))


@needs_gluon
def test_variant_launch_arguments(monkeypatch):
    """The variant's launch (kernel stubbed, CPU tensors): every parameter by position, 32-token K descriptors with
    half tiles, Q descriptors over q seen as rows (or None when not eligible), and a launcher key of its own; the
    default launch is as before."""
    fn = stub_launches(monkeypatch)
    monkeypatch.setattr(G, "DISPATCH_PVR", False)     # this test pins the half-tile / Q-TMA dispatch (PVR: pvr tests)
    case = launch_case

    names = [p.name for p in fn.params]
    c = case()
    G.gluon_dense_launch(*c, half_tiles=False, q_tma=False)      # the plain kernel (explicitly: None dispatches)
    full = fn.full_args(fn.log[-1])
    assert full[-4:] == (False, *G.GLUON_DEFAULT)
    assert full[names.index("qn_desc")] is None and full[names.index("HALF")] is False
    assert list(full[1].block_shape) == [64, 512]
    G.gluon_dense_launch(*c, half_tiles=True, q_tma=True)
    G.gluon_dense_launch(*case(), half_tiles=True, q_tma=True)       # same specialisation: fast
    assert [e[0] for e in fn.log] == ["slow", "slow", "fast"] and len(G._LAUNCHERS) == 2
    v = fn.full_args(fn.log[1])
    assert len(v) == len(fn.params) and fn.log[1][3] == dict(num_warps=4)   # all by position
    assert v[names.index("HALF")] is True and v[names.index("QTMA")] is True
    assert v[-4:] == (False, *G.GLUON_DEFAULT)
    kn, kp = v[1], v[2]
    assert list(kn.block_shape) == [32, 512] and list(kp.block_shape) == [32, 64] and list(kn.shape) == [384, 576]
    qn, qp = v[names.index("qn_desc")], v[names.index("qp_desc")]
    assert qn.base is c[0] and list(qn.shape) == [2 * 128, 576] and list(qn.strides) == [576, 1]
    assert list(qn.block_shape) == [64, 512] and list(qp.block_shape) == [64, 64]
    keys = [k[1][0] for k in G._LAUNCHERS]
    assert ("HALF", True) in keys[1] and ("QTMA", True) in keys[1] and ("CAUSAL", False) in keys[0]
    # not eligible for Q by TMA (h_kv 2, s_q 2): falls back to the plain Q loads, half tiles stay
    G.gluon_dense_launch(*case(s_q=2, h_kv=2), half_tiles=True, q_tma=True)
    w = fn.full_args(fn.log[-1])
    assert w[names.index("QTMA")] is False and w[names.index("qn_desc")] is None and w[names.index("HALF")]
    # Q by TMA alone: 64-token K descriptors
    G.gluon_dense_launch(*case(), q_tma=True)
    x = fn.full_args(fn.log[-1])
    assert list(x[1].block_shape) == [64, 512] and x[names.index("QTMA")] is True and not x[names.index("HALF")]
    # decode.py's launches (None): Q by TMA always, half tiles from s_q 2 (measured session 16); env 0: plain kernel
    G.gluon_dense_launch(*case())
    x = fn.full_args(fn.log[-1])
    assert x[names.index("QTMA")] is G.DISPATCH_Q_TMA and x[names.index("HALF")] is False
    G.gluon_dense_launch(*case(s_q=2))
    x = fn.full_args(fn.log[-1])
    assert x[names.index("QTMA")] is G.DISPATCH_Q_TMA and x[names.index("HALF")] is (2 >= G.DISPATCH_HALF_MIN_SQ)
    G.gluon_dense_launch(*case(s_q=2, h_kv=2))                    # no Q by TMA possible: no half tiles either
    x = fn.full_args(fn.log[-1])
    assert x[names.index("qn_desc")] is None and x[names.index("HALF")] is False
    G.gluon_dense_launch(*case(h_q=32))                           # 32 rows: the plain kernel (not measured there)
    x = fn.full_args(fn.log[-1])
    assert x[names.index("qn_desc")] is None and x[names.index("HALF")] is False
    monkeypatch.setenv("DEEPKERNELS_DENSE_DECODE_VARIANT", "0")
    G.gluon_dense_launch(*case(s_q=2))
    x = fn.full_args(fn.log[-1])
    assert x[-4:] == (False, *G.GLUON_DEFAULT) and x[names.index("qn_desc")] is None and x[names.index("HALF")] is False


# ------------------------------------------------------------------ gpu tier
@pytest.fixture
def poison():
    dec._POISON_OUTPUTS = True
    yield
    dec._POISON_OUTPUTS = False


def _run(q, k, bt, sl, causal, variant=VARIANTS[0], sched_lens=None, scale=None):
    """The variant and the default kernel on the same inputs and schedule; each against the reference, and the
    variant against the default (FlashMLA's tolerances)."""
    from deepkernels.mla.metadata import compute_schedule
    b, s_q, h_q, _ = q.shape
    h_kv = k.shape[2]
    rows = s_q * h_q // h_kv
    assert G.supported(q, k, rows)
    scale = 576 ** -0.5 if scale is None else scale
    sched, ns = compute_schedule(sl if sched_lens is None else sched_lens, dec._num_sm_parts(q.device, rows, h_kv))
    causal = causal and s_q > 1
    o_v, l_v = G.gluon_dense_forward(q, k, bt, sl, sched, ns, scale, causal, half_tiles=variant[0], q_tma=variant[1])
    o_d, l_d = G.gluon_dense_forward(q, k, bt, sl, sched, ns, scale, causal)
    torch.cuda.synchronize()
    o_ref, l_ref = ref.dense_decode(q, k, bt, sl, 512, scale, causal)
    for name, o, l in (("variant", o_v, l_v), ("default", o_d, l_d)):
        assert not torch.isnan(o).any() and not torch.isnan(l).any(), f"{name}: unwritten or NaN outputs"
        assert check_is_allclose(f"out {name}", o, o_ref, *TOL_OUT)
        assert check_is_allclose(f"lse {name}", l, l_ref, *TOL_LSE)
    assert check_is_allclose("out variant vs default", o_v, o_d, *TOL_OUT)
    assert check_is_allclose("lse variant vs default", l_v, l_d, *TOL_LSE)
    assert torch.equal(torch.isinf(l_v), torch.isinf(l_d))
    return o_v, l_v


def _case(b, s_q, s_k, h_q, h_kv, varlen, zero_frac=0.0, dtype=torch.bfloat16):
    if varlen:
        sl = torch.clamp(torch.normal(float(s_k), s_k / 2, (b,)), min=s_q).int()
    else:
        sl = torch.full((b,), s_k, dtype=torch.int32)
    if zero_frac:
        sl[torch.rand(b) < zero_frac] = 0
    return make_case(b, s_q, h_q, h_kv, sl.tolist(), dtype=dtype, device="cuda")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: VID(*v))
def test_gpu_ring_smoke_edge_lengths(variant, poison):
    """Page and half-page boundaries (0, 1, 31, 32, 33, 63, 64, 65, ...), NaN past every end, causal s_q 2."""
    torch.manual_seed(11)
    q, k, bt, sl = make_case(10, 2, 128, 1, [0, 1, 31, 32, 33, 63, 64, 65, 700, 3000], device="cuda")
    _run(q, k, bt, sl, True, variant)


GPU_GRID = [
    (b, s_q, s_k, h_q, h_kv, varlen, causal)
    for b in (2, 64) for s_q in (1, 2) for s_k in (20, 140, 4096)
    for (h_q, h_kv) in ((64, 1), (128, 1), (126, 1), (128, 2))
    for varlen, causal in ((False, False), (True, True))
    if s_q * h_q // h_kv >= 64 and not (b == 64 and s_k == 4096 and h_kv == 2)
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b,s_q,s_k,h_q,h_kv,varlen,causal", GPU_GRID[::3])
def test_gpu_ring_grid(b, s_q, s_k, h_q, h_kv, varlen, causal, poison):
    torch.manual_seed(b * 1000 + s_q * 100 + s_k + h_q)
    _run(*_case(b, s_q, s_k, h_q, h_kv, varlen), causal)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("variant", VARIANTS[1:], ids=lambda v: VID(*v))
@pytest.mark.parametrize("b,s_q,s_k,h_q,h_kv,varlen,causal", GPU_GRID[1::8])
def test_gpu_ring_grid_parts(b, s_q, s_k, h_q, h_kv, varlen, causal, variant, poison):
    """Each half of the variant alone (half tiles only / Q by TMA only) on a thinner grid."""
    torch.manual_seed(b * 1000 + s_q * 100 + s_k + h_q + 1)
    _run(*_case(b, s_q, s_k, h_q, h_kv, varlen), causal, variant)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("h_q,s_q", [(128, 1), (128, 2), (64, 1)])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: VID(*v))
def test_gpu_ring_zero_seqlens(h_q, s_q, variant, poison):
    """Varlen with half of the requests empty (pieces with no tile: Q still loaded and released)."""
    torch.manual_seed(7 + h_q + s_q)
    _run(*_case(128, s_q, 4096, h_q, 1, True, zero_frac=0.5), True, variant)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("num_sms", [1, 3, 264])
@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: VID(*v))
def test_gpu_ring_split_requests(num_sms, variant, poison):
    """Few parts: one CTA walks many requests (ring, message and Q phases carried across pieces). Many parts: every
    request split into many pieces (accumulator rows, combine)."""
    dec.set_mla_num_sms(num_sms)
    try:
        torch.manual_seed(num_sms)
        _run(*_case(16, 2, 1500, 128, 1, True, zero_frac=0.2), True, variant)
        _run(*_case(3, 1, 5000, 64, 1, True), False, variant)
    finally:
        dec.set_mla_num_sms(None)


@pytest.mark.gpu
@needs_sm90
def test_gpu_ring_stale_schedule(poison):
    q, k, bt, sl = make_case(4, 2, 128, 1, [100, 3000, 0, 777], device="cuda")
    planned = torch.tensor([2000, 5, 900, 64], dtype=torch.int32, device="cuda")
    _run(q, k, bt, sl, True, sched_lens=planned)


@pytest.mark.gpu
@needs_sm90
def test_gpu_ring_fp16_padded_q_pitch(poison):
    """fp16, q a [..., :576] view of 704-wide rows: the Q descriptors use the 1408-B pitch."""
    q, k, bt, sl = make_case(4, 2, 64, 1, [300, 1, 5000, 64], dtype=torch.float16)
    qb = torch.randn(4, 2, 64, 704, dtype=torch.float16)
    qb[..., :576] = q
    qv = qb.cuda()[..., :576]
    assert G.q_tma_supported(qv, 1)
    _run(qv, k.cuda(), bt.cuda(), sl.cuda(), True)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("h_q,s_q,h_kv", [(16, 1, 1), (32, 2, 1), (1, 1, 1), (32, 1, 2)])
def test_gpu_ring_small_rows(h_q, s_q, h_kv, poison):
    """Fewer than 64 rows: the Q tile by TMA holds other requests' rows (or TMA zero fill) past ``rows``; they are
    masked on store."""
    torch.manual_seed(h_q * 10 + s_q)
    _run(*_case(9, s_q, 700, h_q, h_kv, True), True)
