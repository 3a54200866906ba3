"""Regression tests of the session-21 fresh-user / adversarial review (CPU: reference + interpreter tiers).

1./2. ``flash_attn_varlen_func`` (and its packed variants) with ``max_seqlen_qo`` smaller than the longest query
   sequence: the grid is sized from the hint (``cdiv(max_seqlen_qo, 128)`` row blocks per (sequence, head)), so on
   CUDA with device ``cu_seqlens_qo`` (not checked: a host sync) the rows past the covered blocks were never written
   and came back as whatever ``torch.empty`` held. Upstream FlashAttention / FlashMLA treat ``max_seqlen`` as the
   caller's grid-size promise and leave those rows undefined too; we must never return stale memory. Now: a
   host-visible ``cu_seqlens_qo`` is still checked (ValueError); otherwise the launch is followed by a guard kernel
   (one program per sequence + 2; no host sync, graph-capturable, writes nothing for correct inputs) that writes NaN
   to the out / lse rows the grid did not cover: the dense decode path's "NaN, never a plausible wrong value" rule.
   The same guard gives the rows of q in no sequence (device ``cu_seqlens_qo`` ending before ``total_q``: the
   CUDA-graph padding tokens of a serving step; ``b == 0`` with rows) their "no key" value, out 0 / lse +inf
   (they were never written either). ``max_seqlen_kv`` sizes nothing here (the kernels read the key lengths from
   ``cu_seqlens_kv``): any value gives the right result.
3. ``max_seqlen_qo`` far larger than ``total_q`` (e.g. 10**12) sized the grid from it: under the interpreter the call
   ran for hours (10**6 took 19 s at total_q 24), on a GPU the grid (cdiv(hint, 128) * b * h programs) passed 2^31
   and the launch failed naming no argument. The grid hint is now clamped to ``total_q`` (no sequence is longer),
   and a grid that still passes 2^31 - 1 programs (many sequences, a lazy hint) is a ValueError naming the hint.
4. MLA decode with empty work (``b == 0``, ``s_q == 0``, dense ``h_q == 0``) returned before looking at
   ``tile_scheduler_metadata``: a ``FlashMLASchedMeta`` filled for another configuration, legacy tensors planned for
   another batch, and ``None`` / any object were all accepted, where the same call with work raises. Now every call
   checks the metadata the same way, on the dense and the sparse path (nothing computed or launched; a fresh
   ``FlashMLASchedMeta`` stays unfilled, so the next call with work fills it: session 16's rule).
5. ``torch.ops.deepkernels.get_mla_metadata`` under torch.compile: its fake divided by zero for
   ``num_q_tokens_per_head_k`` / ``num_heads_k`` <= 0 (ZeroDivisionError, naming nothing); now the eager ValueError.
6. ``causal`` given as a str (``"False"`` from a config) was truthy: the attention ops silently ran causal. Now a
   TypeError naming it (``_validate.check_flag``: bool, NumPy bool, numbers, None as upstream's pybind bool).
"""
import math

import numpy as np
import pytest
import torch

import deepkernels as dk
from deepkernels.mla import dense_prefill as dp
from deepkernels.mla.dense_prefill import flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func
from deepkernels.quant.kvcache import quantize_kv_cache

REF = pytest.param("reference", marks=pytest.mark.reference)
INT = pytest.param("interpret", marks=pytest.mark.interpret)
TIERS = [REF, INT]


# ------------------------------------------------------------------------------------------------ helpers
def _varlen(seq_q, seq_k, h=2, h_k=1, d=128, dtype=torch.bfloat16):
    cq = torch.tensor([0] + np.cumsum(seq_q).tolist(), dtype=torch.int32)
    ck = torch.tensor([0] + np.cumsum(seq_k).tolist(), dtype=torch.int32)
    q = (torch.randn(int(cq[-1]), h, d) / 4).to(dtype)
    k = (torch.randn(int(ck[-1]), h_k, d) / 4).to(dtype)
    v = (torch.randn(int(ck[-1]), h_k, 128) / 4).to(dtype)
    return q, k, v, cq, ck


