"""MLA benchmark cases: dense decode, sparse decode, sparse prefill, dense MHA-mode prefill.

Each check compares our public op with deepkernels.reference on a random subset of rows (the reference is a
float32 loop, too slow for a whole production batch); anchors are plain PyTorch (bmm + softmax + bmm in bf16,
or SDPA), timed in the same process. FLOPs/bytes as FlashMLA counts them (docs/spec/mla.md §6.2).
"""
from __future__ import annotations

import math
import random

import torch

from .cases import Case

__all__ = ["BUILDERS"]

D_QK, D_V, PAGE = 576, 512, 64


def _upstream_randn(*shape, device):
    """FlashMLA's test data (docs/spec/mla.md §5.3): randn/10 clamped to ±1, in bf16. Its tolerances are calibrated on
    this scale; with unit-variance data even exact math with P rounded to bf16 misses the elementwise bound on
    causal rows that see few keys (measured: 15 of 262,144 elements at s=512, 0 at randn/10)."""
    return (torch.randn(*shape, device=device) / 10).clamp(-1, 1).to(torch.bfloat16)


def _mla_out_check(out, lse, ref_out, ref_lse, small: bool, out_tol=(8e-4, 2.01 / 128, 5e-6),
                   lse_tol=(1e-6, 8.01 / 65536)) -> tuple[bool, str]:
    """FlashMLA's tolerances (kernelkit.check_is_allclose, docs/spec/mla.md §5.2). At the tiny CPU shapes the
    few keys per row leave bf16 rounding of P un-averaged (errors up to ~3e-3 on outputs ~0.05), so the
    interpreter tier's looser abs 4e-3 / cos 5e-5 apply there (as in tests/test_mla_decode_kernels.py)."""
    from deepkernels.testing import check_is_allclose, get_cos_diff

    if torch.isnan(out).any():
        return False, "NaN in out"
    abs_tol, cos_tol = (4e-3, 5e-5) if small else (out_tol[0], out_tol[2])
    ok_o = check_is_allclose("out", out.float(), ref_out.float(), abs_tol, out_tol[1], cos_tol, quiet=True)
    ok_l = check_is_allclose("lse", lse.float(), ref_lse.float(), *lse_tol, quiet=True)
    cos = get_cos_diff(out.float(), ref_out.float())
    return ok_o and ok_l, f"cos-diff {cos:.1e}{'' if ok_l else ', lse mismatch'}{'' if ok_o else ', out mismatch'}"


