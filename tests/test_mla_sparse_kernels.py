"""Sparse MLA decode kernels: interpreter (tiny shapes), compile (sm90 cross-compile of every production config)
and GPU tiers (FlashMLA sparse-decode tolerances over a trimmed version of its shape grid, docs/spec/mla.md §5.2-§5.4).

Every run poisons out / lse / the split accumulators with NaN (``_POISON_OUTPUTS``) and writes NaN into every KV
token that no valid in-length index references; anomaly-position matching in ``check_is_allclose`` then proves that
every output element was written and that no unreferenced token leaked in.
"""
import math
import re

import pytest
import torch

import deepkernels as dk
import deepkernels.mla.sparse_decode as sd
from deepkernels.testing.numerics import check_is_allclose

from test_mla_sparse_reference import TOL_LSE, TOL_OUT, _public, make_case, ref_call


@pytest.fixture
def poison():
    sd._POISON_OUTPUTS = True
    yield
    sd._POISON_OUTPUTS = False


@pytest.fixture
def sms():
    """Set the SM count the scheduler balances over (forces split-KV at tiny shapes); restored afterwards."""
    from deepkernels.mla import decode as dec

    def _set(n):
        dec.set_mla_num_sms(n)
    yield _set
    dec.set_mla_num_sms(None)


# tiny interpreter shapes have few output elements, so the cosine difference (~2.2e-6 from bf16 P and output
# rounding, measured) fluctuates more than at FlashMLA's test sizes: a 2x looser cosine bound there only
TOL_OUT_TINY = dict(TOL_OUT, cos_diff_tol=1e-5)


def run_and_check(kw, tol_out=TOL_OUT, tol_lse=TOL_LSE, meta=None):
    meta = meta or dk.get_mla_metadata()[0]
    o, l_ = _public(kw, meta)
    ro, rl = ref_call(kw, out_dtype=torch.float32)      # bf16 kernel output vs the unrounded fp32 reference
    b, s_q, h_q = kw["q"].shape[:3]
    assert o.shape == (b, s_q, h_q, 512) and o.dtype == torch.bfloat16
    assert l_.shape == (b, h_q, s_q) and l_.stride() == (s_q * h_q, 1, h_q)   # transposed view of [b, s_q, h_q]
    assert not torch.isnan(o).any() and not torch.isnan(l_).any()
    assert check_is_allclose("out", o.float().cpu(), ro.float().cpu(), **tol_out)
    assert check_is_allclose("lse", l_.cpu(), rl.cpu(), **tol_lse)
    return o, l_, meta


# ------------------------------------------------------------------ interpreter tier (tiny shapes)
INTERP_CASES = [
    # id, b, s_q, h_q, fmt, topk, s_k, page, extra (xfmt, xtopk, xpage), flags
    ("v32_p64", 2, 1, 16, "v32", 70, 90, 64, None, dict(sink=True)),
    ("v32_p2_B19", 2, 2, 16, "v32", 64, 40, 2, None, dict(nonpow2=True, with_len=True)),
    ("model1_p61_x2", 2, 2, 16, "model1", 70, 90, 61, ("model1", 40, 2), dict(with_len=True, with_xlen=True,
                                                                              sink=True)),
    ("v41_fp4_p53_x69", 3, 1, 32, "v41", 100, 120, 53, ("fp4", 50, 69), dict(with_len=True, sink=True)),
    ("v41_p576_h64", 1, 2, 64, "v41", 64, 200, 576, None, dict(with_len=True)),
    ("v41_v41_p1_B22", 2, 1, 16, "v41", 30, 40, 1, ("v41", 20, 1), dict(with_xlen=True)),
    ("all_invalid_zero_len", 3, 2, 16, "model1", 64, 64, 16, ("model1", 64, 16), dict(all_invalid=True, sink=True)),
    ("zero_seqlen_rows", 4, 1, 16, "v32", 64, 64, 64, None, dict(zero_len=True, sink=True)),
]


