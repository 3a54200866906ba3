"""Interpret, compile and GPU tiers for dense MLA decode (scheduler kernel, split-KV kernel, combine)."""
import re

import pytest
import torch

import deepkernels as dk
import deepkernels.mla.decode as dec
from deepkernels.reference import mla as ref
from deepkernels.testing.numerics import check_is_allclose

from test_mla_decode_reference import make_case


@pytest.fixture
def poison():
    dec._POISON_OUTPUTS = True
    yield
    dec._POISON_OUTPUTS = False


def _run_and_check(q, k, bt, sl, causal, tol_out=(8e-4, 2.01 / 128, 5e-6), tol_lse=(1e-6, 8.01 / 65536),
                   scale=None):
    meta, _ = dk.get_mla_metadata()
    o, l = dk.flash_mla_with_kvcache(q, k, bt, sl, 512, meta, softmax_scale=scale, causal=causal)
    o_ref, l_ref = ref.dense_decode(q, k, bt, sl, 512, scale, causal)
    assert not torch.isnan(o).any() and not torch.isnan(l).any()
    assert check_is_allclose("out", o, o_ref, *tol_out)
    assert check_is_allclose("lse", l, l_ref, *tol_lse)
    return meta


# ------------------------------------------------------------------ interpreter tier (tiny shapes, fp16)
INTERP_CASES = [
    # b, s_q, h_q, h_kv, seqlens, causal, page
    (2, 1, 16, 1, [100, 300], False, 64),
    (3, 2, 8, 2, [0, 130, 70], True, 64),      # B01 zero-length + causal MTP + h_kv 2
    (1, 4, 4, 1, [3], True, 64),               # rows with no key: out 0, lse +inf
    (2, 1, 64, 1, [200, 20], False, 16),       # 64-row tile, page size 16
    (1, 1, 3, 1, [70], False, 64),             # B05 last page partly used, NaN past the end
]


@pytest.mark.interpret
@pytest.mark.parametrize("case", INTERP_CASES)
def test_interpret_dense_decode(case, poison):
    b, s_q, h_q, h_kv, seqlens, causal, page = case
    q, k, bt, sl = make_case(b, s_q, h_q, h_kv, seqlens, page=page, dtype=torch.float16)
    meta = _run_and_check(q, k, bt, sl, causal, tol_out=(2e-3, 2.01 / 128, 5e-5), tol_lse=(1e-5, 8.01 / 65536))
    assert int(meta.num_splits[-1]) >= b


def _run_config_and_check(q, k, bt, sl, causal, cfg, tol_out, tol_lse):
    from deepkernels.mla.metadata import compute_schedule
    b, s_q, h_q, _ = q.shape
    rows = s_q * h_q // k.shape[2]
    sched, ns = compute_schedule(sl, dec._num_sm_parts(q.device, rows, k.shape[2], cfg))
    o, l = dec._dense_launch(q, k, bt, sl, sched, ns, 576 ** -0.5, causal, cfg)
    o_ref, l_ref = ref.dense_decode(q.cpu(), k.cpu(), bt.cpu(), sl.cpu(), 512, None, causal)
    assert not torch.isnan(o).any() and not torch.isnan(l).any()
    assert check_is_allclose("out", o.cpu(), o_ref, *tol_out)
    assert check_is_allclose("lse", l.cpu(), l_ref, *tol_lse)


@pytest.mark.interpret
@pytest.mark.parametrize("cfg,page", [((16, 16, 4, 1, 2, "pvl"), 64), ((16, 32, 4, 1, 1, "p"), 16)])
def test_interpret_config_flags(cfg, page, poison):
    """One block-table load per tile ("p", falls back to per-row loads when BLOCK_N > page), output split over
    two programs ("v"), lazy rescale ("l"); huge-logit rows make the lazy path rescale mid-sequence."""
    q, k, bt, sl = make_case(2, 2, 8, 1, [100, 300], page=page, dtype=torch.float16)
    q[1, :, :3] *= 40
    _run_config_and_check(q, k, bt, sl, True, cfg, (2e-3, 2.01 / 128, 5e-5), (1e-5, 8.01 / 65536))


