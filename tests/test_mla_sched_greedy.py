"""The device port of FlashMLA's greedy split-KV scheduler (``compute_schedule(..., algorithm="greedy")``).

Tiers: reference (CPU path = the host port), interpret (the Triton kernel under TRITON_INTERPRET=1 against
``reference.mla.flashmla_schedule`` on random and adversarial token counts), compile (sm90 cross-compile: one warp,
no local memory / spills, warp reductions by ``redux.sync``, no block barriers), gpu (the same comparisons on CUDA
with poisoned outputs, no host sync, CUDA-graph capture + replay with changed counts, and dense / sparse decode
through the public ``flash_mla_with_kvcache`` under the greedy schedule within FlashMLA's tolerances).
"""
import functools
import re

import pytest
import torch

from deepkernels.mla import metadata as md
from deepkernels.reference.mla import flashmla_schedule, linear_schedule

I32MAX = 2 ** 31 - 1


@pytest.fixture
def poison():
    md._POISON_OUTPUTS = True
    yield
    md._POISON_OUTPUTS = False


def _check(counts, parts, fo=5, device="cpu"):
    c = torch.as_tensor(counts, dtype=torch.int32) if not torch.is_tensor(counts) else counts.to(torch.int32)
    meta, ns = md.compute_schedule(c.to(device), parts, fo, algorithm="greedy")
    m_ref, ns_ref = flashmla_schedule(c.cpu(), parts, fo)
    assert meta.shape == (parts, 8) and ns.shape == (c.numel() + 1,)
    assert meta.dtype == torch.int32 and ns.dtype == torch.int32 and meta.device == c.to(device).device
    meta, ns = meta.cpu(), ns.cpu()
    if not torch.equal(meta, m_ref):
        bad = (meta != m_ref).any(1).nonzero()[:4, 0]
        raise AssertionError(f"meta differs (b={c.numel()} parts={parts} fo={fo}) at parts {bad.tolist()}: "
                             f"{meta[bad].tolist()} vs {m_ref[bad].tolist()}")
    if not torch.equal(ns, ns_ref):
        bad = (ns != ns_ref).nonzero()[:4, 0]
        raise AssertionError(f"num_splits differs (b={c.numel()} parts={parts} fo={fo}) at {bad.tolist()}: "
                             f"{ns[bad].tolist()} vs {ns_ref[bad].tolist()}")


def _random_counts(g, b):
    kind = int(torch.randint(0, 5, (1,), generator=g))
    if kind == 0:       # dense-like, wide spread
        c = torch.randint(0, 20000, (b,), generator=g)
    elif kind == 1:     # sparse-like: topk 2048 with some shorter rows
        c = torch.full((b,), 2048)
        c[torch.rand(b, generator=g) < 0.3] = int(torch.randint(0, 2048, (1,), generator=g))
    elif kind == 2:     # log-normal lengths, 1 .. ~1M
        c = torch.exp(torch.randn(b, generator=g) * 2.5 + 7).clamp(max=2 ** 20)
    elif kind == 3:     # short rows (cost spacing at its minimum)
        c = torch.randint(0, 130, (b,), generator=g)
    else:               # near int32 max
        c = I32MAX - torch.randint(0, 200, (b,), generator=g)
    c = c.to(torch.int64)
    c[torch.rand(b, generator=g) < 0.15] = 0
    c[torch.rand(b, generator=g) < 0.05] = -int(torch.randint(1, 2 ** 31, (1,), generator=g))
    return c.clamp(-2 ** 31, I32MAX).to(torch.int32)


def _random_cases(n, seed, max_b=300, max_parts=264):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        b = int(torch.randint(1, max_b + 1, (1,), generator=g))
        parts = int(torch.randint(1, max_parts + 1, (1,), generator=g))
        fo = (5, 5, 0, 1, 16)[i % 5]
        out.append((_random_counts(g, b), parts, fo))
    return out


