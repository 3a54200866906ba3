"""Sparse top-k MLA prefill, "pair" kernel in FlashMLA's sm90 warpgroup order (WS4; opt-in, NOT dispatched:
:data:`DISPATCH` False). Design from ``benchmarks/notes/sparse_prefill_design_study.md`` section 3.

Measured (session 18, H200, paired rotated rounds against WS2; results/sparse_prefill_ws4-h200-2026-11-29-s18.json,
results/sparse_prefill_r4-h200-2026-11-30-s18.json): the prediction below (0.85-0.93 of WS2's time) is falsified --
1.13-1.19x slower (F1 hit), ablations within 0.975-1.025. ncu (the study's "Session 18: why WS4 lost"): the producer
cannot feed both math warpgroups (they wait 42-47 % of their loop on data). With the 4-rows NoPE gather
(``gather_rows4``) 0.990-0.997 of WS2 -- but WS2 with the same gather is 0.91-0.96 of its old time and dispatched,
so WS4 stays behind. One random GPU case missed the absolute tolerance at 2 of 1,048,576 output elements (1.2e-3 vs
8e-4, cosine within bounds; passed on rerun): its rescaled bf16 P (``P0 * c``) is rounded twice.

Contract, arguments and outputs: exactly :func:`_gluon_sparse_prefill_ws2.launch_sparse_prefill_gluon_ws2`'s (one CTA
per (query token, 64-head group), head group fastest; the token's top-k KV rows gathered 64 at a time, invalid indices
(< 0, >= s_kv, position >= topk_length) zero-filled and never dereferenced; online softmax in base 2 with the running
max in raw-score units; P rounded to bf16 only as the PV operand; out = O / (L [+ exp(sink - m)]) in bf16, lse /
max_logits in natural-log units; rows without a valid token: out 0, lse +inf, max_logits -inf). d_qk 576 (D_PE 64)
and 512 (D_PE 0); :func:`supported_ws4` = WS2's gate (h_q % 64 == 0, d_qk 576 / 512, 16-B aligned rows, sm90).

Design (FlashMLA sm90 sparse prefill ``phase1.cuh`` order, study section 1.7)
------------------------------------------------------------------------------
Blocks of 64 tokens are taken in PAIRS (2i, 2i+1); an odd block count is padded with one all-masked block (the
producer zero-fills it without a global read, its S is masked to -inf, P = 0). ``gl.warp_specialize``, 3 x 4 warps:

* default partition = **WG0** (:func:`_w4_wg0`): Q -> shared memory (all 576 columns, then ``qbar``); S0 = Q K0^T of
  the EVEN block (slot 0), online softmax with its own running max m0 = max(m, rowmax S0) -> ``sM0``, ``MX0``;
  local P V ``O0 += P0(registers) V0[:, :256]`` (RS wgmma), release slot 0 L; wait ``MX1``, the combined max m from
  ``sM1``, c = exp2((m0 - m) log2e scale): P0 * c -> bf16 -> ``sS0``, ``P0R``; wait ``P1R``; O0 *= c, l0 *= c;
  remote P V ``O0 += sS1 V1[:, :256]`` (SS wgmma); then, if another pair follows, S0 of the next pair is issued
  right behind it (L half after ``rdy[0L]``, ``wait_group 1`` = remote P V done -> release slot 1 L, R half after
  ``rdy[0R]``), else wait and release slot 1 L.
* worker 0 = **WG1** (:func:`_w4_wg1`): per pair S1 = Q K1^T of the ODD block (R half + RoPE first, then L half,
  each after its ``rdy``), row max, wait ``MX0``, m = max(sM0, rowmax S1) -> ``sM1``, ``MX1`` (the one-way max
  handoff WG0 -> WG1 -> WG0), P1 = exp2((S1 - m) ...), O1, l1 rescaled from the previous combined max to m; local
  P V ``O1 += P1(registers) V1[:, 256:]``; P1 -> ``sS1``, ``P1R``; wait ``P0R``; remote P V ``O1 += sS0 V0[:, 256:]``;
  ``wait_group 1`` -> release slot 1 R; ``wait_group 0`` -> release slot 0 R.
* worker 1 = **producer** (:func:`_w4_producer`): per pair the four column halves in FlashMLA's order V0L, V1R,
  V0R, V1L (L = NoPE columns [0, 256), R = NoPE [256, 512) + the RoPE tile), each after its own ``fre`` wait,
  masked 16-B cp.async (``_g_gather``'s addressing with a 256-column window), signalled on its own ``rdy``.
* Epilogue: l0 / l1 exchanged through ``sM0`` / ``sM1`` (``FIN0`` / ``FIN1``), l = l0 + l1 in both; WG0 writes
  out[:, :256], WG1 out[:, 256:] and lse / max_logits (WS2's ``_p2_stats`` / ``_p2_write_half`` expressions).

Both warpgroups end every pair with the same running max m (WG0 reads it from ``sM1``), O0 / l0 hold the even blocks'
P at m, O1 / l1 the odd blocks'; O = [O0 | O1] over both blocks because each P V covers both blocks of the pair.

Barrier protocol (all mbarriers count 1; ``i`` = pair index, ``ph = i & 1``; a fresh barrier passes parity 1)
----------------------------------------------------------------------------------------------------------
* ``rdy[h]``, h = 2 slot + half (0 = slot 0 L, 1 = slot 0 R, 2 = slot 1 L, 3 = slot 1 R): producer -> the
  warpgroup(s) reading that half; the producer's per-thread ``cp.async.mbarrier.arrive`` (net zero) + one ordinary
  arrive (WS2's scheme). Waited with parity ``ph`` by: WG0 ``rdy[0]``, ``rdy[1]`` (S0; for pair i+1 in pair i's tail
  with ``ph ^ 1``); WG1 ``rdy[3]``, ``rdy[2]`` (S1). The halves WG0 / WG1 read only through P V were waited on by the
  half's S reader, whose handoff (``P0R`` / ``P1R``) the P V reader waits for.
* ``fre[h]``: consumer -> producer, waited with parity ``ph ^ 1`` before the half of pair i is gathered.
  ``fre[0]`` (slot 0 L: S0 L, local P V of WG0) by WG0 after its local P V; ``fre[2]`` (slot 1 L: S1 L, WG0's
  remote P V) by WG0 after its remote P V; ``fre[3]`` (slot 1 R: S1 R, WG1's local P V) by WG1 after its local P V;
  ``fre[1]`` (slot 0 R + RoPE tile = ``sS0`` for d_qk 576: S0 R, WG1's remote P V) by WG1 after its remote P V.
  Each half's other readers completed before (the S of the other warpgroup precedes its P handoff).
* ``MX0`` WG0 -> WG1 "m0 in sM0" (WG1 waits ``ph``); ``MX1`` WG1 -> WG0 "m in sM1" (WG0 waits ``ph``);
  ``P0R`` WG0 -> WG1 "sS0 written + fenced" (WG1 waits ``ph``); ``P1R`` WG1 -> WG0 "sS1 written + fenced" (WG0
  waits ``ph``). One arrive each per pair.
* ``qbar`` WG0 -> WG1 "Q in shared memory" (WG1 waits parity 0 once); ``FIN0`` / ``FIN1`` "l0 in sM0" / "l1 in
  sM1" (each waited once with parity 0 by the other warpgroup).
Buffer reuse (by hand): ``sM0`` is rewritten in pair i+1 after WG0 waited ``P1R_i``, which WG1 arrives after reading
``sM0_i``; ``sM1`` is rewritten in pair i+1 after ``MX0_{i+1}``, which WG0 arrives after reading ``sM1_i``; ``sS1``
is rewritten after ``MX0_{i+1}``, which WG0 arrives after ``wait_group 1`` retired its remote P V of pair i;
``sS0`` (d_qk 576: slot 0's RoPE tile) is written after S0 (its only other reader) completed, and refilled only after
``fre[1]``, which WG1 arrives after its remote P V read it; d_qk 512: the separate ``sS0`` is rewritten after
``MX1_{i+1}``, which WG1 arrives after its ``wait_group 0`` of pair i. ``sM0`` / ``sM1`` carry l0 / l1 after the
loop: WG1's last read of ``sM0`` precedes ``MX1`` of the last pair (WG0 waited it); WG0's last read of ``sM1``
precedes ``P0R`` of the last pair (WG1 waited it). No wait depends on a later arrive of the waiter itself: inside a
pair WG0 arrives MX0 before waiting MX1 and P0R before waiting P1R; WG1 waits MX0 before arriving MX1, arrives P1R
before waiting P0R; the producer's waits of pair i+1 need only pair-i releases.

Shared memory map (d_qk 576): Q [1, 64, 512] + [1, 64, 64] 73,728 B; K/V 2 slots x ([64, 512] + [64, 64]) 147,456 B
(the column halves are ``.slice(0 | 256, 256, dim=1)`` views of the unchanged tiles: L = NoPE [0, 256), R = NoPE
[256, 512) + the slot's RoPE tile; slot 0's RoPE tile doubles as ``sS0``, the P0 exchange tile); ``sS1`` [64, 64]
bf16 8,192 B; ``sM0`` / ``sM1`` 2 x 256 B (row max, then row sums); 15 mbarriers (rdy x 4, fre x 4, MX0, MX1, P0R,
P1R, Q, FIN0, FIN1) 120 B. d_qk 512: no RoPE tiles, ``sS0`` its own 8,192 B. Q is allocated [1, ...] and every math
descriptor is taken through ``.index(z)`` with a runtime zero ``z = i >> 30`` (:func:`_w4_s_half`): with the fixed
slot per warpgroup all ~80 descriptors per warpgroup were loop-invariant, ptxas hoisted them and spilled 1,180 B
(WG0 loop 104-128 spill instructions) -- study risk R2, the session-14 seesaw's failure; the runtime zero costs a few
integer instructions per pair and leaves 0 spills.

Register split: launch ``maxnreg`` :data:`WS4_MAXNREG` 168 (12 warps); ``setmaxnreg`` WG1 :data:`WS4_WG1_REGS` 208,
producer :data:`WS4_PRODUCER_REGS` 56, WG0 the rest 168 x 3 - 208 - 56 = 240. WG0 holds the most at once (O half 128
+ P0 fp32 32, kept for the rescaled copy to ``sS0``, + P0 as the register operand 16 + the next S0 32 in flight with
the remote P V); measured with the same code: 224 / 224 / 56 -> 13 spill instructions in WG0's loop (76 B in all),
232 / 216 / 56 -> 0 in the loops but 24 B outside, 240 / 208 / 56 -> 0 anywhere (the study's 224 / 224 / 56 guess was
short by 16 for WG0).

Compile numbers (Triton 3.6.0 wheel, ptxas sm_90a, all 8 (d_pe, has_len, has_sink) configurations; asserted in
tests/test_gluon_sparse_prefill_ws4.py): shared memory 230,296-230,312 B (d_qk 576) / 213,864-213,880 B (512) of the
232,448 B limit (WS2: 230,016 / 205,440). wgmma: 3 x 36 (3 x 32) m64n64k16 (WG0 prologue + WG0 loop tail + WG1 loop)
+ 16 m64n256k16, 8 of them with P as the register A operand. PTX: 15 mbarrier.init, 17 try_wait sites, 16 arrive
sites, 4 cp.async.mbarrier.arrive. ptxas: 168 registers, 0 bytes spill stores / loads, no wgmma-serialisation
warning. SASS loops: WG0 1,000 / 973 instructions (44 / 40 HGMMA, 36 MUFU.EX2, 4 wgmma waits), WG1 703 / 680 (44 / 40
HGMMA, 34 EX2, 3 waits), producer 1,310-1,358 / 1,152-1,206 (72 / 64 LDGSTS = 2 x 16 NoPE + 2 x 4 RoPE per thread and
pair, 4 free waits, 4 cp.async arrives), 0 spill instructions in each. SASS order (ptxas, d_qk 576): WG0 publishes
m0 (``sM0`` store + ``MX0`` arrive) after 4 of its 36 exp2 -- ptxas hoisted the handoff above the P exp2s, so WG1's
softmax can start while WG0 computes P0; WG1 arrives ``MX1`` after 6 of its 34 exp2; WG0's next S0 is issued right
behind its remote P V with only the ``rdy[0]`` wait between (no ptxas-inserted wgmma wait anywhere). Compared with
WS2's softmax warpgroup (706 / 679 instructions per BLOCK, the serial chain of every block), each WS4 math warpgroup
runs ~700-1,000 instructions per PAIR.

CPU protocol model (tests/test_gluon_sparse_prefill_ws4.py ``test_protocol_model``): the three partitions as step
lists (waits with the hardware parity rule, arrives, synchronous and wgmma-async reads with their retire points,
writes), 300 random schedules each for 0-7 pairs: no deadlock, no parity aliasing, no write under an in-flight reader,
every read sees the block it expects; mutations (a release moved before its wgmma wait, both P handoffs waited before
being arrived) are caught.
CPU emulation of the arithmetic (``test_pair_algebra_cpu``): the pair softmax (WG0 at m0, WG1 at m, the c rescale of
P0 / O0 / l0, bf16 P, l0 + l1, the epilogue) in PyTorch fp32 against ``sparse_prefill_ref`` with the GPU tier's
tolerances, default and SYM, padded pairs, junk indices, topk_length, +-inf sinks, empty rows; dropping any one of the
three c rescales gives 4-6e-3 output errors (tolerance 8e-4). Neither model checks the Gluon layouts or the PTX.

Ablations (falsifier F2; constexprs ``SYM`` / ``WHOLE``, launcher / compile keywords ``sym_max`` / ``whole_slot``,
bench labels ``gluon-ws4-sym`` / ``gluon-ws4-whole``; both off = the default kernel, whose cleaned PTX is byte-identical
to before the switches existed: sha256 per configuration in ``test_default_ptx_unchanged``):
* ``SYM`` (F2a, symmetric max exchange = the session-14 seesaw order): WG0 publishes m0, waits ``MX1`` and computes
  P0 at the combined max before its exp2s, so both softmaxes run at the same time; no second rescale of P0 / O0 / l0.
  Same barriers and parities (WG0's ``MX1`` wait moves up). SASS: WG0 loop 776-782 instructions, 34 EX2, the ``MX1``
  wait before the exp2s, 0 spills.
* ``WHOLE`` (F2b, whole-slot refill): the producer gathers a slot's first half only when BOTH halves were released
  (V0L waits ``fre[0]`` + ``fre[1]``, V1R ``fre[3]`` + ``fre[2]``; same gather order, same number of waits). ptxas
  then leaves 0-26 spill instructions in the producer loop (0-60 B; 56 or 64 producer registers alike) -- a bias
  against WHOLE in the comparison, small next to the ~1,300-instruction producer loop.
The device script prints t_abl / t_ws4 per shape: F2 expects >= 1.06 (SYM) and >= 1.05 (WHOLE at 64K).

Not implemented (the study's proposal, section 3, or FlashMLA, vs this file): validity bits from the producer (the
math warpgroups reload their block's 64 indices, as WS2, loaded before the S waits); the L2 evict_last / 256-B prefetch cache hints of FlashMLA's gather; TMA Q load
and TMA / bulk output stores; named barriers (Gluon 3.6 has none: mbarriers throughout, study risk R1); the F4
per-warpgroup timestamp build; dispatch (``DISPATCH`` False until a device run says otherwise). Q is loaded by WG0
alone (WG1 waits ``qbar`` once per CTA).

Device command (nothing run on a GPU yet): ``GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_prefill_ws4.sh``
(default-kernel smoke under a hang guard, ablation smoke, GPU tier, 6 rotated paired rounds vs gluon-ws2 with
gluon-ws4 / -sym / -whole at s_kv 8K / 64K, sink off / on, verdict; caps 220 s); bench labels ``gluon-ws4``,
``gluon-ws4-sym``, ``gluon-ws4-whole`` (``benchmarks/mla_prefill.py --gluon --gluon-add gluon-ws4``).

PREDICTION (UNVERIFIED: never run on a GPU; the study's section 3.5, restated for this code): s_q 4096, h_q 128,
topk 2048, paired rotated rounds vs gluon-ws2 in one run: s_kv 8K 520-565 TFLOPS (central 545; paired t / t_ws2
0.85-0.93), s_kv 64K 470-505 (central 485; 0.86-0.93). Falsifiers: F1 paired t / t_ws2 > 0.96 at 8K with 0 loop
spills -> the structure does not carry into Gluon (third loss of the seesaw family); F3 64K / 8K TFLOPS ratio < 0.84
-> the late-freed slot 0 R half (released only after WG1's remote P V) is exposed before the next S0 R half; F0 any
GPU-tier failure or hang -> the protocol above is wrong somewhere (first suspect: an mbarrier arrive of one thread
before the other warps of its warpgroup finished, see risks); F2 (ablations above): neither SYM nor WHOLE slower by
>= 6 % / 5 % -> a gain, if any, is not from the mechanisms the study credits.

Session 20 switches (opt-in, default off; UNVERIFIED on GPU; benchmarks/notes/mla_prefill.md "Session 20")
----------------------------------------------------------------------------------------------------------
``q_async`` / ``o_stage`` (constexprs ``Q_ASYNC`` / ``O_STAGE``): WS2's dispatched Q prologue (one cp.async batch,
same ``_q_async`` guard) in WG0 and each warpgroup's output half staged through its column half of the dead Q tile
(WG0 after ``FIN1``, WG1 after ``FIN0``: both warpgroups' last S completed). ``idx_ahead`` (``IDX_AHEAD``; needs
``gather_rows4``, not ``whole_slot``): :func:`_w4_producer_ahead`, the producer's indices loaded once per block and
one pair ahead instead of after each half's ``fre`` wait. All three bit-identical to the ``gather_rows4`` build; no
barrier added or moved. Compile: 0 spills, loops of WG0 / WG1 unchanged, producer loop 536 -> 296 SASS with
``idx_ahead`` (its 8 index loads per pair issued before the pair's first ``fre`` wait). Device: ``benchmarks/device_sparse_prefill_s20.sh``.

Risks (none of this ran on a GPU)
---------------------------------
* Arrive semantics: every ``mbarrier.arrive`` here relies on Gluon lowering it to a bar.sync of the partition's 128
  threads + one elected arrive (seen in the SASS: ``BAR.SYNC 0x0|0x2|0x3, 0x80`` around each ``SYNCS.ARRIVE``, one
  named barrier id per partition) -- WS2 relies on the same. The protocol model is pair-level: it cannot see a
  missing fence or a layout error.
* Cross-proxy ordering: P0 / P1 are written with generic stores and read by wgmma (async proxy): each writer fences
  (``fence.proxy.async``) before its arrive, each reader fences after its wait; the producer's cp.async writes are
  fenced by the readers after ``rdy`` (WS2's pattern). ``sS0`` for d_qk 576 is slot 0's RoPE tile, overwritten by
  the producer's cp.async only after ``fre[1]`` (WG1's remote P V retired).
* Column-window gathers (study open question 3): the producer cp.asyncs into ``kv_n.index(b).slice(256, 256,
  dim=1)`` views of the 128-B-swizzled [64, 512] tiles. Triton 3.6 accepts and lowers it (memdesc subslice at a
  64-column boundary; WS2 already reads such views as wgmma operands), but the addresses are checked only by the GPU
  tier (a wrong mapping shows as large output errors, not as a hang).
* Mbarrier handoffs instead of named barriers (study R1): ``MX1`` and ``P1R`` are on WG0's critical path once per
  pair; a try_wait round trip is slower than ``bar.sync``.
* Not bit-identical to WS2: WG1 accumulates S of the odd blocks in FlashMLA's order (NoPE 256-511, RoPE, then 0-255)
  and l = l0 + l1; max_logits can differ from WS2's in the last bits (GPU test records it, tolerance asserted).
* The runtime-zero descriptor trick (``z = i >> 30``) assumes < 2^30 pairs (topk < 2^37): always true; if a future
  ptxas proves ``z == 0`` the 1.2 KB of hoisted-descriptor spills come back (the compile test would fail).
"""
from __future__ import annotations