@pytest.mark.interpret
def test_interpret_noncontiguous_q_and_block_table():
    q, k, bt, sl = make_case(2, 2, 8, 1, [65, 129], dtype=torch.float16)
    qb = torch.randn(2, 3, 8, 700).half()
    qb[:, :2, :, :576] = q
    btb = torch.full((2, bt.shape[1] * 2), 7, dtype=torch.int32)
    btb[:, ::2] = bt
    _run_and_check(qb[:, :2, :, :576], k, btb[:, ::2], sl, True, tol_out=(2e-3, 2.01 / 128, 5e-5),
                   tol_lse=(1e-5, 8.01 / 65536))


@pytest.mark.interpret
def test_interpret_scheduler_kernel_matches_reference():
    from deepkernels.mla.metadata import compute_schedule
    for b, parts in [(1, 1), (5, 3), (37, 132), (200, 17)]:
        c = torch.randint(0, 3000, (b,), dtype=torch.int32)
        c[torch.rand(b) < 0.3] = 0
        m, n = compute_schedule(c, parts)
        m2, n2 = ref.linear_schedule(c, parts)
        assert torch.equal(m, m2) and torch.equal(n, n2)


@pytest.mark.interpret
def test_interpret_combine_with_sink():
    from deepkernels.mla.combine import combine_splits_
    b, s_q, h_q = 3, 2, 10
    ns = torch.tensor([0, 1, 4, 6], dtype=torch.int32)
    o = torch.randn(7, s_q, h_q, 512)
    l2 = torch.randn(7, s_q, h_q) * 3
    l2[4:6, :, 3] = float("-inf")                 # request 2 head 3: every split empty
    sink = torch.randn(h_q)
    sink[0], sink[1] = float("inf"), float("-inf")
    out = torch.full((b, s_q, h_q, 512), float("nan"), dtype=torch.float16)
    lse = torch.full((b, h_q, s_q), float("nan"))
    combine_splits_(out, lse, o, l2, ns, attn_sink=sink, all_requests=True)
    o_ref, l_ref = ref.combine_splits(o, l2, ns, torch.float16, attn_sink=sink)
    assert check_is_allclose("out", out, o_ref, 1e-3, 2.01 / 128, 5e-6)
    assert check_is_allclose("lse", lse, l_ref, 1e-6, 8.01 / 65536)
    assert torch.isposinf(lse[2, 3]).all() and (out[2, :, 3] == 0).all()


@pytest.mark.interpret
@pytest.mark.parametrize("planned,actual", [([10, 5, 7], [100, 30, 200]),     # growth (user report)
                                            ([700, 300, 900], [64, 0, 1]),     # shrinkage, to 0 too
                                            ([1, 900, 0], [800, 2, 333])])     # mixed
