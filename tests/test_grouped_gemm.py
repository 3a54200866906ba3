"""MoE grouped GEMMs: reference tier (references vs naive float64 loops, validation, knobs), interpreter tier
(every public function through the real Triton kernels at tiny shapes). Edge cases from
shared/cases/edge-cases.md are named after their row id (test_B28_..., ...). The GPU tier is in
test_grouped_gemm_gpu.py, the compile tier in test_grouped_gemm_compile.py.

Outputs are poisoned with NaN first; tests check that every defined element is written and that undefined
rows (masked tails, other groups) are left untouched.
"""
import numpy as np
import pytest
import torch

import deepkernels as dk
from deepkernels.gemm import dense, grouped
from deepkernels.gemm._configs import GemmConfig
from deepkernels.quant import per_block_cast_to_fp8, per_channel_cast_to_fp8, per_token_cast_to_fp8
from deepkernels.reference import grouped_gemm as R
from deepkernels.testing import calc_diff

# tiny tiles for the interpreter (its per-op cost dominates; the wgmma >= 64-row rule does not apply there)
CFG8 = GemmConfig(32, 32, 4, 2)
CFG16 = GemmConfig(32, 32, 4, 2, block_k=64)


# ----------------------------------------------------------------------------------------------- inputs
def fp8_b(g, n, k, device):
    b = torch.randn(g, n, k, device=device, dtype=torch.bfloat16)
    q = [per_block_cast_to_fp8(b[i]) for i in range(g)]
    return b, (torch.stack([x[0] for x in q]), torch.stack([x[1] for x in q]))


def fp8_a3(g, m, k, device):
    a = torch.randn(g, m, k, device=device, dtype=torch.bfloat16)
    q = [per_token_cast_to_fp8(a[i]) for i in range(g)]
    return a, (torch.stack([x[0] for x in q]), torch.stack([x[1] for x in q]))


def contiguous_case(layout, g, n, k, device):
    gl = torch.tensor(layout, dtype=torch.int32, device=device) if not torch.is_tensor(layout) else layout
    a = torch.randn(gl.numel(), k, device=device, dtype=torch.bfloat16)
    _, B = fp8_b(g, n, k, device)
    return per_token_cast_to_fp8(a), B, gl


def k_grouped_case(ks, m, n, device, layout="nt"):
    """FP8 k-grouped operands in the TN form ([sum_k, MN] + per-channel scales) and the NT form (flat chunks)."""
    xa = torch.randn(sum(ks), m, device=device)
    xb = torch.randn(sum(ks), n, device=device)
    qa, qb, off = [], [], 0
    for k in ks:
        if k:
            qa.append(per_channel_cast_to_fp8(xa[off:off + k]))
            qb.append(per_channel_cast_to_fp8(xb[off:off + k]))
        off += k
    cat = lambda q, i, w: torch.cat([x[i] for x in q]) if q else torch.empty(0, w, device=device)  # noqa: E731
    a_tn = (cat(qa, 0, m).to(torch.float8_e4m3fn), cat(qa, 1, m))
    b_tn = (cat(qb, 0, n).to(torch.float8_e4m3fn), cat(qb, 1, n))
    if layout == "tn":
        return a_tn, b_tn
    return tn_to_nt(a_tn, ks), tn_to_nt(b_tn, ks)


def tn_to_nt(x, ks):
    """TN-form k-grouped operand ([sum_k, MN], sf [sum_sf, MN]) -> NT form (flat [MN, k_g] chunks, sf [MN, sum_sf])."""
    data, sf = x
    offs = R.k_grouped_offsets(ks)[0]
    flat = torch.cat([data[o:o + k].T.contiguous().flatten() for o, k in zip(offs, ks)]) if sum(ks) else data.flatten()
    return flat, sf.T


def nan(*shape, dtype=torch.bfloat16, device="cpu"):
    return torch.full(shape, float("nan"), dtype=dtype, device=device)


def assert_rounded_close(d, ref32):
    """d (bf16/fp32 kernel output) equals the fp32 reference up to d's final rounding (a bf16 ulp or two)."""
    assert d.shape == ref32.shape
    if d.dtype == torch.float32:
        assert calc_diff(d, ref32) < 1e-9
        return
    err = (d.float() - ref32).abs()
    bound = ref32.abs() * 2 ** -7 + 1e-3 * ref32.abs().max().clamp(min=1e-30)
    assert (err <= bound).all(), f"max error {err.max().item()} beyond bf16 rounding"
    assert calc_diff(d.float(), ref32) < 1e-4


def check_contiguous(d, A, B, gl, psum=False, alignment=128):
    ref = R.m_grouped_fp8_gemm_contiguous_ref(A, B, gl, psum, alignment, torch.float32)
    assert not torch.isnan(d).any(), "some output rows were never written"
    gid = R.row_group_ids(gl, d.shape[0], B[0].shape[0], psum, alignment)
    assert (d[gid < 0] == 0).all(), "padding rows must be exactly zero"
    assert_rounded_close(d, ref)
    return ref


