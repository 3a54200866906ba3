"""Regression tests of the session-20 fresh-user review (CPU: reference + interpreter tiers).

1. Strided index tensors of the m-grouped GEMMs: ``masked_m`` / a per-row ``grouped_layout`` passed as a 1-D view
   with a non-unit stride (``counts[:, 0]`` of an ``[G, 2]`` tensor) were read by the kernels as packed int32
   arrays: the masked GEMM wrote rows past ``masked_m[g]`` (documented as never written) and computed other groups'
   rows with the wrong counts, the contiguous GEMM used the wrong expert per row. The public ops now pack such a
   view first (a device copy, no host sync).
2. Integer arguments of the MLA ops: ``head_dim_v=512.0`` (dense and sparse decode) and ``d_v=512.0`` (sparse prefill)
   passed the ``!= 512`` check and failed inside ``torch.empty`` with a message naming no argument; the legacy
   ``get_mla_metadata(cache_seqlens, num_q_tokens_per_head_k, num_heads_k, num_heads_q, ..., topk)`` read its ints with
   ``int()``, so ``16.7`` ran as 16, ``"16"`` as 16 and a negative ``topk`` planned a schedule. Now integers only
   (Python / NumPy), TypeError / ValueError naming the argument.
3. The torch.library FP8 GEMM ops (``fp8_gemm_nt``, ``m_grouped_fp8_gemm_nt_{contiguous,masked}``) take upstream's
   ``recipe_a`` / ``recipe_b`` too (they took only ``recipe``).
4. ``abs_indices_to_kvcache_indices`` on an empty batch (``abs_indices [0, s_q, topk]``) raised torch's "cannot
   reshape tensor of 0 elements into shape [0, -1]"; it returns the empty result now (and takes a NumPy
   ``page_block_size``).
5. ``python -m deepkernels.bench.report`` (README's command for the results table) died with an IndexError traceback
   without an argument and a FileNotFoundError / JSONDecodeError traceback for a bad path; now a usage error (exit 2)
   naming the path. ``deepkernels bench --json DIR`` (a folder) ran the first case, then died with
   IsADirectoryError; now a usage error before anything runs.
6. NumPy integers where upstream's pybind ``int`` / ``List[int]`` takes them: the k-grouped GEMMs' ``ks_cpu``
   (``[np.int64(128), ...]`` was a TypeError) and ``set_mk_alignment_for_contiguous_layout``.
7. The FP4 quantisation helpers did not validate their group sizes like the FP8 ones do: ``per_token_cast_to_fp4`` /
   ``cast_back_from_fp4`` with ``gran_k=0`` raised ZeroDivisionError, ``-128`` / ``128.0`` torch reshape / index
   errors, ``True`` ran as 1; ``quantize_fp4_e2m1(tile=16.0)`` a reshape error; ``dequantize_fp4_e2m1(tile=0)`` a
   ZeroDivisionError. Now ValueError naming the argument, as ``per_token_cast_to_fp8``.
8. K-grouped GEMMs with a ``c`` that starts where ``d`` does but has other strides (``d`` a row-padded view of a
   buffer, ``c`` a packed view of the same buffer): the kernels skip the ``d.copy_(c)`` when the pointers match and
   accumulate into ``d``'s own values (interpreter: calc_diff 5e-3, wrong), while the reference used ``c``. Now a
   ValueError, as the dense GEMMs ("c shares d's storage but has different sizes/strides").
9. An output written over an input (``d`` overlapping ``a``, ``b``, a scale tensor or the index tensor) gave wrong
   values on the kernel path (interpreter: ``m_grouped_bf16_gemm_nt_masked(a, w, a, ...)`` calc_diff 0.98: programs
   read A rows other programs had already overwritten) and right ones on the reference path. The grouped GEMMs now
   raise ValueError naming the input (disjoint views of one workspace buffer stay legal; a call whose d overlaps an
   input never uses a cached plan). The dense GEMMs had the same defect; fixed the same way (the lead, in
   ``gemm/dense.py``: the helpers moved to ``_validate.output_aliases`` / ``check_no_alias``).
10. Dense GEMMs: the c/d overlap check (ValueError) runs only on the validating path; a call whose signature
    matches a cached plan (same shapes, strides, 16-B alignment) with c partially overlapping d reaches
    ``d.copy_(c)``, whose torch RuntimeError names neither argument. Fixed: a ``c`` in ``d``'s storage that is
    not ``d`` itself never takes a cached plan (``dense._c_sig``).
11. Dense decode with the legacy metadata tensors on another device than q: the reference path ignored them, the
    kernel path failed inside the launch ("Cannot copy out of meta tensor" here; on a GPU a CPU schedule is a Triton
    pointer error) naming neither tensor. Now ValueError naming the tensor and q's device.
"""
import numpy as np
import pytest
import torch

