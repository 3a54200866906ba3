"""Sparse MLA decode, WS2 split consumer + 2-CTA cluster producer sharing (deepkernels.mla._gluon_sparse_decode_ws3;
not dispatched): compile tier (sm90 cross-compile: cluster PTX present, the shared offsets the launcher reads, spills
per partition loop, shared memory), and a GPU tier through the public op with its Gluon launch routed to
:func:`launch_sparse_decode_gluon_ws3` (FlashMLA tolerances via tests/test_mla_sparse_kernels.run_and_check: NaN in
every unreferenced cache token, junk indices, NaN-poisoned outputs), plus a direct comparison with WS2."""
from __future__ import annotations

import functools
import inspect
import re

import pytest
import torch

import deepkernels as dk
import deepkernels.mla.sparse_decode as sd
from deepkernels.mla import _gluon_sparse_decode as G
from deepkernels.mla import _gluon_sparse_decode_ws as W
from deepkernels.mla import _gluon_sparse_decode_ws2 as W2
from deepkernels.mla import _gluon_sparse_decode_ws3 as W3

from test_mla_sparse_kernels import poison, run_and_check, sms  # noqa: F401  (fixtures)
from test_mla_sparse_reference import _public, make_case
from deepkernels.testing.compile import (n_hgmma as _n_hgmma, n_spill as _n_spill, sass_loops as _sass_loops,
                                         ws_loop_roles as _ws_loop_roles)

pytestmark = pytest.mark.skipif(not W3.available(), reason=f"Gluon not importable: {W3._IMPORT_ERROR!r}")

FMTS = ("v32", "v41")
_CONFIGS = [(6, True, True), (-1, False, False), (6, False, True), (-1, True, False)]
# measured (Triton 3.6 wheel, ptxas): spill instructions in the softmax token loop / producer block loop. The softmax
# loop spilled 24-35 (wgmma descriptors out of uniform registers) while the cluster PTX re-read %tid.x inside a worker
# partition's loop and global_smem inside the softmax loop nest; both now come from outside the loops (module
# docstring, "Uniform registers"; test_compile_uniform_register_triggers): 0, as WS2.
_SOFT_SPILLS = {"v32": 0, "v41": 0}
_PROD_SPILLS = {"v32": 4, "v41": 1}
_SMEM = {"v32": 230096, "v41": 205504}


@functools.lru_cache(maxsize=None)
def _compiled(fmt, page_shift, has_len, has_sink):
    k = W3.compile_sm90_ws3(fmt, page_shift, has_len, has_sink)
    return k.asm["ptx"], k.asm["ttgir"], k.metadata.shared


@functools.lru_cache(maxsize=None)
def _ptxas(ptx):
    from deepkernels.testing.compile import ptxas_sm90
    return ptxas_sm90(ptx, sass=True)


@pytest.mark.compile
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("page_shift,has_len,has_sink", _CONFIGS)
def test_compile_sm90_ws3(fmt, page_shift, has_len, has_sink):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    ptx, ttgir, shared = _compiled(fmt, page_shift, has_len, has_sink)
    assert shared <= SM90_SMEM_LIMIT and shared <= _SMEM[fmt] + 64, shared
    # the WS2 wgmmas; compiled as a 1-CTA kernel (the cluster comes from the launch)
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16") == 8
    assert ".reqnctapercluster" not in ptx and "%clusterid" not in ptx
    # cluster PTX: 2 bulk pushes + 1 expect_tx per block (producer), a remote empty arrive per consumer warpgroup,
    # cluster barriers at the start and end of each of the 3 partitions, the mbarrier-init fence
    assert ptx.count("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes") == 2
    assert ptx.count("mbarrier.expect_tx.relaxed.cta.shared::cta.b64") == 1
    assert ptx.count("mbarrier.arrive.shared::cluster.b64") == 2
    assert ptx.count("barrier.cluster.arrive.release.aligned") == 6
    assert ptx.count("fence.mbarrier_init.release.cluster") == 1
    assert ptx.count("mbarrier.init.shared") == 6 and ", 4;" in "".join(
        l for l in ptx.splitlines() if "mbarrier.init" in l)
    # the uniform-register rules (module docstring): the kernel's single %tid.x read (the cluster PTX gets its
    # one-thread predicate as an operand), global_smem read by the cluster PTX once per partition (3) + Triton's 2
    assert ptx.count("%tid.x") == 1
    assert len(re.findall(r"mov\.u32 %r\d+, global_smem;", ptx)) == 3, re.findall(r".*global_smem;", ptx)
    # the offsets the launcher passes: ring first, the barriers after every data buffer
    offs = W3.smem_offsets(ttgir)
    ring, ready, empty = W3._offset_args(ttgir)
    assert ring == 0 and ready + 16 == empty and empty + 16 <= shared
    assert all(v + 16 <= ready for k, v in offs.items() if k not in ("ready", "empty", "pready", "pfree"))
    rep = _ptxas(ptx)
    if rep is None:
        pytest.skip("ptxas not available")
    soft, pv, prod = _ws_loop_roles(rep.sass)
    assert len(soft) == 1 and len(pv) == 1 and len(prod) == 1
    assert _n_spill(pv[0]) == 0
    assert _n_spill(soft[0]) <= _SOFT_SPILLS[fmt], _n_spill(soft[0])
    assert _n_spill(prod[0]) <= _PROD_SPILLS[fmt], _n_spill(prod[0])
    assert not any("MEMBAR.ALL.GPU" in t for t in soft[0] + pv[0] + prod[0])   # no cluster-scope release per block
    assert sum(1 for t in prod[0] if "UBLKCP" in t) == 2, [t for t in prod[0] if "BLK" in t]


def _soft_loop_stats(ptx):
    rep = _ptxas(ptx)
    if rep is None:
        pytest.skip("ptxas not available")
    soft = [lp for lp in _sass_loops(rep.sass) if _n_hgmma(lp) > 4]
    assert len(soft) == 1
    return _n_spill(soft[0]), sum(1 for t in soft[0] if "R2UR" in t)


def _asm_block(ptx, needle, nth=0):
    """(start, end) of the ``{ ... }`` inline-asm block holding the nth occurrence of ``needle``."""
    i = -1
    for _ in range(nth + 1):
        i = ptx.index(needle, i + 1)
    return ptx.rfind("{", 0, i), ptx.index("}", i) + 1