def check_masked(d, ref_fn, masked_m):
    """d was NaN-poisoned: rows < masked_m[g] written and equal to the reference, the others untouched."""
    want = ref_fn(nan(*d.shape, dtype=torch.float32, device=d.device))
    m_max = d.shape[1]
    for g, mg in enumerate(masked_m.tolist()):
        mg = min(max(mg, 0), m_max)
        assert not torch.isnan(d[g, :mg]).any(), f"group {g}: valid rows not written"
        assert torch.isnan(d[g, mg:]).all(), f"group {g}: rows >= masked_m written"
        if mg:
            assert_rounded_close(d[g, :mg], want[g, :mg])


# ======================================================================================= reference tier
def _naive_fp8(a8, sa, b8, sb_rows, out_dtype=np.float32):
    """Naive float64 loops for one group: fresh partial per 128-K block rounded to fp32, fp32 promotion."""
    a, b = a8.double().numpy(), b8.double().numpy()
    m, k = a.shape
    n = b.shape[0]
    out = np.zeros((m, n), dtype=np.float32)
    for i in range(m):
        for j in range(n):
            acc = np.float32(0)
            for kb in range(-(-k // 128)):
                p = np.float32(sum(a[i, t] * b[j, t] for t in range(kb * 128, min(k, kb * 128 + 128))))
                acc = np.float32(acc + p * np.float32(np.float32(sa[i, kb]) * np.float32(sb_rows[j, kb])))
            out[i, j] = acc
    return torch.from_numpy(out)


@pytest.mark.reference
def test_reference_contiguous_vs_naive():
    A, B, gl = contiguous_case([1, 1, -1, 0, 2, 2, -1, 7], 3, 3, 160, "cpu")
    ref = R.m_grouped_fp8_gemm_contiguous_ref(A, B, gl, out_dtype=torch.float32)
    for i, g in enumerate(gl.tolist()):
        if not 0 <= g < 3:
            assert (ref[i] == 0).all()
            continue
        sb_rows = B[1][g].repeat_interleave(128, 0)[:3]
        want = _naive_fp8(A[0][i:i + 1], A[1][i:i + 1], B[0][g], sb_rows)
        torch.testing.assert_close(ref[i:i + 1], want, rtol=1e-6, atol=1e-6)


@pytest.mark.reference
def test_reference_masked_and_k_grouped_vs_naive():
    _, A = fp8_a3(2, 3, 256, "cpu")
    _, B = fp8_b(2, 2, 256, "cpu")
    d = nan(2, 3, 2, dtype=torch.float32)
    R.m_grouped_fp8_gemm_masked_ref(A, B, d, torch.tensor([2, 0], dtype=torch.int32))
    want = _naive_fp8(A[0][0, :2], A[1][0, :2], B[0][0], B[1][0].repeat_interleave(128, 0)[:2])
    torch.testing.assert_close(d[0, :2], want, rtol=1e-6, atol=1e-6)
    assert torch.isnan(d[0, 2:]).all() and torch.isnan(d[1]).all()
    ks, m, n = [128, 0, 256], 3, 2
    A, B = k_grouped_case(ks, m, n, "cpu", "tn")
    c = torch.randn(3, m, n)
    out = R.k_grouped_fp8_gemm_ref(A, B, ks, c, m, n, "tn")
    assert torch.equal(out[1], c[1])
    want = _naive_fp8(A[0][128:384].T, A[1][1:3].T, B[0][128:384].T, B[1][1:3].T) + c[2]
    torch.testing.assert_close(out[2], want, rtol=1e-5, atol=1e-5)
    assert torch.equal(R.k_grouped_fp8_gemm_ref(tn_to_nt(A, ks), tn_to_nt(B, ks), ks, c, m, n, "nt"), out)


@pytest.mark.reference
def test_reference_bf16_vs_naive():
    a = torch.randn(5, 64).bfloat16()
    b = torch.randn(2, 3, 64).bfloat16()
    gl = torch.tensor([1, -1, 0, 1, 1], dtype=torch.int32)
    out = R.m_grouped_bf16_gemm_contiguous_ref(a, b, gl, out_dtype=torch.float32)
    for i, g in enumerate(gl.tolist()):
        want = (a[i].double() @ b[g].double().T).float() if g >= 0 else torch.zeros(3)
        torch.testing.assert_close(out[i], want, rtol=0, atol=0)
    ks = [64, 0, 128]
    x, y, c = torch.randn(192, 4).bfloat16(), torch.randn(192, 3).bfloat16(), torch.randn(3, 4, 3)
    out = R.k_grouped_bf16_gemm_ref(x, y, ks, c)
    torch.testing.assert_close(out[2], c[2] + (x[64:].double().T @ y[64:].double()).float(), rtol=1e-6, atol=1e-6)
    assert torch.equal(out[1], c[1])


@pytest.mark.reference
def test_row_group_ids_psum():
    ends = torch.tensor([5, 5, 130, 300], dtype=torch.int32)  # group 1 empty; starts 0, 128, 128, 256
    gid = R.row_group_ids(ends, 400, 4, True, 128)
    want = torch.full((400,), -1, dtype=torch.int64)
    want[0:5] = 0
    want[128:130] = 2
    want[256:300] = 3
    assert torch.equal(gid, want)
    assert torch.equal(R.row_group_ids(torch.tensor([0, 3, -1, 9], dtype=torch.int32), 4, 4, False, 128),
                       torch.tensor([0, 3, -1, -1]))


@pytest.mark.reference
def test_alignment_knobs():
    assert grouped.get_mk_alignment_for_contiguous_layout() == 128
    assert dk.get_theoretical_mk_alignment_for_contiguous_layout() == 128
    assert dk.get_theoretical_mk_alignment_for_contiguous_layout(7) == 128
    assert dk.get_m_alignment_for_contiguous_layout is dk.get_mk_alignment_for_contiguous_layout
    for bad, exc in [(0, ValueError), (24, ValueError), (1.5, TypeError), (True, TypeError)]:
        with pytest.raises(exc):
            dk.set_mk_alignment_for_contiguous_layout(bad)
    try:
        dk.set_mk_alignment_for_contiguous_layout(64)
        assert dk.get_mk_alignment_for_contiguous_layout() == 64
    finally:
        dk.set_mk_alignment_for_contiguous_layout(128)


@pytest.mark.reference
def test_aliases():
    assert dk.fp8_m_grouped_gemm_nt_masked is dk.m_grouped_fp8_gemm_nt_masked
    assert dk.bf16_m_grouped_gemm_nt_masked is dk.m_grouped_bf16_gemm_nt_masked
    assert dk.m_grouped_fp8_fp4_gemm_nt_contiguous is dk.m_grouped_fp8_gemm_nt_contiguous
    assert dk.m_grouped_fp8_fp4_gemm_nt_masked is dk.m_grouped_fp8_gemm_nt_masked


@pytest.mark.reference
class TestValidation:
    def test_contiguous(self):
        A, B, gl = contiguous_case([0] * 4, 2, 16, 128, "cpu")
        d = torch.empty(4, 16, dtype=torch.bfloat16)
        with pytest.raises(TypeError, match="grouped_layout"):
            dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl.long())
        with pytest.raises(ValueError, match="grouped_layout must have shape"):
            dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl[:3])
        with pytest.raises(ValueError, match="shape \\[2\\]"):
            dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl, use_psum_layout=True)
        with pytest.raises(ValueError, match="d must have shape"):
            dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d[:, :8], gl)
        with pytest.raises(ValueError, match="recipe"):
            dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl, recipe=(1, 1, 128))
        with pytest.raises(ValueError, match="b\\[1\\]"):
            dk.m_grouped_fp8_gemm_nt_contiguous(A, (B[0], B[1][:, :, :0]), d, gl)
        with pytest.raises(ValueError, match="share K"):
            dk.m_grouped_fp8_gemm_nt_contiguous(A, (B[0][:, :, :64], B[1]), d, gl)
        with pytest.raises(TypeError, match="pair"):
            dk.m_grouped_fp8_gemm_nt_contiguous(A[0], B, d, gl)
        with pytest.raises(ValueError, match="K % 64"):
            dk.m_grouped_bf16_gemm_nt_contiguous(torch.randn(4, 80).bfloat16(), torch.randn(2, 16, 80).bfloat16(),
                                                 d, gl)

    def test_masked(self):
        _, A = fp8_a3(2, 8, 128, "cpu")
        _, B = fp8_b(2, 16, 128, "cpu")
        d = torch.empty(2, 8, 16, dtype=torch.bfloat16)
        mm = torch.tensor([1, 2], dtype=torch.int32)
        for bad in (0, -3, 1.0, None):
            with pytest.raises(ValueError, match="expected_m"):
                dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, bad)
        with pytest.raises(TypeError, match="masked_m"):
            dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm.long(), 4)
        with pytest.raises(ValueError, match="masked_m must have shape"):
            dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm[:1], 4)
        with pytest.raises(ValueError, match="b must have shape"):
            dk.m_grouped_fp8_gemm_nt_masked(A, (B[0][:1], B[1][:1]), d, mm, 4)
        with pytest.raises(ValueError, match="a\\[1\\]"):
            dk.m_grouped_fp8_gemm_nt_masked((A[0], A[1][:, :4]), B, d, mm, 4)

    def test_k_grouped(self):
        ks = [128, 256]
        A, B = k_grouped_case(ks, 16, 16, "cpu")
        d = torch.empty(2, 16, 16)
        with pytest.raises(ValueError, match="multiple of 128"):
            dk.k_grouped_fp8_gemm_nt_contiguous(A, B, d, [128, 200])
        with pytest.raises(TypeError, match="ks_cpu"):
            dk.k_grouped_fp8_gemm_nt_contiguous(A, B, d, [])
        with pytest.raises(ValueError, match="psum"):
            dk.k_grouped_fp8_gemm_nt_contiguous(A, B, d, ks, use_psum_layout=True)
        with pytest.raises(ValueError, match="recipe"):
            dk.k_grouped_fp8_gemm_nt_contiguous(A, B, d, ks, recipe=(1, 128, 128))
        with pytest.raises(ValueError, match="one group per"):
            dk.k_grouped_fp8_gemm_nt_contiguous(A, B, d[:1], ks)
        with pytest.raises(ValueError, match="chunks"):
            dk.k_grouped_fp8_gemm_nt_contiguous(A, B, d, [128, 128])
        with pytest.raises(ValueError, match="not both"):
            dk.k_grouped_fp8_gemm_nt_contiguous(A, B, d, ks, ks=ks)
        with pytest.raises(ValueError, match="grouped_layout must have shape"):
            dk.k_grouped_fp8_gemm_nt_contiguous(A, B, d, ks, torch.tensor([128], dtype=torch.int32))
        At, Bt = k_grouped_case(ks, 12, 16, "cpu", "tn")
        with pytest.raises(ValueError, match="16-byte rows"):
            dk.k_grouped_fp8_gemm_tn_contiguous(At, Bt, torch.empty(2, 12, 16), ks)


