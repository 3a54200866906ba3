"""The TRIM option of the Gluon dense MLA decode (``deepkernels.mla._gluon_dense_decode``, launcher keyword ``trim``,
constexpr TRIM, :data:`~deepkernels.mla._gluon_dense_decode.DISPATCH_TRIM` off; session 19): the softmax warpgroup
masks only tiles that can hold a masked token (scalar branch ``t0 + 64 > lim_lo``) and folds the scale into one FFMA
per score (``exp2(s * c - m_new * c)``).

- compile tier (CPU cross-compile for sm90): with trim off every half_tiles / q_tma combination's cleaned PTX is
  byte-identical to the build before the option existed (hashes taken at git 12dc192, Triton 3.6.0, both dtypes,
  causal and not); with trim on: same shared memory / wgmma / barriers / 168 registers, the mask is one block that a
  forward branch skips, 32 FMUL + 32 FADD fewer and 32+ FFMA more in the softmax loop, the full-tile path of the
  softmax loop at least 85 instructions (per warp and tile) shorter than the option-off loop, the math section
  (last S HGMMA .. P STSM) at least 80 shorter, no spill instruction on the full-tile path of the softmax or PV loop;
  the launcher passes TRIM by position and keys it apart (kernel stubbed, CPU tensors).
- gpu tier: trim off and on on the same inputs and schedule, each against ``deepkernels.reference.mla.dense_decode``
  with FlashMLA's tolerances (tests/test_mla_decode_gluon.py), and on vs off within 2 ulp of the output dtype
  (out) / 1e-5 relative (lse), identical +inf pattern; empty rows / zero-length requests give out 0, lse +inf.
  Lengths 0 / 1 / 2 / 63 / 64 / 65 / 127 / 129 / ..., varlen, causal s_q 2, h_q 16 / 64 / 128 (and h_kv 2),
  bf16 / fp16, NaN in every unused KV slot (``make_case``), NaN-poisoned outputs, every half_tiles / q_tma
  combination, split requests, a stale schedule, softmax scales, huge logits, a padded q row pitch.
"""
import functools
import hashlib
import os
import re

import pytest
import torch

import deepkernels.mla.decode as dec
from deepkernels.mla import _gluon_dense_decode as G
from deepkernels.reference import mla as ref
from deepkernels.testing.compile import (SM90_SMEM_LIMIT, clean_ptx, n_hgmma, n_spill, ptxas_sm90_or_skip,
                                        sass_count, sass_loops)
from deepkernels.testing.numerics import check_is_allclose

from test_mla_decode_reference import make_case
from test_mla_decode_gluon import TOL_OUT, TOL_LSE, _case

needs_gluon = pytest.mark.skipif(not G.available(), reason=f"gluon not importable: {G._IMPORT_ERROR!r}")
_ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
needs_sm90 = pytest.mark.skipif(not (_ON_GPU and G.available() and torch.cuda.get_device_capability()[0] == 9),
                                reason="needs an sm90 GPU and Gluon")

COMBOS = [(False, True), (True, True), (False, False), (True, False)]     # (half_tiles, q_tma); first two dispatched
CID = "h{:d}q{:d}".format


