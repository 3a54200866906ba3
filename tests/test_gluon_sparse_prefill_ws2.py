"""Sparse prefill, WS2 variant (softmax warpgroup + PV warpgroup + the WS producer;
deepkernels.mla._gluon_sparse_prefill_ws2, dispatched since session 16): compile tier on any machine (sm90
cross-compile: m64n64 S wgmmas of the softmax warpgroup and no m64n32, the two warpgroups' m64n256 P V wgmmas, 6
mbarriers, setmaxnreg of the three partitions, shared memory, ptxas spills per partition loop, the cleaned PTX pinned by
sha256), a CPU launcher check with the kernel stubbed,
and a GPU tier: the cases of tests/test_gluon_sparse_prefill.py through :func:`launch_sparse_prefill_gluon_ws2`
directly and through the public op with its Gluon launch routed here (counted), against the float reference with
FlashMLA's prefill tolerances (randn/10 inputs, junk indices -1 / >= s_kv, NaN in every unreferenced KV row,
non-contiguous views, NaN-poisoned outputs), and against the WS variant (tolerance, not bit-identity: the row sums
are reduced in another order).

Session 19: the opt-in ``q_async`` (``Q_ASYNC``: the softmax warpgroup's Q by one batch of cp.async) -- compile
tier (cp.async / commit / wait counts, no barrier between the Q copies, same loops and shared memory, 0 spills,
default PTX unchanged), CPU launcher guard (q views without 16-byte vectors keep the plain loads), GPU bit identity
against the build without it (``-k q_async``).

Session 19 too: the opt-in ``o_stage`` (``O_STAGE``: each warpgroup's bf16 output half through the dead Q tile,
16-byte row stores) -- compile tier (store / stmatrix / shared-load counts, loops, spills, shared memory, default PTX
unchanged), GPU bit identity alone and with ``q_async`` (``-k o_stage``).

The opt-in OVERLAP / HALF schedules and their tests (sessions 16-17, never dispatched, measured slower) were removed
in session 18; ``test_default_ptx_unchanged`` pins the dispatched kernel's cleaned PTX across that removal (git
history: ``git show cb51b03:tests/test_gluon_sparse_prefill_ws2.py``)."""
from __future__ import annotations

import functools
import hashlib
import re

import pytest
import torch

from deepkernels.mla import _gluon_sparse_prefill as G
from deepkernels.mla import _gluon_sparse_prefill_ws2 as P
from deepkernels.reference.mla_prefill import sparse_prefill_ref
from deepkernels.testing.compile import (clean_ptx, n_hgmma, n_spill, ptxas_sm90_cached, sass_loops,
                                         setmaxnreg_values)
from deepkernels.testing.numerics import check_is_allclose

from test_mla_prefill import make_case

pytestmark = pytest.mark.skipif(not P.available(), reason=f"Gluon not importable: {P._IMPORT_ERROR!r}")


# ------------------------------------------------------------------ compile tier (CPU cross-compile for sm90)
@functools.lru_cache(maxsize=None)
def _compiled(d_pe, has_len, has_sink):
    # the session-17 build (1 row x 32 lanes NoPE gather), pinned by hash; the default since session 18 gathers
    # 4 rows x 8 lanes (test_gather_rows4_plumbing_and_default_ptx)
    k = P.compile_sm90_ws2(d_pe, has_len, has_sink, gather_rows4=False, q_async=False, o_stage=False)
    return k.asm["ptx"], k.metadata.shared


# (d_pe, has_len, has_sink): d_qk 576 and 512 (what supported() accepts), lengths and sinks on and off
_CONFIGS = [(64, False, False), (64, True, True), (64, False, True), (0, True, False), (0, False, False)]
_SMEM = {64: 229888, 0: 205296}      # measured (Triton 3.6), max over the configurations


@pytest.mark.compile
@pytest.mark.parametrize("d_pe,has_len,has_sink", _CONFIGS)
def test_compile_sm90_ws2(d_pe, has_len, has_sink):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    ptx, shared = _compiled(d_pe, has_len, has_sink)
    k_steps = (512 + d_pe) // 16
    # softmax WG: the full S as m64n64k16 (no m64n32 split), P V[:, :256] 4 x m64n256k16; PV WG: P V[:, 256:] 4 x
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k16") == k_steps
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n32k16") == 0
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16") == 8
    assert ptx.count("wgmma.mma_async") == k_steps + 8
    assert shared <= SM90_SMEM_LIMIT and shared <= _SMEM[d_pe] + 64, shared
    # 6 mbarriers: ready x 2, empty x 2, pready, pfree; waits: producer empty, softmax ready + pfree (loop and
    # epilogue), PV ready + pready (loop and epilogue) = 7; arrives: producer ready, softmax pready x 2 + empty,
    # PV pfree + empty = 6
    assert ptx.count("mbarrier.init.shared") == 6
    assert ptx.count("mbarrier.try_wait.parity") == 7
    assert ptx.count("mbarrier.arrive.shared::cta") == 6
    assert "cp.async.mbarrier.arrive" in ptx and "fence.proxy.async" in ptx
    assert "cp.async.wait_group" not in ptx     # the producer tracks its copies by the mbarrier, no commit groups
    # partitions' registers: producer, PV warpgroup, the softmax warpgroup gets the rest of the launch cap
    soft = (P.WS2_MAXNREG * 12 * 32 - (P.WS2_PRODUCER_REGS + P.WS2_PV_REGS) * 128) // 128 // 8 * 8
    regs = setmaxnreg_values(ptx)
    assert ("inc", P.WS2_PV_REGS) in regs and ("dec", soft) in regs, regs
    assert any(r == P.WS2_PRODUCER_REGS for _, r in regs), regs
    # ptxas (Triton 3.6 wheel), measured: 0 spill instructions in the softmax token loop (36 / 32 S k-steps + 4 P V),
    # the PV token loop (4 P V k-steps) and the producer block loop (setmaxnreg 56); 0 bytes of spill in all
    rep = ptxas_sm90_cached(ptx)
    if rep is None:
        pytest.skip("ptxas not available")
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", rep.log)
    assert spill, rep.log
    loops = sass_loops(rep.sass)
    s_loops = [lp for lp in loops if n_hgmma(lp) == k_steps + 4]
    pv_loops = [lp for lp in loops if n_hgmma(lp) == 4]
    prod = [lp for lp in loops if not n_hgmma(lp) and any("LDGSTS" in t for t in lp)]
    assert len(s_loops) == 1 and len(pv_loops) == 1 and len(prod) == 1, (len(s_loops), len(pv_loops), len(prod))
    assert n_spill(s_loops[0]) == 0, f"{n_spill(s_loops[0])} spill instructions in the softmax token loop"
    assert n_spill(pv_loops[0]) == 0, f"{n_spill(pv_loops[0])} spill instructions in the PV token loop"
    assert n_spill(prod[0]) <= 2, f"{n_spill(prod[0])} spill instructions in the producer block loop"
    assert int(spill.group(1)) <= 64 and int(spill.group(2)) <= 64, rep.log


