"""flash_mla_sparse_fwd: validation (CPU), interpreter, compile (sm90) and GPU tiers.

Tolerances and data generation follow FlashMLA ``tests/test_flash_mla_sparse_prefill.py`` (docs/spec/mla.md
§5.2-§5.4): out abs 8e-4 / rel 3.01/128 / cos 7e-6; lse and max_logits abs 1e-6 / rel 2.01/65536.
Outputs are poisoned with NaN before the kernel runs; anomaly-position matching then proves every element
was written. KV rows no valid in-length index points at hold NaN, so any stray read shows up.
"""
import math

import pytest
import torch

from deepkernels import _backend
from deepkernels.mla.prefill import (SPARSE_CANDIDATES, SPARSE_CONFIGS, _launch_sparse_prefill,
                                     _sparse_prefill_fwd_kernel, flash_mla_sparse_fwd)
from deepkernels.reference.mla_prefill import sparse_prefill_ref, sparse_valid_mask
from deepkernels.testing.numerics import check_is_allclose

JUNK = [-2**31, -123456, -1, 114514, 1919810, 2147480000, 2**31 - 1]   # + s_kv, added per case


def _noncontig(t: torch.Tensor) -> torch.Tensor:
    """Same values, outer dims +1 and last dim +128 then sliced (FlashMLA kernelkit style)."""
    big = torch.empty([s + 1 for s in t.shape[:-1]] + [t.shape[-1] + 128], dtype=t.dtype, device=t.device)
    big.fill_(float("nan") if t.is_floating_point() else -7)
    view = big[tuple(slice(0, s) for s in t.shape[:-1])][..., :t.shape[-1]]
    view.copy_(t)
    return view


def make_case(s_q, s_kv, topk, h_q=64, d_qk=576, *, sink=False, with_len=False, all_invalid=False,
              device="cpu", noncontig=True):
    def rnd(*shape):
        x = torch.randn(*shape, device=device) / 10 + (torch.rand(1, device=device) - 0.5) / 10
        return x.clamp(-10, 10).to(torch.bfloat16)
    q = rnd(s_q, h_q, d_qk)
    kv = rnd(s_kv, 1, d_qk)
    ind = torch.empty(s_q, 1, topk, dtype=torch.int32, device=device)
    junk = torch.tensor(JUNK + [s_kv], dtype=torch.int32, device=device)
    for i in range(s_q):
        n = min(s_kv, topk)
        perm = torch.randperm(s_kv, device=device)[:n].to(torch.int32)
        row = junk[torch.randint(0, len(junk), (topk,), device=device)]
        row[:n] = perm
        ind[i, 0] = row[torch.randperm(topk, device=device)]
    if all_invalid:
        bad = torch.randn(s_q, device=device) < -2
        bad[0] = True
        ind[bad] = junk[torch.randint(0, len(junk), (int(bad.sum()), 1, topk), device=device)]
    tl = None
    if with_len:
        tl = torch.randint(0, max(topk + 1, 64), (s_q,), device=device).clamp(max=topk).to(torch.int32)
    sk = None
    if sink:
        sk = torch.randn(h_q, device=device)
        sk[torch.rand(h_q, device=device) < 0.3] = math.inf
        sk[torch.rand(h_q, device=device) < 0.3] = -math.inf
    # NaN into every KV row that no valid in-length index references
    used = torch.zeros(s_kv, dtype=torch.bool, device=device)
    valid = sparse_valid_mask(ind[:, 0], s_kv, tl)
    used[ind[:, 0][valid].long()] = True
    kv[~used] = float("nan")
    if noncontig:
        q, kv, ind = _noncontig(q), _noncontig(kv), _noncontig(ind)
    return q, kv, ind, sk, tl