class _GridRecorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](...)`` records the grid and launches nothing."""

    def __init__(self):
        self.grids = []

    def __getitem__(self, grid):
        self.grids.append(tuple(grid))
        return lambda *a, **k: None


# ------------------------------------------ 1./2. max_seqlen_qo below the longest sequence; rows in no sequence
@pytest.mark.interpret
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_small_max_seqlen_never_leaves_rows_unwritten(causal):
    """The launch as the public op makes it on CUDA with device cu_seqlens (no host check): hint 5 while a sequence
    has 200 rows. Rows 0..127 of every sequence are computed; the rows the grid does not cover must not keep what
    the buffer held (a sentinel here, stale memory on a GPU): NaN out and lse, never a plausible value."""
    q, k, v, cq, ck = _varlen([5, 200, 0, 130], [7, 200, 3, 140])
    total_q, h = q.shape[0], q.shape[1]
    out = torch.full((total_q, h, 128), 7.0, dtype=q.dtype)
    lse = torch.full((h, total_q), 7.0)
    dp._launch_dense_prefill(out, lse, q, k, v, cq, ck, 5, 128 ** -0.5, causal)
    ro, rl = dk.flash_attn_varlen_func(q, k, v, cq, ck, 200, 200, causal=causal)   # a correct hint
    starts = cq.tolist()
    uncovered = torch.zeros(total_q, dtype=torch.bool)
    for a, b in zip(starts, starts[1:]):
        uncovered[a + 128:b] = True
    assert int(uncovered.sum()) == 72 + 2
    assert not (out == 7).any() and not (lse == 7).any(), "rows left as the buffer held them"
    assert out[uncovered].isnan().all() and lse[:, uncovered].isnan().all()
    assert torch.equal(out[~uncovered], ro[~uncovered])
    assert torch.equal(lse[:, ~uncovered], rl.t()[:, ~uncovered])


@pytest.mark.interpret
def test_varlen_guard_is_a_noop_for_a_correct_hint():
    """With a hint >= every length the guard writes nothing: bit-identical to the launch without it."""
    q, k, v, cq, ck = _varlen([5, 200, 0, 130], [7, 200, 3, 140])
    total_q, h = q.shape[0], q.shape[1]
    outs = []
    for hint in (200, 256, total_q):
        out = torch.full((total_q, h, 128), 7.0, dtype=q.dtype)
        lse = torch.full((h, total_q), 7.0)
        dp._launch_dense_prefill(out, lse, q, k, v, cq, ck, hint, 128 ** -0.5, True)
        assert not out.isnan().any() and not (out == 7).any()
        outs.append((out, lse))
    assert all(torch.equal(o, outs[0][0]) and torch.equal(l_, outs[0][1]) for o, l_ in outs)


@pytest.mark.interpret
@pytest.mark.parametrize("cq_list,total_q", [([0, 5, 30], 40), ([0], 8), ([3, 10, 20], 24)])
def test_varlen_rows_outside_every_sequence_defined(cq_list, total_q):
    """Rows of q outside every sequence (device cu_seqlens_qo ending before total_q: the CUDA-graph padding of a
    serving step; b == 0 with rows; cu_seqlens_qo[0] > 0) were never written. They see no key: out 0, lse +inf
    (the empty-row contract), written by the guard launch; the sequences' rows are unaffected."""
    cq = torch.tensor(cq_list, dtype=torch.int32)
    ck = torch.tensor([0] + [7 * (i + 1) for i in range(len(cq_list) - 1)], dtype=torch.int32)
    h = 2
    q = (torch.randn(total_q, h, 128) / 4).bfloat16()
    k = (torch.randn(max(int(ck[-1]), 1), 1, 128) / 4).bfloat16()
    v = (torch.randn(max(int(ck[-1]), 1), 1, 128) / 4).bfloat16()
    out = torch.full((total_q, h, 128), 7.0, dtype=q.dtype)
    lse = torch.full((h, total_q), 7.0)
    dp._launch_dense_prefill(out, lse, q, k, v, cq, ck, 200, 128 ** -0.5, True)
    inside = torch.zeros(total_q, dtype=torch.bool)
    inside[cq_list[0]:cq_list[-1]] = True
    assert not (out == 7).any() and not (lse == 7).any(), "rows left as the buffer held them"
    assert (out[~inside] == 0).all() and torch.isposinf(lse[:, ~inside]).all()
    assert not out[inside].isnan().any() and not lse[:, inside].isnan().any()
    if inside.any():   # the sequences' rows: the reference on exactly those rows
        a = cq_list[0]
        qi = q[inside]
        ro, rl = dk.flash_attn_varlen_func(qi, k[:int(ck[-1])], v[:int(ck[-1])], cq - a, ck, 200, 200, causal=True)
        assert torch.equal(out[inside], ro) and torch.equal(lse[:, inside], rl.t())


