"""Sparse prefill, WS2 variant (softmax warpgroup + PV warpgroup + the WS producer;
deepkernels.mla._gluon_sparse_prefill_ws2, not dispatched): compile tier on any machine (sm90 cross-compile: m64n64
S wgmmas of the softmax warpgroup and no m64n32, the two warpgroups' m64n256 P V wgmmas, 6 mbarriers, setmaxnreg of
the three partitions, shared memory, ptxas spills per partition loop), a CPU launcher check with the kernel stubbed,
and a GPU tier: the cases of tests/test_gluon_sparse_prefill.py through :func:`launch_sparse_prefill_gluon_ws2`
directly and through the public op with its Gluon launch routed here (counted), against the float reference with
FlashMLA's prefill tolerances (randn/10 inputs, junk indices -1 / >= s_kv, NaN in every unreferenced KV row,
non-contiguous views, NaN-poisoned outputs), and against the WS variant (tolerance, not bit-identity: the row sums
are reduced in another order).

The opt-in ``overlap`` schedules (constexpr OVERLAP 1 / 2, launcher keyword ``overlap``; module docstring section
"OVERLAP"): compile tier = the default kernel's cleaned PTX unchanged (sha256 per (d_pe, has_len, has_sink), taken
before the option existed), the option's wgmma / mbarrier / setmaxnreg counts, the register-operand P V of the
softmax warpgroup, ptxas spills per partition loop and every exp2 of the softmax between S_j's wait and P V_{j-1}'s
(the overlap itself, in SASS); launcher keys; GPU tier = the tests below parametrized over ``overlap`` 0 / 1 / 2
(ids ov0 / ov1 / ov2) plus the option against the default kernel on the same inputs.

The opt-in ``half_tiles`` ring (constexpr HALF, any OVERLAP; module docstring section "HALF"): compile tier = the
OVERLAP 1 / 2 kernels' cleaned PTX unchanged with HALF off (sha256 taken before HALF existed), the option's wgmma /
mbarrier / setmaxnreg counts, spills per partition loop, the two half-slot releases of each consumer warpgroup in
SASS order (wait_group 1 -> first half's arrive -> wait_group 0 -> second half's; with OVERLAP both before the P_j
handoff); launcher keys. GPU tier: every test parametrized over ``overlap`` also runs ids half0 / half1 / half2
(half_tiles with overlap 0 / 1 / 2), and the option-vs-default test covers them (bit identity recorded)."""
from __future__ import annotations

import functools
import hashlib
import re

import pytest
import torch

from deepkernels.mla import _gluon_sparse_prefill as G
from deepkernels.mla import _gluon_sparse_prefill_ws2 as P
from deepkernels.reference.mla_prefill import sparse_prefill_ref
from deepkernels.testing.compile import (clean_ptx, n_hgmma, n_spill, ptxas_sm90_cached, sass_loops,
                                         setmaxnreg_values)
from deepkernels.testing.numerics import check_is_allclose

from test_mla_prefill import make_case

pytestmark = pytest.mark.skipif(not P.available(), reason=f"Gluon not importable: {P._IMPORT_ERROR!r}")


# ------------------------------------------------------------------ compile tier (CPU cross-compile for sm90)
@functools.lru_cache(maxsize=None)
def _compiled(d_pe, has_len, has_sink, overlap=0, half_tiles=False):
    kw = dict(half_tiles=True) if half_tiles else {}     # the pre-HALF call for the hashed kernels
    k = P.compile_sm90_ws2(d_pe, has_len, has_sink, overlap=overlap, **kw)
    return k.asm["ptx"], k.metadata.shared


# (d_pe, has_len, has_sink): d_qk 576 and 512 (what supported() accepts), lengths and sinks on and off
_CONFIGS = [(64, False, False), (64, True, True), (64, False, True), (0, True, False), (0, False, False)]
_SMEM = {64: 229888, 0: 205296}      # measured (Triton 3.6), max over the configurations


@pytest.mark.compile
@pytest.mark.parametrize("d_pe,has_len,has_sink", _CONFIGS)
def test_compile_sm90_ws2(d_pe, has_len, has_sink):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    ptx, shared = _compiled(d_pe, has_len, has_sink)
    k_steps = (512 + d_pe) // 16
    # softmax WG: the full S as m64n64k16 (no m64n32 split), P V[:, :256] 4 x m64n256k16; PV WG: P V[:, 256:] 4 x
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k16") == k_steps
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n32k16") == 0
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16") == 8
    assert ptx.count("wgmma.mma_async") == k_steps + 8
    assert shared <= SM90_SMEM_LIMIT and shared <= _SMEM[d_pe] + 64, shared
    # 6 mbarriers: ready x 2, empty x 2, pready, pfree; waits: producer empty, softmax ready + pfree (loop and
    # epilogue), PV ready + pready (loop and epilogue) = 7; arrives: producer ready, softmax pready x 2 + empty,
    # PV pfree + empty = 6
    assert ptx.count("mbarrier.init.shared") == 6
    assert ptx.count("mbarrier.try_wait.parity") == 7
    assert ptx.count("mbarrier.arrive.shared::cta") == 6
    assert "cp.async.mbarrier.arrive" in ptx and "fence.proxy.async" in ptx
    assert "cp.async.wait_group" not in ptx     # the producer tracks its copies by the mbarrier, no commit groups
    # partitions' registers: producer, PV warpgroup, the softmax warpgroup gets the rest of the launch cap
    soft = (P.WS2_MAXNREG * 12 * 32 - (P.WS2_PRODUCER_REGS + P.WS2_PV_REGS) * 128) // 128 // 8 * 8
    regs = setmaxnreg_values(ptx)
    assert ("inc", P.WS2_PV_REGS) in regs and ("dec", soft) in regs, regs
    assert any(r == P.WS2_PRODUCER_REGS for _, r in regs), regs
    # ptxas (Triton 3.6 wheel), measured: 0 spill instructions in the softmax token loop (36 / 32 S k-steps + 4 P V),
    # the PV token loop (4 P V k-steps) and the producer block loop (setmaxnreg 56); 0 bytes of spill in all
    rep = ptxas_sm90_cached(ptx)
    if rep is None:
        pytest.skip("ptxas not available")
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", rep.log)
    assert spill, rep.log
    loops = sass_loops(rep.sass)
    s_loops = [lp for lp in loops if n_hgmma(lp) == k_steps + 4]
    pv_loops = [lp for lp in loops if n_hgmma(lp) == 4]
    prod = [lp for lp in loops if not n_hgmma(lp) and any("LDGSTS" in t for t in lp)]
    assert len(s_loops) == 1 and len(pv_loops) == 1 and len(prod) == 1, (len(s_loops), len(pv_loops), len(prod))
    assert n_spill(s_loops[0]) == 0, f"{n_spill(s_loops[0])} spill instructions in the softmax token loop"
    assert n_spill(pv_loops[0]) == 0, f"{n_spill(pv_loops[0])} spill instructions in the PV token loop"
    assert n_spill(prod[0]) <= 2, f"{n_spill(prod[0])} spill instructions in the producer block loop"
    assert int(spill.group(1)) <= 64 and int(spill.group(2)) <= 64, rep.log