# ------------------------------------------------------------------ compile tier
# sha256 of the cleaned PTX of every (half_tiles, q_tma, causal, dtype) build before TRIM existed (git 12dc192,
# Triton 3.6.0, sm_90a, GLUON_DEFAULT): with trim off each must stay byte-identical.
_PTX_SHA_BEFORE = {
    (False, False, False, "bf16"): "44b1660e2ae43c4303698804d0522b3ef40f376ae29d08837fbf7b77c0c5eef8",
    (False, False, False, "fp16"): "f27ebc96d19c02c9008e320dfec25036776f59e300ebf0977f37596387ed8b99",
    (False, False, True, "bf16"): "5a0c2050eef53d97202ee2ce9af456165c48d61c5d8c50990420d4ee3bfb7ce9",
    (False, False, True, "fp16"): "9ce893ed1ad8f2c6c42a9db1d9296de9bc51b53c28af33b83e0109cd20f0a30b",
    (True, True, False, "bf16"): "e3aa1f8b6e197b87863bd4c846abcada13ca64a86b26d67ee1000d2d59abb412",
    (True, True, False, "fp16"): "152aa46c290d8cb61c023f3b279e68e17b3af9d57f477b719a8833948746cc6b",
    (True, True, True, "bf16"): "bee9858e6845ed9b9cfb4216741c7b41ce99b29b150e5587d72ccf8ecd668d87",
    (True, True, True, "fp16"): "01661fa74a76c76544e77ab014c347e92d8b27e0ba1e32c6f4535a69b5c360d7",
    (True, False, False, "bf16"): "eb40238cbe6f1c426ef43f92a8d74e8adba6b521df1e25ea0d4e489e0e32844f",
    (True, False, False, "fp16"): "e461eefc8a65e751bd2f034c4076b2e42d1974f13455191d7bff9c7dc1c06097",
    (True, False, True, "bf16"): "1d9c42e919336d98f40d0b2d671c00b17aa2df5242181ec60c0deedffd03a84e",
    (True, False, True, "fp16"): "e74e1a0dbf93e7a0b9471c570fc2c0aff4a81281fd7b3f5849dbae3ce27f613c",
    (False, True, False, "bf16"): "c51fc182d4450179a51d5842bbc13b76a3a3f91b1a017be30fa7b69cfc839613",
    (False, True, False, "fp16"): "5735a69d8f2e4e5f8356a698c6bc0956fc877a44efc05951be20ea0ead348850",
    (False, True, True, "bf16"): "2be0c5b66144d244cb8c4d24407f2f9496ee3d95b680016bc08865ab6057dcb1",
    (False, True, True, "fp16"): "203e2553367685311f22d5064b215c906b4d8ca0d5f998a1dcee34527394caca",
}
# measured ptxas spill store bytes with trim on (Triton 3.6.0 wheel's ptxas; off: 0 / 4 (q_tma), 0 / 20 (half +
# q_tma), 32 / 12 (plain), 56 / 60 (half)) per (half, q_tma, causal); all outside the full-tile path of the loops
_SPILL_BYTES_TRIM = {(False, True, False): 16, (False, True, True): 16, (True, True, False): 20,
                     (True, True, True): 24, (False, False, False): 24, (False, False, True): 28,
                     (True, False, False): 52, (True, False, True): 56}


@functools.lru_cache(maxsize=None)
def _compiled(half, qt, causal, trim, dtype="bf16"):
    c = G._compile_sm90(None, causal, dtype, half, qt, trim)
    return c.asm["ptx"], int(c.metadata.shared)


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("half,qt", COMBOS, ids=lambda v: str(v))
def test_trim_off_ptx_unchanged(half, qt, causal, dtype):
    import triton
    if triton.__version__ != "3.6.0":
        pytest.skip(f"hashes taken with Triton 3.6.0, not {triton.__version__}")
    ptx, _ = _compiled(half, qt, causal, False, dtype)
    assert hashlib.sha256(clean_ptx(ptx).encode()).hexdigest() == _PTX_SHA_BEFORE[(half, qt, causal, dtype)]


def _soft_loop_items(sass):
    """The softmax warpgroup's token loop (the innermost loop with more than 4 HGMMA) as ``(pc, text)`` items in
    program order, its label lines included as ``(None, label)``."""
    items = []
    for line in sass.splitlines():
        lm = re.match(r"^(\.L_x_\d+):", line)
        if lm:
            items.append((None, lm.group(1)))
            continue
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if m:
            items.append((int(m.group(1), 16), m.group(2)))
    label_pc, pending = {}, []
    for pc, t in items:
        if pc is None:
            pending.append(t)
        else:
            label_pc.update({p: pc for p in pending})
            pending = []
    loops = []
    for pc, t in items:
        m = re.search(r"BRA `\((\.L_x_\d+)\)", t) if pc is not None else None
        if m and label_pc.get(m.group(1), 1 << 62) < pc:
            loops.append((label_pc[m.group(1)], pc))
    inner = [lp for lp in loops if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]
    found = []
    for a, b in inner:
        sel, on = [], False
        for pc, t in items:
            if pc is not None:
                on = a <= pc <= b
            elif label_pc.get(t, -1) < a or label_pc.get(t, -1) > b:
                continue
            if on or (pc is None and a <= label_pc.get(t, -1) <= b):
                sel.append((pc, t))
        if n_hgmma([t for pc, t in sel if pc is not None]) > 4:
            found.append(sel)
    assert len(found) == 1, len(found)
    return found[0]


