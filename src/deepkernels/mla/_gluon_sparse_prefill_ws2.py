"""Sparse top-k MLA prefill, "dense-decode consumer" variant of the warp-specialised Gluon kernel (dispatched:
:data:`DISPATCH`, ``DEEPKERNELS_SPARSE_PREFILL_WS2=0`` / ``=1`` overrides, :func:`dispatch_on`; measured section
"Measured" at the end).

Same contract, arguments and outputs as :func:`_gluon_sparse_prefill._sparse_prefill_gluon_ws_kernel` (read that
module's docstring): one CTA per (query token, 64-head group), the token's top-k KV rows gathered 64 at a time by the
WS kernel's producer (:func:`_gluon_sparse_prefill._g_ws_producer`, imported unchanged: 4 warps, masked cp.async into
a 2-slot ring of ``[64, 512]`` (+ ``[64, 64]`` RoPE) tiles, invalid rows zero-filled and never dereferenced), online
softmax in base 2 with the running max in raw-score units, P rounded to bf16 only as the PV operand, the epilogue of
``_g_finish`` (out = O / (L [+ exp(sink - m)]) in bf16, lse / max_logits in natural-log units, rows without a valid
token: out 0, lse +inf, max_logits -inf). d_qk 576 (D_PE 64) and 512 (D_PE 0), as :func:`supported` accepts.

What differs is the consumer side, which takes the structure of the sparse decode WS2 kernel
(:mod:`._gluon_sparse_decode_ws2`, itself the dense decode kernel's): instead of 8 consumer warps splitting S by token
columns (m64n32 wgmmas, ``warps_per_cta=[4, 2]``, cross-warpgroup row max / sum through shared memory, a CTA-wide
barrier before P V),

* default partition = softmax warpgroup (4 warps), :func:`_p2_softmax_wg`: Q to shared memory once, then per
  64-token block: the block's 64 indices from global memory (validity: ``0 <= idx < s_kv`` and position ``< n``,
  the old consumer's expression; loaded before the ``ready`` wait so the latency hides under it), wait
  ``ready[slot]``, ``fence.proxy.async``, the FULL S = Q K^T (64 x 64, m64n64k16 wgmmas, ``warps_per_cta=[4, 1]``,
  32 NoPE + 4 RoPE k-steps), -inf for invalid tokens, the online softmax (row reductions inside the warpgroup),
  bf16 P + alpha to the PV warpgroup (``pready`` / ``pfree``), ``O[:, :256] = O[:, :256] * alpha + P V[:, :256]``,
  arrive ``empty[slot]``. Epilogue: the row statistics (``_g_finish``'s expressions: lse, max_logits stored here),
  the per-row output scale to the PV warpgroup through the alpha buffer, its half ``out[:, :256]``.
* worker 0 = PV warpgroup (4 warps), :func:`_p2_pv_wg`: per block wait ``ready[slot]`` (already passed: keeps the
  acquire of the producer's copies direct) and ``pready``, ``fence.proxy.async``, alpha, rescale ``O[:, 256:]``,
  ``O[:, 256:] += P V[:, 256:]``, arrive ``pfree`` and ``empty[slot]``; epilogue: the scale, ``out[:, 256:]``.
* worker 1 = the WS producer (4 warps), unchanged.

Barrier protocol (mbarriers; ``j`` = block counter of the CTA, one query token per CTA so no request loop):

1. ``ready[s]`` (count 1): producer -> both consumer warpgroups (each waits parity ``(j // 2) & 1``); the
   producer's per-thread ``cp.async.mbarrier.arrive`` (net zero) + one ordinary arrive, as in the WS kernel.
2. ``empty[s]`` (count 2): one arrive per consumer warpgroup after its P V of the slot completed (the softmax WG's
   after its S and P V: it is also the only reader of the RoPE tile); the producer waits parity ``((j//2)&1)^1``.
3. ``pready`` (count 1): softmax WG -> PV WG, "P and alpha (after the last block: the output scale) are in shared
   memory"; the PV WG waits parity ``j & 1`` (the scale message: ``num_blocks & 1``).
4. ``pfree`` (count 1): PV WG -> softmax WG, "P / alpha read (its P V completed)"; the softmax WG waits parity
   ``(j & 1) ^ 1`` before overwriting P / alpha (and ``(num_blocks & 1) ^ 1`` before writing the scale).

Shared memory (cross-compiled, Triton 3.6, ``metadata.shared``): d_qk 576: Q 64 KB + 8 KB, ring 2 x (64 + 8) KB,
P 8 KB, alpha 256 B, 6 mbarriers: 230,016 B of the 232,448 B limit (the WS kernel: 230,528 B with its
cross-warpgroup reduction scratch); d_qk 512: 205,440 B.

Registers (launch ``maxnreg`` :data:`WS2_MAXNREG` = 168, 12 warps; ``setmaxnreg``: producer
:data:`WS2_PRODUCER_REGS` = 56 (the WS kernel's 40 left 8-26 spill instructions in this kernel's producer loop), PV
warpgroup :data:`WS2_PV_REGS` = 216, softmax warpgroup the rest, 232). ptxas of the
Triton 3.6 wheel, all 6 (d_pe, has_len, has_sink) configurations: 0 spill instructions in the softmax token loop
(~520-560 SASS instructions, 40 / 36 HGMMA), 0 in the PV token loop (4 HGMMA), 0 bytes spill stores in all.

Prediction (H200, s_q 4096, h_q 128, topk 2048; per (CTA, 64-token block)). The WS kernel measures 354-394 TFLOPS =
2 * 64 * 64 * 1088 flop per block / (132 SMs) -> ~1.34-1.49 us per block per SM, and its consumer structure alone
measures ~3.0 us per block in the decode kernel with its (slower) producer -- i.e. in prefill the consumer, with
cp.async gathers cheap enough to hide, is what sets the block time. The WS2 consumers measured 2.14-2.44 us per
block in decode against ~3.0 for the old consumer structure (0.71-0.81x) -- the full m64n64 S reads Q once per
k-step for 64 tokens (half the Q shared-memory traffic of two m64n32 halves), there is no cross-warpgroup reduction
and no CTA-wide barrier, and the PV warpgroup's P V[:, 256:] runs under the softmax warpgroup's next S. Tensor work
per block is 4.46 M MAC = ~2,180 clk at 2,048 MAC/clk/SM (~1.2 us at 1.83 GHz) -- wait: in prefill one CTA per SM
does not run alone: the WS kernel's 224 KB of shared memory allows one CTA per SM, so the per-block time is the
CTA's own. Scaling the WS kernel's per-block time by the decode ratio gives 0.71-0.81 x -> 1.05-1.2 us?  No: the
tensor floor (1.2 us at m64 wgmmas from one warpgroup at a time, S and P V of consecutive blocks overlapping across
the two warpgroups) caps it; predicted ~1.25-1.35 us per block -> 420-470 TFLOPS (1.10-1.25x the WS kernel), with
the producer (4 warps, 72 KB per block from L2 / HBM at ~2.3 us per 2 blocks in flight) next in line. Uncertain:
the producer's cp.async issue shares the SM's issue slots; the index reload in the softmax warpgroup (L1 hit: the
producer just read the same 256 B) is on its critical path only when the ready wait does not cover it.

Not bit-identical to the WS kernel (row sums over 64 columns in one warpgroup instead of 2 x 32 + an add):
tolerance checks only.

Measured (session 16, H200, git 1c39d4c, ``GIT_SHA=1c39d4c bash benchmarks/device_sparse_prefill_ws2.sh``,
results/sparse_prefill_ws2-h200-2026-11-29-s16.json; s_q 4096, h_q 128, d_qk 576, topk 2048, do_bench median):
GPU tests 43/43; s_kv 8K 480.6 / 481.9 TFLOPS (sink / none; WS 403.3 / 403.7: 1.19x), s_kv 64K 430.9 / 433.5 (WS
373.5 / 376.0: 1.15x) -- the predicted 420-470 at its top (8K above it). Per block 2*64*64*1088 flop / 132 SMs ->
~1.1 us at 8K, ~1.2 us at 64K (where the gathers miss L2 more). Against FlashMLA on the same GPU (ANCHORS.md, no
sink): 0.82x / 0.83x; target 640 not reached.

OVERLAP (opt-in, not dispatched; constexpr ``OVERLAP``, launcher / compile keyword ``overlap``, default 0 = the
schedule above, whose cleaned PTX is byte-identical to before the option: sha256 of all 8 (d_pe, has_len, has_sink)
configurations compared, tests/test_gluon_sparse_prefill_ws2.py ``test_default_ptx_unchanged``).

* Why. Per (CTA, 64-token block) the default's softmax warpgroup runs S_j (36 m64n64k16: 2.36 M MAC = ~1,150 clk
  at 2,048 MAC/clk/SM), then softmax_j, the handoff, then its P V_j half while the PV warpgroup runs the other half
  (2 x 1.05 M MAC = ~1,020 clk together) -- nothing keeps the tensor core busy during the softmax. Measured 2.44 us
  = ~4,470 clk per block at s_kv 8K, so the softmax chain (row max, 34 exp2, row sum over 32 values per thread, the
  P / alpha stores, fence, 3 warpgroup barriers, mbarrier waits, wgmma issue / drain) costs X ~ 2,300 clk.
* ``OVERLAP=1`` = FA3 order in the softmax warpgroup + a lagged PV warpgroup (:func:`_p2o_softmax_wg`,
  :func:`_p2o_pv_wg`). Block j's step (j >= 1): issue S_j, rescale O[:, :256] by alpha_{j-1}, issue its
  P V_{j-1}[:, :256] behind S_j (P_{j-1} as the REGISTER A operand), ``wait_group 1`` (S_j only), arrive ``sdone``,
  softmax_j while P V_{j-1} runs, hand P_j / alpha_j over (``pfree`` wait, stores, ``pready``), then ``wait_group
  0`` and release slot j-1. The PV warpgroup's P V_{j-1}[:, 256:] waits for ``pready`` AND ``sdone`` (S_j done),
  so it runs under softmax_j instead of competing with S_j. The tensor core then sees S_j alone, then both P V_{j-1}
  halves (~1,020 clk) under softmax_j: period ~ S + max(X', 1,020) + issue gaps instead of S + X + 1,020.
  ``OVERLAP=2``: the same softmax warpgroup, the PV warpgroup at ``pready`` as in the default (its half competes with
  S_{j+1}): period ~ S + 510 + max(X', 510); bench label ``gluon-ws2-ov2`` (opt-in ``--gluon-add``).
* Barriers / phases. Unchanged: ``ready`` / ``empty`` (count 2) / ``pready`` / ``pfree`` parities; the softmax
  warpgroup's ``empty`` arrive for block j moves into step j+1 (after its P V_j wait) or the tail. New (OVERLAP 1):
  ``sdone`` (count 1), arrived once per block -- in step j for block j-1 (after S_j completed) and in the tail for
  the last block -- and waited by the PV warpgroup with parity ``j & 1``; no wait of one warpgroup depends on a
  later arrive of the waiter itself (checked by hand: step j's ``pfree`` wait needs the PV warpgroup's block j-1,
  which needs ``sdone`` arrived earlier in step j).
* Ring-slot lifetime (the dense decode FA3 lesson, benchmarks/notes/mla_decode_gluon.md). Slot j-1 is now released
  when both P V_{j-1} complete, ~1,020 clk after S_j, i.e. during softmax_j; the producer must have gathered block
  j+1 into it before S_{j+1} is issued (end of step j's handoff): slack ~ X' - 1,020 ~ 1,300 clk (~0.7 us) per
  72 KB gather, against ~3,300 clk in the default (whose P V halves finish before S_{j+1}). OVERLAP 2 leaves
  ~1,800 clk. The prefill producer is cp.async from L2 (94.7 % hit rate at 8K), no dequant, so the 2-slot ring is
  kept; it is the first suspect if s_kv 64K (more L2 misses) gains less than 8K.
* Shaped by ptxas (SASS inspected, asserted in ``test_compile_overlap``). With P V_{j-1} reading P from shared
  memory its wait had to precede the P_j store, and ptxas sank 29 of the 34 exp2 below that wait (no overlap left).
  With the register operand the P_j store + barrier precede the wait, and all 34 MUFU.EX2 sit between the two
  WARPGROUP.DEPBARs. P crosses the back edge in fp32 and is packed at the top of the step (dense prefill v2's
  lesson). The register operand needs no layout conversion through shared memory (same STS / LDS counts per block
  as the default).
* Compile facts (Triton 3.6 wheel, ptxas sm_90a, all 8 configurations): shared memory OVERLAP 1 229,904 / 229,920 B
  (d_qk 576, without / with topk_length; + 1 mbarrier), 205,312 B (512); OVERLAP 2 = the default's. wgmma 2 x 36
  (32) m64n64k16 (prologue + loop) + 12 m64n256k16 (8 with a register A). Registers: the softmax warpgroup holds
  O[:, :256] (128) and P_{j-1} (16) in flight while softmax_j needs S (32) and its temporaries: at the default
  setmaxnreg (PV 216 / softmax 232) 32-35 spill instructions per block; :data:`WS2_OV_PV_REGS` = 200 -> softmax
  248 (producer 56): 2-4 spill instructions per block (LDL of loop-invariant values before the P pack, L1 hits),
  40-56 B spill stores in all, 0 in the PV and producer loops; 192 / 256 was worse (4-8). Softmax block loop 734 /
  713 SASS instructions (d_qk 576 / 512; default 706 / 679), 40 / 36 HGMMA, 34 MUFU.EX2.
* PREDICTION (H200, s_q 4096, h_q 128, topk 2048, sink off / on alike). OVERLAP 1: X' ~ X + ~100 clk (the sdone
  barrier and arrive, the P pack) ~ 2,400 > 1,020, so period ~ 1,150 + 2,400 ~ 3,550 clk if the gather fits its
  ~1,300 clk slack: 1.26x -> s_kv 8K ~ 600 TFLOPS (range 530-620); s_kv 64K ~ 490 (range 420-540), lower ratio
  because the gathers miss L2 more and the slack is halved -- below ws2 at 64K is possible (the decode FA3 failure
  mode). OVERLAP 2: period ~ 1,150 + 510 + 2,400 ~ 4,060 clk: 1.10x -> 8K ~ 530, 64K ~ 470. Not bit-identical
  guaranteed but expected (the same operations per block in the same order; GPU test records it).
* MEASURED (session 16, H200, git 2cbd731921ab, ``bash benchmarks/device_sparse_prefill_ov.sh``,
  results/sparse_prefill_ov-h200-2026-11-29-s16.json): correct -- 41/41 (OVERLAP 1) and 24/24 (OVERLAP 2 subset)
  GPU tests, output bit-identical to the default -- but SLOWER: OVERLAP 1 382-383 TFLOPS at 8K (ws2 476: 0.80x),
  336 at 64K (ws2 421: 0.80x); OVERLAP 2 397-401 at 8K (0.83-0.84x), 339-340 at 64K (0.81x). Prediction (1.26x /
  1.10x) missed in sign, as the dense decode FA3 order did: with two 72 KB ring slots, releasing slot j-1 only after
  P V_{j-1} (now completing after S_j) leaves the producer's next gather too little slack; not profiled. Not
  dispatched; kept as an option for a 3-slot ring (needs a smaller tile or Q out of shared memory).

HALF (opt-in, not dispatched; constexpr ``HALF``, launcher / compile keyword ``half_tiles=False``, combinable with
every OVERLAP; bench labels ``gluon-ws2-half`` / ``-half-ov`` / ``-half-ov2``, ``--gluon-add``). With HALF off the
cleaned PTX of all 24 (overlap, d_pe, has_len, has_sink) kernels is byte-identical to before the option
(``test_default_ptx_unchanged``, ``test_overlap_ptx_unchanged``).

* Sharper diagnosis of the OVERLAP loss (from the code, not profiled). In the OVERLAP schedule the softmax
  warpgroup's ``empty[j-1]`` arrive sits after ``wait_group 0``, which sits after softmax_j AND the P_j handoff, i.e.
  at the very end of step j -- right before S_{j+1} is issued, and S_{j+1} reads exactly the slot that arrive frees
  (block j+1 = slot (j-1) % 2). So the gather of block j+1 (72 KB) starts when S_{j+1} wants it: the 2-slot ring
  acts as one slot, and the whole gather latency G is exposed (not "~1,300 clk of slack"). Fitting the measurement:
  default period 1,150 + X + 1,020 = 4,470 clk (X ~ 2,300); OVERLAP 1 5,590 clk = 1,150 + X' + G -> G ~ 2,000 clk
  (~1.1 us per 72 KB gather); OVERLAP 2 5,350.
* Design. ``ready`` / ``empty`` become 4 mbarriers each, one per 32-token half-slot (index ``2 slot + h``; counts 1 /
  2; parities unchanged: ``(j // 2) & 1``, producer ``^ 1``). The producer (:func:`_p2h_producer`) gathers block j as
  two [32, 512] + [32, 64] halves into rows [32 h, 32 h + 32) of the slot (``_g_gather`` with BLOCK_N 32, 18
  cp.async of 16 B per thread each), each after its own ``empty`` wait and signalled on its own ``ready``
  (per-thread ``cp.async.mbarrier.arrive`` + one arrive). S stays one m64n64 product per 64 tokens, waiting both
  halves: with both operands in shared memory an m64n64k16 reads 2 KB of Q + 2 KB of K per 32 tensor clk = 128
  B/clk, the SM's shared-memory limit already; an N = 32 S reads 2 KB + 1 KB per 16 clk = 192 B/clk (1.5x the time
  of the S that dominates the block). P V of each consumer warpgroup is two commit groups of 32 tokens
  (``P[:, :32] V[:32]``, ``P[:, 32:] V[32:]``: 2 m64n256k16 each, the same 4 k-steps in the same order as before ->
  expected bit-identical); ``wait_group 1`` -> ``empty[2 slot]``, ``wait_group 0`` -> ``empty[2 slot + 1]`` (PV
  warpgroup: and ``pfree``). With OVERLAP the softmax warpgroup's register P_{j-1} is split into two [64, 32]
  operands (reshape / permute / split; no shared-memory round trip: 6 STS per block as the default) and -- the point
  -- its two waits + releases move INSIDE softmax_j (after the row max / alpha, and after the exp2 / row sum), before
  the handoff (:func:`_p2ho_softmax_wg`), so slot j-1 is freed when both warpgroups' P V_{j-1} groups are done
  (~1,400-2,200 clk into the step) instead of at its end.
* Barrier protocol (j = block; s = j % 2; h = half): producer waits ``empty[2s+h]`` parity ``((j//2)&1)^1``, gathers,
  arrives ``ready[2s+h]``; both consumer warpgroups wait ``ready[2s]`` and ``ready[2s+1]`` parity ``(j//2)&1``;
  each consumer arrives ``empty[2s+h]`` once per block after its P V of half h completed (OVERLAP: the softmax
  warpgroup in step j+1 / the tail). ``pready`` / ``pfree`` / ``sdone`` as before. No wait depends on a later
  arrive of the waiter (checked by hand: the producer's block j+2 half h needs block j's half h arrives, which
  need only block j's own P V and, for the PV warpgroup, ``pready_j`` / ``sdone`` from step j+1's S wait; a
  consumer arrives each half-phase once, since its next arrive on that barrier is after a ``ready`` wait of block
  j+2 that needs the producer past that phase).
* Compile facts (Triton 3.6 wheel, ptxas sm_90a, all 8 configurations per overlap; ``test_compile_half``). Shared
  memory +32 B (4 more mbarriers): OVERLAP 0 / 2 229,904 / 229,920 B (d_qk 576, without / with topk_length),
  205,312 / 205,328 (512); OVERLAP 1 229,936 / 229,952, 205,344. setmaxnreg: OVERLAP 0 producer 56 / PV 216 /
  softmax 232 (:data:`WS2_HALF_PV_REGS`): 0 spill anywhere, softmax block loop 723 / 696 SASS instructions (default
  706 / 679), PV loop 197 (default ~190), producer loop 465 / 392 with 36 / 32 LDGSTS and 2 empty waits.
  OVERLAP 1 / 2: PV 192 / softmax 256 (:data:`WS2_HALF_OV_PV_REGS`; at the non-half 200 / 248 the softmax loop had
  14 spill instructions, 40 B; 208 / 240: 21): 0-3 spill instructions in the softmax loop (0-16 B in all), 0 in the
  PV and producer loops; softmax loop 719-746 instructions. SASS order in the softmax loop (asserted): S_j + both
  P V_{j-1} groups issued, S wait, [row max / alpha], ``wait_group 1`` -> half 0 arrive, ``wait_group 0`` -> half 1
  arrive, then the handoff's ``pfree`` wait and ``pready``. ptxas places the two DEPBARs ~150 / ~175 instructions
  after the S wait and sinks 26 of the 34 exp2 below the second (at 248 registers it kept 23 of 34 above it):
  releases early, at the price of a possible stall on the softmax warpgroup's own P V_{j-1} (~0.5 k clk of tensor
  work queued behind S_j) and less exp2 under P V.
* PREDICTION (H200, s_q 4096, h_q 128, topk 2048; paired rotated-round ratio vs ws2 in the same run, ws2 ~476 at 8K
  / ~421 at 64K). HALF alone (OVERLAP 0): the default's gather already has ~one period of slack; HALF adds 2 waits,
  1 wait_group, 2 arrives + barriers per warpgroup and block: 0.97-1.01x -> 8K ~465-480, 64K ~410-425. HALF +
  OVERLAP 1: slot j-1 freed at ~2,200 clk into the step (PV warpgroup's second group; half 0 ~250 earlier), S_{j+1}
  issued at ~1,150 + X'' (X'' ~ 2,500: X' + a possible DEPBAR stall); the gather (G ~ 2,000 clk for 72 KB, the two
  halves staggered) completes ~3,600-4,000 -> period ~3,700-4,100 clk: 1.05-1.2x -> 8K ~500-570 (central 530); 64K
  (G larger: more L2 misses) 0.95-1.1x -> ~400-465 (central 430). HALF + OVERLAP 2: the PV warpgroup's P V_{j-1}
  competes with S_j, so its releases come earlier but S_j is ~510 clk longer: 1.0-1.12x -> 8K ~475-535, 64K
  ~410-455. Either way HALF + OVERLAP 1 should beat OVERLAP 1 without it by >= 1.25x (its 0.80x came from G); if
  it does not, the exposed-gather diagnosis is wrong. Not bit-identical guaranteed but expected (GPU test records).
  Not run on a GPU yet (``benchmarks/device_sparse_prefill_half.sh``).
* MEASURED (session 17, H200, git 0b54eb4785ad, ``benchmarks/device_sparse_prefill_half.sh``, 6 rotated rounds,
  results/sparse_prefill_half-h200-2026-11-29-s17.json): 120/120 GPU tests, every variant bit-identical to ws2; paired
  t / t_ws2: HALF 1.03-1.05, HALF + OVERLAP 1 1.15-1.19, HALF + OVERLAP 2 1.15-1.18, OVERLAP 1 1.22-1.24 (sink on /
  off, s_kv 8K / 64K). All slower; HALF + OVERLAP 1 is only ~1.05x OVERLAP 1 (falsifier: < 1.25x) -- the exposed
  gather is NOT why OVERLAP loses. Kept as options, not dispatched.
"""
from __future__ import annotations

