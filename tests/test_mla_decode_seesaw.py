"""Seesaw variant of the Gluon dense MLA decode (``deepkernels.mla._gluon_dense_decode_seesaw``, issue #5).

- compile tier (CPU): cross-compiles for sm90 (bf16 / fp16, causal or not): wgmma (S 64x64 and P V 64x256 in
  SASS: both math warpgroups issue both), TMA, mbarriers, ``setmaxnreg``, shared memory within 227 KB, no local
  memory in the PTX, no serialised wgmma (C7514), ptxas spills bounded.
- gpu tier: the same data and tolerances as tests/test_mla_decode_gluon.py (FlashMLA tolerances against
  ``deepkernels.reference.mla.dense_decode``: NaN in unused pages / past each end, poisoned outputs, zero-length
  requests, varlen, causal s_q 2, h_q 64 / 126 / 128, h_kv 1 / 2, page-boundary lengths (0, 1 and 2 tiles, odd /
  even tile counts), few and many scheduler parts, a stale schedule, fp16, non-contiguous q), and agreement with
  today's Gluon kernel on the same schedule (close, not bit-identical: the rescale order differs).
"""
import os
import random

import pytest
import torch

import deepkernels.mla.decode as dec
from deepkernels.mla import _gluon_dense_decode as G
from deepkernels.mla import _gluon_dense_decode_seesaw as SW
from deepkernels.reference import mla as ref
from deepkernels.testing.compile import SM90_SMEM_LIMIT, ptxas_sm90
from deepkernels.testing.numerics import check_is_allclose

from test_mla_decode_gluon import GPU_GRID, _case   # the Gluon kernel's GPU grid and case builder
from test_mla_decode_reference import make_case

needs_gluon = pytest.mark.skipif(not G.available(), reason=f"gluon not importable: {G._IMPORT_ERROR!r}")
_ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
needs_sm90 = pytest.mark.skipif(not (_ON_GPU and G.available() and torch.cuda.get_device_capability()[0] == 9),
                                reason="needs an sm90 GPU and Gluon")

TOL_OUT = (8e-4, 2.01 / 128, 5e-6)
TOL_LSE = (1e-6, 8.01 / 65536)
# ptxas at the 168-register cap (Triton pads the 9 warps to 384 threads): measured 252 B of spill stores for the
# seesaw kernel (per-piece scalars and a few TMA/wgmma descriptor words that are reloaded per tile). A regression
# that spills the accumulators (128 registers per warpgroup) would be >= 512 B.
SPILL_LIMIT = 320
CFG_ID = "order{0[3]}".format
CFGS = SW.SEESAW_CANDIDATES           # edge lengths, parts, rising max, stale schedule: every order
CFGS_MAIN = [SW.SEESAW_DEFAULT]      # the grid, zero lengths, fp16: the default order only (device time)


# ------------------------------------------------------------------ compile tier
@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("cfg", SW.SEESAW_CANDIDATES, ids=lambda c: CFG_ID(c))
@pytest.mark.parametrize("causal,dtype", [(False, "bf16"), (True, "bf16"), (True, "fp16")])
def test_seesaw_compiles_for_sm90(causal, dtype, cfg):
    c = SW.compile_sm90(cfg, causal, dtype)
    ptx, ttgir = c.asm["ptx"], c.asm["ttgir"]
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert "mbarrier.try_wait" in ptx or "mbarrier.wait" in ptx
    assert "ttg.warp_specialize" in ttgir and "setmaxnreg" in ptx
    assert int(c.metadata.shared) <= SM90_SMEM_LIMIT
    assert ".local" not in ptx
    # both math warpgroups issue S (36 k-steps of m64n64k16: 32 nope + 4 rope) and P V (4 k-steps of m64n256k16)
    n64 = ptx.count("wgmma.mma_async.sync.aligned.m64n64k16")
    n256 = ptx.count("wgmma.mma_async.sync.aligned.m64n256k16")
    assert n64 >= 2 * 36 and n64 % 36 == 0, n64
    assert n256 >= 2 * 4 * 2 and n256 % 4 == 0, n256
    rep = ptxas_sm90(ptx, sass=True)
    if rep is None:
        pytest.skip("no bundled ptxas/nvdisasm")
    assert "C7514" not in rep.log, "ptxas serialised the wgmmas"
    assert rep.spill_bytes <= SPILL_LIMIT, rep.log
    if cfg[3] == 1:     # order 1 leaves nothing in flight across the softmax: no injected waits (order 0 / 2: one)
        assert "C7517" not in rep.log, rep.log
    sass = rep.sass.splitlines()
    assert any("HGMMA.64x64x16" in ln for ln in sass)
    assert any("HGMMA.64x256x16" in ln for ln in sass)