@pytest.mark.interpret
@pytest.mark.parametrize("case", INTERP_CASES, ids=[c[0] for c in INTERP_CASES])
def test_interpret_sparse_decode(case, poison, sms, monkeypatch):
    _, b, s_q, h_q, fmt, topk, s_k, page, extra, flags = case
    sms(8)                                            # several parts per request: exercises split-KV + combine
    if case[0] == "v32_p64":   # the linear schedule (the greedy one gives these 2 requests whole parts: no split)
        monkeypatch.setattr(sd, "_GREEDY_SCHED", False)
    x = dict(xfmt=extra[0], xtopk=extra[1], xpage=extra[2]) if extra else {}
    kw = make_case(b, s_q, h_q, fmt, topk, s_k, page, **x, **flags)
    o, l_, meta = run_and_check(kw, TOL_OUT_TINY)
    if case[0] == "v32_p64":
        assert int(meta.num_splits[-1]) > b                           # split-KV + combine really ran
    if flags.get("all_invalid"):
        assert (o == 0).all() and torch.isposinf(l_).all()


@pytest.mark.interpret
def test_interpret_zero_length_rows_and_inf_sinks(poison, sms):
    sms(6)
    kw = make_case(3, 2, 16, "v41", 128, 150, 64, xfmt="fp4", xtopk=64, lengths=[0, 128, 5], xlengths=[0, 0, 64])
    s = torch.randn(16)
    s[:4], s[4:8] = math.inf, -math.inf
    kw["attn_sink"] = s
    o, l_, _ = run_and_check(kw, TOL_OUT_TINY)
    assert (o[0] == 0).all() and torch.isposinf(l_[0]).all()          # no token: out 0, lse +inf (with a sink)
    assert (o[1:, :, :4] == 0).all()                                   # +inf sink -> 0
    o2, l2 = _public(dict(kw, attn_sink=None))
    assert torch.equal(l_, l2)                                         # the sink never changes lse


@pytest.mark.interpret
def test_interpret_split_matches_batch_invariant_and_is_invariant(sms):
    sms(16)
    kw = make_case(3, 1, 16, "v41", 192, 250, 64, with_len=True)
    o_split, l_split = _public(kw)
    sd.set_sparse_decode_batch_invariant(True)
    try:
        o_bi, l_bi = _public(kw)
        one = {k: (v[1:2] if isinstance(v, torch.Tensor) and k in ("q", "indices", "topk_length") else v)
               for k, v in kw.items()}
        o_one, l_one = _public(one)
    finally:
        sd.set_sparse_decode_batch_invariant(False)
    assert torch.equal(o_bi[1:2], o_one) and torch.equal(l_bi[1:2], l_one)   # no dependence on the rest of the batch
    assert check_is_allclose("out", o_split.float(), o_bi.float(), **TOL_OUT_TINY)
    assert check_is_allclose("lse", l_split, l_bi, **TOL_LSE)