import os

import torch

from .._gluon import (IMPORT_ERROR as _IMPORT_ERROR, available, gl, async_copy,  # noqa: F401
                      fence_async_shared, mbarrier, warpgroup_mma, warpgroup_mma_wait)
from .._gluon import compile_sm90 as _compile_sm90_gluon, jit as _jit
from .._launch import cached_launcher, spec_key
from ._gluon_sparse_prefill import BLOCK_H, D_V, WS_MAXNREG, _g_gather, _g_ws_producer, _g_ws_rows, supported

__all__ = ["available", "supported_ws2", "dispatch_on", "launch_sparse_prefill_gluon_ws2", "compile_sm90_ws2",
           "DISPATCH", "WS2_PV_REGS", "WS2_MAXNREG", "WS2_PRODUCER_REGS", "WS2_NUM_WARPS", "WS2_OV_PV_REGS",
           "WS2_HALF_PV_REGS", "WS2_HALF_OV_PV_REGS", "OVERLAP_MODES"]

# launch_sparse_prefill_gluon (variant None) routes here since its first device run (session 16, H200, git 1c39d4c,
# results/sparse_prefill_ws2-h200-2026-11-29-s16.json: 43/43 GPU tests; s_q 4096, h_q 128, topk 2048: 480.6-481.9
# TFLOPS at s_kv 8K (1.19x WS), 430.9-433.5 at 64K (1.15x WS), sink off/on; errors equal to the WS kernel's)
DISPATCH = True
WS2_NUM_WARPS = 4         # the default partition (softmax warpgroup); + 4 PV + 4 producer warps = 12
WS2_MAXNREG = WS_MAXNREG  # 168: 12 warps x 32 x 168 = 64,512 of the 65,536 registers
# setmaxnreg of the producer: the WS kernel's 40 (WS_PRODUCER_REGS) left 8-26 spill instructions in its block loop
# (d_qk 576 / 512 without topk_length); 56 leaves 0 in all configurations, and the consumers still get 216 / 232
WS2_PRODUCER_REGS = 56
WS2_PV_REGS = 216         # setmaxnreg of the PV warpgroup; the softmax warpgroup gets the rest (168 * 3 - 56 - 216)
# OVERLAP 1 / 2 (opt-in): the softmax warpgroup also holds the in-flight P V_{j-1} (O half + its register P operand)
# during softmax_j: PV warpgroup 200, softmax warpgroup 248 (at 216 / 232: 32-35 spill instructions in its block
# loop; 200 / 248: 2-4; 192 / 256: 4-8; ptxas of the Triton 3.6 wheel)
WS2_OV_PV_REGS = 200
# HALF (opt-in, any OVERLAP): the PV warpgroup's setmaxnreg with half tiles, OVERLAP 0 / OVERLAP 1-2 (section "HALF")
WS2_HALF_PV_REGS = 216
WS2_HALF_OV_PV_REGS = 192
_LOG2E = 1.4426950408889634