def test_seesaw_gate_is_todays_gate():
    q = torch.zeros(1, 1, 128, 576, dtype=torch.bfloat16)
    k = torch.zeros(4, 64, 1, 576, dtype=torch.bfloat16)
    assert not SW.supported(q, k, 128)      # CPU tensors
    assert SW.supported(q, k, 128) == G.supported(q, k, 128)
    assert not SW.supported(q, torch.zeros(4, 32, 1, 576, dtype=torch.bfloat16), 128)


def test_seesaw_launcher_signature_matches():
    import inspect
    a = list(inspect.signature(G.gluon_dense_launch).parameters)
    b = list(inspect.signature(SW.gluon_dense_launch_seesaw).parameters)
    assert a == b


# ------------------------------------------------------------------ gpu tier
@pytest.fixture
def poison():
    dec._POISON_OUTPUTS = True
    yield
    dec._POISON_OUTPUTS = False


def _run(q, k, bt, sl, causal, scale=None, sched_lens=None, vs_today=True, config=None):
    from deepkernels.mla.metadata import compute_schedule
    b, s_q, h_q, _ = q.shape
    h_kv = k.shape[2]
    rows = s_q * h_q // h_kv
    assert SW.supported(q, k, rows)
    scale = 576 ** -0.5 if scale is None else scale
    sched, ns = compute_schedule(sl if sched_lens is None else sched_lens, dec._num_sm_parts(q.device, rows, h_kv))
    c = causal and s_q > 1
    o, l = SW.gluon_dense_forward_seesaw(q, k, bt, sl, sched, ns, scale, c, config)
    torch.cuda.synchronize()
    o_ref, l_ref = ref.dense_decode(q, k, bt, sl, 512, scale, causal)
    assert not torch.isnan(o).any() and not torch.isnan(l).any(), "unwritten or NaN outputs"
    assert check_is_allclose("out", o, o_ref, *TOL_OUT)
    assert check_is_allclose("lse", l, l_ref, *TOL_LSE)
    if vs_today:
        o2, l2 = G.gluon_dense_forward(q, k, bt, sl, sched, ns, scale, c)
        torch.cuda.synchronize()
        assert check_is_allclose("out vs today's gluon", o, o2, *TOL_OUT)
        assert check_is_allclose("lse vs today's gluon", l, l2, *TOL_LSE)
    return o, l


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cfg", CFGS, ids=CFG_ID)
def test_gpu_seesaw_edge_lengths(cfg, poison):
    """Lengths at page boundaries: 0, 1 and 2 tiles, odd and even tile counts (which warpgroup owns the last
    tile), NaN past every end; the smoke test of the device script (a hang shows here first)."""
    q, k, bt, sl = make_case(10, 2, 128, 1, [0, 1, 63, 64, 65, 128, 129, 700, 1500, 3000], device="cuda")
    _run(q, k, bt, sl, True, config=cfg)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("b,s_q,s_k,h_q,h_kv,varlen,causal", GPU_GRID[::3])
@pytest.mark.parametrize("cfg", CFGS_MAIN, ids=CFG_ID)
def test_gpu_seesaw_grid(b, s_q, s_k, h_q, h_kv, varlen, causal, cfg, poison):
    torch.manual_seed(b * 1000 + s_q * 100 + s_k + h_q)
    _run(*_case(b, s_q, s_k, h_q, h_kv, varlen), causal, config=cfg)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("h_q,s_q", [(128, 1), (128, 2), (64, 1)])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("cfg", CFGS_MAIN, ids=CFG_ID)
def test_gpu_seesaw_zero_seqlens(h_q, s_q, causal, cfg, poison):
    torch.manual_seed(7)
    _run(*_case(128, s_q, 4096, h_q, 1, True, zero_frac=0.5), causal, config=cfg)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("num_sms", [1, 3, 264, 1000])
