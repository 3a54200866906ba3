"""Gluon sm90 sparse prefill kernel (deepkernels.mla._gluon_sparse_prefill): compile tier on any machine, GPU tier
against the float reference with FlashMLA's prefill tolerances (same data generation as tests/test_mla_prefill.py:
randn/10 inputs, junk indices, NaN in every unreferenced KV row, non-contiguous views, NaN-poisoned outputs)."""
from __future__ import annotations

import pytest
import torch

from deepkernels.mla import _gluon_sparse_prefill as G
from deepkernels.reference.mla_prefill import sparse_prefill_ref
from deepkernels.testing.numerics import check_is_allclose

from test_mla_prefill import make_case

pytestmark = pytest.mark.skipif(not G.available(), reason=f"Gluon not importable: {G._IMPORT_ERROR!r}")


# the single-partition kernel; the warp-specialised one (dispatched)
VARIANTS = ["single", "ws"]


@pytest.mark.compile
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("d_pe,has_len,has_sink", [(64, False, False), (64, True, True), (0, True, False)])
def test_compile_sm90(d_pe, has_len, has_sink, variant):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT, ptxas_sm90
    k = G.compile_sm90(d_pe, has_len, has_sink, variant=variant)
    ptx = k.asm["ptx"]
    assert "wgmma.mma_async" in ptx
    assert "cp.async" in ptx and ("cp.async.wait_group" in ptx or variant != "single")
    k_steps = (512 + d_pe) // 16
    # per warpgroup: S = (512 + d_pe) / 16 k-steps, PV = 64 / 16; nothing is computed twice across the
    # warpgroups (the [4, 2] layouts split N)
    assert ptx.count("wgmma.mma_async") == k_steps + 4
    assert k.metadata.shared <= SM90_SMEM_LIMIT
    if variant != "single":     # producer partition: cp.async tracked by an mbarrier, no commit groups
        assert "cp.async.mbarrier.arrive" in ptx and "setmaxnreg" in ptx
    rep = ptxas_sm90(ptx)
    if rep is not None:     # the WS kernel's 384 threads cap the entry at 168 registers: a few setup bytes spill
        assert rep.spill_bytes <= {"single": 0, "ws": 64}[variant], rep.log


