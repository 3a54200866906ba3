"""Fast MLA decode combine (``deepkernels.mla.combine``, module docstring "Fast combine"): bit-identical to the current
combine kernel on random partials (interpreter and GPU tiers), through the public dense and sparse decode calls
with the fast combine forced on vs off (GPU), with programmatic dependent launch and CUDA-graph capture (GPU), and
its sm90 compile facts (registers without spills, griddepcontrol.wait only with PDL)."""
import re

import pytest
import torch

import deepkernels.mla.combine as comb
from deepkernels.mla.combine import FastCombineConfig, combine_splits_

CONFIGS = [FastCombineConfig(8, 4, 2), FastCombineConfig(8, 4, 1), FastCombineConfig(4, 4, 3, 3),
           FastCombineConfig(16, 8, 2, 2), FastCombineConfig(8, 8, 4), FastCombineConfig(8, 4, 2, 4)]


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, NaN-aware (any NaN matches any NaN: payloads are not part of the contract)."""
    if a.shape != b.shape or a.dtype != b.dtype or a.stride() != b.stride():
        return False
    na, nb = torch.isnan(a), torch.isnan(b)
    if not torch.equal(na, nb):
        return False
    iv = {2: torch.int16, 4: torch.int32}[a.element_size()]
    return torch.equal(a.masked_fill(na, 0).view(iv), b.masked_fill(nb, 0).view(iv))


def random_partials(b, s_q, h_q, counts, device, *, stale=False, empty_frac=0.2, d_v=512):
    """Per-split partials of ``counts[i]`` splits per request: o_accum randn (``O/L`` scale), lse_accum base-2 with a
    spread wide enough that the max matters, ``empty_frac`` of the (split, query, head) entries empty (-inf, o 0),
    one whole request-head empty. ``stale``: num_splits garbage (decreasing, negative, past the rows)."""
    ns = [0]
    for c in counts:
        ns.append(ns[-1] + c)
    rows = ns[-1] + 3
    o = torch.randn(rows, s_q, h_q, d_v, device=device)
    lacc = torch.randn(rows, s_q, h_q, device=device) * 6
    empty = torch.rand(rows, s_q, h_q, device=device) < empty_frac
    lacc[empty] = float("-inf")
    o[empty] = 0.0
    if b > 1 and ns[2] > ns[1]:
        lacc[ns[1]:ns[2], :, 0] = float("-inf")           # request 1, head 0: every split empty
        o[ns[1]:ns[2], :, 0] = 0.0
    ns_t = torch.tensor(ns, dtype=torch.int32)
    if stale:
        ns_t[1] = ns_t[2] + 2          # request 0 longer than planned, request 1 decreasing (empty range)
        ns_t[-1] = rows + 50           # last request past the accumulators (clamped)
        if b > 3:
            ns_t[3] = -4               # negative start
    return o, lacc, ns_t.to(device)


def _launch(o, lacc, ns, b, s_q, h_q, layout, device, **kw):
    out = torch.full((b, s_q, h_q, o.shape[-1]), float("nan"), dtype=torch.bfloat16, device=device)
    if layout == "dense":
        lse = torch.full((b, h_q, s_q), float("nan"), device=device)
    else:   # the sparse path's lse: the transposed view of a contiguous [b, s_q, h_q]
        lse = torch.full((b, s_q, h_q), float("nan"), device=device).transpose(1, 2)
    combine_splits_(out, lse, o, lacc, ns, **kw)
    return out, lse


def _sink(h_q, device):
    s = torch.randn(h_q, device=device) * 4
    s[0], s[1 % h_q] = float("inf"), float("-inf")
    return s


def check_fast_equals_current(device, b, s_q, h_q, counts, layout, sink, all_requests, stale, lengths_kind,
                              configs=CONFIGS, pdl=(False,)):
    o, lacc, ns = random_partials(b, s_q, h_q, counts, device, stale=stale)
    kw = dict(all_requests=all_requests, rne=device == "cpu")
    if sink:
        kw["attn_sink"] = _sink(h_q, device)
    if lengths_kind == "dense":
        kw.update(lengths=torch.randint(0, 3, (b,), dtype=torch.int32, device=device), causal=s_q > 1)
    elif lengths_kind == "sparse":
        kw.update(lengths=torch.randint(-1, 3, (b,), dtype=torch.int32, device=device), topk=2,
                  extra_lengths=torch.randint(-1, 2, (b,), dtype=torch.int32, device=device), extra_topk=1)
    ref = _launch(o, lacc, ns, b, s_q, h_q, layout, device, fast=False, **kw)
    for cfg in configs:
        for p in pdl:
            got = _launch(o, lacc, ns, b, s_q, h_q, layout, device, fast=True, pdl=p, fast_config=cfg, **kw)
            assert same_bits(got[0], ref[0]), f"out differs: {cfg} pdl={p}"
            assert same_bits(got[1], ref[1]), f"lse differs: {cfg} pdl={p}"
    assert torch.isfinite(ref[0].float()).any() and torch.isfinite(ref[1]).any()     # something was combined
    return ref


# counts: 0 (no split: padded num_splits), 1, 2 (the straight-line step at ch >= 2), 3-4, 5-40 (the looped steps)
INTERP_CASES = [
    # id, b, s_q, h_q, counts, layout, sink, all_requests, stale, lengths
    ("dense_small", 5, 1, 16, [2, 1, 3, 0, 2], "dense", False, False, False, "dense"),
    ("dense_causal_many", 4, 2, 10, [7, 2, 40, 4], "dense", False, False, False, "dense"),
    ("sparse_sink", 5, 2, 12, [1, 2, 5, 0, 3], "sparse", True, False, False, "sparse"),
    ("sparse_sink_all", 4, 1, 16, [1, 1, 2, 9], "sparse", True, True, False, "sparse"),
    ("stale_num_splits", 5, 2, 8, [3, 2, 4, 1, 6], "dense", True, True, True, None),
    ("h3_odd", 3, 3, 3, [2, 17, 4], "sparse", False, False, False, None),
]


@pytest.mark.interpret
@pytest.mark.parametrize("case", INTERP_CASES, ids=lambda c: c[0])
def test_interpret_fast_bit_identical(case):
    _, b, s_q, h_q, counts, layout, sink, allr, stale, lk = case
    check_fast_equals_current("cpu", b, s_q, h_q, counts, layout, sink, allr, stale, lk)


@pytest.mark.interpret
def test_interpret_random_split_counts():
    """Split counts 0..40 drawn at random, every layout / sink / all_requests combination, default config + ch 1/4."""
    g = torch.Generator().manual_seed(torch.initial_seed() % 2 ** 31)
    for i, (layout, sink, allr) in enumerate([("dense", False, False), ("sparse", True, False),
                                               ("sparse", True, True), ("dense", True, True)]):
        b = 4
        counts = torch.randint(0, 41, (b,), generator=g).tolist()
        counts[i % b] = 2
        check_fast_equals_current("cpu", b, 1 + i % 2, 8 + 4 * i, counts, layout, sink, allr, i == 3,
                                  "dense" if layout == "dense" else "sparse",
                                  configs=[FastCombineConfig(), FastCombineConfig(8, 4, 1),
                                           FastCombineConfig(8, 4, 4)])


@pytest.mark.interpret
def test_interpret_module_switch_and_pdl_ignored_under_interpreter():
    """set_fast_combine routes calls without fast= to the fast kernel; pdl is ignored under the interpreter (no
    inline asm there) and the results stay the current kernel's."""
    b, s_q, h_q = 3, 1, 8
    o, lacc, ns = random_partials(b, s_q, h_q, [2, 3, 1], "cpu")
    ref = _launch(o, lacc, ns, b, s_q, h_q, "dense", "cpu", rne=True)
    prev = comb.set_fast_combine(True, pdl=True)
    try:
        assert comb.fast_combine_settings()[:2] == (True, True)
        got = _launch(o, lacc, ns, b, s_q, h_q, "dense", "cpu", rne=True)
        off = _launch(o, lacc, ns, b, s_q, h_q, "dense", "cpu", rne=True, fast=False)
    finally:
        comb.set_fast_combine(*prev)
    assert comb.fast_combine_settings() == prev
    assert same_bits(got[0], ref[0]) and same_bits(got[1], ref[1])
    assert same_bits(off[0], ref[0]) and same_bits(off[1], ref[1])


