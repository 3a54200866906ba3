"""torch.library registration of the public ops (deepkernels.ops), reference tier (CPU tensors, so every op runs
its PyTorch reference).

For each op and a few small cases: ``torch.library.opcheck`` (schema, autograd registration, fake tensor, AOT
dispatch with dynamic shapes), the fake implementation's shapes/dtypes/strides against the real outputs, and
results bitwise equal to calling the public function directly. One ``torch.compile(fullgraph=True)`` test runs
a decode step (metadata op + dense decode op) and a mutating GEMM op through Inductor on the CPU.
"""
import os
import shutil

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_map

import deepkernels as dk
import deepkernels.ops as dkops
from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
from deepkernels.quant.kvcache import quantize_kv_cache

pytestmark = pytest.mark.reference

OPS = torch.ops.deepkernels
ALL_CHECKS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
# SchemaCheckMode compares every argument before/after with torch.allclose, which has no CPU kernel for
# float8_e4m3fn ("mul_cpu_reduced_float" not implemented), so test_schema cannot run on ops with FP8 tensor
# arguments; _check_schema_by_hand below checks the same thing (only the declared ``d`` changes, no output
# aliases an input) by comparing raw bytes.
NO_SCHEMA = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
BF16 = torch.bfloat16


def _clone(x):
    return tree_map(lambda t: t.clone() if isinstance(t, torch.Tensor) else t, x)


def _has_fp8(args) -> bool:
    return any(isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fn for t in args)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    flat = torch.empty(t.shape, dtype=t.dtype, device=t.device)   # truly contiguous (strides of size-1 dims too)
    flat.copy_(t.detach())
    return flat.view(-1).view(torch.uint8)


def _equal(x, y) -> bool:
    """Bitwise equality of tensors (NaN-safe: compares raw bytes), tuples of tensors or None."""
    if isinstance(x, (tuple, list)):
        return len(x) == len(y) and all(_equal(a, b) for a, b in zip(x, y))
    if x is None or y is None:
        return x is y
    return x.shape == y.shape and x.dtype == y.dtype and torch.equal(_bytes(x), _bytes(y))


def _check_schema_by_hand(op, args, kwargs, mutated: tuple):
    names = [a.name for a in op.default._schema.arguments]
    bound = dict(zip(names, args), **kwargs)
    before = {k: _bytes(v) for k, v in bound.items() if isinstance(v, torch.Tensor)}
    out = op(*args, **kwargs)
    for k, v in bound.items():
        if isinstance(v, torch.Tensor) and k not in mutated and not any(v is bound[m] for m in mutated):
            assert torch.equal(_bytes(v), before[k]), f"{op}: argument {k} was mutated but is not declared"
    for o in (out if isinstance(out, tuple) else () if out is None else (out,)):
        for k, v in bound.items():
            if isinstance(v, torch.Tensor):
                assert o.untyped_storage().data_ptr() != v.untyped_storage().data_ptr(), f"output aliases {k}"


def _run_opcheck(op, args, kwargs=None, mutated=()):
    kwargs = kwargs or {}
    if _has_fp8(args):
        res = torch.library.opcheck(op, _clone(args), _clone(kwargs), test_utils=NO_SCHEMA)
        _check_schema_by_hand(op, _clone(args), _clone(kwargs), mutated)
    else:
        res = torch.library.opcheck(op, _clone(args), _clone(kwargs), test_utils=ALL_CHECKS)
    assert all(v == "SUCCESS" for v in res.values()), res


def _check_fake_layout(op, args, kwargs, real_out):
    """The fake implementation promises exactly the real outputs' shapes, dtypes and strides."""
    with FakeTensorMode() as mode:
        fargs = tree_map(lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t, (args, kwargs))
        fake_out = op(*fargs[0], **fargs[1])
    if real_out is None:
        assert fake_out is None
        return
    assert len(fake_out) == len(real_out)
    for f, r in zip(fake_out, real_out):
        assert (tuple(f.shape), f.dtype, f.stride()) == (tuple(r.shape), r.dtype, r.stride())
        assert f.device == r.device


# ----------------------------------------------------------------------------------------------- inputs
def _fp8_a(*shape):
    x = torch.randn(*shape, dtype=BF16)
    if len(shape) == 2:
        return per_token_cast_to_fp8(x)
    q = [per_token_cast_to_fp8(x[i]) for i in range(shape[0])]
    return torch.stack([t[0] for t in q]), torch.stack([t[1] for t in q])