# ======================================================================================= interpreter tier
@pytest.mark.interpret
@pytest.mark.parametrize("psum", [False, True])
def test_contiguous_fp8_interpret(psum, device):
    layout = [0] * 20 + [-1] * 12 + [2] * 32 + [1] * 5 + [-1] * 27 + [4] * 33 + [-1] * 31  # odd G = 5, group 3 empty
    A, B, gl = contiguous_case(layout, 5, 48, 384, device)
    if psum:  # same groups in the psum layout (alignment 32 for this test)
        gl = torch.tensor([20, 69, 69, 69, 129], dtype=torch.int32, device=device)
        grouped.set_mk_alignment_for_contiguous_layout(32)
    try:
        d = nan(160, 48, device=device)
        dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl, use_psum_layout=psum, _config=CFG8)
        check_contiguous(d, A, B, gl, psum, grouped.get_mk_alignment_for_contiguous_layout())
    finally:
        grouped.set_mk_alignment_for_contiguous_layout(128)


@pytest.mark.interpret
def test_contiguous_fp8_nn_and_default_config_interpret(device):
    A, B, gl = contiguous_case([1] * 70 + [-1] * 58 + [0] * 3, 2, 40, 256, device)
    d = nan(131, 40, device=device)
    dk.m_grouped_fp8_gemm_nn_contiguous(A, (B[0].transpose(1, 2), B[1].transpose(1, 2)), d, gl)
    check_contiguous(d, A, B, gl)


