"""flash_attn_varlen_func & packed variants: validation, interpreter, compile (sm90) and GPU tiers.

Tolerances: FlashMLA ``tests/test_fmha_sm100.py`` (docs/spec/mla.md §5.2): out abs 1e-3 / rel 8.01/128 /
cos 7e-6; lse abs 1e-6 / rel 2.01/65536. Outputs are poisoned with NaN before the kernel runs.
"""
import pytest
import torch

from deepkernels import _backend
from deepkernels.mla.dense_prefill import (DENSE_CANDIDATES, DENSE_CONFIGS, _dense_prefill_fwd_kernel,
                                           _launch_dense_prefill, flash_attn_varlen_func,
                                           flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func)
from deepkernels.reference.mla_prefill import dense_prefill_ref
from deepkernels.testing.numerics import check_is_allclose


def make_case(seqlens_q, seqlens_k, h, h_k, d_qk, device="cpu"):
    cq = torch.tensor([0] + torch.tensor(seqlens_q).cumsum(0).tolist(), dtype=torch.int32, device=device)
    ck = torch.tensor([0] + torch.tensor(seqlens_k).cumsum(0).tolist(), dtype=torch.int32, device=device)
    tq, tk = int(cq[-1]), int(ck[-1])
    # non-contiguous views: token stride padded, heads interleaved with junk
    q = torch.randn(tq, h, d_qk + 64, device=device).bfloat16()[..., :d_qk]
    k = torch.randn(tk, h_k, d_qk + 64, device=device).bfloat16()[..., :d_qk]
    v = (torch.randn(tk, h_k, 128 + 64, device=device) / 4).bfloat16()[..., :128]
    return q, k, v, cq, ck