supported_ws2 = supported


def dispatch_on() -> bool:
    """Whether ``_gluon_sparse_prefill.launch_sparse_prefill_gluon`` (variant None) launches this kernel:
    ``DEEPKERNELS_SPARSE_PREFILL_WS2=1`` / ``=0`` (read per call; the device scripts switch it for a whole run),
    else :data:`DISPATCH`."""
    env = os.environ.get("DEEPKERNELS_SPARSE_PREFILL_WS2", "")
    if env in ("0", "1"):
        return env == "1"
    return DISPATCH


# ----------------------------------------------------------------------------------------------- device code

@_jit
def _p2_write_half(o, inv, tok, hb, out_ptr, stride_os, stride_oh, COL0: gl.constexpr, O_L: gl.constexpr):
    """Columns [COL0, COL0 + 256) of the CTA's output rows: ``o * inv`` in bf16 (``_g_finish``'s addressing)."""
    offs_ho = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, O_L))
    offs_d = COL0 + gl.arange(0, 256, gl.SliceLayout(0, O_L))
    o = o * inv[:, None]
    o_rows = out_ptr + tok * stride_os + offs_ho.to(gl.int64)[:, None] * stride_oh
    gl.store(o_rows + offs_d[None, :], o.to(gl.bfloat16))


@_jit
def _p2_stats(m_i, l_i, tok, hb, sink_ptr, ml_ptr, lse_ptr, sm_scale, H_Q, HAS_SINK: gl.constexpr,
              S_L: gl.constexpr):
    """``_g_finish``'s per-row part (same expressions): stores lse and max_logits (natural-log units; empty rows +inf
    / -inf), returns the output scale 1 / (L [+ exp(sink - m)]) (0 for an empty row)."""
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    offs_h = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, S_L))
    denom = l_safe
    if HAS_SINK:
        sink = gl.load(sink_ptr + offs_h)
        m_nat = gl.where(empty, 0.0, m_i * sm_scale)
        denom = l_safe + gl.exp(sink - m_nat)
    inv = gl.where(empty, 0.0, 1.0 / denom)
    lse = gl.where(empty, float("inf"), m_i * sm_scale + gl.log(l_safe))
    mx = gl.where(empty, float("-inf"), m_i * sm_scale)
    gl.store(lse_ptr + tok * H_Q + offs_h, lse)
    gl.store(ml_ptr + tok * H_Q + offs_h, mx)
    return inv