@pytest.mark.interpret
def test_B07_B17_stale_or_padded_schedule_is_safe(sms):
    """A schedule planned for other lengths, with padded no-work parts (begin_req = b), never faults."""
    from deepkernels.mla.metadata import compute_schedule
    sms(4)
    kw = make_case(2, 1, 16, "v41", 64, 80, 64)
    q = kw["q"]
    sched, ns = compute_schedule(torch.tensor([1, 1], dtype=torch.int32), 3)
    sched = torch.cat([sched, torch.tensor([[2, 1, 0, 0, 0, 0, 0, 0]], dtype=torch.int32)])
    out = torch.full((2, 1, 16, 512), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((2, 1, 16), float("nan"))
    sd._launch_sparse_decode(out, lse, q, kw["k_cache"], kw["indices"], sched, ns, 0.05, "v41")
    assert not torch.isnan(out).any()                                  # every row written, no fault
    meta = dk.get_mla_metadata()[0]
    _public(kw, meta)
    with pytest.raises(ValueError, match="reused"):                    # B17: q rows no longer match the metadata
        _public(dict(kw, q=torch.cat([q, q]), indices=torch.cat([kw["indices"]] * 2)), meta)


@pytest.mark.interpret
@pytest.mark.parametrize("planned", [([1, 2, 3], [0, 1, 2]), ([192, 192, 192], [64, 64, 64])],
                         ids=["grow", "shrink"])
def test_interpret_reused_schedule_any_lengths(planned, poison, sms):
    """A FlashMLASchedMeta filled for other topk_length / extra_topk_length (same batch) gives the right answer:
    split boundaries are clamped to the actual token line, each request's last split runs to its actual end."""
    sms(8)
    kw = make_case(3, 1, 16, "v41", 192, 250, 64, xfmt="fp4", xtopk=64, xpage=16, lengths=[192, 100, 0],
                   xlengths=[64, 3, 40])
    meta = dk.get_mla_metadata()[0]
    _public(dict(kw, topk_length=torch.tensor(planned[0], dtype=torch.int32),
                 extra_topk_length=torch.tensor(planned[1], dtype=torch.int32)), meta)
    run_and_check(kw, TOL_OUT_TINY, meta=meta)


@pytest.mark.interpret
def test_interpret_padded_num_splits_rows(poison):
    """num_splits planned for 2 requests and padded to 4 (no split for rows 2, 3): the combine writes those rows --
    out 0 / lse +inf for no token position, NaN when the request has token positions (never a plausible wrong
    value). Not reachable through the public op (legacy tensors are re-planned there)."""
    from deepkernels.mla.metadata import compute_schedule
    kw = make_case(4, 1, 16, "v41", 64, 80, 16, lengths=[64, 30, 0, 5])
    sched, ns = compute_schedule(kw["topk_length"][:2].clone(), 3)
    ns = torch.cat([ns, ns[-1:], ns[-1:]])
    out = torch.full((4, 1, 16, 512), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((4, 1, 16), float("nan"))
    sd._launch_sparse_decode(out, lse, kw["q"], kw["k_cache"], kw["indices"], sched, ns, kw["softmax_scale"],
                             "v41", topk_length=kw["topk_length"])
    ro, rl = ref_call(kw, out_dtype=torch.float32)
    assert check_is_allclose("out", out[:2].float(), ro[:2].float(), **TOL_OUT_TINY)
    assert check_is_allclose("lse", lse[:2].transpose(1, 2), rl[:2], **TOL_LSE)
    assert (out[2] == 0).all() and torch.isposinf(lse[2]).all()
    assert out[3].isnan().all() and lse[3].isnan().all()


@pytest.mark.interpret
@pytest.mark.parametrize("scale", [0.0, -0.05])
def test_interpret_nonpositive_softmax_scale(scale, poison, sms):
    """softmax_scale <= 0 follows softmax(scale * q.k) like the reference (exact host rewrite of q), sink too."""
    sms(6)
    kw = make_case(2, 1, 16, "v32", 128, 150, 64, lengths=[128, 7], sink=True)
    run_and_check(dict(kw, softmax_scale=scale), TOL_OUT_TINY)


@pytest.mark.interpret
def test_B18_topk_length_clamped_in_kernel():
    kw = make_case(1, 1, 16, "v32", 64, 64, 64, lengths=[1000])
    o, l_ = _public(kw)
    o2, l2 = _public(dict(kw, topk_length=torch.tensor([64], dtype=torch.int32)))
    assert torch.equal(o, o2) and torch.equal(l_, l2)



@pytest.mark.interpret
def test_interpret_combine_garbage_num_splits_stays_in_bounds():
    """The combine in the sparse path's specialisation (lse [b, s_q, h_q], top-k lengths): a stale or garbage
    num_splits (negative, decreasing, past the accumulator rows) never reads outside o_accum/lse_accum, both ends
    of each request's range clamped to [0, rows] exactly as for dense decode; an empty range gives out 0 / lse +inf
    without a token position, NaN with one."""
    from deepkernels.mla.combine import combine_splits_
    from deepkernels.reference import mla as ref
    b, s_q, h_q, rows = 4, 2, 16, 5
    o = torch.randn(rows, s_q, h_q, 512)
    l2 = torch.randn(rows, s_q, h_q)
    # [-7,2) -> [0,2); [2,1) empty; [1,9) -> [1,5); [9,11) empty
    ns = torch.tensor([-7, 2, 1, 9, 11], dtype=torch.int32)
    out = torch.full((b, s_q, h_q, 512), float("nan"), dtype=torch.bfloat16)
    lse = torch.full((b, s_q, h_q), float("nan"))
    lengths = torch.tensor([3, 0, 40, 9], dtype=torch.int32)
    combine_splits_(out, lse.transpose(1, 2), o, l2, ns, all_requests=True, lengths=lengths, topk=8, rne=True)
    for r, (r0, r1) in ((0, (0, 2)), (2, (1, 5))):
        ro, rl = ref.combine_splits(o[r0:r1], l2[r0:r1], torch.tensor([0, r1 - r0], dtype=torch.int32),
                                    torch.bfloat16)
        assert check_is_allclose(f"out r{r}", out[r].float(), ro[0].float(), **TOL_OUT_TINY)
        assert check_is_allclose(f"lse r{r}", lse[r].transpose(0, 1), rl[0], **TOL_LSE)
    assert (out[1] == 0).all() and torch.isposinf(lse[1]).all()        # empty range, topk_length 0: no token
    assert out[3].isnan().all() and lse[3].isnan().all()               # empty range, 8 token positions: NaN


def test_public_op_launches_take_the_fast_path_on_a_repeated_signature(monkeypatch):
    """Second call with the same signature: the split-KV kernel and the combine go through the bound
    KernelLauncher (direct CompiledKernel.run), keyed stably by the cached call plan; a new FlashMLASchedMeta per
    step recomputes the schedule. (No device: kernels and binding are stand-ins.)"""
    import deepkernels._launch as launch
    import deepkernels.mla._sparse_kernels as sk
    import deepkernels.mla.combine as comb
    from test_mla_decode_reference import _FakeJit
    log = []
    monkeypatch.setattr(sk, "_sparse_decode_fwd_kernel", _FakeJit(sk._sparse_decode_fwd_kernel, log, "decode"))
    monkeypatch.setattr(comb, "_mla_decode_combine_kernel", _FakeJit(comb._mla_decode_combine_kernel, log, "combine"))
    monkeypatch.setitem(comb._FAST, "on", False)   # the stand-in replaces the current (not the fast) combine
    monkeypatch.setattr(launch, "_bindable", lambda args: True)
    monkeypatch.setattr(launch, "_current_device", lambda: 0)
    monkeypatch.setattr(launch, "_stream_getter", lambda: (lambda dev: 0))
    monkeypatch.setattr(sd, "use_kernels", lambda *t: True)
    monkeypatch.setattr(sd, "_PLANS", {})           # plans made under the patch (kernels=True on CPU) are dropped
    monkeypatch.setattr(sd, "_LAUNCHERS", {})
    monkeypatch.setattr(comb, "_LAUNCHERS", {})
    kw = make_case(2, 1, 16, "v41", 64, 80, 16, xfmt="fp4", xtopk=32, xpage=8, with_len=True, sink=True)
    for _ in range(3):
        _public(kw)
    assert log == [("decode", "slow"), ("combine", "slow")] + [("decode", "fast"), ("combine", "fast")] * 2
    assert len(sd._PLANS) == 1 and len(sd._LAUNCHERS) == 1

@pytest.mark.reference
def test_B08_B09_grids_keep_large_counts_on_axis0():
    from deepkernels.mla.combine import _combine_grid      # the combine shared with dense decode
    for parts, s_q, h_q in [(1, 70000, 128), (132, 2 ** 20 + 1, 64), (66, 3, 16)]:
        g = sd._fwd_grid(parts, s_q, h_q, sd.SPARSE_DECODE_CONFIGS[h_q][0])
        assert len(g) == 1 and g[0] < 2 ** 31
        c = _combine_grid(1, s_q, h_q)
        assert c[0] == s_q and c[1] <= 16


# ------------------------------------------------------------------ compile tier (sm90 cross-compile)
_SIG = dict(q_ptr="*bf16", kv_ptr="*u8", idx_ptr="*i32", len_ptr="*i32", xkv_ptr="*u8", xidx_ptr="*i32",
            xlen_ptr="*i32", sink_ptr="*fp32", meta_ptr="*i32", nsplits_ptr="*i32", out_ptr="*bf16", lse_ptr="*fp32",
            oacc_ptr="*fp32", lacc_ptr="*fp32", stride_qb="i32", stride_qs="i32", stride_qh="i32", stride_kb="i32",
            page="i32", num_tok="i32", stride_ib="i32", stride_is="i32", stride_xkb="i32", xpage="i32",
            xnum_tok="i32", stride_xib="i32", stride_xis="i32", b="i32", s_q="i32", h_q="i32", topk="i32",
            xtopk="i32", acc_rows="i32", sm_scale_log2="fp32")
# what Triton's launcher specialises as 16-divisible for aligned tensors (pointers, strides of real caches)
_DIV16 = ["q_ptr", "kv_ptr", "idx_ptr", "len_ptr", "xkv_ptr", "xidx_ptr", "xlen_ptr", "sink_ptr", "meta_ptr",
          "nsplits_ptr", "out_ptr", "lse_ptr", "oacc_ptr", "lacc_ptr", "stride_qb", "stride_qs", "stride_qh",
          "stride_kb", "stride_ib", "stride_is", "stride_xkb", "stride_xib", "stride_xis"]
FMTS = {"v32": (0, 0, False), "model1+x": (1, 1, True), "v41+fp4": (2, 3, True), "v41": (2, 2, False)}


def compile_sparse_config(config, fmt="v41+fp4", page_shift=6, xblock_n=None):
    """Cross-compile ``_sparse_decode_fwd_kernel`` for sm90 with a (BLOCK_H, BLOCK_N, warps, stages, _) config."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from deepkernels.mla._sparse_kernels import _sparse_decode_fwd_kernel as kern
    bh, bn, warps, stages, _ = config
    f, xf, has_x = FMTS[fmt]
    ce = dict(FMT=f, XFMT=xf, PAGE_SHIFT=page_shift, XPAGE_SHIFT=page_shift, HAS_EXTRA=has_x, HAS_LEN=True,
              HAS_XLEN=has_x, HAS_SINK=True, BLOCK_H=bh, BLOCK_N=bn,
              XBLOCK_N=xblock_n or sd._block_n(bn, {"v32": "v32", "model1+x": "model1", "v41+fp4": "fp4",
                                                      "v41": "v41"}[fmt]), SBLOCK=64, UPCAST=False, NUM_STAGES=stages)
    sig = dict(_SIG, **{k: "constexpr" for k in ce})
    attrs = {(kern.arg_names.index(n),): [["tt.divisibility", 16]] for n in _DIV16}
    return triton.compile(ASTSource(kern, signature=sig, constexprs=ce, attrs=attrs),
                          target=GPUTarget("cuda", 90, 32), options=dict(num_warps=warps, num_stages=stages))




def sass_spill_report(ptx: str):
    """(spill bytes from ptxas -v, spill instructions inside innermost loops) or None if ptxas is missing.

    The PTX has no local memory even when ptxas spills, so the register allocation is checked on the SASS."""
    from deepkernels.testing.compile import n_spill, ptxas_sm90, sass_loops
    rep = ptxas_sm90(ptx, sass=True)
    if rep is None:
        return None
    in_loop = sum(n_spill(loop) for loop in sass_loops(rep.sass))
    return rep.spill_bytes, in_loop


COMPILE_CASES = [(128, "v32", 6), (128, "model1+x", -1), (128, "v41+fp4", 6), (128, "v41", -1),
                 (32, "v41+fp4", 6), (16, "v32", -1)]


@pytest.mark.compile
@pytest.mark.parametrize("h_q,fmt,shift", COMPILE_CASES)
def test_compile_production_configs(h_q, fmt, shift):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    cfg = sd.sparse_decode_config(h_q, fmt.split("+")[0])
    c = compile_sparse_config(cfg, fmt, shift)
    ptx, ttgir = c.asm["ptx"], c.asm["ttgir"]
    assert c.metadata.shared <= SM90_SMEM_LIMIT
    assert not re.search(r"\.local\b|ld\.local|st\.local", ptx)
    assert "async_copy_global_to_local" in ttgir, "token gathers are not pipelined"
    if cfg[0] >= 64:
        assert "wgmma.mma_async" in ptx
    rep = sass_spill_report(ptx)
    if rep is not None:
        spill_bytes, in_loop = rep
        assert in_loop == 0, "register spills inside the token loop"
        assert spill_bytes <= 512, f"{spill_bytes} bytes of spills (prologue/epilogue)"


@pytest.mark.compile
@pytest.mark.parametrize("cfg", [c for c in sd.SPARSE_DECODE_CANDIDATES if c != sd.SPARSE_DECODE_CONFIGS[128]])
def test_compile_sweep_candidates(cfg):
    """Every config the device sweep times compiles within smem and without spills in the token loop."""
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    c = compile_sparse_config(cfg, "v41+fp4", 6)
    assert c.metadata.shared <= SM90_SMEM_LIMIT and "wgmma.mma_async" in c.asm["ptx"]
    rep = sass_spill_report(c.asm["ptx"])
    assert rep is None or rep[1] == 0


@pytest.mark.compile
def test_compile_combine():
    """The combine shared with dense decode, in the sparse path's specialisation (lse [b, s_q, h_q], top-k lengths
    clamped, extra cache, sink)."""
    from deepkernels.mla.combine import _mla_decode_combine_kernel
    from deepkernels.testing.compile import compile_sm90
    c = compile_sm90(_mla_decode_combine_kernel,
                     dict(oacc_ptr="*fp32", lacc_ptr="*fp32", nsplits_ptr="*i32", out_ptr="*bf16", lse_ptr="*fp32",
                          sink_ptr="*fp32", len_ptr="*i32", xlen_ptr="*i32", topk="i32", xtopk="i32", s_q="i32",
                          h_q="i32", acc_rows="i32"),
                     dict(HAS_SINK=True, ALL_REQUESTS=False, HEADS=8, D_V=512, HAS_LEN=True, LSE_SHQ=True,
                          TOPK_LEN=True, HAS_EXTRA=True, HAS_XLEN=True, RNE=False), num_warps=4)
    assert not c.uses_local_memory


# ------------------------------------------------------------------ GPU tier
# Trimmed FlashMLA sparse-decode correctness grid (spec §5.4): (s_k, topk, page) x h_q x (b, s_q) x format.
_SHAPES = [(512, 64, 2), (512, 64, 69), (1024, 576, 61), (2046, 2048, 64), (2046, 2048, 576), (650, 576, 53)]
_FORMATS = [("v32", None), ("model1", "model1"), ("v41", "fp4"), ("v41", None)]
GPU_GRID = [(fmt, xfmt, h_q, b, s_q, s_k, topk, page)
            for (s_k, topk, page) in _SHAPES for h_q in (64, 128) for (b, s_q) in ((4, 1), (74, 3))
            for (fmt, xfmt) in _FORMATS]


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt,h_q,b,s_q,s_k,topk,page", GPU_GRID[::5])
def test_gpu_sparse_decode_grid(fmt, xfmt, h_q, b, s_q, s_k, topk, page, poison):
    x = dict(xfmt=xfmt, xtopk=max(topk // 4, 64), xpage=2 if page == 64 else 64) if xfmt else {}
    kw = make_case(b, s_q, h_q, fmt, topk, s_k, page, with_len=fmt != "v32", with_xlen=xfmt is not None,
                   sink=True, device="cuda", **x)
    run_and_check(kw)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt,xfmt", _FORMATS)
@pytest.mark.parametrize("flags", [dict(all_invalid=True), dict(zero_len=True), dict(all_invalid=True, sink=True),
                                   dict(zero_len=True, sink=True)])
def test_gpu_corner_cases(fmt, xfmt, flags, poison):
    x = dict(xfmt=xfmt, xtopk=128, xpage=61) if xfmt else {}
    kw = make_case(74, 3, 128, fmt, 576, 650, 53, with_len=fmt != "v32", **x, **flags, device="cuda")
    o, l_, _ = run_and_check(kw)
    if flags.get("all_invalid"):
        assert (o == 0).all() and torch.isposinf(l_).all()


@pytest.mark.gpu
@pytest.mark.parametrize("h_q", [16, 32])
def test_gpu_small_head_counts(h_q, poison):
    kw = make_case(64, 2, h_q, "v41", 2048, 4096, 64, xfmt="fp4", xtopk=512, xpage=64, with_len=True,
                   with_xlen=True, sink=True, device="cuda")
    run_and_check(kw)


@pytest.mark.gpu
def test_gpu_B19_nonpow2_scales_and_oob_indices(poison):
    kw = make_case(8, 2, 64, "v32", 128, 120, 64, nonpow2=True, lengths=[60] * 8, device="cuda")
    nt = kw["k_cache"].shape[0] * kw["k_cache"].shape[1]
    kw["indices"][:, :, -12:] = torch.arange(nt, nt + 12, dtype=torch.int32, device="cuda")
    run_and_check(kw)


@pytest.mark.gpu
def test_gpu_batch_invariant_mode_and_determinism():
    kw = make_case(74, 2, 128, "v41", 2048, 4096, 64, with_len=True, device="cuda")
    o1, l1 = _public(kw)
    o2, l2 = _public(kw)
    assert torch.equal(o1, o2) and torch.equal(l1, l2)                 # fixed input -> bit-identical output
    check_batch_invariant(kw, o1)


def check_batch_invariant(kw, o_ref):
    """Batch-invariant mode: requests 5..8 alone give bit-identical results to the same rows of the whole batch,
    and the mode's output matches ``o_ref`` (the split-KV result) within the tolerances."""
    sd.set_sparse_decode_batch_invariant(True)
    try:
        ob, lb = _public(kw)
        part = {k: (v[5:9] if isinstance(v, torch.Tensor) and k in ("q", "indices", "topk_length") else v)
                for k, v in kw.items()}
        op, lp = _public(part)
    finally:
        sd.set_sparse_decode_batch_invariant(False)
    assert torch.equal(ob[5:9], op) and torch.equal(lb[5:9], lp)
    assert check_is_allclose("out", ob.float(), o_ref.float(), **TOL_OUT)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    """A decode step (metadata already planned) is capturable: no host syncs in the sparse path."""
    kw = make_case(16, 2, 64, "v41", 512, 1024, 64, xfmt="fp4", xtopk=128, with_len=True, sink=True, device="cuda")
    meta = dk.get_mla_metadata()[0]
    o_ref, l_ref = _public(kw, meta)                                   # plans the schedule
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        _public(kw, meta)                                              # warm up on the capture stream
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o_g, l_g = _public(kw, meta)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_g, o_ref) and torch.equal(l_g, l_ref)