@pytest.mark.compile
def test_compile_uniform_register_triggers():
    """Reproducer of the softmax-loop spills of the first WS3 version (V3.2, one config): the shipped PTX keeps the
    softmax token loop's wgmma descriptors in uniform registers (0 spills); putting back EITHER of the two things the
    first version did makes ptxas rebuild them in vector registers and spill: (a) a ``%tid.x`` read inside a WORKER
    partition's loop (here the producer's ``expect_tx`` predicate recomputed from ``%tid.x``; the same read in the
    PV loop does it too, in the softmax loop itself it does not), (b) ``mov global_smem`` inside the softmax
    partition's loop nest (here in its remote arrive; in the PV loop it is harmless)."""
    ptx = _compiled("v32", 6, True, True)[0]
    assert _soft_loop_stats(ptx)[0] == 0
    s, e = _asm_block(ptx, "mbarrier.expect_tx.relaxed")
    blk = re.sub(r"@%p\d+ mbarrier", "mov.u32 r, %tid.x; and.b32 r, r, 127; setp.eq.u32 q, r, 0; @q mbarrier",
                 ptx[s:e].replace("{", "{ .reg .b32 r; .reg .pred q;", 1))
    assert blk != ptx[s:e]
    spills_a, r2ur_a = _soft_loop_stats(ptx[:s] + blk + ptx[e:])
    s, e = _asm_block(ptx, "mbarrier.arrive.shared::cluster.b64")           # the softmax warpgroup's (first)
    blk = re.sub(r"add\.u32 a, %r\d+, (%r\d+);", r"mov.u32 a, global_smem; add.u32 a, a, \1;", ptx[s:e])
    assert blk != ptx[s:e]
    spills_b, r2ur_b = _soft_loop_stats(ptx[:s] + blk + ptx[e:])
    # measured: (a) 39 spills, R2UR 14 -> 157; (b) 39 spills, R2UR 14 -> 78
    assert spills_a >= 10 and spills_b >= 10, (spills_a, spills_b)


@pytest.mark.compile
def test_compile_ring_view_matches_slices():
    """The producer's [8, 64, 128] view of the [2, 64, 512] ring (``kv8.index(4 s + q)``) addresses the same bytes as
    ``kv_n.index(s).slice(128 q, 128, dim=1)`` -- the fact the 16 KB bulk copies rely on (NVMMA 128-byte swizzle
    stores each 64-column strip of 64 rows contiguously): both stores compile to the same PTX."""
    from deepkernels._gluon import gl, jit, compile_sm90

    @jit
    def k(x_ptr, VIEW: gl.constexpr):
        SH: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 512], gl.bfloat16)
        SH_C: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16)
        L: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
        buf = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 512], SH)
        r = gl.arange(0, 64, gl.SliceLayout(1, L))
        c = gl.arange(0, 128, gl.SliceLayout(0, L))
        x = gl.load(x_ptr + r[:, None] * 128 + c[None, :])
        if VIEW:
            buf._reinterpret(gl.bfloat16, [8, 64, 128], SH_C).index(7).store(x)
        else:
            buf.index(1).slice(384, 128, dim=1).store(x)
        gl.thread_barrier()
        y = buf.index(1).load(gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0]))
        gl.store(x_ptr + r[:, None] * 512 + gl.arange(0, 512, gl.SliceLayout(0, L))[None, :], y)

    def body(view):
        ptx = compile_sm90(k, {"x_ptr": "*bf16"}, {"VIEW": view}, ["x_ptr"], num_warps=4).asm["ptx"]
        lines = [re.sub(r"//.*", "", ln).strip() for ln in ptx.splitlines()]
        return [ln for ln in lines if ln and not ln.startswith((".loc", ".file", "$L")) and "debug" not in ln]
    assert body(True) == body(False)


# sha256 of the cleaned PTX (deepkernels.testing.compile.clean_ptx) of the default build before the ROPE_ROWS option
# existed (git 0b54eb4, Triton 3.6.0, sm_90a), per (fmt, page_shift, has_len, has_sink): the option off (the default,
# WS3_ROPE_ROWS empty) must leave the kernel byte-identical.
_BASE_PTX_SHA = {
    ("v32", 6, True, True): "fd6a3eddd3f9347fc6bb3c5d56767c538dc84a975ab745599defe656154d3e03",
    ("v32", -1, False, False): "652e6677e20c8cdf4e5ac4913ff475e4d217499a264eb7ebd58a16625e0fbde7",
    ("v32", 6, False, True): "a11c0b7599661232f295b17c1c104b87841566f0625ab53d01bb901e12f5c7dd",
    ("v32", -1, True, False): "19c4f996d2c372a50414ec38e435094825eb7c0fb595a25a7a3032e99b169b92",
    ("v41", 6, True, True): "b41d98f0a8e04725e133cd21962be13b99bd49de60ecbbcf26a823190fe59dc6",
    ("v41", -1, False, False): "5c23023f0d282bbfa79892e523699578dd975913b0cc2fd6e450d0e429c14c50",
    ("v41", 6, False, True): "7b6b09f48e530b11dab3f580f2d63a7d3427558c137589468f64d2beaf21452c",
    ("v41", -1, True, False): "62d2577e6eb1a5b415356cadfbb69fdee89a5f15c48aea4d0e93d5f733d9d64f",
}


def _ptx_sha(ptx):
    import hashlib
    from deepkernels.testing.compile import clean_ptx
    return hashlib.sha256(clean_ptx(ptx).encode()).hexdigest()


@pytest.mark.compile
@pytest.mark.parametrize("fmt,page_shift,has_len,has_sink", list(_BASE_PTX_SHA))
def test_default_ptx_unchanged(fmt, page_shift, has_len, has_sink):
    import triton
    if triton.__version__ != "3.6.0":
        pytest.skip(f"hashes taken with Triton 3.6.0, not {triton.__version__}")
    assert not W3.WS3_ROPE_ROWS and W3.WS3_ROW_LANES == frozenset({"v41"})
    # the session-16 build (every later option off: ROW_LANES, V4.1's default since session 17; IDX_AHEAD / PF_LINES
    # / V4.1's PF_L2, defaults since session 18): unchanged since the options were added
    k = W3.compile_sm90_ws3(fmt, page_shift, has_len, has_sink, row_lanes=False, **_S17[fmt])
    assert _ptx_sha(k.asm["ptx"]) == _BASE_PTX_SHA[(fmt, page_shift, has_len, has_sink)]
    if fmt == "v41":        # rope_rows is a V3.2 option: V4.1 compiles the default kernel with it
        k = W3.compile_sm90_ws3(fmt, page_shift, has_len, has_sink, rope_rows=True, row_lanes=False, **_S17[fmt])
        assert _ptx_sha(k.asm["ptx"]) == _BASE_PTX_SHA[(fmt, page_shift, has_len, has_sink)]


# cp.async per thread of the softmax warpgroup's Q load in the V3.2 default build (Q_ASYNC: 9 chunks x 4 x 16 B)
_Q_CPASYNC = 36 if W3._q_async("v32", None) else 0
# the session-17 producer per format (before IDX_AHEAD / PF_LINES / V4.1's PF_L2)
_S17 = {"v32": dict(idx_ahead=False, pf_lines=False, pf_l2=True, q_async=False),
        "v41": dict(idx_ahead=False, pf_lines=False, pf_l2=False, q_async=False)}