import deepkernels as dk
from deepkernels.gemm import grouped
from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
from deepkernels.testing import calc_diff

REF = pytest.mark.reference
INTERP = pytest.mark.interpret


def _strided(values, dtype=torch.int32, device="cpu"):
    """``values`` as a 1-D view with stride 2 (the other column holds junk the kernels must never read)."""
    t = torch.tensor(values, dtype=dtype, device=device)
    v = torch.stack([t, torch.full_like(t, 99)], 1)[:, 0]
    assert v.stride() == (2,)
    return v


def _fp8_b(g, n, k):
    w = torch.randn(g, n, k)
    q = [per_block_cast_to_fp8(w[i], use_ue8m0=False) for i in range(g)]
    return w, (torch.stack([x[0] for x in q]), torch.stack([x[1] for x in q]))


# ------------------------------------------------------------------------------------------------ 1. strided ids
@REF
def test_packed_index_helper():
    t = _strided([3, 0, 1])
    p = grouped._packed_index(t)
    assert p.stride() == (1,) and p.tolist() == [3, 0, 1]
    c = torch.tensor([1, 2], dtype=torch.int32)
    assert grouped._packed_index(c) is c                 # packed: unchanged (no copy)
    one = _strided([5])
    assert grouped._packed_index(one) is one             # one element: any stride is packed
    assert grouped._packed_index(None) is None           # wrong types are left to validation


@INTERP
@pytest.mark.parametrize("fp8", [True, False])
def test_masked_grouped_gemm_strided_masked_m(fp8):
    g, m_max, n, k = 3, 40, 128, 256
    x = torch.randn(g, m_max, k)
    w, b = _fp8_b(g, n, k)
    counts = [40, 0, 17]
    masked_m = _strided(counts)
    d = torch.full((g, m_max, n), 7.0, dtype=torch.bfloat16)
    if fp8:
        a = per_token_cast_to_fp8(x.view(-1, k), use_ue8m0=False)
        dk.m_grouped_fp8_gemm_nt_masked((a[0].view(g, m_max, k), a[1].view(g, m_max, -1)), b, d, masked_m, 16)
    else:
        dk.m_grouped_bf16_gemm_nt_masked(x.bfloat16(), w.bfloat16(), d, masked_m, 16)
    for i, m in enumerate(counts):
        assert (d[i, m:] == 7).all(), f"group {i}: rows >= masked_m[{i}] = {m} were written"
        if m:
            ref = x[i, :m].bfloat16().float() @ w[i].bfloat16().float().T
            assert calc_diff(d[i, :m].float(), ref) < (2e-3 if fp8 else 1e-4)


@INTERP
@pytest.mark.parametrize("fp8", [True, False])
def test_contiguous_grouped_gemm_strided_layout(fp8):
    g, n, k = 3, 128, 256
    ids = [0] * 100 + [-1] * 28 + [2] * 128 + [-1] * 40
    m_sum = len(ids)
    x = torch.randn(m_sum, k)
    w, b = _fp8_b(g, n, k)
    layout = _strided(ids)
    d = torch.full((m_sum, n), float("nan"), dtype=torch.bfloat16)
    if fp8:
        dk.m_grouped_fp8_gemm_nt_contiguous(per_token_cast_to_fp8(x, use_ue8m0=False), b, d, layout)
    else:
        dk.m_grouped_bf16_gemm_nt_contiguous(x.bfloat16(), w.bfloat16(), d, layout)
    xb, wb = x.bfloat16().float(), w.bfloat16().float()
    ref = torch.stack([xb[i] @ wb[j].T if j >= 0 else torch.zeros(n) for i, j in enumerate(ids)])
    pad = torch.tensor(ids) < 0
    assert (d[pad] == 0).all()
    assert calc_diff(d[~pad].float(), ref[~pad]) < (2e-3 if fp8 else 1e-4)



