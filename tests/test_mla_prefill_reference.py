"""Reference tier: the prefill references against naive float64 loops (docs/spec/mla.md §1.3, §1.4, §9)."""
import math

import pytest
import torch

from deepkernels.reference.mla_prefill import dense_prefill_ref, sparse_prefill_ref

pytestmark = pytest.mark.reference

BAD = [-2**31, -123456, -1, 2**31 - 1, 2147480000]


def _naive_sparse(q, kv, ind, scale, d_v, sink, topk_length):
    s_q, h_q, _ = q.shape
    s_kv = kv.shape[0]
    out = torch.zeros(s_q, h_q, d_v, dtype=torch.float64)
    ml = torch.full((s_q, h_q), -math.inf, dtype=torch.float64)
    lse = torch.full((s_q, h_q), math.inf, dtype=torch.float64)
    for i in range(s_q):
        n = ind.shape[-1] if topk_length is None else int(topk_length[i])
        toks = [int(t) for t in ind[i, 0, :n].tolist() if 0 <= int(t) < s_kv]
        if not toks:
            continue
        k = kv[toks, 0].double()
        for h in range(h_q):
            s = [float(q[i, h].double() @ k[j]) * scale for j in range(len(toks))]
            m = max(s)
            tot = sum(math.exp(x - m) for x in s)
            l = m + math.log(tot)
            f = 1.0
            if sink is not None:
                sk = float(sink[h])
                f = 0.0 if sk == math.inf else 1.0 / (1.0 + math.exp(sk - l)) if sk != -math.inf else 1.0
            o = sum(math.exp(x - l) * k[j, :d_v] for j, x in enumerate(s))
            out[i, h] = o * f
            ml[i, h], lse[i, h] = m, l
    return out, ml, lse


@pytest.mark.parametrize("d_qk", [576, 512])
@pytest.mark.parametrize("with_sink", [False, True])
@pytest.mark.parametrize("with_len", [False, True])
def test_sparse_ref_matches_naive(d_qk, with_sink, with_len):
    s_q, h_q, s_kv, topk, d_v = 5, 3, 20, 12, 512
    q = torch.randn(s_q, h_q, d_qk)
    kv = torch.randn(s_kv + 3, 1, d_qk)
    kv[s_kv:] = float("nan")                      # rows past s_kv must never be read
    kv = kv[:s_kv]
    ind = torch.randint(0, s_kv, (s_q, 1, topk), dtype=torch.int32)
    ind[0, 0, ::3] = torch.tensor(BAD[:4], dtype=torch.int32)
    ind[1, 0, :] = torch.tensor((BAD * 3)[:topk], dtype=torch.int32)   # all-invalid row
    ind[2, 0, 5] = s_kv
    sink = None
    if with_sink:
        sink = torch.randn(h_q)
        sink[0], sink[1] = math.inf, -math.inf
    tl = torch.randint(0, topk + 1, (s_q,), dtype=torch.int32) if with_len else None
    out, ml, lse = sparse_prefill_ref(q, kv, ind, 0.3, d_v, sink, tl, dtype=torch.float64)
    eo, eml, else_ = _naive_sparse(q, kv, ind, 0.3, d_v, sink, tl)
    torch.testing.assert_close(out, eo, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(ml, eml, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(lse, else_, rtol=1e-9, atol=1e-9)
    assert torch.all(out[1] == 0) and torch.all(torch.isposinf(lse[1])) and torch.all(torch.isneginf(ml[1]))
    assert not torch.isnan(out).any()


def test_sparse_ref_empty():
    q = torch.randn(0, 16, 576)
    kv = torch.randn(10, 1, 576)
    out, ml, lse = sparse_prefill_ref(q, kv, torch.zeros(0, 1, 64, dtype=torch.int32), 0.1)
    assert out.shape == (0, 16, 512) and lse.shape == (0, 16)
    q = torch.randn(2, 16, 576)
    out, ml, lse = sparse_prefill_ref(q, kv, torch.zeros(2, 1, 64, dtype=torch.int32), 0.1,
                                      topk_length=torch.zeros(2, dtype=torch.int32))
    assert torch.all(out == 0) and torch.all(torch.isposinf(lse)) and torch.all(torch.isneginf(ml))


def _naive_dense(q, k, v, cq, ck, scale, causal):
    total_q, h, _ = q.shape
    h_k = k.shape[1]
    out = torch.zeros(total_q, h, v.shape[-1], dtype=torch.float64)
    lse = torch.full((total_q, h), math.inf, dtype=torch.float64)
    for b in range(len(cq) - 1):
        s_q, s_k = cq[b + 1] - cq[b], ck[b + 1] - ck[b]
        for i in range(s_q):
            for hh in range(h):
                kh = hh // (h // h_k)
                js = [j for j in range(s_k) if not causal or j <= i + s_k - s_q]
                if not js:
                    continue
                s = [float(q[cq[b] + i, hh].double() @ k[ck[b] + j, kh].double()) * scale for j in js]
                m = max(s)
                l = m + math.log(sum(math.exp(x - m) for x in s))
                out[cq[b] + i, hh] = sum(math.exp(x - l) * v[ck[b] + j, kh].double() for x, j in zip(s, js))
                lse[cq[b] + i, hh] = l
    return out, lse


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("h,h_k", [(4, 4), (4, 2)])
def test_dense_ref_matches_naive(causal, h, h_k):
    sq, sk = [3, 0, 5, 4], [3, 2, 2, 7]          # includes s_q > s_k (rows with no key when causal)
    cq = [0] + torch.tensor(sq).cumsum(0).tolist()
    ck = [0] + torch.tensor(sk).cumsum(0).tolist()
    q = torch.randn(cq[-1], h, 24)
    k = torch.randn(ck[-1], h_k, 24)
    v = torch.randn(ck[-1], h_k, 16)
    out, lse = dense_prefill_ref(q, k, v, torch.tensor(cq), torch.tensor(ck), 0.25, causal, dtype=torch.float64)
    eo, el = _naive_dense(q, k, v, cq, ck, 0.25, causal)
    torch.testing.assert_close(out, eo, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(lse, el, rtol=1e-9, atol=1e-9)
    if causal:   # sequence 2 has s_q=5 > s_k=2: its first 3 rows see no key
        assert torch.isposinf(lse[3:6]).all() and (out[3:6] == 0).all()