# sha256 of the cleaned PTX of the dispatched kernel before the OVERLAP option existed (git 52d0099, Triton 3.6.0,
# sm_90a), per (d_pe, has_len, has_sink): unchanged while the OVERLAP / HALF options existed (sessions 16-17) and
# after their removal (session 18).
_BASE_PTX_SHA = {
    (64, False, False): "1c9c679858aae02cb57146f2801ae90030f8b66aa1eaa438043192a71daf1c56",
    (64, False, True): "1a7c8605eafe37bdc9ca5435fc6701792ebb452768383eba5c734764f1f45352",
    (64, True, False): "b5802f342008f68684bc1c9744d1d234d40a7b80e29c1cb120835b4a2a2c385f",
    (64, True, True): "fce0920a22e2b4c8689688c105af24919fcf711d5534e5e0b2dd9f07d7c096c8",
    (0, False, False): "2ad0233271a3cd47e207e93fa95e31c4e78fc084f4e39ade453760be42dfb364",
    (0, False, True): "8064b771fa355d6568b9ef6f2777e953b7c9eed16e6067d75104dae1db976e6c",
    (0, True, False): "b6edd73a428842070db35ff7982eafdf742b5274d3d92aef3f39cdd62dda23e2",
    (0, True, True): "2cb4852c334f851a1853823c049713f587fb3ca1e3e75a0417f6f47e6b076488",
}


@pytest.mark.compile
@pytest.mark.parametrize("d_pe,has_len,has_sink", list(_BASE_PTX_SHA))
def test_default_ptx_unchanged(d_pe, has_len, has_sink):
    import triton
    if triton.__version__ != "3.6.0":
        pytest.skip(f"hashes taken with Triton 3.6.0, not {triton.__version__}")
    ptx, _ = _compiled(d_pe, has_len, has_sink)
    digest = hashlib.sha256(clean_ptx(ptx).encode()).hexdigest()
    assert digest == _BASE_PTX_SHA[(d_pe, has_len, has_sink)]