def test_session18_defaults():
    """Dispatched since session 18 (module docstring, "Index loads ahead"): V3.2 IDX_AHEAD (bulk prefetch), V4.1
    IDX_AHEAD + PF_L2 + PF_LINES."""
    assert W3.WS3_IDX_AHEAD == frozenset({"v32", "v41"}) and W3.WS3_PF_LINES == frozenset({"v41"})
    assert W3.WS3_PF_L2 == frozenset({"v32", "v41"})
    assert W3.WS3_Q_ASYNC == frozenset({"v32"})


@functools.lru_cache(maxsize=None)
def _compiled_rope(page_shift, has_len, has_sink):
    k = W3.compile_sm90_ws3("v32", page_shift, has_len, has_sink, rope_rows=True)
    return k.asm["ptx"], k.asm["ttgir"], k.metadata.shared


def _loops(ptx):
    rep = _ptxas(ptx)
    if rep is None:
        pytest.skip("ptxas not available")
    soft, pv, prod = _ws_loop_roles(rep.sass)
    assert len(soft) == 1 and len(pv) == 1 and len(prod) == 1
    return rep, soft[0], pv[0], prod[0]


@pytest.mark.compile
@pytest.mark.parametrize("page_shift,has_len,has_sink", _CONFIGS)
def test_compile_rope_rows(page_shift, has_len, has_sink):
    """The ROPE_ROWS option (V3.2; module docstring, "RoPE rows"): the cluster PTX and the uniform-register rules as
    the default build; still 4 x 16-B cp.async (``LDGSTS.E.BYPASS.128``) per producer thread and block, now each for
    a different token at the RoPE slice's first 16 bytes (the default: one token, its 4 consecutive 16-B pieces at
    +528 .. +576); rec / valid reach that layout in one warp-local convert (no CTA barrier added to the producer
    loop); no more spills than the default's loops, consumers' loops unchanged."""
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    ptx, ttgir, shared = _compiled_rope(page_shift, has_len, has_sink)
    ptx0 = _compiled("v32", page_shift, has_len, has_sink)[0]
    assert shared <= SM90_SMEM_LIMIT and shared <= _SMEM["v32"] + 256, shared       # + the convert's 240-B scratch
    assert ptx.count("cp.async.cg.shared.global") == 4 + _Q_CPASYNC and ", 0x10," in ptx
    for needle in ("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes",
                   "mbarrier.expect_tx.relaxed.cta.shared::cta.b64", "mbarrier.arrive.shared::cluster.b64",
                   "barrier.cluster.arrive.release.aligned", "wgmma.mma_async.sync.aligned.m64n256k16"):
        assert ptx.count(needle) == ptx0.count(needle), needle
    assert ptx.count("%tid.x") == 1
    assert len(re.findall(r"mov\.u32 %r\d+, global_smem;", ptx)) == 3
    assert ptx.count("bar.sync") == ptx0.count("bar.sync")
    ring, ready, empty = W3._offset_args(ttgir)
    assert ring == 0 and ready + 16 == empty and empty + 16 <= shared
    rep, soft, pv, prod = _loops(ptx)
    rep0, soft0, pv0, prod0 = _loops(ptx0)
    ld = [t for t in prod if t.startswith("LDGSTS")]
    ld0 = [t for t in prod0 if t.startswith("LDGSTS")]
    assert len(ld) == len(ld0) == 4 and all(t.startswith("LDGSTS.E.BYPASS.128") for t in ld + ld0), ld
    offs = lambda lds: sorted(re.search(r"\.64\+(0x[0-9a-f]+)\]", t).group(1) for t in lds)   # noqa: E731
    assert offs(ld0) == ["0x210", "0x220", "0x230", "0x240"] and offs(ld) == ["0x210"] * 4, (ld0, ld)
    assert len({re.search(r"\]\[(R\d+)\.64", t).group(1) for t in ld0}) == 1
    assert sum(1 for t in prod if t.startswith("BAR.SYNC")) == sum(1 for t in prod0 if t.startswith("BAR.SYNC"))
    assert sum(1 for t in prod if "UBLKCP" in t) == 2
    assert _n_spill(soft) == _n_spill(soft0) == 0 and _n_spill(pv) == _n_spill(pv0) == 0
    assert len(soft) == len(soft0) and abs(len(pv) - len(pv0)) <= 2
    # measured: producer loop 1 spill instruction in every config (default 1-3), 680-718 instructions (643-676)
    assert _n_spill(prod) <= max(_n_spill(prod0), 1), (_n_spill(prod), _n_spill(prod0))
    assert rep.spills[0] <= 56, rep.spills
    assert len(prod) <= len(prod0) + 48, (len(prod), len(prod0))
    assert not any("MEMBAR.ALL.GPU" in t for t in soft + pv + prod)


def test_rope_rows_option_plumbing():
    """rope_rows: keyword-only, default from WS3_ROPE_ROWS; V3.2 only (V4.1 never compiles a second kernel)."""
    sig = inspect.signature(W3.launch_sparse_decode_gluon_ws3).parameters
    assert list(sig)[-5] == "rope_rows" and sig["rope_rows"].kind == inspect.Parameter.KEYWORD_ONLY
    assert inspect.signature(W3.compile_sm90_ws3).parameters["rope_rows"].default is None
    assert W3._CONSTEXPRS[-5] == "ROPE_ROWS" and W3.WS3_ROPE_ROWS == frozenset()
    assert not W3._rope_rows("v32", None) and W3._rope_rows("v32", True) and not W3._rope_rows("v41", True)
    assert not W3._rope_rows("v32", False)


@functools.lru_cache(maxsize=None)
def _compiled_rl(fmt, page_shift, has_len, has_sink, rope_rows=False):
    k = W3.compile_sm90_ws3(fmt, page_shift, has_len, has_sink, rope_rows=rope_rows, row_lanes=True)
    return k.asm["ptx"], k.asm["ttgir"], k.metadata.shared