from .._gluon import (IMPORT_ERROR as _IMPORT_ERROR, available, gl, async_copy,  # noqa: F401
                      fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)
from .._gluon import compile_sm90 as _compile_sm90_gluon, jit as _jit
from .._launch import cached_launcher, spec_key
from . import _gluon_sparse_prefill as _gsp
from ._gluon_sparse_prefill import BLOCK_H, D_V, WS_MAXNREG, _g_ws_rows, supported
from ._gluon_sparse_prefill_ws2 import _p2_prologue, _p2_valid, _p2_write_half, _p2_write_half_staged, _q_async

__all__ = ["available", "supported_ws4", "launch_sparse_prefill_gluon_ws4", "compile_sm90_ws4", "DISPATCH",
           "WS4_MAXNREG", "WS4_WG1_REGS", "WS4_PRODUCER_REGS", "WS4_NUM_WARPS"]

DISPATCH = False           # opt-in (bench label gluon-ws4); never routed to by launch_sparse_prefill_gluon
WS4_NUM_WARPS = 4          # the default partition (WG0); + 4 (WG1) + 4 (producer) = 12 warps
WS4_MAXNREG = WS_MAXNREG   # 168: 12 x 32 x 168 = 64,512 of 65,536 registers
WS4_WG1_REGS = 208         # setmaxnreg of WG1; WG0 gets 168 * 3 - WG1 - producer = 240 (224 / 224: 13 spill instructions in WG0's loop)
WS4_PRODUCER_REGS = 56
_LOG2E = 1.4426950408889634