@pytest.mark.gpu
@pytest.mark.parametrize("kind", ["masked", "contiguous"])
def test_grouped_gemm_strided_index_gpu(kind):
    """The same on CUDA at shapes inside the Gluon dispatch envelope (masked: expected_m >= 256, N >= 4096,
    K >= 2048; contiguous: M_sum >= 8192), so the dispatched kernel (Gluon on sm90) gets the packed copy."""
    dev = "cuda"
    g, n, k = 2, 4096, 2048
    w = torch.randn(g, n, k, device=dev)
    q = [per_block_cast_to_fp8(w[i], use_ue8m0=False) for i in range(g)]
    b = (torch.stack([x[0] for x in q]), torch.stack([x[1] for x in q]))
    if kind == "masked":
        m_max, counts = 256, [256, 100]
        x = torch.randn(g, m_max, k, device=dev)
        a = per_token_cast_to_fp8(x.view(-1, k), use_ue8m0=False)
        d = torch.full((g, m_max, n), 7.0, dtype=torch.bfloat16, device=dev)
        dk.m_grouped_fp8_gemm_nt_masked((a[0].view(g, m_max, k), a[1].view(g, m_max, -1)), b, d,
                                        _strided(counts, device=dev), 256)
        torch.cuda.synchronize()
        for i, m in enumerate(counts):
            assert (d[i, m:] == 7).all()
            assert calc_diff(d[i, :m].float(), x[i, :m] @ w[i].T) < 2e-3
    else:
        ids = [0] * 4096 + [1] * 4000 + [-1] * 96
        x = torch.randn(len(ids), k, device=dev)
        d = torch.full((len(ids), n), float("nan"), dtype=torch.bfloat16, device=dev)
        dk.m_grouped_fp8_gemm_nt_contiguous(per_token_cast_to_fp8(x, use_ue8m0=False), b, d, _strided(ids, device=dev))
        torch.cuda.synchronize()
        assert calc_diff(d[:4096].float(), x[:4096] @ w[0].T) < 2e-3
        assert calc_diff(d[4096:8096].float(), x[4096:8096] @ w[1].T) < 2e-3
        assert (d[8096:] == 0).all()

# ------------------------------------------------------------------------------------------------ 2. integer args
BAD_INTS = [512.0, "512", True, None, np.float32(512)]


def _dense_decode_args(b=2, s_q=1, h_q=16):
    seqlens = torch.tensor([70, 0][:b], dtype=torch.int32)
    return (torch.randn(b, s_q, h_q, 576).bfloat16(), torch.randn(4, 64, 1, 576).bfloat16(),
            torch.arange(4, dtype=torch.int32).view(2, 2)[:b], seqlens)


def _sparse_decode_args():
    kc = dk.quantize_kv_cache(torch.randn(2, 16, 1, 576).bfloat16(), "v32")
    return torch.randn(2, 1, 16, 576).bfloat16(), kc, torch.randint(-1, 32, (2, 1, 8), dtype=torch.int32)


@REF
@pytest.mark.parametrize("bad", BAD_INTS)
@pytest.mark.parametrize("path", ["dense", "sparse", "dense-empty"])
def test_decode_head_dim_v_must_be_an_int(bad, path):
    if path == "sparse":
        q, kc, ind = _sparse_decode_args()
        call = lambda v: dk.flash_mla_with_kvcache(q, kc, None, None, v, dk.get_mla_metadata()[0],  # noqa: E731
                                                   is_fp8_kvcache=True, indices=ind)
    else:
        q, kc, bt, seqlens = _dense_decode_args()
        if path == "dense-empty":
            q, bt, seqlens = q[:0], bt[:0], seqlens[:0]
        call = lambda v: dk.flash_mla_with_kvcache(q, kc, bt, seqlens, v, dk.get_mla_metadata()[0])  # noqa: E731
    with pytest.raises(TypeError, match="head_dim_v must be an int"):
        call(bad)
    with pytest.raises(ValueError, match="head_dim_v must be 512"):
        call(256)
    out, lse = call(np.int64(512))        # a NumPy int is the int it equals (upstream's pybind int takes it)
    assert out.shape[-1] == 512 and type(out.shape[-1]) is int