def test_config_validation():
    with pytest.raises(ValueError):
        FastCombineConfig(heads=6)
    with pytest.raises(ValueError):
        FastCombineConfig(ch=5)
    with pytest.raises(ValueError):
        FastCombineConfig(num_warps=3)
    with pytest.raises(ValueError):
        FastCombineConfig(rows=0)
    # on by default since its device run (session 21); DEEPKERNELS_FAST_COMBINE=0 keeps the current kernel; PDL off
    import os
    on, pdl, _ = comb.fast_combine_settings()
    assert on is (os.environ.get("DEEPKERNELS_FAST_COMBINE", "1") != "0") and pdl is False


# ------------------------------------------------------------------ compile tier (sm90, CPU)
_SIG = dict(oacc_ptr="*fp32", lacc_ptr="*fp32", nsplits_ptr="*i32", out_ptr="*bf16", lse_ptr="*fp32",
            sink_ptr="*fp32", len_ptr="*i32", s_q="i32", h_q="i32", acc_rows="i32", xlen_ptr="*i32", topk="i32",
            xtopk="i32", n_rows="i32")


@pytest.mark.compile
@pytest.mark.parametrize("cfg,pdl,flags", [
    (FastCombineConfig(), False, dict(HAS_LEN=True, CAUSAL=True)),
    (FastCombineConfig(), True, dict(HAS_LEN=True, CAUSAL=True)),
    (FastCombineConfig(), True, dict(HAS_SINK=True, HAS_LEN=True, LSE_SHQ=True, TOPK_LEN=True)),
    (FastCombineConfig(8, 4, 1), False, dict(HAS_LEN=True)),
    (FastCombineConfig(16, 8, 2), False, dict(HAS_LEN=True)),
    (FastCombineConfig(8, 8, 4), False, dict(HAS_SINK=True, HAS_LEN=True, LSE_SHQ=True, TOPK_LEN=True)),
    (FastCombineConfig(8, 4, 2, 4), True, dict(HAS_LEN=True, CAUSAL=True)),
], ids=lambda x: str(x))
def test_compile_fast_combine(cfg, pdl, flags):
    from deepkernels.testing.compile import compile_sm90, ptxas_sm90_or_skip
    c = compile_sm90(comb._mla_decode_combine_fast_kernel, _SIG,
                     dict(D_V=512, HEADS=cfg.heads, CH=cfg.ch, ROWS=cfg.rows, PDL=pdl, **flags),
                     num_warps=cfg.num_warps, launch_pdl=pdl)
    assert not c.uses_local_memory
    assert ("griddepcontrol.wait" in c.ptx) == pdl
    rep = ptxas_sm90_or_skip(c.ptx)
    assert rep.spills in (None, (0, 0)), rep.log
    regs = int(re.search(r"Used (\d+) registers", rep.log).group(1))
    assert regs <= 232, regs                 # measured 96-221 across these configs (s21)