supported_ws4 = supported


# ----------------------------------------------------------------------------------------------- device code

@_jit
def _w4_gather(buf_n, buf_p, kv_ptr, idx_row, start, n, s_kv, stride_kvs, COL0: gl.constexpr,
               ROPE: gl.constexpr, D_PE: gl.constexpr, ROWS4: gl.constexpr = False):
    """cp.async NoPE columns [COL0, COL0 + 256) (+ the RoPE columns when ``ROPE``) of the KV rows of top-k positions
    [start, start + 64) into ``buf_n`` ([64, 256] column window of a slot) / ``buf_p``; invalid rows (index < 0,
    >= s_kv, position >= n) zero-filled and never dereferenced (``_g_gather``'s expressions). ``ROWS4`` (opt-in,
    session 18): the NoPE half as 4 rows x 8 lanes per warp instruction (4 row addresses per thread instead of 16)."""
    if ROWS4:
        LN4: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    else:
        LN4: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    LP4: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    offs_n = start + gl.arange(0, 64, gl.SliceLayout(1, LN4))
    idx = gl.load(idx_row + offs_n, mask=offs_n < n, other=-1)
    ok = (idx >= 0) & (idx < s_kv)
    rows = kv_ptr + gl.where(ok, idx, 0).to(gl.int64)[:, None] * stride_kvs
    offs_d = COL0 + gl.arange(0, 256, gl.SliceLayout(0, LN4))
    async_copy.async_copy_global_to_shared(buf_n, rows + offs_d[None, :], mask=ok[:, None])
    if ROPE:
        if D_PE > 0:
            offs_np = start + gl.arange(0, 64, gl.SliceLayout(1, LP4))
            idxp = gl.load(idx_row + offs_np, mask=offs_np < n, other=-1)
            okp = (idxp >= 0) & (idxp < s_kv)
            rowsp = kv_ptr + gl.where(okp, idxp, 0).to(gl.int64)[:, None] * stride_kvs
            offs_p = gl.arange(0, D_PE, gl.SliceLayout(0, LP4))
            async_copy.async_copy_global_to_shared(buf_p, rowsp + 512 + offs_p[None, :], mask=okp[:, None])