@pytest.mark.interpret
def test_varlen_guard_never_writes_outside_total_q():
    """The guard alone, given nonsense device cu_seqlens (a sequence running past total_q, a negative start): it
    writes only rows in [0, total_q) (out viewed inside a larger buffer whose tail must stay untouched)."""
    total_q, h = 10, 2
    buf = torch.full((total_q + 40, h, 128), 7.0, dtype=torch.bfloat16)
    lbuf = torch.full((h * total_q + 40,), 7.0)
    out, lse = buf[:total_q], lbuf[:h * total_q].view(h, total_q)
    cq = torch.tensor([-5, 3, 10 ** 6], dtype=torch.int32)
    dp._dense_prefill_uncovered_kernel[(4,)](out, lse, cq, 2, 0, total_q, h, out.stride(0), out.stride(1),
                                             DV=128, BLOCK_R=16)
    assert (buf[total_q:] == 7).all() and (lbuf[h * total_q:] == 7).all()
    assert out.isnan().all() and lse.isnan().all()          # both sequences' rows, clamped to [0, total_q)


@pytest.mark.parametrize("tier", TIERS)
def test_varlen_small_max_seqlen_host_cu_seqlens_raises_named(tier):
    """Host-visible cu_seqlens (CPU tensors): a too-small hint is a ValueError naming it, on the plain and the packed
    forms, before anything is written."""
    q, k, v, cq, ck = _varlen([5, 200], [7, 200], h=2, h_k=2)
    with pytest.raises(ValueError, match=r"max_seqlen_qo=5 is smaller than a query length \(200\)"):
        dk.flash_attn_varlen_func(q, k, v, cq, ck, 5, 200)
    kv = torch.cat([k, v], -1)
    with pytest.raises(ValueError, match=r"max_seqlen_qo=199 is smaller"):
        flash_attn_varlen_kvpacked_func(q, kv, cq, ck, 199, 200, 128)
    qkv = torch.cat([q, q, q[..., :128]], -1)
    with pytest.raises(ValueError, match=r"max_seqlen_qo=100 is smaller"):
        flash_attn_varlen_qkvpacked_func(qkv, cq, 100, 128)


@pytest.mark.parametrize("tier", TIERS)
def test_varlen_max_seqlen_kv_is_not_a_grid_size(tier):
    """max_seqlen_kv sizes nothing (the key lengths come from cu_seqlens_kv): a small or huge one gives the result of
    the exact one."""
    q, k, v, cq, ck = _varlen([3, 9], [20, 150])
    ro, rl = dk.flash_attn_varlen_func(q, k, v, cq, ck, 9, 150, causal=True)
    for hint in (0, 1, 10 ** 12):
        o, l_ = dk.flash_attn_varlen_func(q, k, v, cq, ck, 9, hint, causal=True)
        assert torch.equal(o, ro) and torch.equal(l_, rl)