def _forward_blocks(items):
    """Index sets (into the instruction list of ``items``) of every block a predicated forward ``BRA`` skips."""
    ins_idx, k = {}, 0
    for i, (pc, _) in enumerate(items):
        if pc is not None:
            ins_idx[i] = k
            k += 1
    blocks = []
    for i, (pc, t) in enumerate(items):
        m = re.match(r"@!?U?P\d\s+BRA `\((\.L_x_\d+)\)", t) if pc is not None else None
        if not m:
            continue
        j = next((j for j in range(i + 1, len(items)) if items[j] == (None, m.group(1))), None)
        if j is not None:
            blocks.append({ins_idx[x] for x in range(i + 1, j) if x in ins_idx})
    return blocks


def _math_section(loop):
    """Instructions between the last S HGMMA (64x64x16) and the first STSM (P -> shared) of the softmax loop."""
    i0 = max(i for i, t in enumerate(loop) if "HGMMA.64x64x16" in t)
    i1 = next(i for i, t in enumerate(loop) if t.startswith("STSM"))
    return i0, i1


@pytest.mark.compile
@needs_gluon
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("half,qt", COMBOS, ids=lambda v: str(v))
def test_trim_compiles_for_sm90(half, qt, causal):
    ptx_off, shared_off = _compiled(half, qt, causal, False)
    ptx, shared = _compiled(half, qt, causal, True)
    assert shared == shared_off and shared <= SM90_SMEM_LIMIT
    for pat in ("wgmma.mma_async.sync.aligned.m64n64k16", "wgmma.mma_async.sync.aligned.m64n256k16",
                "mbarrier.init.shared", "cp.async.bulk.tensor", "wgmma.wait_group.sync.aligned", "fence.proxy.async"):
        assert ptx.count(pat) == ptx_off.count(pat), pat
    assert ptx.count("fma.rn.f32") >= ptx_off.count("fma.rn.f32") + 32
    assert ".local" not in ptx
    rep_off = ptxas_sm90_or_skip(ptx_off, sass=True, cached=True, reason="no bundled ptxas/nvdisasm")
    rep = ptxas_sm90_or_skip(ptx, sass=True, cached=True, reason="no bundled ptxas/nvdisasm")
    assert "C7514" not in rep.log, "ptxas serialised the wgmmas"
    assert re.search(r"Used 168 registers", rep.log), rep.log
    assert rep.spill_bytes <= _SPILL_BYTES_TRIM[(half, qt, causal)] + 8, rep.log
    loops = sass_loops(rep.sass)
    soft_off = [lp for lp in sass_loops(rep_off.sass) if n_hgmma(lp) > 4]
    soft = [lp for lp in loops if n_hgmma(lp) > 4]
    pv = [lp for lp in loops if n_hgmma(lp) == 4]
    prod = [lp for lp in loops if not n_hgmma(lp) and sass_count(lp, r"UTMALDG") >= 9]
    assert len(soft) == 1 and len(soft_off) == 1 and len(pv) == 1 and len(prod) == 1
    soft, soft_off = soft[0], soft_off[0]
    items = _soft_loop_items(rep.sass)
    loop = [t for pc, t in items if pc is not None]
    assert loop == soft
    # the per-element math: FADD + FMUL -> one FFMA (32 scores per thread), MUFU unchanged
    for op, d in (("FMUL", -32), ("FADD", -32)):
        assert sass_count(soft, rf"^{op}\b") <= sass_count(soft_off, rf"^{op}\b") + d, op
    assert sass_count(soft, r"^FFMA\b") >= sass_count(soft_off, r"^FFMA\b") + 32
    assert sass_count(soft, "MUFU.EX2") == sass_count(soft_off, "MUFU.EX2")
    # the mask: every FSEL .. -INF of the loop inside one block a forward branch skips
    fsel = {i for i, t in enumerate(loop) if re.match(r"FSEL .*-INF", t)}
    assert len(fsel) == 32 and sum(1 for t in soft_off if re.match(r"FSEL .*-INF", t)) == 32
    blocks = _forward_blocks(items)
    mask = [b for b in blocks if fsel <= b]
    assert mask, "mask selections not under a branch"
    mask = min(mask, key=len)
    assert len(mask) <= 100, len(mask)
    # full-tile path (the loop without the mask block) vs the option-off loop: measured -89 (q_tma) .. -174 (plain
    # causal); the math section (last S HGMMA .. P STSM): measured -86 (q_tma, s_q 1) .. -119 (half + q_tma causal)
    full = len(loop) - len(mask)
    assert full <= len(soft_off) - 85, (full, len(soft_off))
    i0, i1 = _math_section(loop)
    j0, j1 = _math_section(soft_off)
    math_on = (i1 - i0 - 1) - len([i for i in mask if i0 < i < i1])
    assert math_on <= (j1 - j0 - 1) - 80, (math_on, j1 - j0 - 1)
    # spills: none on the full-tile path of the softmax loop (outside every forward-skipped block), none in the PV
    # loop; the half-tile builds keep <= 2 in the partial-tile V zeroing block / the 40-register producer (as before)
    skipped = set().union(*blocks) if blocks else set()
    assert not [t for i, t in enumerate(loop) if i not in skipped and re.search(r"\b(STL|LDL)\b", t)]
    assert n_spill(soft) <= 2 and n_spill(pv[0]) == 0 and n_spill(prod[0]) <= 2


