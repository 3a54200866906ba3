"""Regression tests of the session-18 fresh-user review (README followed on a fresh CPU venv, then the public MLA
ops probed with the edge-case kinds of shared/cases/edge-cases.md: sparse decode with an extra cache at h_q = 128
and sparse prefill first).

Findings (these tests fail until fixed):

- kind 7 (shape / memory-layout assumptions), GPU dispatch: the sm90 dispatch gates admit tensor layouts that the
  Gluon kernel they route to cannot be compiled for. Triton specialises an int argument as 16-divisible only when
  it is a multiple of 16 *elements*, and the cp.async copies of these kernels need that fact:

  * sparse decode, V3.2, h_q a multiple of 128 (the 2-CTA cluster kernel, WS3, whose softmax warpgroup loads Q by
    cp.async since session 18): ``supported_ws3`` never looks at q's strides or base, so a q view whose head
    stride is 584 elements (rows still 16-byte aligned) reaches ``launch_sparse_decode_gluon_ws3`` and Triton
    fails with "cp.async does not support transfers smaller than 4 bytes" (RuntimeError: PassManager::run failed)
    -- the op documents "q: any strides";
  * sparse prefill: ``_gluon_sparse_prefill.supported`` accepts row strides that are multiples of 8 elements
    (16 bytes), but the dispatched WS2 kernel's KV gather only compiles when ``kv.stride(0)`` is a multiple of 16
    elements: kv with stride(0) = 584 fails the same way.

  Both are reproduced on the CPU: the gate is asked with CUDA-like stand-ins (sm90 patched in), the launcher is
  driven with CPU tensors of the same layout (its launch captured), and the kernel is cross-compiled for sm90 with
  exactly the divisibility facts Triton would derive from the captured arguments.
- README: "with an extra cache: V3.2 on a single-partition Gluon kernel, V4.1 + FP4 on Triton" is stale since
  session 15 (``_gluon_sparse_decode_ws.DISPATCH_EXTRA``: every extra-cache pair runs on the warp-specialised
  kernel, and on the cluster kernel at h_q % 128 == 0 since session 18).

The other tests pin behaviour the review found correct and no earlier test covers at h_q = 128 with an extra
cache (V3.2 656-byte, V4.1 528-byte, FP4 288-byte): extra-only / main-only / empty requests next to full ones
with NaN in every unread slot, junk and huge indices, extra_topk_length clamping, page sizes 1 and 53, padded
block strides, +-inf sinks, softmax_scale <= 0, topk = 0 / extra_topk = 0, reuse of a FlashMLASchedMeta across
calls whose lengths change (many splits), and named errors for every bad extra-cache argument.

Tiers: ``reference`` (CPU reference path), ``interpret`` (Triton kernels under TRITON_INTERPRET=1), ``compile``
(sm90 cross-compile on the CPU).
"""
import math
import pathlib

import pytest
import torch

import deepkernels as dk
from deepkernels.quant.kvcache import quantize_kv_cache
from deepkernels.reference.mla_sparse import sparse_decode_ref

REF = pytest.param("reference", marks=pytest.mark.reference)
INT = pytest.param("interpret", marks=pytest.mark.interpret)
TIERS = [REF, INT]
INF = math.inf
ROOT = pathlib.Path(__file__).resolve().parents[1]
PAIRS = [("v41", "fp4"), ("v32", "v32"), ("v41", "v41")]


def _d(fmt):
    return 576 if fmt == "v32" else 512


def _cache(fmt, nb, page, nan_rows=None, pad_rows=0):
    """Quantised cache ``[nb, page, 1, bpt]``; rows listed in ``nan_rows`` (flat token ids) are NaN before
    quantisation (so their scales are NaN); ``pad_rows`` extra rows per block make stride(0) larger than a block."""
    x = (torch.randn(nb * (page + pad_rows), _d(fmt)) / 10).bfloat16()
    if nan_rows is not None:
        flat = x.view(nb, page + pad_rows, -1)[:, :page].reshape(nb * page, -1).clone()
        flat[nan_rows] = float("nan")
        x.view(nb, page + pad_rows, -1)[:, :page] = flat.view(nb, page, -1)
    c = quantize_kv_cache(x.view(nb, page + pad_rows, 1, _d(fmt)), fmt)
    return c[:, :page]