@pytest.mark.compile
@pytest.mark.parametrize("rope_rows", [False, True], ids=["rl", "rl_rope"])
@pytest.mark.parametrize("page_shift,has_len,has_sink", _CONFIGS)
def test_compile_row_lanes(page_shift, has_len, has_sink, rope_rows):
    """The ROW_LANES option (V3.2, alone and with ROPE_ROWS; module docstring, "Row lanes"): the chunk layout's
    lanes over rows first (TTGIR), the cluster PTX and the uniform-register rules as the default build, the same
    16 ``STS.128`` of dequantised NoPE + 4 RoPE ``LDGSTS`` + 2 bulk pushes per producer block, no CTA barrier added,
    no more spills than the default's loops (floor 1), consumers' loops unchanged."""
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    ptx, ttgir, shared = _compiled_rl("v32", page_shift, has_len, has_sink, rope_rows)
    ptx0, _, shared0 = _compiled("v32", page_shift, has_len, has_sink)
    assert ("sizePerThread = [1, 16], threadsPerWarp = [16, 2], warpsPerCTA = [4, 1], order = [0, 1]" in ttgir)
    assert "order = [0, 1]" not in _compiled("v32", page_shift, has_len, has_sink)[1]
    assert shared <= SM90_SMEM_LIMIT and shared <= shared0 + (256 if rope_rows else 0), (shared, shared0)
    assert ptx.count("cp.async.cg.shared.global") == 4 + _Q_CPASYNC and ", 0x10," in ptx
    for needle in ("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes",
                   "mbarrier.expect_tx.relaxed.cta.shared::cta.b64", "mbarrier.arrive.shared::cluster.b64",
                   "barrier.cluster.arrive.release.aligned", "wgmma.mma_async.sync.aligned.m64n256k16"):
        assert ptx.count(needle) == ptx0.count(needle), needle
    assert ptx.count("%tid.x") == 1
    assert len(re.findall(r"mov\.u32 %r\d+, global_smem;", ptx)) == 3
    assert ptx.count("bar.sync") == ptx0.count("bar.sync")
    ring, ready, empty = W3._offset_args(ttgir)
    assert ring == 0 and ready + 16 == empty and empty + 16 <= shared
    rep, soft, pv, prod = _loops(ptx)
    rep0, soft0, pv0, prod0 = _loops(ptx0)
    sts = lambda lp: sum(1 for t in lp if t.startswith("STS.128"))      # noqa: E731
    assert sts(prod) == sts(prod0) == 16, (sts(prod), sts(prod0))
    assert sum(1 for t in prod if t.startswith("LDGSTS.E.BYPASS.128")) == 4
    assert sum(1 for t in prod if "UBLKCP" in t) == 2
    assert sum(1 for t in prod if t.startswith("BAR.SYNC")) == sum(1 for t in prod0 if t.startswith("BAR.SYNC"))
    assert _n_spill(soft) == _n_spill(soft0) == 0 and _n_spill(pv) == _n_spill(pv0) == 0
    assert len(soft) == len(soft0) and abs(len(pv) - len(pv0)) <= 2
    # measured: producer loop 1 spill instruction in every config (default 1-3); 640-676 instructions alone (default
    # 640-676), 678-716 with ROPE_ROWS; ptxas spill bytes 48-64 alone, 24-52 with ROPE_ROWS (default 24-56)
    assert _n_spill(prod) <= max(_n_spill(prod0), 1), (_n_spill(prod), _n_spill(prod0))
    assert rep.spills[0] <= 64, rep.spills
    assert len(prod) <= len(prod0) + (48 if rope_rows else 8), (len(prod), len(prod0))
    assert not any("MEMBAR.ALL.GPU" in t for t in soft + pv + prod)


@pytest.mark.compile
def test_compile_row_lanes_v41():
    """ROW_LANES on V4.1 (the WS kernel's [64, 4, 8] row-lanes order; V4.1's default since session 17): compiles,
    its layout in the TTGIR, 0 spills in the producer loop as without it, the same 16 ``STS.128`` per block."""
    ptx, ttgir, _ = _compiled_rl("v41", 6, True, True)
    assert "sizePerThread = [1, 2, 8], threadsPerWarp = [16, 2, 1], warpsPerCTA = [4, 1, 1], order = [2, 0, 1]" in ttgir
    assert _compiled("v41", 6, True, True)[0] == ptx          # the default build is this one
    rep, soft, pv, prod = _loops(ptx)
    rep0, soft0, pv0, prod0 = _loops(W3.compile_sm90_ws3("v41", 6, True, True, row_lanes=False).asm["ptx"])
    assert _n_spill(prod) == _n_spill(prod0) == 0 and _n_spill(soft) == 0 and _n_spill(pv) == 0
    assert sum(1 for t in prod if t.startswith("STS.128")) == sum(1 for t in prod0 if t.startswith("STS.128")) == 16
    assert len(prod) <= len(prod0) + 8 and len(soft) == len(soft0)


def test_row_lanes_option_plumbing():
    """row_lanes: keyword-only, before idx_ahead / pf_lines (session 18), default from WS3_ROW_LANES (V4.1 since
    session 17); both formats."""
    for f in (W3.launch_sparse_decode_gluon_ws3, W3.compile_sm90_ws3):
        sig = inspect.signature(f).parameters
        assert list(sig)[-4] == "row_lanes" and sig["row_lanes"].default is None
    sig = inspect.signature(W3.launch_sparse_decode_gluon_ws3).parameters
    assert sig["row_lanes"].kind == inspect.Parameter.KEYWORD_ONLY
    assert W3._CONSTEXPRS[-4] == "ROW_LANES" and W3.WS3_ROW_LANES == frozenset({"v41"})
    assert not W3._row_lanes("v32", None) and W3._row_lanes("v41", None) and not W3._row_lanes("v41", False)
    assert W3._row_lanes("v32", True) and W3._row_lanes("v41", True) and not W3._row_lanes("v32", False)
    params = [p.name for p in W3._sparse_decode_gluon_ws3_kernel.params]
    assert params[-5:] == ["ROPE_ROWS", "ROW_LANES", "IDX_AHEAD", "PF_LINES", "Q_ASYNC"]


def test_idx_ahead_pf_lines_option_plumbing():
    """idx_ahead / pf_lines (session 18): keyword-only, last, defaults from WS3_IDX_AHEAD / WS3_PF_LINES; trailing
    constexprs with defaults in both kernel entries (the extra entry's before its X constexprs, so
    ``_CONSTEXPRS_X = _CONSTEXPRS + X`` still holds)."""
    for f in (W3.launch_sparse_decode_gluon_ws3, W3.compile_sm90_ws3, W3.compile_sm90_ws3_extra):
        sig = inspect.signature(f).parameters
        assert list(sig)[-3:] == ["idx_ahead", "pf_lines", "q_async"]
        assert sig["idx_ahead"].default is None and sig["pf_lines"].default is None and sig["q_async"].default is None
    assert W3._CONSTEXPRS[-3:] == ("IDX_AHEAD", "PF_LINES", "Q_ASYNC")
    for k in (W3._sparse_decode_gluon_ws3_kernel, W3._sparse_decode_gluon_ws3_x_kernel):
        sig = inspect.signature(k.fn).parameters
        assert sig["IDX_AHEAD"].default is False and sig["PF_LINES"].default is False
        assert sig["Q_ASYNC"].default is False
    for fmt in ("v32", "v41"):
        assert W3._q_async(fmt, None) == (fmt in W3.WS3_Q_ASYNC) and W3._q_async(fmt, True)
        assert not W3._q_async(fmt, False)
    for fmt in ("v32", "v41"):
        assert W3._idx_ahead(fmt, None) == (fmt in W3.WS3_IDX_AHEAD) and W3._idx_ahead(fmt, True)
        assert not W3._idx_ahead(fmt, False) and not W3._pf_lines(fmt, False) and W3._pf_lines(fmt, True)
        assert W3._pf_lines(fmt, None) == (fmt in W3.WS3_PF_LINES)


