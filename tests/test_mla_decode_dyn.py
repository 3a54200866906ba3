"""DYN_QUEUE option of the Gluon dense MLA decode (session 21; launcher keyword ``dyn_queue``, constexpr DYN_QUEUE,
off by default, not dispatched; notes ``benchmarks/notes/mla_decode_dyn.md``): min(items, SMs) persistent CTAs take
the schedule's work items (part, kv head, row block) from a global atomic counter; same records, same math.

Compile tier (CPU): option-off PTX is pinned by tests/test_mla_decode_timeline.py (14 hashes); here the dyn build of
every dispatched configuration compiles within shared memory, 168 registers, no serialised wgmma, the same wgmma
counts, the counter atomic present, and no new spill instruction in the tile loops (except the PVR builds' softmax
loop, <= 2: measured, documented). Launch arguments (kernel stubbed, CPU). GPU tier: out / lse / accumulators
bit-identical to the static launch of the same schedule on NaN-poisoned outputs (h_q 16 / 32 / 64 / 128, s_q 1 / 2
causal, split and non-split pieces, zero-length requests, 2-8 parts per SM, few CTAs = many items per CTA), the
counter back at 0 after each launch, and a CUDA graph (launch + combine) replayed 3 times with changed seqlens.
"""
from __future__ import annotations

import functools
import os
import re
import sys

import pytest
import torch

from deepkernels.mla import _gluon_dense_decode as G
from deepkernels.testing.compile import SM90_SMEM_LIMIT, n_hgmma, n_spill, ptxas_sm90_or_skip, sass_count, sass_loops

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks"))
import mla_decode_timeline as TLB  # noqa: E402

needs_gluon = pytest.mark.skipif(not G.available(), reason=f"gluon not importable: {G._IMPORT_ERROR!r}")
_ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
needs_sm90 = pytest.mark.skipif(not (_ON_GPU and G.available() and torch.cuda.get_device_capability()[0] == 9),
                                reason="needs an sm90 GPU and Gluon")

# (half, q_tma, trim, pvr, causal): the dispatched builds (h_q 16 / 32: plain; h_q 64: q_tma + trim, half tiles at
# s_q 2; h_q 128: PVR + q_tma + trim)
_BUILDS = [(False, False, False, False, False), (False, False, False, False, True), (False, True, True, False, False),
           (True, True, True, False, True), (False, True, True, True, False), (False, True, True, True, True)]


# ------------------------------------------------------------------ compile tier
@functools.lru_cache(maxsize=None)
def _build(cfg, dyn):
    half, qt, trim, pvr, causal = cfg
    c = G._compile_sm90(None, causal, "bf16", half, qt, trim, pvr=pvr, dyn_queue=dyn)
    rep = ptxas_sm90_or_skip(c.asm["ptx"], sass=True, cached=True, reason="no bundled ptxas/nvdisasm")
    loops = sass_loops(rep.sass)
    prof = sorted((n_hgmma(lp), sass_count(lp, r"UTMALDG"), n_spill(lp)) for lp in loops
                  if n_hgmma(lp) or sass_count(lp, r"UTMALDG"))
    return c.asm["ptx"], c.metadata.shared, rep, prof


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("cfg", _BUILDS, ids=lambda c: "h%dq%dt%dp%dc%d" % tuple(map(int, c)))
def test_dyn_builds(cfg):
    ptx0, sh0, rep0, prof0 = _build(cfg, False)
    ptx, sh, rep, prof = _build(cfg, True)
    assert sh <= SM90_SMEM_LIMIT and sh - sh0 <= 128, (sh0, sh)
    for pat in ("wgmma.mma_async.sync.aligned.m64n64k16", "wgmma.mma_async.sync.aligned.m64n256k16"):
        assert ptx.count(pat) == ptx0.count(pat), pat
    assert "atom.global.add.u32" in ptx and "atom.global.add.u32" not in ptx0
    assert "C7514" not in rep.log, "ptxas serialised the wgmmas"
    assert re.search(r"Used 168 registers", rep.log), rep.log
    print(f"{cfg}: smem {sh0} -> {sh}; spill bytes {rep0.spill_bytes} -> {rep.spill_bytes}; tile loops (hgmma, "
          f"utmaldg, spill instr) {prof0} -> {prof}")
    # same tile loops (HGMMA / UTMALDG counts); spill instructions in them: none new, except the PVR builds'
    # softmax loop (measured: 0 -> 2, the item loop's counters; notes)
    assert [p[:2] for p in prof] == [p[:2] for p in prof0] or cfg[0], (prof0, prof)
    cap = {p[:2]: p[2] for p in prof0}
    for h, u, s in prof:
        allowed = cap.get((h, u), max(cap.values()) if cfg[0] else 0) + (2 if cfg[3] and h == 40 else 0)
        assert s <= allowed, (cfg, prof0, prof)