@REF
@pytest.mark.parametrize("bad", BAD_INTS)
def test_sparse_prefill_d_v_must_be_an_int(bad):
    q = torch.randn(2, 16, 576).bfloat16()
    kv = torch.randn(8, 1, 576).bfloat16()
    ind = torch.randint(-1, 8, (2, 1, 4), dtype=torch.int32)
    with pytest.raises(TypeError, match="d_v must be an int"):
        dk.flash_mla_sparse_fwd(q, kv, ind, 0.1, d_v=bad)
    with pytest.raises(ValueError, match="d_v must be 512"):
        dk.flash_mla_sparse_fwd(q, kv, ind, 0.1, d_v=256)
    assert dk.flash_mla_sparse_fwd(q, kv, ind, 0.1, d_v=np.int32(512))[0].shape == (2, 16, 512)


@REF
@pytest.mark.parametrize("name,pos", [("num_q_tokens_per_head_k", 1), ("num_heads_k", 2), ("num_heads_q", 3),
                                      ("topk", 5)])
def test_legacy_get_mla_metadata_integer_arguments(name, pos):
    seqlens = torch.tensor([70, 0, 5], dtype=torch.int32)
    args = [seqlens, 16, 1, 16, False, None]
    for bad in (16.7, 16.0, "16", True):
        a = list(args)
        a[pos] = bad
        with pytest.raises(TypeError, match=f"{name} must be an int"):
            dk.get_mla_metadata(*a)
        with pytest.raises(TypeError, match=f"{name} must be an int"):
            dk.get_mla_metadata(seqlens, **dict(zip(["num_q_tokens_per_head_k", "num_heads_k", "num_heads_q",
                                                      "is_fp8_kvcache", "topk"], a[1:])))
    a = list(args)
    a[pos] = -1
    with pytest.raises(ValueError, match=f"{name} must be >= "):
        dk.get_mla_metadata(*a)
    a[pos] = np.int64(64)                 # NumPy ints are ints
    meta, ns = dk.get_mla_metadata(*a)
    assert meta.dtype == ns.dtype == torch.int32 and ns.shape == (4,)


# ------------------------------------------------------------------------------------------------ 3. op recipes
@REF
def test_fp8_gemm_ops_take_recipe_a_and_recipe_b():
    ops = torch.ops.deepkernels      # registered by `import deepkernels` (deepkernels.ops)
    m, n, k, g = 8, 128, 256, 2
    x, w = torch.randn(m, k), torch.randn(n, k)
    a = per_token_cast_to_fp8(x, use_ue8m0=False)
    b_blk = per_block_cast_to_fp8(w, use_ue8m0=False)
    b_row = per_token_cast_to_fp8(w, use_ue8m0=False)
    ref = x @ w.T
    d = torch.full((m, n), float("nan"), dtype=torch.bfloat16)
    ops.fp8_gemm_nt(a[0], a[1], b_blk[0], b_blk[1], d, recipe_a=[1, 128], recipe_b=[128, 128])
    assert calc_diff(d.float(), ref) < 2e-3
    d32 = torch.zeros(m, n)
    ops.fp8_gemm_nt(a[0], a[1], b_row[0], b_row[1], d32, d32, recipe_a=[1, 128], recipe_b=[1, 128])
    assert calc_diff(d32, ref) < 2e-3
    with pytest.raises(ValueError, match="recipe_a and recipe_b must be given together"):
        ops.fp8_gemm_nt(a[0], a[1], b_blk[0], b_blk[1], d, recipe_a=[1, 128])
    with pytest.raises(ValueError, match="not both"):
        ops.fp8_gemm_nt(a[0], a[1], b_blk[0], b_blk[1], d, recipe=[1, 128, 128], recipe_a=[1, 128],
                        recipe_b=[128, 128])
    # m-grouped: recipe_a=(1, 128) + recipe_b=(128, 128) is the default recipe; (1, 128) + (1, 128) is rejected
    wg, bg = _fp8_b(g, n, k)
    xm = torch.randn(g, m, k)
    am = per_token_cast_to_fp8(xm.view(-1, k), use_ue8m0=False)
    dm = torch.zeros(g, m, n, dtype=torch.bfloat16)
    ops.m_grouped_fp8_gemm_nt_masked(am[0].view(g, m, k), am[1].view(g, m, -1), bg[0], bg[1], dm,
                                     torch.tensor([m, 3], dtype=torch.int32), m, recipe_a=[1, 128],
                                     recipe_b=[128, 128])
    assert calc_diff(dm[1, :3].float(), xm[1, :3] @ wg[1].T) < 2e-3
    with pytest.raises(ValueError, match="recipe_a"):
        ops.m_grouped_fp8_gemm_nt_masked(am[0].view(g, m, k), am[1].view(g, m, -1), bg[0], bg[1], dm,
                                         torch.tensor([m, 3], dtype=torch.int32), m, recipe_a=[1, 128],
                                         recipe_b=[1, 128])
    dc = torch.zeros(g * m, n, dtype=torch.bfloat16)
    layout = torch.tensor([0] * m + [1] * m, dtype=torch.int32)
    ops.m_grouped_fp8_gemm_nt_contiguous(am[0], am[1], bg[0], bg[1], dc, layout, recipe_a=[1, 128],
                                         recipe_b=[128, 128])
    assert calc_diff(dc[m:].float(), xm[1] @ wg[1].T) < 2e-3