@pytest.mark.gpu
def test_varlen_small_max_seqlen_device_cu_seqlens_gpu():
    """The public op on CUDA with device cu_seqlens and a too-small hint: no stale rows (NaN where not computed)."""
    q, k, v, cq, ck = (t.cuda() for t in _varlen([5, 300, 130], [7, 300, 140], h=4, h_k=4))
    torch.cuda.empty_cache()
    out, lse = dk.flash_attn_varlen_func(q, k, v, cq, ck, 5, 300, causal=True)
    ro, rl = dk.flash_attn_varlen_func(q, k, v, cq, ck, 300, 300, causal=True)
    bad = torch.zeros(q.shape[0], dtype=torch.bool, device="cuda")
    bad[5 + 128:5 + 300] = True
    bad[305 + 128:] = True
    assert out[bad].isnan().all() and lse[bad].isnan().all()
    assert torch.equal(out[~bad], ro[~bad]) and torch.equal(lse[~bad], rl[~bad])


@pytest.mark.gpu
def test_varlen_padding_rows_device_cu_seqlens_gpu():
    """The public op on CUDA, q padded past cu_seqlens_qo[-1] (a CUDA-graph batch): padding rows out 0 / lse +inf."""
    q, k, v, cq, ck = (t.cuda() for t in _varlen([5, 300, 130], [7, 300, 140], h=4, h_k=4))
    qp = torch.cat([q, torch.randn(64, 4, 128, device="cuda").bfloat16()])
    out, lse = dk.flash_attn_varlen_func(qp, k, v, cq, ck, 300, 300, causal=True)
    ro, rl = dk.flash_attn_varlen_func(q, k, v, cq, ck, 300, 300, causal=True)
    n = q.shape[0]
    assert (out[n:] == 0).all() and torch.isposinf(lse[n:]).all()
    assert torch.equal(out[:n], ro) and torch.equal(lse[:n], rl)


# ------------------------------------------------------------------ 3. max_seqlen_qo far above total_q
@pytest.mark.reference
@pytest.mark.parametrize("hint", [10 ** 12, 2 ** 31, 10 ** 6])
def test_varlen_huge_max_seqlen_grid_clamped(hint, monkeypatch):
    """The Triton launch's grid comes from min(max_seqlen_qo, total_q): a hint of 10**12 must not ask for
    ~8e9 * b * h programs (launch failure on a GPU, hours under the interpreter)."""
    rec, guard = _GridRecorder(), _GridRecorder()
    monkeypatch.setattr(dp, "_dense_prefill_fwd_kernel", rec)
    monkeypatch.setattr(dp, "_dense_prefill_uncovered_kernel", guard)
    q, k, v, cq, ck = _varlen([5, 200, 0, 130], [7, 200, 3, 140], h=2, h_k=1)
    out = torch.empty(q.shape[0], 2, 128, dtype=q.dtype)
    lse = torch.empty(2, q.shape[0])
    dp._launch_dense_prefill(out, lse, q, k, v, cq, ck, hint, 0.1, True)
    b, h, total_q = 4, 2, q.shape[0]
    assert rec.grids and rec.grids[0][0] == math.ceil(total_q / 128) * b * h
    assert guard.grids == [(b + 2,)]


@pytest.mark.reference
def test_varlen_grid_past_int32_raises_named(monkeypatch):
    """Even clamped, ``cdiv(max_seqlen_qo, 128) * b * h`` programs can pass 2^31 - 1 (16,384 sequences, 2^20 tokens,
    h 128 and a lazy hint of total_q: 2^34), which the grid's axis 0 cannot hold (launch failure naming nothing on a
    GPU; the kernels index programs in int32). A ValueError naming max_seqlen_qo, before any launch; the real
    longest length (here 64) fits."""
    rec, guard = _GridRecorder(), _GridRecorder()
    monkeypatch.setattr(dp, "_dense_prefill_fwd_kernel", rec)
    monkeypatch.setattr(dp, "_dense_prefill_uncovered_kernel", guard)
    b, h, total_q = 2 ** 14, 128, 2 ** 20
    q = torch.empty(1, 1, 128, dtype=torch.bfloat16).expand(total_q, h, 128)       # never touched
    k = torch.empty(1, 1, 128, dtype=torch.bfloat16).expand(total_q, 1, 128)
    out = torch.empty(1, 1, 128, dtype=torch.bfloat16).expand(total_q, h, 128)
    lse = torch.empty(1, 1).expand(h, total_q)
    cu = torch.arange(b + 1, dtype=torch.int32) * 64
    with pytest.raises(ValueError, match=r"max_seqlen_qo"):
        dp._launch_dense_prefill(out, lse, q, k, k, cu, cu, total_q, 0.1, True)
    assert not rec.grids and not guard.grids
    dp._launch_dense_prefill(out, lse, q, k, k, cu, cu, 64, 0.1, True)
    assert rec.grids == [(b * h,)]