@pytest.mark.interpret
def test_contiguous_mixed_tiles_interpret(device):
    """A layout that breaks the alignment rule (groups switch inside a tile): still the reference result."""
    A, B, gl = contiguous_case([0, 1, 1, -1, 2, 0, 2, 2] * 9, 3, 32, 128, device)
    d = nan(72, 32, device=device)
    dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl, _config=CFG8)
    check_contiguous(d, A, B, gl)


@pytest.mark.interpret
@pytest.mark.parametrize("layout", ["nt", "nn"])
def test_contiguous_bf16_interpret(layout, device):
    gl = torch.tensor([2] * 30 + [-1] * 2 + [0] * 40, dtype=torch.int32, device=device)
    a = torch.randn(72, 128, device=device).bfloat16()
    b = torch.randn(3, 40, 128, device=device).bfloat16()
    d = nan(72, 40, device=device)
    if layout == "nt":
        dk.m_grouped_bf16_gemm_nt_contiguous(a, b, d, gl, _config=CFG16)
    else:
        dk.m_grouped_bf16_gemm_nn_contiguous(a, b.transpose(1, 2).contiguous(), d, gl)
    want = R.m_grouped_bf16_gemm_contiguous_ref(a, b, gl, out_dtype=torch.float32)
    assert not torch.isnan(d).any() and (d[30:32] == 0).all()
    assert_rounded_close(d, want)


@pytest.mark.interpret
@pytest.mark.parametrize("counts", [[67, 25, 0, 0, 9, 80, 1], [0, 0, 0]])
def test_masked_fp8_interpret(counts, device):
    """Counts like [4001, 1425, 0, 0, 571, ...] scaled down; M_max = 80 is not a multiple of the 32-row tile."""
    g = len(counts)
    _, A = fp8_a3(g, 80, 256, device)
    _, B = fp8_b(g, 40, 256, device)
    mm = torch.tensor(counts, dtype=torch.int32, device=device)
    d = nan(g, 80, 40, device=device)
    dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, 30, _config=CFG8)
    check_masked(d, lambda out: R.m_grouped_fp8_gemm_masked_ref(A, B, out, mm), mm)