@pytest.mark.parametrize("fmt,knobs", [("v32", dict(idx_ahead=True)), ("v32", dict(idx_ahead=True, pf_lines=True)),
                                       ("v41", dict(idx_ahead=True, pf_l2=True, pf_lines=True))])
def test_compile_idx_ahead(fmt, knobs):
    """The index-ahead producer (with the per-thread L2 prefetch) compiles for sm90 with the default build's shared
    size, no spills in the consumer loops and at most the default's producer-loop spills (measured at build time:
    V3.2 0 vs 3, V4.1 + PF_LINES 0 vs 0); PF_LINES replaces the bulk prefetch (UBLKPF) by CCTL.E.PF2."""
    k = W3.compile_sm90_ws3(fmt, 6, True, True, **knobs)
    assert k.metadata.shared == _SMEM[fmt]
    rep = _ptxas(k.asm["ptx"])
    if rep is None:
        pytest.skip("ptxas not available")
    soft, pv, prod = _ws_loop_roles(rep.sass)
    assert len(soft) == 1 and len(pv) == 1 and len(prod) == 1
    assert _n_spill(soft[0]) == 0 and _n_spill(pv[0]) == 0
    assert _n_spill(prod[0]) <= {"v32": 0, "v41": 0}[fmt], _n_spill(prod[0])
    if knobs.get("pf_lines"):
        assert not any("UBLKPF" in t for t in prod[0]) and sum("CCTL.E.PF2" in t for t in prod[0]) == 2


# ------------------------------------------------------------------ CPU: launcher contract
def test_launcher_has_the_ws2_launch_contract():
    a = [(n, p.default) for n, p in inspect.signature(W3.launch_sparse_decode_gluon_ws3).parameters.items()
         if p.kind != p.KEYWORD_ONLY]
    b = [(n, p.default) for n, p in inspect.signature(W2.launch_sparse_decode_gluon_ws2).parameters.items()
         if p.kind != p.KEYWORD_ONLY]
    assert a == b
    p3 = [p.name for p in W3._sparse_decode_gluon_ws3_kernel.params if not p.is_constexpr]
    p2 = [p.name for p in W2._sparse_decode_gluon_ws2_kernel.params if not p.is_constexpr]
    assert p3 == p2 + ["ring_off", "ready_off", "empty_off"]
    assert tuple(p.name for p in W3._sparse_decode_gluon_ws3_kernel.params if p.is_constexpr) == W3._CONSTEXPRS
    assert sd._gsdw3 is W3       # dispatched since session 17 (routes: tests/test_sparse_decode_dispatch.py)


def test_supported_ws3_gate_on_cpu(monkeypatch):
    q128 = torch.zeros(2, 1, 128, 576, dtype=torch.bfloat16)
    q64 = torch.zeros(2, 1, 64, 576, dtype=torch.bfloat16)
    c = torch.zeros(4, 64, 1, 656, dtype=torch.uint8)
    assert not W3.supported_ws3(q128, c, "v32")                       # CPU tensors
    monkeypatch.setattr(W, "supported", lambda *a, **k: True)         # the WS gate it builds on (supported_ws)
    assert W3.supported_ws3(q128, c, "v32") and not W3.supported_ws3(q64, c, "v32")
    assert W3.supported_ws3(q128, c, "v32", extra_k_cache=c)         # V3.2 + V3.2 (since session 18)
    c41 = torch.zeros(4, 64, 1, 528, dtype=torch.uint8)
    assert not W3.supported_ws3(q128, c, "v32", extra_k_cache=c41)   # not a pair
    assert W3.extends_ws(q128, "v41", "fp4") and not W3.extends_ws(q64, "v41", None)
    assert not W3.extends_ws(q128, "v32", "fp4")
    with pytest.raises(ValueError):
        W3.launch_sparse_decode_gluon_ws3(None, None, q128, c, None, None, None, 1.0, "fp4")


# ------------------------------------------------------------------ GPU tier
@pytest.fixture
def ws3_route(monkeypatch):
    """The public op's Gluon launch goes to launch_sparse_decode_gluon_ws3 (h_q 64 calls: to WS2 inside it); each
    launch is counted with its h_q."""
    calls = []

    def route(out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt, attn_sink=None, extra_k_cache=None,
              extra_indices=None, xfmt=None, topk_length=None, extra_topk_length=None, config=None, _spec=None):
        assert W2.supported_ws2(q, k_cache, fmt, extra_k_cache)
        W3.launch_sparse_decode_gluon_ws3(out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt,
                                          attn_sink, extra_k_cache, extra_indices, xfmt, topk_length,
                                          extra_topk_length, config, _spec)
        calls.append(num_splits)

    monkeypatch.setattr(G, "launch_sparse_decode_gluon", route)
    monkeypatch.setattr(W, "DISPATCH", False)
    monkeypatch.setattr(G, "DISPATCH_FMTS", frozenset({"v32", "v41"}))
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS2", "0")
    return calls


def _ran(calls, n=1):
    assert len(calls) == n, f"{len(calls)} WS3 launches, expected {n}"


_GRID = [(128, 4, 1, 2048, 2046, 64, True, True), (128, 74, 3, 576, 1024, 64, True, True),
         (128, 16, 2, 100, 650, 53, False, False), (128, 3, 1, 2048, 4096, 53, True, False),
         (128, 74, 2, 650, 512, 64, False, True), (128, 4, 2, 64, 64, 64, True, True),
         (128, 32, 1, 2048, 2048, 16, False, False), (128, 4, 1, 1024, 2048, 64, True, True),
         (64, 3, 1, 2048, 4096, 53, True, False)]


@pytest.mark.gpu
def test_gpu_ws3_smoke(ws3_route):
    """One small V3.2 call at h_q 128 (the device script runs this first, under a hang guard)."""
    kw = make_case(4, 1, 128, "v32", 256, 512, 64, with_len=True, sink=True, device="cuda")
    run_and_check(kw)
    torch.cuda.synchronize()
    _ran(ws3_route)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("h_q,b,s_q,topk,s_k,page,with_len,sink", _GRID)
def test_gpu_ws3_grid(h_q, b, s_q, topk, s_k, page, with_len, sink, fmt, poison, ws3_route):
    kw = make_case(b, s_q, h_q, fmt, topk, s_k, page, with_len=with_len, sink=sink, device="cuda")
    run_and_check(kw)
    _ran(ws3_route)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("flags", [dict(all_invalid=True), dict(zero_len=True), dict(nonpow2=True)])