@needs_gluon
def test_dyn_launch_arguments(monkeypatch):
    """dyn_queue goes by position (dyn_ptr, n_items, DYN_QUEUE after sm_scale_log2), with a grid of min(items,
    dyn_ctas) CTAs and the item count = the static grid; off: as before (None, None, False); bad arguments raise."""
    from test_mla_decode_gluon_ring import launch_case as case, stub_launches
    fn = stub_launches(monkeypatch)
    names = [p.name for p in fn.params]
    i = names.index("sm_scale_log2")
    assert names[i + 1: i + 5] == ["dyn_ptr", "n_items", "DYN_QUEUE", "qn_desc"]
    G.gluon_dense_launch(*case())
    x = fn.full_args(fn.log[-1])
    assert (x[i + 1], x[i + 2], x[i + 3]) == (None, None, False)
    ctr = torch.zeros(1, dtype=torch.int32)
    for h_q, ctas, grid in ((128, 3, 3), (128, 100, 8), (16, 2, 2)):          # launch_case: 4 parts
        G.gluon_dense_launch(*case(h_q=h_q), dyn_queue=True, dyn_ctas=ctas, dyn_counter=ctr)
        e = fn.log[-1]
        x = fn.full_args(e)
        assert len(x) == len(fn.params)
        assert x[i + 1] is ctr and x[i + 2] == 4 * (2 if h_q == 128 else 1) and x[i + 3] is True
        assert e[1][0] == grid          # slow ("slow", grid, ...) and fast ("fast", grid xyz, ...) launches
        if h_q == 16:       # plain build + the queue: every other option off
            assert not any(x[names.index(n)] for n in ("PVR", "HALF", "QTMA", "TRIM", "EPI_NSP", "TIMELINE"))
        else:
            assert x[names.index("PVR")] is G.DISPATCH_PVR
    G.gluon_dense_launch(*case(), dyn_queue=True, dyn_ctas=5)                  # default counter (one per device)
    assert fn.full_args(fn.log[-1])[i + 1] is G._dyn_counter(torch.device("cpu"))
    with pytest.raises(ValueError):
        G.gluon_dense_launch(*case(), dyn_queue=True, dyn_counter=torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError):
        G.gluon_dense_launch(*case(), dyn_queue=True, dyn_ctas=0)
    with pytest.raises(ValueError):
        G.gluon_dense_launch(*case(), dyn_queue=True, timeline=torch.zeros(8, G.TL_WORDS, dtype=torch.int64))