@pytest.mark.interpret
def test_masked_bf16_legacy_name_interpret(device):
    a = torch.randn(3, 50, 64, device=device).bfloat16()
    b = torch.randn(3, 24, 64, device=device).bfloat16()
    mm = torch.tensor([50, 0, 17], dtype=torch.int32, device=device)
    d = nan(3, 50, 24, device=device)
    dk.bf16_m_grouped_gemm_nt_masked(a, b, d, mm, 20)
    check_masked(d, lambda out: R.m_grouped_bf16_gemm_masked_ref(a, b, out, mm), mm)


@pytest.mark.interpret
@pytest.mark.parametrize("layout", ["nt", "tn"])
def test_k_grouped_fp8_interpret(layout, device):
    ks, m, n = [256, 0, 128, 384], 48, 32
    A, B = k_grouped_case(ks, m, n, device, layout)
    c = torch.randn(4, m, n, device=device) * 8
    d = c.clone()
    fn = dk.k_grouped_fp8_gemm_nt_contiguous if layout == "nt" else dk.k_grouped_fp8_gemm_tn_contiguous
    fn(A, B, d, ks, torch.tensor(ks, dtype=torch.int32, device=device), c=d, _config=CFG8)
    want = R.k_grouped_fp8_gemm_ref(A, B, ks, c, m, n, layout)
    assert torch.equal(d[1], c[1]), "K = 0 group must leave D = C"
    assert calc_diff(d, want) < 1e-9


@pytest.mark.interpret
def test_k_grouped_keyword_forms_interpret(device):
    ks, m, n = [128, 128], 32, 16
    A, B = k_grouped_case(ks, m, n, device)
    want = R.k_grouped_fp8_gemm_ref(A, B, ks, None, m, n)
    kt = torch.tensor(ks, dtype=torch.int32, device=device)
    for kw in (dict(ks_cpu=ks, grouped_layout=kt), dict(ks=ks, ks_tensor=kt), dict(ks_cpu=ks)):
        d = nan(2, m, n, dtype=torch.float32, device=device)
        dk.k_grouped_fp8_gemm_nt_contiguous(A, B, d, **kw)  # c=None: D = A @ B (documented superset)
        assert calc_diff(d, want) < 1e-9


@pytest.mark.interpret
def test_k_grouped_bf16_interpret(device):
    ks, m, n = [128, 0, 256], 40, 24
    a = torch.randn(sum(ks), m, device=device).bfloat16()
    b = torch.randn(sum(ks), n, device=device).bfloat16()
    c = torch.randn(3, m, n, device=device)
    d = nan(3, m, n, dtype=torch.float32, device=device)
    dk.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks, c=c, _config=CFG16)
    assert torch.equal(d[1], c[1])
    assert calc_diff(d, R.k_grouped_bf16_gemm_ref(a, b, ks, c)) < 1e-9


@pytest.mark.interpret
def test_empty_work_interpret(device):
    A, B, gl = contiguous_case([], 2, 16, 128, device)
    d = torch.empty(0, 16, dtype=torch.bfloat16, device=device)
    dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl)  # M_sum == 0: no-op
    A, B = k_grouped_case([0, 0], 16, 16, device)
    c = torch.randn(2, 16, 16, device=device)
    d = nan(2, 16, 16, dtype=torch.float32, device=device)
    dk.k_grouped_fp8_gemm_nt_contiguous(A, B, d, [0, 0], c=c)  # all groups K = 0: D = C
    assert torch.equal(d, c)


# ---- edge cases (shared/cases/edge-cases.md), scaled down for the interpreter
@pytest.mark.interpret
def test_B28_padding_runs_between_groups_interpret(device):
    layout = [0] * 25 + [-1] * 7 + [1] * 32 + [-1] * 256  # [0]*100 + [-1]*28 + [1]*128 + [-1]*1024, / 4
    A, B, gl = contiguous_case(layout, 2, 32, 128, device)
    d = nan(len(layout), 32, device=device)
    dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl, _config=CFG8)
    check_contiguous(d, A, B, gl)


@pytest.mark.interpret
def test_B27_one_row_unaligned_group_interpret(device):
    A, B, gl = contiguous_case([0], 1, 64, 256, device)
    d = nan(1, 64, device=device)
    dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl)
    check_contiguous(d, A, B, gl)


@pytest.mark.interpret
def test_B31_many_groups_narrow_n_programs_skip_groups_interpret(device):
    ks, m, n = [128] * 9, 32, 32  # one tile per group; few programs, so each program skips whole groups
    A, B = k_grouped_case(ks, m, n, device)
    c = torch.randn(9, m, n, device=device)
    old = dense._NUM_SMS
    dense.set_num_sms(2)  # the GEMM knob (deepkernels.set_num_sms is the MLA scheduler's)
    try:
        d = c.clone()
        dk.k_grouped_fp8_gemm_nt_contiguous(A, B, d, ks, c=d, _config=CFG8)
    finally:
        dense.set_num_sms(old)
    assert calc_diff(d, R.k_grouped_fp8_gemm_ref(A, B, ks, c, m, n)) < 1e-9