# ------------------------------------------------------------------------------------------ dense decode
def _dense_decode_case(b: int, s_q: int, h_q: int, mean_sk: int, device: str, small: bool) -> Case:
    anchor = not small
    import deepkernels as dk
    from deepkernels.reference.mla import dense_decode

    def setup():
        seqlens = [max(int(random.normalvariate(mean_sk, mean_sk / 2)), s_q) for _ in range(b)]
        max_blocks = max(math.ceil(s / PAGE) for s in seqlens)
        num_blocks = b * max_blocks
        perm = torch.randperm(num_blocks, device=device, dtype=torch.int32)
        block_table = perm.view(b, max_blocks)
        k_cache = _upstream_randn(num_blocks, PAGE, 1, D_QK, device=device)
        for i, s in enumerate(seqlens):  # NaN in every cache slot past the sequence end
            n_full = s // PAGE
            if s % PAGE:
                k_cache[block_table[i, n_full].long(), s % PAGE:] = float("nan")
            if n_full + (s % PAGE > 0) < max_blocks:
                k_cache[block_table[i, n_full + (s % PAGE > 0):].long()] = float("nan")
        q = _upstream_randn(b, s_q, h_q, D_QK, device=device)
        t = dict(q=q, k_cache=k_cache, block_table=block_table,
                 cache_seqlens=torch.tensor(seqlens, dtype=torch.int32, device=device), seqlens=seqlens)
        t["sched"], _ = dk.get_mla_metadata()
        if anchor:  # contiguous per-batch K (padded) for the plain-PyTorch anchor, built outside its timing
            smax = max(seqlens)
            idx = block_table.long()[:, :, None] * PAGE + torch.arange(PAGE, device=device)
            kv = k_cache.view(-1, D_QK)[idx.view(b, -1)[:, :smax]]
            pos = torch.arange(smax, device=device)
            t["kv"] = kv.nan_to_num_(0.0)
            t["mask"] = (pos[None, :] >= t["cache_seqlens"][:, None])[:, None, :]
        return t

    def ours(t):
        return dk.flash_mla_with_kvcache(t["q"], t["k_cache"], t["block_table"], t["cache_seqlens"], D_V,
                                         t["sched"], causal=s_q > 1)

    def check(t, res):
        out, lse = res
        rows = sorted(random.sample(range(b), min(b, 3)))
        ro, rl = dense_decode(t["q"][rows], t["k_cache"], t["block_table"][rows], t["cache_seqlens"][rows],
                              D_V, causal=s_q > 1)
        return _mla_out_check(out[rows], lse[rows], ro, rl, small)

    def torch_mqa(t):  # bmm + softmax + bmm in bf16 (causal ignored for the anchor's cost)
        q = t["q"].reshape(b, s_q * h_q, D_QK)
        s = torch.bmm(q, t["kv"].transpose(1, 2)) * (D_QK ** -0.5)
        s.masked_fill_(t["mask"], float("-inf"))
        return torch.bmm(s.softmax(-1), t["kv"][..., :D_V])

    sum_sk = b * mean_sk  # FlashMLA's test counts mean_sk
    flops = 2.0 * s_q * sum_sk * h_q * (D_QK + D_V)
    nbytes = (sum_sk * D_QK + b * s_q * h_q * D_QK + b * s_q * h_q * D_V) * 2
    target = ">=620 TFLOPS" if h_q == 128 and s_q == 1 else (
        (">=4000 GB/s" if mean_sk >= 16384 else ">=3500 GB/s") if h_q <= 32 else "")
    return Case("mla", f"dense decode b={b} s_q={s_q} h_q={h_q} s_k~{mean_sk}", setup, ours, check, flops,
                nbytes, "bf16", {"torch bmm+softmax+bmm": torch_mqa} if anchor else {}, target)