def test_dyn_parts():
    assert G.dyn_parts("cpu", 16, 1, 2) == G._dyn_num_ctas("cpu") * 2
    assert G.dyn_parts("cpu", 128, 1, 3) == max(G._dyn_num_ctas("cpu") * 3 // 2, 1)
    with pytest.raises(ValueError):
        G.dyn_parts("cpu", 16, 1, 0)


# ------------------------------------------------------------------ gpu tier
# (h_q, s_q, b, mean s_k, parts per SM (None: decode._num_sm_parts, the static launch's), dyn CTAs (None: one per
# SM), zero-length requests)
GPU_CASES = [(16, 1, 48, 3000, None, None, True), (32, 1, 48, 3000, None, None, False),
             (16, 2, 48, 3000, None, None, True), (32, 2, 32, 2000, 4, None, True),
             (16, 1, 80, 300, 3, None, True), (16, 1, 8, 5000, 8, None, False),
             (64, 1, 32, 1500, None, None, True), (64, 2, 32, 1500, 2, None, False),
             (128, 1, 32, 1500, None, None, True), (128, 2, 32, 1500, None, None, False),
             (128, 1, 40, 1000, 4, None, True), (16, 1, 64, 2000, 4, 3, True), (128, 2, 16, 1200, 2, 5, False)]


@functools.lru_cache(maxsize=None)
def _gpu_case(h_q, s_q, b, s_k, per_sm, ctas, zero):
    import deepkernels.mla.decode as dec
    from deepkernels.mla.metadata import compute_schedule
    q, k, bt, sl, _ = TLB.make_case(b, s_q, h_q, s_k, seed=11 * h_q + s_q + b)
    if zero:
        sl[1] = 0           # zero-length requests (out 0, lse +inf), a one-token one
        sl[5] = 0
        sl[2] = 1
    parts = dec._num_sm_parts(q.device, s_q * h_q, 1) if per_sm is None else G.dyn_parts(q.device, s_q * h_q, 1,
                                                                                          per_sm)
    sched, ns = compute_schedule(sl, parts)
    return q, k, bt, sl, sched, ns, parts


def _same(o0, o1):
    for name, a, c in zip(("out", "lse", "o_acc", "l_acc"), o0, o1):
        assert torch.equal(a.isnan(), c.isnan()), name                 # same elements written
        assert torch.equal(a.nan_to_num(1234.5), c.nan_to_num(1234.5)), name


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda v: "h%d_sq%d_b%d_sk%d_ps%s_c%s_z%d" % v)
def test_gpu_dyn_bitid(case):
    q, k, bt, sl, sched, ns, parts = _gpu_case(*case)
    s_q = q.shape[1]
    causal = s_q > 1
    ctr = torch.zeros(8, dtype=torch.int32, device="cuda")   # slot 4 (16-B aligned: the default's specialisation)
    scale = 576 ** -0.5
    o0 = TLB.alloc_outs(q, parts, poison=True)
    G.gluon_dense_launch(q, k, bt, sl, sched, ns, scale, causal, *o0)            # the static (dispatched) build
    for rep in range(2):                                                           # twice: the counter was reset
        o1 = TLB.alloc_outs(q, parts, poison=True)
        G.gluon_dense_launch(q, k, bt, sl, sched, ns, scale, causal, *o1, dyn_queue=True, dyn_ctas=case[5],
                             dyn_counter=ctr[4:5])
        torch.cuda.synchronize()
        assert ctr.tolist() == [0] * 8, (rep, ctr.tolist())     # reset, neighbours untouched
        _same(o0, o1)
    nsp = (ns[1:] - ns[:-1]).cpu()
    single = (nsp <= 1).nonzero().flatten().tolist()
    assert not o1[0][single].isnan().any() and not o1[1][single].isnan().any()
    if case[6] and int(nsp[1]) == 1:
        assert (o1[0][1] == 0).all() and torch.isinf(o1[1][1]).all()
    print(f"{case}: parts {parts}, split requests {int((nsp > 1).sum())}, items "
          f"{parts * -(-s_q * q.shape[2] // 64)}")


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("h_q,s_q", [(16, 1), (32, 2), (128, 1)])
def test_gpu_dyn_cuda_graph(h_q, s_q):
    """Launch + combine with dyn_queue (default counter) captured in a CUDA graph; 3 replays with other seqlens
    (same, now stale, schedule: the kernels clamp to the actual lengths) each bit-identical to an eager static launch
    of the same inputs; the counter zero after every replay (the kernel resets it: no memset in the graph)."""
    from deepkernels.mla.combine import combine_splits_
    q, k, bt, sl, sched, ns, parts = _gpu_case(h_q, s_q, 48, 2500, 3 if h_q < 64 else None, None, True)
    causal = s_q > 1
    scale = 576 ** -0.5
    sl = sl.clone()
    o1 = TLB.alloc_outs(q, parts, poison=True)

    def step(o, dyn):
        G.gluon_dense_launch(q, k, bt, sl, sched, ns, scale, causal, *o, dyn_queue=dyn)
        combine_splits_(o[0], o[1], o[2], o[3], ns, lengths=sl, causal=causal)

    step(o1, True)                            # compile + warm (and the default counter allocated outside capture)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(o1, True)
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        step(o1, True)
    torch.cuda.synchronize()
    ctr = G._dyn_counter(q.device)
    orig = sl.cpu()
    gen = torch.Generator().manual_seed(h_q + s_q)
    for r in range(3):
        # at most the original lengths (the cache holds NaN past them), some zero, one at full length
        new = (torch.rand(q.shape[0], generator=gen) * (orig + 1).float()).to(torch.int32).clamp_(max=orig)
        new[r] = 0
        new[r + 3] = orig[r + 3]
        sl.copy_(new)
        for t in o1:
            t.fill_(float("nan"))
        g.replay()
        o0 = TLB.alloc_outs(q, parts, poison=True)
        step(o0, False)
        torch.cuda.synchronize()
        assert int(ctr.item()) == 0, r
        for a, c in zip(o0[:2], o1[:2]):          # out / lse after the combine (NaN-aware: same elements)
            assert torch.equal(a.isnan(), c.isnan()) and torch.equal(a.nan_to_num(1234.5), c.nan_to_num(1234.5)), r
        print(f"h_q {h_q} s_q {s_q} replay {r}: NaN in out {int(o1[0].isnan().sum())}, lse {int(o1[1].isnan().sum())}")