@pytest.mark.interpret
def test_B48_one_row_groups_interpret(device):
    _, A = fp8_a3(5, 1, 128, device)
    _, B = fp8_b(5, 40, 128, device)
    mm = torch.ones(5, dtype=torch.int32, device=device)
    d = nan(5, 1, 40, device=device)
    dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, 1, _config=CFG8)
    check_masked(d, lambda out: R.m_grouped_fp8_gemm_masked_ref(A, B, out, mm), mm)
    A, B, gl = contiguous_case([0, 1, 2, 3, 4], 5, 40, 128, device)  # one row per group, mixed in one tile
    d = nan(5, 40, device=device)
    dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl, _config=CFG8)
    check_contiguous(d, A, B, gl)


@pytest.mark.interpret
def test_B38_six_groups_masked_interpret(device):
    _, A = fp8_a3(6, 40, 128, device)
    _, B = fp8_b(6, 32, 128, device)
    mm = torch.tensor([40, 3, 0, 33, 1, 17], dtype=torch.int32, device=device)
    d = nan(6, 40, 32, device=device)
    dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, 20, _config=CFG8)
    check_masked(d, lambda out: R.m_grouped_fp8_gemm_masked_ref(A, B, out, mm), mm)


@pytest.mark.interpret
def test_B30_k_grouped_zero_column_bit_identical_interpret(device):
    ks, m, n = [256, 128, 128, 256], 32, 32
    A, B = k_grouped_case(ks, m, n, device, "tn")
    A[0][256:384] = 0  # the 128-long group's A is all zeros with a tiny scale
    A[1][2] = 1e-30
    c = torch.randn(4, m, n, device=device)
    outs = []
    for _ in range(3):
        d = c.clone()
        dk.k_grouped_fp8_gemm_tn_contiguous(A, B, d, ks, c=d, _config=CFG8)
        outs.append(d)
    assert all(torch.equal(o, outs[0]) for o in outs)
    assert torch.equal(outs[0][1], c[1])
    assert calc_diff(outs[0], R.k_grouped_fp8_gemm_ref(A, B, ks, c, m, n, "tn")) < 1e-9


@pytest.mark.interpret
def test_B32_odd_tiles_per_group_interpret(device):
    ks, m, n = [384, 256], 96, 96  # 3 x 3 = 9 tiles of 32 per group (odd), groups of different K
    A, B = k_grouped_case(ks, m, n, device)
    c = torch.randn(2, m, n, device=device)
    d = c.clone()
    dk.k_grouped_fp8_gemm_nt_contiguous(A, B, d, ks, c=d, _config=CFG8)
    assert calc_diff(d, R.k_grouped_fp8_gemm_ref(A, B, ks, c, m, n)) < 1e-9


# ======================================================================================= host fast path (plan cache)
@pytest.mark.interpret
def test_masked_plan_cache_reuses_verdict_not_values_interpret(device):
    """A repeated masked call with the same signature takes the cached plan; masked_m *values* are not part of the
    signature (read on the device), so new counts still give the reference result and rows >= m_g stay untouched."""
    g = 3
    _, A = fp8_a3(g, 40, 256, device)
    _, B = fp8_b(g, 32, 256, device)
    grouped._PLANS.clear()
    for counts in ([40, 0, 7], [1, 33, 40], [0, 0, 0]):
        mm = torch.tensor(counts, dtype=torch.int32, device=device)
        d = nan(g, 40, 32, device=device)
        dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, 16, _config=CFG8)
        check_masked(d, lambda out: R.m_grouped_fp8_gemm_masked_ref(A, B, out, mm), mm)
    assert len(grouped._PLANS) == 1
    # a different signature (d as float32) is validated again and cached separately
    d32 = nan(g, 40, 32, dtype=torch.float32, device=device)
    dk.m_grouped_fp8_gemm_nt_masked(A, B, d32, mm, 16, _config=CFG8)
    assert len(grouped._PLANS) == 2
    # an argument the full path rejects is rejected again, never served from the cache
    with pytest.raises(ValueError, match="expected_m"):
        dk.m_grouped_fp8_gemm_nt_masked(A, B, d32, mm, 0, _config=CFG8)
    with pytest.raises(ValueError):
        dk.m_grouped_fp8_gemm_nt_masked(A, B, nan(g, 40, 31, device=device), mm, 16, _config=CFG8)