@_jit
def _w4_idx(idx_row, start, n, s_kv):
    """IDX_AHEAD (session 20): the 64 indices of top-k positions [start, start + 64) in the 4-rows gather layout
    (-1 at positions >= n: never read), as ``_w4_gather`` loads them with ``ROWS4``."""
    L4: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    offs_n = start + gl.arange(0, 64, gl.SliceLayout(1, L4))
    return gl.load(idx_row + offs_n, mask=offs_n < n, other=-1)


@_jit
def _w4_rows(kv_ptr, idx, s_kv, stride_kvs):
    """IDX_AHEAD: the validity and KV row pointers of one block's indices (``_w4_gather``'s expressions)."""
    ok = (idx >= 0) & (idx < s_kv)
    return kv_ptr + gl.where(ok, idx, 0).to(gl.int64) * stride_kvs, ok


@_jit
def _w4_gather_rows(buf_n, buf_p, rows, ok, COL0: gl.constexpr, ROPE: gl.constexpr, D_PE: gl.constexpr):
    """``_w4_gather`` with ``ROWS4`` from row pointers computed ahead (:func:`_w4_rows`; IDX_AHEAD): the same masked
    16-byte cp.async (with ``ROWS4`` the NoPE and RoPE layouts are the same, so one row vector serves both), hence
    the same bytes in the same places."""
    L4: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    offs_d = COL0 + gl.arange(0, 256, gl.SliceLayout(0, L4))
    async_copy.async_copy_global_to_shared(buf_n, rows[:, None] + offs_d[None, :], mask=ok[:, None])
    if ROPE:
        if D_PE > 0:
            offs_p = gl.arange(0, D_PE, gl.SliceLayout(0, L4))
            async_copy.async_copy_global_to_shared(buf_p, rows[:, None] + 512 + offs_p[None, :], mask=ok[:, None])


@_jit
def _w4_signal(bar):
    """``bar`` completes when every producer thread's cp.asyncs so far have landed (WS2's scheme, count 1)."""
    async_copy.mbarrier_arrive(bar)
    mbarrier.arrive(bar)