def _decode(q, kc, ind, meta=None, **kw):
    meta = meta or dk.get_mla_metadata()[0]
    return dk.flash_mla_with_kvcache(q, kc, None, None, 512, meta, is_fp8_kvcache=True, indices=ind, **kw)


def _ref(q, kc, ind, scale=None, **kw):
    return sparse_decode_ref(q, kc, ind, 512, scale, kw.get("attn_sink"), kw.get("extra_k_cache"),
                             kw.get("extra_indices_in_kvcache"), kw.get("topk_length"), kw.get("extra_topk_length"),
                             out_dtype=torch.float32)


def _check(out, lse, ro, rl, empty=None):
    """No NaN; rows in ``empty`` ([b, s_q] bool) exactly out 0 / lse +inf; everything matches the reference."""
    assert not torch.isnan(out).any() and not torch.isnan(lse).any()
    assert lse.shape == (out.shape[0], out.shape[2], out.shape[1])
    assert lse.stride() == (out.shape[1] * out.shape[2], 1, out.shape[2])
    if empty is not None:
        lse_bs = lse.transpose(1, 2)
        assert (out[empty] == 0).all() and (lse_bs[empty] == INF).all()
    assert torch.equal(torch.isinf(lse), torch.isinf(rl))
    fin = torch.isfinite(rl)
    torch.testing.assert_close(out.float(), ro.float(), atol=2e-3, rtol=2.01 / 128)
    torch.testing.assert_close(lse[fin], rl[fin], atol=1e-5, rtol=1e-4)


@pytest.fixture
def restore_mla_sms():
    yield
    dk.set_mla_num_sms(None)


# ------------------------------------------------------------------------------------- 1. dispatch vs compile
class _CudaLike:
    """Duck-typed stand-in for a CUDA tensor, enough for the sm90 dispatch gates (shape, strides, dtype, address)."""

    def __init__(self, shape, stride, dtype, ptr=1 << 24):
        self.shape, self._stride, self.dtype, self._ptr = torch.Size(shape), tuple(stride), dtype, ptr
        self.is_cuda = True
        self.device = torch.device("cuda", 0)

    def dim(self):
        return len(self.shape)

    def stride(self, i=None):
        return self._stride if i is None else self._stride[i]

    def data_ptr(self):
        return self._ptr

    def element_size(self):
        return torch.empty((), dtype=self.dtype).element_size()


def _launch_facts(fn, args):
    """The argument names Triton marks 16-divisible for a launch with ``args`` (in ``fn``'s parameter order):
    tensors whose address is 16-byte aligned, ints that are multiples of 16."""
    facts = set()
    for name, v in zip(fn.arg_names, args):
        if isinstance(v, torch.Tensor) and v.data_ptr() % 16 == 0:
            facts.add(name)
        elif isinstance(v, int) and not isinstance(v, bool) and v % 16 == 0:
            facts.add(name)
    return facts


def _compiles(module, facts, build):
    """Cross-compile through ``module``'s ``_compile_sm90_gluon`` with only the hints in ``facts``; (ok, error)."""
    orig = module._compile_sm90_gluon

    def restricted(fn, sig, consts, hinted, **kw):
        return orig(fn, sig, consts, [h for h in hinted if h in facts], **kw)

    module._compile_sm90_gluon = restricted
    try:
        build()
        return True, None
    except Exception as e:      # Triton's MLIR pass failure (RuntimeError)
        return False, f"{type(e).__name__}: {e}"
    finally:
        module._compile_sm90_gluon = orig