@pytest.mark.parametrize("legacy", [False, True])
def test_interpret_reused_schedule_any_lengths(planned, actual, legacy, poison):
    """A schedule planned for other cache_seqlens (same batch) gives the right answer: split boundaries are
    clamped to the actual length and each request's last split runs to its actual end."""
    dec.set_mla_num_sms(12)                       # several splits per request
    try:
        q, k, bt, sl = make_case(3, 2, 8, 1, actual, dtype=torch.float16)
        p = torch.tensor(planned, dtype=torch.int32)
        if legacy:
            md, ns = dk.get_mla_metadata(p, 16, 1)
            splits = ns
        else:
            md, ns = dk.get_mla_metadata()
            # fills the schedule for `planned` (a block table wide enough for the planned lengths: page 0 everywhere)
            bt_plan = torch.zeros(3, -(-max(planned) // k.shape[1]), dtype=torch.int32)
            dk.flash_mla_with_kvcache(q, k, bt_plan, p, 512, md, causal=True)
            splits = md.num_splits
        assert max(planned) < 64 or int(splits.diff().max()) > 1      # long plans: multi-split requests
        o, l = dk.flash_mla_with_kvcache(q, k, bt, sl, 512, md, ns, causal=True)
        o_ref, l_ref = ref.dense_decode(q, k, bt, sl, 512, None, True)
        assert not torch.isnan(o).any() and not torch.isnan(l).any()
        assert check_is_allclose("out", o, o_ref, 2e-3, 2.01 / 128, 5e-5)
        assert check_is_allclose("lse", l, l_ref, 1e-5, 8.01 / 65536)
    finally:
        dec.set_mla_num_sms(None)


@pytest.mark.interpret
def test_interpret_padded_num_splits_rows(poison):
    """Legacy schedule for 2 requests replayed at batch 4, num_splits padded with its last value (vLLM CUDA-graph
    padding): rows with no split are written by the combine -- out 0 / lse +inf where no key is visible, NaN where
    keys exist (cannot be computed without a split; never a plausible wrong value)."""
    q, k, bt, sl = make_case(4, 2, 8, 1, [130, 70, 0, 1], dtype=torch.float16)
    md, ns = dk.get_mla_metadata(sl[:2].clone(), 16, 1)
    ns4 = torch.cat([ns, ns[-1:], ns[-1:]])
    o, l = dk.flash_mla_with_kvcache(q, k, bt, sl, 512, md, ns4, causal=True)
    o_ref, l_ref = ref.dense_decode(q, k, bt, sl, 512, None, True)
    assert check_is_allclose("out", o[:3], o_ref[:3], 2e-3, 2.01 / 128, 5e-5)
    assert check_is_allclose("lse", l[:3], l_ref[:3], 1e-5, 8.01 / 65536)
    assert (o[2] == 0).all() and torch.isposinf(l[2]).all()
    assert (o[3, 0] == 0).all() and torch.isposinf(l[3, :, 0]).all()     # causal: query 0 sees no key
    assert o[3, 1].isnan().all() and l[3, :, 1].isnan().all()            # query 1 sees 1 key, no split planned


@pytest.mark.interpret
@pytest.mark.parametrize("scale", [0.0, -0.07, -2.0])
def test_interpret_nonpositive_softmax_scale(scale, poison):
    """softmax_scale <= 0 follows the definition softmax(scale * q.k) (exact rewrite of q on the host)."""
    q, k, bt, sl = make_case(3, 2, 8, 1, [0, 130, 70], dtype=torch.float16)
    _run_and_check(q, k, bt, sl, True, tol_out=(2e-3, 2.01 / 128, 5e-5), tol_lse=(1e-5, 8.01 / 65536), scale=scale)


# ------------------------------------------------------------------ compile tier (production configs, sm90)
_SIG = dict(q_ptr="*bf16", k_ptr="*bf16", bt_ptr="*i32", seqlens_ptr="*i32", meta_ptr="*i32", nsplits_ptr="*i32",
            out_ptr="*bf16", lse_ptr="*fp32", oacc_ptr="*fp32", lacc_ptr="*fp32",
            stride_qb="i64", stride_qs="i64", stride_qh="i64", stride_kb="i64", stride_kt="i64", stride_kh="i64",
            stride_btb="i32", max_pages="i32", num_kv_blocks="i32", b="i32", s_q="i32", h_q="i32", group="i32",
            rows="i32", num_m_blocks="i32", h_kv="i32", acc_rows="i32", sm_scale="fp32", sm_scale_log2="fp32")
# Arguments Triton specialises as 16-divisible at a real launch (aligned pointers, multiple-of-16 strides); without
# them the compile would not vectorise the KV loads and the pipeliner would skip them (not what runs on the GPU).
_DIV16 = ["q_ptr", "k_ptr", "bt_ptr", "seqlens_ptr", "meta_ptr", "nsplits_ptr", "out_ptr", "lse_ptr", "oacc_ptr",
          "lacc_ptr", "stride_qb", "stride_qs", "stride_qh", "stride_kb", "stride_kt", "stride_kh"]


def compile_decode_config(bm, bn, warps, stages, causal=False, flags=""):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from deepkernels.mla._dense_decode_kernels import _mla_decode_fwd_kernel as kern
    ce = dict(CAUSAL=causal, PAGE=64, SBLOCK=64, BLOCK_M=bm, BLOCK_N=bn, D_NOPE=512, D_PE=64, UPCAST=False,
              NUM_STAGES=stages, TILE_IN_PAGE="p" in flags and 64 % bn == 0, V_SPLIT=2 if "v" in flags else 1,
              LAZY_RESCALE="l" in flags, WARP_SPEC="w" in flags)
    sig = dict(_SIG, **{k: "constexpr" for k in ce})
    attrs = {(kern.arg_names.index(n),): [["tt.divisibility", 16]] for n in _DIV16}
    return triton.compile(ASTSource(kern, signature=sig, constexprs=ce, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))


@pytest.mark.compile
@pytest.mark.parametrize("key,causal", [(16, False), (32, False), (64, False), (128, False), (128, True)])
def test_compile_production_configs(key, causal):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    cfg = dec._CONFIGS[key]
    c = compile_decode_config(*cfg[:4], causal, dec._config_flags(cfg))
    ptx, ttgir = c.asm["ptx"], c.asm["ttgir"]
    assert c.metadata.shared <= SM90_SMEM_LIMIT
    assert not re.search(r"\.local\b|ld\.local|st\.local", ptx), "register spills / local memory"
    assert "async_copy_global_to_local" in ttgir, "KV loads are not pipelined"
    if cfg[0] >= 64:
        assert "wgmma.mma_async" in ptx


@pytest.mark.compile
@pytest.mark.parametrize("cfg", [(16, 32, 4, 3, 2, "p"), (64, 64, 4, 2, 1, "pvl"), (128, 32, 8, 2, 1, "pv")])
def test_compile_flag_configs(cfg):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    c = compile_decode_config(*cfg[:4], False, cfg[5])
    ptx, ttgir = c.asm["ptx"], c.asm["ttgir"]
    assert c.metadata.shared <= SM90_SMEM_LIMIT
    assert not re.search(r"\.local\b|ld\.local|st\.local", ptx), "register spills / local memory"
    assert "async_copy_global_to_local" in ttgir, "KV loads are not pipelined"
    # 16-byte cp.async for the KV rows; with one page id per tile no per-row 4-byte page-table copies remain
    assert re.search(r"cp\.async\.cg\.shared\.global \[[^]]*\], \[[^]]*\], 0x10", ptx)
    assert len(re.findall(r"cp\.async\.ca\.shared\.global", ptx)) <= 4


@pytest.mark.compile
def test_compile_scheduler_and_combine():
    from deepkernels.mla.combine import _mla_decode_combine_kernel
    from deepkernels.mla.metadata import _mla_sched_metadata_kernel
    from deepkernels.testing.compile import compile_sm90
    c = compile_sm90(_mla_sched_metadata_kernel, dict(counts_ptr="*i32", meta_ptr="*i32", nsplits_ptr="*i32",
                                                      b="i32", num_parts="i32"),
                     dict(OVERHEAD=5, SBLOCK=64, CHUNK=128, PARTS=32), num_warps=4)
    assert not c.uses_local_memory
    c = compile_sm90(_mla_decode_combine_kernel,
                     dict(oacc_ptr="*fp32", lacc_ptr="*fp32", nsplits_ptr="*i32", out_ptr="*bf16", lse_ptr="*fp32",
                          sink_ptr="*fp32", len_ptr="*i32", s_q="i32", h_q="i32", acc_rows="i32"),
                     dict(HAS_SINK=False, ALL_REQUESTS=False, HEADS=8, D_V=512, HAS_LEN=True, CAUSAL=True), num_warps=4)
    assert not c.uses_local_memory


# ------------------------------------------------------------------ GPU tier (FlashMLA tolerances)
GPU_GRID = [
    # b, s_q, s_k, h_q, h_kv, varlen, causal
    (b, s_q, s_k, h_q, h_kv, varlen, causal)
    for b in (2, 64) for s_q in (1, 2, 4) for s_k in (20, 140, 4096)
    for (h_q, h_kv) in ((1, 1), (9, 3), (16, 1), (63, 1), (64, 2), (128, 1), (128, 8))
    for varlen, causal in ((False, False), (True, True))
    if not (b == 64 and s_k == 4096 and (h_q < 64 or h_kv == 8))
]


def _gpu_case(b, s_q, s_k, h_q, h_kv, varlen, zero_frac=0.0):
    if varlen:
        sl = torch.clamp(torch.normal(float(s_k), s_k / 2, (b,)), min=s_q).int()
    else:
        sl = torch.full((b,), s_k, dtype=torch.int32)
    if zero_frac:
        sl[torch.rand(b) < zero_frac] = 0
    return make_case(b, s_q, h_q, h_kv, sl.tolist(), device="cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("b,s_q,s_k,h_q,h_kv,varlen,causal", GPU_GRID[::4])
def test_gpu_dense_decode_grid(b, s_q, s_k, h_q, h_kv, varlen, causal, poison):
    q, k, bt, sl = _gpu_case(b, s_q, s_k, h_q, h_kv, varlen)
    _run_and_check(q, k, bt, sl, causal)


@pytest.mark.gpu
@pytest.mark.parametrize("h_q,h_kv", [(16, 1), (128, 1), (64, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_corner_zero_seqlens(h_q, h_kv, causal, poison):
    q, k, bt, sl = _gpu_case(128, 2, 4096, h_q, h_kv, True, zero_frac=0.5)
    _run_and_check(q, k, bt, sl, causal)


def _sweep_candidates():
    import importlib.util
    import pathlib
    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "mla_decode.py"
    spec = importlib.util.spec_from_file_location("_mla_decode_bench", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.CANDIDATES


# (s_q, h_q) pairs of the benchmark per bucket (same specialisations as the sweep, so its compile cache is reused)
_BUCKET_SHAPES = {16: [(1, 16)], 32: [(1, 32), (2, 16)], 64: [(1, 64), (2, 32)], 128: [(1, 128), (2, 64)]}
GPU_CANDIDATE_CASES = [(s_q, h_q, cfg) for key, cands in _sweep_candidates().items()
                       for (s_q, h_q) in _BUCKET_SHAPES[key] for cfg in cands]


@pytest.mark.gpu
@pytest.mark.parametrize("s_q,h_q,cfg", GPU_CANDIDATE_CASES, ids=lambda v: str(v).replace(" ", ""))
def test_gpu_every_sweep_candidate(s_q, h_q, cfg, poison):
    """Every config the benchmark sweep may pick is exact on varlen/zero-length/NaN-padded inputs."""
    sl = [0, 1, 63, 64, 65, 700, 1500, 3000]
    q, k, bt, sl = make_case(8, s_q, h_q, 1, sl, device="cuda")
    _run_config_and_check(q, k, bt, sl, s_q > 1, cfg, (8e-4, 2.01 / 128, 5e-6), (1e-6, 8.01 / 65536))


@pytest.mark.gpu
def test_gpu_b01_empty_request(poison):
    q, k, bt, sl = make_case(2, 1, 128, 1, [0, 130])
    _run_and_check(q.cuda(), k.cuda(), bt.cuda(), sl.cuda(), False)


@pytest.mark.gpu
@pytest.mark.parametrize("s_k", [16384, 16385])
def test_gpu_b23_mtp_causal_long(s_k, poison):
    q, k, bt, sl = make_case(2, 2, 8, 1, [s_k, s_k - 7])
    _run_and_check(q.cuda(), k.cuda(), bt.cuda(), sl.cuda(), True)


@pytest.mark.gpu
def test_gpu_noncontiguous_q_and_schedule_reuse(poison):
    q, k, bt, sl = make_case(4, 2, 64, 1, [300, 1, 5000, 64])
    qb = torch.randn(4, 2, 64, 704, dtype=torch.bfloat16)
    qb[..., :576] = q
    meta = _run_and_check(qb[..., :576].cuda(), k.cuda(), bt.cuda(), sl.cuda(), True)
    o1, _ = dk.flash_mla_with_kvcache(qb[..., :576].cuda(), k.cuda(), bt.cuda(), sl.cuda(), 512, meta, causal=True)
    o2, _ = dk.flash_mla_with_kvcache(qb[..., :576].cuda(), k.cuda(), bt.cuda(), sl.cuda(), 512, meta, causal=True)
    assert torch.equal(o1, o2)


@pytest.mark.gpu
def test_gpu_huge_logits_max_gives_one():
    q, k, bt, sl = make_case(1, 1, 16, 1, [100], nan_unused=False)
    q.fill_(0.5)
    k.fill_(0.5)
    meta, _ = dk.get_mla_metadata()
    o, l = dk.flash_mla_with_kvcache(q.cuda() * 4096, k.cuda() * 4096, bt.cuda(), sl.cuda(), 512, meta)
    assert torch.isfinite(l).all() and not torch.isnan(o).any()


@pytest.mark.gpu
def test_gpu_cuda_graph_capture(monkeypatch):
    # the Triton kernel's fast launch path (the Gluon path's capture: tests/test_mla_decode_gluon.py)
    monkeypatch.setenv("DEEPKERNELS_DISABLE_GLUON", "dense_decode")
    q, k, bt, sl = [t.cuda() for t in make_case(8, 1, 16, 1, [100, 2000, 0, 64, 65, 1, 4096, 300])]
    meta, _ = dk.get_mla_metadata()
    dk.flash_mla_with_kvcache(q, k, bt, sl, 512, meta)       # warm up / compile
    meta2, _ = dk.get_mla_metadata()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, l = dk.flash_mla_with_kvcache(q, k, bt, sl, 512, meta2)
    g.replay()
    torch.cuda.synchronize()
    o_ref, _ = ref.dense_decode(q.cpu(), k.cpu(), bt.cpu(), sl.cpu(), 512)
    assert check_is_allclose("out", o.cpu(), o_ref, 8e-4, 2.01 / 128, 5e-6)
    # the captured call went through the bound launchers (direct CompiledKernel.run) of the warm-up call
    from deepkernels.mla import combine as comb
    from deepkernels.mla import metadata as md
    for cache in (dec._LAUNCHERS, comb._LAUNCHERS, md._LAUNCHERS):
        assert any(l.fast_calls for l in cache.values())


@pytest.mark.interpret
def test_interpret_combine_garbage_num_splits_stays_in_bounds():
    """A stale or garbage num_splits (negative, decreasing, past the accumulator rows) never makes the combine
    read outside o_accum/lse_accum: both ends are clamped to [0, rows]. Rows whose clamped range holds splits are
    combined from exactly those rows; an empty range gives out 0 and lse +inf (no key, no length given)."""
    from deepkernels.mla.combine import combine_splits_
    b, s_q, h_q, rows = 4, 1, 8, 5
    o = torch.randn(rows, s_q, h_q, 512)
    l2 = torch.randn(rows, s_q, h_q)
    ns = torch.tensor([-7, 2, 1, 9, 11], dtype=torch.int32)  # [-7,2) -> [0,2); [2,1) empty; [1,9) -> [1,5); [9,11) empty
    out = torch.full((b, s_q, h_q, 512), float("nan"), dtype=torch.float16)
    lse = torch.full((b, h_q, s_q), float("nan"))
    combine_splits_(out, lse, o, l2, ns, all_requests=True)
    one = torch.tensor([0, 2], dtype=torch.int32)
    o0, l0 = ref.combine_splits(o[0:2], l2[0:2], one, torch.float16)           # request 0: rows [0, 2)
    assert check_is_allclose("out r0", out[0], o0[0], 1e-3, 2.01 / 128, 5e-6)
    assert check_is_allclose("lse r0", lse[0], l0[0], 1e-6, 8.01 / 65536)
    o2, l2r = ref.combine_splits(o[1:5], l2[1:5], torch.tensor([0, 4], dtype=torch.int32), torch.float16)
    assert check_is_allclose("out r2", out[2], o2[0], 1e-3, 2.01 / 128, 5e-6)   # request 2: rows [1, 5)
    assert check_is_allclose("lse r2", lse[2], l2r[0], 1e-6, 8.01 / 65536)
    for r in (1, 3):                                                            # empty ranges
        assert (out[r] == 0).all() and torch.isposinf(lse[r]).all()