def test_gpu_ws3_corner_cases(flags, fmt, poison, ws3_route):
    kw = make_case(74, 3, 128, fmt, 576, 650, 53, with_len=True, sink=True, **flags, device="cuda")
    o, l_, _ = run_and_check(kw)
    if flags.get("all_invalid"):
        assert (o == 0).all() and torch.isposinf(l_).all()
    _ran(ws3_route)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws3_all_indices_minus_one(fmt, poison, ws3_route):
    kw = make_case(8, 2, 128, fmt, 192, 256, 64, sink=True, device="cuda")
    kw["indices"] = torch.full_like(kw["indices"], -1)
    o, l_ = _public(kw)
    assert (o == 0).all() and torch.isposinf(l_).all()
    _ran(ws3_route)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws3_topk_length_zero(fmt, poison, ws3_route):
    kw = make_case(6, 2, 128, fmt, 256, 512, 64, lengths=[0] * 6, sink=True, device="cuda")
    o, l_ = _public(kw)
    assert (o == 0).all() and torch.isposinf(l_).all()
    kw = make_case(6, 2, 128, fmt, 256, 512, 64, lengths=[0, 256, 0, 1, 0, 65], sink=True, device="cuda")
    run_and_check(kw)
    _ran(ws3_route, 2)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
@pytest.mark.parametrize("n_sms", [3, 8, 264, 1000])
def test_gpu_ws3_split_counts(n_sms, fmt, poison, sms, ws3_route):
    """Few / many scheduler parts (a cluster walks several requests; a request spreads over many splits)."""
    sms(n_sms)
    kw = make_case(16, 2, 128, fmt, 2048, 4096, 64, with_len=True, sink=True, device="cuda")
    run_and_check(kw)
    _ran(ws3_route)
    if n_sms >= 264:
        assert int(ws3_route[0][-1]) > 16


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws3_dequant_exact(fmt, ws3_route):
    """One valid token per row: out = the dequantised record bit for bit, both CTAs' column halves (each CTA
    dequantised one half and received the other by DSMEM)."""
    from deepkernels.quant.kvcache import dequantize_kv_cache
    b, s_q, h_q = 8, 2, 128
    kw = make_case(b, s_q, h_q, fmt, 64, 4096, 64, nonpow2=True, lengths=[1] * b, device="cuda")
    kw["attn_sink"] = torch.full((h_q, ), float("-inf"), device="cuda")
    o, _ = _public(kw)
    cache, ind = kw["k_cache"], kw["indices"]
    deq = dequantize_kv_cache(cache, fmt).view(cache.shape[0] * cache.shape[1], -1)[:, :512]
    i0 = ind[:, :, 0].long()
    ok = (i0 >= 0) & (i0 < deq.shape[0])
    want = torch.where(ok[..., None], deq[i0.clamp(0, deq.shape[0] - 1)], torch.zeros_like(deq[:1]))
    assert torch.equal(o, want[:, :, None, :].expand_as(o))
    _ran(ws3_route)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws3_deterministic_and_graph_capture(fmt, ws3_route):
    kw = make_case(16, 2, 128, fmt, 512, 1024, 64, with_len=True, sink=True, device="cuda")
    meta = dk.get_mla_metadata()[0]
    o_ref, l_ref = _public(kw, meta)
    o2, l2 = _public(kw, meta)
    assert torch.equal(o_ref, o2) and torch.equal(l_ref, l2)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        _public(kw, meta)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        o_g, l_g = _public(kw, meta)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(o_g, o_ref) and torch.equal(l_g, l_ref)
    _ran(ws3_route, 4)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", FMTS)
def test_gpu_ws3_equals_ws2(fmt, poison):
    """Direct launches on one schedule: the same K/V tile bytes and the same consumer expressions as WS2, so out /
    lse are expected bit-identical to WS2 (NaN at the same positions counts as equal)."""
    from deepkernels.mla.metadata import compute_schedule
    b, s_q, h_q, topk = 8, 2, 128, 1024
    kw = make_case(b, s_q, h_q, fmt, topk, 4096, 64, with_len=True, sink=True, device="cuda")
    q, cache, ind = kw["q"], kw["k_cache"], kw["indices"]
    cfg = sd.sparse_decode_config(h_q, fmt)
    parts = sd._num_sm_parts(q.device, s_q, h_q, cfg)
    sched, ns = compute_schedule(sd._token_counts(b, topk, kw["topk_length"], 0, None, False, q.device), parts)
    res = []
    for launch in (W2.launch_sparse_decode_gluon_ws2, W3.launch_sparse_decode_gluon_ws3):
        out = torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(b, s_q, h_q, device="cuda")
        launch(out, lse, q, cache, ind, sched, ns, q.shape[-1] ** -0.5, fmt, kw["attn_sink"],
               topk_length=kw["topk_length"])
        res.append((out, lse))
    torch.cuda.synchronize()
    (o1, l1), (o2, l2) = res
    assert not torch.isnan(o2).any() and not torch.isnan(l2).any()
    assert torch.equal(o2, o1) and torch.equal(l2, l1), ((o2.float() - o1.float()).abs().max(),
                                                          (l2 - l1).abs().max())


_ROPE_SHAPES = [(8, 2, 1024, 4096, 64, True, True, {}), (74, 3, 576, 650, 53, True, True, dict(nonpow2=True)),
                (16, 1, 2048, 4096, 64, False, False, {}), (74, 3, 576, 650, 53, True, True, dict(all_invalid=True)),
                (6, 2, 256, 512, 64, True, True, dict(lengths=[0, 256, 0, 1, 0, 65]))]