def _adversarial_cases():
    eq = lambda n, b: [n] * b          # noqa: E731
    cases = [
        # spec/mla.md §3.3 worked examples
        (eq(2048, 4), 8, 5), ([0, 100, 5000], 6, 5),
        # b = 1, zero / negative / huge counts, b < parts
        ([0], 1, 5), ([0], 132, 5), ([1], 264, 5), ([I32MAX], 1, 5), ([I32MAX], 264, 5), ([-7], 3, 5),
        ([-2 ** 31, 0, -1, 5], 7, 5), ([3, 0, 70, 0], 132, 5), (eq(0, 40), 66, 5), (eq(0, 40), 3, 0),
        # all-equal sparse rows: one request per part (the V3.2 b 64 bench row), the window edge (diff = fo),
        # just past it (diff = fo + 1: split), y exactly on a boundary (diff = 0), uneven parts
        (eq(2048, 64), 66, 5), (eq(2048, 64), 74, 5), (eq(2048, 64), 73, 5), (eq(2048, 64), 77, 5),
        (eq(2048, 64), 64, 5), (eq(2048, 128), 66, 5), (eq(2048, 128), 132, 5), (eq(2560, 64), 66, 5),
        (eq(2048, 64), 1, 5), (eq(2048, 64), 2, 5), (eq(4096, 64), 66, 0), (eq(64, 100), 7, 1),
        # cost-line spacing at its minimum (fo + 1) with fo = 0 and big fo
        (eq(1, 200), 13, 0), (eq(1, 200), 264, 0), (eq(64, 90), 33, 1 << 20), ([5, 9000, 5], 2, 1 << 20),
        # huge counts: positions past int32 (b * 2^25 blocks), blocks at the 64-token edge
        (eq(I32MAX, 3), 5, 5), (eq(I32MAX, 100), 132, 5), (eq(I32MAX, 200), 33, 5),
        ([I32MAX, 0, I32MAX, 1, I32MAX - 64, 2 ** 31 - 65, 2 ** 30], 264, 5), ([I32MAX, 2 ** 30, 7, I32MAX], 2, 5),
    ]
    # every window edge of the 32-request windows and the 3-window prefetch queue
    g = torch.Generator().manual_seed(1234)
    for b in (31, 32, 33, 63, 64, 65, 95, 96, 97, 127, 128, 129, 160, 161):
        for parts in (7, 66, 132):
            cases.append((_random_counts(g, b), parts, 5))
    return cases


ADVERSARIAL = _adversarial_cases()


# ------------------------------------------------------------------ reference tier (no kernels: the host port)
def test_cpu_path_is_the_reference():
    if md.use_kernels(torch.zeros(1, dtype=torch.int32)):
        pytest.skip("kernels run on CPU tensors here (interpreter): covered by the interpret tier")
    for counts, parts, fo in ADVERSARIAL[:12] + _random_cases(20, 7):
        _check(counts, parts, fo)


def test_argument_errors():
    c = torch.tensor([5, 6], dtype=torch.int32)
    with pytest.raises(ValueError, match="algorithm"):
        md.compute_schedule(c, 4, algorithm="fancy")
    with pytest.raises(ValueError, match="fixed_overhead"):
        md.compute_schedule(c, 4, -1, algorithm="greedy")
    with pytest.raises(ValueError, match="fixed_overhead"):
        md.compute_schedule(c, 4, (1 << 20) + 1, algorithm="greedy")
    with pytest.raises(ValueError, match="num_sm_parts"):
        md.compute_schedule(c, 0, algorithm="greedy")
    with pytest.raises(TypeError):
        md.compute_schedule(c.long(), 4, algorithm="greedy")
    meta, ns = md.compute_schedule(torch.zeros(0, dtype=torch.int32), 3, algorithm="greedy")
    m_ref, ns_ref = flashmla_schedule([], 3)
    assert torch.equal(meta, m_ref) and torch.equal(ns, ns_ref)


# ------------------------------------------------------------------ interpreter tier
@pytest.mark.interpret
@pytest.mark.parametrize("i", range(len(ADVERSARIAL)))
def test_interpret_adversarial(i):
    counts, parts, fo = ADVERSARIAL[i]
    _check(counts, parts, fo)


@pytest.mark.interpret
def test_interpret_random():
    for counts, parts, fo in _random_cases(25, 2026):
        _check(counts, parts, fo)


@pytest.mark.interpret
def test_interpret_parts_sweep():
    g = torch.Generator().manual_seed(99)
    for parts in (1, 2, 31, 32, 33, 65, 66, 127, 132, 133, 263, 264):     # PARTS_SWEEP's edges (interpreter time)
        _check(torch.full((64,), 2048, dtype=torch.int32), parts)
        _check(_random_counts(g, 45), parts)


@pytest.mark.interpret
def test_interpret_large_batches():
    g = torch.Generator().manual_seed(5)
    _check(torch.full((8192,), 2048, dtype=torch.int32), 132)
    _check(torch.randint(0, 100000, (8192,), generator=g, dtype=torch.int32), 66)
    _check(torch.randint(0, 3000, (70000,), generator=g, dtype=torch.int32), 264)