@needs_gluon
def test_trim_launch_arguments(monkeypatch):
    """The trim launch (kernel stubbed, CPU tensors): TRIM passed by position (after QTMA), a launcher key of its
    own, trim alone takes the variant path (plain K descriptors, no Q descriptors); trim=None takes DISPATCH_TRIM
    (on since session 19) at >= DISPATCH_MIN_ROWS rows only."""
    from test_mla_decode_gluon_ring import launch_case as case, stub_launches
    fn = stub_launches(monkeypatch)

    names = [p.name for p in fn.params]
    assert names.index("TRIM") == names.index("QTMA") + 1 and names[-5] == "TRIM"
    assert G.DISPATCH_TRIM is True                                               # dispatched since session 19
    monkeypatch.setattr(G, "DISPATCH_PVR", False)     # this test pins the TRIM / half-tile dispatch (PVR: pvr tests)
    monkeypatch.setattr(G, "DISPATCH_TRIM", False)                               # first the off default
    G.gluon_dense_launch(*case(), half_tiles=False, q_tma=False)                 # plain, trim None -> off
    full = fn.full_args(fn.log[-1])
    assert full[names.index("TRIM")] is False and full[-4:] == (False, *G.GLUON_DEFAULT)
    G.gluon_dense_launch(*case(), half_tiles=False, q_tma=False, trim=True)      # trim alone: variant path
    v = fn.full_args(fn.log[-1])
    assert len(v) == len(fn.params) and fn.log[-1][3] == dict(num_warps=4)      # all by position
    assert v[names.index("TRIM")] is True and v[names.index("HALF")] is False and v[names.index("QTMA")] is False
    assert v[names.index("qn_desc")] is None and list(v[1].block_shape) == [64, 512]
    assert v[-4:] == (False, *G.GLUON_DEFAULT)
    G.gluon_dense_launch(*case(), trim=True)                                     # dispatched Q by TMA + trim
    x = fn.full_args(fn.log[-1])
    assert x[names.index("TRIM")] is True and x[names.index("QTMA")] is G.DISPATCH_Q_TMA
    G.gluon_dense_launch(*case(), trim=True)                                     # same specialisation: fast
    assert fn.log[-1][0] == "fast"
    G.gluon_dense_launch(*case(s_q=2), trim=True)
    x = fn.full_args(fn.log[-1])
    assert x[names.index("TRIM")] is True and x[names.index("HALF")] is (2 >= G.DISPATCH_HALF_MIN_SQ)
    G.gluon_dense_launch(*case(s_q=2))                                           # trim None: off
    x = fn.full_args(fn.log[-1])
    assert x[names.index("TRIM")] is False
    keys = [k[1][0] for k in G._LAUNCHERS]
    assert sum(("TRIM", True) in k for k in keys) == 3 and len(set(G._LAUNCHERS)) == len(G._LAUNCHERS) == 5
    monkeypatch.setattr(G, "DISPATCH_TRIM", True)                                # the module default
    G.gluon_dense_launch(*case())
    assert fn.full_args(fn.log[-1])[names.index("TRIM")] is True
    G.gluon_dense_launch(*case(h_q=16))                                          # < DISPATCH_MIN_ROWS rows: off
    assert fn.full_args(fn.log[-1])[names.index("TRIM")] is False
    monkeypatch.setenv("DEEPKERNELS_DENSE_DECODE_VARIANT", "0")
    G.gluon_dense_launch(*case())
    x = fn.full_args(fn.log[-1])
    assert x[names.index("TRIM")] is False and x[names.index("QTMA")] is False


# ------------------------------------------------------------------ gpu tier
@pytest.fixture
def poison():
    dec._POISON_OUTPUTS = True
    yield
    dec._POISON_OUTPUTS = False