def _direct(kw, fmt, **knobs):
    """One direct WS3 launch on the public op's schedule; (out, lse)."""
    from deepkernels.mla.metadata import compute_schedule
    q, cache, ind = kw["q"], kw["k_cache"], kw["indices"]
    b, s_q, h_q, _ = q.shape
    topk = ind.shape[2]
    cfg = sd.sparse_decode_config(h_q, fmt)
    parts = sd._num_sm_parts(q.device, s_q, h_q, cfg)
    sched, ns = compute_schedule(sd._token_counts(b, topk, kw["topk_length"], 0, None, False, q.device), parts)
    out = torch.full((b, s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((b, s_q, h_q), float("nan"), device="cuda")
    W3.launch_sparse_decode_gluon_ws3(out, lse, q, cache, ind, sched, ns, kw["softmax_scale"], fmt,
                                      kw.get("attn_sink"), topk_length=kw["topk_length"], **knobs)
    torch.cuda.synchronize()
    return out, lse


@pytest.mark.gpu
@pytest.mark.parametrize("b,s_q,topk,s_k,page,with_len,sink,flags", _ROPE_SHAPES)
def test_gpu_ws3_rope_rows_bit_identical(b, s_q, topk, s_k, page, with_len, sink, flags, poison):
    """rope_rows=True (V3.2) against the default WS3 build: the same RoPE bytes land in the same tile, so out / lse
    are bit-identical (NaN in every unreferenced cache token, junk / -1 indices, NaN-poisoned outputs and
    accumulators, all-invalid rows, zero lengths)."""
    kw = make_case(b, s_q, 128, "v32", topk, s_k, page, with_len=with_len, sink=sink, device="cuda", **flags)
    o0, l0 = _direct(kw, "v32")
    o1, l1 = _direct(kw, "v32", rope_rows=True)
    assert not torch.isnan(o0).any() and not torch.isnan(l0).any()
    assert torch.equal(o1, o0) and torch.equal(l1, l0), ((o1.float() - o0.float()).abs().max(),
                                                          (l1 - l0).abs().max())
    if flags.get("all_invalid"):
        assert (o1 == 0).all() and torch.isposinf(l1).all()


@pytest.mark.gpu
def test_gpu_ws3_rope_rows_indices_minus_one_and_junk(poison):
    """Every index -1, then every other index out of range / -1: zero fill of the masked RoPE rows as the default."""
    kw = make_case(8, 2, 128, "v32", 192, 256, 64, sink=True, device="cuda")
    ind = kw["indices"]
    kw["indices"] = torch.full_like(ind, -1)
    o1, l1 = _direct(kw, "v32", rope_rows=True)
    assert (o1 == 0).all() and torch.isposinf(l1).all()
    junk = ind.clone()
    junk[..., ::2] = torch.where(torch.arange(junk[..., ::2].numel(), device="cuda").view_as(junk[..., ::2]) % 3 == 0,
                                 -1, 1 << 30).to(junk.dtype)
    kw["indices"] = junk
    o0, l0 = _direct(kw, "v32")
    o1, l1 = _direct(kw, "v32", rope_rows=True)
    assert torch.equal(o1, o0) and torch.equal(l1, l0)


@pytest.mark.gpu
def test_gpu_ws3_rope_rows_public_op(poison, ws3_route, monkeypatch):
    """Through the public op (FlashMLA tolerances) with the option made the V3.2 default (WS3_ROPE_ROWS)."""
    monkeypatch.setattr(W3, "WS3_ROPE_ROWS", frozenset({"v32"}))
    kw = make_case(74, 3, 128, "v32", 576, 1024, 64, with_len=True, sink=True, device="cuda")
    run_and_check(kw)
    _ran(ws3_route)


_RL_KNOBS = [dict(row_lanes=True), dict(row_lanes=True, rope_rows=True)]


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", _RL_KNOBS, ids=["rl", "rl_rope"])
@pytest.mark.parametrize("b,s_q,topk,s_k,page,with_len,sink,flags", _ROPE_SHAPES)
def test_gpu_ws3_row_lanes_bit_identical(b, s_q, topk, s_k, page, with_len, sink, flags, knobs, poison):
    """row_lanes=True (alone and with rope_rows, V3.2) against the default WS3 build: the same dequantised bytes
    land at the same ring addresses (only which lane stores them changes), so out / lse are bit-identical (NaN in
    every unreferenced cache token, junk / -1 indices, NaN-poisoned outputs, all-invalid rows, zero lengths)."""
    kw = make_case(b, s_q, 128, "v32", topk, s_k, page, with_len=with_len, sink=sink, device="cuda", **flags)
    o0, l0 = _direct(kw, "v32")
    o1, l1 = _direct(kw, "v32", **knobs)
    assert not torch.isnan(o0).any() and not torch.isnan(l0).any()
    assert torch.equal(o1, o0) and torch.equal(l1, l0), ((o1.float() - o0.float()).abs().max(),
                                                          (l1 - l0).abs().max())
    if flags.get("all_invalid"):
        assert (o1 == 0).all() and torch.isposinf(l1).all()


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", _RL_KNOBS, ids=["rl", "rl_rope"])
def test_gpu_ws3_row_lanes_indices_minus_one_and_junk(knobs, poison):
    """Every index -1, then junk / -1 indices: masked rows as the default, with row_lanes (and rope_rows)."""
    kw = make_case(8, 2, 128, "v32", 192, 256, 64, sink=True, device="cuda")
    ind = kw["indices"]
    kw["indices"] = torch.full_like(ind, -1)
    o1, l1 = _direct(kw, "v32", **knobs)
    assert (o1 == 0).all() and torch.isposinf(l1).all()
    junk = ind.clone()
    junk[..., ::2] = torch.where(torch.arange(junk[..., ::2].numel(), device="cuda").view_as(junk[..., ::2]) % 3 == 0,
                                 -1, 1 << 30).to(junk.dtype)
    kw["indices"] = junk
    o0, l0 = _direct(kw, "v32")
    o1, l1 = _direct(kw, "v32", **knobs)
    assert torch.equal(o1, o0) and torch.equal(l1, l0)


_IA_KNOBS = [dict(idx_ahead=True), dict(idx_ahead=True, pf_lines=True), dict(idx_ahead=True, pf_l2=False),
             dict(pf_lines=True)]


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", _IA_KNOBS, ids=["ia", "ia_pfl", "ia_nopf", "pfl"])
@pytest.mark.parametrize("b,s_q,topk,s_k,page,with_len,sink,flags", _ROPE_SHAPES)
def test_gpu_ws3_idx_ahead_bit_identical(b, s_q, topk, s_k, page, with_len, sink, flags, knobs, poison):
    """idx_ahead (indices loaded an iteration ahead), pf_lines (per-thread L2 prefetch) and pf_l2 off change only
    when indices are loaded / what is prefetched: out / lse bit-identical to the default V3.2 build (NaN in every
    unreferenced cache token, NaN-poisoned outputs, all-invalid rows, zero lengths, page 53)."""
    kw = make_case(b, s_q, 128, "v32", topk, s_k, page, with_len=with_len, sink=sink, device="cuda", **flags)
    o0, l0 = _direct(kw, "v32", **_S17["v32"])
    o1, l1 = _direct(kw, "v32", **{**_S17["v32"], **knobs})
    assert not torch.isnan(o0).any() and not torch.isnan(l0).any()
    assert torch.equal(o1, o0) and torch.equal(l1, l0), ((o1.float() - o0.float()).abs().max(),
                                                          (l1 - l0).abs().max())


@pytest.mark.gpu
@pytest.mark.parametrize("knobs", [dict(idx_ahead=True), dict(idx_ahead=True, pf_l2=True, pf_lines=True)],
                         ids=["ia", "ia_pfl"])
@pytest.mark.parametrize("b,s_q,topk,s_k,page,with_len,sink,flags", [_ROPE_SHAPES[1], _ROPE_SHAPES[3],
                                                                     _ROPE_SHAPES[4]])
def test_gpu_ws3_idx_ahead_v41_bit_identical(b, s_q, topk, s_k, page, with_len, sink, flags, knobs, poison):
    kw = make_case(b, s_q, 128, "v41", topk, s_k, page, with_len=with_len, sink=sink, device="cuda", **flags)
    o0, l0 = _direct(kw, "v41", **_S17["v41"])
    o1, l1 = _direct(kw, "v41", **{**_S17["v41"], **knobs})
    assert not torch.isnan(o0).any() and not torch.isnan(l0).any()
    assert torch.equal(o1, o0) and torch.equal(l1, l0)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["v32", "v41"])
@pytest.mark.parametrize("b,s_q,topk,s_k,page,with_len,sink,flags", [_ROPE_SHAPES[0], _ROPE_SHAPES[1],
                                                                     _ROPE_SHAPES[4]])
def test_gpu_ws3_q_async_bit_identical(b, s_q, topk, s_k, page, with_len, sink, flags, fmt, poison):
    """q_async (session 18: Q by cp.async, all chunks in flight) lands the same Q bytes: out / lse bit-identical to the
    default build (several requests per CTA, s_q 2 / 3, zero lengths, page 53)."""
    kw = make_case(b, s_q, 128, fmt, topk, s_k, page, with_len=with_len, sink=sink, device="cuda", **flags)
    o0, l0 = _direct(kw, fmt, q_async=False)
    o1, l1 = _direct(kw, fmt, q_async=True)
    assert not torch.isnan(o0).any() and not torch.isnan(l0).any()
    assert torch.equal(o1, o0) and torch.equal(l1, l0)


@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["v32", "v41"])
def test_gpu_ws3_idx_ahead_indices_minus_one_and_junk(fmt, poison):
    """Every index -1, then junk (1 << 30) / -1 indices, with the indices loaded ahead (+ the per-thread prefetch,
    whose addresses come from junk indices masked off): as the default."""
    knobs = dict(idx_ahead=True, pf_l2=True, pf_lines=True)
    kw = make_case(8, 2, 128, fmt, 448, 512, 64, sink=True, device="cuda")
    ind = kw["indices"]
    kw["indices"] = torch.full_like(ind, -1)
    o1, l1 = _direct(kw, fmt, **knobs)
    assert (o1 == 0).all() and torch.isposinf(l1).all()
    junk = ind.clone()
    junk[..., ::2] = torch.where(torch.arange(junk[..., ::2].numel(), device="cuda").view_as(junk[..., ::2]) % 3 == 0,
                                 -1, 1 << 30).to(junk.dtype)
    kw["indices"] = junk
    o0, l0 = _direct(kw, fmt, **_S17[fmt])
    o1, l1 = _direct(kw, fmt, **knobs)
    assert torch.equal(o1, o0) and torch.equal(l1, l0)