@pytest.mark.interpret
def test_interpret_linear_default_unchanged():
    c = torch.randint(0, 5000, (77,), dtype=torch.int32)
    m, n = md.compute_schedule(c, 33)
    m2, n2 = md.compute_schedule(c, 33, algorithm="linear")
    m3, n3 = linear_schedule(c, 33)
    assert torch.equal(m, m3) and torch.equal(n, n3) and torch.equal(m2, m3) and torch.equal(n2, n3)


# ------------------------------------------------------------------ compile tier
@pytest.mark.compile
def test_compile_greedy_kernel():
    from deepkernels.testing.compile import compile_sm90, ptxas_sm90_or_skip
    c = compile_sm90(md._mla_sched_greedy_kernel,
                     dict(counts_ptr="*i32", meta_ptr="*i32", nsplits_ptr="*i32", b="i32", num_parts="i32"),
                     dict(OVERHEAD=5, SBLOCK=64, W=md._GW, TW=md._GT), num_warps=1)
    assert not c.uses_local_memory
    assert "bar.sync" not in c.ptx and "barrier.sync" not in c.ptx, "one warp: no block barriers"
    assert len(re.findall(r"redux\.sync", c.ptx)) >= 3, "the per-part reductions should be single redux.sync ops"
    rep = ptxas_sm90_or_skip(c.ptx)
    assert re.search(r"0 bytes spill stores, 0 bytes spill loads", rep.log), rep.log


# ------------------------------------------------------------------ GPU tier
@pytest.mark.gpu
def test_gpu_adversarial_and_random(poison):
    for counts, parts, fo in ADVERSARIAL + _random_cases(400, 11) + _random_cases(100, 12, max_b=3000):
        _check(counts, parts, fo, "cuda")


@pytest.mark.gpu
def test_gpu_parts_1_to_264(poison):
    g = torch.Generator().manual_seed(3)
    sparse = torch.full((128,), 2048, dtype=torch.int32)
    mixed = _random_counts(g, 100)
    for parts in range(1, 265):
        _check(sparse, parts, device="cuda")
        _check(mixed, parts, device="cuda")


@pytest.mark.gpu
def test_gpu_large_batches(poison):
    g = torch.Generator().manual_seed(4)
    for b in (1024, 8192, 70000):
        for parts in (1, 33, 132, 264):
            _check(torch.randint(-10, 100000, (b,), generator=g, dtype=torch.int32), parts, device="cuda")
        _check(torch.full((b,), 2048, dtype=torch.int32), 132, device="cuda")
        _check(torch.full((b,), I32MAX, dtype=torch.int32), 66, device="cuda")


@pytest.mark.gpu
def test_gpu_no_host_sync_and_cuda_graph_replay_with_new_counts():
    b, parts = 96, 66
    g = torch.Generator().manual_seed(8)
    counts = _random_counts(g, b).cuda()
    md.compute_schedule(counts, parts, algorithm="greedy")          # compile / bind the launcher
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        md.compute_schedule(counts, parts, algorithm="greedy")
    finally:
        torch.cuda.set_sync_debug_mode("default")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        md.compute_schedule(counts, parts, algorithm="greedy")
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        meta, ns = md.compute_schedule(counts, parts, algorithm="greedy")
    for it in range(6):
        new = _random_counts(g, b) if it else torch.full((b,), 2048, dtype=torch.int32)
        counts.copy_(new.cuda())
        meta.fill_(-1)
        ns.fill_(-1)
        graph.replay()
        torch.cuda.synchronize()
        m_ref, ns_ref = flashmla_schedule(new, parts)
        assert torch.equal(meta.cpu(), m_ref) and torch.equal(ns.cpu(), ns_ref)


@pytest.mark.gpu
def test_gpu_linear_default_unchanged():
    g = torch.Generator().manual_seed(9)
    for b, parts in ((1, 1), (64, 66), (128, 132), (1000, 33)):
        c = _random_counts(g, b).clamp(max=2 ** 20)
        m, n = md.compute_schedule(c.cuda(), parts)
        m2, n2 = linear_schedule(c, parts)
        assert torch.equal(m.cpu(), m2) and torch.equal(n.cpu(), n2)


def _use_greedy(monkeypatch):
    """Both decode paths' schedules through the greedy kernel (the way benchmarks/mla_sched_sweep.py patches them)."""
    import deepkernels.mla.decode as dec
    import deepkernels.mla.sparse_decode as sdec
    greedy = functools.partial(md.compute_schedule, algorithm="greedy")
    monkeypatch.setattr(dec, "compute_schedule", greedy)
    monkeypatch.setattr(sdec, "compute_schedule", greedy)