@pytest.mark.gpu
def test_gpu_huge_logits_max_element_exact(poison):
    """FlashMLA d626421: with huge logits the max element must give exp2(0) = 1 (no fused-FMA drift)."""
    kw = make_case(2, 1, 64, "v41", 64, 64, 64, device="cuda")
    kw["q"] = (kw["q"] * 0 + 1).bfloat16()
    kw["softmax_scale"] = 1e3
    o, l_, _ = run_and_check(kw)
    assert torch.isfinite(o).all() and torch.isfinite(l_).all()


@pytest.mark.gpu
def test_gpu_repeated_call_fast_path_bit_identical(monkeypatch):
    """Repeated calls with one signature take the cached host path (plan + direct CompiledKernel launches of the
    split-KV kernel and the shared combine) and give bit-identical results; a batch of another size (b = 1, a
    multiple of 16, other: unspecialised) reuses the compiled kernel."""
    from deepkernels.mla import combine as comb
    monkeypatch.setenv("DEEPKERNELS_DISABLE_GLUON", "sparse_decode")   # the Triton kernel's launch path
    kw = make_case(16, 1, 128, "v41", 256, 512, 64, xfmt="fp4", xtopk=64, with_len=True, with_xlen=True, sink=True,
                   device="cuda")
    sd._PLANS.clear()
    o1, l1 = _public(kw)
    fast0 = sum(x.fast_calls for d in (sd._LAUNCHERS, comb._LAUNCHERS) for x in d.values())
    for _ in range(3):
        o2, l2 = _public(kw)
        assert torch.equal(o1, o2) and torch.equal(l1, l2)
    fast = sum(x.fast_calls for d in (sd._LAUNCHERS, comb._LAUNCHERS) for x in d.values()) - fast0
    assert fast == 6, f"{fast} fast launches for 3 repeated calls (2 expected per call)"
    for b in (1, 3):
        part = {k: (v[:b] if isinstance(v, torch.Tensor) and k in ("q", "indices", "topk_length",
                                                                    "extra_indices_in_kvcache", "extra_topk_length")
                    else v) for k, v in kw.items()}
        run_and_check(part)