@pytest.mark.interpret
def test_varlen_huge_max_seqlen_runs_promptly_and_exactly():
    """Under the interpreter: max_seqlen_qo 10**12 (and the packed forms) gives the exact-hint result."""
    q, k, v, cq, ck = _varlen([5, 19], [7, 30], h=2, h_k=2)
    ro, rl = dk.flash_attn_varlen_func(q, k, v, cq, ck, 19, 30, causal=True)
    o, l_ = dk.flash_attn_varlen_func(q, k, v, cq, ck, 10 ** 12, 10 ** 12, causal=True)
    assert torch.equal(o, ro) and torch.equal(l_, rl)
    kv = torch.cat([k, v], -1)
    o, l_ = flash_attn_varlen_kvpacked_func(q, kv, cq, ck, 10 ** 12, 10 ** 12, 128, causal=True)
    assert torch.equal(o, ro) and torch.equal(l_, rl)


# ------------------------------------------------------------------ 4. decode: empty work checks its metadata
def _dense_case(b, s_q=1, h_q=16, page=64):
    q = torch.randn(b, s_q, h_q, 576).bfloat16()
    kc = torch.randn(4, page, 1, 576).bfloat16()
    bt = torch.arange(2 * b, dtype=torch.int32).view(b, 2) % 4
    sl = torch.full((b,), 70, dtype=torch.int32)
    return q, kc, bt, sl


def _sparse_case(b, s_q=1, h_q=16, topk=32, nb=2, page=64):
    kc = quantize_kv_cache((torch.randn(nb, page, 1, 576) / 10).bfloat16(), "v32")
    q = torch.randn(b, s_q, h_q, 576).clamp(-2, 2).bfloat16()
    ind = torch.randint(0, nb * page, (b, s_q, topk), dtype=torch.int32)
    return q, kc, ind


def _dense(case, meta, ns=None):
    return dk.flash_mla_with_kvcache(*case, 512, meta, ns)


def _sparse(case, meta, ns=None):
    q, kc, ind = case
    return dk.flash_mla_with_kvcache(q, kc, None, None, 512, meta, ns, is_fp8_kvcache=True, indices=ind)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("path", ["dense", "sparse"])
def test_empty_work_rejects_metadata_of_another_config(tier, path):
    """A FlashMLASchedMeta filled by a b=2 call, reused by b=0 / s_q=0 (dense: h_q=0) calls: the ValueError a
    non-empty call of another configuration gets."""
    run, case = (_dense, _dense_case) if path == "dense" else (_sparse, _sparse_case)
    meta, _ = dk.get_mla_metadata()
    run(case(2), meta)
    empties = [case(0), case(2, s_q=0)] + ([case(2, h_q=0)] if path == "dense" else [])
    for c in empties + [case(3)]:
        with pytest.raises(ValueError, match="tile_scheduler_metadata was built for"):
            run(c, meta)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("path", ["dense", "sparse"])