def _fp8_b(*shape):
    x = torch.randn(*shape, dtype=BF16)
    if len(shape) == 2:
        return per_block_cast_to_fp8(x)
    q = [per_block_cast_to_fp8(x[i]) for i in range(shape[0])]
    return torch.stack([t[0] for t in q]), torch.stack([t[1] for t in q])


def gemm_cases():
    """(id, op name, op args, op kwargs, public call on cloned args)."""
    m, n, k = 8, 64, 256
    (ad, sa), (bd, sb) = _fp8_a(m, k), _fp8_b(n, k)
    d = torch.empty(m, n, dtype=BF16)
    c = torch.randn(m, n, dtype=BF16)
    bp = per_token_cast_to_fp8(torch.randn(n, k, dtype=BF16))      # per-row (1, 1, 128) B scales
    d32 = torch.empty(m, n, dtype=torch.float32)
    a16, b16 = torch.randn(m, k, dtype=BF16), torch.randn(n, k, dtype=BF16)
    g, mm, kk = 2, 6, 128
    (gad, gsa), (gbd, gsb) = _fp8_a(g * mm, kk), _fp8_b(g, n, kk)
    layout = torch.tensor([0, 0, 0, 1, 1, -1, 1, 0, -1, 1, 1, 1], dtype=torch.int32)
    psum = torch.tensor([5, 12], dtype=torch.int32)
    gd = torch.empty(g * mm, n, dtype=BF16)
    (mad, msa) = _fp8_a(g, mm, kk)
    masked_m = torch.tensor([3, 6], dtype=torch.int32)
    md = torch.zeros(g, mm, n, dtype=BF16)
    ga16, gb16 = torch.randn(g * mm, kk, dtype=BF16), torch.randn(g, n, kk, dtype=BF16)
    ma16 = torch.randn(g, mm, kk, dtype=BF16)
    return [
        ("fp8", "fp8_gemm_nt", (ad, sa, bd, sb, d), {},
         lambda a: dk.fp8_gemm_nt((a[0], a[1]), (a[2], a[3]), a[4])),
        ("fp8_c", "fp8_gemm_nt", (ad, sa, bd, sb, d, c), {},
         lambda a: dk.fp8_gemm_nt((a[0], a[1]), (a[2], a[3]), a[4], a[5])),
        ("fp8_perrow_f32", "fp8_gemm_nt", (ad, sa, *bp, d32), {"recipe": [1, 1, 128]},
         lambda a: dk.fp8_gemm_nt((a[0], a[1]), (a[2], a[3]), a[4], recipe=(1, 1, 128))),
        ("bf16", "bf16_gemm_nt", (a16, b16, d), {}, lambda a: dk.bf16_gemm_nt(*a)),
        ("bf16_c", "bf16_gemm_nt", (a16, b16, d32, c.float()), {}, lambda a: dk.bf16_gemm_nt(*a)),
        ("grouped_fp8_contig", "m_grouped_fp8_gemm_nt_contiguous", (gad, gsa, gbd, gsb, gd, layout), {},
         lambda a: dk.m_grouped_fp8_gemm_nt_contiguous((a[0], a[1]), (a[2], a[3]), a[4], a[5])),
        ("grouped_fp8_psum", "m_grouped_fp8_gemm_nt_contiguous", (gad, gsa, gbd, gsb, gd, psum),
         {"use_psum_layout": True},
         lambda a: dk.m_grouped_fp8_gemm_nt_contiguous((a[0], a[1]), (a[2], a[3]), a[4], a[5],
                                                       use_psum_layout=True)),
        ("grouped_bf16_contig", "m_grouped_bf16_gemm_nt_contiguous", (ga16, gb16, gd, layout), {},
         lambda a: dk.m_grouped_bf16_gemm_nt_contiguous(*a)),
        ("grouped_fp8_masked", "m_grouped_fp8_gemm_nt_masked", (mad, msa, gbd, gsb, md, masked_m, 4), {},
         lambda a: dk.m_grouped_fp8_gemm_nt_masked((a[0], a[1]), (a[2], a[3]), a[4], a[5], a[6])),
        ("grouped_bf16_masked", "m_grouped_bf16_gemm_nt_masked", (ma16, gb16, md, masked_m, 4), {},
         lambda a: dk.m_grouped_bf16_gemm_nt_masked(*a)),
    ]


