"""Experimental Gluon warp-specialised dense prefill (deepkernels.mla._gluon_dense_prefill): compile tier on any
machine; GPU tier against the float reference with FlashMLA's dense-prefill tolerances (data of
tests/test_dense_prefill.py: non-contiguous heads with junk columns, varlen incl. empty sequences, GQA, causal with
s_q > s_k, NaN-poisoned outputs). The kernel is not dispatched; these tests are its first device check."""
import pytest
import torch

from deepkernels.mla import _gluon_dense_prefill as G
from deepkernels.mla import _gluon_dense_prefill_v2 as G2
from deepkernels.reference.mla_prefill import dense_prefill_ref
from deepkernels.testing.numerics import check_is_allclose

from test_dense_prefill import make_case

pytestmark = pytest.mark.skipif(not G.available(), reason=f"Gluon not importable: {G._IMPORT_ERROR!r}")


@pytest.mark.compile
@pytest.mark.parametrize("d_qk", [192, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_compile_sm90(d_qk, causal):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT, ptxas_sm90
    k = G.compile_sm90(d_qk, causal)
    ptx = k.asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "setmaxnreg" in ptx
    # per consumer warpgroup: S = d_qk / 16 k-steps, P V = 64 / 16; two consumers
    assert ptx.count("wgmma.mma_async") == 2 * (d_qk // 16 + 4)
    assert k.metadata.shared <= SM90_SMEM_LIMIT
    rep = ptxas_sm90(ptx)
    if rep is not None:
        assert rep.spill_bytes == 0, rep.log


@pytest.mark.gpu
@pytest.mark.parametrize("d_qk", [192, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("h,h_k", [(16, 16), (32, 4)])
@pytest.mark.parametrize("lens", [([512, 512], [512, 512]), ([300, 0, 1000, 17], [700, 5, 1000, 0]),
                                  ([129, 64], [65, 300])])
def test_gpu_dense(d_qk, causal, h, h_k, lens):
    q, k, v, cq, ck = make_case(*lens, h, h_k, d_qk, device="cuda")
    assert G.supported(q, k, v)
    total_q = q.shape[0]
    out = torch.full((total_q, h, 128), float("nan"), dtype=q.dtype, device="cuda")
    lse_hm = torch.full((h, total_q), float("nan"), device="cuda")
    G.launch_dense_prefill_gluon(out, lse_hm, q, k, v, cq, ck, max(lens[0]), d_qk ** -0.5, causal)
    ro, rl = dense_prefill_ref(q, k, v, cq, ck, d_qk ** -0.5, causal)
    assert check_is_allclose("out", out.float(), ro, abs_tol=1e-3, rel_tol=8.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose("lse", lse_hm.t(), rl, abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert not torch.isnan(out).any()


# ---- second generation (mla/_gluon_dense_prefill_v2.py): 128-key tiles, S_j issued with PV_{j-1}, ping-pong
@pytest.mark.compile
@pytest.mark.parametrize("variant", G2.VARIANTS)
@pytest.mark.parametrize("d_qk", [192, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_compile_sm90_v2(variant, d_qk, causal):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT, ptxas_sm90
    k = G2.compile_sm90(d_qk, causal, variant=variant)
    ptx = k.asm["ptx"]
    assert "cp.async.bulk.tensor" in ptx and "setmaxnreg" in ptx
    # per consumer warpgroup: prologue S (d_qk/16 k-steps), unmasked and masked loop bodies (S + PV 128/16 = 8),
    # epilogue PV; two consumers
    assert ptx.count("wgmma.mma_async") == 2 * (3 * (d_qk // 16) + 3 * 8)
    assert "wgmma.wait_group.sync.aligned 1" in ptx            # S_j waited for while PV_{j-1} is in flight
    assert k.metadata.shared <= SM90_SMEM_LIMIT
    rep = ptxas_sm90(ptx, sass=True)
    if rep is not None:
        assert "C7512" not in rep.log and "C7514" not in rep.log, rep.log   # wgmma not serialised
        # ptxas spills loop-invariant mask/address values (~200-320 bytes, measured): stored in the prologue,
        # reloaded in the epilogue and in the MASKED loop (~17 LDL per masked tile; that loop runs about one tile
        # per warpgroup: the tail past s_k, the causal diagonal). The unmasked loop — the hot one — must have none
        # in its softmax (DEPBAR.LE gsb0, 0x1 to the next DEPBAR ... 0x0), and the PV wait must come after the
        # softmax's exps (ptxas hoists it when anything after it wants O; see _v2_step)
        lines = rep.sass.splitlines()
        dep1 = [i for i, ln in enumerate(lines) if "WARPGROUP.DEPBAR.LE gsb0, 0x1" in ln]
        assert len(dep1) == 4, "expected one S-only wgmma wait per steady-state loop (2 loops x 2 consumers)"
        for n, i in enumerate(dep1):
            end = next(e for e in range(i, len(lines)) if "WARPGROUP.DEPBAR.LE gsb0, 0x0" in lines[e])
            if n % 2 == 0:      # SASS order per consumer: unmasked loop, then masked loop
                assert not any("LDL" in ln or "STL" in ln for ln in lines[i:end]), "spill in the hot loop"
                # 64 exps per thread per tile (+2 alphas); measured 60-66 before the PV wait
                assert sum("MUFU.EX2" in ln for ln in lines[i:end]) >= 56, "PV wait hoisted into the softmax"
        assert rep.spill_bytes <= 512, rep.log


@pytest.mark.gpu
@pytest.mark.parametrize("variant", G2.VARIANTS)
@pytest.mark.parametrize("d_qk", [192, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens", [([300, 0, 1000, 17], [700, 5, 1000, 0]),     # empty seqs, s_k = 0 (no key)
                                  ([1, 129, 200, 640], [1, 65, 0, 384]),       # length 1, s_q > s_k (rows see no key)
                                  ([512, 384], [512, 1024])])                  # several full / masked tiles
def test_gpu_dense_v2(variant, d_qk, causal, lens):
    h, h_k = 32, 4
    q, k, v, cq, ck = make_case(*lens, h, h_k, d_qk, device="cuda")
    assert G2.supported(q, k, v)
    total_q = q.shape[0]
    out = torch.full((total_q, h, 128), float("nan"), dtype=q.dtype, device="cuda")
    lse_hm = torch.full((h, total_q), float("nan"), device="cuda")
    G2.launch_dense_prefill_gluon_v2(out, lse_hm, q, k, v, cq, ck, max(lens[0]), d_qk ** -0.5, causal,
                                     variant=variant)
    ro, rl = dense_prefill_ref(q, k, v, cq, ck, d_qk ** -0.5, causal)
    assert check_is_allclose("out", out.float(), ro, abs_tol=1e-3, rel_tol=8.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose("lse", lse_hm.t(), rl, abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert not torch.isnan(out).any()


def test_v2_rejects_unknown_variant():
    with pytest.raises(ValueError, match="variant"):
        G2._pingpong("nope")