@_jit
def _w4_producer(kv_n, kv_p, rdy, fre, kv_ptr, idx_ptr, len_ptr, s_kv, topk, stride_kvs, stride_is, H_Q,
                 D_PE: gl.constexpr, HAS_LEN: gl.constexpr, WHOLE: gl.constexpr = False,
                 ROWS4: gl.constexpr = False, IDX_AHEAD: gl.constexpr = False):
    """Worker partition (4 warps): per pair the halves V0L, V1R, V0R, V1L (study 1.4), each after ``fre[h]`` (parity
    ``ph ^ 1``), signalled on ``rdy[h]``. ``WHOLE`` (ablation F2b): a slot is refilled only when BOTH its halves are
    free (V0L waits ``fre[0]`` and ``fre[1]``, V1R ``fre[3]`` and ``fre[2]``; same gather order). ``IDX_AHEAD``
    (session 20, opt-in; needs ``ROWS4``, not with ``WHOLE``): :func:`_w4_producer_ahead`."""
    tok = (gl.program_id(0) // (H_Q // 64)).to(gl.int64)
    n, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    num_pairs = (num_blocks + 1) // 2
    idx_row = idx_ptr + tok * stride_is
    if IDX_AHEAD:
        _w4_producer_ahead(kv_n, kv_p, rdy, fre, kv_ptr, idx_row, n, num_pairs, s_kv, stride_kvs, D_PE)
        return
    for i in range(num_pairs):
        ph = (i & 1) ^ 1
        j0 = i * 128
        mbarrier.wait(fre.index(0), ph)
        if WHOLE:
            mbarrier.wait(fre.index(1), ph)
        _w4_gather(kv_n.index(0).slice(0, 256, dim=1), kv_p.index(0), kv_ptr, idx_row, j0, n, s_kv, stride_kvs,
                   0, False, D_PE, ROWS4)
        _w4_signal(rdy.index(0))
        mbarrier.wait(fre.index(3), ph)
        if WHOLE:
            mbarrier.wait(fre.index(2), ph)
        _w4_gather(kv_n.index(1).slice(256, 256, dim=1), kv_p.index(1), kv_ptr, idx_row, j0 + 64, n, s_kv,
                   stride_kvs, 256, True, D_PE, ROWS4)
        _w4_signal(rdy.index(3))
        if not WHOLE:
            mbarrier.wait(fre.index(1), ph)
        _w4_gather(kv_n.index(0).slice(256, 256, dim=1), kv_p.index(0), kv_ptr, idx_row, j0, n, s_kv, stride_kvs,
                   256, True, D_PE, ROWS4)
        _w4_signal(rdy.index(1))
        if not WHOLE:
            mbarrier.wait(fre.index(2), ph)
        _w4_gather(kv_n.index(1).slice(0, 256, dim=1), kv_p.index(1), kv_ptr, idx_row, j0 + 64, n, s_kv,
                   stride_kvs, 0, False, D_PE, ROWS4)
        _w4_signal(rdy.index(2))


@_jit
def _w4_producer_ahead(kv_n, kv_p, rdy, fre, kv_ptr, idx_row, n, num_pairs, s_kv, stride_kvs, D_PE: gl.constexpr):
    """IDX_AHEAD (session 20): :func:`_w4_producer`'s pair loop (same waits, parities, gathers, order and signals)
    with each block's 64 indices loaded once per pair and one pair AHEAD: pair 0's before the loop; at the top of
    pair i its row pointers are formed and pair i+1's indices issued, before the first ``fre`` wait (ptxas puts
    all index loads on one scoreboard, so their first use waits for every one in flight: issued a whole pair
    earlier, they have landed). Without it every one of the 4 half gathers of a pair loads its
    indices after its ``fre`` wait, so a dependent global load (~570 cycles in WS2's producer, session-20 profile)
    sits between the consumer's release and the first cp.async of the half, on the release -> ready chain.
    Positions >= n load -1 (masked), never dereferenced, as before."""
    i0 = _w4_idx(idx_row, 0, n, s_kv)
    i1 = _w4_idx(idx_row, 64, n, s_kv)
    for i in range(num_pairs):
        ph = (i & 1) ^ 1
        j0 = i * 128
        # this pair's row pointers, then the next pair's indices in flight for the whole pair (one scoreboard
        # covers all index loads: their first use, at the next loop top, waits for loads issued a pair earlier)
        r0, ok0 = _w4_rows(kv_ptr, i0, s_kv, stride_kvs)
        r1, ok1 = _w4_rows(kv_ptr, i1, s_kv, stride_kvs)
        i0 = _w4_idx(idx_row, j0 + 128, n, s_kv)
        i1 = _w4_idx(idx_row, j0 + 192, n, s_kv)
        mbarrier.wait(fre.index(0), ph)
        _w4_gather_rows(kv_n.index(0).slice(0, 256, dim=1), kv_p.index(0), r0, ok0, 0, False, D_PE)
        _w4_signal(rdy.index(0))
        mbarrier.wait(fre.index(3), ph)
        _w4_gather_rows(kv_n.index(1).slice(256, 256, dim=1), kv_p.index(1), r1, ok1, 256, True, D_PE)
        _w4_signal(rdy.index(3))
        mbarrier.wait(fre.index(1), ph)
        _w4_gather_rows(kv_n.index(0).slice(256, 256, dim=1), kv_p.index(0), r0, ok0, 256, True, D_PE)
        _w4_signal(rdy.index(1))
        mbarrier.wait(fre.index(2), ph)
        _w4_gather_rows(kv_n.index(1).slice(0, 256, dim=1), kv_p.index(1), r1, ok1, 0, False, D_PE)
        _w4_signal(rdy.index(2))


@_jit
def _w4_inv(m_i, l_i, tok, hb, sink_ptr, ml_ptr, lse_ptr, sm_scale, H_Q, HAS_SINK: gl.constexpr,
            STORE: gl.constexpr, S_L: gl.constexpr):
    """``_p2_stats``'s expressions: the output scale 1 / (L [+ exp(sink - m)]) (0 for an empty row); with ``STORE``
    also lse / max_logits (natural-log units; empty rows +inf / -inf)."""
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    offs_h = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, S_L))
    denom = l_safe
    if HAS_SINK:
        sink = gl.load(sink_ptr + offs_h)
        m_nat = gl.where(empty, 0.0, m_i * sm_scale)
        denom = l_safe + gl.exp(sink - m_nat)
    inv = gl.where(empty, 0.0, 1.0 / denom)
    if STORE:
        lse = gl.where(empty, float("inf"), m_i * sm_scale + gl.log(l_safe))
        mx = gl.where(empty, float("-inf"), m_i * sm_scale)
        gl.store(lse_ptr + tok * H_Q + offs_h, lse)
        gl.store(ml_ptr + tok * H_Q + offs_h, mx)
    return inv


@_jit
def _w4_s_half(q_n, q_p, kv_n, kv_p, z, b, acc, HALF: gl.constexpr, FIRST: gl.constexpr, D_PE: gl.constexpr):
    """Issue the S k-steps of one column half of slot ``b`` (async; returns the token): HALF 0 = NoPE columns
    [0, 256), HALF 1 = [256, 512) + the RoPE columns. ``z`` is a runtime zero (``i >> 30`` of the loop counter): the
    Q / K shared-memory descriptors then depend on the loop and are recomputed per pair instead of being hoisted
    out of the loop (~72 64-bit descriptors per warpgroup: ptxas spilled them, ~1.2 KB, study risk R2)."""
    qz = q_n.index(z)
    kz = kv_n.index(z + b)
    tok = warpgroup_mma(qz.slice(HALF * 256, 256, dim=1), kz.slice(HALF * 256, 256, dim=1).permute((1, 0)), acc,
                        use_acc=not FIRST, is_async=True)
    if HALF == 1:
        if D_PE > 0:
            tok = warpgroup_mma(q_p.index(z), kv_p.index(z + b).permute((1, 0)), tok, is_async=True)
    return tok


@_jit
def _w4_bars(bars):
    """The 7 handoff mbarriers of ``bars`` by name: MX0 MX1 P0R P1R Q FIN0 FIN1 (kernel allocation order)."""
    return (bars.index(0), bars.index(1), bars.index(2), bars.index(3), bars.index(4), bars.index(5),
            bars.index(6))