def _dense_decode_inputs(b=2, s_q=2, h_q=4, h_kv=1, seqlens=(5, 37), page=16):
    seqlens = torch.tensor(seqlens, dtype=torch.int32)
    width = max(-(-int(n) // page) for n in seqlens) + 1
    nb = b * width
    bt = torch.randperm(nb).view(b, width).int()
    k = (torch.randn(nb, page, h_kv, 576) / 10).to(BF16)
    q = (torch.randn(b, s_q, h_q, 576) / 10).to(BF16)
    return q, k, bt, seqlens


def _sparse_decode_inputs(b=2, s_q=1, h_q=16, topk=8, page=16, nb=3):
    kv = (torch.randn(nb, page, 1, 576) / 10).clamp(-1, 1).to(BF16)
    cache = quantize_kv_cache(kv, "v32")
    ind = torch.randint(0, nb * page, (b, s_q, topk), dtype=torch.int32)
    ind[..., -2:] = -1
    q = (torch.randn(b, s_q, h_q, 576) / 10).to(BF16)
    return q, cache, ind


def attn_cases():
    """(id, op name, op args, op kwargs, public call on cloned args)."""
    q, k, bt, sl = _dense_decode_inputs()
    rows = q.shape[1] * q.shape[2] // k.shape[2]
    sched, ns = dk.get_mla_metadata(sl, rows, k.shape[2])
    q2, k2, bt2, sl2 = _dense_decode_inputs(b=3, s_q=1, h_q=8, h_kv=2, seqlens=(0, 1, 40), page=8)
    sched2, ns2 = dk.get_mla_metadata(sl2, 4, 2)
    sq, cache, ind = _sparse_decode_inputs()
    sink = torch.randn(16)
    tlen = torch.tensor([8, 3], dtype=torch.int32)
    pq = (torch.randn(3, 16, 576) / 10).to(BF16)
    pkv = (torch.randn(20, 1, 576) / 10).to(BF16)
    pind = torch.randint(-1, 20, (3, 1, 8), dtype=torch.int32)
    vq = torch.randn(10, 4, 192, dtype=BF16)
    vk, vv = torch.randn(12, 2, 192, dtype=BF16), torch.randn(12, 2, 128, dtype=BF16)
    cq, ck = torch.tensor([0, 3, 10], dtype=torch.int32), torch.tensor([0, 5, 12], dtype=torch.int32)
    vq1 = torch.randn(6, 1, 128, dtype=BF16)    # h = 1: lse [total_q, 1], the stride of a size-1 dim
    vk1, vv1 = torch.randn(4, 1, 128, dtype=BF16), torch.randn(4, 1, 128, dtype=BF16)
    cq1, ck1 = torch.tensor([0, 6], dtype=torch.int32), torch.tensor([0, 4], dtype=torch.int32)
    return [
        ("metadata", "get_mla_metadata", (sl, rows, k.shape[2]), {},
         lambda a: dk.get_mla_metadata(*a)),
        ("metadata_topk", "get_mla_metadata", (sl, 16, 1), {"topk": 8},
         lambda a: dk.get_mla_metadata(*a, topk=8)),
        ("decode", "flash_mla_with_kvcache", (q, k, bt, sl, 512, sched, ns), {"causal": True},
         lambda a: dk.flash_mla_with_kvcache(*a, causal=True)),
        ("decode_gqa_scale", "flash_mla_with_kvcache", (q2, k2, bt2, sl2, 512, sched2, ns2),
         {"softmax_scale": 0.05}, lambda a: dk.flash_mla_with_kvcache(*a, softmax_scale=0.05)),
        ("sparse_decode", "flash_mla_with_kvcache_sparse", (sq, cache.view(torch.uint8), ind, 512), {},
         lambda a: dk.flash_mla_with_kvcache(a[0], a[1], None, None, 512, dk.get_mla_metadata()[0],
                                             is_fp8_kvcache=True, indices=a[2])),
        ("sparse_decode_sink_len", "flash_mla_with_kvcache_sparse", (sq, cache, ind, 512),
         {"softmax_scale": 0.04, "attn_sink": sink, "topk_length": tlen},
         lambda a: dk.flash_mla_with_kvcache(a[0], a[1], None, None, 512, dk.get_mla_metadata()[0],
                                             softmax_scale=0.04, is_fp8_kvcache=True, indices=a[2],
                                             attn_sink=sink, topk_length=tlen)),
        ("sparse_prefill", "flash_mla_sparse_fwd", (pq, pkv, pind, 0.04), {},
         lambda a: dk.flash_mla_sparse_fwd(*a)),
        ("sparse_prefill_sink", "flash_mla_sparse_fwd", (pq, pkv, pind, 0.04),
         {"attn_sink": sink, "topk_length": tlen.new_tensor([8, 0, 5])},
         lambda a: dk.flash_mla_sparse_fwd(*a, attn_sink=sink, topk_length=tlen.new_tensor([8, 0, 5]))),
        ("varlen", "flash_attn_varlen_func", (vq, vk, vv, cq, ck, 7, 7), {"causal": True},
         lambda a: dk.flash_attn_varlen_func(*a, causal=True)),
        ("varlen_h1", "flash_attn_varlen_func", (vq1, vk1, vv1, cq1, ck1, 6, 4), {"softmax_scale": 0.1},
         lambda a: dk.flash_attn_varlen_func(*a, softmax_scale=0.1)),
    ]


# static ids (collection builds no tensors; identical on every xdist worker); test_case_ids checks them
GEMM_IDS = ["fp8", "fp8_c", "fp8_perrow_f32", "bf16", "bf16_c", "grouped_fp8_contig", "grouped_fp8_psum",
            "grouped_bf16_contig", "grouped_fp8_masked", "grouped_bf16_masked"]
ATTN_IDS = ["metadata", "metadata_topk", "decode", "decode_gqa_scale", "sparse_decode", "sparse_decode_sink_len",
            "sparse_prefill", "sparse_prefill_sink", "varlen", "varlen_h1"]


def _case(cases, cid):
    return next(c for c in cases() if c[0] == cid)


def test_case_ids():
    assert [c[0] for c in gemm_cases()] == GEMM_IDS and [c[0] for c in attn_cases()] == ATTN_IDS
    assert {c[1] for c in gemm_cases() + attn_cases()} == set(dkops.OPS)   # every op has a case


# ----------------------------------------------------------------------------------------------- tests
def test_every_op_is_registered_and_declares_its_mutations():
    """Every op is reachable as torch.ops.deepkernels.<name>; the GEMMs declare ``d`` mutated, nothing else is.
    (Each op's fake implementation is exercised by opcheck and _check_fake_layout below.)"""
    names = [n for n in dkops.__all__ if n != "OPS"]
    assert sorted(dkops.OPS) == sorted(names)
    for name in names:
        assert dkops.OPS[name] is getattr(OPS, name)
        assert getattr(dkops, name)._qualname == f"deepkernels::{name}"
    mutating = {n for n in dkops.OPS if "gemm" in n}
    for name, packet in dkops.OPS.items():
        mut = [a.name for a in packet.default._schema.arguments if a.alias_info and a.alias_info.is_write]
        assert mut == (["d"] if name in mutating else []), (name, mut)


@pytest.mark.parametrize("cid", GEMM_IDS)
def test_gemm_op_opcheck_and_matches_public(cid):
    _, name, args, kwargs, public = _case(gemm_cases, cid)
    op = getattr(OPS, name)
    _run_opcheck(op, args, kwargs, mutated=("d",))
    _check_fake_layout(op, args, kwargs, None)
    got, want = _clone(args), _clone(args)
    assert op(*got, **kwargs) is None
    public(want)
    d_idx = [a.name for a in op.default._schema.arguments].index("d")
    assert _equal(got[d_idx], want[d_idx])
    assert _equal(tuple(x for i, x in enumerate(got) if i != d_idx and isinstance(x, torch.Tensor)),
                  tuple(x for i, x in enumerate(args) if i != d_idx and isinstance(x, torch.Tensor)))


@pytest.mark.parametrize("name", ["fp8_gemm_nt", "bf16_gemm_nt"])
def test_gemm_op_accumulates_in_place_with_c_is_d(name):
    m, n, k = 8, 64, 128
    d0 = torch.randn(m, n, dtype=BF16)
    if name == "fp8_gemm_nt":
        (ad, sa), (bd, sb) = _fp8_a(m, k), _fp8_b(n, k)
        ops_args, call = (ad, sa, bd, sb), lambda d, c: dk.fp8_gemm_nt((ad, sa), (bd, sb), d, c)
    else:
        a16, b16 = torch.randn(m, k, dtype=BF16), torch.randn(n, k, dtype=BF16)
        ops_args, call = (a16, b16), lambda d, c: dk.bf16_gemm_nt(a16, b16, d, c)
    op = getattr(OPS, name)
    d = d0.clone()
    op(*ops_args, d, d)
    want = d0.clone()
    call(want, want)
    assert _equal(d, want) and not _equal(d, d0)
    x = d0.clone()
    _run_opcheck(op, (*ops_args, x, x), mutated=("d",))


@pytest.mark.parametrize("cid", ATTN_IDS)
def test_attention_op_opcheck_and_matches_public(cid):
    _, name, args, kwargs, public = _case(attn_cases, cid)
    op = getattr(OPS, name)
    _run_opcheck(op, args, kwargs)
    got = op(*_clone(args), **_clone(kwargs))
    want = public(_clone(args))
    assert isinstance(got, tuple) and len(got) == len(want)
    assert _equal(got, tuple(want))
    _check_fake_layout(op, args, kwargs, got)


def test_output_layouts_match_upstream():
    """lse of the varlen op and of sparse decode are transposed views, as upstream (documented in the ops)."""
    _, _, args, kwargs, _ = _case(attn_cases, "varlen")
    out, lse = OPS.flash_attn_varlen_func(*args, **kwargs)
    assert out.is_contiguous() and lse.shape == (10, 4) and lse.stride() == (1, 10)
    _, _, args, kwargs, _ = _case(attn_cases, "sparse_decode")
    out, lse = OPS.flash_mla_with_kvcache_sparse(*args, **kwargs)
    assert out.is_contiguous() and lse.shape == (2, 16, 1) and lse.stride() == (16, 1, 16)
    _, _, args, kwargs, _ = _case(attn_cases, "decode")
    out, lse = OPS.flash_mla_with_kvcache(*args, **kwargs)
    assert out.is_contiguous() and lse.is_contiguous() and lse.shape == (2, 4, 2)


def test_validation_errors_are_the_public_ops():
    _, _, args, kwargs, _ = _case(attn_cases, "decode")
    with pytest.raises(ValueError, match="head_dim_v"):
        OPS.flash_mla_with_kvcache(*args[:4], 256, *args[5:], **kwargs)
    a16, b16 = torch.randn(8, 64, dtype=BF16), torch.randn(16, 64, dtype=BF16)
    with pytest.raises(ValueError, match="d must have shape"):
        OPS.bf16_gemm_nt(a16, b16, torch.empty(8, 8, dtype=BF16))


def _has_cxx() -> bool:
    return any(shutil.which(c) for c in (os.environ.get("CXX", "g++"), "g++", "clang++"))


@pytest.mark.skipif(not _has_cxx(), reason="Inductor's CPU backend needs a C++ compiler")
def test_torch_compile_fullgraph_decode_step_and_gemm():
    """A decode step (metadata op + dense decode op) and a mutating GEMM op (into a graph-allocated buffer and
    accumulating into a graph input) traced as one graph by Dynamo and compiled by Inductor (CPU). About 13 s
    on 2 cores with a cold Inductor cache, 3 s warm."""
    q, k, bt, sl = _dense_decode_inputs()
    a16, b16 = torch.randn(8, 64, dtype=BF16), torch.randn(32, 64, dtype=BF16)
    acc0 = torch.randn(8, 32, dtype=torch.float32)

    def step(q, k, bt, sl, a, b, acc):
        sched, ns = OPS.get_mla_metadata(sl, q.shape[1] * q.shape[2] // k.shape[2], k.shape[2])
        out, lse = OPS.flash_mla_with_kvcache(q, k, bt, sl, 512, sched, ns, causal=True)
        d = torch.empty(a.shape[0], b.shape[0], dtype=torch.float32)
        OPS.bf16_gemm_nt(a, b, d)
        OPS.bf16_gemm_nt(a, b, acc, acc)
        return out.float() * 0.5, lse * 2, d + 1        # exact pointwise ops: bitwise comparable

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, dynamic=False)
    acc_c, acc_e = acc0.clone(), acc0.clone()
    got = compiled(q, k, bt, sl, a16, b16, acc_c)
    want = step(q, k, bt, sl, a16, b16, acc_e)
    for x, y in zip(got, want):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    assert _equal(acc_c, acc_e) and not _equal(acc_c, acc0)