# sha256 of the cleaned PTX of the dispatched kernel (overlap 0) before the OVERLAP option existed (git 52d0099,
# Triton 3.6.0, sm_90a), per (d_pe, has_len, has_sink): the option must leave it byte-identical.
_BASE_PTX_SHA = {
    (64, False, False): "1c9c679858aae02cb57146f2801ae90030f8b66aa1eaa438043192a71daf1c56",
    (64, False, True): "1a7c8605eafe37bdc9ca5435fc6701792ebb452768383eba5c734764f1f45352",
    (64, True, False): "b5802f342008f68684bc1c9744d1d234d40a7b80e29c1cb120835b4a2a2c385f",
    (64, True, True): "fce0920a22e2b4c8689688c105af24919fcf711d5534e5e0b2dd9f07d7c096c8",
    (0, False, False): "2ad0233271a3cd47e207e93fa95e31c4e78fc084f4e39ade453760be42dfb364",
    (0, False, True): "8064b771fa355d6568b9ef6f2777e953b7c9eed16e6067d75104dae1db976e6c",
    (0, True, False): "b6edd73a428842070db35ff7982eafdf742b5274d3d92aef3f39cdd62dda23e2",
    (0, True, True): "2cb4852c334f851a1853823c049713f587fb3ca1e3e75a0417f6f47e6b076488",
}


@pytest.mark.compile
@pytest.mark.parametrize("d_pe,has_len,has_sink", list(_BASE_PTX_SHA))
def test_default_ptx_unchanged(d_pe, has_len, has_sink):
    import triton
    if triton.__version__ != "3.6.0":
        pytest.skip(f"hashes taken with Triton 3.6.0, not {triton.__version__}")
    ptx, _ = _compiled(d_pe, has_len, has_sink)
    digest = hashlib.sha256(clean_ptx(ptx).encode()).hexdigest()
    assert digest == _BASE_PTX_SHA[(d_pe, has_len, has_sink)]


# sha256 of the cleaned PTX of the OVERLAP 1 / 2 kernels before the HALF option existed (git 42429e3, Triton 3.6.0,
# sm_90a), per (overlap, d_pe, has_len, has_sink): with half_tiles off they must stay byte-identical.
_BASE_OV_PTX_SHA = {
    (1, 64, False, False): "8e35e6992dc6bb09cada19c5b9c1bd09ff31c49f688157be792f50604d2145fc",
    (1, 64, False, True): "1dc7fefc78afcf7d3295464a32418fe42702481eeb74cb82477e41ea9cc041db",
    (1, 64, True, False): "028fd7040c0855923299f21f330c01256bd36b642afcaa63916354d32a6a4c3b",
    (1, 64, True, True): "90aac3aa1102ee540692b994e26faffd531e3be83f97bfe2cf0955b21b0f0d60",
    (1, 0, False, False): "5ccbc92b1d8a508d308ff827d7ffc29640eaf7e3eda77137e92d151917305799",
    (1, 0, False, True): "22c9cf58ebfc94e5ece5a80763e8ba0c171ee8abe77667e3908754de9fef5318",
    (1, 0, True, False): "5793cdc4a552e10834642da2d75c81843e249f19dd6cfa12ab44f9c4d23530d3",
    (1, 0, True, True): "47a455f595459ba06780788451f3d836504e3c1be57347c78cbe6ebfa00a738b",
    (2, 64, False, False): "d1ba5ee0bc262c556add444825e56a3dc176748eb148ec725f1f044d46f94dd4",
    (2, 64, False, True): "df63bdbe2e7efb5ae9332ed9d1b33874d20b8050d08f8e496c80952ef2f03f8c",
    (2, 64, True, False): "0cf06aefad4c2a3d9864d105d6742cbc7c4068084b2a62f95a83859e7c31aa3a",
    (2, 64, True, True): "a19ff0e612890e36bf1235d232bcd78abfa26d98397d3694a425e5baf568b15e",
    (2, 0, False, False): "4f053a3719b250081391eefb451c95aeeebce598a3f142a06b0dc8c6ce04cd82",
    (2, 0, False, True): "fb8d1c719bc1f3be869429d1d0b56b10ab0d5668d35e2bb0fb023fcf95c8a493",
    (2, 0, True, False): "7b1d068905eb81aec644dd5b074a765a6bde236e98200894c45cbf83d6bf5b40",
    (2, 0, True, True): "9c08c07d8a7c8d5718b4c197374f4bb89f5c0fbd931d1f2fc0f9a21d13b3f61f",
}