@pytest.mark.parametrize("cfg", CFGS, ids=CFG_ID)
def test_gpu_seesaw_many_and_few_parts(num_sms, cfg, poison):
    """Few parts: one CTA walks many requests (ring / P / Q / l-exchange phases carried across pieces, pieces of
    0 tiles). Many parts: every request split into many pieces (accumulator rows, combine)."""
    dec.set_mla_num_sms(num_sms)
    try:
        torch.manual_seed(num_sms)
        _run(*_case(16, 2, 1500, 128, 1, True, zero_frac=0.2), True, config=cfg)
        _run(*_case(3, 1, 5000, 64, 1, True), False, config=cfg)
    finally:
        dec.set_mla_num_sms(None)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cfg", CFGS, ids=CFG_ID)
def test_gpu_seesaw_stale_schedule(cfg, poison):
    q, k, bt, sl = make_case(4, 2, 128, 1, [100, 3000, 0, 777], device="cuda")
    planned = torch.tensor([2000, 5, 900, 64], dtype=torch.int32, device="cuda")
    _run(q, k, bt, sl, True, sched_lens=planned, config=cfg)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cfg", CFGS_MAIN, ids=CFG_ID)
def test_gpu_seesaw_noncontiguous_q_fp16(cfg, poison):
    q, k, bt, sl = make_case(4, 2, 64, 1, [300, 1, 5000, 64], dtype=torch.float16)
    qb = torch.randn(4, 2, 64, 704, dtype=torch.float16)
    qb[..., :576] = q
    _run(qb[..., :576].cuda(), k.cuda(), bt.cuda(), sl.cuda(), True, config=cfg)


@pytest.mark.gpu
@needs_sm90
def test_gpu_seesaw_huge_logits():
    """Large scores: the running max chain through shared memory (both warpgroups) keeps exp2 finite."""
    q, k, bt, sl = make_case(2, 1, 128, 1, [100, 700], nan_unused=False, device="cuda")
    q.fill_(0.5)
    k.fill_(0.5)
    from deepkernels.mla.metadata import compute_schedule
    sched, ns = compute_schedule(sl, dec._num_sm_parts(q.device, 128, 1))
    o, l = SW.gluon_dense_forward_seesaw(q * 64, k * 64, bt, sl, sched, ns, 576 ** -0.5, False)
    torch.cuda.synchronize()
    assert torch.isfinite(l).all() and not torch.isnan(o).any()
    assert torch.allclose(o.float(), torch.full_like(o.float(), 32.0), rtol=1e-2)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("cfg", CFGS, ids=CFG_ID)
