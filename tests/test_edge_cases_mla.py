"""Edge cases of shared/cases/edge-cases.md for MLA (dense decode, sparse decode, sparse prefill, dense prefill).

Each test is named after the row id it covers (``test_B06_...``) or generalises (``test_B01_kind_...``).
Tiers: ``reference`` runs the public op on CPU tensors (the PyTorch reference) and checks it against an
independent float64 computation written here; ``interpret`` drives the real Triton kernels through the
interpreter and checks them against :mod:`deepkernels.reference`; ``gpu`` holds the production-size variants.
Every KV slot that must not be read holds NaN (``make_case`` of the sibling test modules does that).
"""
import math

import pytest
import torch

import deepkernels as dk
import deepkernels.mla.decode as dec
from deepkernels.reference import mla as ref
from deepkernels.reference.mla_prefill import dense_prefill_ref, sparse_prefill_ref
from deepkernels.testing.numerics import check_is_allclose

from test_mla_decode_reference import make_case

REF = pytest.param("reference", marks=pytest.mark.reference)
INT = pytest.param("interpret", marks=pytest.mark.interpret)
TIERS = [REF, INT]

# FlashMLA tolerances (dense decode); the interpreter tier runs fp16 inputs like tests/test_mla_decode_kernels.py
TOL = {"reference": ((8e-4, 2.01 / 128, 5e-6), (1e-6, 8.01 / 65536)),
       "interpret": ((2e-3, 2.01 / 128, 5e-5), (1e-5, 8.01 / 65536))}
DTYPE = {"reference": torch.bfloat16, "interpret": torch.float16, "gpu": torch.bfloat16}


class _Launched(BaseException):
    """Raised by a stand-in kernel: derives from BaseException so ``pytest.raises(ValueError)`` cannot swallow it."""


class _Boom:
    def __getitem__(self, grid):
        raise _Launched(f"a kernel was launched (grid {grid}) before the argument check")

    def __getattr__(self, name):
        raise _Launched(f"a kernel was touched ({name}) before the argument check")


@pytest.fixture
def no_launch(monkeypatch):
    """Replace every MLA kernel by a stand-in that fails the test if it is launched."""
    patch_no_launch(monkeypatch)


def patch_no_launch(monkeypatch):
    import deepkernels.mla._dense_decode_kernels as ddk
    import deepkernels.mla.combine as comb
    import deepkernels.mla.dense_prefill as dp
    import deepkernels.mla.metadata as md
    import deepkernels.mla.prefill as pf
    monkeypatch.setattr(ddk, "_mla_decode_fwd_kernel", _Boom())
    monkeypatch.setattr(comb, "_mla_decode_combine_kernel", _Boom())
    monkeypatch.setattr(comb, "_mla_decode_combine_fast_kernel", _Boom())
    monkeypatch.setattr(md, "_mla_sched_metadata_kernel", _Boom())
    monkeypatch.setattr(pf, "_sparse_prefill_fwd_kernel", _Boom())
    monkeypatch.setattr(dp, "_dense_prefill_fwd_kernel", _Boom())
    try:
        import deepkernels.mla._sparse_kernels as sk
        monkeypatch.setattr(sk, "_sparse_decode_fwd_kernel", _Boom())
        monkeypatch.setattr(sk, "_sparse_decode_combine_kernel", _Boom())
    except (ImportError, AttributeError):
        pass


@pytest.fixture
def poison():
    dec._POISON_OUTPUTS = True
    yield
    dec._POISON_OUTPUTS = False