@pytest.mark.compile
@pytest.mark.parametrize("overlap,d_pe,has_len,has_sink", list(_BASE_OV_PTX_SHA))
def test_overlap_ptx_unchanged(overlap, d_pe, has_len, has_sink):
    import triton
    if triton.__version__ != "3.6.0":
        pytest.skip(f"hashes taken with Triton 3.6.0, not {triton.__version__}")
    ptx, _ = _compiled(d_pe, has_len, has_sink, overlap)
    digest = hashlib.sha256(clean_ptx(ptx).encode()).hexdigest()
    assert digest == _BASE_OV_PTX_SHA[(overlap, d_pe, has_len, has_sink)]


def _order(loop):
    """Positions of the first / last instruction of some kinds in a SASS loop."""
    pos = {"depbar": [], "ex2": [], "hgmma": []}
    for i, t in enumerate(loop):
        op = t.split()[1] if t.startswith("@") else t.split()[0]
        if op.startswith("WARPGROUP.DEPBAR"):
            pos["depbar"].append(i)
        elif op.startswith("MUFU.EX2"):
            pos["ex2"].append(i)
        elif op.startswith("HGMMA"):
            pos["hgmma"].append(i)
    return pos


@pytest.mark.compile
@pytest.mark.parametrize("overlap", [1, 2], ids=lambda o: f"ov{o}")
@pytest.mark.parametrize("d_pe,has_len,has_sink", _CONFIGS + [(0, True, True)])
def test_compile_overlap(d_pe, has_len, has_sink, overlap):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    ptx, shared = _compiled(d_pe, has_len, has_sink, overlap)
    k_steps = (512 + d_pe) // 16
    # softmax WG: S in the prologue and in the loop (2 x k_steps m64n64k16), its P V in the loop and the tail (2 x 4
    # m64n256k16 with P as the REGISTER operand); PV WG: 4 m64n256k16 from shared memory
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k16") == 2 * k_steps
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16") == 12
    assert ptx.count("wgmma.mma_async") == 2 * k_steps + 12
    rs = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16\s*\{[^}]*\},\s*\{", ptx)
    assert len(rs) == 8, len(rs)          # 2 P V sites x 4 k-steps with a register A operand
    assert shared <= SM90_SMEM_LIMIT and shared <= _SMEM[d_pe] + 64, shared
    # mbarriers: ready x 2, empty x 2, pready, pfree (+ sdone with overlap 1). Waits: producer empty; softmax ready
    # (prologue, loop), pfree (prologue, loop, epilogue); PV ready, pready (loop, epilogue) [+ sdone] = 8 [9]; the
    # ptx repeats the handoff's pfree wait per inlined site. Arrives: producer ready; softmax pready (prologue,
    # loop, epilogue), empty (loop, tail) [+ sdone loop, tail]; PV pfree, empty.
    assert ptx.count("mbarrier.init.shared") == (7 if overlap == 1 else 6)
    assert ptx.count("mbarrier.try_wait.parity") == (10 if overlap == 1 else 9)
    assert ptx.count("mbarrier.arrive.shared::cta") == (10 if overlap == 1 else 8)
    soft = (P.WS2_MAXNREG * 12 * 32 - (P.WS2_PRODUCER_REGS + P.WS2_OV_PV_REGS) * 128) // 128 // 8 * 8
    regs = setmaxnreg_values(ptx)
    assert regs == [("dec", P.WS2_PRODUCER_REGS), ("dec", soft), ("inc", P.WS2_OV_PV_REGS)], regs   # 56 / 248 / 200
    rep = ptxas_sm90_cached(ptx)
    if rep is None:
        pytest.skip("ptxas not available")
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", rep.log)
    assert spill, rep.log
    loops = sass_loops(rep.sass)
    s_loops = [lp for lp in loops if n_hgmma(lp) == k_steps + 4]
    pv_loops = [lp for lp in loops if n_hgmma(lp) == 4]
    prod = [lp for lp in loops if not n_hgmma(lp) and any("LDGSTS" in t for t in lp)]
    assert len(s_loops) == 1 and len(pv_loops) == 1 and len(prod) == 1, (len(s_loops), len(pv_loops), len(prod))
    # measured (Triton 3.6 wheel's ptxas, PV 200 / softmax 248): 2-4 spill instructions in the softmax block loop
    # (loads of loop-invariant values before the P pack), 0 in the PV and producer loops, 40-56 bytes in all
    assert n_spill(s_loops[0]) <= 4, f"{n_spill(s_loops[0])} spill instructions in the softmax block loop"
    assert n_spill(pv_loops[0]) == 0, f"{n_spill(pv_loops[0])} spill instructions in the PV block loop"
    assert n_spill(prod[0]) <= 2, f"{n_spill(prod[0])} spill instructions in the producer block loop"
    assert int(spill.group(1)) <= 64 and int(spill.group(2)) <= 64, rep.log
    # the overlap itself: in the softmax block loop the S_j wgmmas, then P V_{j-1}'s, then the S wait
    # (wait_group 1), EVERY exp2 of softmax_j, and only then P V_{j-1}'s wait (wait_group 0)
    pos = _order(s_loops[0])
    assert len(pos["depbar"]) == 2 and len(pos["ex2"]) == 34, pos
    assert pos["hgmma"][-1] < pos["depbar"][0] < min(pos["ex2"]) and max(pos["ex2"]) < pos["depbar"][1], pos


@pytest.mark.compile
def test_launch_overlap_keys(monkeypatch):
    """overlap=1 / 2 reach the kernel as OVERLAP with the option's PV setmaxnreg, key the launcher apart from the
    default; an unknown value raises (kernel stubbed; CPU tensors)."""
    seen = []

    def fake_cached(cache, fn, key, meta, limit):
        seen.append((key, meta()))
        return lambda grid, *args: None

    monkeypatch.setattr(P, "cached_launcher", fake_cached)
    q = torch.zeros(2, 64, 576, dtype=torch.bfloat16)
    kv = torch.zeros(100, 1, 576, dtype=torch.bfloat16)
    ind = torch.zeros(2, 1, 64, dtype=torch.int32)
    out = torch.empty(2, 64, 512, dtype=torch.bfloat16)
    ml, lse = torch.empty(2, 64), torch.empty(2, 64)
    for ov in (0, 1, 2):
        P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 0.5, overlap=ov)
    P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 0.5, overlap=1, pv_regs=216)
    metas = [m for _, m in seen]
    assert [m["OVERLAP"] for m in metas] == [0, 1, 2, 1]
    assert [m["PV_REGS"] for m in metas] == [P.WS2_PV_REGS, P.WS2_OV_PV_REGS, P.WS2_OV_PV_REGS, 216]
    assert len({k for k, _ in seen}) == 4
    for bad in (3, -1, True, "1"):
        with pytest.raises(ValueError):
            P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 0.5, overlap=bad)
    with pytest.raises(ValueError):
        P.compile_sm90_ws2(overlap=5)