def test_gpu_seesaw_rising_max_across_tiles(cfg, poison):
    """Scores that grow tile after tile (the running max changes on every tile, alternating owners): checks the
    alpha each non-owner derives from the published max."""
    q, k, bt, sl = make_case(2, 2, 128, 1, [64 * 7 + 5, 64 * 8], nan_unused=True, device="cuda")
    ramp = torch.linspace(0.2, 3.0, k.shape[1], device="cuda", dtype=torch.float32)
    for bi in range(2):
        for pi, page in enumerate(bt[bi, : -(-int(sl[bi]) // 64)].tolist()):
            k[page] = (k[page].float() * (1.0 + pi) * ramp[:, None, None]).to(k.dtype)
    _run(q, k, bt, sl, True, config=cfg)


# ------------------------------------------------------------------ protocol model (CPU)
# A pure-Python model of the kernel's barrier protocol: the producer and the two math warpgroups as generators that
# follow the kernel's control flow (both ORDERs, the WG0 peel, the trailing consume, the Q / l hand-offs), mbarriers
# with count and phase parity, async wgmma reads checked at issue and at completion (the K slot, P buffer and Q must
# still hold the expected tile / piece). Random interleavings over piece lists with 0, 1, 2, odd and even tile
# counts; a deadlock shows as no progress. Mutations (kempty count 1, no pfree wait, no qfree arrive, no l wait,
# a double kempty arrive) make it fail. It checks the protocol as written here, not the compiled kernel.

class _Bar:
    def __init__(self, count):
        self.count, self.pending, self.k = count, 0, 0

    def arrive(self):
        self.pending += 1
        if self.pending == self.count:
            self.pending, self.k = 0, self.k + 1


def _protocol_model(pieces, order, seed, stages=2):
    rnd = random.Random(seed)
    kready = [_Bar(1) for _ in range(stages)]
    kempty = [_Bar(2) for _ in range(stages)]
    pready, pfree, qready, qfree = _Bar(1), _Bar(1), _Bar(1), _Bar(1)
    lready = [_Bar(1), _Bar(1)]
    slot_tile = [None] * stages          # which tile a K slot holds
    P = {"tile": None}                   # which tile's P / m is in the buffer
    Q = {"piece": None}
    L = [None, None]
    log = []

    def W(bar, parity):                  # wait: block while the bar's current phase parity == parity
        while (bar.k & 1) == parity:
            yield

    def producer():
        t = 0
        for n in pieces:
            for _ in range(n):
                s = t % stages
                yield from W(kempty[s], ((t // stages) & 1) ^ 1)
                slot_tile[s] = t         # TMA write
                kready[s].arrive()
                t += 1

    def math(w):
        wo = order if order < 2 else 1 - w       # ORDER 2: WG0 runs order 1, WG1 order 0
        kt = 0
        for r, n in enumerate(pieces):
            if w == 0:
                yield from W(qfree, (r & 1) ^ 1)
                Q["piece"] = r
                qready.arrive()
            else:
                yield from W(qready, r & 1)
            inflight = []               # (kind, tile, check) of async wgmma not yet waited

            def read_s(t):
                assert Q["piece"] == r and slot_tile[t % stages] == t, ("S", w, t)

            def read_pv(t):
                assert P["tile"] == t and slot_tile[t % stages] == t, ("PV", w, t, P["tile"])

            def consume(t):
                yield from W(pready, t & 1)
                assert P["tile"] == t
                read_pv(t)
                inflight.append(("pv", t))

            def wait_all(keep=0):
                while len(inflight) > keep:
                    kind, t = inflight.pop(0)
                    (read_s if kind == "s" else read_pv)(t)

            def own(j, has_prev):
                t = kt + j
                s = t % stages
                if wo == 1:
                    if has_prev:
                        yield from consume(t - 1)
                    yield from W(kready[s], (t // stages) & 1)
                    read_s(t); inflight.append(("s", t))
                    wait_all(0)
                    if has_prev:
                        kempty[(t - 1) % stages].arrive()
                    yield
                else:
                    yield from W(kready[s], (t // stages) & 1)
                    read_s(t); inflight.append(("s", t))
                    if has_prev:
                        yield from consume(t - 1)
                        wait_all(1)
                    else:
                        wait_all(0)
                    yield                # softmax
                    if has_prev:
                        wait_all(0)
                        kempty[(t - 1) % stages].arrive()
                assert not inflight
                yield from W(pfree, (t & 1) ^ 1)
                P["tile"] = t
                pready.arrive()
                read_pv(t); inflight.append(("pv", t))
                yield
                wait_all(0)
                kempty[s].arrive()
                pfree.arrive()

            if w == 0:
                if n > 0:
                    yield from own(0, False)
                for j in range(2, n, 2):
                    yield from own(j, True)
                if n >= 2 and n % 2 == 0:
                    yield from consume(kt + n - 1); wait_all(0); kempty[(kt + n - 1) % stages].arrive()
            else:
                for j in range(1, n, 2):
                    yield from own(j, True)
                if n % 2 == 1:
                    yield from consume(kt + n - 1); wait_all(0); kempty[(kt + n - 1) % stages].arrive()
            kt += n
            L[w] = r
            lready[w].arrive()
            yield from W(lready[1 - w], r & 1)
            assert L[1 - w] == r, ("l exchange", w, r, L)
            if w == 1:
                qfree.arrive()
            log.append((w, r))

    agents = {"prod": producer(), "wg0": math(0), "wg1": math(1)}
    steps = 0
    while agents:
        name = rnd.choice(sorted(agents))
        # run the chosen agent one step; detect global deadlock
        try:
            next(agents[name])
        except StopIteration:
            del agents[name]
        steps += 1
        if steps > 200000:
            raise AssertionError(f"deadlock / livelock: pieces={pieces} order={order} left={sorted(agents)}")
    return log





@pytest.mark.parametrize("order", [0, 1, 2])
def test_seesaw_barrier_protocol_model(order):
    rnd = random.Random(order)
    cases = [[0], [1], [2], [3], [0, 0], [1, 1], [2, 1, 0, 3], [5, 0, 1, 2, 7], [1, 2, 3, 4, 5, 6]]
    cases += [[rnd.choice([0, 0, 1, 2, 3, 4, 5, 9]) for _ in range(rnd.randint(1, 6))] for _ in range(150)]
    for i, c in enumerate(cases):
        for seed in range(3):
            log = _protocol_model(c, order, seed * 1000 + i)
            assert sorted(log) == sorted((w, r) for r in range(len(c)) for w in (0, 1))