@pytest.mark.compile
def test_module_contract():
    assert P.DISPATCH is True     # dispatched since session 16 (1.15-1.19x the WS kernel)
    assert P.supported_ws2 is G.supported
    # the kernel takes the WS kernel's runtime arguments in the same order (a drop-in for the launch)
    ws_args = [a for a in G._sparse_prefill_gluon_ws_kernel.arg_names if not a.isupper()]
    ws2_args = [a for a in P._sparse_prefill_gluon_ws2_kernel.arg_names if not a.isupper()]
    assert ws_args == ws2_args
    # H_Q is a runtime argument (upper case as in the WS kernel); the rest of the upper-case names are constexprs
    ws2_upper = [a for a in P._sparse_prefill_gluon_ws2_kernel.arg_names if a.isupper()]
    assert ws2_upper[0] == "H_Q" and ws2_upper[1:] == list(P._CONSTEXPRS)
    # registers: 12 warps within the register file, setmaxnreg values multiples of 8 and <= 256
    assert P.WS2_MAXNREG * 12 * 32 <= 65536
    soft = (P.WS2_MAXNREG * 12 * 32 - (P.WS2_PRODUCER_REGS + P.WS2_PV_REGS) * 128) // 128
    assert all(r % 8 == 0 and 24 <= r <= 256 for r in (P.WS2_PRODUCER_REGS, P.WS2_PV_REGS, soft // 8 * 8))


@pytest.mark.compile
def test_launch_args_on_cpu(monkeypatch):
    """The launcher passes the WS launch's arguments, grid and constexprs (kernel stubbed; CPU tensors)."""
    seen = {}

    def fake_cached(cache, fn, key, meta, limit):
        seen["fn"], seen["key"], seen["meta"] = fn, key, meta()

        def launch(grid, *args):
            seen["grid"], seen["args"] = grid, args
        return launch

    monkeypatch.setattr(P, "cached_launcher", fake_cached)
    s_q, h_q, s_kv, topk = 3, 128, 100, 192
    q = torch.zeros(s_q, h_q, 576, dtype=torch.bfloat16)
    kv = torch.zeros(s_kv, 1, 576, dtype=torch.bfloat16)
    ind = torch.zeros(s_q, 1, topk, dtype=torch.int32)
    out = torch.empty(s_q, h_q, 512, dtype=torch.bfloat16)
    ml, lse = torch.empty(s_q, h_q), torch.empty(s_q, h_q)
    tl = torch.zeros(s_q, dtype=torch.int32)
    P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 0.25, None, tl)
    assert seen["fn"] is P._sparse_prefill_gluon_ws2_kernel
    assert seen["grid"] == (s_q * 2, )
    assert seen["meta"] == dict(D_PE=64, HAS_LEN=True, HAS_SINK=False, PRODUCER_REGS=P.WS2_PRODUCER_REGS,
                                PV_REGS=P.WS2_PV_REGS, GATHER_ROWS4=True, Q_ASYNC=P.WS2_Q_ASYNC,
                                O_STAGE=P.WS2_O_STAGE, num_warps=4,
                                maxnreg=P.WS2_MAXNREG)
    a = seen["args"]
    assert a[0] is q and a[1] is kv and a[2] is ind and a[3] is tl and a[4] is lse and a[5] is out
    assert a[6] is ml and a[7] is lse and a[8:10] == (s_kv, topk)
    assert a[10] == 0.25 and abs(a[11] - 0.25 * 1.4426950408889634) < 1e-12
    assert a[12:] == (q.stride(0), q.stride(1), kv.stride(0), ind.stride(0), out.stride(0), out.stride(1), h_q)
    seen.clear()
    P.launch_sparse_prefill_gluon_ws2(out[:0], ml[:0], lse[:0], q[:0], kv, ind[:0], 0.25)
    assert not seen                                  # s_q 0: nothing launched


@pytest.mark.compile
@pytest.mark.parametrize("env,expect", [("1", "ws2"), ("0", "ws"), (None, "ws2" if P.DISPATCH else "ws")])
def test_dispatch_switch(monkeypatch, env, expect):
    """prefill._launch_sparse_prefill -> launch_sparse_prefill_gluon (variant None) sends the Gluon-eligible call to
    WS2 iff dispatch_on() (DEEPKERNELS_SPARSE_PREFILL_WS2 overrides DISPATCH), else to the WS variant; kernel
    launches stubbed, CPU tensors."""
    from deepkernels.mla import prefill
    if env is None:
        monkeypatch.delenv("DEEPKERNELS_SPARSE_PREFILL_WS2", raising=False)
    else:
        monkeypatch.setenv("DEEPKERNELS_SPARSE_PREFILL_WS2", env)
    seen = []
    monkeypatch.setattr(G, "supported", lambda q, kv: True)
    monkeypatch.setattr(G, "cached_launcher",
                        lambda cache, fn, *a, **k: (lambda grid, *args: seen.append(
                            "ws" if fn is G._sparse_prefill_gluon_ws_kernel else fn)))
    monkeypatch.setattr(P, "launch_sparse_prefill_gluon_ws2", lambda *a, **k: seen.append("ws2"))
    q = torch.zeros(2, 64, 576, dtype=torch.bfloat16)
    kv = torch.zeros(10, 1, 576, dtype=torch.bfloat16)
    ind = torch.zeros(2, 1, 64, dtype=torch.int32)
    out = torch.empty(2, 64, 512, dtype=torch.bfloat16)
    ml, lse = torch.empty(2, 64), torch.empty(2, 64)
    prefill._launch_sparse_prefill(out, ml, lse, q, kv, ind, 0.5)
    assert seen == [expect]


# ------------------------------------------------------------------ GPU tier
def _run(q, kv, ind, sk, tl, sm_scale=0.5, name="", **kw):
    s_q, h_q, _ = q.shape
    out = torch.full((s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device=q.device)
    ml = torch.full((s_q, h_q), float("nan"), device=q.device)
    lse = torch.full((s_q, h_q), float("nan"), device=q.device)
    assert P.supported_ws2(q, kv)
    P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, sm_scale, sk, tl, **kw)
    ro, rml, rlse = sparse_prefill_ref(q, kv, ind, sm_scale, 512, sk, tl)
    assert check_is_allclose(f"{name} out", out.float(), ro, abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose(f"{name} lse", lse, rlse, abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert check_is_allclose(f"{name} max_logits", ml, rml, abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any() and not torch.isnan(ml).any()
    return out, ml, lse


@pytest.fixture
def ws2_route(monkeypatch):
    """The public op's Gluon launch goes to launch_sparse_prefill_gluon_ws2 (DEEPKERNELS_SPARSE_PREFILL_WS2=1, as
    dispatched by default since session 16); each launch is counted."""
    calls = []
    launch = P.launch_sparse_prefill_gluon_ws2

    def counted(out, max_logits, lse, q, kv, indices, *args, **kw):
        assert P.supported_ws2(q, kv)
        launch(out, max_logits, lse, q, kv, indices, *args, **kw)
        calls.append(q.shape)

    monkeypatch.setenv("DEEPKERNELS_SPARSE_PREFILL_WS2", "1")
    monkeypatch.setattr(P, "launch_sparse_prefill_gluon_ws2", counted)
    return calls


@pytest.mark.gpu
def test_gpu_ws2_smoke():
    """One small call (the device scripts run this first, under a hang guard)."""
    q, kv, ind, sk, tl = make_case(5, 300, 192, h_q=128, sink=True, with_len=True, all_invalid=True, device="cuda")
    _run(q, kv, ind, sk, tl, name="smoke")


@pytest.mark.gpu
@pytest.mark.parametrize("d_qk,h_q", [(576, 128), (576, 64), (512, 64), (512, 128)])
@pytest.mark.parametrize("s_kv,topk", [(592, 128), (1521, 512), (114, 384), (4096, 100)])
def test_gpu_regular(d_qk, h_q, s_kv, topk):
    q, kv, ind, sk, tl = make_case(62, s_kv, topk, h_q=h_q, d_qk=d_qk, device="cuda")
    _run(q, kv, ind, sk, tl, name=f"{d_qk}/{h_q}/{s_kv}/{topk}")


@pytest.mark.gpu
@pytest.mark.parametrize("d_qk", [576, 512])
@pytest.mark.parametrize("sink,with_len", [(False, False), (True, False), (False, True), (True, True)])
def test_gpu_features(sink, with_len, d_qk):
    q, kv, ind, sk, tl = make_case(213, 1592, 384, h_q=128, d_qk=d_qk, sink=sink, with_len=with_len,
                                   all_invalid=True, device="cuda")
    _run(q, kv, ind, sk, tl, name=f"sink={sink} len={with_len}")


@pytest.mark.gpu
@pytest.mark.parametrize("s_q,s_kv,topk", [(1, 128, 128), (1234, 4321, 4096), (1024, 32, 2048), (3, 64, 0),
                                           (5, 200, 16), (5, 300, 48)])
def test_gpu_corners(s_q, s_kv, topk):
    # all-invalid rows, blocks with no valid index (s_kv << topk), topk = 0, one partial block
    q, kv, ind, sk, tl = make_case(s_q, s_kv, topk, h_q=128, sink=True, all_invalid=topk > 0, device="cuda")
    _run(q, kv, ind, sk, tl)


@pytest.mark.gpu
@pytest.mark.parametrize("s_q,s_kv,topk,with_len", [(37, 1000, 192, False), (29, 3000, 448, True),
                                                    (16, 100, 320, False), (9, 5000, 1088, True)])
def test_gpu_odd_blocks(s_q, s_kv, topk, with_len):
    # an odd number of 64-token blocks: the 2-slot ring and the pready / pfree phases end on either
    # parity; with topk_length the per-row block count varies (odd, even, 1, 0)
    q, kv, ind, sk, tl = make_case(s_q, s_kv, topk, h_q=128, sink=True, with_len=with_len, all_invalid=True,
                                   device="cuda")
    _run(q, kv, ind, sk, tl, name=f"odd {s_q}/{s_kv}/{topk}/{with_len}")


@pytest.mark.gpu
def test_gpu_topk_length_zero_and_all_invalid():
    # topk_length 0 for every row / all indices invalid (-1 and >= s_kv): out 0, lse +inf, max_logits -inf
    q, kv, ind, sk, _ = make_case(7, 500, 256, h_q=128, sink=True, device="cuda")
    tl = torch.zeros(7, dtype=torch.int32, device="cuda")
    out, ml, lse = _run(q, kv, ind, sk, tl, name="topk_length 0")
    assert (out == 0).all() and torch.isinf(lse).all() and (lse > 0).all() and (ml == float("-inf")).all()
    ind = torch.where(torch.rand(ind.shape, device="cuda") < 0.5, -1, 500 + 7).to(torch.int32)
    out, ml, lse = _run(q, kv, ind, sk, None, name="all invalid")
    assert (out == 0).all() and (lse == float("inf")).all() and (ml == float("-inf")).all()


@pytest.mark.gpu
def test_gpu_huge_logits():
    # FlashMLA d626421: exp2 of the max element is exactly 1 even with huge logits; 3 blocks (odd), the value 32 in
    # every valid row, the second query's row valid for 100 of 192 positions only
    q = torch.full((2, 64, 576), 32.0, device="cuda").bfloat16()
    kv = torch.full((200, 1, 576), 32.0, device="cuda").bfloat16()
    ind = torch.arange(192, device="cuda", dtype=torch.int32).view(1, 1, 192).repeat(2, 1, 1)
    ind[1, 0, 100:] = -1
    out = torch.empty(2, 64, 512, dtype=torch.bfloat16, device="cuda")
    ml, lse = torch.empty(2, 64, device="cuda"), torch.empty(2, 64, device="cuda")
    P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 1.0)
    assert torch.isfinite(lse).all() and (out.float() - 32).abs().max() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("d_qk", [576, 512])
@pytest.mark.parametrize("sink,with_len", [(True, True), (False, False)])
def test_gpu_public_op_routed(d_qk, sink, with_len, ws2_route):
    """flash_mla_sparse_fwd (and the out-parameter launcher's checks) with the Gluon launch routed to WS2."""
    from test_mla_prefill import run_and_check
    from deepkernels.mla.prefill import flash_mla_sparse_fwd
    q, kv, ind, sk, tl = make_case(97, 3000, 1024, h_q=128, d_qk=d_qk, sink=sink, with_len=with_len,
                                   all_invalid=True, device="cuda")
    run_and_check(q, kv, ind, sk, tl, name=f"public {d_qk}")
    assert len(ws2_route) == 1, f"{len(ws2_route)} WS2 launches, expected 1"
    out, ml, lse = flash_mla_sparse_fwd(q, kv, ind, 0.5, attn_sink=sk, topk_length=tl)
    assert len(ws2_route) == 2, f"{len(ws2_route)} WS2 launches, expected 2"
    ro, rml, rlse = sparse_prefill_ref(q, kv, ind, 0.5, 512, sk, tl)
    assert check_is_allclose("public out", out.float(), ro, abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose("public lse", lse, rlse, abs_tol=1e-6, rel_tol=2.01 / 65536)


@pytest.mark.gpu
@pytest.mark.parametrize("d_qk", [576, 512])
def test_gpu_close_to_ws(d_qk):
    """Against the WS variant on the same inputs: the same empty-row pattern, out / lse / max_logits within
    tolerance (not bit-identical: row sums over 64 columns in one warpgroup instead of 2 x 32 + an add)."""
    q, kv, ind, sk, tl = make_case(211, 5000, 1088, h_q=128, d_qk=d_qk, sink=True, with_len=True, all_invalid=True,
                                   device="cuda")
    res = []
    for launch in (lambda *a: G.launch_sparse_prefill_gluon(*a, variant="ws"), P.launch_sparse_prefill_gluon_ws2):
        out = torch.full((211, 128, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        ml = torch.full((211, 128), float("nan"), device="cuda")
        lse = torch.full((211, 128), float("nan"), device="cuda")
        launch(out, ml, lse, q, kv, ind, 0.5, sk, tl)
        res.append((out.float(), ml, lse))
    (o1, m1, l1), (o2, m2, l2) = res
    assert torch.equal(torch.isfinite(l1), torch.isfinite(l2)) and torch.equal(torch.isfinite(m1), torch.isfinite(m2))
    assert check_is_allclose("ws2 vs ws out", o2, o1, abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
    assert (o2 - o1).abs().max() <= 2e-3
    fin = torch.isfinite(l1)
    assert (l2[fin] - l1[fin]).abs().max() <= 1e-5
    assert torch.equal(m1, m2)          # the running max is exact in both (same scores, same max)


# ------------------------------------------------------------------ gather_rows4 (session 18, opt-in)
def test_gather_rows4_plumbing_and_default_ptx():
    """``gather_rows4``: keyword-only, default :data:`WS2_GATHER_ROWS4` (on since session 18); the kernel's last
    constexpr, with default False, so the build with it off is the pinned one (test_default_ptx_unchanged); on, the
    producer loop shrinks (4 row addresses per thread instead of 16)."""
    import inspect
    sig = inspect.signature(P.launch_sparse_prefill_gluon_ws2).parameters
    assert sig["gather_rows4"].kind == inspect.Parameter.KEYWORD_ONLY and sig["gather_rows4"].default is None
    assert P._CONSTEXPRS[5] == "GATHER_ROWS4" and P.WS2_GATHER_ROWS4 is True  # (Q_ASYNC, O_STAGE after it: s19)
    k0 = P.compile_sm90_ws2(64, True, True, gather_rows4=False)
    k1 = P.compile_sm90_ws2(64, True, True, gather_rows4=True)
    assert k1.metadata.shared == k0.metadata.shared
    assert clean_ptx(k1.asm["ptx"]) != clean_ptx(k0.asm["ptx"])
    assert clean_ptx(P.compile_sm90_ws2(64, True, True).asm["ptx"]) == clean_ptx(k1.asm["ptx"])


_R4_CASES = [(64, 4096, 2048, 576, False, False), (37, 3000, 1000, 576, True, True), (16, 700, 576, 512, True, False)]


@pytest.mark.gpu
@pytest.mark.parametrize("s_q,s_kv,topk,d_qk,sink,with_len", _R4_CASES)
def test_gpu_gather_rows4_bit_identical(s_q, s_kv, topk, d_qk, sink, with_len):
    """The 4-rows NoPE gather lands the same bytes in the same slots: out / lse / max_logits bit-identical to the
    default build (NaN-poisoned outputs, invalid / -1 indices, lengths, sink, d_qk 512)."""
    q, kv, ind, sk, tl = make_case(s_q, s_kv, topk, h_q=128, d_qk=d_qk, sink=sink, with_len=with_len,
                                   all_invalid=True, device="cuda")
    res = []
    for kw in (dict(gather_rows4=False), dict(gather_rows4=True)):
        out = torch.full((s_q, 128, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        ml = torch.full((s_q, 128), float("nan"), device="cuda")
        lse = torch.full((s_q, 128), float("nan"), device="cuda")
        P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 0.5, sk, tl, **kw)
        res.append((out, ml, lse))
    (o0, m0, l0), (o1, m1, l1) = res
    assert not torch.isnan(o0).any()
    assert torch.equal(o1, o0) and torch.equal(m1, m0) and torch.equal(l1, l0)


# ------------------------------------------------------------------ q_async (session 19, opt-in)
# unmasked 16-byte cp.async (src-size immediate 16): the Q copies; the producer's gathers pass a src-size register
_Q_CPASYNC = re.compile(r"cp\.async\.cg\.shared\.global \[ %r\d+ \+ 0 \], \[ %rd\d+ \+ 0 \], 0x10, 0x10;")


def _same_loops_no_spill(ptx0, ptx1, d_pe):
    """ptxas both builds (skip without ptxas): ``ptx1`` spills 0 bytes, and its softmax (S + P V HGMMAs), PV (4
    HGMMAs) and producer (LDGSTS) loops have ``ptx0``'s instruction counts with no spill instruction. Returns the two
    ptxas reports."""
    rep0, rep1 = ptxas_sm90_cached(ptx0), ptxas_sm90_cached(ptx1)
    if rep0 is None or rep1 is None:
        pytest.skip("ptxas not available")
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", rep1.log)
    assert spill and int(spill.group(1)) == 0 and int(spill.group(2)) == 0, rep1.log
    loops0, loops1 = sass_loops(rep0.sass), sass_loops(rep1.sass)
    k_steps = (512 + d_pe) // 16
    for pick in (lambda lp: n_hgmma(lp) == k_steps + 4, lambda lp: n_hgmma(lp) == 4,
                 lambda lp: not n_hgmma(lp) and any("LDGSTS" in t for t in lp)):
        l0, l1 = [lp for lp in loops0 if pick(lp)], [lp for lp in loops1 if pick(lp)]
        assert len(l0) == len(l1) == 1
        assert len(l1[0]) == len(l0[0]) and n_spill(l1[0]) == 0, (len(l1[0]), len(l0[0]), n_spill(l1[0]))
    return rep0, rep1


@functools.lru_cache(maxsize=None)
def _compiled_qa(d_pe, has_len, has_sink, q_async):
    k = P.compile_sm90_ws2(d_pe, has_len, has_sink, q_async=q_async, o_stage=False)   # Q_ASYNC's own effect
    return k.asm["ptx"], k.metadata.shared


@pytest.mark.compile
def test_q_async_plumbing_and_default_ptx():
    """``q_async``: keyword-only, default :data:`WS2_Q_ASYNC` (off: opt-in until measured); a kernel constexpr
    with default False, so the default build is unchanged (test_default_ptx_unchanged pins it with
    gather_rows4 off; here the dispatched gather_rows4 build, default == explicit off)."""
    import inspect
    for fn in (P.launch_sparse_prefill_gluon_ws2, P.compile_sm90_ws2):
        sig = inspect.signature(fn).parameters
        assert sig["q_async"].default is None
    assert inspect.signature(P.launch_sparse_prefill_gluon_ws2).parameters["q_async"].kind == \
        inspect.Parameter.KEYWORD_ONLY
    assert P._CONSTEXPRS[6] == "Q_ASYNC" and P.WS2_Q_ASYNC is True       # dispatched since session 19
    assert P._sparse_prefill_gluon_ws2_kernel.arg_names[-2] == "Q_ASYNC"
    sig = inspect.signature(P._sparse_prefill_gluon_ws2_kernel.fn).parameters
    assert sig["Q_ASYNC"].default is False                                   # the kernel's own default: off
    off = clean_ptx(P.compile_sm90_ws2(64, True, True, o_stage=False, q_async=False).asm["ptx"])
    assert off == clean_ptx(_compiled_qa(64, True, True, False)[0])
    assert off != clean_ptx(_compiled_qa(64, True, True, True)[0])


@pytest.mark.compile
@pytest.mark.parametrize("d_pe,has_len,has_sink", _CONFIGS)
def test_compile_q_async(d_pe, has_len, has_sink):
    """Q_ASYNC: the 9 (d_qk 576) / 8 (512) Q chunks as 4 unmasked 16-byte cp.async per thread each, issued back to
    back (no barrier, no global load between them), ONE commit group and ONE ``wait_group 0`` (the only one in the
    kernel: the producer tracks its copies by mbarrier), then the proxy fence; no Q ``ld.global`` left; the same
    wgmma / mbarrier counts and shared memory as the build without it; ptxas: the three loops unchanged in size, 0
    spill instructions in them, 0 bytes of spill; SASS: +36 / +32 LDGSTS, 36 / 32 fewer LDG, fewer BAR.SYNC."""
    ptx0, sh0 = _compiled_qa(d_pe, has_len, has_sink, False)
    ptx1, sh1 = _compiled_qa(d_pe, has_len, has_sink, True)
    n_q = (512 + d_pe) // 64 * 4            # 16-byte copies per thread: [64, 64] chunks / 128 threads / 8 elements
    assert sh1 == sh0, (sh1, sh0)
    assert len(_Q_CPASYNC.findall(ptx0)) == 0 and len(_Q_CPASYNC.findall(ptx1)) == n_q
    assert ptx1.count("cp.async.cg.shared.global") == ptx0.count("cp.async.cg.shared.global") + n_q
    assert "cp.async.ca." not in ptx1       # every copy 16 bytes (.cg)
    assert ptx0.count("cp.async.commit_group") == 0 and ptx1.count("cp.async.commit_group") == 1
    assert ptx0.count("cp.async.wait_group") == 0 and ptx1.count("cp.async.wait_group") == 1
    assert re.search(r"cp\.async\.wait_group\s+0;", ptx1)
    # the batch: first Q copy .. commit .. wait, then the fence, with no barrier / global load before the wait
    first = _Q_CPASYNC.search(ptx1).start()
    commit, wait = ptx1.index("cp.async.commit_group"), ptx1.index("cp.async.wait_group")
    fence = ptx1.index("fence.proxy.async", wait)
    assert first < commit < wait < fence
    batch = ptx1[first:wait]
    assert len(_Q_CPASYNC.findall(batch)) == n_q
    assert "bar.sync" not in batch and "ld.global" not in batch and "mbarrier" not in batch
    assert ptx1[wait:fence].count("bar.sync") <= 1      # Triton's barrier after the wait (membar) at most
    assert ptx1.index("wgmma.mma_async") > fence
    for pat in ("wgmma.mma_async", "mbarrier.init.shared", "mbarrier.try_wait.parity", "mbarrier.arrive.shared::cta",
                "cp.async.mbarrier.arrive", "setmaxnreg"):
        assert ptx1.count(pat) == ptx0.count(pat), pat
    assert ptx1.count("bar.sync") < ptx0.count("bar.sync")
    rep0, rep1 = _same_loops_no_spill(ptx0, ptx1, d_pe)

    def count(sass, pred):
        return sum(1 for line in sass.splitlines() if pred(line))

    ldgsts = lambda t: "LDGSTS" in t and "ARRIVE" not in t      # noqa: E731
    ldg = lambda t: re.search(r"\bLDG\.", t) is not None          # noqa: E731
    assert count(rep1.sass, ldgsts) == count(rep0.sass, ldgsts) + n_q
    assert count(rep1.sass, ldg) == count(rep0.sass, ldg) - n_q
    assert count(rep1.sass, lambda t: "BAR.SYNC" in t) < count(rep0.sass, lambda t: "BAR.SYNC" in t)


@pytest.mark.compile
def test_q_async_guard_on_cpu(monkeypatch):
    """The launcher sets Q_ASYNC only for a q whose base is 16-byte aligned and whose token / head strides are
    multiples of 16 elements (deepkernels._launch.triton_aligned); a head stride of 584 (16-byte rows, not a
    16-element multiple) or an 8-byte-offset base keeps the plain loads. Default (q_async None): on (session 19). Kernel
    stubbed; CPU tensors."""
    seen = []

    def fake_cached(cache, fn, key, meta, limit):
        seen.append(meta())
        return lambda grid, *args: None

    monkeypatch.setattr(P, "cached_launcher", fake_cached)
    s_q, h_q = 4, 128
    kv = torch.zeros(100, 1, 576, dtype=torch.bfloat16)
    ind = torch.zeros(s_q, 1, 64, dtype=torch.int32)
    out = torch.empty(s_q, h_q, 512, dtype=torch.bfloat16)
    ml, lse = torch.empty(s_q, h_q), torch.empty(s_q, h_q)
    q = torch.zeros(s_q, h_q, 576, dtype=torch.bfloat16)
    q_pad = torch.zeros(s_q, h_q, 584, dtype=torch.bfloat16)[..., :576]             # head stride 584
    q_off = torch.zeros(s_q * h_q * 576 + 4, dtype=torch.bfloat16)[4:].view(s_q, h_q, 576)   # base + 8 bytes
    q_big = torch.zeros(s_q + 1, h_q + 1, 704, dtype=torch.bfloat16)[:s_q, :h_q, :576]  # make_case's view
    for qq, kw, expect in ((q, {}, True), (q_pad, {}, False), (q, dict(q_async=False), False),
                           (q, dict(q_async=True), True),
                           (q_big, dict(q_async=True), True), (q_pad, dict(q_async=True), False),
                           (q_off, dict(q_async=True), False)):
        P.launch_sparse_prefill_gluon_ws2(out, ml, lse, qq, kv, ind, 0.25, **kw)
        assert seen[-1]["Q_ASYNC"] is expect, (qq.stride(), qq.data_ptr() % 16, kw)


@pytest.mark.compile
def test_q_async_unaligned_q_compiles(monkeypatch):
    """tests/test_review_s18.py's method for q: the launch with ``q_async=True`` on a q view with head stride 584
    (captured, stubbed) compiles for sm90 under exactly the divisibility facts Triton derives from its arguments --
    and the Q_ASYNC build itself would not (2-byte cp.async): the guard is what keeps such q compilable."""
    from test_review_s18 import _compiles, _launch_facts
    seen = {}

    def fake_cached(cache, fn, key, meta, limit):
        seen["meta"] = meta()
        return lambda grid, *args: seen.update(args=args)

    monkeypatch.setattr(P, "cached_launcher", fake_cached)
    q = torch.zeros(4, 128, 584, dtype=torch.bfloat16)[..., :576]
    kv = torch.zeros(100, 1, 576, dtype=torch.bfloat16)
    ind = torch.zeros(4, 1, 64, dtype=torch.int32)
    out = torch.empty(4, 128, 512, dtype=torch.bfloat16)
    ml, lse = torch.empty(4, 128), torch.empty(4, 128)
    P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 0.05, q_async=True)
    m = seen["meta"]
    facts = _launch_facts(P._sparse_prefill_gluon_ws2_kernel, seen["args"])
    assert "stride_qh" not in facts and "q_ptr" in facts
    assert m["Q_ASYNC"] is False

    def build(q_async):
        return lambda: P.compile_sm90_ws2(d_pe=m["D_PE"], has_len=m["HAS_LEN"], has_sink=m["HAS_SINK"],
                                          pv_regs=m["PV_REGS"], producer_regs=m["PRODUCER_REGS"],
                                          gather_rows4=m["GATHER_ROWS4"], q_async=q_async)
    ok, err = _compiles(P, facts, build(m["Q_ASYNC"]))
    assert ok, err
    ok_forced, _ = _compiles(P, facts, build(True))
    assert not ok_forced, "the Q_ASYNC build compiled without the 16-divisible head stride: the guard is moot"


# s_q, s_kv, topk, d_qk, h_q, sink, with_len: full blocks, partial blocks, lengths, sink, d_qk 512, h_q 64,
# blocks with no valid index (s_kv << topk), topk 0 (no block: Q loaded, never read)
_QA_CASES = [(64, 4096, 2048, 576, 128, False, False), (37, 3000, 1000, 576, 128, True, True),
             (16, 700, 576, 512, 128, True, False), (29, 3000, 448, 512, 128, False, True),
             (33, 1521, 512, 576, 64, True, False), (1024, 32, 2048, 576, 128, True, False),
             (5, 200, 16, 576, 128, True, True), (3, 64, 0, 512, 128, True, False)]


def _launch_pair(q, kv, ind, sk, tl, kws):
    res = []
    s_q, h_q, _ = q.shape
    for kw in kws:
        out = torch.full((s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        ml = torch.full((s_q, h_q), float("nan"), device="cuda")
        lse = torch.full((s_q, h_q), float("nan"), device="cuda")
        P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 0.5, sk, tl, **kw)
        res.append((out, ml, lse))
    return res


@pytest.mark.gpu
@pytest.mark.parametrize("s_q,s_kv,topk,d_qk,h_q,sink,with_len", _QA_CASES)
def test_gpu_q_async_bit_identical(s_q, s_kv, topk, d_qk, h_q, sink, with_len):
    """Q by one cp.async batch lands the same bytes in the same shared tiles: out / lse / max_logits bit-identical
    to the build without it (NaN-poisoned outputs, junk / -1 indices, all-invalid rows, lengths, sink, d_qk 512,
    h_q 64, topk 0); the option-on result also passes the reference check."""
    q, kv, ind, sk, tl = make_case(s_q, s_kv, topk, h_q=h_q, d_qk=d_qk, sink=sink, with_len=with_len,
                                   all_invalid=topk > 0, device="cuda")
    assert P._q_async(True, q)
    (o0, m0, l0), (o1, m1, l1) = _launch_pair(q, kv, ind, sk, tl, (dict(q_async=False), dict(q_async=True)))
    assert not torch.isnan(o0).any() and not torch.isnan(l0).any() and not torch.isnan(m0).any()
    assert torch.equal(o1, o0) and torch.equal(m1, m0) and torch.equal(l1, l0)
    if topk:
        _run(q, kv, ind, sk, tl, name="q_async", q_async=True)


@pytest.mark.gpu
def test_gpu_q_async_unaligned_q_plain_path(monkeypatch):
    """A q view with head stride 584 elements (16-byte rows, not a 16-element multiple; the gate would keep it off
    Gluon, the launcher is called directly): ``q_async=True`` launches the plain-load build (Q_ASYNC False in the
    launch's constexprs), and its results are bit-identical to the same values in an aligned q with and without
    the option."""
    q, kv, ind, sk, tl = make_case(41, 2000, 640, h_q=128, sink=True, with_len=True, all_invalid=True,
                                   device="cuda")
    q_pad = torch.full((41, 128, 584), float("nan"), dtype=torch.bfloat16, device="cuda")[..., :576]
    q_pad.copy_(q)
    assert not P._q_async(True, q_pad) and not P.supported_ws2(q_pad, kv)
    metas = []
    real = P.cached_launcher

    def spy(cache, fn, key, meta, limit):
        metas.append(meta())
        return real(cache, fn, key, meta, limit)

    monkeypatch.setattr(P, "cached_launcher", spy)
    (o0, m0, l0), = _launch_pair(q, kv, ind, sk, tl, (dict(q_async=False), ))
    (o1, m1, l1), = _launch_pair(q_pad, kv, ind, sk, tl, (dict(q_async=True), ))
    (o2, m2, l2), = _launch_pair(q, kv, ind, sk, tl, (dict(q_async=True), ))
    assert [m["Q_ASYNC"] for m in metas] == [False, False, True]
    assert not torch.isnan(o1).any()
    assert torch.equal(o1, o0) and torch.equal(m1, m0) and torch.equal(l1, l0)
    assert torch.equal(o2, o0) and torch.equal(m2, m0) and torch.equal(l2, l0)



# ------------------------------------------------------------------ o_stage (session 19, opt-in)
@functools.lru_cache(maxsize=None)
def _compiled_os(d_pe, has_len, has_sink, q_async, o_stage):
    k = P.compile_sm90_ws2(d_pe, has_len, has_sink, q_async=q_async, o_stage=o_stage)
    return k.asm["ptx"], k.metadata.shared


@pytest.mark.compile
def test_o_stage_plumbing_and_default_ptx():
    """``o_stage``: keyword-only, default :data:`WS2_O_STAGE` (off: opt-in until measured); the kernel's last
    constexpr with default False, so the default build is unchanged (test_default_ptx_unchanged)."""
    import inspect
    for fn in (P.launch_sparse_prefill_gluon_ws2, P.compile_sm90_ws2):
        assert inspect.signature(fn).parameters["o_stage"].default is None
    assert inspect.signature(P.launch_sparse_prefill_gluon_ws2).parameters["o_stage"].kind == \
        inspect.Parameter.KEYWORD_ONLY
    assert P._CONSTEXPRS[-1] == "O_STAGE" and P.WS2_O_STAGE is True       # dispatched since session 19
    assert P._sparse_prefill_gluon_ws2_kernel.arg_names[-1] == "O_STAGE"
    sig = inspect.signature(P._sparse_prefill_gluon_ws2_kernel.fn).parameters
    assert sig["O_STAGE"].default is False
    default = clean_ptx(P.compile_sm90_ws2(64, True, True).asm["ptx"])
    assert default == clean_ptx(_compiled_os(64, True, True, True, True)[0])  # the dispatched build: both on
    assert default != clean_ptx(_compiled_os(64, True, True, False, False)[0])


@pytest.mark.compile
@pytest.mark.parametrize("d_pe,has_len,has_sink,q_async", [(*c, False) for c in _CONFIGS] + [(64, True, True, True),
                                                                                            (0, False, False, True)])
def test_compile_o_stage(d_pe, has_len, has_sink, q_async):
    """O_STAGE: the 128 4-byte output stores per thread (64 per warpgroup) become 32 16-byte ``st.global.v4``
    (16 per warpgroup) after 16 ``stmatrix`` + a barrier + 16 ``ld.shared.v4`` per warpgroup; lse / max_logits
    stores unchanged; shared memory +16 B at most (the PV partition captures the Q tile); the same wgmma / mbarrier
    counts; ptxas: the three loops unchanged in size, 0 spill instructions in them, 0 bytes of spill. With
    ``q_async`` too: both changes present, nothing else."""
    ptx0, sh0 = _compiled_os(d_pe, has_len, has_sink, q_async, False)
    ptx1, sh1 = _compiled_os(d_pe, has_len, has_sink, q_async, True)
    assert sh0 <= sh1 <= sh0 + 16, (sh0, sh1)
    assert ptx0.count("st.global.v4") == 0 and ptx1.count("st.global.v4.b32") == 32
    assert ptx1.count("st.global.b32") == ptx0.count("st.global.b32") - 128
    assert ptx1.count("stmatrix") == ptx0.count("stmatrix") + 32
    assert ptx0.count("ld.shared.v4") == 0 and ptx1.count("ld.shared.v4.b32") == 32
    for pat in ("wgmma.mma_async", "mbarrier.init.shared", "mbarrier.try_wait.parity", "mbarrier.arrive.shared::cta",
                "cp.async.mbarrier.arrive", "cp.async.cg.shared.global", "cp.async.wait_group", "setmaxnreg"):
        assert ptx1.count(pat) == ptx0.count(pat), pat
    # each warpgroup: its stmatrix, then a barrier, then its shared loads, then its 16-byte stores
    for bar in ("bar.sync \t0, 128;", "bar.sync \t2, 128;"):
        last_stsm = max(i for i in _find_all(ptx1, "stmatrix") if _partition_of(ptx1, i) == bar)
        loads = [i for i in _find_all(ptx1, "ld.shared.v4") if _partition_of(ptx1, i) == bar]
        stores = [i for i in _find_all(ptx1, "st.global.v4") if _partition_of(ptx1, i) == bar]
        assert len(loads) == 16 and len(stores) == 16, bar
        assert last_stsm < min(loads) <= max(loads) < min(stores)
        assert bar in ptx1[last_stsm:min(loads)]
    rep0, rep1 = _same_loops_no_spill(ptx0, ptx1, d_pe)
    stg = lambda sass, pat: sum(1 for t in sass.splitlines() if re.search(pat, t))   # noqa: E731
    assert stg(rep0.sass, r"\bSTG\.") == 132 and stg(rep1.sass, r"\bSTG\.") == 36
    assert stg(rep1.sass, r"\bSTG\.E\.128\b") == 32


def _find_all(text, pat):
    i = text.find(pat)
    while i >= 0:
        yield i
        i = text.find(pat, i + 1)


def _partition_of(ptx, pos):
    """The named barrier of the partition the PTX at ``pos`` belongs to: the last ``bar.sync N, 128`` before it
    (softmax warpgroup 0, PV warpgroup 2, producer 3)."""
    return max((ptx.rfind(b, 0, pos), b) for b in ("bar.sync \t0, 128;", "bar.sync \t2, 128;",
                                                  "bar.sync \t3, 128;"))[1]


@pytest.mark.gpu
@pytest.mark.parametrize("s_q,s_kv,topk,d_qk,h_q,sink,with_len", _QA_CASES)
def test_gpu_o_stage_bit_identical(s_q, s_kv, topk, d_qk, h_q, sink, with_len):
    """The staged epilogue stores the same bf16 values: out / lse / max_logits bit-identical to the build without it,
    alone and with ``q_async`` (NaN-poisoned outputs, junk / -1 indices, all-invalid rows -- out 0 --, lengths,
    sink, d_qk 512, h_q 64, topk 0); the option-on result also passes the reference check."""
    q, kv, ind, sk, tl = make_case(s_q, s_kv, topk, h_q=h_q, d_qk=d_qk, sink=sink, with_len=with_len,
                                   all_invalid=topk > 0, device="cuda")
    (o0, m0, l0), (o1, m1, l1), (o2, m2, l2) = _launch_pair(
        q, kv, ind, sk, tl, (dict(o_stage=False), dict(o_stage=True), dict(o_stage=True, q_async=True)))
    assert not torch.isnan(o0).any() and not torch.isnan(l0).any() and not torch.isnan(m0).any()
    assert torch.equal(o1, o0) and torch.equal(m1, m0) and torch.equal(l1, l0)
    assert torch.equal(o2, o0) and torch.equal(m2, m0) and torch.equal(l2, l0)
    if topk:
        _run(q, kv, ind, sk, tl, name="o_stage", o_stage=True)


@pytest.mark.gpu
def test_gpu_o_stage_strided_out():
    """An ``out`` view with row stride 520 elements and an 8-byte base offset (no 16-byte vectors: Triton narrows
    the staged stores) and one with the make_case padding: bit-identical to a contiguous ``out`` without the option,
    nothing written outside the view."""
    q, kv, ind, sk, tl = make_case(23, 1800, 704, h_q=128, sink=True, with_len=True, all_invalid=True,
                                   device="cuda")
    (o0, m0, l0), = _launch_pair(q, kv, ind, sk, tl, (dict(o_stage=False), ))
    for shape, off in (((23, 128, 520), 4), ((24, 129, 640), 0)):
        big = torch.full((shape[0] * shape[1] * shape[2] + off, ), float("nan"), dtype=torch.bfloat16, device="cuda")
        out = big[off:].view(shape)[:23, :128, :512]
        ml = torch.full((23, 128), float("nan"), device="cuda")
        lse = torch.full((23, 128), float("nan"), device="cuda")
        P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 0.5, sk, tl, o_stage=True)
        assert torch.equal(out, o0) and torch.equal(ml, m0) and torch.equal(lse, l0)
        rest = big[off:].view(shape).clone()
        rest[:23, :128, :512] = float("nan")
        assert torch.isnan(rest).all() and torch.isnan(big[:off]).all()
