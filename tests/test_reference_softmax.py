"""The references' row softmax at extreme scores (session 19 review: a logsumexp followed by exp(s - lse) in fp32
loses log L in lse once |max score| is ~1e6, scaling the output by up to the number of tied keys). Every MLA
reference now goes through ``deepkernels.reference._softmax.softmax_lse`` (max-shifted). CPU tier."""
import math

import pytest
import torch

import deepkernels as dk
from deepkernels.reference._softmax import softmax_lse
from deepkernels.reference import mla as ref_mla
from deepkernels.reference.mla_prefill import dense_prefill_ref


def test_softmax_lse_matches_float64_and_handles_empty_rows():
    torch.manual_seed(0)
    s = torch.randn(3, 5, 7) * 30
    s[0, 1] = float("-inf")                     # an all-masked row
    s[1, 2, :3] = float("-inf")
    p, lse, empty = softmax_lse(s)
    s64 = s.double()
    want_lse = torch.logsumexp(s64, -1)
    fin = torch.isfinite(want_lse)
    assert torch.equal(empty, ~fin) and torch.isneginf(lse[~fin]).all() and (p[~fin] == 0).all()
    torch.testing.assert_close(lse[fin].double(), want_lse[fin], rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(p[fin].double(), torch.softmax(s64[fin], -1), rtol=1e-5, atol=1e-7)
    p0, lse0, empty0 = softmax_lse(torch.zeros(2, 0))
    assert p0.shape == (2, 0) and torch.isneginf(lse0).all() and empty0.all()


@pytest.mark.parametrize("scale", [1e8, -1e8, 3e6])
def test_sparse_prefill_reference_tied_keys_at_huge_scale(scale):
    """Two copies of the same token at |scale| 1e8: softmax over identical scores is exactly 1/2 each, so out == V
    (was 0.74-2.0 x V before the fix) and lse = s + log 2."""
    torch.manual_seed(1)
    q = (torch.randn(1, 16, 512) / 4).bfloat16()
    kv = (torch.randn(8, 1, 512) / 4).bfloat16()
    out, max_logits, lse = dk.flash_mla_sparse_fwd(q, kv, torch.tensor([[[3, 3]]], dtype=torch.int32), scale)
    v = kv[3, 0].float()
    torch.testing.assert_close(out[0].float(), v.expand(16, 512).bfloat16().float(), rtol=0, atol=0)
    s = (q[0].float() @ kv[3, 0].float()) * scale
    torch.testing.assert_close(max_logits[0], s, rtol=1e-5, atol=0)            # fp32 dot, another summation order
    torch.testing.assert_close(lse[0].double(), s.double() + math.log(2), rtol=1e-5, atol=0)


def test_dense_decode_and_prefill_references_at_huge_scale():
    """The dense decode (``_attend``) and dense prefill references: 3 identical keys at scale 1e7 -> out == V."""
    torch.manual_seed(2)
    q = torch.randn(2, 4, 64, dtype=torch.float32)
    k = torch.randn(1, 1, 64).expand(3, 1, 64).contiguous()
    o, lse = ref_mla._attend(q, k, 64, 1e7, [3, 3])
    torch.testing.assert_close(o, k[0, 0].expand(2, 4, 64), rtol=1e-6, atol=1e-6)
    kk = k[:, 0][:, None, :].expand(3, 4, 64).contiguous()
    cu_q = torch.tensor([0, 2], dtype=torch.int32)
    cu_k = torch.tensor([0, 3], dtype=torch.int32)
    o2, _ = dense_prefill_ref(q, kk, kk.clone(), cu_q, cu_k, 1e7, False)
    torch.testing.assert_close(o2.float(), kk[0].expand(2, 4, 64).float(), rtol=1e-6, atol=1e-6)
