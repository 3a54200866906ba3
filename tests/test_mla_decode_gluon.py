"""Gluon warp-specialised dense MLA decode (``deepkernels.mla._gluon_dense_decode``), every row count.

- compile tier: every candidate config (and causal) cross-compiles for sm90 on the CPU: wgmma, TMA bulk copies,
  mbarriers, ``setmaxnreg`` (warp-specialised), shared memory within 227 KB, no local memory in the PTX, ptxas
  spills only outside the KV loop (bounded), no serialised wgmma (C7514).
- gpu tier: FlashMLA tolerances (out 8e-4 / 2.01/128 / cos 5e-6, lse 1e-6 / 8.01/65536) against
  ``deepkernels.reference.mla.dense_decode`` on FlashMLA-style data (randn/10, NaN in unused KV pages and past
  each sequence's end, 2147480000 in unused block-table slots, outputs poisoned with NaN), zero-length requests,
  varlen, causal s_q 2, h_q 64 / 126 / 128, h_kv 1 / 2, few and many scheduler parts, a stale schedule, fp16.
Everything skips cleanly on a CPU box, under the interpreter, or when Gluon is not importable.
"""
import os

import pytest
import torch

import deepkernels.mla.decode as dec
from deepkernels.mla import _gluon_dense_decode as G
from deepkernels.reference import mla as ref
from deepkernels.testing.compile import SM90_SMEM_LIMIT, ptxas_sm90_or_skip
from deepkernels.testing.numerics import check_is_allclose

from test_mla_decode_reference import make_case

needs_gluon = pytest.mark.skipif(not G.available(), reason=f"gluon not importable: {G._IMPORT_ERROR!r}")
_ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
needs_sm90 = pytest.mark.skipif(not (_ON_GPU and G.available() and torch.cuda.get_device_capability()[0] == 9),
                                reason="needs an sm90 GPU and Gluon")

TOL_OUT = (8e-4, 2.01 / 128, 5e-6)
MAIN_CFGS = G.GLUON_CANDIDATES           # every candidate runs the whole correctness grid
CFG_ID = "s{}_r{}_{}".format
TOL_LSE = (1e-6, 8.01 / 65536)


# ------------------------------------------------------------------ compile tier
@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("cfg", G.GLUON_CANDIDATES, ids=lambda c: CFG_ID(*c))
@pytest.mark.parametrize("causal", [False, True])
def test_gluon_decode_compiles_for_sm90(cfg, causal):
    c = G._compile_sm90(cfg, causal)
    ptx, ttgir = c.asm["ptx"], c.asm["ttgir"]
    assert "wgmma.mma_async" in ptx
    assert "cp.async.bulk.tensor" in ptx
    assert "mbarrier.try_wait" in ptx or "mbarrier.wait" in ptx
    assert "ttg.warp_specialize" in ttgir and "setmaxnreg" in ptx
    assert int(c.metadata.shared) <= SM90_SMEM_LIMIT
    assert ".local" not in ptx
    rep = ptxas_sm90_or_skip(ptx, sass=True, reason="no bundled ptxas/nvdisasm")
    assert "C7514" not in rep.log, "ptxas serialised the wgmmas"
    # a few scalars of the per-request setup spill at the 168-register cap (Triton pads 9 warps to 384 threads);
    # SASS (notes) shows them outside the tile loop. Bound them so a regression that spills the accumulators fails.
    assert rep.spill_bytes <= 64, rep.log
    assert any("HGMMA.64x64x16" in ln for ln in rep.sass.splitlines()), "no 64x64 wgmma (S = Q K^T) in SASS"
    assert any("HGMMA.64x256x16" in ln for ln in rep.sass.splitlines()), "no 64x256 wgmma (P V) in SASS"


def test_gluon_gate_refuses_cpu_and_other_pages():
    q = torch.zeros(1, 1, 128, 576, dtype=torch.bfloat16)
    k = torch.zeros(4, 64, 1, 576, dtype=torch.bfloat16)
    assert not G.supported(q, k, 128)      # CPU tensors
    assert not G.supported(q, k, 32)
    assert not G.supported(q, torch.zeros(4, 32, 1, 576, dtype=torch.bfloat16), 128)