@pytest.mark.gpu
@pytest.mark.parametrize("b,s_q,h_q,s_k,varlen", [(64, 1, 128, 4096, False), (37, 2, 128, 3000, True),
                                                   (128, 1, 64, 1500, True), (3, 1, 16, 20000, False)])
def test_gpu_dense_decode_under_greedy(b, s_q, h_q, s_k, varlen, monkeypatch):
    import deepkernels as dk
    import deepkernels.mla.decode as dec
    from deepkernels.reference import mla as ref
    from deepkernels.testing.numerics import check_is_allclose
    from test_mla_decode_reference import make_case
    sl = (torch.clamp(torch.normal(float(s_k), s_k / 2, (b,)), min=s_q).int() if varlen
          else torch.full((b,), s_k, dtype=torch.int32))
    if varlen:
        sl[::7] = 0
    q, k, bt, sl = make_case(b, s_q, h_q, 1, sl.tolist(), device="cuda")
    meta_lin = dk.get_mla_metadata()[0]
    o_lin, l_lin = dk.flash_mla_with_kvcache(q, k, bt, sl, 512, meta_lin, causal=s_q > 1)
    _use_greedy(monkeypatch)
    monkeypatch.setattr(dec, "_POISON_OUTPUTS", True)
    meta = dk.get_mla_metadata()[0]
    o, l_ = dk.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=s_q > 1)
    parts = meta.tile_scheduler_metadata.shape[0]
    m_ref, ns_ref = flashmla_schedule(sl.cpu(), parts)
    assert torch.equal(meta.tile_scheduler_metadata.cpu(), m_ref) and torch.equal(meta.num_splits.cpu(), ns_ref)
    o_ref, l_ref = ref.dense_decode(q, k, bt, sl, 512, None, s_q > 1)
    assert not torch.isnan(o).any() and not torch.isnan(l_).any()
    assert check_is_allclose("out", o, o_ref, 8e-4, 2.01 / 128, 5e-6)
    assert check_is_allclose("lse", l_, l_ref, 1e-6, 8.01 / 65536)
    assert check_is_allclose("out vs linear schedule", o, o_lin, 8e-4, 2.01 / 128, 5e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt,b,s_q,with_len", [("v32", None, 64, 1, False), ("v41", None, 128, 2, True),
                                                      ("v41", "fp4", 64, 1, True), ("v32", None, 74, 3, True)])
def test_gpu_sparse_decode_under_greedy(fmt, xfmt, b, s_q, with_len, monkeypatch):
    import deepkernels as dk
    import deepkernels.mla.sparse_decode as sdec
    from deepkernels.testing.numerics import check_is_allclose
    from test_mla_sparse_reference import TOL_LSE, TOL_OUT, _public, make_case, ref_call
    x = dict(xfmt=xfmt, xtopk=512, xpage=64) if xfmt else {}
    kw = make_case(b, s_q, 128, fmt, 2048, 4096, 64, with_len=with_len, with_xlen=xfmt is not None, sink=True,
                   device="cuda", **x)
    o_lin, l_lin = _public(kw)
    _use_greedy(monkeypatch)
    monkeypatch.setattr(sdec, "_POISON_OUTPUTS", True)
    meta = dk.get_mla_metadata()[0]
    o, l_ = _public(kw, meta)
    assert meta.tile_scheduler_metadata.shape[1] == 8
    ro, rl = ref_call(kw, out_dtype=torch.float32)
    assert not torch.isnan(o).any() and not torch.isnan(l_).any()
    assert check_is_allclose("out", o.float().cpu(), ro.float().cpu(), **TOL_OUT)
    assert check_is_allclose("lse", l_.cpu(), rl.cpu(), **TOL_LSE)
    assert check_is_allclose("out vs linear schedule", o.float().cpu(), o_lin.float().cpu(), **TOL_OUT)
    m = meta.tile_scheduler_metadata.cpu()
    if fmt == "v32" and not with_len and b * 37 // m.shape[0] >= 32:
        # equal top-k rows (32 blocks + 5 each) and a step of >= 32 blocks: FlashMLA's greedy fill gives one whole
        # request per part, a schedule the linear one never makes (no split, nothing to combine)
        used = m[:, 0] < b
        assert (m[used, 0] == m[used, 1]).all() and (m[used, 5] == 0).all() and (m[used, 6] == 0).all()