# ------------------------------------------------------------------ independent float64 dense decode
def naive_decode(q, k, bt, sl, causal, scale=None, d_v=512):
    """Per request: gather the first ``seqlen`` KV rows through the block table, float64 softmax. Rows with no key:
    out 0, lse +inf. Returns (out [b, s_q, h_q, d_v] fp64, lse [b, h_q, s_q] fp64)."""
    b, s_q, h_q, d = q.shape
    page, h_kv = k.shape[1], k.shape[2]
    scale = d ** -0.5 if scale is None else scale
    out = torch.zeros(b, s_q, h_q, d_v, dtype=torch.float64)
    lse = torch.full((b, h_q, s_q), math.inf, dtype=torch.float64)
    g = h_q // h_kv
    for i in range(b):
        n = max(int(sl[i]), 0)
        if n == 0:
            continue
        pages = bt[i, :-(-n // page)].long().cpu()
        kk = k.cpu()[pages].reshape(-1, h_kv, d)[:n].double()                   # [n, h_kv, d]
        qi = q[i].cpu().double().reshape(s_q, h_kv, g, d)
        s = torch.einsum("skgd,nkd->skgn", qi, kk).reshape(s_q, h_q, n) * scale
        if causal:
            lim = n - (s_q - 1 - torch.arange(s_q))                              # keys < lim are visible
            s = s.masked_fill(torch.arange(n)[None, None, :] >= lim[:, None, None], -math.inf)
        l_ = torch.logsumexp(s, -1)                                              # [s_q, h_q]
        empty = torch.isneginf(l_)
        p = torch.exp(s - torch.where(empty, 0.0, l_)[..., None]).reshape(s_q, h_kv, g, n)
        o = torch.einsum("skgn,nkd->skgd", p, kk[..., :d_v]).reshape(s_q, h_q, d_v)
        out[i] = torch.where(empty[..., None], 0.0, o)
        lse[i] = torch.where(empty, math.inf, l_).T
    return out, lse


def decode_and_check(tier, q, k, bt, sl, causal, scale=None, meta=None):
    meta = meta if meta is not None else dk.get_mla_metadata()[0]
    o, l_ = dk.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, softmax_scale=scale, causal=causal)
    b, s_q, h_q, _ = q.shape
    assert o.shape == (b, s_q, h_q, 512) and l_.shape == (b, h_q, s_q)
    assert not torch.isnan(o).any() and not torch.isnan(l_).any()
    if tier == "reference":
        ro, rl = naive_decode(q, k, bt, sl, causal, scale)
    else:
        ro, rl = ref.dense_decode(q, k, bt, sl, 512, scale, causal)
    # the reference tier run under TRITON_INTERPRET=1 executes the interpreted kernels (their P rounding), so it
    # takes the interpreter's tolerances
    from deepkernels._backend import interpret_mode
    (ta, tr, tc), (la, lr) = TOL["interpret" if tier == "interpret" or interpret_mode() else "reference"]
    assert check_is_allclose("out", o.float().cpu(), ro.float().cpu(), ta, tr, tc)
    assert check_is_allclose("lse", l_.float().cpu(), rl.float().cpu(), la, lr)
    return o, l_, meta


# ================================================================== kind 3: tile tails, head counts
@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("h_q", [8, 16, 32, 64, 128])
def test_B06_heads_below_tile_and_graph_batch_9(tier, h_q, poison):
    """TP16 (8 heads, fewer than the 64-row tile) and a CUDA-graph batch of 9: every head count gives the
    reference result (sglang #5516)."""
    if tier == "interpret" and h_q not in (8, 64):
        pytest.skip("interpreter: h_q 8 (below every tile) and 64 (one full tile) cover the tile edges")
    sl = torch.randint(1, 140 if tier == "reference" else 70, (9,)).tolist()
    sl[3] = 64
    q, k, bt, s = make_case(9, 1, h_q, 1, sl, dtype=DTYPE[tier])
    decode_and_check(tier, q, k, bt, s, False)


@pytest.mark.gpu
@pytest.mark.parametrize("h_q", [8, 16, 32, 64, 128])
@pytest.mark.parametrize("b", [9, 64])
def test_B06_heads_and_batch_gpu(h_q, b, poison):
    sl = torch.randint(1, 4096, (b,)).tolist()
    q, k, bt, s = make_case(b, 1, h_q, 1, sl, device="cuda")
    decode_and_check("gpu", q, k, bt, s, False)


@pytest.mark.reference
def test_B06_kind_sparse_ops_reject_heads_below_tile(no_launch):
    """Head counts the sparse kernels have no tile for are rejected before launch, naming q."""
    from test_mla_prefill import make_case as sp_case
    q, kv, ind, _, _ = sp_case(2, 30, 32, h_q=16)
    with pytest.raises(ValueError, match="q"):
        dk.flash_mla_sparse_fwd(q[:, :8], kv, ind, 0.5)
    from test_mla_sparse_reference import make_case as sd_case
    kw = sd_case(1, 1, 16, "v41", 64, 80, 64)
    with pytest.raises(ValueError, match="q"):
        dk.flash_mla_with_kvcache(kw["q"][:, :, :8], kw["k_cache"], None, None, 512, dk.get_mla_metadata()[0],
                                  is_fp8_kvcache=True, indices=kw["indices"])


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("h_q", [16, 64])
def test_B14_kv_lengths_across_tiles(tier, h_q, poison):
    """K and V tiles cover the same rows: lengths 1, tile-1, tile, tile+1 of BLOCK_N (32 / 64) and of the 64-token
    page, and 300 (ik_llama.cpp PR #2031)."""
    sl = [1, 31, 32, 33, 63, 64, 65, 300] if h_q == 16 else [1, 63, 64, 65, 300]
    q, k, bt, s = make_case(len(sl), 1, h_q, 1, sl, dtype=DTYPE[tier])
    decode_and_check(tier, q, k, bt, s, False)


@pytest.mark.parametrize("tier", TIERS)
def test_B14_kind_sparse_prefill_topk_tails(tier):
    """Same mechanism in sparse prefill: topk_length at 1, 63, 64, 65 and 300 (BLOCK_N 64)."""
    from test_mla_prefill import make_case as sp_case
    q, kv, ind, _, _ = sp_case(5, 400, 300, h_q=16)
    tl_ = torch.tensor([1, 63, 64, 65, 300], dtype=torch.int32)
    out, ml, lse = dk.flash_mla_sparse_fwd(q, kv, ind, 0.3, topk_length=tl_)
    ro, rml, rlse = _naive_sparse_prefill(q, kv, ind, 0.3, tl_) if tier == "reference" else \
        sparse_prefill_ref(q, kv, ind, 0.3, topk_length=tl_)
    _check_sparse_prefill(out, ml, lse, ro, rml, rlse)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("page", [1, 3, 16, 128])
def test_B22_kind_dense_decode_page_sizes(tier, page, poison):
    """The page size is read from the cache tensor: 1, a non-power of two, 16 and 128 all match."""
    sl = [1, 70, 129] if page > 1 else [1, 9, 20]
    q, k, bt, s = make_case(3, 2, 16, 1, sl, page=page, dtype=DTYPE[tier])
    decode_and_check(tier, q, k, bt, s, True)


# ================================================================== kind 5: metadata vs launch
@pytest.mark.parametrize("tier", TIERS)
def test_B11_gqa_heads_long_query_causal(tier, poison):
    """b=1, h_q=16, h_kv=8 (2 query heads per KV head), long causal query (FlashMLA #28): scheduled correctly,
    through both metadata forms."""
    s_q, n = (384, 256) if tier == "reference" else (16, 40)      # s_q 1024 in the gpu tier
    q, k, bt, s = make_case(1, s_q, 16, 8, [n], dtype=DTYPE[tier])
    decode_and_check(tier, q, k, bt, s, True)
    sched, ns = dk.get_mla_metadata(s, s_q * 16 // 8, 8)
    o, l_ = dk.flash_mla_with_kvcache(q, k, bt, s, 512, sched, ns, causal=True)
    o2, l2 = dk.flash_mla_with_kvcache(q, k, bt, s, 512, dk.get_mla_metadata()[0], causal=True)
    assert check_is_allclose("out", o.float(), o2.float(), *TOL[tier][0])
    assert check_is_allclose("lse", l_, l2, *TOL[tier][1])


@pytest.mark.gpu
def test_B11_gqa_heads_long_query_causal_gpu(poison):
    q, k, bt, s = make_case(1, 1024, 16, 8, [256], device="cuda")
    decode_and_check("gpu", q, k, bt, s, True)


@pytest.mark.parametrize("tier", TIERS)
def test_B12_head_counts_come_from_q(tier, poison):
    """sglang #5154: the caller passed num_kv_heads=16 instead of 1. The current metadata API derives the heads from
    q and rejects reuse with other head counts; a legacy schedule planned with the wrong head count still gives the
    reference result (it only changes how the work is split)."""
    q, k, bt, s = make_case(2, 1, 16, 1, [70, 200], dtype=DTYPE[tier])
    o, l_, meta = decode_and_check(tier, q, k, bt, s, False)
    k16 = k.expand(-1, -1, 16, -1)                    # same cache seen as 16 KV heads
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):
        dk.flash_mla_with_kvcache(q, k16, bt, s, 512, meta)
    sched, ns = dk.get_mla_metadata(s, 1 * 16 // 16, 16)          # the caller's wrong num_heads_k
    o2, l2 = dk.flash_mla_with_kvcache(q, k, bt, s, 512, sched, ns)
    assert check_is_allclose("out", o2.float(), o.float(), *TOL[tier][0])
    assert check_is_allclose("lse", l2, l_, *TOL[tier][1])


@pytest.mark.parametrize("tier", [
    REF, INT])
def test_B17_kind_dense_decode_stale_metadata_rejected(tier, monkeypatch):
    """Legacy metadata planned for a batch of 3 and replayed with 4 requests (the B07/B17 mechanism in the dense
    path): rejected before launch, naming the argument, on every backend."""
    q, k, bt, s = make_case(4, 1, 16, 1, [10, 70, 0, 5], dtype=DTYPE[tier])
    sched, ns = dk.get_mla_metadata(s[:3], 16, 1)
    patch_no_launch(monkeypatch)
    meta = dk.get_mla_metadata()[0]
    meta.have_initialized, meta.config = True, dec.FlashMLASchedMeta.Config(3, 1, 16, 64, 1, False, False, None,
                                                                          None, None)
    with pytest.raises(ValueError, match="tile_scheduler_metadata"):
        dk.flash_mla_with_kvcache(q, k, bt, s, 512, meta)
    with pytest.raises(ValueError, match="num_splits"):
        dk.flash_mla_with_kvcache(q, k, bt, s, 512, sched, ns)


# ================================================================== kind 6: launch geometry
class _Recorder:
    def __init__(self, log, name):
        self.log, self.name = log, name

    def __getitem__(self, grid):
        self.log.append((self.name, tuple(grid)))
        return lambda *a, **kw: None


def _check_grids(log):
    assert log
    for name, grid in log:
        assert 1 <= len(grid) <= 3, (name, grid)
        assert grid[0] < 2 ** 31, (name, grid)
        assert all(g <= 65535 for g in grid[1:]), f"{name}: a count above 65,535 on grid axis y/z: {grid}"


@pytest.mark.reference
@pytest.mark.parametrize("b,s_q,h_q", [(65536, 1, 16), (65537, 1, 8), (1, 70000, 8)])
def test_B10_dense_decode_grids_large_batch(b, s_q, h_q, monkeypatch):
    """flashinfer #4534: batch 65,536 with one KV token each. The split-KV kernel and the combine keep b and s_q
    on grid axis 0 (recorded launches, sizes as plain tensors that are never touched)."""
    import deepkernels.mla._dense_decode_kernels as ddk
    import deepkernels.mla.combine as comb
    log = []
    monkeypatch.setattr(ddk, "_mla_decode_fwd_kernel", _Recorder(log, "decode"))
    monkeypatch.setattr(comb, "_mla_decode_combine_kernel", _Recorder(log, "combine"))
    monkeypatch.setitem(comb._FAST, "on", False)   # the stand-in replaces the current (not the fast) combine
    q = torch.empty(1, 1, 1, 576, dtype=torch.bfloat16).expand(b, s_q, h_q, 576)
    k = torch.empty(2, 64, 1, 576, dtype=torch.bfloat16)
    bt = torch.zeros(1, 1, dtype=torch.int32).expand(b, 1)
    sl = torch.ones(1, dtype=torch.int32).expand(b)
    parts = 2                     # the fp32 split accumulators are [b + parts, s_q, h_q, 512] (virtual, untouched)
    sched = torch.zeros(parts, 8, dtype=torch.int32)
    ns = torch.zeros(b + 1, dtype=torch.int32)
    out, lse = dec._dense_launch(q, k, bt, sl, sched, ns, 0.1, False)
    assert out.shape == (b, s_q, h_q, 512)
    _check_grids(log)


@pytest.mark.reference
def test_B10_kind_prefill_grids_large_counts(monkeypatch):
    """Sparse prefill (s_q tokens) and dense prefill (sequences x heads x blocks) grids keep large counts on axis 0."""
    import deepkernels.mla.dense_prefill as dp
    import deepkernels.mla.prefill as pf
    log = []
    monkeypatch.setattr(pf, "_sparse_prefill_fwd_kernel", _Recorder(log, "sparse_prefill"))
    monkeypatch.setattr(dp, "_dense_prefill_fwd_kernel", _Recorder(log, "dense_prefill"))
    # the guard launch after it (rows a too-small max_seqlen_qo left uncovered -> NaN): one program per sequence
    monkeypatch.setattr(dp, "_dense_prefill_uncovered_kernel", _Recorder(log, "dense_prefill_guard"))
    for s_q, h_q in [(70000, 128), (2 ** 20 + 1, 16)]:
        q = torch.empty(1, 1, 576, dtype=torch.bfloat16).expand(s_q, h_q, 576)
        kv = torch.empty(4, 1, 576, dtype=torch.bfloat16)
        ind = torch.zeros(1, 1, 64, dtype=torch.int32).expand(s_q, 1, 64)
        out = torch.empty(1, 1, 512, dtype=torch.bfloat16).expand(s_q, h_q, 512)
        ml = torch.empty(1, 1).expand(s_q, h_q)
        pf._launch_sparse_prefill(out, ml, ml, q, kv, ind, 0.1)
    b, h = 70000, 16
    q = torch.empty(1, 1, 192, dtype=torch.bfloat16).expand(b * 130, h, 192)
    k = torch.empty(1, 1, 192, dtype=torch.bfloat16).expand(b, 1, 192)
    v = torch.empty(1, 1, 128, dtype=torch.bfloat16).expand(b, 1, 128)
    cu = torch.arange(b + 1, dtype=torch.int32)
    out = torch.empty(1, 1, 128, dtype=torch.bfloat16).expand(b * 130, h, 128)
    dp._launch_dense_prefill(out, torch.empty(1, 1).expand(h, b * 130), q, k, v, cu * 130, cu, 130, 0.1, True)
    assert {n for n, _ in log} == {"sparse_prefill", "dense_prefill", "dense_prefill_guard"}
    _check_grids(log)


@pytest.mark.interpret
def test_B10_many_requests_one_token_sentinel_overwritten(poison):
    """Many requests of KV length 1 with NaN-poisoned outputs: every element is overwritten and equals the single V
    row each request attends (softmax over one key is exactly 1)."""
    b = 48
    q, k, bt, s = make_case(b, 1, 8, 1, [1] * b, dtype=torch.float16)
    o, l_, _ = decode_and_check("interpret", q, k, bt, s, False)
    v = k[bt[:, 0].long(), 0, 0, :512]                                        # [b, 512]
    assert torch.equal(o[:, 0], v[:, None, :].expand(b, 8, 512))


@pytest.mark.gpu
def test_B10_batch_65536_kv_len_1_gpu(poison):
    b = 65536
    q, k, bt, s = make_case(b, 1, 16, 1, [1] * b, device="cuda")
    meta = dk.get_mla_metadata()[0]
    o, l_ = dk.flash_mla_with_kvcache(q, k, bt.cuda(), s, 512, meta)
    torch.cuda.synchronize()
    assert not torch.isnan(o).any() and torch.isfinite(l_).all()
    v = k[bt[:, 0].long(), 0, 0, :512]
    assert torch.equal(o[:, 0], v[:, None, :].expand(b, 16, 512))
    lse = (q[:, 0].float() * k[bt[:, 0].long(), 0, 0][:, None, :].float()).sum(-1) * 576 ** -0.5
    torch.testing.assert_close(l_[:, :, 0], lse, atol=1e-3, rtol=1e-3)


# ================================================================== kind 7: shapes and strides
@pytest.mark.reference
def test_B13_other_latent_widths_rejected(no_launch):
    """kv_lora_rank 256 (d_qk 320, d_v 256): rejected at every public MLA op, naming the argument."""
    q, k, bt, s = make_case(2, 1, 16, 1, [10, 70], d=320)
    with pytest.raises(ValueError, match="q"):
        dk.flash_mla_with_kvcache(q, k, bt, s, 256, dk.get_mla_metadata()[0])
    q5, k5, _, _ = make_case(2, 1, 16, 1, [10, 70])
    with pytest.raises(ValueError, match="head_dim_v"):
        dk.flash_mla_with_kvcache(q5, k5, bt, s, 256, dk.get_mla_metadata()[0])
    qs = torch.randn(4, 16, 320).bfloat16()
    with pytest.raises(ValueError, match="d_qk"):
        dk.flash_mla_sparse_fwd(qs, torch.randn(8, 1, 320).bfloat16(), torch.zeros(4, 1, 8, dtype=torch.int32), 0.1)
    with pytest.raises(ValueError, match="d_v"):
        dk.flash_mla_sparse_fwd(torch.randn(4, 16, 576).bfloat16(), torch.randn(8, 1, 576).bfloat16(),
                                torch.zeros(4, 1, 8, dtype=torch.int32), 0.1, d_v=256)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="d_qk"):
        dk.flash_attn_varlen_func(qs, torch.randn(4, 16, 320).bfloat16(), torch.randn(4, 16, 256).bfloat16(),
                                  cu, cu, 4, 4)
    from test_mla_sparse_reference import make_case as sd_case
    kw = sd_case(1, 1, 16, "v32", 64, 80, 64)
    with pytest.raises(ValueError, match="head_dim_v"):
        dk.flash_mla_with_kvcache(kw["q"], kw["k_cache"], None, None, 256, dk.get_mla_metadata()[0],
                                  is_fp8_kvcache=True, indices=kw["indices"])


def _strided_copy(t, pad_last=64, every=2):
    """The same values as a view: outer dims spaced out (every other head), last dim padded; the rest is NaN."""
    shape = list(t.shape)
    big = torch.full(shape[:-2] + [shape[-2] * every, shape[-1] + pad_last], float("nan"), dtype=t.dtype)
    view = big[..., ::every, :shape[-1]]
    view.copy_(t)
    return view


@pytest.mark.parametrize("tier", TIERS)
def test_B15_query_and_cache_views(tier, poison):
    """flashinfer #1341: q and the cache passed as views of wider tensors (heads interleaved, 576 of 640 columns,
    the rest NaN); strides are honoured, never read as contiguous."""
    q, k, bt, s = make_case(2, 2, 16, 1, [70, 130], dtype=DTYPE[tier])
    qv = _strided_copy(q)
    kv = _strided_copy(k.transpose(1, 2)).transpose(1, 2)          # [nb, page, 1, 576], page stride spaced out
    assert not qv.is_contiguous() and not kv.is_contiguous()
    o, l_, _ = decode_and_check(tier, qv, kv, bt, s, True)
    o2, l2, _ = decode_and_check(tier, q, k, bt, s, True)
    assert torch.equal(o, o2) and torch.equal(l_, l2)


@pytest.mark.reference
def test_B15_last_dim_stride_rejected(no_launch):
    q, k, bt, s = make_case(1, 1, 16, 1, [10])
    qt = torch.empty(1, 1, 16, 576 * 2, dtype=q.dtype)[..., ::2]
    qt.copy_(q)
    with pytest.raises(ValueError, match="q"):
        dk.flash_mla_with_kvcache(qt, k, bt, s, 512, dk.get_mla_metadata()[0])


# ================================================================== kind 2: masked entries, long contexts
@pytest.mark.reference
@pytest.mark.parametrize("n", [16384, 16385, 32768])
def test_B23_two_token_causal_long_kv(n):
    """FlashMLA-ETAP #2: s_q=2 causal decode, NaN past 16,384 keys. Both sides of 16,384 match float64."""
    q, k, bt, s = make_case(1, 2, 8, 1, [n])
    decode_and_check("reference", q, k, bt, s, True)


@pytest.mark.interpret
def test_B23_two_token_causal_interpret(poison):
    """Interpreter: the two-token causal mask at the tile edges (the long lengths run in the gpu tier)."""
    q, k, bt, s = make_case(4, 2, 8, 1, [1, 2, 33, 129], dtype=torch.float16)
    decode_and_check("interpret", q, k, bt, s, True)


@pytest.mark.gpu
@pytest.mark.parametrize("n", [16384, 16385, 32768, 65536])
def test_B23_two_token_causal_long_kv_gpu(n, poison):
    q, k, bt, s = make_case(8, 2, 8, 1, [n] * 7 + [n - 1], device="cuda")
    decode_and_check("gpu", q, k, bt, s, True)


def _naive_sparse_prefill(q, kv, ind, scale, topk_length=None):
    """float64 loop over query tokens: softmax over the valid, in-length indices only."""
    s_q, h_q, _ = q.shape
    out = torch.zeros(s_q, h_q, 512, dtype=torch.float64)
    ml = torch.full((s_q, h_q), -math.inf, dtype=torch.float64)
    lse = torch.full((s_q, h_q), math.inf, dtype=torch.float64)
    for i in range(s_q):
        row = ind[i, 0].long()
        n = row.numel() if topk_length is None else min(max(int(topk_length[i]), 0), row.numel())
        row = row[:n]
        row = row[(row >= 0) & (row < kv.shape[0])]
        if row.numel() == 0:
            continue
        kk = kv[row, 0].double()
        s = (q[i].double() @ kk.T) * scale
        ml[i] = s.amax(-1)
        lse[i] = torch.logsumexp(s, -1)
        out[i] = torch.softmax(s, -1) @ kk[:, :512]
    return out, ml, lse


def _check_sparse_prefill(out, ml, lse, ro, rml, rlse):
    assert not torch.isnan(out).any() and not torch.isnan(lse).any() and not torch.isnan(ml).any()
    assert check_is_allclose("out", out.float(), ro.float(), abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose("lse", lse.float(), rlse.float(), abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert check_is_allclose("max_logits", ml.float(), rml.float(), abs_tol=1e-6, rel_tol=2.01 / 65536)


@pytest.mark.parametrize("tier", TIERS)
def test_B24_trailing_invalid_blocks_without_topk_length(tier):
    """FlashMLA PR #196: 1,152-wide index rows, about the first 1,000 valid, the rest -1, no topk_length. Matches
    the reference, and equals the same call given topk_length = valid count (the -1 blocks contribute nothing)."""
    s_q, s_kv, topk = 2, 1200, 1152
    valid_n = [1000, 1000 - int(torch.randint(0, 64, ()))]
    q = (torch.randn(s_q, 16, 576) / 10).bfloat16()
    kv = (torch.randn(s_kv, 1, 576) / 10).bfloat16()
    ind = torch.full((s_q, 1, topk), -1, dtype=torch.int32)
    used = torch.zeros(s_kv, dtype=torch.bool)
    for i, n in enumerate(valid_n):
        ind[i, 0, :n] = torch.randperm(s_kv)[:n].int()
        used[ind[i, 0, :n].long()] = True
    kv[~used] = float("nan")
    out, ml, lse = dk.flash_mla_sparse_fwd(q, kv, ind, 0.3)
    ro, rml, rlse = _naive_sparse_prefill(q, kv, ind, 0.3) if tier == "reference" else \
        sparse_prefill_ref(q, kv, ind, 0.3)
    _check_sparse_prefill(out, ml, lse, ro, rml, rlse)
    tl_ = torch.tensor(valid_n, dtype=torch.int32)
    o2, m2, l2 = dk.flash_mla_sparse_fwd(q, kv, ind, 0.3, topk_length=tl_)
    assert torch.equal(out, o2) and torch.equal(ml, m2) and torch.equal(lse, l2)


@pytest.mark.gpu
def test_B24_trailing_invalid_blocks_gpu():
    s_q, s_kv, topk = 256, 8192, 1152
    q = (torch.randn(s_q, 128, 576, device="cuda") / 10).bfloat16()
    kv = (torch.randn(s_kv, 1, 576, device="cuda") / 10).bfloat16()
    ind = torch.full((s_q, 1, topk), -1, dtype=torch.int32, device="cuda")
    ind[:, 0, :1000] = torch.stack([torch.randperm(s_kv, device="cuda")[:1000] for _ in range(s_q)]).int()
    out, ml, lse = dk.flash_mla_sparse_fwd(q, kv, ind, 0.3)
    ro, rml, rlse = sparse_prefill_ref(q, kv, ind, 0.3)
    _check_sparse_prefill(out, ml, lse, ro, rml, rlse)
    o2, m2, l2 = dk.flash_mla_sparse_fwd(q, kv, ind, 0.3, topk_length=torch.full((s_q,), 1000, dtype=torch.int32,
                                                                                   device="cuda"))
    assert torch.equal(out, o2) and torch.equal(lse, l2)


@pytest.mark.parametrize("tier", TIERS)
def test_B24_kind_sparse_decode_trailing_invalid_equals_topk_length(tier):
    """Sparse decode: trailing -1 entries give the same result as topk_length = valid count."""
    from test_mla_sparse_reference import TOL_LSE, TOL_OUT, _public, make_case as sd_case, ref_call
    kw = sd_case(2, 1, 16, "v41", 128, 100, 64, lengths=[100, 77])
    ind = kw["indices"].clone()
    for i, n in enumerate([100, 77]):
        ind[i, :, n:] = -1
    o, l_ = _public(dict(kw, indices=ind, topk_length=None))
    o2, l2 = _public(dict(kw, indices=ind))
    tol_out = dict(TOL_OUT, cos_diff_tol=2e-5) if tier == "interpret" else TOL_OUT
    ro, rl = ref_call(kw)
    for oo, ll in ((o, l_), (o2, l2)):
        assert not torch.isnan(oo).any()
        assert check_is_allclose("out", oo.float(), ro.float(), **tol_out)
        assert check_is_allclose("lse", ll, rl, **TOL_LSE)


@pytest.mark.parametrize("tier", TIERS)
def test_B05_kind_dense_prefill_neighbour_sequence_nan(tier):
    """Varlen dense prefill: a K/V tile that overhangs a sequence's end reads the next sequence's rows; they are
    masked by selection, so NaN there never reaches the first sequence. Rows with no key: out 0, lse +inf."""
    lq, lk = [5, 3, 37], [7, 2, 20]
    cq = torch.tensor([0, 5, 8, 45], dtype=torch.int32)
    ck = torch.tensor([0, 7, 9, 29], dtype=torch.int32)
    q = torch.randn(45, 4, 192).bfloat16()
    k = torch.randn(29, 2, 192).bfloat16()
    v = (torch.randn(29, 2, 128) / 4).bfloat16()
    k[7:9] = float("nan")                                         # sequence 1 holds NaN
    v[7:9] = float("nan")
    out, lse = dk.flash_attn_varlen_func(q, k, v, cq, ck, 37, 20, causal=True)
    keep = torch.ones(45, dtype=torch.bool)
    keep[5:8] = False
    if tier == "reference":
        ro, rl = _naive_dense_prefill(q, k, v, lq, lk, 192 ** -0.5, True)
    else:
        ro, rl = dense_prefill_ref(q, k, v, cq, ck, 192 ** -0.5, True)
    assert not torch.isnan(out[keep]).any() and not torch.isnan(lse[keep]).any()
    assert check_is_allclose("out", out[keep].float(), ro[keep].float(), abs_tol=1e-3, rel_tol=8.01 / 128,
                             cos_diff_tol=7e-6)
    assert check_is_allclose("lse", lse[keep].float(), rl[keep].float(), abs_tol=1e-6, rel_tol=2.01 / 65536)
    first_rows = 37 - 20                                           # causal, s_q > s_k: these rows see no key
    assert (out[8:8 + first_rows] == 0).all() and torch.isposinf(lse[8:8 + first_rows]).all()


def _naive_dense_prefill(q, k, v, lq, lk, scale, causal):
    h, h_k = q.shape[1], k.shape[1]
    out = torch.zeros(q.shape[0], h, v.shape[-1], dtype=torch.float64)
    lse = torch.full((q.shape[0], h), math.inf, dtype=torch.float64)
    q0 = k0 = 0
    for sq, sk in zip(lq, lk):
        for j in range(h):
            qq, kk, vv = q[q0:q0 + sq, j].double(), k[k0:k0 + sk, j // (h // h_k)].double(), \
                v[k0:k0 + sk, j // (h // h_k)].double()
            for i in range(sq):
                lim = i + sk - sq + 1 if causal else sk
                if lim <= 0 or sk == 0:
                    continue
                s = (qq[i] @ kk[:lim].T) * scale
                lse[q0 + i, j] = torch.logsumexp(s, 0)
                out[q0 + i, j] = torch.softmax(s, 0) @ vv[:lim]
        q0, k0 = q0 + sq, k0 + sk
    return out, lse


# ================================================================== kind 1: empty work in every MLA op
@pytest.mark.parametrize("tier", TIERS)
def test_B01_kind_dense_decode_all_empty_and_no_batch(tier, poison):
    q, k, bt, s = make_case(3, 2, 16, 1, [0, 0, 0], dtype=DTYPE[tier])
    o, l_, _ = decode_and_check(tier, q, k, bt, s, True)
    assert (o == 0).all() and torch.isposinf(l_).all()
    o0, l0 = dk.flash_mla_with_kvcache(q[:0], k, bt[:0], s[:0], 512, dk.get_mla_metadata()[0])
    assert o0.shape == (0, 2, 16, 512) and l0.shape == (0, 16, 2)


@pytest.mark.parametrize("tier", TIERS)
def test_B01_kind_empty_sparse_prefill(tier):
    """Every index -1 or junk, topk 0, s_kv 0 and s_q 0: out 0, max_logits -inf, lse +inf, never NaN."""
    q = (torch.randn(3, 16, 576) / 10).bfloat16()
    kv = torch.full((40, 1, 576), float("nan")).bfloat16()
    junk = torch.tensor([-1, -2 ** 31, 40, 2 ** 31 - 1], dtype=torch.int32)
    ind = junk[torch.randint(0, 4, (3, 1, 70))]
    for o, ml, lse in (dk.flash_mla_sparse_fwd(q, kv, ind, 0.3),
                       dk.flash_mla_sparse_fwd(q, kv, ind[..., :0], 0.3),
                       dk.flash_mla_sparse_fwd(q, kv[:0], ind, 0.3)):
        assert (o == 0).all() and torch.isneginf(ml).all() and torch.isposinf(lse).all()
    o, ml, lse = dk.flash_mla_sparse_fwd(q[:0], kv, ind[:0], 0.3)
    assert o.shape == (0, 16, 512) and ml.shape == (0, 16) and lse.shape == (0, 16)


@pytest.mark.parametrize("tier", TIERS)
def test_B01_kind_empty_dense_prefill(tier):
    """Varlen dense prefill with every key sequence empty, and with no query tokens at all."""
    cq = torch.tensor([0, 3, 3, 8], dtype=torch.int32)
    ck = torch.zeros(4, dtype=torch.int32)
    q = torch.randn(8, 4, 128).bfloat16()
    k = torch.empty(0, 4, 128, dtype=torch.bfloat16)
    out, lse = dk.flash_attn_varlen_func(q, k, k, cq, ck, 5, 0)
    assert (out == 0).all() and torch.isposinf(lse).all()
    z = torch.zeros(2, dtype=torch.int32)
    out, lse = dk.flash_attn_varlen_func(q[:0], k, k, z, z, 0, 0)
    assert out.shape == (0, 4, 128)


@pytest.mark.gpu
@pytest.mark.parametrize("topk", [512, 1024, 2048])
def test_B25_exact_fp8_scales_topk_gpu(topk):
    """FlashMLA #192 (performance row; the speed part is in benchmarks): exact non-power-of-two V3.2 scales at
    topk 512/1024/2048 match the reference."""
    from test_mla_sparse_reference import TOL_LSE, TOL_OUT, _public, make_case as sd_case, ref_call
    kw = sd_case(8, 1, 128, "v32", topk, topk + 300, 64, nonpow2=True, with_len=True, device="cuda")
    o, l_ = _public(kw)
    ro, rl = ref_call(kw)
    assert check_is_allclose("out", o.float(), ro.float(), **TOL_OUT)
    assert check_is_allclose("lse", l_, rl, **TOL_LSE)


@pytest.mark.parametrize("tier", TIERS)
def test_B25_exact_fp8_scales_topk_512(tier):
    """Same, topk 512 at a tiny batch: the kernel dequantises with the exact fp32 scale of each token."""
    from test_mla_sparse_reference import TOL_LSE, TOL_OUT, _public, make_case as sd_case, ref_call
    kw = sd_case(1, 1, 16, "v32", 512, 700, 64, nonpow2=True)
    o, l_ = _public(kw)
    ro, rl = ref_call(kw)
    assert not torch.isnan(o).any()
    tol_out = dict(TOL_OUT, cos_diff_tol=2e-5) if tier == "interpret" else TOL_OUT
    assert check_is_allclose("out", o.float(), ro.float(), **tol_out)
    assert check_is_allclose("lse", l_, rl, **TOL_LSE)
    if tier == "reference":   # the reference itself against the exact fp32 scales, decoded independently here
        u = kw["k_cache"].view(torch.uint8)
        sc = u[..., 512:528].contiguous().view(torch.float32)                      # [nb, page, 1, 4]
        assert not torch.all(sc.log2() == sc.log2().round())                       # really non-power-of-two