# ------------------------------------------------------------------ gpu tier
@pytest.fixture
def poison():
    dec._POISON_OUTPUTS = True
    yield
    dec._POISON_OUTPUTS = False


def _run(q, k, bt, sl, causal, scale=None, sched_lens=None, config=None, tol_out=TOL_OUT, tol_lse=TOL_LSE):
    from deepkernels.mla.metadata import compute_schedule
    b, s_q, h_q, _ = q.shape
    h_kv = k.shape[2]
    rows = s_q * h_q // h_kv
    assert G.supported(q, k, rows)
    scale = 576 ** -0.5 if scale is None else scale
    sched, ns = compute_schedule(sl if sched_lens is None else sched_lens, dec._num_sm_parts(q.device, rows, h_kv))
    o, l = G.gluon_dense_forward(q, k, bt, sl, sched, ns, scale, causal and s_q > 1, config)
    torch.cuda.synchronize()
    o_ref, l_ref = ref.dense_decode(q, k, bt, sl, 512, scale, causal)     # on the GPU (fp32 math)
    assert not torch.isnan(o).any() and not torch.isnan(l).any(), "unwritten or NaN outputs"
    assert check_is_allclose("out", o, o_ref, *tol_out)
    assert check_is_allclose("lse", l, l_ref, *tol_lse)
    return o, l


def _case(b, s_q, s_k, h_q, h_kv, varlen, zero_frac=0.0, dtype=torch.bfloat16):
    if varlen:
        sl = torch.clamp(torch.normal(float(s_k), s_k / 2, (b,)), min=s_q).int()
    else:
        sl = torch.full((b,), s_k, dtype=torch.int32)
    if zero_frac:
        sl[torch.rand(b) < zero_frac] = 0
    return make_case(b, s_q, h_q, h_kv, sl.tolist(), dtype=dtype, device="cuda")