def _arrives(loop):
    """Positions of the mbarrier arrives (SYNCS.ARRIVE) and waits (SYNCS.PHASECHK ... TRYWAIT) in a SASS loop."""
    arr = [i for i, t in enumerate(loop) if "SYNCS.ARRIVE" in t]
    wt = [i for i, t in enumerate(loop) if "SYNCS.PHASECHK" in t and "TRYWAIT" in t]
    return arr, wt


# HALF compile facts (Triton 3.6 wheel, ptxas sm_90a), per overlap: shared memory (max over has_len) for d_pe 64 / 0,
# mbarrier try_wait / arrive sites in the PTX, setmaxnreg values
_HALF_SMEM = {0: {64: 229920, 0: 205328}, 1: {64: 229952, 0: 205344}, 2: {64: 229920, 0: 205328}}
_HALF_BARS = {0: (10, 10, 9), 1: (11, 14, 14), 2: (10, 13, 12)}        # init, try_wait, arrive


@pytest.mark.compile
@pytest.mark.parametrize("overlap", [0, 1, 2], ids=lambda o: f"half{o}")
@pytest.mark.parametrize("d_pe,has_len,has_sink", _CONFIGS + [(0, True, True)])
def test_compile_half(d_pe, has_len, has_sink, overlap):
    from deepkernels.testing.compile import SM90_SMEM_LIMIT
    ptx, shared = _compiled(d_pe, has_len, has_sink, overlap, True)
    k_steps = (512 + d_pe) // 16
    # S per 64 tokens as before (m64n64k16; no m64n32: an N = 32 S would need 192 B/clk of shared memory); P V as
    # 32-token groups: 2 m64n256k16 per group, 2 groups per warpgroup and block (+ the softmax WG's tail with OVERLAP)
    n_s = k_steps if overlap == 0 else 2 * k_steps
    n_pv = 8 if overlap == 0 else 12
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k16") == n_s
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n32k16") == 0
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n256k16") == n_pv
    rs = re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n256k16\.f32\.bf16\.bf16\s*\{[^}]*\},\s*\{", ptx)
    assert len(rs) == (0 if overlap == 0 else 8), len(rs)     # register-A P halves (OVERLAP): loop + tail
    assert shared <= SM90_SMEM_LIMIT and shared <= _HALF_SMEM[overlap][d_pe], shared
    # 4 ready + 4 empty (one per half-slot), pready, pfree [+ sdone]
    init, waits, arrives = _HALF_BARS[overlap]
    assert ptx.count("mbarrier.init.shared") == init
    assert ptx.count("mbarrier.try_wait.parity") == waits
    assert ptx.count("mbarrier.arrive.shared::cta") == arrives
    assert ptx.count("cp.async.mbarrier.arrive") == 2       # one per half in the producer
    regs = setmaxnreg_values(ptx)
    if overlap == 0:
        soft = (P.WS2_MAXNREG * 12 * 32 - (P.WS2_PRODUCER_REGS + P.WS2_HALF_PV_REGS) * 128) // 128 // 8 * 8
        assert regs == [("dec", P.WS2_PRODUCER_REGS), ("dec", soft), ("inc", P.WS2_HALF_PV_REGS)], regs  # 56/232/216
    else:   # PV 192 -> the softmax warpgroup gets 256 (Triton's own entry value, filtered by _setmaxnreg)
        assert regs == [("dec", P.WS2_PRODUCER_REGS), ("inc", P.WS2_HALF_OV_PV_REGS)], regs
    rep = ptxas_sm90_cached(ptx)
    if rep is None:
        pytest.skip("ptxas not available")
    spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", rep.log)
    assert spill, rep.log
    loops = sass_loops(rep.sass)
    s_loops = [lp for lp in loops if n_hgmma(lp) == k_steps + 4]
    pv_loops = [lp for lp in loops if n_hgmma(lp) == 4]
    prod = [lp for lp in loops if not n_hgmma(lp) and any("LDGSTS" in t for t in lp)]
    assert len(s_loops) == 1 and len(pv_loops) == 1 and len(prod) == 1, (len(s_loops), len(pv_loops), len(prod))
    # measured: OVERLAP 0 no spill at all; OVERLAP 1 / 2 0-3 spill instructions in the softmax block loop, 0-16 B
    assert n_spill(s_loops[0]) <= (0 if overlap == 0 else 3), n_spill(s_loops[0])
    assert n_spill(pv_loops[0]) == 0 and n_spill(prod[0]) == 0, (n_spill(pv_loops[0]), n_spill(prod[0]))
    assert int(spill.group(1)) <= (0 if overlap == 0 else 16), rep.log
    # the producer: 36 cp.async (16 B) per thread and block, as before (2 x 18 per half); 2 empty waits
    assert sum(1 for t in prod[0] if re.match(r"(@!?U?P\w+ )?LDGSTS", t)) == (36 if d_pe else 32)
    assert sum(1 for t in prod[0] if "ARRIVES.LDGSTSBAR" in t) == 2     # cp.async.mbarrier.arrive per half
    assert sum(1 for t in prod[0] if "SYNCS.PHASECHK" in t and "TRYWAIT" in t) == 2
    # the PV warpgroup: wait_group 1 -> first half-slot's empty; wait_group 0 -> pfree, second half-slot's empty
    pos = _order(pv_loops[0])
    arr, _ = _arrives(pv_loops[0])
    assert len(pos["depbar"]) == 2 and len(arr) == 3, (pos, arr)
    assert pos["depbar"][0] < arr[0] < pos["depbar"][1] < arr[1] < arr[2], (pos, arr)
    # the softmax warpgroup: S wait, then the two P V commit groups' waits, each followed by its half-slot release
    pos = _order(s_loops[0])
    arr, wt = _arrives(s_loops[0])
    d = pos["depbar"]
    assert len(d) == 3 and len(pos["ex2"]) == 34, pos
    rel = [a for a in arr if a > d[1]]
    assert d[1] < rel[0] < d[2] < rel[1], (d, arr)
    assert d[0] < min(pos["ex2"]), pos           # no exp2 before S_j's wait
    if overlap == 0:
        assert max(pos["ex2"]) < d[1], pos       # the softmax before P V, as the default
    else:
        # FA3 order: S_j and both P V_{j-1} groups issued before S_j's wait; both half-slot releases precede the P_j
        # handoff (its pfree wait: the loop's last mbarrier wait) -- the point of the option (module docstring)
        assert pos["hgmma"][-1] < d[0], pos
        assert rel[1] < wt[-1] < arr[-1], (d, arr, wt)


@pytest.mark.compile
def test_launch_half_keys(monkeypatch):
    """half_tiles=True reaches the kernel as HALF (with any overlap) with its PV setmaxnreg, keys the launcher apart;
    a non-bool raises (kernel stubbed; CPU tensors)."""
    seen = []

    def fake_cached(cache, fn, key, meta, limit):
        seen.append((key, meta()))
        return lambda grid, *args: None

    monkeypatch.setattr(P, "cached_launcher", fake_cached)
    q = torch.zeros(2, 64, 576, dtype=torch.bfloat16)
    kv = torch.zeros(100, 1, 576, dtype=torch.bfloat16)
    ind = torch.zeros(2, 1, 64, dtype=torch.int32)
    out = torch.empty(2, 64, 512, dtype=torch.bfloat16)
    ml, lse = torch.empty(2, 64), torch.empty(2, 64)
    for ov, half in ((0, False), (0, True), (1, True), (2, True), (1, False)):
        P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 0.5, overlap=ov, half_tiles=half)
    metas = [m for _, m in seen]
    assert [(m["OVERLAP"], m["HALF"]) for m in metas] == [(0, False), (0, True), (1, True), (2, True), (1, False)]
    assert [m["PV_REGS"] for m in metas] == [P.WS2_PV_REGS, P.WS2_HALF_PV_REGS, P.WS2_HALF_OV_PV_REGS,
                                             P.WS2_HALF_OV_PV_REGS, P.WS2_OV_PV_REGS]
    assert len({k for k, _ in seen}) == 5
    for bad in (1, 0, None, "1"):
        with pytest.raises(ValueError):
            P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 0.5, half_tiles=bad)
    with pytest.raises(ValueError):
        P.compile_sm90_ws2(half_tiles=1)