# ------------------------------------------------------------------------------------------ sparse prefill
def _sparse_prefill_case(s_q: int, h_q: int, topk: int, s_kv: int, sink: bool, device: str, small: bool) -> Case:
    import deepkernels as dk
    from deepkernels.reference.mla_prefill import sparse_prefill_ref

    scale = D_QK ** -0.5

    def setup():
        q = _upstream_randn(s_q, h_q, D_QK, device=device)
        kv = _upstream_randn(s_kv, 1, D_QK, device=device)
        idx = torch.stack([torch.randperm(s_kv, device=device)[:topk] for _ in range(min(s_q, 64))])
        idx = idx.repeat((s_q + idx.shape[0] - 1) // idx.shape[0], 1)[:s_q]
        idx[:, -max(1, topk // 16):] = -1  # some invalid slots
        t = dict(q=q, kv=kv, indices=idx.to(torch.int32).view(s_q, 1, topk))
        t["sink"] = torch.randn(h_q, device=device) if sink else None
        return t

    def ours(t):
        return dk.flash_mla_sparse_fwd(t["q"], t["kv"], t["indices"], scale, attn_sink=t["sink"])

    def check(t, res):
        out, max_logits, lse = res
        rows = sorted(random.sample(range(s_q), min(s_q, 16)))
        ro, rm, rl = sparse_prefill_ref(t["q"][rows], t["kv"], t["indices"][rows], scale, attn_sink=t["sink"])
        return _mla_out_check(out[rows], lse[rows], ro, rl, small, (8e-4, 3.01 / 128, 7e-6), (1e-6, 2.01 / 65536))

    n_valid = s_q * (topk - max(1, topk // 16))
    flops = 2.0 * s_q * topk * h_q * (D_QK + D_V)
    nbytes = n_valid * D_QK * 2 + s_q * h_q * (D_QK + D_V) * 2
    return Case("prefill", f"sparse prefill s_q={s_q} h_q={h_q} topk={topk} s_kv={s_kv}{' sink' if sink else ''}",
                setup, ours, check, flops, nbytes, "bf16", {}, ">=640 TFLOPS" if h_q == 128 else "")


# ------------------------------------------------------------------------------------------ dense prefill
def _dense_prefill_case(b: int, s: int, h: int, d_qk: int, causal: bool, device: str, small: bool) -> Case:
    anchor = not small
    import deepkernels as dk
    from deepkernels.reference.mla_prefill import dense_prefill_ref

    d_v = 128

    def setup():
        q = _upstream_randn(b * s, h, d_qk, device=device)
        k = _upstream_randn(b * s, h, d_qk, device=device)
        v = _upstream_randn(b * s, h, d_v, device=device)
        cu = torch.arange(0, b * s + 1, s, device=device, dtype=torch.int32)
        return dict(q=q, k=k, v=v, cu=cu)

    def ours(t):
        return dk.flash_attn_varlen_func(t["q"], t["k"], t["v"], t["cu"], t["cu"], s, s, causal=causal)

    def check(t, res):
        out, lse = res
        heads = sorted(random.sample(range(h), min(h, 2)))
        q, k, v = (t[n][:, heads] for n in ("q", "k", "v"))
        ro, rl = dense_prefill_ref(q, k, v, t["cu"], t["cu"], causal=causal)
        return _mla_out_check(out[:, heads], lse[:, heads], ro, rl, small, (1e-3, 8.01 / 128, 7e-6), (1e-6, 2.01 / 65536))  # FMHA row of spec §5.2

    def sdpa(t):
        q, k, v = (t[n].view(b, s, h, -1).transpose(1, 2) for n in ("q", "k", "v"))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    pairs = b * s * s * (0.5 if causal else 1.0)
    flops = pairs * h * 2 * (d_qk + d_v)
    nbytes = b * s * h * (2 * d_qk + 2 * d_v) * 2
    return Case("prefill", f"dense prefill b={b} s={s} h={h} d=({d_qk},{d_v}){' causal' if causal else ''}",
                setup, ours, check, flops, nbytes, "bf16", {"torch SDPA": sdpa} if anchor else {}, ">=1.0x SDPA")


# ------------------------------------------------------------------------------------------ sparse decode
SPARSE_FORMATS = {"v32": (576, 656), "v41": (512, 528), "v41+fp4": (512, 528)}


def _sparse_decode_case(fmt: str, b: int, s_q: int, h_q: int, topk: int, num_blocks: int, device: str,
                        small: bool, extra_topk: int = 512) -> Case:
    import deepkernels as dk
    from deepkernels.quant import dequantize_kv_cache, quantize_kv_cache
    from deepkernels.reference.mla_sparse import sparse_decode_ref

    d_qk, token_bytes = SPARSE_FORMATS[fmt]
    extra = fmt.endswith("+fp4")
    page = 64 if not small else 16
    n_tok = num_blocks * page
    ex_topk = extra_topk if extra else 0

    def _indices(n: int, k: int):  # unique random positions per (b, s_q) row, a few -1
        idx = torch.rand(b * s_q, n, device=device).argsort(dim=-1)[:, :k].to(torch.int32)
        idx[:, -max(1, k // 32):] = -1
        return idx.view(b, s_q, k)

    def setup():
        kv = (torch.randn(num_blocks, page, 1, d_qk, device=device) / 10).to(torch.bfloat16)
        t = dict(q=torch.randn(b, s_q, h_q, d_qk, device=device).clamp(-1, 1).to(torch.bfloat16),  # spec §5.3
                 k_cache=quantize_kv_cache(kv, fmt.split("+")[0]), indices=_indices(n_tok, topk))
        if extra:
            kv2 = (torch.randn(num_blocks, page, 1, 512, device=device) / 10).to(torch.bfloat16)
            t["extra_k_cache"] = quantize_kv_cache(kv2, "fp4")
            t["extra_indices"] = _indices(n_tok, ex_topk)
        t["sched"], _ = dk.get_mla_metadata()
        if not small:  # the anchor attends the same tokens of a cache dequantized beforehand (outside its timing)
            t["kv_deq"] = dequantize_kv_cache(t["k_cache"]).view(-1, d_qk)
            if extra:
                t["kv2_deq"] = dequantize_kv_cache(t["extra_k_cache"]).view(-1, 512)
        return t

    def ours(t):
        return dk.flash_mla_with_kvcache(t["q"], t["k_cache"], None, None, D_V, t["sched"], is_fp8_kvcache=True,
                                         indices=t["indices"], extra_k_cache=t.get("extra_k_cache"),
                                         extra_indices_in_kvcache=t.get("extra_indices"))

    def check(t, res):
        out, lse = res
        rows = sorted(random.sample(range(b), min(b, 4)))
        ex = dict(extra_k_cache=t["extra_k_cache"], extra_indices=t["extra_indices"][rows]) if extra else {}
        ro, rl = sparse_decode_ref(t["q"][rows], t["k_cache"], t["indices"][rows], D_V, out_dtype=torch.float32,
                                   **ex)
        return _mla_out_check(out[rows], lse[rows], ro, rl, small, (1e-3, 2.01 / 128, 5e-6), (1e-6, 8.01 / 65536))

    def torch_attn(t):  # gather + bmm + softmax + bmm in bf16 over the pre-dequantized tokens
        idx = t["indices"].view(b, -1).long().clamp_min(0)
        k = t["kv_deq"][idx].view(b, s_q, topk, d_qk)
        if extra:
            k2 = t["kv2_deq"][t["extra_indices"].view(b, -1).long().clamp_min(0)].view(b, s_q, ex_topk, 512)
            k = torch.cat([k, k2], dim=2)
        s = torch.einsum("bshd,bstd->bsht", t["q"], k) * (d_qk ** -0.5)
        return torch.einsum("bsht,bstd->bshd", s.softmax(-1).to(k.dtype), k[..., :D_V])

    n_att = b * s_q * (topk + ex_topk)
    uniq = n_tok * (1 - (1 - topk / n_tok) ** (b * s_q))  # expected distinct tokens touched
    flops = 2.0 * h_q * n_att * (d_qk + D_V)
    nbytes = 2 * b * s_q * h_q * d_qk + uniq * token_bytes + 2 * b * s_q * h_q * D_V
    if extra:
        nbytes += n_tok * (1 - (1 - ex_topk / n_tok) ** (b * s_q)) * 288
    return Case("sparse", f"sparse decode {fmt} b={b} s_q={s_q} h_q={h_q} topk={topk}{f'+{ex_topk}' if extra else ''}",
                setup, ours, check, flops, nbytes, "bf16", {} if small else {"torch gather+bmm (pre-dequantized)": torch_attn},
                ">=420 TFLOPS" if h_q == 128 else "")


def sparse_cases(device: str, small: bool, quick: bool) -> list[Case]:
    if small:
        return [_sparse_decode_case("v32", 2, 1, 16, 40, 8, device, True),
                _sparse_decode_case("v41+fp4", 2, 2, 16, 40, 8, device, True, extra_topk=24)]
    fmts = ("v32", "v41+fp4") if quick else ("v32", "v41", "v41+fp4")
    bsq = ((128, 1),) if quick else ((64, 1), (128, 1), (128, 2))
    hs = (128,) if quick else (64, 128)
    return [_sparse_decode_case(f, bb, sq, h, 2048, 1024, device, False) for f in fmts for bb, sq in bsq for h in hs]


def mla_cases(device: str, small: bool, quick: bool) -> list[Case]:
    if small:
        return [_dense_decode_case(2, 1, 16, 100, device, True), _dense_decode_case(2, 2, 16, 70, device, True)]
    hs = (16, 128) if quick else (16, 32, 64, 128)
    sks = (4096, 32768) if quick else (4096, 8192, 16384, 32768)
    sqs = (1,) if quick else (1, 2)
    return [_dense_decode_case(128, sq, h, sk, device, False) for sq in sqs for h in hs for sk in sks]


def prefill_cases(device: str, small: bool, quick: bool) -> list[Case]:
    if small:
        return [_sparse_prefill_case(4, 16, 40, 100, True, device, True),
                _dense_prefill_case(2, 24, 2, 192, True, device, True)]
    skvs = (8192, 65536) if quick else (8192, 32768, 65536, 131072)
    cases = [_sparse_prefill_case(4096, 128, 2048, skv, False, device, False) for skv in skvs]
    cases += [_sparse_prefill_case(4096, 128, 2048, 32768, True, device, False)]
    dense = [(4096, 192, True), (8192, 192, True)] if quick else [
        (4096, 192, True), (4096, 192, False), (8192, 192, True), (8192, 128, True)]
    cases += [_dense_prefill_case(2, s, 128, d, c, device, False) for s, d, c in dense]
    return cases


BUILDERS = {"mla": mla_cases, "sparse": sparse_cases, "prefill": prefill_cases}