def _run(q, kv, ind, sk, tl, sm_scale=0.5, name="", variant=None):
    s_q, h_q, _ = q.shape
    out = torch.full((s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device=q.device)
    ml = torch.full((s_q, h_q), float("nan"), device=q.device)
    lse = torch.full((s_q, h_q), float("nan"), device=q.device)
    assert G.supported(q, kv)
    G.launch_sparse_prefill_gluon(out, ml, lse, q, kv, ind, sm_scale, sk, tl, variant=variant)
    ro, rml, rlse = sparse_prefill_ref(q, kv, ind, sm_scale, 512, sk, tl)
    assert check_is_allclose(f"{name} out", out.float(), ro, abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose(f"{name} lse", lse, rlse, abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert check_is_allclose(f"{name} max_logits", ml, rml, abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any() and not torch.isnan(ml).any()


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("d_qk,h_q", [(576, 128), (576, 64), (512, 64), (512, 128)])
@pytest.mark.parametrize("s_kv,topk", [(592, 128), (1521, 512), (114, 384), (4096, 100)])
def test_gpu_regular(d_qk, h_q, s_kv, topk, variant):
    q, kv, ind, sk, tl = make_case(62, s_kv, topk, h_q=h_q, d_qk=d_qk, device="cuda")
    _run(q, kv, ind, sk, tl, name=f"{d_qk}/{h_q}/{s_kv}/{topk}", variant=variant)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("sink,with_len", [(False, False), (True, False), (False, True), (True, True)])
def test_gpu_features(sink, with_len, variant):
    q, kv, ind, sk, tl = make_case(213, 1592, 384, h_q=128, sink=sink, with_len=with_len, all_invalid=True,
                                   device="cuda")
    _run(q, kv, ind, sk, tl, name=f"sink={sink} len={with_len}", variant=variant)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("s_q,s_kv,topk", [(1, 128, 128), (1234, 4321, 4096), (1024, 32, 2048), (3, 64, 0),
                                           (5, 200, 16), (5, 300, 48)])
def test_gpu_corners(s_q, s_kv, topk, variant):
    # all-invalid rows, blocks with no valid index (s_kv << topk), topk = 0, one partial block
    q, kv, ind, sk, tl = make_case(s_q, s_kv, topk, h_q=128, sink=True, all_invalid=topk > 0, device="cuda")
    _run(q, kv, ind, sk, tl, variant=variant)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("s_q,s_kv,topk,with_len", [(37, 1000, 192, False), (29, 3000, 448, True),
                                                    (16, 100, 320, False), (9, 5000, 1088, True)])
def test_gpu_odd_blocks(s_q, s_kv, topk, with_len, variant):
    # an odd number of 64-token blocks (3, 7, 5, 17; topk not a multiple of 128): the 2-slot ring ends on either
    # slot and phase; with topk_length the per-row block count varies (odd and even)
    q, kv, ind, sk, tl = make_case(s_q, s_kv, topk, h_q=128, sink=True, with_len=with_len, all_invalid=True,
                                   device="cuda")
    _run(q, kv, ind, sk, tl, name=f"odd {s_q}/{s_kv}/{topk}/{with_len}", variant=variant)


@pytest.mark.gpu
@pytest.mark.parametrize("variant", VARIANTS)
def test_gpu_huge_logits(variant):
    # FlashMLA d626421: exp2 of the max element is exactly 1 even with huge logits; 3 blocks (odd), the value 32 in
    # every valid row, the second query's row valid for 100 of 192 positions only
    q = torch.full((2, 64, 576), 32.0, device="cuda").bfloat16()
    kv = torch.full((200, 1, 576), 32.0, device="cuda").bfloat16()
    ind = torch.arange(192, device="cuda", dtype=torch.int32).view(1, 1, 192).repeat(2, 1, 1)
    ind[1, 0, 100:] = -1
    out = torch.empty(2, 64, 512, dtype=torch.bfloat16, device="cuda")
    ml, lse = torch.empty(2, 64, device="cuda"), torch.empty(2, 64, device="cuda")
    G.launch_sparse_prefill_gluon(out, ml, lse, q, kv, ind, 1.0, variant=variant)
    assert torch.isfinite(lse).all() and (out.float() - 32).abs().max() == 0


@pytest.mark.gpu
def test_gpu_matches_triton_kernel_and_huge_logits():
    from deepkernels.mla.prefill import _launch_sparse_prefill
    q, kv, ind, sk, tl = make_case(97, 3000, 1024, h_q=128, sink=True, with_len=True, device="cuda")
    outs = []
    for launch in (G.launch_sparse_prefill_gluon, _launch_sparse_prefill):
        out = torch.empty(97, 128, 512, dtype=torch.bfloat16, device="cuda")
        ml, lse = torch.empty(97, 128, device="cuda"), torch.empty(97, 128, device="cuda")
        launch(out, ml, lse, q, kv, ind, 0.5, sk, tl)
        outs.append((out.float(), ml, lse))
    assert check_is_allclose("gluon vs triton out", outs[0][0], outs[1][0], abs_tol=8e-4, rel_tol=3.01 / 128,
                             cos_diff_tol=7e-6)
    # FlashMLA d626421: exp2 of the max element is exactly 1 even with huge logits
    q = torch.full((1, 64, 576), 32.0, device="cuda").bfloat16()
    kv = torch.full((8, 1, 576), 32.0, device="cuda").bfloat16()
    ind = torch.arange(8, device="cuda", dtype=torch.int32).view(1, 1, 8)
    out = torch.empty(1, 64, 512, dtype=torch.bfloat16, device="cuda")
    ml, lse = torch.empty(1, 64, device="cuda"), torch.empty(1, 64, device="cuda")
    G.launch_sparse_prefill_gluon(out, ml, lse, q, kv, ind, 1.0)
    assert torch.isfinite(lse).all() and (out.float() - 32).abs().max() == 0