@_jit
def _p2_prologue(q_n, q_p, q_ptr, idx_ptr, len_ptr, topk, stride_qs, stride_qh, stride_is, H_Q,
                 D_PE: gl.constexpr, HAS_LEN: gl.constexpr):
    """Every softmax warpgroup's start: this CTA's (query token, 64-head group), its 64 Q rows into shared memory
    in 64-column chunks (32 registers of loads live at a time) made visible to the wgmma proxy, the token's valid
    position count ``n`` and block count, and its index row. Returns (tok, hb, n, num_blocks, idx_row)."""
    LP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    pid = gl.program_id(0)
    tok = (pid // (H_Q // 64)).to(gl.int64)
    hb = pid % (H_Q // 64)
    hq = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, LP))
    dq = gl.arange(0, 64, gl.SliceLayout(0, LP))
    q_rows = q_ptr + tok * stride_qs + hq.to(gl.int64)[:, None] * stride_qh
    for c in gl.static_range(8):
        q_n.slice(c * 64, 64, dim=1).store(gl.load(q_rows + (c * 64 + dq)[None, :]))
    if D_PE > 0:
        q_p.store(gl.load(q_rows + (512 + dq)[None, :]))
    fence_async_shared()
    gl.thread_barrier()
    n, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    return tok, hb, n, num_blocks, idx_ptr + tok * stride_is


