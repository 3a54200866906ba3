"""Gluon dense prefill (deepkernels.mla._gluon_dense_prefill, dispatched by deepkernels.mla.dense_prefill on sm90):
compile tier on any machine (PTX + SASS schedule checks); GPU tier against the float reference with FlashMLA's
dense-prefill tolerances (data of tests/test_dense_prefill.py: non-contiguous heads with junk columns, varlen incl.
empty sequences, GQA and MHA, causal with s_q > s_k, NaN-poisoned outputs); reference tier: the kernel's tile
schedule emulated on the CPU."""
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
@pytest.mark.parametrize("d_qk", [192, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("h,h_k", [(32, 4), (16, 16)])
@pytest.mark.parametrize("lens", [([300, 0, 1000, 17], [700, 5, 1000, 0]),     # empty seqs, s_k = 0 (no key)
                                  ([1, 129, 200, 640], [1, 65, 0, 384]),       # length 1, s_q > s_k (rows see no key)
                                  ([512, 384], [512, 1024]),                   # several full / masked tiles
                                  ([512, 512], [512, 512]),                    # full 128-row blocks, s_q == s_k
                                  ([129, 64], [65, 300])])                     # 1-row last block; s_q > / < s_k
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


def _emulate(q, k, v, cq, ck, max_q, scale, causal):
    """The consumer's schedule in PyTorch on the CPU, step for step: 128-row CTAs of two 64-row warpgroups,
    n_tiles and the unmasked / masked split (n_full), masking only on masked tiles, P packed to bf16 for PV,
    O rescaled by alpha_{j-1} just before PV_{j-1}, TMA zero-fill past total_k. Mirrors _gluon_dense_prefill
    (keep in step with it); the kernel itself cannot run without a GPU."""
    tq, H, d = q.shape
    G, sl2, n_m, big = H // k.shape[1], scale * 1.4426950408889634, -(-max_q // 128), torch.tensor(float("inf"))
    out, lse = torch.full((tq, H, 128), float("nan")), torch.full((H, tq), float("nan"))
    for b in range(cq.shape[0] - 1):
        q0, s_q, k0, s_k = int(cq[b]), int(cq[b + 1] - cq[b]), int(ck[b]), int(ck[b + 1] - ck[b])
        diag = s_k - s_q
        for h in range(H):
            def tile(j):
                idx = k0 + j * 128 + torch.arange(128)
                kk, vv, ok = torch.zeros(128, d), torch.zeros(128, 128), idx < k.shape[0]
                kk[ok], vv[ok] = k[idx[ok], h // G].float(), v[idx[ok], h // G].float()
                return kk, vv
            for m in range(n_m):
                hi = min(max(min((m + 1) * 128, s_q) + diag, 0), s_k) if causal else s_k
                n_tiles = -(-(hi if m * 128 < s_q else 0) // 128)
                for row_lo in (m * 128, m * 128 + 64):
                    rows = torch.arange(row_lo, row_lo + 64)
                    qq, okq = torch.zeros(64, d), rows < s_q
                    qq[okq] = q[q0 + rows[okq], h].float()

                    def softmax(s, j, m_i, l_i, mask):
                        if mask:
                            keys = j * 128 + torch.arange(128)
                            ok = (keys < s_k)[None, :] & ((keys[None, :] <= rows[:, None] + diag) if causal else True)
                            s = torch.where(ok, s, -big)
                        m_new = torch.maximum(m_i, s.max(1).values)
                        ms = torch.where(m_new == -big, 0.0, m_new) * sl2
                        alpha, p = torch.exp2(m_i * sl2 - ms), torch.exp2(s * sl2 - ms[:, None])
                        return m_new, l_i * alpha + p.sum(1), p, alpha

                    m_i, l_i, acc = torch.full((64,), -big), torch.zeros(64), torch.zeros(64, 128)
                    if n_tiles > 0:
                        m_i, l_i, p32, alpha = softmax(qq @ tile(0)[0].T, 0, m_i, l_i, True)
                        n_full = s_k // 128
                        if causal:
                            n_full = min(n_full, max(row_lo + diag + 1, 0) // 128)
                        n_full = min(max(n_full, 1), n_tiles)
                        for j in range(1, n_tiles):
                            s = qq @ tile(j)[0].T
                            acc = acc * alpha[:, None] + p32.bfloat16().float() @ tile(j - 1)[1]
                            m_i, l_i, p32, alpha = softmax(s, j, m_i, l_i, j >= n_full)
                        acc = acc * alpha[:, None] + p32.bfloat16().float() @ tile(n_tiles - 1)[1]
                    empty = l_i == 0
                    l_safe = torch.where(empty, 1.0, l_i)
                    st = rows < s_q
                    out[q0 + rows[st], h] = (acc * torch.where(empty, 0.0, 1 / l_safe)[:, None])[st]
                    lse[h, q0 + rows[st]] = torch.where(empty, big, m_i * scale + torch.log(l_safe))[st]
    return out, lse


@pytest.mark.reference
@pytest.mark.parametrize("d_qk", [192, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("lens", [([300, 0, 1000, 17], [700, 5, 1000, 0]), ([1, 129, 200, 640], [1, 65, 0, 384]),
                                  ([512, 384], [512, 1024])])
def test_schedule_emulation(d_qk, causal, lens):
    """The kernel's tile schedule (emulated on the CPU) meets the GPU tests' tolerances on their data."""
    torch.manual_seed(0)
    q, k, v, cq, ck = make_case(*lens, 2, 1, d_qk)
    out, lse = _emulate(q, k, v, cq, ck, max(lens[0]), d_qk ** -0.5, causal)
    ro, rl = dense_prefill_ref(q, k, v, cq, ck, d_qk ** -0.5, causal)
    assert check_is_allclose("out", out.bfloat16().float(), ro, abs_tol=1e-3, rel_tol=8.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose("lse", lse.t(), rl, abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert not torch.isnan(out).any()