def run_and_check(q, kv, ind, sk, tl, sm_scale=0.5, config=None, name=""):
    s_q, h_q, _ = q.shape
    out = torch.full((s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device=q.device)
    ml = torch.full((s_q, h_q), float("nan"), device=q.device)
    lse = torch.full((s_q, h_q), float("nan"), device=q.device)
    _launch_sparse_prefill(out, ml, lse, q, kv, ind, sm_scale, sk, tl, config=config)
    ro, rml, rlse = sparse_prefill_ref(q, kv, ind, sm_scale, 512, sk, tl)
    assert check_is_allclose(f"{name} out", out.float(), ro, abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose(f"{name} lse", lse, rlse, abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert check_is_allclose(f"{name} max_logits", ml, rml, abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any() and not torch.isnan(ml).any()
    return out, ml, lse


# ---------------------------------------------------------------- validation (no kernel, CPU) ---------
@pytest.mark.reference
def test_validation_errors():
    q = torch.randn(4, 64, 576).bfloat16()
    kv = torch.randn(10, 1, 576).bfloat16()
    ind = torch.zeros(4, 1, 128, dtype=torch.int32)
    with pytest.raises(TypeError, match="q"):
        flash_mla_sparse_fwd(q.float(), kv, ind, 0.1)
    with pytest.raises(ValueError, match="h_q"):
        flash_mla_sparse_fwd(torch.randn(4, 48, 576).bfloat16(), kv, ind, 0.1)
    with pytest.raises(ValueError, match="d_qk"):
        flash_mla_sparse_fwd(torch.randn(4, 64, 320).bfloat16(), kv, ind, 0.1)
    with pytest.raises(ValueError, match="kv"):
        flash_mla_sparse_fwd(q, torch.randn(10, 2, 576).bfloat16(), ind, 0.1)
    with pytest.raises(TypeError, match="indices"):
        flash_mla_sparse_fwd(q, kv, ind.long(), 0.1)
    with pytest.raises(ValueError, match="indices"):
        flash_mla_sparse_fwd(q, kv, ind[:3], 0.1)
    with pytest.raises(ValueError, match="d_v"):
        flash_mla_sparse_fwd(q, kv, ind, 0.1, d_v=576)
    with pytest.raises(ValueError, match="sm_scale"):
        flash_mla_sparse_fwd(q, kv, ind, float("nan"))
    with pytest.raises(ValueError, match="attn_sink"):
        flash_mla_sparse_fwd(q, kv, ind, 0.1, attn_sink=torch.zeros(32))
    with pytest.raises(ValueError, match="topk_length"):
        flash_mla_sparse_fwd(q, kv, ind, 0.1, topk_length=torch.zeros(5, dtype=torch.int32))


@pytest.mark.reference
def test_cpu_fallback_matches_reference():
    if _backend.interpret_mode():
        pytest.skip("CPU tensors run the kernel under the interpreter")
    q, kv, ind, sk, tl = make_case(5, 50, 64, h_q=16, sink=True, with_len=True, all_invalid=True)
    out, ml, lse = flash_mla_sparse_fwd(q, kv, ind, 0.5, attn_sink=sk, topk_length=tl)
    ro, rml, rlse = sparse_prefill_ref(q, kv, ind, 0.5, 512, sk, tl)
    assert out.dtype == torch.bfloat16 and out.shape == (5, 16, 512) and lse.is_contiguous()
    assert check_is_allclose("out", out.float(), ro, abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)


# ---------------------------------------------------------------- interpreter tier --------------------
@pytest.mark.interpret
@pytest.mark.parametrize("h_q,d_qk,cfg", [(16, 576, None), (64, 512, None), (64, 576, (64, 16, 8, 2, True)),
                                          (32, 576, (32, 32, 4, 2, False))])
@pytest.mark.parametrize("feat", ["plain", "sink_len"])
def test_interpret_sparse(h_q, d_qk, cfg, feat):
    q, kv, ind, sk, tl = make_case(3, 40, 70, h_q=h_q, d_qk=d_qk, sink=feat != "plain",
                                   with_len=feat != "plain", all_invalid=True)
    run_and_check(q, kv, ind, sk, tl, config=cfg)


@pytest.mark.interpret
def test_interpret_public_op_and_empty():
    q, kv, ind, sk, tl = make_case(2, 30, 32, h_q=16)
    out, ml, lse = flash_mla_sparse_fwd(q, kv, ind, 0.5)
    ro, _, rlse = sparse_prefill_ref(q, kv, ind, 0.5)
    assert check_is_allclose("out", out.float(), ro, abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
    o0, m0, l0 = flash_mla_sparse_fwd(q[:0], kv, ind[:0], 0.5)           # s_q = 0
    assert o0.shape == (0, 16, 512)
    z = torch.zeros(2, dtype=torch.int32)
    o1, m1, l1 = flash_mla_sparse_fwd(q, kv, ind, 0.5, topk_length=z)     # topk_length 0
    assert (o1 == 0).all() and torch.isposinf(l1).all() and torch.isneginf(m1).all()
    o2, m2, l2 = flash_mla_sparse_fwd(q, kv[:0], ind, 0.5)                # s_kv = 0: all invalid
    assert (o2 == 0).all() and torch.isposinf(l2).all()


# ---------------------------------------------------------------- compile tier -----------------------
def compile_hinted(fn, sig, constexprs, num_warps, num_stages):
    """Like deepkernels.testing.compile_sm90, plus the 16-divisibility hints Triton's launcher derives at
    run time for aligned pointers and strides (without them no cp.async pipelining is generated)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from deepkernels.testing.compile import CompiledSM90
    sig = dict(sig)
    attrs = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(fn.arg_names)
             if n in sig and (sig[n].startswith("*") or n.startswith("stride"))}
    sig.update({k: "constexpr" for k in constexprs})
    c = triton.compile(ASTSource(fn, sig, dict(constexprs), attrs), target=GPUTarget("cuda", 90, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    return CompiledSM90(ttgir=c.asm["ttgir"], ptx=c.asm["ptx"], shared=int(c.metadata.shared), num_warps=num_warps)


SPARSE_SIG = dict(q_ptr="*bf16", kv_ptr="*bf16", idx_ptr="*i32", len_ptr="*i32", sink_ptr="*fp32",
                  out_ptr="*bf16", ml_ptr="*fp32", lse_ptr="*fp32", s_kv="i32", topk="i32", sm_scale="fp32",
                  scale_log2="fp32", stride_qs="i32", stride_qh="i32", stride_kvs="i32", stride_is="i32",
                  stride_os="i32", stride_oh="i32", H_Q="i32")


@pytest.mark.compile
@pytest.mark.parametrize("h_q,cfg", [(h, SPARSE_CONFIGS[h]) for h in (16, 32, 128)]
                         + [(128, c) for c in SPARSE_CANDIDATES if c != SPARSE_CONFIGS[128]])
def test_compile_sparse_sm90(h_q, cfg):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    bh, bn, nw, ns, tr = cfg
    c = compile_hinted(_sparse_prefill_fwd_kernel, SPARSE_SIG,
                       dict(BLOCK_H=bh, BLOCK_N=bn, D_V=512, D_PE=64, HAS_LEN=True, HAS_SINK=True,
                            UPCAST=False, NUM_STAGES=ns, TRANS_S=tr), nw, ns)
    assert c.shared <= SM90_SMEM_LIMIT, c.shared
    assert not c.uses_local_memory
    if bh >= 64:
        assert c.has_wgmma
    if ns >= 2:
        assert "cp.async" in c.ptx          # the KV gather is pipelined


# ---------------------------------------------------------------- GPU tier ---------------------------
REGULAR = [(592, 128), (1521, 512), (114, 384)]      # trimmed from spec §5.4 to fit the device budget


@pytest.mark.gpu
@pytest.mark.parametrize("d_qk,h_q", [(576, 128), (512, 64), (576, 32), (512, 16)])
@pytest.mark.parametrize("s_kv,topk", REGULAR)
def test_gpu_regular(d_qk, h_q, s_kv, topk):
    q, kv, ind, sk, tl = make_case(62, s_kv, topk, h_q=h_q, d_qk=d_qk, device="cuda")
    run_and_check(q, kv, ind, sk, tl, name=f"{d_qk}/{h_q}/{s_kv}/{topk}")


FEATURES = ([(c, sink, False) for c in SPARSE_CANDIDATES for sink in (False, True)]
            + [(SPARSE_CONFIGS[128], True, True), (SPARSE_CONFIGS[128], False, True)])


@pytest.mark.gpu
@pytest.mark.parametrize("cfg,sink,with_len", FEATURES)
def test_gpu_features_all_configs(cfg, sink, with_len):
    q, kv, ind, sk, tl = make_case(213, 1592, 384, h_q=128, sink=sink, with_len=with_len, all_invalid=True,
                                   device="cuda")
    run_and_check(q, kv, ind, sk, tl, config=cfg, name=str(cfg))


@pytest.mark.gpu
@pytest.mark.parametrize("s_q,s_kv,topk", [(1, 128, 128), (1234, 4321, 4096), (1024, 32, 2048), (1, 64, 8192)])
def test_gpu_corners(s_q, s_kv, topk):
    # all-invalid rows; blocks with no valid index (s_kv << topk)
    q, kv, ind, sk, tl = make_case(s_q, s_kv, topk, h_q=128, sink=True, all_invalid=True, device="cuda")
    run_and_check(q, kv, ind, sk, tl)


@pytest.mark.gpu
def test_gpu_public_op_and_huge_s_q():
    q, kv, ind, sk, tl = make_case(4, 300, 256, h_q=128, device="cuda")
    out, ml, lse = flash_mla_sparse_fwd(q, kv, ind, 0.5)
    ro, _, _ = sparse_prefill_ref(q, kv, ind, 0.5)
    assert check_is_allclose("out", out.float(), ro, abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
    s_q = 70000                                  # grid-axis limit (FlashMLA 9241ae3 #182): launch + spot check
    q = (torch.randn(s_q, 64, 576, device="cuda") / 10).bfloat16()
    kv = (torch.randn(4096, 1, 576, device="cuda") / 10).bfloat16()
    ind = torch.randint(0, 4096, (s_q, 1, 128), device="cuda", dtype=torch.int32)
    out, ml, lse = flash_mla_sparse_fwd(q, kv, ind, 0.5)
    torch.cuda.synchronize()
    rows = torch.tensor([0, 65535, 65536, s_q - 1], device="cuda")
    ro, _, rlse = sparse_prefill_ref(q[rows], kv, ind[rows], 0.5)
    assert check_is_allclose("out", out[rows].float(), ro, abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose("lse", lse[rows], rlse, abs_tol=1e-6, rel_tol=2.01 / 65536)


@pytest.mark.gpu
def test_gpu_huge_logits_max_element_is_one():
    # FlashMLA d626421: exp2 of the max element must be exactly 1 even with ~1e6 logits
    q = torch.full((1, 64, 576), 32.0, device="cuda").bfloat16()
    kv = torch.full((8, 1, 576), 32.0, device="cuda").bfloat16()
    ind = torch.arange(8, device="cuda", dtype=torch.int32).view(1, 1, 8)
    out, ml, lse = flash_mla_sparse_fwd(q, kv, ind, 1.0)
    assert torch.isfinite(lse).all() and (out.float() - 32).abs().max() == 0