@_jit
def _p2_softmax_wg(q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree, q_ptr, idx_ptr, len_ptr,
                   sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2, stride_qs, stride_qh,
                   stride_is, stride_os, stride_oh, H_Q, D_PE: gl.constexpr, HAS_LEN: gl.constexpr,
                   HAS_SINK: gl.constexpr):
    """Default partition (4 warps): Q, the full S = Q K^T, the online softmax, P + alpha to the PV warpgroup,
    O[:, :256] += P V[:, :256]; epilogue: lse / max_logits, the output scale to the PV warpgroup, out[:, :256]."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    LS: gl.constexpr = gl.SliceLayout(0, S_L)
    tok, hb, n, num_blocks, idx_row = _p2_prologue(q_n, q_p, q_ptr, idx_ptr, len_ptr, topk, stride_qs, stride_qh,
                                                   stride_is, H_Q, D_PE, HAS_LEN)
    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))   # running max of raw q.k
    l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, S_L))
    acc = gl.zeros([64, 256], gl.float32, O_L)
    s_zero = gl.zeros([64, 64], gl.float32, S_L)
    for j in range(num_blocks):
        slot = j % 2
        # validity of the block's tokens (the WS consumer's expression), loaded before the ready wait
        offs_n = j * 64 + gl.arange(0, 64, LS)
        idx = gl.load(idx_row + offs_n, mask=offs_n < n, other=-1)
        valid = (idx >= 0) & (idx < s_kv)
        mbarrier.wait(ready.index(slot), (j // 2) & 1)
        fence_async_shared()     # the cp.async writes (generic proxy) before the wgmma reads (async proxy)
        tok_s = warpgroup_mma(q_n, kv_n.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if D_PE > 0:
            tok_s = warpgroup_mma(q_p, kv_p.index(slot).permute((1, 0)), tok_s, is_async=True)
        s = warpgroup_mma_wait(0, deps=(tok_s, ))
        # online softmax step (_g_softmax's expressions, row reductions inside this warpgroup)
        s = gl.where(valid[None, :], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2((m_i - m_safe) * scale_log2)
        p = gl.exp2((s - m_safe[:, None]) * scale_log2)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        # P and alpha to the PV warpgroup (once it released the previous ones)
        mbarrier.wait(pfree, (j & 1) ^ 1)
        p_smem.store(p.to(gl.bfloat16))
        a_smem.store(alpha)
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(pready)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        tok_o = warpgroup_mma(p_smem, kv_n.index(slot).slice(0, 256, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(tok_o, ))
        mbarrier.arrive(empty.index(slot))

    # epilogue: lse / max_logits here, the output scale to the PV warpgroup, own half of the output
    inv = _p2_stats(m_i, l_i, tok, hb, sink_ptr, ml_ptr, lse_ptr, sm_scale, H_Q, HAS_SINK, S_L)
    mbarrier.wait(pfree, (num_blocks & 1) ^ 1)
    a_smem.store(inv)
    gl.thread_barrier()
    mbarrier.arrive(pready)
    _p2_write_half(acc, gl.convert_layout(inv, gl.SliceLayout(1, O_L)), tok, hb, out_ptr, stride_os, stride_oh, 0,
                   O_L)


@_jit
def _p2_pv_wg(kv_n, p_smem, a_smem, ready, empty, pready, pfree, len_ptr, out_ptr, topk, stride_os, stride_oh, H_Q,
              HAS_LEN: gl.constexpr):
    """Worker partition (4 warps): O[:, 256:] = O[:, 256:] * alpha + P V[:, 256:] per block; epilogue: the output
    scale from the softmax warpgroup, out[:, 256:]."""
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    pid = gl.program_id(0)
    tok = (pid // (H_Q // 64)).to(gl.int64)
    _, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    acc = gl.zeros([64, 256], gl.float32, O_L)
    for j in range(num_blocks):
        slot = j % 2
        mbarrier.wait(ready.index(slot), (j // 2) & 1)    # passed already (the softmax WG sent P after it)
        mbarrier.wait(pready, j & 1)
        fence_async_shared()     # the cp.async V writes (generic proxy) before this warpgroup's wgmma
        alpha = a_smem.load(gl.SliceLayout(1, O_L))
        acc = acc * alpha[:, None]
        tok_o = warpgroup_mma(p_smem, kv_n.index(slot).slice(256, 256, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(tok_o, ))
        mbarrier.arrive(pfree)
        mbarrier.arrive(empty.index(slot))
    mbarrier.wait(pready, num_blocks & 1)
    inv = a_smem.load(gl.SliceLayout(1, O_L))
    pid = gl.program_id(0)
    _p2_write_half(acc, inv, (pid // (H_Q // 64)).to(gl.int64), pid % (H_Q // 64), out_ptr, stride_os, stride_oh,
                   256, O_L)


# ------------------------------------------------------------- OVERLAP (opt-in): FA3 order + lagged PV warpgroup

@_jit
def _p2o_valid(idx_row, j, n, s_kv, LS: gl.constexpr):
    """Validity of block j's 64 tokens (the WS consumer's expression)."""
    offs_n = j * 64 + gl.arange(0, 64, LS)
    idx = gl.load(idx_row + offs_n, mask=offs_n < n, other=-1)
    return (idx >= 0) & (idx < s_kv)


@_jit
def _p2o_softmax(s, valid, m_i, l_i, scale_log2):
    """One online-softmax step (the default path's expressions): returns P (fp32), alpha, the new max and sum."""
    s = gl.where(valid[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2((m_i - m_safe) * scale_log2)
    p = gl.exp2((s - m_safe[:, None]) * scale_log2)
    l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_i


@_jit
def _p2o_handoff(p, alpha, p_smem, a_smem, pready, pfree, j):
    """P_j (bf16) and alpha_j to the PV warpgroup once it released P_{j-1} (``pfree``), then ``pready``. The
    softmax warpgroup's own P V reads P from registers, so ``p_smem`` has this one reader."""
    mbarrier.wait(pfree, (j & 1) ^ 1)
    p_smem.store(p.to(gl.bfloat16))
    a_smem.store(alpha)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(pready)


@_jit
def _p2o_softmax_wg(q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree, sdone, q_ptr, idx_ptr,
                    len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2, stride_qs,
                    stride_qh, stride_is, stride_os, stride_oh, H_Q, D_PE: gl.constexpr, HAS_LEN: gl.constexpr,
                    HAS_SINK: gl.constexpr, OVERLAP: gl.constexpr):
    """Default partition with ``OVERLAP`` 1 / 2 (module docstring, section "OVERLAP"). Block j's step (j >= 1),
    entered with P_{j-1} in fp32 and alpha_{j-1}: pack P_{j-1} to the register A operand, issue S_j, rescale O by
    alpha_{j-1}, issue P V_{j-1}[:, :256] behind S_j, wait for S_j only (``wait_group 1``), [OVERLAP 1: arrive
    ``sdone``], softmax_j while P V_{j-1} runs, P_j / alpha_j to the PV warpgroup, then wait for P V_{j-1} and
    release slot j-1. Prologue: S_0, softmax_0, handoff; tail: the last P V.

    Shaped by ptxas (SASS checked, module docstring): with P V_{j-1} reading P from shared memory its wait had to
    precede the P_j store, and ptxas then sank 29 of the 34 exp2 below that wait; with P as the register operand the
    P_j store (and its barrier) precede the wait, which pins the softmax before it. P crosses the back edge in fp32
    and is packed at the top (dense prefill v2's lesson: a loop-carried packed P shares the in-flight P's
    registers)."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    L_PA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    LS: gl.constexpr = gl.SliceLayout(0, S_L)
    tok, hb, n, num_blocks, idx_row = _p2_prologue(q_n, q_p, q_ptr, idx_ptr, len_ptr, topk, stride_qs, stride_qh,
                                                   stride_is, H_Q, D_PE, HAS_LEN)
    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))   # running max of raw q.k
    l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, S_L))
    acc = gl.zeros([64, 256], gl.float32, O_L)
    s_zero = gl.zeros([64, 64], gl.float32, S_L)
    if num_blocks > 0:
        # prologue: S_0, softmax_0, P_0 handed over (O is zero: nothing to rescale or accumulate yet)
        valid = _p2o_valid(idx_row, 0, n, s_kv, LS)
        mbarrier.wait(ready.index(0), 0)
        fence_async_shared()
        tok_s = warpgroup_mma(q_n, kv_n.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if D_PE > 0:
            tok_s = warpgroup_mma(q_p, kv_p.index(0).permute((1, 0)), tok_s, is_async=True)
        s = warpgroup_mma_wait(0, deps=(tok_s, ))
        p32, alpha, m_i, l_i = _p2o_softmax(s, valid, m_i, l_i, scale_log2)
        _p2o_handoff(p32, alpha, p_smem, a_smem, pready, pfree, 0)
        for j in range(1, num_blocks):
            slot = j % 2
            prev = 1 - slot
            p_op = gl.convert_layout(p32.to(gl.bfloat16), L_PA)     # P_{j-1} as the register A operand
            valid = _p2o_valid(idx_row, j, n, s_kv, LS)      # loaded before the ready wait (latency hidden)
            mbarrier.wait(ready.index(slot), (j // 2) & 1)
            fence_async_shared()
            tok_s = warpgroup_mma(q_n, kv_n.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            if D_PE > 0:
                tok_s = warpgroup_mma(q_p, kv_p.index(slot).permute((1, 0)), tok_s, is_async=True)
            # O is idle here (its P V_{j-2} was waited for): rescale, then P V_{j-1} queued behind S_j
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
            tok_o = warpgroup_mma(p_op, kv_n.index(prev).slice(0, 256, dim=1), acc, is_async=True)
            s = warpgroup_mma_wait(1, deps=(tok_s, ))          # S_j done; P V_{j-1} may still run
            if OVERLAP == 1:
                mbarrier.arrive(sdone)     # the PV warpgroup may now issue its P V_{j-1} (under softmax_j)
            p32, alpha, m_i, l_i = _p2o_softmax(s, valid, m_i, l_i, scale_log2)
            _p2o_handoff(p32, alpha, p_smem, a_smem, pready, pfree, j)
            acc, p_op = warpgroup_mma_wait(0, deps=(tok_o, p_op))
            mbarrier.arrive(empty.index(prev))
        # tail: the last block's P V
        last = (num_blocks - 1) % 2
        p_op = gl.convert_layout(p32.to(gl.bfloat16), L_PA)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        tok_o = warpgroup_mma(p_op, kv_n.index(last).slice(0, 256, dim=1), acc, is_async=True)
        if OVERLAP == 1:
            mbarrier.arrive(sdone)         # no S_{num_blocks}: releases the PV warpgroup's last block
        acc, p_op = warpgroup_mma_wait(0, deps=(tok_o, p_op))
        mbarrier.arrive(empty.index(last))

    inv = _p2_stats(m_i, l_i, tok, hb, sink_ptr, ml_ptr, lse_ptr, sm_scale, H_Q, HAS_SINK, S_L)
    mbarrier.wait(pfree, (num_blocks & 1) ^ 1)
    a_smem.store(inv)
    gl.thread_barrier()
    mbarrier.arrive(pready)
    _p2_write_half(acc, gl.convert_layout(inv, gl.SliceLayout(1, O_L)), tok, hb, out_ptr, stride_os, stride_oh, 0,
                   O_L)


@_jit
def _p2o_pv_wg(kv_n, p_smem, a_smem, ready, empty, pready, pfree, sdone, len_ptr, out_ptr, topk, stride_os,
               stride_oh, H_Q, HAS_LEN: gl.constexpr, OVERLAP: gl.constexpr):
    """:func:`_p2_pv_wg` with ``OVERLAP`` 1: block j's P V waits, besides ``pready``, for ``sdone`` (the softmax
    warpgroup's S_{j+1} completed, or it has no block j + 1), so it runs under softmax_{j+1} instead of competing
    with S_{j+1} for the tensor core. ``OVERLAP`` 2: as :func:`_p2_pv_wg`."""
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    pid = gl.program_id(0)
    tok = (pid // (H_Q // 64)).to(gl.int64)
    _, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    acc = gl.zeros([64, 256], gl.float32, O_L)
    for j in range(num_blocks):
        slot = j % 2
        mbarrier.wait(ready.index(slot), (j // 2) & 1)    # passed already (the softmax WG sent P after it)
        mbarrier.wait(pready, j & 1)
        if OVERLAP == 1:
            mbarrier.wait(sdone, j & 1)
        fence_async_shared()
        alpha = a_smem.load(gl.SliceLayout(1, O_L))
        acc = acc * alpha[:, None]
        tok_o = warpgroup_mma(p_smem, kv_n.index(slot).slice(256, 256, dim=1), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(tok_o, ))
        mbarrier.arrive(pfree)
        mbarrier.arrive(empty.index(slot))
    mbarrier.wait(pready, num_blocks & 1)
    inv = a_smem.load(gl.SliceLayout(1, O_L))
    _p2_write_half(acc, inv, tok, pid % (H_Q // 64), out_ptr, stride_os, stride_oh, 256, O_L)


# -------------------------------------------------------- HALF (opt-in): 32-token half-tile ready / empty pairs

@_jit
def _p2h_producer(kv_n, kv_p, ready, empty, kv_ptr, idx_ptr, len_ptr, s_kv, topk, stride_kvs, stride_is, H_Q,
                  D_PE: gl.constexpr, HAS_LEN: gl.constexpr):
    """:func:`_gluon_sparse_prefill._g_ws_producer` (2 slots) with each 64-token block gathered as two 32-token
    halves, each into rows [32 h, 32 h + 32) of the slot's tiles after its own ``empty[2 slot + h]`` and signalled on
    its own ``ready[2 slot + h]`` (per-thread ``cp.async.mbarrier.arrive`` + one ordinary arrive, count 1): half 0
    of block j + 2 starts as soon as both consumer warpgroups finished P V of block j's first 32 tokens."""
    LN4: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    LP4: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    tok = (gl.program_id(0) // (H_Q // 64)).to(gl.int64)
    n, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    idx_row = idx_ptr + tok * stride_is
    for j in range(num_blocks):
        slot = j % 2
        for h in gl.static_range(2):
            mbarrier.wait(empty.index(2 * slot + h), ((j // 2) & 1) ^ 1)    # a fresh barrier passes phase 1
            _g_gather(kv_n.index(slot).slice(h * 32, 32, dim=0), kv_p.index(slot).slice(h * 32, 32, dim=0), kv_ptr,
                      idx_row, j * 64 + h * 32, n, s_kv, stride_kvs, 32, 512, D_PE, LN4, LP4, False)
            async_copy.mbarrier_arrive(ready.index(2 * slot + h))
            mbarrier.arrive(ready.index(2 * slot + h))


@_jit
def _p2h_wait_ready(ready, slot, phase):
    """Both 32-token halves of ring slot ``slot`` have landed (S is computed per 64 tokens: module docstring)."""
    mbarrier.wait(ready.index(2 * slot), phase)
    mbarrier.wait(ready.index(2 * slot + 1), phase)


@_jit
def _p2h_pv(a_lo, a_hi, v, acc, empty, slot):
    """``acc += P V`` (``v`` = the slot's [64, 256] value columns of this warpgroup) as two commit groups of 32
    tokens (2 x m64n256k16 each); ``empty[2 slot]`` arrives at ``wait_group 1`` (first half read), ``empty[2 slot +
    1]`` at ``wait_group 0``. ``a_lo`` / ``a_hi``: P[:, :32] / P[:, 32:] (shared memory views). Returns acc."""
    tok = warpgroup_mma(a_lo, v.slice(0, 32, dim=0), acc, is_async=True)
    tok = warpgroup_mma(a_hi, v.slice(32, 32, dim=0), tok, is_async=True)
    tok = warpgroup_mma_wait(1, deps=(tok, ))
    mbarrier.arrive(empty.index(2 * slot))
    acc = warpgroup_mma_wait(0, deps=(tok, ))
    mbarrier.arrive(empty.index(2 * slot + 1))
    return acc


@_jit
def _p2h_split_p(p32, L_PA: gl.constexpr):
    """P (fp32, the S accumulator layout) -> bf16 P[:, :32], P[:, 32:] as register A operands of m64n256k16."""
    p3 = gl.permute(gl.reshape(p32.to(gl.bfloat16), [64, 2, 32]), [0, 2, 1])
    lo, hi = gl.split(p3)
    return gl.convert_layout(lo, L_PA), gl.convert_layout(hi, L_PA)


@_jit
def _p2h_softmax_wg(q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree, q_ptr, idx_ptr, len_ptr,
                    sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2, stride_qs, stride_qh,
                    stride_is, stride_os, stride_oh, H_Q, D_PE: gl.constexpr, HAS_LEN: gl.constexpr,
                    HAS_SINK: gl.constexpr):
    """:func:`_p2_softmax_wg` (OVERLAP 0 order) with half tiles: waits both halves' ``ready`` before S, its P V
    [:, :256] as two 32-token commit groups (:func:`_p2h_pv`) releasing each half-slot separately."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    LS: gl.constexpr = gl.SliceLayout(0, S_L)
    tok, hb, n, num_blocks, idx_row = _p2_prologue(q_n, q_p, q_ptr, idx_ptr, len_ptr, topk, stride_qs, stride_qh,
                                                   stride_is, H_Q, D_PE, HAS_LEN)
    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))
    l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, S_L))
    acc = gl.zeros([64, 256], gl.float32, O_L)
    s_zero = gl.zeros([64, 64], gl.float32, S_L)
    for j in range(num_blocks):
        slot = j % 2
        valid = _p2o_valid(idx_row, j, n, s_kv, LS)        # loaded before the ready waits (latency hidden)
        _p2h_wait_ready(ready, slot, (j // 2) & 1)
        fence_async_shared()
        tok_s = warpgroup_mma(q_n, kv_n.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if D_PE > 0:
            tok_s = warpgroup_mma(q_p, kv_p.index(slot).permute((1, 0)), tok_s, is_async=True)
        s = warpgroup_mma_wait(0, deps=(tok_s, ))
        p, alpha, m_i, l_i = _p2o_softmax(s, valid, m_i, l_i, scale_log2)
        _p2o_handoff(p, alpha, p_smem, a_smem, pready, pfree, j)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        acc = _p2h_pv(p_smem.slice(0, 32, dim=1), p_smem.slice(32, 32, dim=1), kv_n.index(slot).slice(0, 256, dim=1),
                      acc, empty, slot)

    inv = _p2_stats(m_i, l_i, tok, hb, sink_ptr, ml_ptr, lse_ptr, sm_scale, H_Q, HAS_SINK, S_L)
    mbarrier.wait(pfree, (num_blocks & 1) ^ 1)
    a_smem.store(inv)
    gl.thread_barrier()
    mbarrier.arrive(pready)
    _p2_write_half(acc, gl.convert_layout(inv, gl.SliceLayout(1, O_L)), tok, hb, out_ptr, stride_os, stride_oh, 0,
                   O_L)


@_jit
def _p2ho_softmax_wg(q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree, sdone, q_ptr, idx_ptr,
                     len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2, stride_qs,
                     stride_qh, stride_is, stride_os, stride_oh, H_Q, D_PE: gl.constexpr, HAS_LEN: gl.constexpr,
                     HAS_SINK: gl.constexpr, OVERLAP: gl.constexpr):
    """:func:`_p2o_softmax_wg` (OVERLAP 1 / 2: FA3 order) with half tiles. Block j's step (j >= 1): P_{j-1} split
    into two [64, 32] register A operands, wait both halves of slot j, issue S_j, rescale O, issue P V_{j-1} as two
    32-token commit groups behind S_j, ``wait_group 2`` (S_j), [OVERLAP 1: ``sdone``], the row max and alpha of
    softmax_j, ``wait_group 1`` -> arrive ``empty`` of slot j-1's first half, the exp2 / row sum, ``wait_group 0``
    -> arrive the second half's, then the P_j / alpha_j handoff. The releases sit inside the softmax (module
    docstring, section "HALF": in the non-half OVERLAP schedule this warpgroup's arrive after the handoff released
    slot j-1 only when S_{j+1} -- which needs block j+1 gathered into that slot -- was about to be issued)."""
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    L_PA: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=O_L, k_width=2)
    LS: gl.constexpr = gl.SliceLayout(0, S_L)
    tok, hb, n, num_blocks, idx_row = _p2_prologue(q_n, q_p, q_ptr, idx_ptr, len_ptr, topk, stride_qs, stride_qh,
                                                   stride_is, H_Q, D_PE, HAS_LEN)
    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))
    l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, S_L))
    acc = gl.zeros([64, 256], gl.float32, O_L)
    s_zero = gl.zeros([64, 64], gl.float32, S_L)
    if num_blocks > 0:
        valid = _p2o_valid(idx_row, 0, n, s_kv, LS)
        _p2h_wait_ready(ready, 0, 0)
        fence_async_shared()
        tok_s = warpgroup_mma(q_n, kv_n.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if D_PE > 0:
            tok_s = warpgroup_mma(q_p, kv_p.index(0).permute((1, 0)), tok_s, is_async=True)
        s = warpgroup_mma_wait(0, deps=(tok_s, ))
        p32, alpha, m_i, l_i = _p2o_softmax(s, valid, m_i, l_i, scale_log2)
        _p2o_handoff(p32, alpha, p_smem, a_smem, pready, pfree, 0)
        for j in range(1, num_blocks):
            slot = j % 2
            prev = 1 - slot
            p_lo, p_hi = _p2h_split_p(p32, L_PA)                # P_{j-1} as two register A operands
            valid = _p2o_valid(idx_row, j, n, s_kv, LS)
            _p2h_wait_ready(ready, slot, (j // 2) & 1)
            fence_async_shared()
            tok_s = warpgroup_mma(q_n, kv_n.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
            if D_PE > 0:
                tok_s = warpgroup_mma(q_p, kv_p.index(slot).permute((1, 0)), tok_s, is_async=True)
            acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
            v = kv_n.index(prev).slice(0, 256, dim=1)
            tok_o = warpgroup_mma(p_lo, v.slice(0, 32, dim=0), acc, is_async=True)
            tok_o = warpgroup_mma(p_hi, v.slice(32, 32, dim=0), tok_o, is_async=True)
            s = warpgroup_mma_wait(2, deps=(tok_s, ))          # S_j done; both P V_{j-1} groups may still run
            if OVERLAP == 1:
                mbarrier.arrive(sdone)
            # softmax_j (the _p2o_softmax expressions), split around the two P V_{j-1} waits
            s = gl.where(valid[None, :], s, float("-inf"))
            m_new = gl.maximum(m_i, gl.max(s, 1))
            m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = gl.exp2((m_i - m_safe) * scale_log2)
            tok_o, p_lo, p_hi = warpgroup_mma_wait(1, deps=(tok_o, p_lo, p_hi))
            mbarrier.arrive(empty.index(2 * prev))          # tokens 0-31 of slot j-1 read by this warpgroup
            p32 = gl.exp2((s - m_safe[:, None]) * scale_log2)
            l_i = l_i * alpha + gl.sum(p32, 1)
            m_i = m_new
            acc, p_lo, p_hi = warpgroup_mma_wait(0, deps=(tok_o, p_lo, p_hi))
            mbarrier.arrive(empty.index(2 * prev + 1))      # tokens 32-63
            _p2o_handoff(p32, alpha, p_smem, a_smem, pready, pfree, j)
        last = (num_blocks - 1) % 2
        p_lo, p_hi = _p2h_split_p(p32, L_PA)
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        v = kv_n.index(last).slice(0, 256, dim=1)
        tok_o = warpgroup_mma(p_lo, v.slice(0, 32, dim=0), acc, is_async=True)
        tok_o = warpgroup_mma(p_hi, v.slice(32, 32, dim=0), tok_o, is_async=True)
        if OVERLAP == 1:
            mbarrier.arrive(sdone)         # no S_{num_blocks}: releases the PV warpgroup's last block
        tok_o, p_lo, p_hi = warpgroup_mma_wait(1, deps=(tok_o, p_lo, p_hi))
        mbarrier.arrive(empty.index(2 * last))
        acc, p_lo, p_hi = warpgroup_mma_wait(0, deps=(tok_o, p_lo, p_hi))
        mbarrier.arrive(empty.index(2 * last + 1))

    inv = _p2_stats(m_i, l_i, tok, hb, sink_ptr, ml_ptr, lse_ptr, sm_scale, H_Q, HAS_SINK, S_L)
    mbarrier.wait(pfree, (num_blocks & 1) ^ 1)
    a_smem.store(inv)
    gl.thread_barrier()
    mbarrier.arrive(pready)
    _p2_write_half(acc, gl.convert_layout(inv, gl.SliceLayout(1, O_L)), tok, hb, out_ptr, stride_os, stride_oh, 0,
                   O_L)


@_jit
def _p2h_pv_wg(kv_n, p_smem, a_smem, ready, empty, pready, pfree, sdone, len_ptr, out_ptr, topk, stride_os,
               stride_oh, H_Q, HAS_LEN: gl.constexpr, OVERLAP: gl.constexpr):
    """:func:`_p2o_pv_wg` (``OVERLAP`` 0 / 2: at ``pready``; 1: also after ``sdone``) with half tiles: both halves'
    ``ready``, P V[:, 256:] as two 32-token commit groups, ``empty[2 slot]`` at ``wait_group 1``, ``pfree`` and
    ``empty[2 slot + 1]`` at ``wait_group 0``."""
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    pid = gl.program_id(0)
    tok = (pid // (H_Q // 64)).to(gl.int64)
    _, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    acc = gl.zeros([64, 256], gl.float32, O_L)
    for j in range(num_blocks):
        slot = j % 2
        _p2h_wait_ready(ready, slot, (j // 2) & 1)       # passed already (the softmax WG sent P after them)
        mbarrier.wait(pready, j & 1)
        if OVERLAP == 1:
            mbarrier.wait(sdone, j & 1)
        fence_async_shared()
        alpha = a_smem.load(gl.SliceLayout(1, O_L))
        acc = acc * alpha[:, None]
        v = kv_n.index(slot).slice(256, 256, dim=1)
        tok_o = warpgroup_mma(p_smem.slice(0, 32, dim=1), v.slice(0, 32, dim=0), acc, is_async=True)
        tok_o = warpgroup_mma(p_smem.slice(32, 32, dim=1), v.slice(32, 32, dim=0), tok_o, is_async=True)
        tok_o = warpgroup_mma_wait(1, deps=(tok_o, ))
        mbarrier.arrive(empty.index(2 * slot))
        acc = warpgroup_mma_wait(0, deps=(tok_o, ))
        mbarrier.arrive(pfree)
        mbarrier.arrive(empty.index(2 * slot + 1))
    mbarrier.wait(pready, num_blocks & 1)
    inv = a_smem.load(gl.SliceLayout(1, O_L))
    _p2_write_half(acc, inv, tok, pid % (H_Q // 64), out_ptr, stride_os, stride_oh, 256, O_L)


@_jit
def _p2h_barriers():
    """HALF's mbarriers: ``ready`` / ``empty`` per half-slot (index ``2 slot + h``; counts 1 / 2), initialised."""
    ready = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [4, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(4):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)      # one arrive per consumer warpgroup
    return ready, empty


@_jit
def _p2_smem(D_PE: gl.constexpr, HALF: gl.constexpr = False):
    """Shared memory: Q, the 2-slot K (= V) ring, P, the alpha / scale vector; d_qk 576 also the RoPE tiles (d_qk
    512: the NoPE tiles stand in, never read); mbarriers ``ready`` (count 1), ``empty`` (count 2: one arrive per
    consumer warpgroup), ``pready`` / ``pfree`` (count 1), initialised. ``HALF``: ``ready`` / ``empty`` are 4 each,
    one per 32-token half-slot (:func:`_p2h_barriers`)."""
    SH_N: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 512], gl.bfloat16)
    SH_P: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    q_n = gl.allocate_shared_memory(gl.bfloat16, [64, 512], SH_N)
    kv_n = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 512], SH_N)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [64, 64], SH_P)
    if D_PE > 0:
        q_p = gl.allocate_shared_memory(gl.bfloat16, [64, D_PE], SH_P)
        kv_p = gl.allocate_shared_memory(gl.bfloat16, [2, 64, D_PE], SH_P)
    else:
        q_p = q_n
        kv_p = kv_n
    a_smem = gl.allocate_shared_memory(gl.float32, [64], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    if HALF:
        ready, empty = _p2h_barriers()
    else:
        ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    pready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    pfree = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    if not HALF:
        for i in gl.static_range(2):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=2)      # one arrive per consumer warpgroup
    mbarrier.init(pready, count=1)
    mbarrier.init(pfree, count=1)
    return q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree


@_jit
def _sparse_prefill_gluon_ws2_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr,
    s_kv, topk, sm_scale, scale_log2,
    stride_qs, stride_qh, stride_kvs, stride_is, stride_os, stride_oh, H_Q,
    D_PE: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, PV_REGS: gl.constexpr, OVERLAP: gl.constexpr = 0, HALF: gl.constexpr = False,
):
    """The WS kernel's arguments (``NUM_SLOTS`` fixed at 2) + ``PV_REGS``, the PV warpgroup's ``setmaxnreg``, +
    ``OVERLAP`` (0: the dispatched schedule; 1 / 2: module docstring, section "OVERLAP") + ``HALF`` (32-token
    half-tile ready / empty pairs, any OVERLAP: section "HALF").
    Partitions: softmax warpgroup (default, 4 warps), PV warpgroup (4), the WS producer (4)."""
    q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree = _p2_smem(D_PE, HALF)
    if HALF:
        if OVERLAP == 1:
            sdone = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            mbarrier.init(sdone, count=1)
        else:
            sdone = pfree      # never waited on or arrived at with OVERLAP 0 / 2
        if OVERLAP == 0:
            gl.warp_specialize([
                (_p2h_softmax_wg, (q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree, q_ptr, idx_ptr,
                                   len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2,
                                   stride_qs, stride_qh, stride_is, stride_os, stride_oh, H_Q, D_PE, HAS_LEN,
                                   HAS_SINK)),
                (_p2h_pv_wg, (kv_n, p_smem, a_smem, ready, empty, pready, pfree, sdone, len_ptr, out_ptr, topk,
                              stride_os, stride_oh, H_Q, HAS_LEN, OVERLAP)),
                (_p2h_producer, (kv_n, kv_p, ready, empty, kv_ptr, idx_ptr, len_ptr, s_kv, topk, stride_kvs,
                                 stride_is, H_Q, D_PE, HAS_LEN)),
            ], [4, 4], [PV_REGS, PRODUCER_REGS])
        else:
            gl.warp_specialize([
                (_p2ho_softmax_wg, (q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree, sdone, q_ptr,
                                    idx_ptr, len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale,
                                    scale_log2, stride_qs, stride_qh, stride_is, stride_os, stride_oh, H_Q, D_PE,
                                    HAS_LEN, HAS_SINK, OVERLAP)),
                (_p2h_pv_wg, (kv_n, p_smem, a_smem, ready, empty, pready, pfree, sdone, len_ptr, out_ptr, topk,
                              stride_os, stride_oh, H_Q, HAS_LEN, OVERLAP)),
                (_p2h_producer, (kv_n, kv_p, ready, empty, kv_ptr, idx_ptr, len_ptr, s_kv, topk, stride_kvs,
                                 stride_is, H_Q, D_PE, HAS_LEN)),
            ], [4, 4], [PV_REGS, PRODUCER_REGS])
    elif OVERLAP == 0:
        gl.warp_specialize([
            (_p2_softmax_wg, (q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree, q_ptr, idx_ptr,
                              len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2,
                              stride_qs, stride_qh, stride_is, stride_os, stride_oh, H_Q, D_PE, HAS_LEN, HAS_SINK)),
            (_p2_pv_wg, (kv_n, p_smem, a_smem, ready, empty, pready, pfree, len_ptr, out_ptr, topk, stride_os,
                         stride_oh, H_Q, HAS_LEN)),
            (_g_ws_producer, (kv_n, kv_p, ready, empty, kv_ptr, idx_ptr, len_ptr, s_kv, topk, stride_kvs, stride_is,
                              H_Q, D_PE, HAS_LEN, 2)),
        ], [4, 4], [PV_REGS, PRODUCER_REGS])
    else:
        if OVERLAP == 1:
            # one more mbarrier, sdone (count 1: softmax WG -> PV WG, "S_{j+1} done / no block j + 1")
            sdone = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            mbarrier.init(sdone, count=1)
        else:
            sdone = pfree      # never waited on or arrived at with OVERLAP 2
        gl.warp_specialize([
            (_p2o_softmax_wg, (q_n, q_p, kv_n, kv_p, p_smem, a_smem, ready, empty, pready, pfree, sdone, q_ptr,
                               idx_ptr, len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale,
                               scale_log2, stride_qs, stride_qh, stride_is, stride_os, stride_oh, H_Q, D_PE,
                               HAS_LEN, HAS_SINK, OVERLAP)),
            (_p2o_pv_wg, (kv_n, p_smem, a_smem, ready, empty, pready, pfree, sdone, len_ptr, out_ptr, topk,
                          stride_os, stride_oh, H_Q, HAS_LEN, OVERLAP)),
            (_g_ws_producer, (kv_n, kv_p, ready, empty, kv_ptr, idx_ptr, len_ptr, s_kv, topk, stride_kvs, stride_is,
                              H_Q, D_PE, HAS_LEN, 2)),
        ], [4, 4], [PV_REGS, PRODUCER_REGS])