def _close_ulps(name, a, b, ulps=2, frac=1e-4):
    """Within ``ulps`` ulp of the output dtype (|a - b| <= ulps * eps * max(|a|, |b|) + 2^-22) except at most ``frac``
    of the elements, and none beyond FlashMLA's out tolerance (abs 8e-4 + rel 2.01/128). P is rounded to bf16 before
    P V: the FMA-rounded exponent of TRIM can flip one p's bf16 rounding, which moves the outputs it feeds by a few
    ulp (first device run, H200: 2-13 of 0.5-4 M elements beyond 2 ulp, max |d| 1.2e-4)."""
    eps = torch.finfo(a.dtype).eps
    af, bf = a.float(), b.float()
    d = (af - bf).abs()
    big = torch.maximum(af.abs(), bf.abs())
    bad = d > ulps * eps * big + 2.0 ** -22
    assert int(bad.sum()) <= frac * d.numel(), \
        f"{name}: {int(bad.sum())} of {d.numel()} elements beyond {ulps} ulp, max |d| {float(d.max()):.3e}"
    assert (d <= 8e-4 + 2.01 / 128 * big).all(), f"{name}: max |d| {float(d.max()):.3e} beyond FlashMLA's tolerance"


def _run(q, k, bt, sl, causal, combo=(None, None), sched_lens=None, scale=None):
    """Trim off and on (the given half_tiles / q_tma; None = the dispatched choice) on the same inputs and schedule:
    each against the reference (FlashMLA's tolerances), then on vs off (2 ulp but for <= 0.01 % of the elements,
    none beyond FlashMLA's out tolerance; lse 1e-5 relative, +inf pattern)."""
    from deepkernels.mla.metadata import compute_schedule
    b, s_q, h_q, _ = q.shape
    h_kv = k.shape[2]
    rows = s_q * h_q // h_kv
    assert G.supported(q, k, rows)
    scale = 576 ** -0.5 if scale is None else scale
    sched, ns = compute_schedule(sl if sched_lens is None else sched_lens, dec._num_sm_parts(q.device, rows, h_kv))
    causal = causal and s_q > 1
    res = {}
    for trim in (False, True):
        res[trim] = G.gluon_dense_forward(q, k, bt, sl, sched, ns, scale, causal, half_tiles=combo[0],
                                          q_tma=combo[1], trim=trim)
    torch.cuda.synchronize()
    o_ref, l_ref = ref.dense_decode(q, k, bt, sl, 512, scale, causal)
    for trim, (o, l) in res.items():
        name = "trim" if trim else "off"
        assert not torch.isnan(o).any() and not torch.isnan(l).any(), f"{name}: unwritten or NaN outputs"
        assert check_is_allclose(f"out {name}", o, o_ref, *TOL_OUT)
        assert check_is_allclose(f"lse {name}", l, l_ref, *TOL_LSE)
    (o_off, l_off), (o_on, l_on) = res[False], res[True]
    _close_ulps("out trim vs off", o_on, o_off)
    assert torch.equal(torch.isinf(l_on), torch.isinf(l_off)) and torch.equal(l_on == float("inf"),
                                                                              l_off == float("inf"))
    fin = torch.isfinite(l_off)
    d = (l_on[fin] - l_off[fin]).abs()
    assert (d <= 1e-5 * l_off[fin].abs() + 1e-6).all(), float(d.max()) if d.numel() else 0.0
    return o_on, l_on


EDGE = [0, 1, 2, 63, 64, 65, 127, 129, 700, 3001]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("h_q", [16, 64, 128])
def test_gpu_trim_edge_lengths(h_q, s_q, dtype, poison):
    """Lengths 0 / 1 / 2 / 63 / 64 / 65 / 127 / 129 / ... (NaN past every end), causal at s_q 2 (the length-1
    request's first query row is empty there), the dispatched half_tiles / q_tma; empty rows: out 0, lse +inf."""
    torch.manual_seed(h_q * 10 + s_q)
    q, k, bt, sl = make_case(len(EDGE), s_q, h_q, 1, EDGE, dtype=dtype, device="cuda")
    o, l = _run(q, k, bt, sl, True)
    assert (o[0] == 0).all() and (l[0] == float("inf")).all()           # zero-length request
    if s_q == 2:                                                          # length 1, causal: row 0 sees no token
        assert (o[1, 0] == 0).all() and (l[1, :, 0] == float("inf")).all()
        assert torch.isfinite(l[1, :, 1]).all()