# ------------------------------------------------------------------------------------------------ 4. empty batch
@REF
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
def test_abs_indices_to_kvcache_indices_empty_batch(dtype):
    for shape in [(0, 1, 8), (0,), (0, 2, 0)]:
        out = dk.abs_indices_to_kvcache_indices(torch.zeros(shape, dtype=dtype), torch.zeros(0, 3, dtype=torch.int32),
                                                64)
        assert out.shape == shape and out.dtype == dtype
    out = dk.abs_indices_to_kvcache_indices(torch.tensor([[5, 70, -1, 200]], dtype=dtype),
                                            torch.tensor([[3, 1]], dtype=torch.int32), np.int64(64))
    assert out.tolist() == [[3 * 64 + 5, 64 + 6, -1, -1]]


# ------------------------------------------------------------------------------------------------ 5. report CLI
@REF
def test_bench_report_cli_errors_are_usage_errors(tmp_path, capsys):
    import json
    from deepkernels.bench import report
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("not json")
    wrong = tmp_path / "list.json"
    wrong.write_text("[1]")
    for argv, words in (([], "PATH"), ([str(tmp_path / "missing.json")], "missing.json"),
                        ([str(bad_json)], "bad.json is not JSON"), ([str(wrong)], "list.json is not a")):
        with pytest.raises(SystemExit) as e:
            report.main(argv)
        assert e.value.code == 2
        assert words in capsys.readouterr().err
    good = tmp_path / "cpu.json"
    good.write_text(json.dumps(dict(provenance=dict(date="d", torch="t", triton="3.6.0", git_sha="x", gpu=None),
                                    rows=[dict(suite="mla", name="dense decode", provider="deepkernels",
                                               provider_kind="ours", status="PASS", metric="cos-diff 1e-06",
                                               target=">=1", us=None)])))
    assert report.main([str(good)]) == 0
    assert "| mla | dense decode | PASS (cos-diff 1e-06) |" in capsys.readouterr().out



@REF
@pytest.mark.parametrize("opt", ["--json", "--plot"])
def test_bench_cli_output_path_that_is_a_folder_is_a_usage_error(opt, tmp_path, capsys, monkeypatch):
    from deepkernels.bench import cli

    def no_exec(*args):   # the CPU mode re-executes itself under the interpreter: never let it replace pytest
        raise AssertionError("deepkernels bench started running instead of refusing the path")
    monkeypatch.setattr(cli.os, "execve", no_exec)
    with pytest.raises(SystemExit) as e:
        cli.main(["bench", "--only", "mla", opt, str(tmp_path)])
    assert e.value.code == 2
    assert "is a folder" in capsys.readouterr().err