@pytest.mark.parametrize("bad", [None, "meta", 3])
def test_empty_work_rejects_non_metadata(tier, path, bad):
    """None or any other object as tile_scheduler_metadata is the TypeError of a call with work, for empty work too
    (upstream requires the metadata; it asserts b > 0)."""
    run, case = (_dense, _dense_case) if path == "dense" else (_sparse, _sparse_case)
    for c in (case(0), case(2, s_q=0), case(2)):
        with pytest.raises(TypeError, match=r"tile_scheduler_metadata must come from get_mla_metadata\(\)"):
            run(c, bad)


@pytest.mark.parametrize("tier", TIERS)
def test_empty_work_checks_legacy_tensors(tier):
    """Dense legacy (tile_scheduler_metadata, num_splits) planned for b=2 and replayed at b=0: the num_splits
    ValueError of any other batch mismatch; planned for b=0 (num_splits [1]) it is accepted."""
    sched, ns = dk.get_mla_metadata(torch.tensor([70, 70], dtype=torch.int32), 16, 1)
    with pytest.raises(ValueError, match=r"num_splits must have shape \[b \+ 1\] = \[1\]"):
        _dense(_dense_case(0), sched, ns)
    for c in (_dense_case(0), _dense_case(2)):              # legacy tensor without num_splits: as with work
        with pytest.raises(TypeError, match=r"num_splits must be a torch.Tensor, got NoneType"):
            _dense(c, sched, None)
    s0, n0 = dk.get_mla_metadata(torch.zeros(0, dtype=torch.int32), 16, 1)
    o, l_ = _dense(_dense_case(0), s0, n0)
    assert o.shape == (0, 1, 16, 512) and l_.shape == (0, 16, 1)
    o, l_ = _dense(_dense_case(2, s_q=0), sched, ns)      # s_q = 0 with the batch's own plan: fine
    assert o.shape == (2, 0, 16, 512)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("path", ["dense", "sparse"])
def test_empty_work_leaves_fresh_metadata_fresh(tier, path, monkeypatch):
    """A fresh FlashMLASchedMeta seen first by empty calls stays unfilled (an empty call plans nothing; no scheduler
    launch), so the next call with work fills it with its own configuration (session 16's rule, kept); an empty
    call given num_splits with it is the ValueError of any call."""
    from deepkernels.mla import decode as dd, sparse_decode as sd

    def boom(*a, **k):
        raise AssertionError("scheduler launched for empty work")
    monkeypatch.setattr(dd, "compute_schedule", boom)
    monkeypatch.setattr(sd, "compute_schedule", boom)
    run, case = (_dense, _dense_case) if path == "dense" else (_sparse, _sparse_case)
    meta, _ = dk.get_mla_metadata()
    for c in (case(0), case(2, s_q=0), case(5, s_q=0)):
        o, l_ = run(c, meta)
        assert o.shape[0] == c[0].shape[0] and o.shape[1] == c[0].shape[1] and not meta.have_initialized
    with pytest.raises(ValueError, match="num_splits must be None when tile_scheduler_metadata is a FlashMLASchedMeta"):
        run(case(0), meta, torch.zeros(1, dtype=torch.int32))
    monkeypatch.undo()
    o, l_ = run(case(2), meta)
    assert meta.have_initialized and meta.config.b == 2 and not o.isnan().any()
    run(case(2, s_q=1), meta)


@pytest.mark.compile
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_varlen_guard_kernel_compiles_sm90(dtype):
    """The guard kernel cross-compiles for sm90 (it runs after every CUDA call, whose cu_seqlens_qo is not read on
    the host): no local memory, int64 row offsets."""
    from deepkernels.testing.compile import compile_sm90
    sig = {"out_ptr": f"*{dtype}", "lse_ptr": "*fp32", "cu_q_ptr": "*i32", "B": "i32", "covered": "i32",
           "total_q": "i32", "H": "i32", "stride_ot": "i32", "stride_oh": "i32"}
    c = compile_sm90(dp._dense_prefill_uncovered_kernel, sig, {"DV": 128, "BLOCK_R": 16}, num_warps=4)
    assert not c.uses_local_memory
    assert "mul.wide.s32" in c.ptx or "cvt.s64.s32" in c.ptx        # 64-bit token offsets