@pytest.mark.interpret
def test_contiguous_plan_cache_and_copies_interpret(device):
    """Contiguous: the cached plan serves a new grouped_layout with the same shape; a call whose A needed a copy
    (not K-major) is never cached; psum layouts are re-expanded on every call."""
    grouped._PLANS.clear()
    A, B, gl = contiguous_case([0] * 20 + [-1] * 12 + [1] * 32, 2, 40, 256, device)
    for layout in (gl, torch.tensor([1] * 30 + [-1] * 2 + [0] * 32, dtype=torch.int32, device=device)):
        d = nan(64, 40, device=device)
        dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, layout, _config=CFG8)
        check_contiguous(d, A, B, layout)
    assert len(grouped._PLANS) == 1
    a_mn = (A[0].T.contiguous().T, A[1])  # MN-major data: copied to K-major inside, so not cached
    d = nan(64, 40, device=device)
    dk.m_grouped_fp8_gemm_nt_contiguous(a_mn, B, d, gl, _config=CFG8)
    check_contiguous(d, A, B, gl)
    assert len(grouped._PLANS) == 1
    grouped.set_mk_alignment_for_contiguous_layout(32)
    try:
        for ends in ([20, 64], [32, 50]):
            psum = torch.tensor(ends, dtype=torch.int32, device=device)
            d = nan(64, 40, device=device)
            dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, psum, use_psum_layout=True, _config=CFG8)
            check_contiguous(d, A, B, psum, True, 32)
    finally:
        grouped.set_mk_alignment_for_contiguous_layout(128)
    assert len(grouped._PLANS) == 2


def test_contiguous_gluon_dispatch_rule(monkeypatch):
    """Where the public contiguous op uses the Gluon kernel (the v3 device-measured envelope) and the env knobs."""
    from types import SimpleNamespace
    from deepkernels.gemm import _gluon_fp8
    if not _gluon_fp8.available():
        pytest.skip("gluon not importable")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("DEEPKERNELS_GROUPED_GLUON", raising=False)
    monkeypatch.delenv("DEEPKERNELS_DISABLE_GLUON", raising=False)
    monkeypatch.setattr("deepkernels._backend.interpret_mode", lambda: False)
    d = SimpleNamespace(dtype=torch.bfloat16, is_cuda=True)
    rule = grouped._gluon_contiguous_config
    monkeypatch.delenv("DEEPKERNELS_GROUPED_EPI", raising=False)       # default: the TMA-store-epilogue twin
    # K >= 7168: the scales-ahead twin (session 19), else the TMA-store config
    assert rule(32768, 4096, 7168, True, True, d, 128, None) is _gluon_fp8.GLUON_WS_128_S6_EPI_SA1
    assert rule(10112, 7168, 2048, True, True, d, 128, None) is _gluon_fp8.GLUON_WS_128_S6_EPI
    for args in [(4096, 4096, 7168, True, True, d, 128, None),      # M_sum below the measured envelope
                 (32768, 2048, 7168, True, True, d, 128, None),     # N below it
                 (32768, 4096, 1024, True, True, d, 128, None),     # K below it
                 (32768, 4096, 7168, True, True, d, 64, None),      # tiles would mix groups
                 (32768, 4096, 7168, False, True, d, 128, None),    # BF16
                 (32768, 4096, 7168, True, True, SimpleNamespace(dtype=torch.float32, is_cuda=True), 128, None),
                 (32768, 4096, 7168, True, True, d, 128, GemmConfig(128, 128, 8, 4))]:  # explicit Triton config
        assert rule(*args) is None, args
    monkeypatch.setenv("DEEPKERNELS_DISABLE_GLUON", "1")
    assert rule(32768, 4096, 7168, True, True, d, 128, None) is None
    monkeypatch.delenv("DEEPKERNELS_DISABLE_GLUON")
    monkeypatch.setenv("DEEPKERNELS_GROUPED_GLUON", "0")
    assert rule(32768, 4096, 7168, True, True, d, 128, None) is None
    monkeypatch.setenv("DEEPKERNELS_GROUPED_GLUON", "1")
    assert rule(512, 256, 512, True, True, d, 64, None) is _gluon_fp8.GLUON_WS_128_S6_EPI
    monkeypatch.setenv("DEEPKERNELS_GROUPED_EPI", "0")
    assert rule(512, 256, 512, True, True, d, 64, None) is _gluon_fp8.GLUON_WS_128_S6