# ------------------------------------------------------------------------------------------------ 6. NumPy ints
@REF
def test_k_grouped_ks_cpu_takes_numpy_ints():
    ks, m, n = [128, 0, 256], 16, 32
    ag = [torch.randn(m, k) for k in ks]
    bg = [torch.randn(n, k) for k in ks]

    def pack(ts):
        q = [per_token_cast_to_fp8(t, use_ue8m0=False) for t in ts if t.shape[1]]
        return torch.cat([x[0].flatten() for x in q]), torch.cat([x[1] for x in q], 1)
    a, b = pack(ag), pack(bg)
    d = torch.full((3, m, n), float("nan"))
    dk.k_grouped_fp8_gemm_nt_contiguous(a, b, d, [np.int64(k) for k in ks], c=None)
    for g in (0, 2):
        assert calc_diff(d[g], ag[g] @ bg[g].T) < 2e-3
    assert (d[1] == 0).all()
    with pytest.raises(TypeError, match="ks_cpu"):
        dk.k_grouped_fp8_gemm_nt_contiguous(a, b, d, [128.0, 0, 256], c=None)


@REF
def test_set_mk_alignment_takes_numpy_int():
    prev = dk.get_mk_alignment_for_contiguous_layout()
    try:
        dk.set_mk_alignment_for_contiguous_layout(np.int64(64))
        assert dk.get_mk_alignment_for_contiguous_layout() == 64
        assert type(dk.get_mk_alignment_for_contiguous_layout()) is int
        with pytest.raises(TypeError, match="alignment must be an int"):
            dk.set_mk_alignment_for_contiguous_layout(64.0)
    finally:
        dk.set_mk_alignment_for_contiguous_layout(prev)


# ------------------------------------------------------------------------------------------------ 7. FP4 group sizes
@REF
@pytest.mark.parametrize("bad", [0, -128, 128.0, True, "128"])
def test_fp4_helpers_validate_group_sizes(bad):
    x = torch.randn(2, 256)
    packed, sf = dk.per_token_cast_to_fp4(x, use_ue8m0=True)
    with pytest.raises(ValueError, match="gran_k must be a positive int"):
        dk.per_token_cast_to_fp4(x, use_ue8m0=True, gran_k=bad)
    with pytest.raises(ValueError, match="gran_k must be a positive int"):
        dk.cast_back_from_fp4(packed, sf, gran_k=bad)
    with pytest.raises(ValueError, match="tile must be a positive"):
        dk.quantize_fp4_e2m1(x, bad if bad != 128.0 else 16.0)
    p16, s16 = dk.quantize_fp4_e2m1(x)
    with pytest.raises(ValueError, match="tile must be a positive"):
        dk.dequantize_fp4_e2m1(p16, s16, bad if bad != 128.0 else 16.0)
    # the valid calls are unchanged
    back = dk.cast_back_from_fp4(packed, sf)
    assert back.shape == (2, 256) and torch.isfinite(back).all()
    assert dk.dequantize_fp4_e2m1(p16, s16).shape == (2, 256)