@_jit
def _w4_wg0(q_n, q_p, kv_n, kv_p, s_s0, s_s1, s_m0, s_m1, rdy, fre, bars, q_ptr, idx_ptr, len_ptr, sink_ptr,
            out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2, stride_qs, stride_qh, stride_is, stride_os,
            stride_oh, H_Q, D_PE: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr,
            SYM: gl.constexpr = False, Q_ASYNC: gl.constexpr = False, O_STAGE: gl.constexpr = False):
    """Default partition = WG0 (module docstring): even blocks' S + softmax, O[:, :256]. ``SYM`` (ablation F2a):
    WG0 waits for the combined max (``MX1``) BEFORE its exp2s, so both softmaxes run at the same time (the session-14
    seesaw order); P0 is then already at the combined max (no second rescale). ``Q_ASYNC`` / ``O_STAGE`` (session
    20, opt-in): WS2's Q by one cp.async batch (``_p2_prologue``) / out[:, :256] staged in ``q_n[0][:, :256]``
    (``_p2_write_half_staged``; after ``FIN1`` both warpgroups' last S completed: Q is dead)."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    L_PA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    LS: gl.constexpr = gl.SliceLayout(0, S_L)
    LR: gl.constexpr = gl.SliceLayout(1, S_L)
    mx0, mx1, p0r, p1r, qbar, fin0, fin1 = _w4_bars(bars)
    tok, hb, n, num_blocks, idx_row = _p2_prologue(q_n.index(0), q_p.index(0), q_ptr, idx_ptr, len_ptr, topk, stride_qs, stride_qh,
                                                   stride_is, H_Q, D_PE, HAS_LEN, Q_ASYNC)
    mbarrier.arrive(qbar)           # Q stored, fenced and barrier'd by the prologue
    num_pairs = (num_blocks + 1) // 2
    m_i = gl.full([64], float("-inf"), gl.float32, LR)   # running (combined) max of raw q.k
    l_i = gl.zeros([64], gl.float32, LR)
    acc = gl.zeros([64, 256], gl.float32, O_L)
    s_zero = gl.zeros([64, 64], gl.float32, S_L)
    s = s_zero
    valid = _p2_valid(idx_row, 0, n, s_kv, LS)
    if num_pairs > 0:
        # S0 of pair 0: L half, then R half (+ RoPE), each after its own ready
        z0 = num_pairs >> 30
        mbarrier.wait(rdy.index(0), 0)
        fence_async_shared()
        tok_s = _w4_s_half(q_n, q_p, kv_n, kv_p, z0, 0, s_zero, 0, True, D_PE)
        mbarrier.wait(rdy.index(1), 0)
        fence_async_shared()
        tok_s = _w4_s_half(q_n, q_p, kv_n, kv_p, z0, 0, tok_s, 1, False, D_PE)
        s = warpgroup_mma_wait(0, deps=(tok_s, ))
    for i in range(num_pairs):
        ph = i & 1
        z = i >> 30               # runtime zero: loop-variant descriptors (_w4_s_half)
        # softmax of the even block with WG0's own running max
        s = gl.where(valid[None, :], s, float("-inf"))
        m0 = gl.maximum(m_i, gl.max(s, 1))
        if SYM:
            s_m0.store(m0)
            gl.thread_barrier()
            mbarrier.arrive(mx0)
            mbarrier.wait(mx1, ph)
            m0 = s_m1.load(LR)
        m0_safe = gl.where(m0 == float("-inf"), 0.0, m0)
        alpha = gl.exp2((m_i - m0_safe) * scale_log2)
        p = gl.exp2((s - m0_safe[:, None]) * scale_log2)
        l_i = l_i * alpha + gl.sum(p, 1)
        if not SYM:
            s_m0.store(m0)
            gl.thread_barrier()
            mbarrier.arrive(mx0)
        # local P V: O0 += P0 V0[:, :256] (P0 the register A operand), then release slot 0 L
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        p_op = gl.convert_layout(p.to(gl.bfloat16), L_PA)
        tok_o = warpgroup_mma(p_op, kv_n.index(z).slice(0, 256, dim=1), acc, is_async=True)
        acc, p_op = warpgroup_mma_wait(0, deps=(tok_o, p_op))
        mbarrier.arrive(fre.index(0))
        if SYM:
            s_s0.store(p.to(gl.bfloat16))      # already at the combined max
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(p0r)
            m_i = m0
            mbarrier.wait(p1r, ph)
            fence_async_shared()
        else:
            # the combined max from WG1: P0 rescaled to it -> sS0 for WG1's remote P V
            mbarrier.wait(mx1, ph)
            m_c = s_m1.load(LR)
            m_c_safe = gl.where(m_c == float("-inf"), 0.0, m_c)
            c = gl.exp2((m0 - m_c_safe) * scale_log2)
            p = p * c[:, None]
            s_s0.store(p.to(gl.bfloat16))
            fence_async_shared()
            gl.thread_barrier()
            mbarrier.arrive(p0r)
            l_i = l_i * c
            m_i = m_c
            # remote P V: O0 += sS1 V1[:, :256]
            mbarrier.wait(p1r, ph)
            fence_async_shared()
            acc = acc * gl.convert_layout(c, gl.SliceLayout(1, O_L))[:, None]
        tok_o = warpgroup_mma(s_s1, kv_n.index(z + 1).slice(0, 256, dim=1), acc, is_async=True)
        if i + 1 < num_pairs:
            # the next pair's S0 right behind the remote P V (study 1.7 step 5)
            valid = _p2_valid(idx_row, 2 * i + 2, n, s_kv, LS)
            mbarrier.wait(rdy.index(0), ph ^ 1)
            fence_async_shared()
            tok_s = _w4_s_half(q_n, q_p, kv_n, kv_p, z, 0, s_zero, 0, True, D_PE)
            acc = warpgroup_mma_wait(1, deps=(tok_o, ))       # remote P V done (S0 L may still run)
            mbarrier.arrive(fre.index(2))
            mbarrier.wait(rdy.index(1), ph ^ 1)
            fence_async_shared()
            tok_s = _w4_s_half(q_n, q_p, kv_n, kv_p, z, 0, tok_s, 1, False, D_PE)
            s = warpgroup_mma_wait(0, deps=(tok_s, ))
        else:
            acc = warpgroup_mma_wait(0, deps=(tok_o, ))
            mbarrier.arrive(fre.index(2))
    # epilogue: l0 to WG1 through sM0, l1 from sM1; l = l0 + l1 (the same order in both warpgroups)
    s_m0.store(l_i)
    gl.thread_barrier()
    mbarrier.arrive(fin0)
    mbarrier.wait(fin1, 0)
    l_tot = l_i + s_m1.load(LR)
    inv = _w4_inv(m_i, l_tot, tok, hb, sink_ptr, ml_ptr, lse_ptr, sm_scale, H_Q, HAS_SINK, False, S_L)
    if O_STAGE:
        _p2_write_half_staged(acc, gl.convert_layout(inv, gl.SliceLayout(1, O_L)), tok, hb, out_ptr, stride_os,
                              stride_oh, q_n.index(0).slice(0, 256, dim=1), 0, O_L)
    else:
        _p2_write_half(acc, gl.convert_layout(inv, gl.SliceLayout(1, O_L)), tok, hb, out_ptr, stride_os, stride_oh,
                       0, O_L)


@_jit
def _w4_wg1(q_n, q_p, kv_n, kv_p, s_s0, s_s1, s_m0, s_m1, rdy, fre, bars, idx_ptr, len_ptr, sink_ptr, out_ptr,
            ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2, stride_is, stride_os, stride_oh, H_Q,
            D_PE: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, O_STAGE: gl.constexpr = False):
    """Worker partition = WG1 (module docstring): odd blocks' S + softmax from WG0's max, O[:, 256:], lse /
    max_logits. ``O_STAGE`` (session 20, opt-in): out[:, 256:] staged in ``q_n[0][:, 256:]`` (after ``FIN0``
    both warpgroups' last S completed)."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    L_PA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    LS: gl.constexpr = gl.SliceLayout(0, S_L)
    LR: gl.constexpr = gl.SliceLayout(1, S_L)
    mx0, mx1, p0r, p1r, qbar, fin0, fin1 = _w4_bars(bars)
    pid = gl.program_id(0)
    tok = (pid // (H_Q // 64)).to(gl.int64)
    hb = pid % (H_Q // 64)
    n, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    num_pairs = (num_blocks + 1) // 2
    idx_row = idx_ptr + tok * stride_is
    m_i = gl.full([64], float("-inf"), gl.float32, LR)
    l_i = gl.zeros([64], gl.float32, LR)
    acc = gl.zeros([64, 256], gl.float32, O_L)
    s_zero = gl.zeros([64, 64], gl.float32, S_L)
    mbarrier.wait(qbar, 0)
    for i in range(num_pairs):
        ph = i & 1
        z = i >> 30               # runtime zero: loop-variant descriptors (_w4_s_half)
        valid = _p2_valid(idx_row, 2 * i + 1, n, s_kv, LS)
        # S1: R half (+ RoPE) first, then L half (study 1.4: the halves come back in this order)
        mbarrier.wait(rdy.index(3), ph)
        fence_async_shared()
        tok_s = _w4_s_half(q_n, q_p, kv_n, kv_p, z, 1, s_zero, 1, True, D_PE)
        mbarrier.wait(rdy.index(2), ph)
        fence_async_shared()
        tok_s = _w4_s_half(q_n, q_p, kv_n, kv_p, z, 1, tok_s, 0, False, D_PE)
        s = warpgroup_mma_wait(0, deps=(tok_s, ))
        s = gl.where(valid[None, :], s, float("-inf"))
        r_max = gl.max(s, 1)
        # the one-way handoff: WG0's max (already >= the previous combined max) -> combined max -> WG0
        mbarrier.wait(mx0, ph)
        m_new = gl.maximum(s_m0.load(LR), r_max)
        s_m1.store(m_new)
        gl.thread_barrier()
        mbarrier.arrive(mx1)
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2((m_i - m_safe) * scale_log2)
        p = gl.exp2((s - m_safe[:, None]) * scale_log2)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        # local P V: O1 += P1 V1[:, 256:] (register A operand); P1 -> sS1 for WG0
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        p_bf = p.to(gl.bfloat16)
        p_op = gl.convert_layout(p_bf, L_PA)
        tok_o = warpgroup_mma(p_op, kv_n.index(z + 1).slice(256, 256, dim=1), acc, is_async=True)
        s_s1.store(p_bf)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(p1r)
        # remote P V: O1 += sS0 V0[:, 256:]
        mbarrier.wait(p0r, ph)
        fence_async_shared()
        tok_o = warpgroup_mma(s_s0, kv_n.index(z).slice(256, 256, dim=1), tok_o, is_async=True)
        tok_o, p_op = warpgroup_mma_wait(1, deps=(tok_o, p_op))    # local P V done
        mbarrier.arrive(fre.index(3))
        acc = warpgroup_mma_wait(0, deps=(tok_o, ))
        mbarrier.arrive(fre.index(1))
    # epilogue: l1 to WG0 through sM1, l0 from sM0; l = l0 + l1; lse / max_logits stored here
    s_m1.store(l_i)
    gl.thread_barrier()
    mbarrier.arrive(fin1)
    mbarrier.wait(fin0, 0)
    l_tot = s_m0.load(LR) + l_i
    inv = _w4_inv(m_i, l_tot, tok, hb, sink_ptr, ml_ptr, lse_ptr, sm_scale, H_Q, HAS_SINK, True, S_L)
    if O_STAGE:
        _p2_write_half_staged(acc, gl.convert_layout(inv, gl.SliceLayout(1, O_L)), tok, hb, out_ptr, stride_os,
                              stride_oh, q_n.index(0).slice(256, 256, dim=1), 256, O_L)
    else:
        _p2_write_half(acc, gl.convert_layout(inv, gl.SliceLayout(1, O_L)), tok, hb, out_ptr, stride_os, stride_oh,
                       256, O_L)


@_jit
def _sparse_prefill_gluon_ws4_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr,
    s_kv, topk, sm_scale, scale_log2,
    stride_qs, stride_qh, stride_kvs, stride_is, stride_os, stride_oh, H_Q,
    D_PE: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, WG1_REGS: gl.constexpr, SYM: gl.constexpr = False, WHOLE: gl.constexpr = False,
    ROWS4: gl.constexpr = False, Q_ASYNC: gl.constexpr = False, O_STAGE: gl.constexpr = False,
    IDX_AHEAD: gl.constexpr = False,
):
    """The WS / WS2 kernels' runtime arguments; constexprs: D_PE, HAS_LEN, HAS_SINK, the producer's and WG1's
    setmaxnreg; ablations ``SYM`` (symmetric max exchange) / ``WHOLE`` (whole-slot refill), both off by default (PTX
    unchanged). Partitions: WG0 (default, 4 warps), WG1 (4), producer (4). ``ROWS4``: the 4-rows NoPE gather
    (session 18); ``Q_ASYNC`` / ``O_STAGE`` (session 20): WS2's dispatched Q prologue / staged output epilogue
    (module docstring, "Session 20"); ``IDX_AHEAD`` (session 20): the producer's indices one pair ahead
    (:func:`_w4_producer_ahead`; with ROWS4); all off by default."""
    SH_N: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 512], gl.bfloat16)
    SH_P: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    SH_V: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    q_n = gl.allocate_shared_memory(gl.bfloat16, [1, 64, 512], SH_N)
    kv_n = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 512], SH_N)
    s_s1 = gl.allocate_shared_memory(gl.bfloat16, [64, 64], SH_P)
    if D_PE > 0:
        q_p = gl.allocate_shared_memory(gl.bfloat16, [1, 64, D_PE], SH_P)
        kv_p = gl.allocate_shared_memory(gl.bfloat16, [2, 64, D_PE], SH_P)
        s_s0 = kv_p.index(0)          # slot 0's RoPE tile (study 1.3: FlashMLA's sS0)
    else:
        q_p = q_n
        kv_p = kv_n
        s_s0 = gl.allocate_shared_memory(gl.bfloat16, [64, 64], SH_P)
    s_m0 = gl.allocate_shared_memory(gl.float32, [64], SH_V)
    s_m1 = gl.allocate_shared_memory(gl.float32, [64], SH_V)
    rdy = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    fre = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    bars = gl.allocate_shared_memory(gl.int64, [7, 1], mbarrier.MBarrierLayout())   # MX0 MX1 P0R P1R Q FIN0 FIN1
    for k in gl.static_range(4):
        mbarrier.init(rdy.index(k), count=1)
        mbarrier.init(fre.index(k), count=1)
    for k in gl.static_range(7):
        mbarrier.init(bars.index(k), count=1)
    gl.warp_specialize([
        (_w4_wg0, (q_n, q_p, kv_n, kv_p, s_s0, s_s1, s_m0, s_m1, rdy, fre, bars, q_ptr, idx_ptr, len_ptr, sink_ptr,
                   out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2, stride_qs, stride_qh, stride_is,
                   stride_os, stride_oh, H_Q, D_PE, HAS_LEN, HAS_SINK, SYM, Q_ASYNC, O_STAGE)),
        (_w4_wg1, (q_n, q_p, kv_n, kv_p, s_s0, s_s1, s_m0, s_m1, rdy, fre, bars, idx_ptr, len_ptr, sink_ptr, out_ptr,
                   ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2, stride_is, stride_os, stride_oh, H_Q, D_PE,
                   HAS_LEN, HAS_SINK, O_STAGE)),
        (_w4_producer, (kv_n, kv_p, rdy, fre, kv_ptr, idx_ptr, len_ptr, s_kv, topk, stride_kvs, stride_is, H_Q, D_PE,
                        HAS_LEN, WHOLE, ROWS4, IDX_AHEAD)),
    ], [4, 4], [WG1_REGS, PRODUCER_REGS])