def test_masked_gluon_dispatch_rule(monkeypatch):
    """Where the public masked op uses the Gluon kernel (the v3b device-measured envelope) and the env knobs."""
    from types import SimpleNamespace
    from deepkernels.gemm import _gluon_fp8
    if not _gluon_fp8.available():
        pytest.skip("gluon not importable")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("DEEPKERNELS_GROUPED_GLUON", raising=False)
    monkeypatch.delenv("DEEPKERNELS_DISABLE_GLUON", raising=False)
    monkeypatch.setattr("deepkernels._backend.interpret_mode", lambda: False)
    d = SimpleNamespace(dtype=torch.bfloat16, is_cuda=True)
    rule = grouped._gluon_masked_config
    monkeypatch.delenv("DEEPKERNELS_GROUPED_EPI", raising=False)       # default: the TMA-store-epilogue twin
    for args in [(1024, 4096, 7168, 1024), (256, 7168, 2048, 256), (4096, 4096, 7168, 300)]:   # K >= 7168: SA1
        want = _gluon_fp8.GLUON_WS_128_S4_EPI_SA1 if args[2] >= 7168 else _gluon_fp8.GLUON_WS_128_S4_EPI
        assert rule(*args, True, d, None) is want, args
    for args, is_fp8, dd, cfg in [((1024, 4096, 7168, 128), True, d, None),    # expected_m below the envelope
                                  ((1024, 2048, 7168, 1024), True, d, None),   # N below it
                                  ((1024, 4096, 1024, 1024), True, d, None),   # K below it
                                  ((1024, 4096, 7168, 1024), False, d, None),  # BF16
                                  ((1024, 4096, 7168, 1024), True, SimpleNamespace(dtype=torch.float32, is_cuda=True),
                                   None),
                                  ((1024, 4096, 7168, 1024), True, d, GemmConfig(128, 128, 8, 4))]:
        assert rule(*args, is_fp8, dd, cfg) is None, args
    monkeypatch.setenv("DEEPKERNELS_DISABLE_GLUON", "grouped_gemm")
    assert rule(1024, 4096, 7168, 1024, True, d, None) is None
    monkeypatch.delenv("DEEPKERNELS_DISABLE_GLUON")
    monkeypatch.setenv("DEEPKERNELS_GROUPED_GLUON", "0")
    assert rule(1024, 4096, 7168, 1024, True, d, None) is None
    monkeypatch.setenv("DEEPKERNELS_GROUPED_GLUON", "1")
    assert rule(64, 256, 512, 8, True, d, None) is _gluon_fp8.GLUON_WS_128_S4_EPI
    monkeypatch.setenv("DEEPKERNELS_GROUPED_EPI", "0")
    assert rule(64, 256, 512, 8, True, d, None) is _gluon_fp8.GLUON_WS_128_S4


@pytest.mark.interpret
def test_masked_gluon_plan_host_path_interpret(device, monkeypatch):
    """Host path of the Gluon masked dispatch (the kernel is GPU-only): validated once, then the cached plan is
    called with the same tensors; masked_m stays on the device; a stand-in computes the reference."""
    calls = []

    def fake_launch(self, a, b, d, sfa, sfb, mm):
        assert self.masked and mm.device == a.device
        calls.append(mm.data_ptr())
        R.m_grouped_fp8_gemm_masked_ref((a, sfa), (b, sfb), d, mm)

    monkeypatch.setattr(grouped, "_gluon_masked_config", lambda *a: object())
    monkeypatch.setattr(grouped._GluonPlan, "__call__", fake_launch)
    monkeypatch.setattr(grouped, "_PLANS", {})
    _, A = fp8_a3(3, 40, 256, device)
    _, B = fp8_b(3, 48, 256, device)
    for counts in ([5, 0, 40], [40, 1, 0]):
        mm = torch.tensor(counts, dtype=torch.int32, device=device)
        d = nan(3, 40, 48, device=device)
        dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, 256)
        check_masked(d, lambda out: R.m_grouped_fp8_gemm_masked_ref(A, B, out, mm), mm)
    assert len(calls) == 2
    (plan,) = grouped._PLANS.values()
    assert isinstance(plan, grouped._GluonPlan) and plan.masked


@pytest.mark.interpret
def test_contiguous_gluon_plan_host_path_interpret(device, monkeypatch):
    """Host path of the Gluon contiguous dispatch (the kernel itself is GPU-only): validated once, cached, sfa passed
    as given (K-major, no MN-major copy), psum layouts expanded per call; a stand-in computes the reference."""
    calls = []

    def fake_launch(self, a, b, d, sfa, sfb, gid):
        calls.append((tuple(sfa.stride()), gid.shape[0]))
        d.copy_(R.m_grouped_fp8_gemm_contiguous_ref((a, sfa), (b, sfb), gid, False, 128, d.dtype))

    monkeypatch.setattr(grouped, "_gluon_contiguous_config", lambda *a: object())
    monkeypatch.setattr(grouped._GluonPlan, "__call__", fake_launch)
    monkeypatch.setattr(grouped, "_PLANS", {})  # the stand-in plan never outlives this test
    A, B, gl = contiguous_case([0] * 20 + [-1] * 12 + [1] * 32, 2, 40, 256, device)
    for _ in range(2):
        d = nan(64, 40, device=device)
        dk.m_grouped_fp8_gemm_nt_contiguous(A, B, d, gl)
        check_contiguous(d, A, B, gl)
    assert calls == [(tuple(A[1].stride()), 64)] * 2
    (run,) = grouped._PLANS.values()
    assert isinstance(run.plan, grouped._GluonPlan) and not run.norm_sfa