TRIM_GRID = [
    (s_q, s_k, h_q, h_kv, varlen, causal)
    for s_q in (1, 2) for s_k in (140, 4096)
    for (h_q, h_kv) in ((16, 1), (64, 1), (128, 1), (128, 2))
    for varlen, causal in ((False, False), (True, True))
]


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("s_q,s_k,h_q,h_kv,varlen,causal", TRIM_GRID[::2] + TRIM_GRID[1::8])
def test_gpu_trim_grid(s_q, s_k, h_q, h_kv, varlen, causal, poison):
    """b 64, varlen N(s_k, s_k / 2) (lengths not multiples of 64) with 10 % empty requests, or fixed lengths."""
    torch.manual_seed(s_q * 100 + s_k + h_q + h_kv)
    _run(*_case(64, s_q, s_k, h_q, h_kv, varlen, zero_frac=0.1 if varlen else 0.0), causal)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("s_q", [1, 2])
@pytest.mark.parametrize("combo", COMBOS, ids=lambda v: CID(*v))
def test_gpu_trim_every_combo(combo, s_q, poison):
    """Trim with each half_tiles / q_tma combination explicitly (the variant partitions' two softmax call sites)."""
    torch.manual_seed(s_q + 3 * combo[0] + 5 * combo[1])
    q, k, bt, sl = make_case(len(EDGE), s_q, 128, 1, EDGE, device="cuda")
    _run(q, k, bt, sl, True, combo)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("num_sms", [1, 264])
def test_gpu_trim_split_requests(num_sms, poison):
    """Few parts: one CTA walks many requests; many parts: requests split into pieces (k1 < seqlen for all but the
    last split: lim_lo = k1 there, the causal bound only in the last)."""
    dec.set_mla_num_sms(num_sms)
    try:
        torch.manual_seed(num_sms)
        _run(*_case(16, 2, 1500, 128, 1, True, zero_frac=0.2), True)
        _run(*_case(3, 1, 5000, 64, 1, True), False)
    finally:
        dec.set_mla_num_sms(None)


@pytest.mark.gpu
@needs_sm90
def test_gpu_trim_stale_schedule(poison):
    q, k, bt, sl = make_case(4, 2, 128, 1, [100, 3000, 0, 777], device="cuda")
    planned = torch.tensor([2000, 5, 900, 64], dtype=torch.int32, device="cuda")
    _run(q, k, bt, sl, True, sched_lens=planned)


@pytest.mark.gpu
@needs_sm90
@pytest.mark.parametrize("scale", [0.01, 0.3, 1.0])
def test_gpu_trim_softmax_scales(scale, poison):
    """softmax_scale other than 576^-0.5 (c = scale * log2 e is the kernel's sm_scale_log2)."""
    torch.manual_seed(int(scale * 100))
    q, k, bt, sl = make_case(6, 2, 64, 1, [1, 65, 300, 0, 1000, 64], device="cuda")
    _run(q, k, bt, sl, True, scale=scale)


@pytest.mark.gpu
@needs_sm90
def test_gpu_trim_huge_logits():
    """Scores ~6e5 (x scale ~2.5e4): the folded m * c stays exact enough; identical V rows give their mean."""
    q, k, bt, sl = make_case(2, 1, 128, 1, [100, 700], nan_unused=False, device="cuda")
    q.fill_(0.5)
    k.fill_(0.5)
    from deepkernels.mla.metadata import compute_schedule
    sched, ns = compute_schedule(sl, dec._num_sm_parts(q.device, 128, 1))
    o, l = G.gluon_dense_forward(q * 64, k * 64, bt, sl, sched, ns, 576 ** -0.5, False, half_tiles=None,
                                 q_tma=None, trim=True)
    torch.cuda.synchronize()
    assert torch.isfinite(l).all() and not torch.isnan(o).any()
    assert torch.allclose(o.float(), torch.full_like(o.float(), 32.0), rtol=1e-2)


@pytest.mark.gpu
@needs_sm90
def test_gpu_trim_fp16_padded_q_pitch(poison):
    """fp16, q a [..., :576] view of 704-wide rows (Q descriptors with the 1408-B pitch)."""
    q, k, bt, sl = make_case(4, 2, 64, 1, [300, 1, 5000, 64], dtype=torch.float16)
    qb = torch.randn(4, 2, 64, 704, dtype=torch.float16)
    qb[..., :576] = q
    _run(qb.cuda()[..., :576], k.cuda(), bt.cuda(), sl.cuda(), True)