# ------------------------------------------------------------------ 5. torch.compile: get_mla_metadata's fake
@pytest.mark.reference
@pytest.mark.parametrize("rows,h_kv,name", [(0, 1, "num_q_tokens_per_head_k"), (16, 0, "num_heads_k"),
                                            (-3, 1, "num_q_tokens_per_head_k")])
def test_get_mla_metadata_op_compiled_bad_ints_named(rows, h_kv, name):
    """``torch.ops.deepkernels.get_mla_metadata`` under torch.compile runs its fake first: a 0 there died with
    ZeroDivisionError inside the SM-part count (wrapped by dynamo, naming no argument). Now the eager op's
    ValueError, naming the argument, in both modes."""
    from deepkernels import ops
    sl = torch.tensor([10, 70], dtype=torch.int32)
    op = ops.get_mla_metadata
    with pytest.raises(ValueError, match=f"{name} must be >= 1"):
        op(sl, rows, h_kv)
    torch._dynamo.reset()
    with pytest.raises(Exception, match=f"{name} must be >= 1") as ei:
        torch.compile(lambda s: op(s, rows, h_kv), fullgraph=True)(sl)
    assert "ZeroDivisionError" not in str(ei.value)


# ------------------------------------------------------------------ 6. boolean flags given as strings
@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("bad", ["False", "no", b"0", [False], torch.tensor([0, 1])])
def test_attention_causal_rejects_non_booleans(tier, bad):
    """``causal="False"`` (a flag read from a config file) was truthy: the call silently ran causal, the opposite
    of what was asked (upstream's pybind bool conversion rejects a str). Now a TypeError naming causal, on
    flash_attn_varlen_func (+ packed forms) and both decode paths; bool, NumPy bool, 0 / 1 and None (False, as
    pybind) still work and mean what they say."""
    q, k, v, cq, ck = _varlen([3, 9], [20, 30])
    with pytest.raises(TypeError, match="causal must be a bool"):
        dk.flash_attn_varlen_func(q, k, v, cq, ck, 9, 30, causal=bad)
    kv = torch.cat([k, v], -1)
    with pytest.raises(TypeError, match="causal must be a bool"):
        flash_attn_varlen_kvpacked_func(q, kv, cq, ck, 9, 30, 128, causal=bad)
    with pytest.raises(TypeError, match="causal must be a bool"):
        dk.flash_mla_with_kvcache(*_dense_case(2, s_q=2), 512, dk.get_mla_metadata()[0], causal=bad)
    qs, kc, ind = _sparse_case(2)
    with pytest.raises(TypeError, match="causal must be a bool"):
        dk.flash_mla_with_kvcache(qs, kc, None, None, 512, dk.get_mla_metadata()[0], is_fp8_kvcache=True,
                                  indices=ind, causal=bad)


@pytest.mark.parametrize("tier", TIERS)
def test_attention_causal_boolean_forms_agree(tier):
    q, k, v, cq, ck = _varlen([3, 9], [20, 30])
    rt = dk.flash_attn_varlen_func(q, k, v, cq, ck, 9, 30, causal=True)
    rf = dk.flash_attn_varlen_func(q, k, v, cq, ck, 9, 30, causal=False)
    assert not torch.equal(rt[0], rf[0])
    for flag, ref in ((np.bool_(True), rt), (1, rt), (np.bool_(False), rf), (0, rf), (None, rf)):
        o, l_ = dk.flash_attn_varlen_func(q, k, v, cq, ck, 9, 30, causal=flag)
        assert torch.equal(o, ref[0]) and torch.equal(l_, ref[1])
    case = _dense_case(2, s_q=2)
    dt = dk.flash_mla_with_kvcache(*case, 512, dk.get_mla_metadata()[0], causal=True)
    for flag in (np.bool_(True), 1):
        o, l_ = dk.flash_mla_with_kvcache(*case, 512, dk.get_mla_metadata()[0], causal=flag)
        assert torch.equal(o, dt[0]) and torch.equal(l_, dt[1])