@pytest.mark.compile
def test_module_contract():
    assert P.DISPATCH is True     # dispatched since session 16 (1.15-1.19x the WS kernel)
    assert P.supported_ws2 is G.supported
    # the kernel takes the WS kernel's runtime arguments in the same order (a drop-in for the launch)
    ws_args = [a for a in G._sparse_prefill_gluon_ws_kernel.arg_names if not a.isupper()]
    ws2_args = [a for a in P._sparse_prefill_gluon_ws2_kernel.arg_names if not a.isupper()]
    assert ws_args == ws2_args
    # H_Q is a runtime argument (upper case as in the WS kernel); the rest of the upper-case names are constexprs
    ws2_upper = [a for a in P._sparse_prefill_gluon_ws2_kernel.arg_names if a.isupper()]
    assert ws2_upper[0] == "H_Q" and ws2_upper[1:] == list(P._CONSTEXPRS)
    # registers: 12 warps within the register file, setmaxnreg values multiples of 8 and <= 256
    assert P.WS2_MAXNREG * 12 * 32 <= 65536
    soft = (P.WS2_MAXNREG * 12 * 32 - (P.WS2_PRODUCER_REGS + P.WS2_PV_REGS) * 128) // 128
    assert all(r % 8 == 0 and 24 <= r <= 256 for r in (P.WS2_PRODUCER_REGS, P.WS2_PV_REGS, soft // 8 * 8))


@pytest.mark.compile
def test_launch_args_on_cpu(monkeypatch):
    """The launcher passes the WS launch's arguments, grid and constexprs (kernel stubbed; CPU tensors)."""
    seen = {}

    def fake_cached(cache, fn, key, meta, limit):
        seen["fn"], seen["key"], seen["meta"] = fn, key, meta()

        def launch(grid, *args):
            seen["grid"], seen["args"] = grid, args
        return launch

    monkeypatch.setattr(P, "cached_launcher", fake_cached)
    s_q, h_q, s_kv, topk = 3, 128, 100, 192
    q = torch.zeros(s_q, h_q, 576, dtype=torch.bfloat16)
    kv = torch.zeros(s_kv, 1, 576, dtype=torch.bfloat16)
    ind = torch.zeros(s_q, 1, topk, dtype=torch.int32)
    out = torch.empty(s_q, h_q, 512, dtype=torch.bfloat16)
    ml, lse = torch.empty(s_q, h_q), torch.empty(s_q, h_q)
    tl = torch.zeros(s_q, dtype=torch.int32)
    P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 0.25, None, tl)
    assert seen["fn"] is P._sparse_prefill_gluon_ws2_kernel
    assert seen["grid"] == (s_q * 2, )
    assert seen["meta"] == dict(D_PE=64, HAS_LEN=True, HAS_SINK=False, PRODUCER_REGS=P.WS2_PRODUCER_REGS,
                                PV_REGS=P.WS2_PV_REGS, OVERLAP=0, HALF=False, num_warps=4, maxnreg=P.WS2_MAXNREG)
    a = seen["args"]
    assert a[0] is q and a[1] is kv and a[2] is ind and a[3] is tl and a[4] is lse and a[5] is out
    assert a[6] is ml and a[7] is lse and a[8:10] == (s_kv, topk)
    assert a[10] == 0.25 and abs(a[11] - 0.25 * 1.4426950408889634) < 1e-12
    assert a[12:] == (q.stride(0), q.stride(1), kv.stride(0), ind.stride(0), out.stride(0), out.stride(1), h_q)
    seen.clear()
    P.launch_sparse_prefill_gluon_ws2(out[:0], ml[:0], lse[:0], q[:0], kv, ind[:0], 0.25)
    assert not seen                                  # s_q 0: nothing launched


@pytest.mark.compile
@pytest.mark.parametrize("env,expect", [("1", "ws2"), ("0", "ws"), (None, "ws2" if P.DISPATCH else "ws")])
def test_dispatch_switch(monkeypatch, env, expect):
    """prefill._launch_sparse_prefill -> launch_sparse_prefill_gluon (variant None) sends the Gluon-eligible call to
    WS2 iff dispatch_on() (DEEPKERNELS_SPARSE_PREFILL_WS2 overrides DISPATCH), else to the WS variant; kernel
    launches stubbed, CPU tensors."""
    from deepkernels.mla import prefill
    if env is None:
        monkeypatch.delenv("DEEPKERNELS_SPARSE_PREFILL_WS2", raising=False)
    else:
        monkeypatch.setenv("DEEPKERNELS_SPARSE_PREFILL_WS2", env)
    seen = []
    monkeypatch.setattr(G, "supported", lambda q, kv: True)
    monkeypatch.setattr(G, "cached_launcher",
                        lambda cache, fn, *a, **k: (lambda grid, *args: seen.append(
                            "ws" if fn is G._sparse_prefill_gluon_ws_kernel else fn)))
    monkeypatch.setattr(P, "launch_sparse_prefill_gluon_ws2", lambda *a, **k: seen.append("ws2"))
    q = torch.zeros(2, 64, 576, dtype=torch.bfloat16)
    kv = torch.zeros(10, 1, 576, dtype=torch.bfloat16)
    ind = torch.zeros(2, 1, 64, dtype=torch.int32)
    out = torch.empty(2, 64, 512, dtype=torch.bfloat16)
    ml, lse = torch.empty(2, 64), torch.empty(2, 64)
    prefill._launch_sparse_prefill(out, ml, lse, q, kv, ind, 0.5)
    assert seen == [expect]


# ------------------------------------------------------------------ GPU tier
# (overlap, half_tiles): ids ov0 / ov1 / ov2 as before the HALF option, half0 / half1 / half2 with half tiles
MODES = [(0, False), (1, False), (2, False), (0, True), (1, True), (2, True)]
OVS = pytest.mark.parametrize("overlap,half_tiles", MODES,
                              ids=[f"half{o}" if h else f"ov{o}" for o, h in MODES])


def _run(q, kv, ind, sk, tl, sm_scale=0.5, name="", overlap=0, half_tiles=False):
    s_q, h_q, _ = q.shape
    out = torch.full((s_q, h_q, 512), float("nan"), dtype=torch.bfloat16, device=q.device)
    ml = torch.full((s_q, h_q), float("nan"), device=q.device)
    lse = torch.full((s_q, h_q), float("nan"), device=q.device)
    assert P.supported_ws2(q, kv)
    P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, sm_scale, sk, tl, overlap=overlap,
                                      half_tiles=half_tiles)
    ro, rml, rlse = sparse_prefill_ref(q, kv, ind, sm_scale, 512, sk, tl)
    assert check_is_allclose(f"{name} out", out.float(), ro, abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose(f"{name} lse", lse, rlse, abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert check_is_allclose(f"{name} max_logits", ml, rml, abs_tol=1e-6, rel_tol=2.01 / 65536)
    assert not torch.isnan(out).any() and not torch.isnan(lse).any() and not torch.isnan(ml).any()
    return out, ml, lse


@pytest.fixture
def ws2_route(monkeypatch):
    """The public op's Gluon launch goes to launch_sparse_prefill_gluon_ws2 (DEEPKERNELS_SPARSE_PREFILL_WS2=1, as
    dispatched by default since session 16); each launch is counted."""
    calls = []
    launch = P.launch_sparse_prefill_gluon_ws2

    def counted(out, max_logits, lse, q, kv, indices, *args, **kw):
        assert P.supported_ws2(q, kv)
        launch(out, max_logits, lse, q, kv, indices, *args, **kw)
        calls.append(q.shape)

    monkeypatch.setenv("DEEPKERNELS_SPARSE_PREFILL_WS2", "1")
    monkeypatch.setattr(P, "launch_sparse_prefill_gluon_ws2", counted)
    return calls


@pytest.mark.gpu
@OVS
def test_gpu_ws2_smoke(overlap, half_tiles):
    """One small call (the device scripts run this first, under a hang guard)."""
    q, kv, ind, sk, tl = make_case(5, 300, 192, h_q=128, sink=True, with_len=True, all_invalid=True, device="cuda")
    _run(q, kv, ind, sk, tl, name="smoke", overlap=overlap, half_tiles=half_tiles)


@pytest.mark.gpu
@pytest.mark.parametrize("d_qk,h_q", [(576, 128), (576, 64), (512, 64), (512, 128)])
@pytest.mark.parametrize("s_kv,topk", [(592, 128), (1521, 512), (114, 384), (4096, 100)])
@OVS
def test_gpu_regular(d_qk, h_q, s_kv, topk, overlap, half_tiles):
    q, kv, ind, sk, tl = make_case(62, s_kv, topk, h_q=h_q, d_qk=d_qk, device="cuda")
    _run(q, kv, ind, sk, tl, name=f"{d_qk}/{h_q}/{s_kv}/{topk}", overlap=overlap, half_tiles=half_tiles)


@pytest.mark.gpu
@pytest.mark.parametrize("d_qk", [576, 512])
@pytest.mark.parametrize("sink,with_len", [(False, False), (True, False), (False, True), (True, True)])
@OVS
def test_gpu_features(sink, with_len, d_qk, overlap, half_tiles):
    q, kv, ind, sk, tl = make_case(213, 1592, 384, h_q=128, d_qk=d_qk, sink=sink, with_len=with_len,
                                   all_invalid=True, device="cuda")
    _run(q, kv, ind, sk, tl, name=f"sink={sink} len={with_len}", overlap=overlap, half_tiles=half_tiles)


@pytest.mark.gpu
@pytest.mark.parametrize("s_q,s_kv,topk", [(1, 128, 128), (1234, 4321, 4096), (1024, 32, 2048), (3, 64, 0),
                                           (5, 200, 16), (5, 300, 48)])
@OVS
def test_gpu_corners(s_q, s_kv, topk, overlap, half_tiles):
    # all-invalid rows, blocks with no valid index (s_kv << topk), topk = 0, one partial block
    q, kv, ind, sk, tl = make_case(s_q, s_kv, topk, h_q=128, sink=True, all_invalid=topk > 0, device="cuda")
    _run(q, kv, ind, sk, tl, overlap=overlap, half_tiles=half_tiles)


@pytest.mark.gpu
@pytest.mark.parametrize("s_q,s_kv,topk,with_len", [(37, 1000, 192, False), (29, 3000, 448, True),
                                                    (16, 100, 320, False), (9, 5000, 1088, True)])
@OVS
def test_gpu_odd_blocks(s_q, s_kv, topk, with_len, overlap, half_tiles):
    # an odd number of 64-token blocks: the 2-slot ring and the pready / pfree [/ sdone] phases end on either
    # parity; with topk_length the per-row block count varies (odd, even, 1, 0)
    q, kv, ind, sk, tl = make_case(s_q, s_kv, topk, h_q=128, sink=True, with_len=with_len, all_invalid=True,
                                   device="cuda")
    _run(q, kv, ind, sk, tl, name=f"odd {s_q}/{s_kv}/{topk}/{with_len}", overlap=overlap, half_tiles=half_tiles)


@pytest.mark.gpu
@OVS
def test_gpu_topk_length_zero_and_all_invalid(overlap, half_tiles):
    # topk_length 0 for every row / all indices invalid (-1 and >= s_kv): out 0, lse +inf, max_logits -inf
    q, kv, ind, sk, _ = make_case(7, 500, 256, h_q=128, sink=True, device="cuda")
    tl = torch.zeros(7, dtype=torch.int32, device="cuda")
    out, ml, lse = _run(q, kv, ind, sk, tl, name="topk_length 0", overlap=overlap, half_tiles=half_tiles)
    assert (out == 0).all() and torch.isinf(lse).all() and (lse > 0).all() and (ml == float("-inf")).all()
    ind = torch.where(torch.rand(ind.shape, device="cuda") < 0.5, -1, 500 + 7).to(torch.int32)
    out, ml, lse = _run(q, kv, ind, sk, None, name="all invalid", overlap=overlap, half_tiles=half_tiles)
    assert (out == 0).all() and (lse == float("inf")).all() and (ml == float("-inf")).all()


@pytest.mark.gpu
@OVS
def test_gpu_huge_logits(overlap, half_tiles):
    # FlashMLA d626421: exp2 of the max element is exactly 1 even with huge logits; 3 blocks (odd), the value 32 in
    # every valid row, the second query's row valid for 100 of 192 positions only
    q = torch.full((2, 64, 576), 32.0, device="cuda").bfloat16()
    kv = torch.full((200, 1, 576), 32.0, device="cuda").bfloat16()
    ind = torch.arange(192, device="cuda", dtype=torch.int32).view(1, 1, 192).repeat(2, 1, 1)
    ind[1, 0, 100:] = -1
    out = torch.empty(2, 64, 512, dtype=torch.bfloat16, device="cuda")
    ml, lse = torch.empty(2, 64, device="cuda"), torch.empty(2, 64, device="cuda")
    P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 1.0, overlap=overlap, half_tiles=half_tiles)
    assert torch.isfinite(lse).all() and (out.float() - 32).abs().max() == 0


@pytest.mark.gpu
@pytest.mark.parametrize("d_qk", [576, 512])
@pytest.mark.parametrize("sink,with_len", [(True, True), (False, False)])
def test_gpu_public_op_routed(d_qk, sink, with_len, ws2_route):
    """flash_mla_sparse_fwd (and the out-parameter launcher's checks) with the Gluon launch routed to WS2."""
    from test_mla_prefill import run_and_check
    from deepkernels.mla.prefill import flash_mla_sparse_fwd
    q, kv, ind, sk, tl = make_case(97, 3000, 1024, h_q=128, d_qk=d_qk, sink=sink, with_len=with_len,
                                   all_invalid=True, device="cuda")
    run_and_check(q, kv, ind, sk, tl, name=f"public {d_qk}")
    assert len(ws2_route) == 1, f"{len(ws2_route)} WS2 launches, expected 1"
    out, ml, lse = flash_mla_sparse_fwd(q, kv, ind, 0.5, attn_sink=sk, topk_length=tl)
    assert len(ws2_route) == 2, f"{len(ws2_route)} WS2 launches, expected 2"
    ro, rml, rlse = sparse_prefill_ref(q, kv, ind, 0.5, 512, sk, tl)
    assert check_is_allclose("public out", out.float(), ro, abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
    assert check_is_allclose("public lse", lse, rlse, abs_tol=1e-6, rel_tol=2.01 / 65536)


@pytest.mark.gpu
@pytest.mark.parametrize("d_qk", [576, 512])
def test_gpu_close_to_ws(d_qk):
    """Against the WS variant on the same inputs: the same empty-row pattern, out / lse / max_logits within
    tolerance (not bit-identical: row sums over 64 columns in one warpgroup instead of 2 x 32 + an add)."""
    q, kv, ind, sk, tl = make_case(211, 5000, 1088, h_q=128, d_qk=d_qk, sink=True, with_len=True, all_invalid=True,
                                   device="cuda")
    res = []
    for launch in (lambda *a: G.launch_sparse_prefill_gluon(*a, variant="ws"), P.launch_sparse_prefill_gluon_ws2):
        out = torch.full((211, 128, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        ml = torch.full((211, 128), float("nan"), device="cuda")
        lse = torch.full((211, 128), float("nan"), device="cuda")
        launch(out, ml, lse, q, kv, ind, 0.5, sk, tl)
        res.append((out.float(), ml, lse))
    (o1, m1, l1), (o2, m2, l2) = res
    assert torch.equal(torch.isfinite(l1), torch.isfinite(l2)) and torch.equal(torch.isfinite(m1), torch.isfinite(m2))
    assert check_is_allclose("ws2 vs ws out", o2, o1, abs_tol=8e-4, rel_tol=3.01 / 128, cos_diff_tol=7e-6)
    assert (o2 - o1).abs().max() <= 2e-3
    fin = torch.isfinite(l1)
    assert (l2[fin] - l1[fin]).abs().max() <= 1e-5
    assert torch.equal(m1, m2)          # the running max is exact in both (same scores, same max)


@pytest.mark.gpu
@pytest.mark.parametrize("overlap,half_tiles", MODES[1:], ids=[f"half{o}" if h else f"ov{o}" for o, h in MODES[1:]])
@pytest.mark.parametrize("d_qk,s_q,s_kv,topk,with_len", [(576, 211, 5000, 1088, True), (512, 211, 5000, 1088, True),
                                                         (576, 64, 3000, 2048, False), (576, 33, 700, 576, False)])
def test_gpu_overlap_vs_default(d_qk, s_q, s_kv, topk, with_len, overlap, half_tiles, record_property):
    """The option (``overlap`` 1 / 2; ``half_tiles`` with ``overlap`` 0 / 1 / 2) against the dispatched schedule on
    the same inputs (sink, topk_length, all-invalid rows, odd and even block counts): the same empty-row pattern,
    max_logits identical (the same scores, the same max), out / lse within the reference tolerances. Expected
    bit-identical (the same operations per block in the same order; the softmax warpgroup's P operand moves from
    shared memory to registers, same bf16 values; half tiles issue the same 4 k-steps of P V in the same order, as
    two commit groups): recorded, not asserted."""
    q, kv, ind, sk, tl = make_case(s_q, s_kv, topk, h_q=128, d_qk=d_qk, sink=True, with_len=with_len,
                                   all_invalid=True, device="cuda")
    res = []
    for ov, half in ((0, False), (overlap, half_tiles)):
        out = torch.full((s_q, 128, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        ml = torch.full((s_q, 128), float("nan"), device="cuda")
        lse = torch.full((s_q, 128), float("nan"), device="cuda")
        P.launch_sparse_prefill_gluon_ws2(out, ml, lse, q, kv, ind, 0.5, sk, tl, overlap=ov, half_tiles=half)
        res.append((out, ml, lse))
    (o0, m0, l0), (o1, m1, l1) = res
    bit = torch.equal(o0, o1) and torch.equal(l0, l1) and torch.equal(m0, m1)
    record_property("bit_identical_to_default", bit)
    assert not torch.isnan(o1).any() and not torch.isnan(l1).any() and not torch.isnan(m1).any()
    assert torch.equal(torch.isfinite(l0), torch.isfinite(l1)) and torch.equal(m0, m1)
    assert check_is_allclose("ov vs default out", o1.float(), o0.float(), abs_tol=8e-4, rel_tol=3.01 / 128,
                             cos_diff_tol=7e-6)
    fin = torch.isfinite(l0)
    assert (l1[fin] - l0[fin]).abs().max() <= 1e-5 if fin.any() else True