def run_and_check(q, k, v, cq, ck, max_q, scale, causal, config=None):
    total_q, h, _ = q.shape
    out = torch.full((total_q, h, 128), float("nan"), dtype=q.dtype, device=q.device)
    lse_hm = torch.full((h, total_q), float("nan"), device=q.device)
    _launch_dense_prefill(out, lse_hm, q, k, v, cq, ck, max_q, scale, causal, config=config)
    ro, rl = dense_prefill_ref(q, k, v, cq, ck, scale, causal)
    assert check_is_allclose("out", out.float(), ro, abs_tol=1e-3, rel_tol=8.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose("lse", lse_hm.t(), rl, abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert not torch.isnan(out).any()


@pytest.mark.reference
def test_validation_errors():
    q, k, v, cq, ck = make_case([4], [4], 4, 2, 192)
    f = flash_attn_varlen_func
    with pytest.raises(ValueError, match="d_qk"):
        f(q[..., :160], k[..., :160], v, cq, ck, 4, 4)
    with pytest.raises(ValueError, match="multiple"):
        f(q[:, :3], k, v, cq, ck, 4, 4)
    with pytest.raises(TypeError, match="cu_seqlens_qo"):
        f(q, k, v, cq.long(), ck, 4, 4)
    with pytest.raises(ValueError, match="dropout_p"):
        f(q, k, v, cq, ck, 4, 4, dropout_p=0.1)
    with pytest.raises(ValueError, match="max_seqlen_qo"):
        f(q, k, v, cq, ck, 2, 4)
    with pytest.raises(ValueError, match="cu_seqlens_kv"):
        f(q, k, v, cq, torch.tensor([0, 3], dtype=torch.int32), 4, 4)
    with pytest.raises(TypeError, match="k"):
        f(q, k.half(), v, cq, ck, 4, 4)


@pytest.mark.reference
def test_cpu_fallback_and_packing():
    if _backend.interpret_mode():
        pytest.skip("CPU tensors run the kernel under the interpreter")
    q, k, v, cq, ck = make_case([5, 3], [5, 3], 2, 2, 128)
    qkv = torch.cat([q, k, v], dim=-1)
    o1, l1 = flash_attn_varlen_qkvpacked_func(qkv, cq, 5, 128, causal=True)
    o2, l2 = flash_attn_varlen_kvpacked_func(q, torch.cat([k, v], -1), cq, cq, 5, 5, 128, causal=True)
    o3, l3 = flash_attn_varlen_func(q, k, v, cq, cq, 5, 5, causal=True)
    assert torch.equal(o1, o3) and torch.equal(o2, o3) and torch.equal(l1, l3)
    assert l3.shape == (8, 2) and l3.stride() == (1, 8)        # transposed [h, total_q] buffer, as upstream


@pytest.mark.interpret
@pytest.mark.parametrize("d_qk", [192, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_interpret_dense(d_qk, causal):
    # s_q > s_k (rows with no key when causal), empty sequences, tails of the 16-row tiles
    q, k, v, cq, ck = make_case([5, 0, 37, 3], [5, 7, 33, 0], 4, 2, d_qk)
    run_and_check(q, k, v, cq, ck, 37, (d_qk + 100) ** -0.5, causal, config=(16, 16, 4, 2))


@pytest.mark.interpret
def test_interpret_packed_public():
    q, k, v, cq, ck = make_case([9, 4], [9, 4], 2, 2, 128)
    qkv = torch.cat([q, k, v], dim=-1)
    o, l = flash_attn_varlen_qkvpacked_func(qkv, cq, 9, 128, causal=True)
    ro, rl = dense_prefill_ref(q, k, v, cq, cq, None, True)
    assert check_is_allclose("out", o.float(), ro, abs_tol=1e-3, rel_tol=8.01 / 128, cos_diff_tol=7e-6)
    e, el = flash_attn_varlen_func(q[:0], k[:0], v[:0], torch.zeros(1, dtype=torch.int32),
                                   torch.zeros(1, dtype=torch.int32), 0, 0)
    assert e.shape == (0, 2, 128) and el.shape == (0, 2)


DENSE_SIG = dict(q_ptr="*bf16", k_ptr="*bf16", v_ptr="*bf16", out_ptr="*bf16", lse_ptr="*fp32", cu_q_ptr="*i32",
                 cu_k_ptr="*i32", sm_scale="fp32", scale_log2="fp32", n_m_blocks="i32", total_q="i32",
                 stride_qt="i32", stride_qh="i32", stride_kt="i32", stride_kh="i32", stride_vt="i32",
                 stride_vh="i32", stride_ot="i32", stride_oh="i32", H="i32", GROUP="i32")


@pytest.mark.compile
@pytest.mark.parametrize("d_qk", [192, 128])
@pytest.mark.parametrize("causal", [False, True])
def test_compile_dense_sm90(d_qk, causal):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT

    from test_mla_prefill import compile_hinted
    bm, bn, nw, ns = DENSE_CONFIGS[d_qk]
    c = compile_hinted(_dense_prefill_fwd_kernel, DENSE_SIG,
                       dict(D1=128, D2=d_qk - 128, DV=128, BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal,
                            UPCAST=False, NUM_STAGES=ns), nw, ns)
    assert c.has_wgmma and "cp.async" in c.ptx
    assert c.shared <= SM90_SMEM_LIMIT and not c.uses_local_memory


@pytest.mark.gpu
@pytest.mark.parametrize("d_qk", [192, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("h,h_k", [(16, 16), (32, 4)])
@pytest.mark.parametrize("lens", [([512, 512], [512, 512]), ([300, 0, 1000, 17], [700, 5, 1000, 0]),
                                  ([129, 64], [65, 64])])
def test_gpu_dense(d_qk, causal, h, h_k, lens):
    q, k, v, cq, ck = make_case(lens[0], lens[1], h, h_k, d_qk, device="cuda")
    run_and_check(q, k, v, cq, ck, max(lens[0]), (d_qk + 100) ** -0.5, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("d_qk", [192, 128])
def test_gpu_dense_all_candidates(d_qk):
    q, k, v, cq, ck = make_case([700, 257], [700, 300], 8, 8, d_qk, device="cuda")
    for cfg in DENSE_CANDIDATES[d_qk]:
        for causal in (False, True):
            run_and_check(q, k, v, cq, ck, 700, d_qk ** -0.5, causal, config=cfg)


@pytest.mark.gpu
def test_gpu_dense_public_packed():
    q, k, v, cq, ck = make_case([1024, 33], [1024, 33], 8, 8, 192, device="cuda")
    qkv = torch.cat([q, k, v], dim=-1)
    o, l = flash_attn_varlen_qkvpacked_func(qkv, cq, 1024, 192, causal=True)
    ro, rl = dense_prefill_ref(q, k, v, cq, cq, None, True)
    assert check_is_allclose("out", o.float(), ro, abs_tol=1e-3, rel_tol=8.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose("lse", l, rl, abs_tol=1e-6, rel_tol=2.01 / 65536)