def _gluon_or_skip():
    from deepkernels import _gluon
    if not _gluon.available():
        pytest.skip(f"Gluon not importable: {_gluon.IMPORT_ERROR}")


@pytest.mark.compile
def test_ws3_sparse_decode_gate_admits_only_q_layouts_its_kernel_compiles_for(monkeypatch):
    """Kind 7 (layout assumptions), GPU dispatch: FlashMLA's q contract is 'last dim contiguous, other strides
    free'. A V3.2 call at h_q = 128 with enough work for the cluster kernel (b 64, topk 2048, 66 parts) whose q is
    a view with head stride 584 elements (1168 bytes: rows 16-byte aligned) must either be kept off WS3 by the gate
    or be launched with arguments the WS3 kernel (cp.async Q loads) compiles for; today the gate admits it and the
    compile fails (cp.async transfers < 4 bytes)."""
    _gluon_or_skip()
    from deepkernels.mla import _gluon_sparse_decode_ws as ws
    from deepkernels.mla import _gluon_sparse_decode_ws3 as ws3
    from deepkernels.mla import combine
    for var in ("DEEPKERNELS_DISABLE_GLUON", "DEEPKERNELS_SPARSE_WS3"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    b, s_q, h_q, topk, page, nb, pad = 64, 1, 128, 2048, 64, 64, 584
    q_stub = _CudaLike((b, s_q, h_q, 576), (s_q * h_q * pad, h_q * pad, pad, 1), torch.bfloat16)
    kc_stub = _CudaLike((nb, page, 1, 656), (page * 656, 656, 656, 1), torch.float8_e4m3fn)
    admitted = (ws.DISPATCH and "v32" in ws.DISPATCH_FMTS and ws.supported_ws(q_stub, kc_stub, "v32")
                and ws3.dispatch_on("v32") and ws3.supported_ws3(q_stub, kc_stub, "v32")
                and ws3.enough_work(b, topk, 66))

    # the launch the public op makes for such a q (driven with CPU tensors of the same layout; launch captured)
    q = torch.zeros(2, s_q, h_q, pad, dtype=torch.bfloat16)[..., :576]
    kc = quantize_kv_cache(torch.zeros(2, page, 1, 576, dtype=torch.bfloat16), "v32")
    ind = torch.zeros(2, s_q, 64, dtype=torch.int32)
    sched = torch.zeros(1, 8, dtype=torch.int32)
    ns = torch.arange(3, dtype=torch.int32)
    out = torch.empty(2, s_q, h_q, 512, dtype=torch.bfloat16)
    lse = torch.empty(2, s_q, h_q)
    seen = {}

    def capture(self, gx, args, scale_log2):
        seen["args"], seen["meta"] = args, dict(self.meta)

    monkeypatch.setattr(ws3._ClusterLauncher, "__call__", capture)
    monkeypatch.setattr(combine, "combine_splits_", lambda *a, **k: None)
    ws3._LAUNCHERS.clear()
    ws3.launch_sparse_decode_gluon_ws3(out, lse, q, kc, ind, sched, ns, 576 ** -0.5, "v32")
    ws3._LAUNCHERS.clear()
    m = seen["meta"]
    facts = _launch_facts(ws3._sparse_decode_gluon_ws3_kernel, seen["args"])
    ok, err = _compiles(ws3, facts, lambda: ws3.compile_sm90_ws3(
        "v32", page_shift=m["PAGE_SHIFT"], has_len=m["HAS_LEN"], has_sink=m["HAS_SINK"], pv_regs=m["PV_REGS"],
        producer_regs=m["PRODUCER_REGS"], deq_asm=m["DEQ_ASM"], pf_l2=m["PF_L2"], rope_rows=m["ROPE_ROWS"],
        row_lanes=m["ROW_LANES"], idx_ahead=m["IDX_AHEAD"], pf_lines=m["PF_LINES"], q_async=m["Q_ASYNC"]))
    assert not admitted or ok, (f"WS3 is dispatched for q strides {q_stub.stride()} but does not compile for the "
                                f"launch's divisibility facts: {str(err)[:300]}")


@pytest.mark.compile
def test_sparse_prefill_gate_admits_only_kv_strides_its_kernel_compiles_for(monkeypatch):
    """Kind 7 (layout assumptions), GPU dispatch: flash_mla_sparse_fwd documents 'kv: any strides'. The Gluon gate
    accepts a kv row stride of 584 elements (a multiple of 8: 16-byte rows), but Triton only marks multiples of 16
    elements, and the dispatched WS2 kernel's KV gather (cp.async) does not compile without that fact: the gate
    must keep such a kv off the Gluon kernel (or the launch must make it compilable)."""
    _gluon_or_skip()
    from deepkernels.mla import _gluon_sparse_prefill as gsp
    from deepkernels.mla import _gluon_sparse_prefill_ws2 as gsp2
    for var in ("DEEPKERNELS_DISABLE_GLUON", "DEEPKERNELS_SPARSE_PREFILL_WS2"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    s_q, h_q, s_kv, topk, pad = 64, 128, 4096, 2048, 584
    q_stub = _CudaLike((s_q, h_q, 576), (h_q * 576, 576, 1), torch.bfloat16)
    kv_stub = _CudaLike((s_kv, 1, 576), (pad, pad, 1), torch.bfloat16)
    admitted = gsp.supported(q_stub, kv_stub) and gsp2.dispatch_on()

    q = torch.zeros(4, h_q, 576, dtype=torch.bfloat16)
    kv = torch.zeros(100, 1, pad, dtype=torch.bfloat16)[..., :576]
    ind = torch.zeros(4, 1, 64, dtype=torch.int32)
    out = torch.empty(4, h_q, 512, dtype=torch.bfloat16)
    ml, lse = torch.empty(4, h_q), torch.empty(4, h_q)
    seen = {}

    def fake_cached_launcher(cache, fn, key, meta, limit=1024, **kw):
        seen["meta"] = meta() if callable(meta) else meta
        return lambda grid, *args: seen.update(args=args)

    monkeypatch.setattr(gsp2, "cached_launcher", fake_cached_launcher)
    gsp2.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 0.05)
    m = seen["meta"]
    facts = _launch_facts(gsp2._sparse_prefill_gluon_ws2_kernel, seen["args"])
    ok, err = _compiles(gsp2, facts, lambda: gsp2.compile_sm90_ws2(
        d_pe=m["D_PE"], has_len=m["HAS_LEN"], has_sink=m["HAS_SINK"], pv_regs=m["PV_REGS"],
        producer_regs=m["PRODUCER_REGS"], gather_rows4=m["GATHER_ROWS4"]))
    assert not admitted or ok, (f"the sparse prefill Gluon kernel is dispatched for kv strides {kv_stub.stride()} "
                                f"but does not compile for the launch's divisibility facts: {str(err)[:300]}")


# ------------------------------------------------------------------------------------------------ 2. README
@pytest.mark.reference
def test_readme_extra_cache_dispatch_sentence_is_current():
    """README accuracy (a new user's view of the sm90 dispatch): 'with an extra cache: V3.2 on a single-partition
    Gluon kernel, V4.1 + FP4 on Triton' contradicts sparse_decode.py, which sends every extra-cache pair to the
    warp-specialised kernel while _gluon_sparse_decode_ws.DISPATCH_EXTRA (on since session 15) and to the 2-CTA
    cluster kernel for the pairs of _gluon_sparse_decode_ws3.DISPATCH_EXTRA_PAIRS (session 18)."""
    from deepkernels.mla import _gluon_sparse_decode_ws as ws
    text = " ".join((ROOT / "README.md").read_text().split())
    if ws.DISPATCH and ws.DISPATCH_EXTRA:
        if "fp4" in ws.WS_EXTRA_PAIRS["v41"]:
            assert "V4.1 + FP4 on Triton" not in text
        if "v32" in ws.WS_EXTRA_PAIRS["v32"]:
            assert "with an extra cache: V3.2 on a single-partition Gluon kernel" not in text


# ------------------------------------------------------------- 3. sparse decode, h_q = 128, extra caches (pins)
def _extra_case(fmt, xfmt, b=5, s_q=2, h_q=128, topk=64, xtopk=32, page=64, xpage=16, nb=3, xnb=4, xpad=0):
    """Requests: 0 extra tokens only (main all -1), 1 main only (extra_topk_length 0), 2 nothing (main length 0,
    extra indices junk: >= num tokens, INT_MAX, INT_MIN, -2), 3 main + extra with extra_topk_length past xtopk,
    4 main with junk mixed in + extra with negative extra_topk_length. Every cache token no request reads is NaN."""
    n, xn = nb * page, xnb * xpage
    ind = torch.randint(0, n, (b, s_q, topk), dtype=torch.int32)
    xind = torch.randint(0, xn, (b, s_q, xtopk), dtype=torch.int32)
    ind[0] = -1
    xind[2] = torch.tensor([xn, 2**31 - 1, -2**31, -2], dtype=torch.int32).repeat(xtopk // 4 + 1)[:xtopk]
    ind[4, :, ::3] = torch.tensor([n, -5, 2**31 - 1], dtype=torch.int32).repeat(topk)[:ind[4, :, ::3].shape[-1]]
    tl_ = torch.tensor([topk, topk, 0, 2**31 - 1, topk - 7], dtype=torch.int32)[:b]
    xtl = torch.tensor([xtopk, 0, xtopk, 2**31 - 1, -3], dtype=torch.int32)[:b]
    used, xused = torch.zeros(n, dtype=torch.bool), torch.zeros(xn, dtype=torch.bool)
    for i in range(b):
        r = ind[i, :, :max(0, min(int(tl_[i]), topk))].reshape(-1).long()
        used[r[(r >= 0) & (r < n)]] = True
        r = xind[i, :, :max(0, min(int(xtl[i]), xtopk))].reshape(-1).long()
        xused[r[(r >= 0) & (r < xn)]] = True
    kc = _cache(fmt, nb, page, nan_rows=~used)
    xc = _cache(xfmt, xnb, xpage, nan_rows=~xused, pad_rows=xpad)
    q = torch.randn(b, s_q, h_q, _d(fmt)).clamp(-2, 2).bfloat16()
    empty = torch.zeros(b, s_q, dtype=torch.bool)
    empty[2] = True
    kw = dict(extra_k_cache=xc, extra_indices_in_kvcache=xind, topk_length=tl_, extra_topk_length=xtl)
    return q, kc, ind, kw, empty


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("fmt,xfmt", PAIRS)
@pytest.mark.parametrize("variant", ["plain", "sink", "scale<=0", "xpage1_padded"])
def test_sparse_decode_h128_extra_cache_mixed_requests(tier, fmt, xfmt, variant):
    """Kinds 1 + 2 (empty work, invalid entries) with an extra cache at h_q = 128 (FlashMLA contract: main and extra
    tokens in one softmax; only -1 / out-of-range / past-length entries are skipped; an empty row is out 0,
    lse +inf with or without a sink): each request kind next to full ones matches the reference, NaN never leaks."""
    # page size 1 with stride(0) larger than one block, else 16-token pages
    xpage, xnb, xpad = (1, 64, 1) if variant == "xpage1_padded" else (16, 4, 0)
    q, kc, ind, kw, empty = _extra_case(fmt, xfmt, xpage=xpage, xnb=xnb, xpad=xpad)
    scale = None
    if variant == "sink":
        kw["attn_sink"] = torch.tensor([INF, -INF, 0.0, 3.0] * 32)
    elif variant == "scale<=0":
        scale = -0.05
    out, lse = _decode(q, kc, ind, softmax_scale=scale, **kw)
    ro, rl = _ref(q, kc, ind, scale, **kw)
    _check(out, lse, ro, rl, empty)
    if variant == "scale<=0":                            # scale 0: uniform weights over the valid tokens
        out0, lse0 = _decode(q, kc, ind, softmax_scale=0.0, **kw)
        ro0, rl0 = _ref(q, kc, ind, 0.0, **kw)
        _check(out0, lse0, ro0, rl0, empty)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("fmt,xfmt", PAIRS)
def test_sparse_decode_h128_extra_cache_zero_width_index_lists(tier, fmt, xfmt):
    """Kind 1 (empty work): topk = 0 next to a non-empty extra list (extra tokens only), extra_topk = 0 next to a
    main list (the extra cache contributes nothing, with or without extra_topk_length), and both 0 (every row
    empty: out 0, lse +inf) match the reference."""
    b, s_q, h_q = 2, 2, 128
    kc, xc = _cache(fmt, 2, 64), _cache(xfmt, 2, 16)
    q = torch.randn(b, s_q, h_q, _d(fmt)).clamp(-2, 2).bfloat16()
    ind = torch.randint(0, 128, (b, s_q, 40), dtype=torch.int32)
    xind = torch.randint(0, 32, (b, s_q, 24), dtype=torch.int32)
    xl = torch.tensor([0, 5], dtype=torch.int32)
    for i, xi, extra_len in ((ind[..., :0], xind, None), (ind, xind[..., :0], None), (ind, xind[..., :0], xl),
                             (ind[..., :0], xind[..., :0], xl)):
        kw = dict(extra_k_cache=xc, extra_indices_in_kvcache=xi, extra_topk_length=extra_len)
        out, lse = _decode(q, kc, i, **kw)
        ro, rl = _ref(q, kc, i, **kw)
        empty = torch.full((b, s_q), i.shape[-1] == 0 and xi.shape[-1] == 0)
        _check(out, lse, ro, rl, empty)


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("fmt,xfmt", [("v41", "fp4"), ("v32", "v32")])
def test_sparse_decode_h128_extra_cache_reused_schedule_many_splits(tier, fmt, xfmt, restore_mla_sms):
    """Kind 5 (stale metadata): one FlashMLASchedMeta reused across calls whose topk_length / extra_topk_length
    change (grow from 0 to past the list, shrink), with set_mla_num_sms(64) forcing many splits per request: every
    call matches the reference (deepkernels' documented superset of FlashMLA's reuse rule)."""
    dk.set_mla_num_sms(64)
    b, s_q, h_q = 3, 2, 128
    kc, xc = _cache(fmt, 4, 64), _cache(xfmt, 3, 64)
    q = torch.randn(b, s_q, h_q, _d(fmt)).clamp(-2, 2).bfloat16()
    ind = torch.randint(0, 256, (b, s_q, 130), dtype=torch.int32)
    xind = torch.randint(0, 192, (b, s_q, 100), dtype=torch.int32)
    meta = dk.get_mla_metadata()[0]
    for tl_, xtl in (([0, 0, 0], [0, 0, 0]), ([130, 7, 64], [100, 0, 99]), ([2**31 - 1, 129, 1], [-1, 100, 65]),
                     ([5, 0, 130], [1, 2, 3])):
        kw = dict(extra_k_cache=xc, extra_indices_in_kvcache=xind, topk_length=torch.tensor(tl_, dtype=torch.int32),
                  extra_topk_length=torch.tensor(xtl, dtype=torch.int32))
        out, lse = _decode(q, kc, ind, meta=meta, **kw)
        ro, rl = _ref(q, kc, ind, **kw)
        empty = torch.tensor([t <= 0 and x <= 0 for t, x in zip(tl_, xtl)])[:, None].expand(b, s_q)
        _check(out, lse, ro, rl, empty)
    with pytest.raises(ValueError, match="tile_scheduler_metadata was built for"):
        _decode(q, kc, ind, meta=meta)                   # same meta without the extra cache: another config


@pytest.mark.reference
def test_sparse_decode_h128_extra_cache_bad_arguments_named():
    """Error contract (FlashMLA pairing rules: the extra cache has the main cache's format, or is FP4 next to V4.1;
    extra indices only with an extra cache and vice versa; int32 index / length tensors): every bad extra-cache
    argument raises TypeError / ValueError naming it, before any launch."""
    b, s_q, h_q = 2, 1, 128
    kc41, xfp4, kc32 = _cache("v41", 2, 16), _cache("fp4", 2, 16), _cache("v32", 2, 16)
    q41 = torch.randn(b, s_q, h_q, 512).bfloat16()
    q32 = torch.randn(b, s_q, h_q, 576).bfloat16()
    ind = torch.randint(0, 32, (b, s_q, 8), dtype=torch.int32)
    cases = [
        (ValueError, r"k_cache: the 288-byte FP4 format is only valid as extra_k_cache", q41, xfp4, {}),
        (ValueError, r"extra_k_cache format 'fp4' \(288 B/token\) does not pair with the main cache format 'v32'",
         q32, kc32, dict(extra_k_cache=xfp4, extra_indices_in_kvcache=ind)),
        (ValueError, r"extra_k_cache format 'v32' \(656 B/token\) does not pair with the main cache format 'v41'",
         q41, kc41, dict(extra_k_cache=kc32, extra_indices_in_kvcache=ind)),
        (TypeError, r"extra_indices_in_kvcache must have dtype torch.int32, got torch.int64", q41, kc41,
         dict(extra_k_cache=xfp4, extra_indices_in_kvcache=ind.long())),
        (TypeError, r"extra_topk_length must have dtype torch.int32, got torch.int64", q41, kc41,
         dict(extra_k_cache=xfp4, extra_indices_in_kvcache=ind, extra_topk_length=torch.ones(b, dtype=torch.long))),
        (ValueError, r"extra_topk_length must have shape \[b=2\], got \[3\]", q41, kc41,
         dict(extra_k_cache=xfp4, extra_indices_in_kvcache=ind, extra_topk_length=torch.ones(3, dtype=torch.int32))),
        (TypeError, r"extra_k_cache must have dtype torch.float8_e4m3fn or torch.int8 or torch.uint8, got "
                    r"torch.bfloat16", q41, kc41,
         dict(extra_k_cache=xfp4.view(torch.uint8).view(torch.bfloat16), extra_indices_in_kvcache=ind)),
        (ValueError, r"extra_topk_length is only allowed with extra_k_cache", q41, kc41,
         dict(extra_topk_length=torch.ones(b, dtype=torch.int32))),
        (ValueError, r"extra_indices_in_kvcache is required with extra_k_cache and forbidden without it", q41, kc41,
         dict(extra_indices_in_kvcache=ind)),
        (ValueError, r"extra_indices_in_kvcache is required with extra_k_cache and forbidden without it", q41, kc41,
         dict(extra_k_cache=xfp4)),
        (ValueError, r"extra_k_cache must have h_k = 1", q41, kc41,
         dict(extra_k_cache=torch.zeros(2, 16, 2, 288, dtype=torch.uint8), extra_indices_in_kvcache=ind)),
        (ValueError, r"extra_k_cache must have stride\(1\) == bytes_per_token \(288\)", q41, kc41,
         dict(extra_k_cache=torch.zeros(2, 16, 1, 576, dtype=torch.uint8)[..., :288], extra_indices_in_kvcache=ind)),
    ]
    for exc, pat, q, kc, kw in cases:
        with pytest.raises(exc, match=pat):
            _decode(q, kc, ind, **kw)