@pytest.mark.gpu
def test_gpu_ws3_row_lanes_v41_bit_identical(poison):
    """row_lanes=True on V4.1 (the WS kernel's [64, 4, 8] row-lanes order; V4.1's default since session 17) against
    the build without it."""
    kw = make_case(74, 3, 128, "v41", 576, 650, 64, with_len=True, sink=True, device="cuda")
    o0, l0 = _direct(kw, "v41", row_lanes=False)
    o1, l1 = _direct(kw, "v41", row_lanes=True)
    assert not torch.isnan(o0).any() and not torch.isnan(l0).any()
    assert torch.equal(o1, o0) and torch.equal(l1, l0)


@pytest.mark.gpu
def test_gpu_ws3_row_lanes_public_op(poison, ws3_route, monkeypatch):
    """Through the public op (FlashMLA tolerances) with both options made the V3.2 default."""
    monkeypatch.setattr(W3, "WS3_ROW_LANES", frozenset({"v32"}))
    monkeypatch.setattr(W3, "WS3_ROPE_ROWS", frozenset({"v32"}))
    kw = make_case(74, 3, 128, "v32", 576, 1024, 64, with_len=True, sink=True, device="cuda")
    run_and_check(kw)
    _ran(ws3_route)


def test_cluster_launcher_call_sequence(monkeypatch):
    """CPU, compiled kernel stubbed: the cluster launcher compiles its JIT kernel once through ``warmup`` (the runtime
    arguments, the scale, three zero offsets, the grid, the constexprs), reads the shared offsets from that compile's
    TTGIR, then launches every call through the compiled kernel's ``run`` with ``gx`` clusters' worth of grid X and
    packed metadata ``(num_warps, 2, shared)``: the arguments, the scale, the offsets, then the constexpr tail. The
    prefill subclass differs only in the JIT kernel it compiles."""
    import types
    from deepkernels.mla import _gluon_sparse_prefill_ws3 as P3
    runs, warm = [], []

    class Compiled:
        asm = {"ttgir": "ttgir-text"}
        metadata = types.SimpleNamespace(num_warps=4, shared=230000)
        function = object()

        def run(self, *a):
            runs.append(a)

    class Jit:
        def __init__(self, names):
            self.params = [types.SimpleNamespace(name=n) for n in names]

        def warmup(self, *a, grid, **meta):
            warm.append((a, grid, meta))
            return Compiled()

    names = ["x", "y", "scale_log2", "ring_off", "ready_off", "empty_off", "A", "B"]
    monkeypatch.setattr(W3, "_sparse_decode_gluon_ws3_kernel", Jit(names))
    monkeypatch.setattr(W3, "_offset_args", lambda ttgir: (0, 111, 222) if ttgir == "ttgir-text" else None)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: types.SimpleNamespace(cuda_stream=7))
    la = W3._ClusterLauncher(dict(A=1, B=True, num_warps=4, maxnreg=168))
    la(33, ("px", 5), 0.5)
    la(34, ("qx", 6), 0.25)
    assert len(warm) == 1 and warm[0][0] == ("px", 5, 0.5, 0, 0, 0) and warm[0][1] == (33, )
    assert warm[0][2] == dict(A=1, B=True, num_warps=4, maxnreg=168)
    assert [r[:4] for r in runs] == [(33, 1, 1, 7), (34, 1, 1, 7)]
    assert runs[1][5] == (4, 2, 230000) and runs[1][6:9] == (None, None, None)
    assert runs[1][9:] == ("qx", 6, 0.25, 0, 111, 222, 1, True)
    monkeypatch.setattr(P3, "_sparse_prefill_gluon_ws3_kernel", Jit(names[1:]))
    pla = P3._PrefillClusterLauncher(dict(A=2, B=False, num_warps=4, maxnreg=168))
    assert pla._jit_kernel() is P3._sparse_prefill_gluon_ws3_kernel
    pla(12, ("p", ), 1.0)
    assert warm[-1][0] == ("p", 1.0, 0, 0, 0) and runs[-1][9:] == ("p", 1.0, 0, 111, 222, 2, False)


def test_launcher_key_is_the_current_device(monkeypatch):
    """A cluster launcher holds a function loaded into the current device's context, so its cache key is the current
    device (what the launch uses), not q's device: with q on cuda:1 while cuda:0 is current, a later call with cuda:1
    current must not reuse cuda:0's function."""
    import types
    q = types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", 1))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    k0 = W3._launch_device(q)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert (k0, W3._launch_device(q)) == (0, 1)
    assert W3._launch_device(torch.zeros(1)) == -1
