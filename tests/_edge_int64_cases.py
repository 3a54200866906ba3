"""Worker for tests/test_edge_cases_int64.py (run in a subprocess with TRITON_INTERPRET=1).

Each case places the rows an op must read (or write) more than 2^31 elements apart inside a large, lazily
allocated and mostly untouched buffer, then runs the real Triton kernel through the interpreter. The interpreter
does integer arithmetic in the kernel's own widths, so an offset computed in int32 wraps and the process reads
a wrong address (usually a segfault): the parent process notices which case did not report back.
Usage: python _edge_int64_cases.py CASE [CASE ...]; prints "ok CASE" or "bad CASE <why>" per case.
"""
import sys

import torch

BIG = 2 ** 30 + 64          # row stride (elements): row 2 starts at element 2^31 + 128


def spaced(rows, t, stride=BIG):
    """A view holding ``rows`` (the first dim of ``t``) spaced ``stride`` elements apart in a lazily allocated buffer."""
    inner = t[0].numel()
    buf = torch.empty(stride * (rows - 1) + inner, dtype=t.dtype)
    v = buf.as_strided(t.shape, (stride,) + tuple(t[0].stride()))
    v.copy_(t)
    return v


def case_gemm_fp8():
    import deepkernels as dk  # noqa: F401
    from deepkernels.gemm import dense
    from deepkernels.gemm._configs import GemmConfig
    from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
    from deepkernels.reference import gemm as ref
    A = per_token_cast_to_fp8(torch.randn(3, 256).bfloat16())
    B = per_block_cast_to_fp8(torch.randn(40, 256).bfloat16())
    Av = (spaced(3, A[0].view(torch.uint8)).view(torch.float8_e4m3fn), A[1])
    d = spaced(3, torch.full((3, 40), float("nan"), dtype=torch.bfloat16), 2 ** 30 + 16)
    dense.fp8_gemm_nt(Av, B, d, _config=GemmConfig(64, 64, 4, 2))
    want = ref.fp8_gemm_ref(A, B, out_dtype=torch.float32)
    return torch.allclose(d.float(), want, rtol=2 ** -7, atol=1e-2)


def case_gemm_bf16():
    from deepkernels.gemm import dense
    from deepkernels.gemm._configs import GemmConfig
    a, b = torch.randn(3, 64).bfloat16(), torch.randn(24, 64).bfloat16()
    d = spaced(3, torch.full((3, 24), float("nan"), dtype=torch.bfloat16), 2 ** 30 + 16)
    dense.bf16_gemm_nt(spaced(3, a), b, d, _config=GemmConfig(64, 64, 4, 2, block_k=64))
    return torch.allclose(d.float(), a.float() @ b.float().T, rtol=2 ** -7, atol=1e-2)


def case_dense_decode():
    import deepkernels as dk
    from deepkernels.reference import mla as ref
    k = (torch.randn(3, 64, 1, 576) / 10).half()
    q = (torch.randn(1, 1, 16, 576) / 10).half()
    bt = torch.tensor([[2, 0]], dtype=torch.int32)
    sl = torch.tensor([100], dtype=torch.int32)
    kv = spaced(3, k)                                          # page 2 starts at element 2^31 + 128
    o, l_ = dk.flash_mla_with_kvcache(q, kv, bt, sl, 512, dk.get_mla_metadata()[0])
    ro, rl = ref.dense_decode(q, k, bt, sl, 512)
    return torch.allclose(o.float(), ro.float(), atol=2e-3, rtol=2e-2) and torch.allclose(l_, rl, atol=1e-4)


def case_sparse_prefill():
    import deepkernels as dk
    from deepkernels.reference.mla_prefill import sparse_prefill_ref
    q = (torch.randn(2, 16, 576) / 10).bfloat16()
    kv = (torch.randn(3, 1, 576) / 10).bfloat16()
    ind = torch.tensor([[[2, 0, 1]], [[2, -1, 2]]], dtype=torch.int32)
    o, ml, lse = dk.flash_mla_sparse_fwd(q, spaced(3, kv), ind, 0.1)
    ro, rml, rlse = sparse_prefill_ref(q, kv, ind, 0.1)
    return torch.allclose(o.float(), ro.float(), atol=2e-3, rtol=2e-2) and torch.allclose(lse, rlse.float(), atol=1e-4)


def case_dense_prefill():
    import deepkernels as dk
    from deepkernels.reference.mla_prefill import dense_prefill_ref
    q = torch.randn(3, 2, 128).bfloat16()
    k, v = torch.randn(3, 2, 128).bfloat16(), torch.randn(3, 2, 128).bfloat16()
    cu = torch.tensor([0, 3], dtype=torch.int32)
    o, lse = dk.flash_attn_varlen_func(q, spaced(3, k), spaced(3, v), cu, cu, 3, 3)
    ro, rl = dense_prefill_ref(q, k, v, cu, cu)
    return torch.allclose(o.float(), ro.float(), atol=2e-3, rtol=2e-2) and torch.allclose(lse, rl.float(), atol=1e-4)


def case_sparse_decode():
    import deepkernels as dk
    from deepkernels.quant.kvcache import quantize_kv_cache
    from deepkernels.reference.mla_sparse import sparse_decode_ref
    kv = (torch.randn(3, 4, 1, 512) / 10).bfloat16()
    cache = quantize_kv_cache(kv, "v41")                                   # [3, 4, 1, 528] bytes
    u = cache.view(torch.uint8)
    stride0 = 2 ** 30 + 2048                                               # block 2 starts at byte 2^31 + 4096
    buf = torch.empty(stride0 * 2 + u[0].numel(), dtype=torch.uint8)
    big = buf.as_strided(u.shape, (stride0,) + tuple(u.stride()[1:]))
    big.copy_(u)
    q = (torch.randn(1, 1, 16, 512) / 10).bfloat16()
    ind = torch.tensor([[[8, 9, 0, 11]]], dtype=torch.int32)               # tokens of block 2 and block 0
    o, l_ = dk.flash_mla_with_kvcache(q, big.view(torch.float8_e4m3fn), None, None, 512, dk.get_mla_metadata()[0],
                                      is_fp8_kvcache=True, indices=ind)
    ro, rl = sparse_decode_ref(q, cache, ind, 512)
    return torch.allclose(o.float(), ro.float(), atol=2e-3, rtol=2e-2) and torch.allclose(l_, rl.float(), atol=1e-4)


if __name__ == "__main__":
    for name in sys.argv[1:]:
        try:
            ok = globals()[f"case_{name}"]()
            print(f"{'ok' if ok else 'bad'} {name}", flush=True)
        except Exception as e:  # noqa: BLE001 - reported to the parent
            print(f"bad {name} {type(e).__name__}: {str(e)[:300]}".replace("\n", " "), flush=True)