# ----------------------------------------------------------------------------------------------- host code

_CONSTEXPRS = ("D_PE", "HAS_LEN", "HAS_SINK", "PRODUCER_REGS", "PV_REGS", "OVERLAP", "HALF")   # parameter order
OVERLAP_MODES = (0, 1, 2)   # 0: dispatched schedule; 1: FA3 order + lagged PV warpgroup; 2: FA3 order only
_LAUNCHERS: dict = {}   # (kernel, (names, constexprs, options, specialisation)) -> KernelLauncher
_LAUNCHER_LIMIT = 1024


def _overlap(overlap) -> int:
    if isinstance(overlap, bool) or overlap not in OVERLAP_MODES:
        raise ValueError(f"overlap must be one of {OVERLAP_MODES}, got {overlap!r}")
    return int(overlap)


def _half(half_tiles) -> bool:
    if not isinstance(half_tiles, bool):
        raise ValueError(f"half_tiles must be a bool, got {half_tiles!r}")
    return half_tiles


def _pv_regs(pv_regs, overlap, half_tiles=False) -> int:
    """The PV warpgroup's setmaxnreg: explicit, else :data:`WS2_PV_REGS` (OVERLAP 0) / :data:`WS2_OV_PV_REGS`
    (OVERLAP 1 / 2), with half tiles :data:`WS2_HALF_PV_REGS` / :data:`WS2_HALF_OV_PV_REGS`."""
    if pv_regs:
        return pv_regs
    if _half(half_tiles):
        return WS2_HALF_OV_PV_REGS if _overlap(overlap) else WS2_HALF_PV_REGS
    return WS2_OV_PV_REGS if _overlap(overlap) else WS2_PV_REGS


