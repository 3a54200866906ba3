"""Reference tier: dense MLA decode reference vs float64 loops, schedulers, split-KV + combine, API on CPU."""
import math

import pytest
import torch
from hypothesis import given, strategies as st

import deepkernels as dk
from deepkernels.reference import mla as ref

pytestmark = pytest.mark.reference


def make_case(b, s_q, h_q, h_kv, seqlens, page=64, dtype=torch.bfloat16, d=576, nan_unused=True, device="cpu"):
    """FlashMLA-style inputs: random page permutation, NaN in every KV slot past a sequence's end (and in spare
    pages), 2147480000 in unused block-table slots. Data is generated on ``device``."""
    seqlens = torch.tensor(seqlens, dtype=torch.int32)
    need = [-(-max(int(n), 0) // page) for n in seqlens]
    nb = sum(need) + 2
    width = max(need) + 1
    perm = torch.randperm(nb)
    bt = torch.full((b, width), 2147480000, dtype=torch.int32)
    used = torch.zeros(nb * page, dtype=torch.bool)
    off = 0
    for i in range(b):
        pages = perm[off:off + need[i]]
        off += need[i]
        bt[i, :need[i]] = pages.int()
        tok = torch.arange(need[i] * page)
        flat = pages.long().repeat_interleave(page) * page + tok % page
        used[flat[tok < int(seqlens[i])]] = True
    k = (torch.randn(nb, page, h_kv, d, device=device) / 10).clamp(-1, 1).to(dtype)
    if nan_unused:
        k[~used.reshape(nb, page).to(device)] = float("nan")
    q = (torch.randn(b, s_q, h_q, d, device=device) / 10).clamp(-1, 1).to(dtype)
    return q, k, bt.to(device), seqlens.to(device)


def naive_f64(q, k, bt, seqlens, d_v, scale, causal):
    b, s_q, h_q, d = q.shape
    page, h_kv = k.shape[1], k.shape[2]
    out = torch.zeros(b, s_q, h_q, d_v, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float64)
    for i in range(b):
        n = int(seqlens[i])
        for j in range(s_q):
            lim = n - (s_q - 1 - j) if causal else n
            for h in range(h_q):
                kvh = h // (h_q // h_kv)
                ss = []
                for t in range(max(lim, 0)):
                    kk = k[bt[i, t // page], t % page, kvh].double()
                    ss.append((float(q[i, j, h].double() @ kk) * scale, kk[:d_v]))
                if not ss:
                    continue
                m = max(x for x, _ in ss)
                L = sum(math.exp(x - m) for x, _ in ss)
                out[i, j, h] = sum(math.exp(x - m) / L * v for x, v in ss)
                lse[i, h, j] = m + math.log(L)
    return out, lse


@pytest.mark.parametrize("b,s_q,h_q,h_kv,seqlens,causal,page", [
    (2, 1, 3, 1, [5, 70], False, 64),
    (3, 2, 4, 2, [0, 9, 66], True, 16),
    (1, 3, 2, 1, [2], True, 64),          # rows 0 of s_q see 0 keys -> out 0, lse +inf
])
def test_dense_reference_vs_naive_f64(b, s_q, h_q, h_kv, seqlens, causal, page):
    q, k, bt, sl = make_case(b, s_q, h_q, h_kv, seqlens, page=page, d=576)
    scale = 576 ** -0.5
    o, l = ref.dense_decode(q, k, bt, sl, 512, scale, causal, compute_dtype=torch.float64)
    on, ln = naive_f64(q, k, bt, sl, 512, scale, causal)
    assert not torch.isnan(o).any()
    torch.testing.assert_close(o.double(), on.to(q.dtype).double(), atol=1e-2, rtol=0)
    assert torch.equal(torch.isinf(l), torch.isinf(ln))
    fin = torch.isfinite(ln)
    torch.testing.assert_close(l.double()[fin], ln[fin], atol=1e-5, rtol=0)


def test_flashmla_schedule_worked_examples():
    meta, ns = ref.flashmla_schedule([0, 100, 5000], 6)
    assert ns.tolist() == [0, 1, 2, 8]
    assert meta[0, :4].tolist() == [0, 2, 0, 4]
    assert [int(meta[p, 3] - meta[p, 2]) for p in range(1, 6)] == [17, 17, 17, 17, 7]
    _, ns = ref.flashmla_schedule([2048] * 4, 8)
    assert ns.tolist() == [0, 2, 5, 8, 11]


def _coverage(meta, ns, counts):
    blocks = [ref._blocks(n) for n in counts]
    seen = {}
    for rec in meta.tolist():
        begin, end, bb, eb, bs = rec[:5]
        if begin >= len(counts):
            continue
        for r in range(begin, end + 1):
            s0 = bb if r == begin else 0
            s1 = eb if r == end else blocks[r]
            split = bs if r == begin else 0
            assert 0 <= split < int(ns[r + 1] - ns[r])
            for x in range(s0, s1):
                assert (r, x) not in seen
                seen[(r, x)] = split
    for r, nb in enumerate(blocks):
        if counts[r] > 0:
            assert all((r, x) in seen for x in range(nb)), r
    return seen


@given(st.lists(st.integers(0, 3000), min_size=1, max_size=40), st.integers(1, 40))
def test_schedules_cover_every_block_once(counts, parts):
    for fn in (ref.linear_schedule, ref.flashmla_schedule):
        meta, ns = fn(counts, parts)
        assert ns[0] == 0 and int(ns[-1]) <= len(counts) + parts
        assert torch.all(ns[1:] > ns[:-1])
        _coverage(meta, ns, counts)


def test_linear_schedule_balance():
    counts = [100000] + [64] * 200
    meta, _ = ref.linear_schedule(counts, 132)
    total = sum(ref._blocks(n) + 5 for n in counts)
    W = -(-total // 132)
    for rec in meta.tolist():
        if rec[0] < len(counts) and rec[0] == rec[1]:
            assert rec[3] - rec[2] <= W


@pytest.mark.parametrize("schedule", [ref.linear_schedule, ref.flashmla_schedule])
@pytest.mark.parametrize("parts", [1, 3, 7])
def test_split_partials_and_combine_match_direct(schedule, parts):
    q, k, bt, sl = make_case(3, 2, 4, 1, [0, 300, 130])
    o, l = ref.dense_decode(q, k, bt, sl, 512, None, True)
    o2, l2 = ref.dense_decode_via_splits(q, k, bt, sl, parts, 512, None, True, schedule=schedule)
    torch.testing.assert_close(o2.float(), o.float(), atol=8e-3, rtol=0)
    assert torch.equal(torch.isinf(l), torch.isinf(l2))
    torch.testing.assert_close(l2[torch.isfinite(l)], l[torch.isfinite(l)], atol=1e-5, rtol=0)
    assert (o[0] == 0).all() and torch.isposinf(l[0]).all()


def test_combine_sink_semantics():
    K, s_q, h_q = 3, 1, 4
    o = torch.randn(K, s_q, h_q, 512)
    lse2 = torch.randn(K, s_q, h_q)
    ns = torch.tensor([0, K], dtype=torch.int32)
    base, lse = ref.combine_splits(o, lse2, ns, torch.float32)
    sink = torch.tensor([float("inf"), float("-inf"), 0.0, 1.0])
    out, lse_s = ref.combine_splits(o, lse2, ns, torch.float32, attn_sink=sink)
    torch.testing.assert_close(lse_s, lse)
    assert (out[:, :, 0] == 0).all()
    torch.testing.assert_close(out[:, :, 1], base[:, :, 1])
    f = 1 / (1 + torch.exp(sink[2:] - lse[0, 2:, 0]))
    torch.testing.assert_close(out[0, 0, 2:], base[0, 0, 2:] * f[:, None], atol=1e-5, rtol=1e-5)


def test_api_cpu_reference_and_metadata_contract():
    q, k, bt, sl = make_case(2, 2, 8, 1, [10, 200])
    meta, none = dk.get_mla_metadata()
    assert isinstance(meta, dk.FlashMLASchedMeta) and none is None
    o, l = dk.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, causal=True)
    assert meta.have_initialized and meta.tile_scheduler_metadata.shape[1] == 8
    assert meta.num_splits.shape == (3,)
    assert o.shape == (2, 2, 8, 512) and l.shape == (2, 8, 2) and l.dtype == torch.float32
    o2, l2 = ref.dense_decode(q, k, bt, sl, 512, None, True)
    assert torch.equal(o, o2)
    q3 = q[:1].clone()
    with pytest.raises(ValueError, match="reused"):
        dk.flash_mla_with_kvcache(q3, k, bt[:1], sl[:1], 512, meta, causal=True)
    sched, ns = dk.get_mla_metadata(sl, 2 * 8 // 1, 1)
    assert sched.dtype == torch.int32 and sched.shape[1] == 8 and ns.shape == (3,)
    o3, _ = dk.flash_mla_with_kvcache(q, k, bt, sl, 512, sched, ns, causal=True)
    assert torch.equal(o3, o)


@pytest.mark.parametrize("mutate,exc,match", [
    (lambda a: a.update(head_dim_v=256), ValueError, "head_dim_v"),
    (lambda a: a.update(q=a["q"][..., :512]), ValueError, "576"),
    (lambda a: a.update(q=a["q"].float()), TypeError, "q must have dtype"),
    (lambda a: a.update(cache_seqlens=a["cache_seqlens"].long()), TypeError, "cache_seqlens"),
    (lambda a: a.update(block_table=a["block_table"][:1]), ValueError, "block_table"),
    (lambda a: a.update(k_cache=a["k_cache"][:, :, :, :]. expand(-1, -1, 3, -1)), ValueError, "h_kv"),
    (lambda a: a.update(attn_sink=torch.zeros(4)), ValueError, "attn_sink"),
])
def test_api_validation_errors(mutate, exc, match):
    q, k, bt, sl = make_case(2, 1, 4, 1, [10, 20])
    args = dict(q=q, k_cache=k, block_table=bt, cache_seqlens=sl, head_dim_v=512,
                tile_scheduler_metadata=dk.get_mla_metadata()[0])
    mutate(args)
    with pytest.raises(exc, match=match):
        dk.flash_mla_with_kvcache(**args)


def test_empty_batch():
    q = torch.randn(0, 1, 4, 576).bfloat16()
    k = torch.randn(2, 64, 1, 576).bfloat16()
    o, l = dk.flash_mla_with_kvcache(q, k, torch.zeros(0, 1, dtype=torch.int32), torch.zeros(0, dtype=torch.int32),
                                     512, dk.get_mla_metadata()[0])
    assert o.shape == (0, 1, 4, 512) and l.shape == (0, 4, 1)


def test_legacy_metadata_checked_on_cpu_reference_path():
    """B17 on the CPU path: legacy (tile_scheduler_metadata, num_splits) planned for b=3 replayed with b=4 is
    rejected naming num_splits, exactly as on the kernel path (validation happens once, at the public op)."""
    q, k, bt, s = make_case(4, 1, 16, 1, [10, 70, 0, 5])
    sched, ns = dk.get_mla_metadata(s[:3], 16, 1)
    with pytest.raises(ValueError, match="num_splits"):
        dk.flash_mla_with_kvcache(q, k, bt, s, 512, sched, ns)
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):
        dk.flash_mla_with_kvcache(q, k, bt, s, 512, sched[:, :4].contiguous(), dk.get_mla_metadata(s, 16, 1)[1])
    with pytest.raises(TypeError, match="num_splits"):
        dk.flash_mla_with_kvcache(q, k, bt, s, 512, sched, ns.long())


def test_cached_signature_still_checks_call_state():
    """A signature that passed once is not re-validated, but the checks that do not depend on it still run on every
    call: softmax_scale, num_splits with a FlashMLASchedMeta, a reused schedule's config; a new signature (same
    shapes, 4-byte misaligned view) is validated in full."""
    import deepkernels.mla.decode as dec
    q, k, bt, s = make_case(2, 2, 8, 1, [10, 200])
    meta, _ = dk.get_mla_metadata()
    o1, _ = dk.flash_mla_with_kvcache(q, k, bt, s, 512, meta, causal=True)
    o2, _ = dk.flash_mla_with_kvcache(q, k, bt, s, 512, meta, causal=True)     # cached plan
    assert torch.equal(o1, o2) and len(dec._PLANS) >= 1
    with pytest.raises(ValueError, match="softmax_scale"):
        dk.flash_mla_with_kvcache(q, k, bt, s, 512, meta, softmax_scale=float("nan"), causal=True)
    with pytest.raises(ValueError, match="num_splits must be None"):
        dk.flash_mla_with_kvcache(q, k, bt, s, 512, meta, meta.num_splits, causal=True)
    with pytest.raises(ValueError, match="reused"):
        dk.flash_mla_with_kvcache(q, k, bt, s, 512, meta, causal=False)
    sched, ns = dk.get_mla_metadata(s, 16, 1)
    dk.flash_mla_with_kvcache(q, k, bt, s, 512, sched, ns, causal=True)
    bad = torch.zeros(ns.numel() + 1, dtype=torch.int32)[1:]                    # misaligned view, same shape
    bad.copy_(ns)
    o3, _ = dk.flash_mla_with_kvcache(q, k, bt, s, 512, sched, bad, causal=True)
    assert torch.equal(o3, o1)
    with pytest.raises(ValueError, match="num_splits"):
        dk.flash_mla_with_kvcache(q, k, bt, s, 512, sched, torch.zeros(ns.numel() + 1, dtype=torch.int32)[:2],
                                  causal=True)


class _FakeCompiled:
    function, packed_metadata = "fn-handle", "packed"

    def __init__(self, log, name):
        self.log, self.name = log, name

    def run(self, *args):
        self.log.append((self.name, "fast"))


class _FakeJit:
    """Stand-in JITFunction with the real kernel's params: fn[grid](*args, **meta) records and returns a compiled
    kernel whose run() records a fast launch."""

    def __init__(self, real, log, name):
        self.params, self.log, self.name = real.params, log, name
        self.compiled = _FakeCompiled(log, name)

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.log.append((self.name, "slow"))
            return self.compiled
        return launch


def test_public_op_launches_take_the_fast_path_on_a_repeated_signature(monkeypatch):
    """Second call with the same signature: the split-KV kernel and the combine go through the bound
    KernelLauncher (direct CompiledKernel.run), keyed stably by the cached call plan; a new FlashMLASchedMeta per
    step recomputes the schedule. (No device: kernels and binding are stand-ins.)"""
    import deepkernels._launch as launch
    import deepkernels.mla._dense_decode_kernels as ddk
    import deepkernels.mla.combine as comb
    import deepkernels.mla.decode as dec
    log = []
    monkeypatch.setattr(ddk, "_mla_decode_fwd_kernel", _FakeJit(ddk._mla_decode_fwd_kernel, log, "decode"))
    monkeypatch.setattr(comb, "_mla_decode_combine_kernel", _FakeJit(comb._mla_decode_combine_kernel, log, "combine"))
    monkeypatch.setitem(comb._FAST, "on", False)   # the stand-in replaces the current (not the fast) combine
    monkeypatch.setattr(launch, "_bindable", lambda args: True)
    monkeypatch.setattr(launch, "_current_device", lambda: 0)
    monkeypatch.setattr(launch, "_stream_getter", lambda: (lambda dev: 0))
    monkeypatch.setattr(dec, "use_kernels", lambda *t: True)
    monkeypatch.setattr(dec, "_PLANS", {})          # plans made under the patch (kernels=True on CPU) are dropped
    q, k, bt, s = make_case(2, 1, 16, 1, [10, 200])
    for _ in range(3):
        meta, _ = dk.get_mla_metadata()
        dk.flash_mla_with_kvcache(q, k, bt, s, 512, meta)
    assert log == [("decode", "slow"), ("combine", "slow")] + [("decode", "fast"), ("combine", "fast")] * 2