def test_dyn_bench_cli_cpu(tmp_path, capsys):
    """The bench's argument parsing, variant schedules, its no-CUDA path and its printer (what the device script
    calls)."""
    import mla_decode_dyn as DB
    a = DB.parse_args([str(tmp_path / "x.json"), "--rounds", "3", "--only-shapes", "16:1:4096", "--variants",
                       "dyn_same,dyn3"])
    assert a.rounds == 3 and a.variants == "dyn_same,dyn3"
    assert set(DB.VARIANTS) == {"dyn_same", "dyn2", "dyn3", "dyn4"}
    per = {2: 264, 3: 396, 4: 528}
    assert DB.variant_parts(264, per.get, list(DB.VARIANTS)) == {"dyn_same": 264, "dyn3": 396, "dyn4": 528}
    assert DB.variant_parts(66, {2: 132, 3: 198, 4: 264}.get, list(DB.VARIANTS)) == \
        {"dyn_same": 66, "dyn2": 132, "dyn3": 198, "dyn4": 264}
    assert DB.variant_parts(264, per.get, ["dyn2"]) == {"dyn2": 264}
    assert len(DB.SHAPES) == 14 and (128, 1, 32768) in DB.SHAPES
    if not torch.cuda.is_available():
        assert DB.main(a) == 0
    st = dict(ms=0.18, gbps=3300.0, paired_time_ratio_median=0.95, paired_time_ratio_min=0.94,
              paired_time_ratio_max=0.96)
    DB._print_row(dict(h_q=16, s_q=1, s_k=4096, static_parts=264, variant_parts={"dyn_same": 264, "dyn3": 396},
                       bit_identical={"dyn_same": True, "dyn3": False},
                       timing={"static": st, "static_again": st, "dyn_same": st, "dyn3": st}))
    DB._print_row(dict(h_q=16, s_q=1, s_k=4096, failed="x"))
    out = capsys.readouterr().out
    assert "SUMMARY h_q= 16" in out and "A/A 0.950" in out and "dyn3(396) 0.950" in out and "NOT-BITID" in out
    assert "FAILED" in out