def launch_sparse_prefill_gluon_ws2(out, max_logits, lse, q, kv, indices, sm_scale, attn_sink=None,
                                    topk_length=None, *, pv_regs=None, producer_regs=None, maxnreg=None,
                                    overlap: int = 0, half_tiles: bool = False):
    """Drop-in for :func:`_gluon_sparse_prefill.launch_sparse_prefill_gluon` (without ``variant``): same
    out-parameter contract (inputs validated by ``flash_mla_sparse_fwd``; last dims contiguous; the caller checked
    :func:`supported_ws2`). Keyword-only tuning knobs (benchmarks): PV / producer ``setmaxnreg``, launch
    ``maxnreg``; ``overlap`` 0 (the dispatched schedule) / 1 / 2 (opt-in, module docstring section "OVERLAP";
    ValueError otherwise); ``half_tiles`` (opt-in bool, any ``overlap``: section "HALF"; ValueError if not a
    bool). Launched through a cached :class:`deepkernels._launch.KernelLauncher` keyed by
    (constexpr names, constexprs, options, :func:`deepkernels._launch.spec_key` of the arguments)."""
    s_q, h_q, d_qk = q.shape
    if s_q == 0:
        return
    dummy = lse
    args = (q, kv, indices, topk_length if topk_length is not None else dummy,
            attn_sink if attn_sink is not None else dummy, out, max_logits, lse,
            kv.shape[0], indices.shape[-1])
    ints = (q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), out.stride(0), out.stride(1), h_q)
    names = _CONSTEXPRS
    constexprs = (d_qk - D_V, topk_length is not None, attn_sink is not None,
                  producer_regs or WS2_PRODUCER_REGS, _pv_regs(pv_regs, overlap, half_tiles), _overlap(overlap),
                  _half(half_tiles))
    opts = (WS2_NUM_WARPS, maxnreg or WS2_MAXNREG)
    launcher = cached_launcher(_LAUNCHERS, _sparse_prefill_gluon_ws2_kernel,
                               (names, constexprs, opts, spec_key(*args, *ints)),
                               lambda: dict(zip(names, constexprs), num_warps=opts[0], maxnreg=opts[1]),
                               _LAUNCHER_LIMIT)
    launcher((s_q * (h_q // BLOCK_H), ), *args, float(sm_scale), float(sm_scale) * _LOG2E, *ints)


def compile_sm90_ws2(d_pe: int = 64, has_len: bool = False, has_sink: bool = False, pv_regs=None,
                     producer_regs=None, maxnreg=None, overlap: int = 0, half_tiles: bool = False):
    """Cross-compile the kernel for sm90 (no GPU needed) with the divisibility facts of an aligned launch. Returns
    the CompiledKernel (``.asm['ptx']``, ``.metadata.shared``)."""
    sig = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "idx_ptr": "*i32", "len_ptr": "*i32", "sink_ptr": "*fp32",
           "out_ptr": "*bf16", "ml_ptr": "*fp32", "lse_ptr": "*fp32",
           "s_kv": "i32", "topk": "i32", "sm_scale": "fp32", "scale_log2": "fp32",
           "stride_qs": "i32", "stride_qh": "i32", "stride_kvs": "i32", "stride_is": "i32", "stride_os": "i32",
           "stride_oh": "i32", "H_Q": "i32"}
    # every constexpr, in parameter order (the cross-compile binds constexprs by position)
    consts = dict(zip(_CONSTEXPRS, (d_pe, has_len, has_sink, producer_regs or WS2_PRODUCER_REGS,
                                    _pv_regs(pv_regs, overlap, half_tiles), _overlap(overlap),
                                    _half(half_tiles))))
    hinted = ("q_ptr", "kv_ptr", "idx_ptr", "out_ptr", "stride_qs", "stride_qh", "stride_kvs", "stride_os",
              "stride_oh")
    return _compile_sm90_gluon(_sparse_prefill_gluon_ws2_kernel, sig, consts, hinted, num_warps=WS2_NUM_WARPS,
                               maxnreg=maxnreg or WS2_MAXNREG)
