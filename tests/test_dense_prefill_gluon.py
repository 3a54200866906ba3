"""Experimental Gluon warp-specialised dense prefill (deepkernels.mla._gluon_dense_prefill): compile tier on any
machine; GPU tier against the float reference with FlashMLA's dense-prefill tolerances (data of
tests/test_dense_prefill.py: non-contiguous heads with junk columns, varlen incl. empty sequences, GQA, causal with
s_q > s_k, NaN-poisoned outputs). The kernel is not dispatched; these tests are its first device check."""
import pytest
import torch

from deepkernels.mla import _gluon_dense_prefill as G
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