# ----------------------------------------------------------------------------------------------- host code

_CONSTEXPRS = ("D_PE", "HAS_LEN", "HAS_SINK", "PRODUCER_REGS", "WG1_REGS", "SYM", "WHOLE", "ROWS4", "Q_ASYNC",
               "O_STAGE", "IDX_AHEAD")  # parameter order
_LAUNCHERS: dict = {}
_LAUNCHER_LIMIT = 1024


def _flag(x) -> bool:
    if not isinstance(x, bool):
        raise ValueError(f"ablation switches must be bools, got {x!r}")
    return x


def _idx_ahead(idx_ahead, gather_rows4, whole_slot) -> bool:
    """The IDX_AHEAD constexpr: ``idx_ahead`` (a bool), which needs the 4-rows gather layout and the default
    (non-WHOLE) refill order."""
    if _flag(idx_ahead) and (not _flag(gather_rows4) or _flag(whole_slot)):
        raise ValueError("idx_ahead needs gather_rows4=True and whole_slot=False")
    return idx_ahead


def launch_sparse_prefill_gluon_ws4(out, max_logits, lse, q, kv, indices, sm_scale, attn_sink=None,
                                    topk_length=None, *, wg1_regs=None, producer_regs=None, maxnreg=None,
                                    sym_max: bool = False, whole_slot: bool = False, gather_rows4: bool = False,
                                    q_async: bool = False, o_stage: bool = False, idx_ahead: bool = False):
    """Drop-in for :func:`_gluon_sparse_prefill_ws2.launch_sparse_prefill_gluon_ws2` (same out-parameter contract;
    the caller checked :func:`supported_ws4`, else uses WS2). Keyword-only tuning knobs: WG1 / producer
    ``setmaxnreg``, launch ``maxnreg``; ablations (module docstring, falsifier F2; ValueError unless bools)
    ``sym_max`` (symmetric max exchange) and ``whole_slot`` (whole-slot refill); ``gather_rows4`` (session 18): the
    NoPE gathers 4 rows x 8 lanes per warp instruction (``_w4_gather``'s ``ROWS4``); ``q_async`` / ``o_stage``
    (session 20): WS2's Q by one cp.async batch (only for a q with 16-byte vectors: WS2's ``_q_async`` guard) / the
    output staged through the dead Q tile; ``idx_ahead`` (session 20): the producer's indices one pair ahead
    (needs ``gather_rows4``, not with ``whole_slot``: ValueError); all bools, default off. Cached :class:`deepkernels._launch.KernelLauncher` keyed by (constexpr names,
    constexprs, options, :func:`deepkernels._launch.spec_key` of the arguments)."""
    s_q, h_q, d_qk = q.shape
    if s_q == 0:
        return
    args, ints = _gsp.launch_args(out, max_logits, lse, q, kv, indices, attn_sink, topk_length)
    constexprs = (d_qk - D_V, topk_length is not None, attn_sink is not None,
                  producer_regs or WS4_PRODUCER_REGS, wg1_regs or WS4_WG1_REGS, _flag(sym_max), _flag(whole_slot),
                  _flag(gather_rows4))
    s20 = (_q_async(_flag(q_async), q), _flag(o_stage), _idx_ahead(idx_ahead, gather_rows4, whole_slot))
    names = _CONSTEXPRS
    if any(s20):
        constexprs = constexprs + s20
    else:       # the session-20 switches off = the kernel's defaults: the launch meta of the build before them
        names = _CONSTEXPRS[:len(constexprs)]
    opts = (WS4_NUM_WARPS, maxnreg or WS4_MAXNREG)
    launcher = cached_launcher(_LAUNCHERS, _sparse_prefill_gluon_ws4_kernel,
                               (names, constexprs, opts, spec_key(*args, *ints)),
                               lambda: dict(zip(names, constexprs), num_warps=opts[0], maxnreg=opts[1]),
                               _LAUNCHER_LIMIT)
    launcher((s_q * (h_q // BLOCK_H), ), *args, float(sm_scale), float(sm_scale) * _LOG2E, *ints)


def compile_sm90_ws4(d_pe: int = 64, has_len: bool = False, has_sink: bool = False, wg1_regs=None,
                     producer_regs=None, maxnreg=None, sym_max: bool = False, whole_slot: bool = False,
                     gather_rows4: bool = False, q_async: bool = False, o_stage: bool = False,
                     idx_ahead: bool = False):
    """Cross-compile the kernel for sm90 (no GPU needed) with the divisibility facts of an aligned launch. Returns
    the CompiledKernel (``.asm['ptx']``, ``.metadata.shared``)."""
    consts = dict(zip(_CONSTEXPRS, (d_pe, has_len, has_sink, producer_regs or WS4_PRODUCER_REGS,
                                    wg1_regs or WS4_WG1_REGS, _flag(sym_max), _flag(whole_slot),
                                    _flag(gather_rows4), _flag(q_async), _flag(o_stage),
                                    _idx_ahead(idx_ahead, gather_rows4, whole_slot))))
    return _compile_sm90_gluon(_sparse_prefill_gluon_ws4_kernel, _gsp.SIG, consts, _gsp.HINTED,
                               num_warps=WS4_NUM_WARPS,
                               maxnreg=maxnreg or WS4_MAXNREG)
