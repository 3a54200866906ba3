"""Reference tier: deepkernels.reference.gemm against naive float64 loops (small shapes, CPU)."""
import math

import pytest
import torch

from deepkernels.reference import gemm as ref

pytestmark = pytest.mark.reference


def _fp8(shape):
    return (torch.randn(shape) * 4).clamp(-448, 448).to(torch.float8_e4m3fn)


def _naive_fp8(a, sfa, b, sfb, gran_n, c=None):
    """Per element: sum over K blocks of fp32(sum_k a*b) * fp32(sfa*sfb), in python floats (float64)."""
    m, k = a.shape
    n = b.shape[0]
    A, B = a.double().tolist(), b.double().tolist()
    out = torch.zeros(m, n, dtype=torch.float64)
    for i in range(m):
        for j in range(n):
            tot = 0.0
            for kb in range(math.ceil(k / 128)):
                part = sum(A[i][t] * B[j][t] for t in range(kb * 128, min(k, kb * 128 + 128)))
                s = float(torch.tensor(float(sfa[i, kb]) * float(sfb[j // gran_n, kb]), dtype=torch.float32))
                tot += part * s
            out[i, j] = tot + (float(c[i, j]) if c is not None else 0.0)
    return out


@pytest.mark.parametrize("m,n,k", [(3, 5, 128), (4, 130, 576), (2, 3, 1152 // 4), (1, 257, 200)])
@pytest.mark.parametrize("recipe", [(1, 128, 128), (1, 1, 128)])
def test_fp8_reference_matches_naive(m, n, k, recipe):
    a, b = _fp8((m, k)), _fp8((n, k))
    sfk = math.ceil(k / 128)
    sfa = torch.rand(m, sfk) + 0.5
    sfb = torch.rand(math.ceil(n / recipe[1]), sfk) + 0.5
    c = torch.randn(m, n)
    got = ref.fp8_gemm_ref((a, sfa), (b, sfb), c=c, recipe=recipe, out_dtype=torch.float32)
    want = _naive_fp8(a, sfa, b, sfb, recipe[1], c)
    torch.testing.assert_close(got.double(), want, rtol=2e-6, atol=1e-4)


def test_fp8_reference_exact_power_of_two_scales():
    # with power-of-two scales and small integers every step is exact: bitwise equality with float64
    m, n, k = 5, 7, 384
    a = torch.randint(-4, 5, (m, k)).float().to(torch.float8_e4m3fn)
    b = torch.randint(-4, 5, (n, k)).float().to(torch.float8_e4m3fn)
    sfa = 2.0 ** torch.randint(-3, 4, (m, 3)).float()
    sfb = 2.0 ** torch.randint(-3, 4, (1, 3)).float()
    got = ref.fp8_gemm_ref((a, sfa), (b, sfb), out_dtype=torch.float32)
    want = _naive_fp8(a, sfa, b, sfb, 128)
    assert torch.equal(got.double(), want)


def test_fp8_reference_sf_layout_invariance_and_ue8m0_packed():
    m, n, k = 6, 9, 640
    a, b = _fp8((m, k)), _fp8((n, k))
    sfa = 2.0 ** torch.randint(-5, 5, (m, 5)).float()
    sfb_rows = 2.0 ** torch.randint(-5, 5, (n, 5)).float()
    base = ref.fp8_gemm_ref((a, sfa), (b, sfb_rows), recipe=(1, 1, 128), out_dtype=torch.float32)
    # MN-major SFA gives the same result
    sfa_t = sfa.T.contiguous().T
    assert torch.equal(base, ref.fp8_gemm_ref((a, sfa_t), (b, sfb_rows), recipe=(1, 1, 128),
                                              out_dtype=torch.float32))

    # packed UE8M0: byte j of int32 w holds the exponent of K-group 4w+j
    def pack(sf):
        e = (sf.view(torch.int32) >> 23).to(torch.uint8)
        e = torch.nn.functional.pad(e, (0, 8 - e.shape[1]))
        return e.contiguous().view(torch.int32)
    got = ref.fp8_gemm_ref((a, pack(sfa)), (b, pack(sfb_rows)), out_dtype=torch.float32)
    assert torch.equal(base, got)


def test_fp8_reference_fresh_partial_promotion_differs_from_single_sum():
    # the per-block promotion is not the same as scaling once: check the reference really promotes per block
    m, n, k = 2, 2, 256
    a = torch.ones(m, k).to(torch.float8_e4m3fn)
    b = torch.ones(n, k).to(torch.float8_e4m3fn)
    sfa = torch.tensor([[1.0, 2.0]] * m)
    sfb = torch.tensor([[1.0, 3.0]])
    got = ref.fp8_gemm_ref((a, sfa), (b, sfb), out_dtype=torch.float32)
    assert torch.all(got == 128 * 1 + 128 * 6)


@pytest.mark.parametrize("m,n,k", [(3, 4, 5), (1, 17, 64), (7, 2, 130)])
def test_bf16_reference_matches_naive(m, n, k):
    a = torch.randn(m, k).bfloat16()
    b = torch.randn(n, k).bfloat16()
    c = torch.randn(m, n)
    got = ref.bf16_gemm_ref(a, b, c=c, out_dtype=torch.float32)
    A, B = a.double(), b.double()
    want = torch.tensor([[sum(float(A[i, t] * B[j, t]) for t in range(k)) + float(c[i, j]) for j in range(n)]
                         for i in range(m)], dtype=torch.float64)
    torch.testing.assert_close(got.double(), want, rtol=1e-6, atol=1e-5)


def test_inplace_reference_empty_and_k0():
    d = torch.full((3, 4), 7.0, dtype=torch.bfloat16)
    a = (torch.empty(3, 0, dtype=torch.float8_e4m3fn), torch.empty(3, 0))
    b = (torch.empty(4, 0, dtype=torch.float8_e4m3fn), torch.empty(1, 0))
    ref.fp8_gemm_nt(a, b, d)
    assert torch.all(d == 0)
    c = torch.randn(3, 4).bfloat16()
    ref.fp8_gemm_nt(a, b, d, c=c)
    assert torch.equal(d, c)
    d0 = torch.empty(0, 4, dtype=torch.bfloat16)
    ref.bf16_gemm_nt(torch.empty(0, 8, dtype=torch.bfloat16), torch.randn(4, 8).bfloat16(), d0)