# ------------------------------------------------------------------ GPU tier
GPU_CASES = [
    ("dense_b64", 64, 1, 64, None, "dense", False, False, False, "dense"),
    ("dense_s2", 32, 2, 128, None, "dense", False, False, False, "dense"),
    ("sparse_sink", 64, 2, 128, None, "sparse", True, False, False, "sparse"),
    ("sparse_all", 16, 1, 64, None, "sparse", True, True, False, "sparse"),
    ("stale", 12, 2, 16, None, "dense", True, True, True, None),
    ("odd_heads", 9, 3, 9, None, "sparse", False, False, False, None),
]


# test ids: "plain" (fast combine, no PDL) / "pdl" (PDL launch): the device script gates the bench on -k "not pdl"
PDL_IDS = dict(argnames="pdl", argvalues=[False, True], ids=["plain", "pdl"])


@pytest.mark.gpu
@pytest.mark.parametrize(**PDL_IDS)
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c[0])
def test_gpu_fast_bit_identical(case, pdl):
    _, b, s_q, h_q, _c, layout, sink, allr, stale, lk = case
    counts = torch.randint(0, 41, (b,)).tolist()
    counts[: b // 2] = torch.randint(0, 4, (b // 2,)).tolist()      # the common 0-3 split requests too
    check_fast_equals_current("cuda", b, s_q, h_q, counts, layout, sink, allr, stale, lk,
                              configs=CONFIGS if not pdl else CONFIGS[:1], pdl=(pdl,))


@pytest.mark.gpu
def test_gpu_pdl_after_producer_and_graph_capture():
    """PDL launch right after the kernel that writes the partials (a torch copy): results identical to the current
    kernel's, eager and replayed from a CUDA graph (partials rewritten between replays)."""
    b, s_q, h_q = 64, 2, 64
    counts = torch.randint(0, 5, (b,)).tolist()
    o, lacc, ns = random_partials(b, s_q, h_q, counts, "cuda")
    src_o, src_l = o.clone(), lacc.clone()
    sink = _sink(h_q, "cuda")
    lens = torch.randint(0, 3, (b,), dtype=torch.int32, device="cuda")
    kw = dict(attn_sink=sink, lengths=lens, causal=True)
    ref = _launch(src_o, src_l, ns, b, s_q, h_q, "dense", "cuda", fast=False, **kw)
    out = torch.full_like(ref[0], float("nan"))
    lse = torch.full_like(ref[1], float("nan"))

    def step():
        o.copy_(src_o)                   # the producer of the partials, right before the dependent launch
        lacc.copy_(src_l)
        combine_splits_(out, lse, o, lacc, ns, fast=True, pdl=True, **kw)

    o.zero_()
    lacc.fill_(float("-inf"))
    step()
    torch.cuda.synchronize()
    assert same_bits(out, ref[0]) and same_bits(lse, ref[1])
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(3):
            step()
    for _ in range(2):
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        o.zero_()
        lacc.fill_(float("-inf"))
        g.replay()
        torch.cuda.synchronize()
        assert same_bits(out, ref[0]) and same_bits(lse, ref[1])
    launchers = [v for (fn, _k), v in comb._LAUNCHERS.items() if fn is comb._mla_decode_combine_fast_kernel]
    assert any(v.fast_calls for v in launchers) and any(v.meta.get("launch_pdl") for v in launchers)


@pytest.fixture
def poison_all():
    import deepkernels.mla.decode as dec
    import deepkernels.mla.sparse_decode as sd
    dec._POISON_OUTPUTS = sd._POISON_OUTPUTS = True
    yield
    dec._POISON_OUTPUTS = sd._POISON_OUTPUTS = False


def _public_both(call, monkeypatch, pdl):
    """``call()`` with the module-wide switch off, then on (PDL as given), each on fresh outputs."""
    res = []
    for on, pdl in ((False, False), (True, pdl)):
        monkeypatch.setitem(comb._FAST, "on", on)
        monkeypatch.setitem(comb._FAST, "pdl", pdl)
        o, l_ = call()
        if o.is_cuda:
            torch.cuda.synchronize()
        res.append((o.clone(), l_.clone()))
    return res


@pytest.mark.gpu
@pytest.mark.parametrize(**PDL_IDS)
@pytest.mark.parametrize("b,s_q,h_q,s_k,varlen", [(128, 1, 64, 4096, True), (2, 2, 128, 20000, False)])
def test_gpu_public_dense_fast_vs_current(b, s_q, h_q, s_k, varlen, pdl, poison_all, monkeypatch):
    import deepkernels as dk
    from test_mla_decode_reference import make_case
    if varlen:
        sl = torch.clamp(torch.normal(float(s_k), s_k / 2, (b,)), min=s_q).int().tolist()
        sl[0] = 0
    else:
        sl = [s_k] * b
    q, k, bt, sl_t = make_case(b, s_q, h_q, 1, sl, device="cuda")
    meta, _ = dk.get_mla_metadata()
    res = _public_both(lambda: dk.flash_mla_with_kvcache(q, k, bt, sl_t, 512, meta, causal=s_q > 1), monkeypatch,
                       pdl)
    for o, l_ in res[1:]:
        assert same_bits(o, res[0][0]) and same_bits(l_, res[0][1])
    fin = res[0][0][sl_t > 0]
    assert not torch.isnan(fin).any()
    launchers = [v for (fn, _k), v in comb._LAUNCHERS.items() if fn is comb._mla_decode_combine_fast_kernel]
    assert launchers, "the fast combine never ran"


@pytest.mark.gpu
@pytest.mark.parametrize(**PDL_IDS)
@pytest.mark.parametrize("fmt,xfmt,b,s_q,h_q,topk,sink", [("v32", None, 64, 1, 128, 2048, False),
                                                          ("v41", "fp4", 74, 2, 64, 576, True)])
def test_gpu_public_sparse_fast_vs_current(fmt, xfmt, b, s_q, h_q, topk, sink, pdl, poison_all, monkeypatch):
    from test_mla_sparse_reference import _public, make_case
    x = dict(xfmt=xfmt, xtopk=128, xpage=64) if xfmt else {}
    kw = make_case(b, s_q, h_q, fmt, topk, 4096, 64, with_len=fmt != "v32", with_xlen=xfmt is not None, sink=sink,
                   device="cuda", **x)
    res = _public_both(lambda: _public(kw), monkeypatch, pdl)
    for o, l_ in res[1:]:
        assert same_bits(o, res[0][0]) and same_bits(l_, res[0][1])
    assert not torch.isnan(res[0][0]).any()


@pytest.mark.gpu
@pytest.mark.parametrize(**PDL_IDS)
def test_gpu_public_dense_graph_capture(pdl, monkeypatch):
    """The public dense call captured in a CUDA graph with the fast combine (+ PDL): replay equals the eager current
    call bit for bit."""
    import deepkernels as dk
    from test_mla_decode_reference import make_case
    b, s_q, h_q = 16, 2, 128
    sl = torch.clamp(torch.normal(3000.0, 1500.0, (b,)), min=s_q).int().tolist()
    q, k, bt, sl_t = make_case(b, s_q, h_q, 1, sl, device="cuda")
    meta, _ = dk.get_mla_metadata()
    o_ref, l_ref = dk.flash_mla_with_kvcache(q, k, bt, sl_t, 512, meta, causal=True)
    o_ref, l_ref = o_ref.clone(), l_ref.clone()
    monkeypatch.setitem(comb._FAST, "on", True)
    monkeypatch.setitem(comb._FAST, "pdl", pdl)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        dk.flash_mla_with_kvcache(q, k, bt, sl_t, 512, meta, causal=True)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o, l_ = dk.flash_mla_with_kvcache(q, k, bt, sl_t, 512, meta, causal=True)
    o.fill_(float("nan"))
    l_.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert same_bits(o, o_ref) and same_bits(l_, l_ref)