GPU_GRID = [
    (b, s_q, s_k, h_q, h_kv, varlen, causal)
    for b in (2, 64) for s_q in (1, 2) for s_k in (20, 140, 4096)
    for (h_q, h_kv) in ((64, 1), (128, 1), (126, 1), (128, 2))
    for varlen, causal in ((False, False), (True, True))
    if s_q * h_q // h_kv >= 64 and not (b == 64 and s_k == 4096 and h_kv == 2)
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cfg", MAIN_CFGS, ids=lambda c: CFG_ID(*c))
@pytest.mark.parametrize("b,s_q,s_k,h_q,h_kv,varlen,causal", GPU_GRID[::2])
def test_gpu_gluon_grid(b, s_q, s_k, h_q, h_kv, varlen, causal, cfg, poison):
    torch.manual_seed(b * 1000 + s_q * 100 + s_k + h_q)
    _run(*_case(b, s_q, s_k, h_q, h_kv, varlen), causal, config=cfg)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("h_q,s_q", [(128, 1), (128, 2), (64, 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cfg", MAIN_CFGS, ids=lambda c: CFG_ID(*c))
def test_gpu_gluon_zero_seqlens(h_q, s_q, causal, cfg, poison):
    torch.manual_seed(7)
    _run(*_case(128, s_q, 4096, h_q, 1, True, zero_frac=0.5), causal, config=cfg)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cfg", G.GLUON_CANDIDATES, ids=lambda c: CFG_ID(*c))
def test_gpu_gluon_every_config_edge_lengths(cfg, poison):
    """Lengths at page boundaries (0, 1, 63, 64, 65, ...), NaN past every end; both kernel variants."""
    q, k, bt, sl = make_case(8, 2, 128, 1, [0, 1, 63, 64, 65, 700, 1500, 3000], device="cuda")
    _run(q, k, bt, sl, True, config=cfg)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("num_sms", [1, 3, 264, 1000])
@pytest.mark.parametrize("cfg", MAIN_CFGS, ids=lambda c: CFG_ID(*c))
def test_gpu_gluon_many_and_few_parts(num_sms, cfg, poison):
    """Few parts: one CTA walks many requests (ring and message phases carried across pieces). Many parts: every
    request split into many pieces (accumulator rows, combine)."""
    dec.set_mla_num_sms(num_sms)
    try:
        torch.manual_seed(num_sms)
        _run(*_case(16, 2, 1500, 128, 1, True, zero_frac=0.2), True, config=cfg)
        _run(*_case(3, 1, 5000, 64, 1, True), False, config=cfg)
    finally:
        dec.set_mla_num_sms(None)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cfg", MAIN_CFGS, ids=lambda c: CFG_ID(*c))
def test_gpu_gluon_stale_schedule(cfg, poison):
    """Schedule planned for other lengths of the same batch: splits are clamped to the actual lengths and each
    request's last split runs to its actual end."""
    q, k, bt, sl = make_case(4, 2, 128, 1, [100, 3000, 0, 777], device="cuda")
    planned = torch.tensor([2000, 5, 900, 64], dtype=torch.int32, device="cuda")
    _run(q, k, bt, sl, True, sched_lens=planned, config=cfg)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cfg", MAIN_CFGS, ids=lambda c: CFG_ID(*c))
def test_gpu_gluon_noncontiguous_q_fp16(cfg, poison):
    q, k, bt, sl = make_case(4, 2, 64, 1, [300, 1, 5000, 64], dtype=torch.float16)
    qb = torch.randn(4, 2, 64, 704, dtype=torch.float16)
    qb[..., :576] = q
    _run(qb[..., :576].cuda(), k.cuda(), bt.cuda(), sl.cuda(), True, config=cfg)


@pytest.mark.gpu
@needs_sm90
def test_gpu_gluon_huge_logits():
    q, k, bt, sl = make_case(2, 1, 128, 1, [100, 700], nan_unused=False, device="cuda")
    q.fill_(0.5)
    k.fill_(0.5)
    from deepkernels.mla.metadata import compute_schedule
    sched, ns = compute_schedule(sl, dec._num_sm_parts(q.device, 128, 1))
    o, l = G.gluon_dense_forward(q * 64, k * 64, bt, sl, sched, ns, 576 ** -0.5, False)
    torch.cuda.synchronize()
    assert torch.isfinite(l).all() and not torch.isnan(o).any()
    assert torch.allclose(o.float(), torch.full_like(o.float(), 32.0), rtol=1e-2)   # mean of identical V rows


@pytest.mark.gpu
@needs_sm90
def test_gpu_gluon_matches_triton_path_bench_shape(poison):
    """One benchmark-like batch (b=32, s_q=2, varlen 2048, causal): Gluon and the Triton kernel agree."""
    torch.manual_seed(3)
    q, k, bt, sl = _case(32, 2, 2048, 128, 1, True)
    o, l = _run(q, k, bt, sl, True)
    from deepkernels.mla.metadata import compute_schedule
    cfg = dec._pick_config(256)
    sched, ns = compute_schedule(sl, dec._num_sm_parts(q.device, 256, 1, cfg))
    o2, l2 = dec._dense_launch(q, k, bt, sl, sched, ns, 576 ** -0.5, True, cfg)
    assert check_is_allclose("out vs triton", o, o2, *TOL_OUT)
    assert check_is_allclose("lse vs triton", l, l2, *TOL_LSE)


@pytest.mark.gpu
@needs_sm90
def test_gpu_public_op_dispatches_to_gluon(monkeypatch, poison):
    """flash_mla_with_kvcache runs the Gluon kernel on sm90 (rows >= 64 and fewer); DEEPKERNELS_DISABLE_GLUON=1
    brings back the Triton kernel (same results within FlashMLA's tolerances); page size 32 keeps Triton."""
    import deepkernels as dk
    calls = []
    orig = G.gluon_dense_launch

    def counted(*a, **kw):
        calls.append(1)
        return orig(*a, **kw)

    monkeypatch.setattr(G, "gluon_dense_launch", counted)
    q, k, bt, sl = make_case(4, 2, 64, 1, [300, 1, 5000, 64], device="cuda")
    o_ref, l_ref = ref.dense_decode(q, k, bt, sl, 512, None, True)
    outs = []
    for disable in ("0", "1"):
        monkeypatch.setenv("DEEPKERNELS_DISABLE_GLUON", disable)
        n = len(calls)
        meta, _ = dk.get_mla_metadata()
        o, l = dk.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
        torch.cuda.synchronize()
        assert (len(calls) > n) == (disable == "0")
        assert check_is_allclose("out", o, o_ref, *TOL_OUT) and check_is_allclose("lse", l, l_ref, *TOL_LSE)
        outs.append(o)
    assert check_is_allclose("gluon vs triton", outs[0], outs[1], *TOL_OUT)
    q16, k16, bt16, sl16 = make_case(2, 1, 16, 1, [100, 700], device="cuda")     # 16 rows: Gluon, padded tile
    monkeypatch.setenv("DEEPKERNELS_DISABLE_GLUON", "0")
    n = len(calls)
    meta, _ = dk.get_mla_metadata()
    o16, l16 = dk.flash_mla_with_kvcache(q16, k16, bt16, sl16, 512, meta)
    assert len(calls) == n + 1
    r16, rl16 = ref.dense_decode(q16, k16, bt16, sl16, 512, None, False)
    assert check_is_allclose("out", o16, r16, *TOL_OUT) and check_is_allclose("lse", l16, rl16, *TOL_LSE)


@pytest.mark.gpu
@needs_sm90
def test_gpu_gluon_cuda_graph_capture():
    """The public op on the Gluon path (TMA descriptors passed by value) is capturable and replays correctly."""
    import deepkernels as dk
    q, k, bt, sl = make_case(8, 1, 128, 1, [100, 2000, 0, 64, 65, 1, 4096, 300], device="cuda")
    meta, _ = dk.get_mla_metadata()
    dk.flash_mla_with_kvcache(q, k, bt, sl, 512, meta)       # warm up / compile
    meta2, _ = dk.get_mla_metadata()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, l = dk.flash_mla_with_kvcache(q, k, bt, sl, 512, meta2)
    g.replay()
    torch.cuda.synchronize()
    o_ref, l_ref = ref.dense_decode(q, k, bt, sl, 512)
    assert check_is_allclose("out", o, o_ref, *TOL_OUT) and check_is_allclose("lse", l, l_ref, *TOL_LSE)


# rows < 64 (h_q 16 / 32 bandwidth regime): the kernel masks query rows past `rows` on load and store, so it runs
# with a padded 64-row tile. The public gate (G.MIN_ROWS) decides whether these shapes are dispatched; this grid
# checks the kernel itself on them, with the schedule the Triton path would plan (2 parts per SM) and one part per SM.
SMALL_GRID = [
    (b, s_q, s_k, h_q, h_kv, varlen, causal)
    for b in (3, 64) for s_q in (1, 2) for s_k in (20, 140, 4096)
    for (h_q, h_kv) in ((16, 1), (32, 1), (1, 1), (9, 1), (32, 2))
    for varlen, causal in ((False, False), (True, True))
    if s_q * h_q // h_kv < 64
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("parts_rows", ["triton", "gluon"])
@pytest.mark.parametrize("b,s_q,s_k,h_q,h_kv,varlen,causal", SMALL_GRID[::3])
def test_gpu_gluon_small_rows(b, s_q, s_k, h_q, h_kv, varlen, causal, parts_rows, poison):
    from deepkernels.mla.metadata import compute_schedule
    torch.manual_seed(b * 1000 + s_q * 100 + s_k + h_q)
    q, k, bt, sl = _case(b, s_q, s_k, h_q, h_kv, varlen)
    rows = s_q * h_q // h_kv
    plan_rows = rows if parts_rows == "triton" else 64
    sched, ns = compute_schedule(sl, dec._num_sm_parts(q.device, plan_rows, h_kv))
    scale = 576 ** -0.5
    o, l = G.gluon_dense_forward(q, k, bt, sl, sched, ns, scale, causal and s_q > 1)
    torch.cuda.synchronize()
    o_ref, l_ref = ref.dense_decode(q, k, bt, sl, 512, scale, causal)
    assert not torch.isnan(o).any() and not torch.isnan(l).any(), "unwritten or NaN outputs"
    assert check_is_allclose("out", o, o_ref, *TOL_OUT)
    assert check_is_allclose("lse", l, l_ref, *TOL_LSE)