# ------------------------------------------------------------------------------------------------ 8. k-grouped c/d
@REF
@pytest.mark.parametrize("fp8", [True, False])
def test_k_grouped_c_aliasing_d_with_other_strides_raises(fp8):
    ks, m, n = [128, 256], 16, 32
    sum_k = sum(ks)
    buf = torch.randn(2, m, n + 8)
    d = buf[..., :n]                                               # rows padded to n + 8
    c = torch.as_strided(buf, (2, m, n), (m * n, n, 1))           # same first element, packed rows
    before = buf.clone()
    if fp8:
        a = (torch.zeros(m * sum_k, dtype=torch.float8_e4m3fn), torch.ones(m, sum_k // 128))
        b = (torch.zeros(n * sum_k, dtype=torch.float8_e4m3fn), torch.ones(n, sum_k // 128))
        call = lambda cc: dk.k_grouped_fp8_gemm_nt_contiguous(a, b, d, ks, c=cc)  # noqa: E731
    else:
        a, b = torch.zeros(sum_k, m).bfloat16(), torch.zeros(sum_k, n).bfloat16()
        call = lambda cc: dk.k_grouped_bf16_gemm_tn_contiguous(a, b, d, ks, c=cc)  # noqa: E731
    with pytest.raises(ValueError, match="shares d's storage"):
        call(c)
    assert torch.equal(buf, before)                                # raised before anything was written
    call(d)                                                        # c is d: in place (zero products: d unchanged)
    assert torch.equal(buf, before)
    call(d.view(2, m, n))                                          # another object, same view: fine too


# ------------------------------------------------------------------------------------------------ 9. d over an input
def _grouped_alias_case(kind, out_over):
    g, m, k = 2, 64, 256
    x, w = torch.randn(g, m, k).bfloat16(), torch.randn(g, k, k).bfloat16()   # N == K: d fits over a or b
    counts = torch.tensor([m, m], dtype=torch.int32)
    ids = torch.tensor([0] * m + [1] * m, dtype=torch.int32)
    d = {"a": x, "b": w, "fresh": torch.empty(g, m, k, dtype=torch.bfloat16)}[out_over]
    if kind == "masked":
        return lambda: dk.m_grouped_bf16_gemm_nt_masked(x, w, d[:, :m] if out_over == "b" else d, counts, m)
    flat = d.view(-1, k)[: g * m]
    return lambda: dk.m_grouped_bf16_gemm_nt_contiguous(x.view(g * m, k), w, flat, ids)


@REF
@pytest.mark.parametrize("kind", ["masked", "contiguous"])
@pytest.mark.parametrize("out_over", ["a", "b"])
def test_grouped_gemm_output_over_an_input_raises(kind, out_over):
    _grouped_alias_case(kind, "fresh")()          # the same signature validated (and cached) first
    with pytest.raises(ValueError, match=f"overlaps {out_over}"):
        _grouped_alias_case(kind, out_over)()


@REF
def test_grouped_gemm_disjoint_views_of_one_workspace_are_fine():
    g, m, k, n = 2, 64, 256, 128
    x, w = torch.randn(g, m, k), torch.randn(g, n, k)
    ws = torch.empty(g * m * k + g * m * n, dtype=torch.bfloat16)
    a, d = ws[: g * m * k].view(g, m, k), ws[g * m * k:].view(g, m, n)
    a.copy_(x)
    for _ in range(2):   # validated call, then the cached plan
        dk.m_grouped_bf16_gemm_nt_masked(a, w.bfloat16(), d, torch.tensor([m, 7], dtype=torch.int32), m)
        assert calc_diff(d[1, :7].float(), x[1, :7].bfloat16().float() @ w[1].bfloat16().float().T) < 1e-4


@REF
def test_k_grouped_output_over_an_input_raises():
    ks, m = [128], 128
    a = torch.randn(128, m).bfloat16()
    d = torch.empty(1, m, m)
    dk.k_grouped_bf16_gemm_tn_contiguous(a, a, d, ks)
    buf = torch.zeros(m * m * 2)                     # d's fp32 bytes over a's bf16 bytes
    a2 = buf.view(torch.bfloat16)[: 128 * m].view(128, m)
    with pytest.raises(ValueError, match="overlaps a"):
        dk.k_grouped_bf16_gemm_tn_contiguous(a2, torch.randn(128, m).bfloat16(), buf[: m * m].view(1, m, m), ks)


@REF
def test_dense_gemm_output_over_an_input_raises():
    a = torch.randn(64, 256).bfloat16()
    with pytest.raises(ValueError, match="overlaps"):
        dk.bf16_gemm_nt(a, torch.randn(256, 256).bfloat16(), a)
    x = torch.randn(64, 256).bfloat16()
    b = torch.randn(256, 256).bfloat16()
    dk.bf16_gemm_nt(x, b, torch.empty(64, 256, dtype=torch.bfloat16))       # a same-signature call first
    with pytest.raises(ValueError, match="overlaps a"):
        dk.bf16_gemm_nt(x, b, x)
    buf = torch.randn(128, 256).bfloat16()                                   # disjoint views of one buffer: fine
    dk.bf16_gemm_nt(buf[:64], b, buf[64:])


@REF
def test_dense_fp8_gemm_output_over_an_input_raises():
    from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
    a = per_token_cast_to_fp8(torch.randn(64, 256).bfloat16(), use_ue8m0=False)
    b = per_block_cast_to_fp8(torch.randn(128, 256).bfloat16(), use_ue8m0=False)
    d = torch.empty(64, 128, dtype=torch.bfloat16)
    dk.fp8_gemm_nt(a, b, d)
    over_a = a[0].view(torch.bfloat16)[:, :128]                              # d's bytes over A's
    with pytest.raises(ValueError, match=r"overlaps a\[0\]"):
        dk.fp8_gemm_nt(a, b, over_a)
    over_sfa = torch.empty(64 * 128, dtype=torch.bfloat16)
    sfa = over_sfa.view(torch.float32)[: 64 * 2].view(64, 2)
    sfa.copy_(a[1])
    with pytest.raises(ValueError, match=r"overlaps a\[1\]"):
        dk.fp8_gemm_nt((a[0], sfa), b, over_sfa.view(64, 128))



@INTERP
def test_dense_gemm_cached_plan_still_rejects_overlapping_c():
    m, n, k = 64, 128, 256
    a, b = torch.randn(m, k).bfloat16(), torch.randn(n, k).bfloat16()
    dk.bf16_gemm_nt(a, b, torch.empty(m, n, dtype=torch.bfloat16), c=torch.randn(m, n).bfloat16())   # cached
    buf = torch.randn(m + 8, n).bfloat16()          # d = rows 0..63, c = rows 8..71: same signature, overlapping
    with pytest.raises(ValueError, match="overlap"):
        dk.bf16_gemm_nt(a, b, buf[:m], c=buf[8:])



# ------------------------------------------------------------------------------------------------ 11. metadata device
@REF
@pytest.mark.parametrize("which", ["tile_scheduler_metadata", "num_splits"])
def test_dense_decode_legacy_metadata_on_another_device_raises(which):
    q, kc, bt, seqlens = _dense_decode_args()
    meta, ns = dk.get_mla_metadata(seqlens, 16, 1)
    if which == "tile_scheduler_metadata":
        meta = meta.to("meta")
    else:
        ns = ns.to("meta")
    with pytest.raises(ValueError, match=f"{which} must be on q's device"):
        dk.flash_mla_with_kvcache(q, kc, bt, seqlens, 512, meta, ns)


# ------------------------------------------------------------------------- lead: deep_gemm.testing's timing helpers
def test_deep_gemm_testing_names_its_missing_timing_helpers():
    """Upstream's deep_gemm.testing.bench / bench_kineto are not served: the AttributeError says so (and what to use),
    calc_diff / count_bytes are served."""
    from deepkernels.compat import deep_gemm_testing as t
    assert callable(t.calc_diff) and callable(t.count_bytes)
    for name in ("bench", "bench_kineto"):
        with pytest.raises(AttributeError, match="not implemented by deepkernels"):
            getattr(t, name)
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        t.nope


# ------------------------------------------------------------------- lead: a FlashMLASchedMeta reused on another device
@REF
@pytest.mark.parametrize("path", ["dense", "sparse"])
def test_sched_meta_filled_on_another_device_raises(path):
    """A FlashMLASchedMeta filled by a call on one device and reused for a call on another: ValueError naming
    tile_scheduler_metadata (the kernels would read schedule tensors of another GPU). Simulated on a CPU-only machine
    by moving the filled schedule to the 'meta' device."""
    meta = dk.get_mla_metadata()[0]
    if path == "dense":
        q, kc, bt, sl = _dense_decode_args()
        call = lambda: dk.flash_mla_with_kvcache(q, kc, bt, sl, 512, meta)   # noqa: E731
    else:
        q, kc, ind = _sparse_decode_args()
        call = lambda: dk.flash_mla_with_kvcache(q, kc, None, None, 512, meta, is_fp8_kvcache=True,  # noqa: E731
                                                 indices=ind)
    call()                                           # fills it (CPU)
    call()                                           # reuse on the same device: fine
    meta.tile_scheduler_metadata = meta.tile_scheduler_metadata.to("meta")
    with pytest.raises(ValueError, match="tile_scheduler_metadata was filled on meta"):
        call()


def test_resolve_schedule_device_check_is_optional():
    from deepkernels.mla.metadata import resolve_schedule
    from deepkernels.mla.decode import FlashMLASchedMeta
    meta = FlashMLASchedMeta()
    pair = (torch.zeros(1, 8, dtype=torch.int32), torch.zeros(2, dtype=torch.int32))
    assert resolve_schedule(meta, None, "cfg", lambda: pair, None, FlashMLASchedMeta) == pair
    assert resolve_schedule(meta, None, "cfg", None, None, FlashMLASchedMeta, torch.device("cpu")) == pair
    with pytest.raises(ValueError, match="use one get_mla_metadata"):
        resolve_schedule(meta, None, "cfg", None, None, FlashMLASchedMeta, torch.device("meta"))
