"""Gluon (``triton.experimental.gluon``, Triton 3.6) warp-specialised dense paged MLA decode for sm90, every
``rows = s_q * h_q / h_kv`` (fewer than 64 rows run in a padded 64-row tile: query rows past ``rows`` are masked on
load and store; at h_q 16 / 32 the kernel is bandwidth-bound and still 1.1-2.0x the Triton kernel's GB/s,
``benchmarks/results/mla_decode_small_rows-h200-2026-11-29.json``).

Same contract as the Triton split-KV kernel :func:`deepkernels.mla._dense_decode_kernels._mla_decode_fwd_kernel`
(which stays the fallback): one CTA per (scheduler part, kv head, 64-row query block), persistent over the
request pieces of its part (FlashMLA scheduler records from :func:`deepkernels.mla.metadata.compute_schedule`),
split boundaries clamped to the actual lengths, the last split of a request runs to its actual end, page ids
clamped to ``[0, num_blocks)``, block-table columns ``>= ceil(len / 64)`` never read, tokens past the end masked
(and their V rows zeroed in shared memory, since the cache may hold NaN there), causal bottom-right. Single-split
requests write ``out``/``lse`` (natural log, +inf when empty) directly; split requests write ``O/L`` and the base-2
``log2 L + m`` (-inf when empty) to accumulator row ``num_splits[req] + split`` for the unchanged combine kernel.

Structure (three partitions of ``gl.warp_specialize``, 9 warps; Triton pads the CTA to 384 threads, so ptxas
allocates every partition within 168 registers: the 64x256 fp32 accumulator (128) + S (32) fit, ~20-30 B of
per-request scalars spill outside the tile loop):

* producer (1 warp): TMA loads of one 64-token page per tile into a ``NUM_STAGES``-deep ring: K_nope ``[64, 512]``
  and K_rope ``[64, 64]`` boxes from a 2-D descriptor over ``k_cache`` viewed as ``[num_blocks * 64, h_kv * 576]``
  (``kready``/``kempty`` mbarriers; ``kempty`` needs one arrive from each consumer warpgroup).
* softmax warpgroup (default partition, 4 warps): loads Q ``[64, 576]`` of the piece into shared memory, computes
  ``S = Q K^T`` (64x64, K = 512 + 64) with wgmma, the online softmax (running max in raw-score units,
  ``p = exp2((s - m) * scale * log2e)``, masked scores by selection), writes bf16 ``P`` and the rescale factor
  ``alpha`` to shared memory (``pready``/``pfree`` mbarriers), and accumulates ``O[:, :256] += P V[:, :256]``.
  Issue order S_j -> softmax -> P_j V_j, each waited for. Two overlapped orders (FA3-style, "S ahead") lost on the
  H200 (-12..-31 %, -2..-17 % per shape) and were removed: with only 2 ring stages (Q and two 72 KB K tiles fill
  224 KB of shared memory) any later release of a ring slot shortens the time the next TMA load has.
* PV warpgroup (worker, 4 warps): for every tile, rescales its ``O[:, 256:]`` by ``alpha`` and accumulates
  ``P V[:, 256:]`` from the shared P; at the end of a piece it receives ``1/L`` and writes its half.

A FlashMLA-style "seesaw" variant (both warpgroups compute S for alternate tiles and exchange P / the row max; three
issue orders) was measured in session 15 (H200, git 3d9a1b17f99b, results/mla_decode_seesaw-h200-2026-11-29-s15.json,
b 128, h_q 128/64, s_q 1/2, s_k 4K-32K): correct (60/60 GPU tests) but 0.68-0.88x this kernel at every shape (best
order 0.75-0.88x; prediction was +5-15 %), with 264 B of spills in its token loops. Removed; last present at 3d9a1b1.

Variant (launcher keywords ``half_tiles`` / ``q_tma``, constexprs HALF / QTMA; dispatched since session 16 for
decode.py's launches: Q by TMA always, half tiles from s_q >= 2 -- :data:`DISPATCH_Q_TMA`, measured numbers there;
the plain kernel's cleaned PTX is byte-identical to before, tests/test_mla_decode_gluon_ring.py hashes it):

* HALF (32-token half-tile ring): the same shared memory (2 x [64, 576] K slots = 144 KB) but four ready/empty
  mbarrier pairs, one per 32-token half of a slot (half-slot ``2 * slot + h``). The producer loads each page as two
  [32, 512] + [32, 64] TMA loads (36,864 B each, 18 boxes per page) into rows 0-31 / 32-63 of the slot tile, each
  after its own ``kempty``. The softmax warpgroup still computes S per 64 tokens (N = 64: an N = 32 S would re-read
  Q from shared memory twice as often, 3 KB per 16 MMA cycles = 192 B/clk, over the 128 B/clk the N = 64 S already
  needs), waiting both halves' ``kready``. Both consumer warpgroups issue P V as two commit groups (tokens 0-31:
  ``P[:, :32] V[:32]``, then 32-63) and arrive the first half's ``kempty`` at ``wait_group 1``, the second's at
  ``wait_group 0`` (count 2 as before). So half the bytes of every slot are freed ~half a P V (~0.35 us) earlier and
  the producer's next load for them starts then; the other half (36 KB instead of 72 KB) starts as before.
* QTMA (Q by TMA): the producer loads Q of each piece (q seen as ``[b * s_q * h_q, 576]``, rows
  ``req * s_q * h_q + kvh * group + mb * 64``; needs h_kv == 1 or s_q == 1, else the launcher falls back to the plain
  loads) on ``qready`` (count 1, 73,728 tx bytes) after ``qempty`` (count 1), which the softmax warpgroup arrives right
  after the last S of the piece has completed (or at once for a piece with no tile). The next piece's Q then lands
  under the last tile's softmax + P V and the output writes instead of the softmax warpgroup loading it with plain
  loads while the tensor cores wait. Rows past ``rows`` hold other requests' rows (or TMA zero fill): masked on store.

Cross-compile (Triton 3.6.0, ptxas sm_90a, GLUON_DEFAULT config; default 229,936 B, 32 / 12 B spills):
half + q_tma 230,064 B smem, 168 registers, spill stores 0 B (causal 20 B); half only 229,968 B, 56 / 60 B;
q_tma only 230,032 B, 0 / 4 B. SASS spill instructions per loop: P V warpgroup loop 0 everywhere; softmax token
loop 0 (half + q_tma, non-causal) .. 2; producer tile loop 2 with half tiles (one reloaded slot value at the
40-register producer cap), 0 without. 36 x m64n64k16 + 8 x m64n256k16, no C7514.

PREDICTION (h_q 128, s_q 1, b 128 varlen, half + q_tma vs the default 484-599 TFLOPS; not yet measured): per
64-token tile a CTA does 8.9 MFLOP = 1.49 us at the measured ~790 TFLOPS matmul ceiling, plus ~0.3-0.4 us of serial
softmax + hand-off: a compute floor of ~1.85 us (~630 TFLOPS); the default takes ~2.0 us at 32K. With 2 full slots,
the load of tile j+2 starts when P V_j ends and has one tile period to land; at 590 TFLOPS the SMs pull
72 KB / 2.0 us each = 4.8 TB/s from L2 (both 64-row CTAs read each page), so a 72 KB load plausibly needs ~2 us
and sets the period. Half tiles give half of it ~0.35 us more and the other half needs only 36 KB, so the load side
drops toward the compute floor: s_k 32768 600-630 (1.01-1.07x), 8192 570-600 (1.03-1.08x); s_k 4096 500-530
(1.03-1.09x, of which Q by TMA ~1-2 %: ~3 pieces per CTA, ~1-2 us of plain Q loads each, in ~250 us). If the
default is compute/bubble-bound rather than load-bound, 0.98-1.02x at 8K/32K and only the Q-by-TMA 1-3 % at 4K.
Costs: two more mbarrier waits and one more wait_group + arrive per consumer warpgroup per tile, 18 instead of 9
TMA boxes per page. h_q 64 (one CTA per page, half the L2 traffic) should gain less.

MEASURED (session 16, H200, git de9dbf4694ae, 82/82 GPU tests; rotated rounds, paired ratios: see DISPATCH_Q_TMA):
half + q_tma at s_q 1, h_q 128: 1.02-1.03x the plain kernel (predicted 1.01-1.09x: low end), Q by TMA alone
1.04-1.07x (more than the predicted 1-3 %: the plain Q loads cost more than estimated); at s_q 2 half + q_tma
1.00-1.06x (h_q 64: 1.01-1.09x). The load-bound model explains part of it at most: the largest gains are at 4K.

TRIM option (session 19; launcher keyword ``trim``, constexpr TRIM, :data:`DISPATCH_TRIM`: dispatched at >= 64 rows
since its device run, 0.955-0.990 of the time at h_q 128, 0.974-1.004 at h_q 64 -- below the prediction;
combines with HALF / QTMA, routed through ``_g_variant_partitions``; :func:`_g_softmax_trim`). From the ncu profile of
the dispatched kernel at h_q 128 s_k 8K (``benchmarks/results/ncu-h200-2026-11-30-s19/dense_decode.*``, git d50337a):
the softmax warpgroup is the critical path and its per-tile math (mask, max, shuffles, exp2, sums, cvt: 261 SASS
instructions per warp) takes ~664 of the ~3,487 cycles of a tile while the tensor cores idle. Two trims, both in the
softmax warpgroup only:

* (a) the causal / length mask only on tiles that can hold a masked token: a scalar, warp-uniform branch
  ``t0 + 64 > lim_lo`` with ``lim_lo = min(k1, seqlen - (s_q - 1))`` when causal, ``k1`` otherwise. Every row's limit
  is ``min(k1, seqlen - (s_q - 1 - sidx))`` with ``sidx >= 0`` (padded rows past ``rows`` use sidx 0) and
  ``k1 <= seqlen``, so ``lim_lo <= min over rows``: on a skipped tile every token satisfies
  ``tok < t0 + 64 <= lim_lo <= lim[row]`` and the selection would be the identity; tiles that can hold a masked
  token (a partial last tile, the causal tail) run the same selection as without the option. ptxas emits one
  ``BRA`` over the 65-instruction (81 causal) mask block.
* (b) the scale folded into one FFMA per score: ``p = exp2(fma(s, c, -m_new * c))``, ``c = sm_scale_log2``
  (= scale * log2 e, host), ``m_new * c`` once per row, instead of ``exp2((s - m_new) * c)`` (FADD + FMUL). The
  running max stays in raw-score units; alpha keeps ``exp2((m_i - m_new) * c)`` (two -1e30 starts must give exactly
  1, not exp2 of an FFMA rounding residue of ~1e21); lse (``log L + m * scale``, +inf / -inf when empty), 1/L, the
  outputs of empty rows and zero-length requests (0, lse +inf) and the softmax_scale handling are unchanged.
  Numerics: p carries the rounding of ``m_new * c`` (a common factor per row and tile, <= half an ulp of
  ``|m_new * c|``) and one rounding less per score, so out / lse are not bit-identical to the option-off build;
  tests/test_mla_decode_gluon_trim.py checks both against the reference with FlashMLA's tolerances and on vs off
  within 2 ulp of the output dtype (out; P is rounded to bf16, so a flipped p rounding moves a few outputs further:
  the first device run saw 2-13 of 0.5-4 M elements beyond 2 ulp, max 1.2e-4 -> <= 0.01 % allowed, none beyond
  FlashMLA's out tolerance) and 1e-5 relative (lse).

Compile facts (CPU cross-compile, Triton 3.6.0 wheel's ptxas, bf16, GLUON_DEFAULT; tests/test_mla_decode_gluon_trim.py
-m compile): trim off leaves the cleaned PTX of all 16 (half, q_tma, causal, dtype) builds byte-identical (hashes
pinned). Trim on, softmax warpgroup's token loop, SASS instructions per warp (static loop / full-tile path = loop
without the skipped mask block / math section = last S HGMMA .. P STSM, full tile):

| build (half, q_tma, causal) | loop off | loop on | full-tile path on | math off -> on | spill stores B off -> on |
|---|---|---|---|---|---|
| q_tma (dispatched at s_q 1) | 1,192 | 1,168 | 1,103 (-89) | 265 -> 179 (-86) | 0 -> 16 |
| q_tma, causal | 1,217 | 1,184 | 1,103 (-114) | 289 -> 180 (-109) | 4 -> 16 |
| half + q_tma | 1,217 | 1,187 | 1,122 (-95) | 273 -> 180 (-93) | 0 -> 20 |
| half + q_tma, causal (dispatched at s_q 2) | 1,228 | 1,212 | 1,131 (-97) | 283 -> 170 (-113) | 20 -> 24 |
| plain | 1,198 | 1,171 | 1,106 (-92) | 253 -> 163 (-90) | 32 -> 24 |
| plain, causal | 1,280 | 1,187 | 1,106 (-174) | 275 -> 163 (-112) | 12 -> 28 |

FMUL 162 -> 130, FADD 68 -> 36, FFMA 2 -> 36 (q_tma build), MUFU.EX2 34 and FSEL 32 (now under the branch) unchanged;
same shared memory, 168 registers, wgmma counts, no C7514. Spill instructions on the full-tile path of the softmax
loop: 0 in every build, PV loop 0; the added spill bytes sit in the per-request setup / epilogue; half + q_tma causal
has one STL/LDL pair inside the partial-tile V-zeroing block of the softmax loop (once per piece), half-tile builds
keep the producer's reloaded slot value (<= 2 LDL, the 40-register producer), as without the option.

PREDICTION (UNVERIFIED until the device run, ``benchmarks/device_mla_decode_trim.sh``: paired rotated-round A/B, trim
off vs on on the dispatched kernel, b 128, h_q 128 / 64, s_q 1 / 2, s_k 4K / 8K / 32K, + an A/A control): the softmax
math section 664 -> 450-530 cycles per tile (-86 of 265 instructions at s_q 1; its floor is 34 MUFU x 8 = 272 cycles),
each cycle saved coming off the tile (critical path), so at h_q 128 s_q 1 the kernel time x 0.95 (0.94-0.965) of the
option-off build (paired median ratio); s_q 2 (-113 instructions: the causal mask is skipped too) about the same, h_q
64 similar or less. Falsifier: paired ratio >= 0.975 at h_q 128 s_q 1 (or a re-profiled math section >= 560 cycles per
tile).

PVR option (session 20; launcher keyword ``pvr``, constexpr PVR; dispatched at >= 128 query heads per kv head:
:data:`DISPATCH_PVR`; needs QTMA, replaces HALF).
The session-20 profile of the dispatched build (benchmarks/notes/mla_decode_gluon.md "Session 20") puts the tensor
cores idle ~1,200 of ~3,390 cycles per tile while the softmax warpgroup does softmax + hand-off + O_L rescale, and
P V_R_{j-1} inside the S_j window (S_j queues behind it). With PVR the PV warpgroup issues P V_R_j only after the
softmax warpgroup has issued all of S_{j+1} (``sissued``, count 1, one phase per tile: arrived right after S_{j+1}'s
issue for j + 1 > 0, and after the piece's loop for its last tile; the PV warpgroup waits phase ``it & 1``), so
P V_R_j runs on the tensor cores under softmax_{j+1}. P_j stays in the single P buffer until P V_R_j completes
(``pfree`` gates the next store as before). To keep the ring's slack, each slot is released by column halves:
``kready``/``kempty`` (count 1) guard part a = K_nope cols 0-255 + K_rope (40 KB: a [64, 256] box of a third K
descriptor ``kh_desc`` into the tile's column half + the RoPE box), released by the softmax warpgroup after P V_L_j;
``kready_b``/``kempty_b`` (count 1) guard part b = cols 256-511 (32 KB, one [64, 256] box), released by the PV
warpgroup after P V_R_j.
S_j is issued as NoPE cols 0-255 (after ``kready``), NoPE cols 256-511 (after ``kready_b``), RoPE: the same MMA
sequence as the other builds, so the results are the dispatched build's bit for bit (expected; the GPU tests check
2 ulp and report identity separately). Deadlock-freedom: an arrive on ``sissued`` for tile j + 1 needs the
softmax warpgroup past P_j's store, i.e. ``pfree`` of P V_R_{j-1}, which the PV warpgroup arrives after its wait for
tile j - 1: at most one phase is ever pending; pieces without tiles arrive and wait nothing; the producer's loads of
tile j + 2 wait P V_L_j (part a) and P V_R_j (part b), both reachable without it. Cross-compile (Triton 3.6.0):
230,128 B shared memory, 168 registers, 36 + 4 HGMMA in the softmax loop, 4 in the PV loop, 9 UTMALDG in the
producer loop, 0 spills in all three tile loops; ptxas spill stores 16 B (causal 16 B, as the dispatched q_tma + trim
build; outside the loops). (With 9 single [64, 64] boxes through ``kp_desc`` instead, the producer loop reloaded a
64-bit value per tile at its 40-register cap.) Prediction: benchmarks/notes/mla_decode_gluon.md "Session 20".
Measured (session 20, H200, git 96e49a5bfd74, ``benchmarks/device_mla_decode_pvr.sh``, 32/32 GPU tests, 5 rotated
rounds paired against the dispatched build, ``results/mla_decode_pvr-h200-2026-11-30-s20.json``): outputs bit-identical
at every benchmarked shape; t_pvr / t_dispatched at h_q 128, b 128: s_q 1 s_k 4K / 8K / 32K 1.002 / 0.969 / 0.955,
s_q 2 (against half tiles) 0.965 / 0.967 / 1.002; h_q 64 s_q 1 8K 1.037 (A/A medians 1.000-1.030). Predicted 0.93-0.965
at h_q 128 s_q 1 8K / 32K: 32K inside, 8K just outside (0.969), not falsified (< 0.975). Dispatched at >= 128 query
heads per kv head (:data:`DISPATCH_PVR_MIN_HEADS`; h_q 64 keeps the half-tile / TRIM build).

EPI options (session 21; launcher keywords ``epi_nsp`` / ``epi_early`` / ``epi_sis``, constexprs EPI_NSP / EPI_EARLY /
EPI_SIS, off by default, not dispatched; benchmarks/notes/mla_decode_timeline.md "EPI"). The softmax warpgroup's
per-piece epilogue (TIMELINE: median 4.6 us from the last P V_L to its stores issued at b 128 h_q 128 s_k 4K) is on
its critical path: the next piece's first S waits for it. Same math and store values in every option (bit-identical):

* EPI_NSP (a): ``nsplits[req]`` / ``nsplits[req + 1]`` loaded at the piece's start (``_g_piece_nsp``, both
  consumer warpgroups) and kept, instead of two global loads after the tile loop.
* EPI_EARLY (b): the softmax warpgroup writes its O half and lse first, then waits ``pfree`` (the PV warpgroup's last
  P V_R) and hands over 1/L: the wait overlaps the stores (the PV warpgroup's own stores start later).
* EPI_SIS (PVR builds; no effect elsewhere): the PV warpgroup issues P V_R of a piece's last tile without waiting
  ``sissued`` (there is no S_{j+1} to queue behind), beside the softmax warpgroup's P V_L; the softmax warpgroup no
  longer arrives a phase after its loop and the PV warpgroup counts its waited phases itself.

Cross-compile (Triton 3.6.0, bf16): PVR builds with a / b / a+b keep 168 registers, 16 B of spill stores and
spill-free tile loops; EPI_SIS puts 4 spill instructions into the softmax tile loop (non-causal; causal: 24 B, 1 in
the producer loop); the plain build (h_q 16) with EPI_NSP: 32 -> 44 B, 2 spill instructions in its softmax loop.
A 16-B vector store of the O half (``convert_layout`` to 2 rows x 8 columns per thread) goes through shared memory
in Triton 3.6 (233,872 B > the 232,448 B limit) and was dropped.

DYN_QUEUE option (session 21; launcher keyword ``dyn_queue``, constexpr DYN_QUEUE, off by default, not dispatched;
benchmarks/notes/mla_decode_dyn.md). At < 64 query rows the schedule has 2 parts per SM (``decode._num_sm_parts``) but
one CTA per SM fits (~230 KB shared memory): the static grid runs as two waves, each CTA paying its start-up and
first-tile latency. With the option the launcher starts ``min(items, num_sms)`` persistent CTAs (items = the static
grid: part x kv head x 64-row block, taken in pid order); the producer warp takes the next item from a global int32
counter (:func:`_dq_fetch`, right after issuing the current item's last K load, so the next item's K tiles load
while the consumers finish) and hands its id to both consumer warpgroups through a 2-slot shared ring
(:func:`_dq_publish` / :func:`_dq_recv`; ``widready`` count 1, ``widempty`` count 2). Each item runs the unchanged
per-part code (``_g_producer_part`` / ``_g_softmax_part`` / ``_g_pv_part``: the partition bodies, ring / hand-off /
Q-barrier / sissued phases carried across items): outputs bit-identical to the static launch of the same schedule.
Every CTA ends with exactly one fetch past the items, so the fetch returning ``items + grid - 1`` is the launch's
last access to the counter and stores 0 back (no memset, no host sync; CUDA-graph safe). :func:`dyn_parts` builds
finer schedules (parts per SM). Cross-compile: +112 B shared memory, 168 registers, no new spill instruction in the
tile loops of the plain / q_tma / half-tile builds; the PVR builds' softmax loop gets 2 (notes).

Needs: CUDA, bf16/fp16, page_block_size 64, d_qk 576, ``k_cache`` strides ``(64 * s1, s1, 576, 1)`` with 16-B
aligned rows. No interpreter support (Gluon); cross-compiles on a CPU (:func:`_compile_sm90`).
"""
from __future__ import annotations

import os

import functools
import math

import torch

from .._backend import gluon_disabled, interpret_mode
from .._launch import cached_launcher, spec_key
from .._gluon import (IMPORT_ERROR as _IMPORT_ERROR, available, gl, fence_async_shared, mbarrier, tma,
                      warpgroup_mma, warpgroup_mma_wait, TensorDescriptor)
from .._gluon import compile_sm90 as _compile_sm90_gluon, jit as _jit
from ._gluon_timeline import put_asm, stamp_asm, tl_put, tl_stamp

__all__ = ["available", "supported", "gluon_dense_launch", "gluon_dense_forward", "GLUON_DEFAULT"]

D_NOPE, D_PE, PAGE, BLOCK_M = 512, 64, 64, 64
DV_HALF = D_NOPE // 2
_LOG2E = math.log2(math.e)




# (num_stages, pv_regs, producer_regs). Issue order: S_j -> softmax -> P_j V_j, each waited for. Two overlapped
# orders were measured on the H200 and removed (git 88b3cd4 has them; benchmarks/notes/mla_decode_gluon.md,
# results/mla_decode_gluon-h200-2026-11-29-run{1,2}.json, b=128 varlen, 16 shapes): serial 304-599 TFLOPS
# (1.69-2.41x the Triton kernel), "S ahead" 296-539, FA3-style 318-488 -- with 2 ring stages a later slot release
# leaves the next TMA load too little time. pv_regs / producer_regs only set setmaxnreg: ptxas allocates the whole
# kernel within 168 registers (Triton pads the 9 warps to 384 threads).
GLUON_DEFAULT = (2, 232, 40)
# What decode.py's launches (half_tiles / q_tma left None) take, measured session 16 (H200, git de9dbf4694ae,
# results/mla_decode_ring-h200-2026-11-29-s16.json: 5 rounds in rotated order, paired time ratios vs the plain kernel
# in the same round, "default again" control 0.99-1.03; b 128, s_k 4K / 8K / 32K; 82/82 GPU tests of the variant):
# Q by TMA alone at s_q 1 (h_q 128: 0.937 / 0.957 / 0.961 of the plain kernel's time; h_q 64: 0.949 / 0.967 / 0.968;
# half tiles + Q by TMA there 0.970-0.985 and 1.046 at h_q 64 32K), half tiles + Q by TMA at s_q >= 2 (h_q 128:
# 0.941 / 0.959 / 1.002; h_q 64: 0.919 / 0.940 / 0.992; Q by TMA alone there 0.946-1.017).
# DEEPKERNELS_DENSE_DECODE_VARIANT=0 keeps the plain kernel for every call.
DISPATCH_Q_TMA = True
DISPATCH_HALF_MIN_SQ = 2
DISPATCH_MIN_ROWS = 64     # s_q * h_q / h_kv: the A/B covered h_q 64 / 128 only
# The TRIM option (launcher keyword ``trim``, constexpr TRIM; module docstring "TRIM"): what launches with trim=None
# take at >= DISPATCH_MIN_ROWS query rows per kv head. On since its first device run (session 19, H200, git
# d1089e892f12, benchmarks/device_mla_decode_trim.sh, paired 5 rotated rounds, A/A 0.989-1.025,
# results/mla_decode_trim-h200-2026-11-30-s19.json): t_trim / t_off h_q 128 s_q 1 0.980-0.990, s_q 2 0.955-0.981;
# h_q 64 s_q 1 0.997-1.004, s_q 2 0.974-0.980 (predicted 0.94-0.965 at h_q 128 s_q 1: smaller than predicted)
DISPATCH_TRIM = True
# The PVR option (launcher keyword ``pvr``, constexpr PVR; module docstring "PVR option"): what launches with pvr=None
# take at >= DISPATCH_PVR_MIN_HEADS query heads per kv head (with Q by TMA; it replaces the half tiles at s_q >= 2).
# Session 20 (H200, git 96e49a5bfd74, benchmarks/device_mla_decode_pvr.sh, paired 5 rotated rounds, bit-identical
# outputs, results/mla_decode_pvr-h200-2026-11-30-s20.json): h_q 128 s_q 1 1.002 / 0.969 / 0.955 at s_k 4K / 8K / 32K,
# s_q 2 0.965 / 0.967 / 1.002; h_q 64 s_q 1 8K 1.037 (slower: not dispatched there)
DISPATCH_PVR = True
DISPATCH_PVR_MIN_HEADS = 128
GLUON_CANDIDATES = [GLUON_DEFAULT]
# TIMELINE instrumentation (launcher keyword ``timeline``: an int64 [grid, TL_WORDS] buffer, ZEROED before each
# launch -- stamps are atomic maxima over a partition's warps; constexpr TIMELINE, never dispatched). Per CTA a
# header of TL_HEADER words -- 0 CTA start (softmax warpgroup, %globaltimer ns), 1 its end, 2 %smid, 3 number of
# pieces, 4 PV warpgroup end, 5 / 6 %clock64 at softmax start / end, 7 unused -- then TL_PIECE words for each of
# the first TL_MAX_PIECES pieces: 0 start (its Q in shared memory), 1 first K tile ready (= start without tiles),
# 2 tile loop done (last P V_L complete), 3 softmax warpgroup's O half + lse stores issued, 4 unused (0: a
# per-piece PV stamp cost spills), 5 request, 6 k0 | k1 << 32 (token range), 7 nsp | split_index << 32 (nsp > 1:
# a split piece writing the fp32 accumulators); finer epilogue stamps of the softmax warpgroup (session 21, "EPI"):
# 8 its pfree wait done (the PV warpgroup's last P V_R complete), 10 its O half's stores issued (before the lse
# store); 9, 11-15 unused (a stamp taken once nsplits[req] is in a register -- an asm with the loaded value as an
# operand -- put 2 spill instructions into the PVR softmax tile loop). With EPI_EARLY the order is 2, 10, 8, 3.
# _tl_put / _tl_stamp address this layout (asm from deepkernels.mla._gluon_timeline).
TL_HEADER, TL_PIECE, TL_MAX_PIECES = 8, 16, 32
TL_WORDS = TL_HEADER + TL_PIECE * TL_MAX_PIECES
_TL_PUT_ASM = gl.constexpr(put_asm(TL_HEADER, TL_PIECE, TL_MAX_PIECES, TL_WORDS))
_TL_STAMP_ASM = gl.constexpr(stamp_asm(TL_HEADER, TL_PIECE, TL_MAX_PIECES, TL_WORDS))


# ----------------------------------------------------------------------------------------------- device code

@_jit
def _g_coords(num_m_blocks, h_kv):
    pid = gl.program_id(0)
    mb = pid % num_m_blocks
    tmp = pid // num_m_blocks
    kvh = tmp % h_kv
    part = tmp // h_kv
    return mb, kvh, part


@_jit
def _g_record(meta_ptr, part, b):
    rec = meta_ptr + part * 8
    begin_req = gl.maximum(gl.load(rec + 0), 0)
    end_req = gl.minimum(gl.load(rec + 1), b - 1)
    begin_blk = gl.load(rec + 2)
    end_blk = gl.load(rec + 3)
    begin_split = gl.load(rec + 4)
    return begin_req, end_req, begin_blk, end_blk, begin_split


@_jit
def _g_piece(req, begin_req, end_req, begin_blk, end_blk, begin_split, seqlens_ptr, nsplits_ptr, max_pages):
    """Token range [k0, k1) of request ``req`` in this part (same clamps as the Triton kernel)."""
    seqlen = gl.maximum(gl.load(seqlens_ptr + req), 0)
    nblk = (gl.maximum(seqlen - 1, 0) // 64) + 1
    split = gl.where(req == begin_req, begin_split, 0)
    nsp = gl.load(nsplits_ptr + req + 1) - gl.load(nsplits_ptr + req)
    not_last = split < nsp - 1
    sb = gl.where(req == begin_req, begin_blk, 0)
    se = gl.where((req == end_req) & not_last, end_blk, nblk)
    k0 = gl.maximum(sb, 0) * 64
    k1 = gl.minimum(gl.minimum(se * 64, seqlen), max_pages * 64)
    return seqlen, k0, k1


@_jit
def _g_piece_nsp(req, begin_req, end_req, begin_blk, end_blk, begin_split, seqlens_ptr, nsplits_ptr, max_pages):
    """:func:`_g_piece` that also returns ``nsplits[req]`` (the request's first accumulator row) and its split count
    (EPI_NSP: loaded at the piece's start and kept, instead of reloaded in the epilogue)."""
    seqlen = gl.maximum(gl.load(seqlens_ptr + req), 0)
    nblk = (gl.maximum(seqlen - 1, 0) // 64) + 1
    split = gl.where(req == begin_req, begin_split, 0)
    base_row = gl.load(nsplits_ptr + req)
    nsp = gl.load(nsplits_ptr + req + 1) - base_row
    not_last = split < nsp - 1
    sb = gl.where(req == begin_req, begin_blk, 0)
    se = gl.where((req == end_req) & not_last, end_blk, nblk)
    k0 = gl.maximum(sb, 0) * 64
    k1 = gl.minimum(gl.minimum(se * 64, seqlen), max_pages * 64)
    return seqlen, k0, k1, base_row, nsp


@_jit
def _tl_put(tl_ptr, req, begin_req, word, val):
    """TIMELINE: ``tl_ptr[ctaid, off] = val`` in this kernel's layout (``off = word`` for ``req < 0``, else
    ``8 + min(req - begin_req, 31) * 16 + word``); :func:`deepkernels.mla._gluon_timeline.tl_put`."""
    return tl_put(tl_ptr, req, begin_req, word, val, _TL_PUT_ASM)


@_jit
def _tl_stamp(tl_ptr, req, begin_req, word):
    """TIMELINE: ``%globaltimer`` as an atomic max over the partition's warps into the word :func:`_tl_put`
    addresses; :func:`deepkernels.mla._gluon_timeline.tl_stamp`."""
    return tl_stamp(tl_ptr, req, begin_req, word, _TL_STAMP_ASM)


@_jit
def _tl_clock():
    """TIMELINE: ``%clock64`` (SM cycles; with the CTA start / end stamps: the SM clock)."""
    return gl.inline_asm_elementwise(asm="mov.u64 $0, %clock64;", constraints="=l,r", args=[gl.program_id(0)],
                                     dtype=gl.int64, is_pure=False, pack=1)


@_jit
def _tl_smid():
    """TIMELINE: ``%smid`` of the CTA."""
    return gl.inline_asm_elementwise(asm="mov.u32 $0, %smid;", constraints="=r,r", args=[gl.program_id(0)],
                                     dtype=gl.int32, is_pure=False, pack=1)


@_jit
def _dq_fetch(dyn_ptr, last):
    """DYN_QUEUE: the next work item, ``atomicAdd(dyn_ptr, 1)`` by lane 0 of the (one-warp) producer, broadcast to
    the warp. The fetch that returns ``last`` (= items + grid - 1: every CTA ends with exactly one fetch past the
    items, so this is the launch's last access to the counter) stores 0 back: the counter is zero again for the next
    launch (stream order) without a memset or a host sync, also inside a CUDA graph."""
    return gl.inline_asm_elementwise(
        asm="""{
        .reg .pred p, q;
        .reg .b32 t, l;
        mov.u32 l, %laneid;
        setp.eq.u32 p, l, 0;
        mov.u32 t, 0;
        @p atom.global.add.u32 t, [$1], 1;
        shfl.sync.idx.b32 $0, t, 0, 31, -1;
        setp.eq.and.s32 q, $0, $2, p;
        mov.u32 t, 0;
        @q st.global.u32 [$1], t;
        }""", constraints="=r,l,r", args=[dyn_ptr.to(gl.int64, bitcast=True), last],
        dtype=gl.int32, is_pure=False, pack=1)


@_jit
def _dq_publish(wid, widready, widempty, n, w):
    """DYN_QUEUE: the producer hands its ``n``-th work item id ``w`` to both consumer warpgroups (ring slot
    ``n % 2``, ``widready`` count 1; the slot is free again once both warpgroups arrived ``widempty``, count 2)."""
    slot = n % 2
    mbarrier.wait(widempty.index(slot), ((n // 2) & 1) ^ 1)     # fresh barrier: phase 1 counts as done
    wid.index(slot).store(gl.full([1], w, gl.int32, gl.BlockedLayout([1], [32], [1], [0])))
    gl.thread_barrier()
    mbarrier.arrive(widready.index(slot))


@_jit
def _dq_recv(wid, widready, widempty, n):
    """DYN_QUEUE: a consumer warpgroup's ``n``-th work item id (see :func:`_dq_publish`); the slot is released after
    every thread of the warpgroup has read it."""
    slot = n % 2
    mbarrier.wait(widready.index(slot), (n // 2) & 1)
    w = gl.max(wid.index(slot).load(gl.BlockedLayout([1], [32], [4], [0])), 0)
    gl.thread_barrier()
    mbarrier.arrive(widempty.index(slot))
    return w


@_jit
def _g_producer(kn_desc, kp_desc, k_nope, k_rope, kready, kempty, bt_ptr, seqlens_ptr, meta_ptr, nsplits_ptr,
                stride_btb, max_pages, num_kv_blocks, b, num_m_blocks, h_kv, NUM_STAGES: gl.constexpr,
                HALF: gl.constexpr = False, QTMA: gl.constexpr = False, qn_desc=None, qp_desc=None, q_nope=None,
                q_rope=None, qready=None, qempty=None, rows=None, group=None, PVR: gl.constexpr = False,
                kready_b=None, kempty_b=None, kh_desc=None, DYN_QUEUE: gl.constexpr = False, dyn_ptr=None,
                n_items=None, wid=None, widready=None, widempty=None):
    if DYN_QUEUE:
        # DYN_QUEUE (module docstring): take work items (part, kv head, row block) from the global counter until
        # none are left; each id is handed to the consumer warpgroups through the shared ring ``wid``, and the
        # next one is taken right after the current item's last K load was issued (its loads then follow the ring)
        last = n_items + gl.num_programs(0) - 1
        w = _dq_fetch(dyn_ptr, last)
        it = w * 0
        pc = w * 0
        n = w * 0
        _dq_publish(wid, widready, widempty, n, w)
        while w < n_items:
            mb = w % num_m_blocks
            tmp = w // num_m_blocks
            it, pc = _g_producer_part(mb, tmp % h_kv, tmp // h_kv, it, pc, kn_desc, kp_desc, k_nope, k_rope,
                                      kready, kempty, bt_ptr, seqlens_ptr, meta_ptr, nsplits_ptr, stride_btb,
                                      max_pages, num_kv_blocks, b, NUM_STAGES, HALF, QTMA, qn_desc, qp_desc, q_nope,
                                      q_rope, qready, qempty, rows, group, PVR, kready_b, kempty_b, kh_desc, h_kv)
            n += 1
            w = _dq_fetch(dyn_ptr, last)
            _dq_publish(wid, widready, widempty, n, w)
    else:
        mb, kvh, part = _g_coords(num_m_blocks, h_kv)
        it = 0      # locals (tensors), not constexpr arguments: loop-carried inside
        pc = 0
        _g_producer_part(mb, kvh, part, it, pc, kn_desc, kp_desc, k_nope, k_rope, kready, kempty, bt_ptr, seqlens_ptr,
                         meta_ptr, nsplits_ptr, stride_btb, max_pages, num_kv_blocks, b, NUM_STAGES, HALF, QTMA,
                         qn_desc, qp_desc, q_nope, q_rope, qready, qempty, rows, group, PVR, kready_b, kempty_b,
                         kh_desc, h_kv)


@_jit
def _g_producer_part(mb, kvh, part, it, pc, kn_desc, kp_desc, k_nope, k_rope, kready, kempty, bt_ptr, seqlens_ptr,
                     meta_ptr, nsplits_ptr, stride_btb, max_pages, num_kv_blocks, b, NUM_STAGES: gl.constexpr,
                     HALF: gl.constexpr, QTMA: gl.constexpr, qn_desc, qp_desc, q_nope, q_rope, qready, qempty, rows,
                     group, PVR: gl.constexpr, kready_b, kempty_b, kh_desc, h_kv):
    """The producer's work for one scheduler part of (row block ``mb``, kv head ``kvh``); ``it`` / ``pc``: K tiles /
    pieces this partition has already done (ring and Q-barrier phases). Returns the updated ``(it, pc)``."""
    begin_req, end_req, begin_blk, end_blk, begin_split = _g_record(meta_ptr, part, b)
    col = kvh * 576
    for req in range(begin_req, end_req + 1):
        seqlen, k0, k1 = _g_piece(req, begin_req, end_req, begin_blk, end_blk, begin_split, seqlens_ptr,
                                  nsplits_ptr, max_pages)
        bt_row = bt_ptr + req.to(gl.int64) * stride_btb
        if QTMA:
            # Q of this piece (rows contiguous in q seen as [b * s_q * h_q, 576]: h_kv == 1 or s_q == 1, checked
            # by the launcher) once the softmax warpgroup's last S of the previous piece has completed
            mbarrier.wait(qempty, ((req - begin_req + pc) & 1) ^ 1)
            mbarrier.expect(qready, qn_desc.block_type.nbytes + qp_desc.block_type.nbytes)
            qrow = req * (rows * h_kv) + kvh * group + mb * 64
            tma.async_copy_global_to_shared(qn_desc, [qrow, 0], qready, q_nope)
            tma.async_copy_global_to_shared(qp_desc, [qrow, 512], qready, q_rope)
        for t0 in range(k0, k1, 64):
            slot = it % NUM_STAGES
            if PVR:
                # column-split slot: part a = K_nope cols 0-255 + K_rope (40 KB, released by the softmax warpgroup
                # after P V_L), part b = cols 256-511 (32 KB, released by the PV warpgroup after P V_R); [64, 256]
                # boxes (kh_desc) into column halves of the tile
                _g_load_pvr(kh_desc, kp_desc, k_nope, k_rope, kready, kempty, kready_b, kempty_b, bt_row, t0, col,
                            slot, ((it // NUM_STAGES) & 1) ^ 1, num_kv_blocks)
            elif HALF:
                # two 32-token halves of the page, each on its own ready/empty pair: the first half is released
                # by the consumers halfway through P V, so its next load starts earlier
                page = gl.load(bt_row + t0 // 64)
                page = gl.minimum(gl.maximum(page, 0), num_kv_blocks - 1)
                for h in gl.static_range(2):
                    mbarrier.wait(kempty.index(2 * slot + h), ((it // NUM_STAGES) & 1) ^ 1)
                    bar = kready.index(2 * slot + h)
                    mbarrier.expect(bar, kn_desc.block_type.nbytes + kp_desc.block_type.nbytes)
                    tma.async_copy_global_to_shared(kn_desc, [page * 64 + h * 32, col], bar,
                                                    k_nope.index(slot).slice(h * 32, 32, dim=0))
                    tma.async_copy_global_to_shared(kp_desc, [page * 64 + h * 32, col + 512], bar,
                                                    k_rope.index(slot).slice(h * 32, 32, dim=0))
            else:
                mbarrier.wait(kempty.index(slot), ((it // NUM_STAGES) & 1) ^ 1)  # fresh barrier: phase 1 done
                page = gl.load(bt_row + t0 // 64)
                page = gl.minimum(gl.maximum(page, 0), num_kv_blocks - 1)
                bar = kready.index(slot)
                mbarrier.expect(bar, kn_desc.block_type.nbytes + kp_desc.block_type.nbytes)
                tma.async_copy_global_to_shared(kn_desc, [page * 64, col], bar, k_nope.index(slot))
                tma.async_copy_global_to_shared(kp_desc, [page * 64, col + 512], bar, k_rope.index(slot))
            it += 1
    return it, pc + gl.maximum(end_req - begin_req + 1, 0)


@_jit
def _g_load_pvr(kh_desc, kp_desc, k_nope, k_rope, kready, kempty, kready_b, kempty_b, bt_row, t0, col, slot, phase,
                num_kv_blocks):
    """PVR: one page into ring slot ``slot`` as part a (``kempty``/``kready``: K_nope cols 0-255 + K_rope) and part b
    (``kempty_b``/``kready_b``: cols 256-511), each loaded once its own release has come."""
    mbarrier.wait(kempty.index(slot), phase)
    page = gl.load(bt_row + t0 // 64)
    page = gl.minimum(gl.maximum(page, 0), num_kv_blocks - 1)
    bar = kready.index(slot)
    mbarrier.expect(bar, kh_desc.block_type.nbytes + kp_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(kh_desc, [page * 64, col], bar, k_nope.index(slot).slice(0, 256, dim=1))
    tma.async_copy_global_to_shared(kp_desc, [page * 64, col + 512], bar, k_rope.index(slot))
    mbarrier.wait(kempty_b.index(slot), phase)
    bar_b = kready_b.index(slot)
    mbarrier.expect(bar_b, kh_desc.block_type.nbytes)
    tma.async_copy_global_to_shared(kh_desc, [page * 64, col + 256], bar_b, k_nope.index(slot).slice(256, 256, dim=1))


@_jit
def _g_zero_tail(buf, nvalid, ROWS: gl.constexpr, COLS: gl.constexpr, num_warps: gl.constexpr):
    """Zero rows >= nvalid of a [ROWS, COLS] shared tile (tokens past the end: the cache may hold NaN there and
    0 * NaN would poison P V). Caller fences and synchronises."""
    L: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])
    CH: gl.constexpr = 64
    rows = gl.arange(0, ROWS, gl.SliceLayout(1, L))
    keep = (rows < nvalid)[:, None]
    for c in gl.static_range(COLS // CH):
        sub = buf.slice(c * CH, CH, dim=1)
        x = sub.load(L)
        sub.store(gl.where(keep, x, gl.zeros_like(x)))


@_jit
def _g_softmax(s, m_i, l_i, t0, lim, sm_scale_log2, L_S: gl.constexpr):
    tok = t0 + gl.arange(0, 64, gl.SliceLayout(0, L_S))
    valid = tok[None, :] < lim[:, None]
    s = gl.where(valid, s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    alpha = gl.exp2((m_i - m_new) * sm_scale_log2)
    p = gl.exp2((s - m_new[:, None]) * sm_scale_log2)
    l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new


@_jit
def _g_softmax_trim(s, m_i, l_i, t0, lim, lim_lo, sm_scale_log2, L_S: gl.constexpr):
    """:func:`_g_softmax` with the TRIM option: the causal / length mask only on a tile that can hold a masked token
    (``t0 + 64 > lim_lo``, ``lim_lo <= min(lim)``: a scalar, warp-uniform branch; on the other tiles every
    ``tok < t0 + 64 <= lim_lo <= lim[row]`` and the selection would be the identity), and the scale folded into one
    FFMA per element, ``p = exp2(s * c - m_new * c)`` with ``m_new * c`` once per row (``c = scale * log2 e``). The
    running max stays in raw-score units; alpha keeps the subtraction form (``m_i == m_new == -1e30`` must give
    exactly 1, not exp2 of an FFMA rounding residue)."""
    if t0 + 64 > lim_lo:
        tok = t0 + gl.arange(0, 64, gl.SliceLayout(0, L_S))
        s = gl.where(tok[None, :] < lim[:, None], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    alpha = gl.exp2((m_i - m_new) * sm_scale_log2)
    mc = m_new * sm_scale_log2
    p = gl.exp2(gl.fma(s, sm_scale_log2, -mc[:, None]))
    l_new = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_new


@_jit
def _g_send_p(p, alpha, p_smem, a_smem, pready, pfree, msg, k_nope_slot, nvalid, DT: gl.constexpr):
    """Hand P (bf16) and alpha to the PV warpgroup (after it released the previous ones); zero the V_L rows past
    the end of a partial tile first (this warpgroup's own V half)."""
    mbarrier.wait(pfree, (msg & 1) ^ 1)
    p_smem.store(p.to(DT))
    a_smem.store(alpha)
    if nvalid < 64:
        _g_zero_tail(k_nope_slot.slice(0, 256, dim=1), nvalid, 64, 256, 4)
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(pready)


@_jit
def _g_wait_halves(kready, slot, phase):
    """Wait until both 32-token halves of the K tile in ring slot ``slot`` have landed."""
    mbarrier.wait(kready.index(2 * slot), phase)
    mbarrier.wait(kready.index(2 * slot + 1), phase)


@_jit
def _g_pv_halves(p_smem, v, o, kempty, slot):
    """``o += P V`` as two commit groups of 32 tokens (2 x m64n256k16 each); the first half-slot is released as
    soon as its group has completed, the second after the last one. Returns the accumulator."""
    tok = warpgroup_mma(p_smem.slice(0, 32, dim=1), v.slice(0, 32, dim=0), o, is_async=True)
    tok = warpgroup_mma(p_smem.slice(32, 32, dim=1), v.slice(32, 32, dim=0), tok, is_async=True)
    tok = warpgroup_mma_wait(1, deps=(tok, ))
    mbarrier.arrive(kempty.index(2 * slot))
    o = warpgroup_mma_wait(0, deps=(tok, ))
    mbarrier.arrive(kempty.index(2 * slot + 1))
    return o


@_jit
def _g_out_rows(mb, rows, group, kvh, L: gl.constexpr):
    r = mb * 64 + gl.arange(0, 64, gl.SliceLayout(1, L))
    rmask = r < rows
    sidx = gl.where(rmask, r // group, 0)
    hidx = gl.where(rmask, kvh * group + r % group, 0)
    return rmask, sidx, hidx


@_jit
def _g_write_half(o, inv, req, split, nsp, rmask, sidx, hidx, out_ptr, oacc_ptr, s_q, h_q, acc_rows,
                  COL0: gl.constexpr, L: gl.constexpr):
    cols = COL0 + gl.arange(0, 256, gl.SliceLayout(0, L))
    o = o * inv[:, None]
    sidx64 = sidx.to(gl.int64)
    hidx64 = hidx.to(gl.int64)
    req64 = req.to(gl.int64)
    if nsp <= 1:
        ooff = ((req64 * s_q + sidx64) * h_q + hidx64) * 512
        gl.store(out_ptr + ooff[:, None] + cols[None, :], o.to(out_ptr.dtype.element_ty), mask=rmask[:, None])
    else:
        acc_row = split.to(gl.int64)
        ok = (acc_row >= 0) & (acc_row < acc_rows)
        aoff = ((acc_row * s_q + sidx64) * h_q + hidx64) * 512
        gl.store(oacc_ptr + aoff[:, None] + cols[None, :], o, mask=rmask[:, None] & ok)


@_jit
def _g_lse_store(l_i, m_i, empty, req, split, nsp, rmask_s, sidx_s, hidx_s, lse_ptr, lacc_ptr, s_q, h_q, acc_rows,
                 sm_scale, sm_scale_log2):
    """The softmax warpgroup's lse store of a piece (EPI_EARLY's copy of the inline code in :func:`_g_softmax_wg`):
    natural-log lse + inf when empty to ``lse`` (single split), base-2 ``log2 L + m`` (-inf when empty) to the
    accumulator row ``split`` otherwise."""
    sidx64 = sidx_s.to(gl.int64)
    hidx64 = hidx_s.to(gl.int64)
    req64 = req.to(gl.int64)
    if nsp <= 1:
        lse_n = gl.where(empty, float("inf"), gl.log(gl.where(empty, 1.0, l_i)) + m_i * sm_scale)
        gl.store(lse_ptr + (req64 * h_q + hidx64) * s_q + sidx64, lse_n, mask=rmask_s)
    else:
        acc_row = split.to(gl.int64)
        ok = (acc_row >= 0) & (acc_row < acc_rows)
        lse_2 = gl.where(empty, float("-inf"), gl.log2(gl.where(empty, 1.0, l_i)) + m_i * sm_scale_log2)
        gl.store(lacc_ptr + (acc_row * s_q + sidx64) * h_q + hidx64, lse_2, mask=rmask_s & ok)


@_jit
def _g_softmax_wg(q_ptr, k_nope, k_rope, q_nope, q_rope, p_smem, a_smem, kready, kempty, pready, pfree,
                  seqlens_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
                  stride_qb, stride_qs, stride_qh, max_pages, b, s_q, h_q, group, rows, num_m_blocks, h_kv,
                  acc_rows, sm_scale, sm_scale_log2,
                  CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr, HALF: gl.constexpr = False,
                  QTMA: gl.constexpr = False, TRIM: gl.constexpr = False, qready=None, qempty=None,
                  PVR: gl.constexpr = False, kready_b=None, sissued=None, TIMELINE: gl.constexpr = False,
                  tl_ptr=None, EPI_NSP: gl.constexpr = False, EPI_EARLY: gl.constexpr = False,
                  EPI_SIS: gl.constexpr = False, DYN_QUEUE: gl.constexpr = False, n_items=None, wid=None,
                  widready=None, widempty=None):
    if DYN_QUEUE:
        w = _dq_recv(wid, widready, widempty, 0)
        it = w * 0
        # one register for the item count and the piece parity: np = 2 * items done + (pieces done & 1); the
        # P hand-offs (msg) = tiles + pieces, and every phase only needs parities (fewer values live across the
        # tile loops: the PVR build's softmax loop spilled with four counters)
        np = w * 0
        while w < n_items:
            mb = w % num_m_blocks
            tmp = w // num_m_blocks
            it, msg, pc = _g_softmax_part(mb, tmp % h_kv, tmp // h_kv, it, it + np, np, q_ptr, k_nope, k_rope, q_nope,
                                          q_rope, p_smem, a_smem, kready, kempty, pready, pfree, seqlens_ptr, meta_ptr,
                                          nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr, stride_qb, stride_qs,
                                          stride_qh, max_pages, b, s_q, h_q, group, rows, acc_rows, sm_scale,
                                          sm_scale_log2, CAUSAL, NUM_STAGES, HALF, QTMA, TRIM, qready, qempty, PVR,
                                          kready_b, sissued, TIMELINE, tl_ptr, EPI_NSP, EPI_EARLY, EPI_SIS)
            np = (np | 1) + 1 + (pc & 1)
            w = _dq_recv(wid, widready, widempty, np >> 1)
    else:
        mb, kvh, part = _g_coords(num_m_blocks, h_kv)
        it = 0
        msg = 0
        pc = 0
        _g_softmax_part(mb, kvh, part, it, msg, pc, q_ptr, k_nope, k_rope, q_nope, q_rope, p_smem, a_smem, kready, kempty,
                        pready, pfree, seqlens_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
                        stride_qb, stride_qs, stride_qh, max_pages, b, s_q, h_q, group, rows, acc_rows, sm_scale,
                        sm_scale_log2, CAUSAL, NUM_STAGES, HALF, QTMA, TRIM, qready, qempty, PVR, kready_b, sissued,
                        TIMELINE, tl_ptr, EPI_NSP, EPI_EARLY, EPI_SIS)


@_jit
def _g_softmax_part(mb, kvh, part, it, msg, pc, q_ptr, k_nope, k_rope, q_nope, q_rope, p_smem, a_smem, kready, kempty,
                    pready, pfree, seqlens_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
                    stride_qb, stride_qs, stride_qh, max_pages, b, s_q, h_q, group, rows, acc_rows, sm_scale,
                    sm_scale_log2, CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr, HALF: gl.constexpr,
                    QTMA: gl.constexpr, TRIM: gl.constexpr, qready, qempty, PVR: gl.constexpr, kready_b, sissued,
                    TIMELINE: gl.constexpr, tl_ptr, EPI_NSP: gl.constexpr, EPI_EARLY: gl.constexpr,
                    EPI_SIS: gl.constexpr):
    """The softmax warpgroup's work for one scheduler part (row block ``mb``, kv head ``kvh``); ``it`` / ``msg`` /
    ``pc``: K tiles / P hand-offs / pieces already done by this partition. Returns the updated ``(it, msg, pc)``."""
    DT: gl.constexpr = k_nope.dtype
    L_S: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    L_O: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    L_Q: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    begin_req, end_req, begin_blk, end_blk, begin_split = _g_record(meta_ptr, part, b)
    # query rows of this block (FlashMLA's flattened row = s_q_idx * group + head_in_group)
    rmask_q, sidx_q, hidx_q = _g_out_rows(mb, rows, group, kvh, L_Q)
    q_row = sidx_q.to(gl.int64) * stride_qs + hidx_q.to(gl.int64) * stride_qh
    dq = gl.arange(0, 64, gl.SliceLayout(0, L_Q))
    rmask_s, sidx_s, hidx_s = _g_out_rows(mb, rows, group, kvh, L_S)
    rmask_o, sidx_o, hidx_o = _g_out_rows(mb, rows, group, kvh, L_O)
    zero_s = gl.zeros([64, 64], gl.float32, L_S)
    if TIMELINE:
        _tl_stamp(tl_ptr, -1, 0, 0)                          # header: CTA start (softmax warpgroup)
        _tl_put(tl_ptr, -1, 0, 2, _tl_smid())
        _tl_put(tl_ptr, -1, 0, 3, end_req - begin_req + 1)
        _tl_put(tl_ptr, -1, 0, 5, _tl_clock())
    for req in range(begin_req, end_req + 1):
        if EPI_NSP:     # the request's accumulator rows now, not after the tile loop (module docstring "EPI")
            seqlen, k0, k1, base_row, nsp = _g_piece_nsp(req, begin_req, end_req, begin_blk, end_blk, begin_split,
                                                         seqlens_ptr, nsplits_ptr, max_pages)
        else:
            seqlen, k0, k1 = _g_piece(req, begin_req, end_req, begin_blk, end_blk, begin_split, seqlens_ptr,
                                      nsplits_ptr, max_pages)
        if QTMA:
            mbarrier.wait(qready, (req - begin_req + pc) & 1)     # Q of this piece, loaded by the producer
        else:
            # Q of this piece -> shared memory (every wgmma of the previous piece has completed)
            q_base = q_ptr + req.to(gl.int64) * stride_qb + q_row
            for c in gl.static_range(8):
                x = gl.load(q_base[:, None] + (c * 64 + dq)[None, :], mask=rmask_q[:, None], other=0.0)
                q_nope.slice(c * 64, 64, dim=1).store(x)
            x = gl.load(q_base[:, None] + (512 + dq)[None, :], mask=rmask_q[:, None], other=0.0)
            q_rope.store(x)
            fence_async_shared()
            gl.thread_barrier()
        if TIMELINE:
            # piece start (its Q in shared memory), then the first K tile's arrival (the loop's first wait, done
            # early: waiting a completed phase again returns at once), piece facts
            _tl_stamp(tl_ptr, req, begin_req, 0)
            if k1 > k0:
                if HALF:
                    _g_wait_halves(kready, it % NUM_STAGES, (it // NUM_STAGES) & 1)
                else:
                    mbarrier.wait(kready.index(it % NUM_STAGES), (it // NUM_STAGES) & 1)
            _tl_stamp(tl_ptr, req, begin_req, 1)
            _tl_put(tl_ptr, req, begin_req, 5, req)
            _tl_put(tl_ptr, req, begin_req, 6, k0.to(gl.int64) + (k1.to(gl.int64) << 32))

        if CAUSAL:
            limit = seqlen - (s_q - 1 - sidx_s)
        else:
            limit = seqlen + sidx_s * 0
        lim = gl.minimum(limit, k1)
        if TRIM:
            # a lower bound of min(lim) over the block's rows (sidx >= 0; k1 <= seqlen): tiles ending at or before
            # it hold no masked token for any row
            if CAUSAL:
                lim_lo = gl.minimum(seqlen - (s_q - 1), k1)
            else:
                lim_lo = k1
        m_i = gl.full([64], -1e30, gl.float32, gl.SliceLayout(1, L_S))
        l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, L_S))
        o = gl.zeros([64, 256], gl.float32, L_O)
        n_tiles = gl.maximum(k1 - k0 + 63, 0) // 64
        for j in range(0, n_tiles):
            t0 = k0 + j * 64
            slot = it % NUM_STAGES
            if PVR:
                # S in the same MMA order as below (NoPE 0-255, 256-511, RoPE: bit-identical), the second NoPE
                # half behind its own part's arrival; once all of S_j is issued, the PV warpgroup may issue
                # P V_R of the previous tile (it queues behind S_j on the tensor cores and runs under softmax_j)
                mbarrier.wait(kready.index(slot), (it // NUM_STAGES) & 1)
                tok = warpgroup_mma(q_nope.slice(0, 256, dim=1),
                                    k_nope.index(slot).slice(0, 256, dim=1).permute((1, 0)), zero_s, use_acc=False,
                                    is_async=True)
                mbarrier.wait(kready_b.index(slot), (it // NUM_STAGES) & 1)
                tok = warpgroup_mma(q_nope.slice(256, 256, dim=1),
                                    k_nope.index(slot).slice(256, 256, dim=1).permute((1, 0)), tok, is_async=True)
                tok = warpgroup_mma(q_rope, k_rope.index(slot).permute((1, 0)), tok, is_async=True)
                if j > 0:
                    mbarrier.arrive(sissued)
            else:
                if HALF:
                    _g_wait_halves(kready, slot, (it // NUM_STAGES) & 1)
                else:
                    mbarrier.wait(kready.index(slot), (it // NUM_STAGES) & 1)
                tok = warpgroup_mma(q_nope, k_nope.index(slot).permute((1, 0)), zero_s, use_acc=False,
                                    is_async=True)
                tok = warpgroup_mma(q_rope, k_rope.index(slot).permute((1, 0)), tok, is_async=True)
            s = warpgroup_mma_wait(0, deps=(tok, ))
            if QTMA:
                if j == n_tiles - 1:
                    mbarrier.arrive(qempty)          # last S of the piece done: the producer may load the next Q
            if TRIM:
                p, alpha, m_i, l_i = _g_softmax_trim(s, m_i, l_i, t0, lim, lim_lo, sm_scale_log2, L_S)
            else:
                p, alpha, m_i, l_i = _g_softmax(s, m_i, l_i, t0, lim, sm_scale_log2, L_S)
            _g_send_p(p, alpha, p_smem, a_smem, pready, pfree, msg, k_nope.index(slot), k1 - t0, DT)
            msg += 1
            o = o * gl.convert_layout(alpha, gl.SliceLayout(1, L_O))[:, None]
            if HALF:
                o = _g_pv_halves(p_smem, k_nope.index(slot).slice(0, 256, dim=1), o, kempty, slot)
            else:
                o_tok = warpgroup_mma(p_smem, k_nope.index(slot).slice(0, 256, dim=1), o, is_async=True)
                o = warpgroup_mma_wait(0, deps=(o_tok, ))
                mbarrier.arrive(kempty.index(slot))
            it += 1
        if PVR:
            if not EPI_SIS:      # EPI_SIS: the PV warpgroup does not wait for the last tile (no phase for it)
                if n_tiles > 0:
                    mbarrier.arrive(sissued)     # no S_{j+1} after the piece's last tile: release its P V_R now
        if QTMA:
            if n_tiles == 0:
                mbarrier.arrive(qempty)
        if TIMELINE:
            _tl_stamp(tl_ptr, req, begin_req, 2)              # last tile's P V_L done

        # finalise: 1/L to the PV warpgroup, own half + lse
        empty = (l_i == 0.0) | (l_i != l_i)
        inv = gl.where(empty, 0.0, 1.0 / gl.where(empty, 1.0, l_i))
        if EPI_EARLY:
            # own O half + lse first (they need neither the PV warpgroup's last P V_R nor the hand-off), then 1/L:
            # the pfree wait overlaps the stores (module docstring "EPI")
            if not EPI_NSP:
                base_row = gl.load(nsplits_ptr + req)
                nsp = gl.load(nsplits_ptr + req + 1) - base_row
            split = base_row + gl.where(req == begin_req, begin_split, 0)
            _g_write_half(o, gl.convert_layout(inv, gl.SliceLayout(1, L_O)), req, split, nsp, rmask_o, sidx_o,
                          hidx_o, out_ptr, oacc_ptr, s_q, h_q, acc_rows, 0, L_O)
            if TIMELINE:
                _tl_stamp(tl_ptr, req, begin_req, 10)
            _g_lse_store(l_i, m_i, empty, req, split, nsp, rmask_s, sidx_s, hidx_s, lse_ptr, lacc_ptr, s_q, h_q,
                         acc_rows, sm_scale, sm_scale_log2)
            mbarrier.wait(pfree, (msg & 1) ^ 1)
            if TIMELINE:
                _tl_stamp(tl_ptr, req, begin_req, 8)
            a_smem.store(inv)
            gl.thread_barrier()
            mbarrier.arrive(pready)
            msg += 1
        else:
            mbarrier.wait(pfree, (msg & 1) ^ 1)
            if TIMELINE:
                _tl_stamp(tl_ptr, req, begin_req, 8)
            a_smem.store(inv)
            gl.thread_barrier()
            mbarrier.arrive(pready)
            msg += 1

            if not EPI_NSP:
                base_row = gl.load(nsplits_ptr + req)
                nsp = gl.load(nsplits_ptr + req + 1) - base_row
            split = base_row + gl.where(req == begin_req, begin_split, 0)
            _g_write_half(o, gl.convert_layout(inv, gl.SliceLayout(1, L_O)), req, split, nsp, rmask_o, sidx_o,
                          hidx_o, out_ptr, oacc_ptr, s_q, h_q, acc_rows, 0, L_O)
            if TIMELINE:
                _tl_stamp(tl_ptr, req, begin_req, 10)
            sidx64 = sidx_s.to(gl.int64)
            hidx64 = hidx_s.to(gl.int64)
            req64 = req.to(gl.int64)
            if nsp <= 1:
                lse_n = gl.where(empty, float("inf"), gl.log(gl.where(empty, 1.0, l_i)) + m_i * sm_scale)
                gl.store(lse_ptr + (req64 * h_q + hidx64) * s_q + sidx64, lse_n, mask=rmask_s)
            else:
                acc_row = split.to(gl.int64)
                ok = (acc_row >= 0) & (acc_row < acc_rows)
                lse_2 = gl.where(empty, float("-inf"), gl.log2(gl.where(empty, 1.0, l_i)) + m_i * sm_scale_log2)
                gl.store(lacc_ptr + (acc_row * s_q + sidx64) * h_q + hidx64, lse_2, mask=rmask_s & ok)
        if TIMELINE:
            _tl_stamp(tl_ptr, req, begin_req, 3)              # piece end: this half's O + lse stores issued
            _tl_put(tl_ptr, req, begin_req, 7, (split - base_row).to(gl.int64) * 4294967296 + nsp.to(gl.int64))
    if TIMELINE:
        _tl_stamp(tl_ptr, -1, 0, 1)                        # CTA end (softmax warpgroup)
        _tl_put(tl_ptr, -1, 0, 6, _tl_clock())
    return it, msg, pc + gl.maximum(end_req - begin_req + 1, 0)


@_jit
def _g_pv_wg(k_nope, p_smem, a_smem, kready, kempty, pready, pfree, seqlens_ptr, meta_ptr, nsplits_ptr,
             out_ptr, oacc_ptr, max_pages, b, s_q, h_q, group, rows, num_m_blocks, h_kv, acc_rows,
             NUM_STAGES: gl.constexpr, HALF: gl.constexpr = False, PVR: gl.constexpr = False, kready_b=None,
             kempty_b=None, sissued=None, TIMELINE: gl.constexpr = False, tl_ptr=None,
             EPI_NSP: gl.constexpr = False, EPI_SIS: gl.constexpr = False, DYN_QUEUE: gl.constexpr = False,
             n_items=None, wid=None, widready=None, widempty=None):
    if DYN_QUEUE:
        w = _dq_recv(wid, widready, widempty, 0)
        it = w * 0
        msg = w * 0
        sis = w * 0
        n = w * 0
        while w < n_items:
            mb = w % num_m_blocks
            tmp = w // num_m_blocks
            it, msg, sis = _g_pv_part(mb, tmp % h_kv, tmp // h_kv, it, msg, sis, k_nope, p_smem, a_smem, kready,
                                      kempty, pready, pfree, seqlens_ptr, meta_ptr, nsplits_ptr, out_ptr, oacc_ptr,
                                      max_pages, b, s_q, h_q, group, rows, acc_rows, NUM_STAGES, HALF, PVR, kready_b,
                                      kempty_b, sissued, EPI_NSP, EPI_SIS)
            n += 1
            w = _dq_recv(wid, widready, widempty, n)
    else:
        mb, kvh, part = _g_coords(num_m_blocks, h_kv)
        it = 0
        msg = 0
        sis = 0
        _g_pv_part(mb, kvh, part, it, msg, sis, k_nope, p_smem, a_smem, kready, kempty, pready, pfree, seqlens_ptr,
                   meta_ptr, nsplits_ptr, out_ptr, oacc_ptr, max_pages, b, s_q, h_q, group, rows, acc_rows,
                   NUM_STAGES, HALF, PVR, kready_b, kempty_b, sissued, EPI_NSP, EPI_SIS)
        if TIMELINE:
            _tl_stamp(tl_ptr, -1, 0, 4)                             # CTA end (PV warpgroup)


@_jit
def _g_pv_part(mb, kvh, part, it, msg, sis, k_nope, p_smem, a_smem, kready, kempty, pready, pfree, seqlens_ptr,
               meta_ptr, nsplits_ptr, out_ptr, oacc_ptr, max_pages, b, s_q, h_q, group, rows, acc_rows,
               NUM_STAGES: gl.constexpr, HALF: gl.constexpr, PVR: gl.constexpr, kready_b, kempty_b, sissued,
               EPI_NSP: gl.constexpr, EPI_SIS: gl.constexpr):
    """The PV warpgroup's work for one scheduler part (row block ``mb``, kv head ``kvh``); ``it`` / ``msg`` / ``sis``:
    K tiles / P hand-offs / sissued phases (EPI_SIS) already done. Returns the updated ``(it, msg, sis)``."""
    L_O: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    begin_req, end_req, begin_blk, end_blk, begin_split = _g_record(meta_ptr, part, b)
    rmask_o, sidx_o, hidx_o = _g_out_rows(mb, rows, group, kvh, L_O)
    for req in range(begin_req, end_req + 1):
        if EPI_NSP:
            seqlen, k0, k1, base_row, nsp = _g_piece_nsp(req, begin_req, end_req, begin_blk, end_blk, begin_split,
                                                         seqlens_ptr, nsplits_ptr, max_pages)
        else:
            seqlen, k0, k1 = _g_piece(req, begin_req, end_req, begin_blk, end_blk, begin_split, seqlens_ptr,
                                      nsplits_ptr, max_pages)
        o = gl.zeros([64, 256], gl.float32, L_O)
        for t0 in range(k0, k1, 64):
            slot = it % NUM_STAGES
            if PVR:
                mbarrier.wait(kready_b.index(slot), (it // NUM_STAGES) & 1)     # V_R = part b of the slot
            elif HALF:
                _g_wait_halves(kready, slot, (it // NUM_STAGES) & 1)
            else:
                mbarrier.wait(kready.index(slot), (it // NUM_STAGES) & 1)
            mbarrier.wait(pready, msg & 1)
            alpha = a_smem.load(gl.SliceLayout(1, L_O))
            o = o * alpha[:, None]
            v = k_nope.index(slot).slice(256, 256, dim=1)
            if k1 - t0 < 64:
                _g_zero_tail(v, k1 - t0, 64, 256, 4)
                fence_async_shared()
                gl.thread_barrier()
            if PVR:
                # one sissued phase per tile (arrived at S_{j+1}'s issue or after the piece's last P V_L)
                if EPI_SIS:
                    # the piece's last tile: no S_{j+1} to queue behind, so P V_R issues at once, beside the
                    # softmax warpgroup's P V_L (which no longer arrives a phase after its loop)
                    if t0 + 64 < k1:
                        mbarrier.wait(sissued, sis & 1)
                        sis += 1
                else:
                    mbarrier.wait(sissued, it & 1)
                tok = warpgroup_mma(p_smem, v, o, is_async=True)
                o = warpgroup_mma_wait(0, deps=(tok, ))
                mbarrier.arrive(pfree)
                mbarrier.arrive(kempty_b.index(slot))
            elif HALF:
                o = _g_pv_halves(p_smem, v, o, kempty, slot)
                mbarrier.arrive(pfree)
            else:
                tok = warpgroup_mma(p_smem, v, o, is_async=True)
                o = warpgroup_mma_wait(0, deps=(tok, ))
                mbarrier.arrive(pfree)
                mbarrier.arrive(kempty.index(slot))
            msg += 1
            it += 1
        mbarrier.wait(pready, msg & 1)
        inv = a_smem.load(gl.SliceLayout(1, L_O))
        gl.thread_barrier()
        mbarrier.arrive(pfree)
        msg += 1
        if not EPI_NSP:
            base_row = gl.load(nsplits_ptr + req)
            nsp = gl.load(nsplits_ptr + req + 1) - base_row
        split = base_row + gl.where(req == begin_req, begin_split, 0)
        _g_write_half(o, inv, req, split, nsp, rmask_o, sidx_o, hidx_o, out_ptr, oacc_ptr, s_q, h_q, acc_rows,
                      256, L_O)
    return it, msg, sis


@_jit
def _g_variant_partitions(q_ptr, kn_desc, kp_desc, bt_ptr, seqlens_ptr, meta_ptr, nsplits_ptr,
                          out_ptr, lse_ptr, oacc_ptr, lacc_ptr, stride_qb, stride_qs, stride_qh, stride_btb,
                          max_pages, num_kv_blocks, b, s_q, h_q, group, rows, num_m_blocks, h_kv, acc_rows,
                          sm_scale, sm_scale_log2, k_nope, k_rope, q_nope, q_rope, p_smem, a_smem, kready,
                          kempty, pready, pfree, CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr,
                          PV_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, HALF: gl.constexpr,
                          QTMA: gl.constexpr, qn_desc, qp_desc, TRIM: gl.constexpr = False,
                          PVR: gl.constexpr = False, kh_desc=None, TIMELINE: gl.constexpr = False, tl_ptr=None,
                          EPI_NSP: gl.constexpr = False, EPI_EARLY: gl.constexpr = False,
                          EPI_SIS: gl.constexpr = False, DYN_QUEUE: gl.constexpr = False, dyn_ptr=None,
                          n_items=None):
    """The opt-in variant's partitions (HALF: 32-token half-tile ready/empty pairs; QTMA: Q loaded by the producer
    with TMA on ``qready``/``qempty``; TRIM: the softmax warpgroup's trimmed per-tile math, :func:`_g_softmax_trim`;
    PVR: column-split slots, ``kready``/``kempty`` then guard part a and ``kready_b``/``kempty_b`` part b, and
    ``sissued`` lets the PV warpgroup issue P V_R_j once S_{j+1} is issued). Kept out of the kernel body so the
    default's IR is built as before. DYN_QUEUE: the work-item ring (``wid``, 2 slots) and its barriers."""
    if DYN_QUEUE:
        wid = gl.allocate_shared_memory(gl.int32, [2, 1], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
        widready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        widempty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(widready.index(i), count=1)      # the producer
            mbarrier.init(widempty.index(i), count=2)      # both consumer warpgroups
    else:
        wid: gl.constexpr = None
        widready: gl.constexpr = None
        widempty: gl.constexpr = None
    # PVR needs Q by TMA (without QTMA it is off) and replaces HALF; the producer sees the Q operands only with QTMA
    if QTMA:
        qready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        qempty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
        mbarrier.init(qready, count=1)
        mbarrier.init(qempty, count=1)
        pq_nope = q_nope
        pq_rope = q_rope
        p_rows = rows
        p_group = group
        if PVR:
            pvr: gl.constexpr = True
            half: gl.constexpr = False
            kready_b = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
            kempty_b = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
            sissued = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
            for i in gl.static_range(NUM_STAGES):
                mbarrier.init(kready_b.index(i), count=1)
                mbarrier.init(kempty_b.index(i), count=1)    # the PV warpgroup only (V_R)
            mbarrier.init(sissued, count=1)
            p_kh_desc = kh_desc
        else:
            pvr: gl.constexpr = False
            half: gl.constexpr = HALF
            kready_b: gl.constexpr = None
            kempty_b: gl.constexpr = None
            sissued: gl.constexpr = None
            p_kh_desc: gl.constexpr = None
    else:
        pvr: gl.constexpr = False
        half: gl.constexpr = HALF
        qready: gl.constexpr = None
        qempty: gl.constexpr = None
        pq_nope: gl.constexpr = None
        pq_rope: gl.constexpr = None
        p_rows: gl.constexpr = None
        p_group: gl.constexpr = None
        kready_b: gl.constexpr = None
        kempty_b: gl.constexpr = None
        sissued: gl.constexpr = None
        p_kh_desc: gl.constexpr = None
    gl.warp_specialize([
        (_g_softmax_wg, (q_ptr, k_nope, k_rope, q_nope, q_rope, p_smem, a_smem, kready, kempty, pready, pfree,
                         seqlens_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
                         stride_qb, stride_qs, stride_qh, max_pages, b, s_q, h_q, group, rows, num_m_blocks,
                         h_kv, acc_rows, sm_scale, sm_scale_log2, CAUSAL, NUM_STAGES, half, QTMA, TRIM,
                         qready, qempty, pvr, kready_b, sissued, TIMELINE, tl_ptr, EPI_NSP, EPI_EARLY, EPI_SIS,
                         DYN_QUEUE, n_items, wid, widready, widempty)),
        (_g_pv_wg, (k_nope, p_smem, a_smem, kready, kempty, pready, pfree, seqlens_ptr, meta_ptr, nsplits_ptr,
                    out_ptr, oacc_ptr, max_pages, b, s_q, h_q, group, rows, num_m_blocks, h_kv, acc_rows,
                    NUM_STAGES, half, pvr, kready_b, kempty_b, sissued, TIMELINE, tl_ptr, EPI_NSP, EPI_SIS, DYN_QUEUE,
                    n_items, wid, widready, widempty)),
        (_g_producer, (kn_desc, kp_desc, k_nope, k_rope, kready, kempty, bt_ptr, seqlens_ptr, meta_ptr,
                       nsplits_ptr, stride_btb, max_pages, num_kv_blocks, b, num_m_blocks, h_kv, NUM_STAGES,
                       half, QTMA, qn_desc if QTMA else None, qp_desc if QTMA else None, pq_nope, pq_rope, qready,
                       qempty, p_rows, p_group, pvr, kready_b, kempty_b, p_kh_desc, DYN_QUEUE, dyn_ptr, n_items,
                       wid, widready, widempty)),
    ], [4, 1], [PV_REGS, PRODUCER_REGS])


# Integer arguments that vary per call are not specialised (no recompile when b, h_q, ... become 1 or a multiple
# of 16); the q strides stay specialised (16-byte Q loads; unspecialised they add ~70 B of ptxas spills).
_NO_SPEC = ["stride_btb", "max_pages", "num_kv_blocks", "b", "s_q", "h_q",
            "group", "rows", "num_m_blocks", "h_kv", "acc_rows", "n_items"]


def _jit_kernel(fn):
    return _jit(fn, do_not_specialize=_NO_SPEC)


@_jit_kernel
def _mla_decode_gluon_kernel(q_ptr, kn_desc, kp_desc, bt_ptr, seqlens_ptr, meta_ptr, nsplits_ptr,
                             out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
                             stride_qb, stride_qs, stride_qh, stride_btb, max_pages, num_kv_blocks,
                             b, s_q, h_q, group, rows, num_m_blocks, h_kv, acc_rows, sm_scale, sm_scale_log2,
                             dyn_ptr=None, n_items=None, DYN_QUEUE: gl.constexpr = False,
                             qn_desc=None, qp_desc=None, kh_desc=None, tl_ptr=None,
                             EPI_NSP: gl.constexpr = False, EPI_EARLY: gl.constexpr = False,
                             EPI_SIS: gl.constexpr = False, TIMELINE: gl.constexpr = False, PVR: gl.constexpr = False,
                             HALF: gl.constexpr = False,
                             QTMA: gl.constexpr = False,
                             TRIM: gl.constexpr = False, CAUSAL: gl.constexpr = False, NUM_STAGES: gl.constexpr = 2,
                             PV_REGS: gl.constexpr = 232, PRODUCER_REGS: gl.constexpr = 40):
    DT: gl.constexpr = kn_desc.dtype
    SL: gl.constexpr = kn_desc.layout
    NSLOT: gl.constexpr = NUM_STAGES * 2 if HALF else NUM_STAGES    # ready/empty pairs (one per half-tile)
    k_nope = gl.allocate_shared_memory(DT, [NUM_STAGES, 64, 512], SL)
    k_rope = gl.allocate_shared_memory(DT, [NUM_STAGES, 64, 64], kp_desc.layout)
    q_nope = gl.allocate_shared_memory(DT, [64, 512], SL)
    q_rope = gl.allocate_shared_memory(DT, [64, 64], kp_desc.layout)
    p_smem = gl.allocate_shared_memory(DT, [64, 64], kp_desc.layout)
    a_smem = gl.allocate_shared_memory(gl.float32, [64], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    kready = gl.allocate_shared_memory(gl.int64, [NSLOT, 1], mbarrier.MBarrierLayout())
    kempty = gl.allocate_shared_memory(gl.int64, [NSLOT, 1], mbarrier.MBarrierLayout())
    pready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    pfree = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NSLOT):
        mbarrier.init(kready.index(i), count=1)
        if PVR:
            mbarrier.init(kempty.index(i), count=1)  # PVR: part a of the slot, released by the softmax warpgroup
        else:
            mbarrier.init(kempty.index(i), count=2)  # one arrive per consumer warpgroup
    mbarrier.init(pready, count=1)
    mbarrier.init(pfree, count=1)
    if HALF or QTMA or TRIM or PVR or DYN_QUEUE:
        _g_variant_partitions(q_ptr, kn_desc, kp_desc, bt_ptr, seqlens_ptr, meta_ptr, nsplits_ptr,
                              out_ptr, lse_ptr, oacc_ptr, lacc_ptr, stride_qb, stride_qs, stride_qh, stride_btb,
                              max_pages, num_kv_blocks, b, s_q, h_q, group, rows, num_m_blocks, h_kv, acc_rows,
                              sm_scale, sm_scale_log2, k_nope, k_rope, q_nope, q_rope, p_smem, a_smem, kready,
                              kempty, pready, pfree, CAUSAL, NUM_STAGES, PV_REGS, PRODUCER_REGS, HALF, QTMA,
                              qn_desc, qp_desc, TRIM, PVR, kh_desc, TIMELINE, tl_ptr, EPI_NSP, EPI_EARLY, EPI_SIS,
                              DYN_QUEUE, dyn_ptr, n_items)
    else:
        gl.warp_specialize([
            (_g_softmax_wg, (q_ptr, k_nope, k_rope, q_nope, q_rope, p_smem, a_smem, kready, kempty, pready, pfree,
                             seqlens_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
                             stride_qb, stride_qs, stride_qh, max_pages, b, s_q, h_q, group, rows, num_m_blocks, h_kv,
                             acc_rows, sm_scale, sm_scale_log2, CAUSAL, NUM_STAGES, False, False, False, None, None,
                             False, None, None, TIMELINE, tl_ptr, EPI_NSP, EPI_EARLY, EPI_SIS)),
            (_g_pv_wg, (k_nope, p_smem, a_smem, kready, kempty, pready, pfree, seqlens_ptr, meta_ptr, nsplits_ptr,
                        out_ptr, oacc_ptr, max_pages, b, s_q, h_q, group, rows, num_m_blocks, h_kv, acc_rows,
                        NUM_STAGES, False, False, None, None, None, TIMELINE, tl_ptr, EPI_NSP, EPI_SIS)),
            (_g_producer, (kn_desc, kp_desc, k_nope, k_rope, kready, kempty, bt_ptr, seqlens_ptr, meta_ptr,
                           nsplits_ptr, stride_btb, max_pages, num_kv_blocks, b, num_m_blocks, h_kv, NUM_STAGES)),
        ], [4, 1], [PV_REGS, PRODUCER_REGS])


# ----------------------------------------------------------------------------------------------- host code

@functools.lru_cache(maxsize=None)
def _smem_layout():
    """The descriptors' shared layout (128-B swizzle, 16-bit elements); built once (~3 us per construction)."""
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)


def supported(q: torch.Tensor, k_cache: torch.Tensor, rows: int) -> bool:
    """Gate of the Gluon path: Gluon importable, not disabled (``DEEPKERNELS_DISABLE_GLUON=1``), not under the
    interpreter, CUDA sm90 tensors, bf16/fp16, d_qk 576, page_block_size 64, at least one query row, and a
    k_cache whose pages can be addressed as rows of a 2-D TMA descriptor (16-B aligned)."""
    if not available() or gluon_disabled("dense_decode"):
        return False
    if interpret_mode():
        return False
    if not (q.is_cuda and k_cache.is_cuda) or q.dtype not in (torch.bfloat16, torch.float16):
        return False
    if k_cache.dtype != q.dtype or q.shape[-1] != 576 or k_cache.dim() != 4:
        return False
    nb, page, h_kv, d = k_cache.shape
    if page != PAGE or d != 576 or rows < 1 or nb * page >= 2 ** 31:
        return False
    s0, s1, s2, s3 = k_cache.stride()
    if s3 != 1 or (h_kv > 1 and s2 != 576) or s0 != page * s1 or s1 < h_kv * 576 or (s1 * 2) % 16:
        return False
    if k_cache.data_ptr() % 16 or torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    return True


def gluon_dense_launch(q, k_cache, block_table, seqlens, sched, num_splits, scale, causal, out, lse, o_acc, l_acc,
                       config=None, _spec=None, half_tiles=None, q_tma=None, trim=None, pvr=None, timeline=None,
                       epi_nsp=False, epi_early=False, epi_sis=False, dyn_queue=False, dyn_ctas=None,
                       dyn_counter=None):
    """Launch the Gluon split-KV kernel (no combine). Arguments as in ``decode._dense_launch`` (q ``[b, s_q, h_q,
    576]``, k_cache ``[num_blocks, 64, h_kv, 576]``, block_table ``[b, *]`` int32 with stride(1) == 1, seqlens
    ``[b]`` int32 contiguous, sched ``[parts, 8]`` / num_splits ``[b + 1]`` int32); outputs allocated by the
    caller: out ``[b, s_q, h_q, 512]`` (q dtype), lse ``[b, h_q, s_q]`` fp32, o_acc ``[acc_rows, s_q, h_q, 512]``
    fp32, l_acc ``[acc_rows, s_q, h_q]`` fp32, all contiguous. Launched through a
    :class:`deepkernels._launch.KernelLauncher` (direct compiled-kernel launch once bound; ``_LAUNCHERS``) keyed by
    ``_spec``: a hashable object standing for the specialisation facts of every argument (``decode._dense_launch``
    passes its launch key, which covers them: k_cache's dtype fixes the two TMA descriptors' key), or None to
    compute them here with :func:`deepkernels._launch.spec_key` (descriptors included).

    ``half_tiles`` / ``q_tma``: the variant (module docstring): 32-token half-tile ring barriers, Q loaded by the
    producer with TMA; None (decode.py's launches): the measured choice at >= :data:`DISPATCH_MIN_ROWS` query rows per
    kv head, Q by TMA (:data:`DISPATCH_Q_TMA`) and half tiles from s_q >= :data:`DISPATCH_HALF_MIN_SQ`
    (``DEEPKERNELS_DENSE_DECODE_VARIANT=0``: neither). ``q_tma`` falls back to the plain Q loads when the query rows of a
    block are not one strided run (needs h_kv == 1 or s_q == 1 and q viewable as ``[b * s_q * h_q, 576]`` with a
    16-B aligned base and row pitch): :func:`q_tma_supported`.

    ``trim``: the TRIM option (module docstring): the softmax warpgroup masks only tiles that can hold a masked token
    and folds the scale into one FFMA per score; None takes :data:`DISPATCH_TRIM` (on) at >= :data:`DISPATCH_MIN_ROWS`
    rows (``DEEPKERNELS_DENSE_DECODE_VARIANT=0`` keeps it off). Any combination with ``half_tiles`` / ``q_tma``.

    ``pvr``: the PVR option (module docstring "PVR option"): P V_R issued behind the next tile's S, K slots released
    by column halves; None takes :data:`DISPATCH_PVR` (on) at >= :data:`DISPATCH_PVR_MIN_HEADS` query heads per kv
    head unless ``half_tiles=True`` is asked for (``DEEPKERNELS_DENSE_DECODE_VARIANT=0`` keeps it off). Needs Q by TMA (off where ``q_tma`` resolves to False)
    and replaces the half-tile split (``half_tiles`` forced off); combines with ``trim``.

    ``timeline``: None (every dispatched launch), or a zeroed int64 CUDA tensor ``[grid, TL_WORDS]`` (contiguous; grid =
    parts * h_kv * 64-row blocks) that the TIMELINE build (constexpr TIMELINE, same math, a handful of extra stores
    per piece) fills with per-CTA / per-piece ``%globaltimer`` stamps (layout at :data:`TL_WORDS`;
    ``benchmarks/mla_decode_timeline.py``). Raises ValueError on a buffer of another shape / dtype.

    ``epi_nsp`` / ``epi_early`` / ``epi_sis``: the EPI options (module docstring "EPI"; constexprs EPI_NSP / EPI_EARLY /
    EPI_SIS, off by default, not dispatched; same math, bit-identical outputs): the split counts loaded at the piece
    start, the softmax warpgroup's own O half + lse written before its pfree wait / 1-over-L hand-off, and (PVR
    builds only, else no effect) P V_R of a piece's last tile released right after its P hand-off. Any
    combination, with every build (a plain build with one of them on launches through the variant path).

    ``dyn_queue``: the DYN_QUEUE option (module docstring "DYN_QUEUE"; off by default, not dispatched): launch
    ``min(items, dyn_ctas)`` persistent CTAs (``dyn_ctas`` None: one per SM, ``decode._num_sms``) that take the
    work items (scheduler part, kv head, 64-row block) of ``sched`` from a global int32 counter (``dyn_counter``:
    a zeroed int32 CUDA tensor of >= 1 element, left zeroed by the kernel; None: one per device, :func:`_dyn_counter`;
    launches that may run concurrently on several streams need counters of their own). Same records, same math:
    outputs bit-identical to the static launch of the same ``sched``. Any combination with the other options
    except ``timeline``. The number of parts per SM is the caller's schedule (:func:`dyn_parts`)."""
    stages, pv_regs, prod_regs = config or GLUON_DEFAULT
    if pvr is None:      # measured at h_q 64 / 128 (h_kv 1): a gain at 128 heads only; an explicit half_tiles=True wins
        pvr = (DISPATCH_PVR and os.environ.get("DEEPKERNELS_DENSE_DECODE_VARIANT", "") != "0"
               and q.shape[2] // k_cache.shape[2] >= DISPATCH_PVR_MIN_HEADS and half_tiles is not True)
    if trim is None:     # measured at >= DISPATCH_MIN_ROWS rows only (h_q 64 / 128)
        trim = (DISPATCH_TRIM and os.environ.get("DEEPKERNELS_DENSE_DECODE_VARIANT", "") != "0"
                and q.shape[1] * q.shape[2] // k_cache.shape[2] >= DISPATCH_MIN_ROWS)
    trim = bool(trim)
    if half_tiles is None or q_tma is None:
        # only where it was measured: >= 64 query rows per kv head (h_q 64 / 128); the bandwidth regime (16 / 32
        # rows: the Q box would load 64 rows for 16 / 32 used) keeps the plain kernel -- the closing bench of session
        # 16 showed h_q 16 / 32 7-12 % below session 15 at long s_k with the variant on, not A/B-tested
        on = (os.environ.get("DEEPKERNELS_DENSE_DECODE_VARIANT", "") != "0"
              and q.shape[1] * q.shape[2] // k_cache.shape[2] >= DISPATCH_MIN_ROWS)
        if q_tma is None:
            q_tma = on and DISPATCH_Q_TMA
    q_tma = bool(q_tma) and q_tma_supported(q, k_cache.shape[2])
    if half_tiles is None:   # measured only together with Q by TMA (half tiles alone: not A/B-tested)
        half_tiles = on and q.shape[1] >= DISPATCH_HALF_MIN_SQ and q_tma
    pvr = bool(pvr) and q_tma         # built with Q by TMA only (module docstring "PVR option")
    half_tiles = bool(half_tiles) and not pvr
    grid, args = _launch_args(q, k_cache, block_table, seqlens, sched, num_splits, out, lse, o_acc, l_acc,
                              32 if half_tiles else 64)
    causal_c = bool(causal and q.shape[1] > 1)
    if timeline is not None and (timeline.dtype != torch.int64 or tuple(timeline.shape) != (grid[0], TL_WORDS)
                                 or not timeline.is_contiguous() or timeline.device != q.device):
        raise ValueError(f"timeline must be a contiguous int64 [{grid[0]}, {TL_WORDS}] tensor on {q.device}, got "
                         f"{timeline.dtype} {tuple(timeline.shape)} on {timeline.device}")
    epi = (bool(epi_nsp), bool(epi_early), bool(epi_sis))
    dyn = (None, None, False)
    if dyn_queue:
        if timeline is not None:
            raise ValueError("dyn_queue does not combine with timeline (per-CTA records of static parts)")
        if dyn_counter is None:
            dyn_counter = _dyn_counter(q.device)
        elif (dyn_counter.dtype != torch.int32 or dyn_counter.numel() < 1 or dyn_counter.device != q.device
              or not dyn_counter.is_contiguous()):
            raise ValueError(f"dyn_counter must be a contiguous int32 tensor of >= 1 element on {q.device}, got "
                             f"{dyn_counter.dtype} {tuple(dyn_counter.shape)} on {dyn_counter.device}")
        n_items = grid[0]
        ctas = _dyn_num_ctas(q.device) if dyn_ctas is None else int(dyn_ctas)
        if ctas < 1:
            raise ValueError(f"dyn_ctas must be >= 1, got {dyn_ctas}")
        grid = (min(n_items, ctas), )
        dyn = (dyn_counter, n_items, True)
    if not (half_tiles or q_tma or trim or pvr or any(epi) or dyn_queue) and timeline is None:
        constexprs = (causal_c, stages, pv_regs, prod_regs)
        launcher = cached_launcher(_LAUNCHERS, _mla_decode_gluon_kernel,
                                   (tuple(zip(_CONSTEXPRS, constexprs)), spec_key(*args) if _spec is None else _spec),
                                   lambda: dict(zip(_CONSTEXPRS, constexprs), num_warps=4), _LAUNCHER_LIMIT,
                                   cache_descriptors=True)
        launcher(grid, *args, scale, scale * _LOG2E)
        return out, lse
    # the variant: every constexpr and the two Q descriptors (None without q_tma) passed by position
    constexprs = (pvr, half_tiles, q_tma, trim, causal_c, stages, pv_regs, prod_regs)
    qd = _q_descs(q) if q_tma else (None, None)
    if pvr:
        qd = (*qd, TensorDescriptor(k_cache, args[1].shape, args[1].strides, [64, 256], _smem_layout()))
    else:
        qd = (*qd, None)
    key = (tuple(zip(_CONSTEXPRS_VARIANT, constexprs)),
           spec_key(*args, *qd) if _spec is None else (_spec, "variant"))
    if any(epi):                # an EPI build: a key of its own (the dispatched key as before)
        key = (key, tuple(zip(_CONSTEXPRS_EPI, epi)))
    if dyn_queue:               # a DYN_QUEUE build: a key of its own
        key = (key, "dyn", spec_key(dyn[0]))
    tl = (None, False)
    if timeline is not None:    # the instrumented build: a key of its own
        key, tl = (key, "timeline", spec_key(timeline)), (timeline, True)
    launcher = cached_launcher(_LAUNCHERS, _mla_decode_gluon_kernel, key, dict(num_warps=4), _LAUNCHER_LIMIT,
                               cache_descriptors=True)
    launcher(grid, *args, scale, scale * _LOG2E, *dyn, *qd, tl[0], *epi, tl[1], *constexprs)
    return out, lse


DYN_PARTS_PER_SM = 2     # the schedule the static launch uses at < 64 rows (decode._CONFIGS: 2 parts per SM)
_DYN_COUNTERS: dict = {}


def _dyn_counter(device) -> torch.Tensor:
    """DYN_QUEUE's default work counter of ``device``: one zeroed int32, allocated once (outside any graph capture
    when the first dyn launch of the device is not captured; the kernel leaves it zeroed after every launch)."""
    dev = torch.device(device)
    key = (dev.type, dev.index if dev.index is not None or dev.type != "cuda" else torch.cuda.current_device())
    c = _DYN_COUNTERS.get(key)
    if c is None:
        c = _DYN_COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=dev)
    return c


def _dyn_num_ctas(device) -> int:
    from .decode import _num_sms
    return _num_sms(torch.device(device))


def dyn_parts(device, rows: int, h_kv: int, parts_per_sm: int = DYN_PARTS_PER_SM) -> int:
    """Scheduler parts for a DYN_QUEUE launch with ``parts_per_sm`` work items per SM (the knob: 2 = the static
    launch's schedule at < 64 rows, 3 / 4 finer): ``max(num_sms * parts_per_sm // h_kv // m_blocks, 1)``, as
    ``decode._num_sm_parts`` (64-row blocks). Pass it to ``metadata.compute_schedule``."""
    if parts_per_sm < 1:
        raise ValueError(f"parts_per_sm must be >= 1, got {parts_per_sm}")
    m_blocks = -(-rows // BLOCK_M)
    return max(_dyn_num_ctas(device) * parts_per_sm // h_kv // m_blocks, 1)


def q_tma_supported(q: torch.Tensor, h_kv: int) -> bool:
    """The variant's Q-by-TMA precondition: the 64 query rows of a block are consecutive rows of q seen as
    ``[b * s_q * h_q, 576]`` (h_kv == 1, or s_q == 1), and that view exists with a 16-B aligned base and pitch."""
    b, s_q, h_q, d = q.shape
    if not (h_kv == 1 or s_q == 1) or b * s_q * h_q >= 2 ** 31 or q.data_ptr() % 16:
        return False
    try:
        q2 = q.view(b * s_q * h_q, d)
    except RuntimeError:
        return False
    return q2.stride(1) == 1 and (q2.stride(0) * q.element_size()) % 16 == 0 and q2.stride(0) >= d


def _q_descs(q):
    """Two TMA descriptors over q seen as ``[b * s_q * h_q, 576]``: ``[64, 512]`` (NoPE) and ``[64, 64]`` (RoPE)."""
    b, s_q, h_q, d = q.shape
    q2 = q.view(b * s_q * h_q, d)
    lay = _smem_layout()
    shape2, strides2 = [b * s_q * h_q, d], [q2.stride(0), 1]
    return (TensorDescriptor(q, shape2, strides2, [64, 512], lay), TensorDescriptor(q, shape2, strides2, [64, 64], lay))


def _launch_args(q, k_cache, block_table, seqlens, sched, num_splits, out, lse, o_acc, l_acc, kt=64):
    """(grid, runtime arguments before the two scales) of a split-KV launch: one CTA per (scheduler part, kv head,
    64-row block of s_q x h_q / h_kv rows); K read through two TMA descriptors over the cache viewed as
    ``[num_blocks * 64, h_kv * 576]`` (``[kt, 512]`` NoPE = V, ``[kt, 64]`` RoPE boxes; kt 32 for half tiles)."""
    b, s_q, h_q, _ = q.shape
    nb, page, h_kv, _ = k_cache.shape
    group = h_q // h_kv
    rows = s_q * group
    m_blocks = -(-rows // BLOCK_M)
    lay = _smem_layout()
    shape2 = [nb * page, h_kv * 576]
    strides2 = [k_cache.stride(1), 1]
    kn_desc = TensorDescriptor(k_cache, shape2, strides2, [kt, 512], lay)
    kp_desc = TensorDescriptor(k_cache, shape2, strides2, [kt, 64], lay)
    qs = q.stride()
    args = (q, kn_desc, kp_desc, block_table, seqlens, sched, num_splits, out, lse, o_acc, l_acc,
            qs[0], qs[1], qs[2], block_table.stride(0), block_table.shape[1], nb,
            b, s_q, h_q, group, rows, m_blocks, h_kv, o_acc.shape[0])
    return (sched.shape[0] * h_kv * m_blocks, ), args


_CONSTEXPRS = ("CAUSAL", "NUM_STAGES", "PV_REGS", "PRODUCER_REGS")
_CONSTEXPRS_VARIANT = ("PVR", "HALF", "QTMA", "TRIM") + _CONSTEXPRS     # parameter order
_CONSTEXPRS_EPI = ("EPI_NSP", "EPI_EARLY", "EPI_SIS")     # between tl_ptr and TIMELINE
_LAUNCHERS: dict = {}   # (kernel, (constexprs, specialisation)) -> KernelLauncher (deepkernels._launch.cached_launcher)
_LAUNCHER_LIMIT = 1024


def gluon_dense_forward(q, k_cache, block_table, cache_seqlens, sched, num_splits, scale, causal, config=None,
                        half_tiles=False, q_tma=False, trim=False, pvr=False, timeline=None, epi_nsp=False,
                        epi_early=False, epi_sis=False, dyn_queue=False):
    """Whole split-KV step on the Gluon kernel: allocate out/lse/accumulators (NaN-poisoned when
    ``decode._POISON_OUTPUTS``), launch, combine (``combine_splits_`` unchanged). Same arguments and results as
    ``decode._dense_launch`` (which dispatches here when :func:`supported`); for tests and benchmarks.
    ``half_tiles`` / ``q_tma`` / ``trim`` / ``pvr``: the opt-in options (:func:`gluon_dense_launch`; None there = the
    dispatched choice); ``timeline``: the TIMELINE buffer; ``epi_*``: the EPI options, ``dyn_queue``: the work queue
    (:func:`gluon_dense_launch`)."""
    from . import decode as _dec
    from .combine import combine_splits_

    b, s_q, h_q, _ = q.shape
    dev = q.device
    parts = sched.shape[0]
    acc_rows = b + parts
    out = torch.empty(b, s_q, h_q, D_NOPE, dtype=q.dtype, device=dev)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=dev)
    o_acc = torch.empty(acc_rows, s_q, h_q, D_NOPE, dtype=torch.float32, device=dev)
    l_acc = torch.empty(acc_rows, s_q, h_q, dtype=torch.float32, device=dev)
    if _dec._POISON_OUTPUTS:
        for t in (out, lse, o_acc, l_acc):
            t.fill_(float("nan"))
    seqlens = cache_seqlens.contiguous()
    if block_table.stride(1) != 1:
        block_table = block_table.contiguous()
    gluon_dense_launch(q, k_cache, block_table, seqlens, sched, num_splits, scale, causal, out, lse, o_acc, l_acc,
                       config, half_tiles=half_tiles, q_tma=q_tma, trim=trim, pvr=pvr, timeline=timeline,
                       epi_nsp=epi_nsp, epi_early=epi_early, epi_sis=epi_sis, dyn_queue=dyn_queue)
    combine_splits_(out, lse, o_acc, l_acc, num_splits, lengths=seqlens, causal=bool(causal and s_q > 1))
    return out, lse


def _compile_sm90(config=None, causal=False, dtype="bf16", half_tiles=False, q_tma=False, trim=False, pvr=False,
                  timeline=False, epi_nsp=False, epi_early=False, epi_sis=False, dyn_queue=False):
    """Cross-compile the kernel for sm90 (no GPU needed). Returns the CompiledKernel. ``half_tiles`` / ``q_tma`` /
    ``trim`` / ``pvr``: the opt-in options (module docstring); all False compile the default kernel exactly as
    before. ``pvr`` needs ``q_tma`` and excludes ``half_tiles`` (both split the ring slots). ``timeline``: the
    TIMELINE instrumentation (an ``*i64`` buffer argument); ``epi_*``: the EPI options (module docstring "EPI");
    ``dyn_queue``: the DYN_QUEUE work queue (an ``*i32`` counter and the item count)."""
    if pvr and (half_tiles or not q_tma):
        raise ValueError("pvr needs q_tma and replaces half_tiles")
    stages, pv_regs, prod_regs = config or GLUON_DEFAULT
    lay = repr(_smem_layout())
    fn = _mla_decode_gluon_kernel
    kt = 32 if half_tiles else 64
    sig = {"q_ptr": f"*{dtype}", "kn_desc": f"tensordesc<{dtype}[{kt}, 512],{lay}>",
           "kp_desc": f"tensordesc<{dtype}[{kt}, 64],{lay}>", "bt_ptr": "*i32", "seqlens_ptr": "*i32",
           "meta_ptr": "*i32", "nsplits_ptr": "*i32", "out_ptr": f"*{dtype}", "lse_ptr": "*fp32",
           "oacc_ptr": "*fp32", "lacc_ptr": "*fp32",
           "stride_qb": "i32", "stride_qs": "i32", "stride_qh": "i32", "stride_btb": "i32", "max_pages": "i32",
           "num_kv_blocks": "i32", "b": "i32", "s_q": "i32", "h_q": "i32", "group": "i32", "rows": "i32",
           "num_m_blocks": "i32", "h_kv": "i32", "acc_rows": "i32", "sm_scale": "fp32", "sm_scale_log2": "fp32"}
    # every optional constexpr, in parameter order (the compile binds them by position)
    consts = {}
    if q_tma:
        sig["qn_desc"] = f"tensordesc<{dtype}[64, 512],{lay}>"
        sig["qp_desc"] = f"tensordesc<{dtype}[64, 64],{lay}>"
    else:
        consts.update(qn_desc=None, qp_desc=None)
    if pvr:
        sig["kh_desc"] = f"tensordesc<{dtype}[64, 256],{lay}>"
    else:
        consts.update(kh_desc=None)
    if dyn_queue:
        sig["dyn_ptr"] = "*i32"
        sig["n_items"] = "i32"
    else:
        consts.update(dyn_ptr=None, n_items=None)
    consts.update(DYN_QUEUE=bool(dyn_queue))
    if timeline:
        sig["tl_ptr"] = "*i64"
    else:
        consts.update(tl_ptr=None)
    consts.update(TIMELINE=bool(timeline))
    consts.update(PVR=bool(pvr), HALF=bool(half_tiles), QTMA=bool(q_tma), TRIM=bool(trim), CAUSAL=causal,
                  NUM_STAGES=stages,
                  PV_REGS=pv_regs, PRODUCER_REGS=prod_regs, EPI_NSP=bool(epi_nsp), EPI_EARLY=bool(epi_early),
                  EPI_SIS=bool(epi_sis))
    div16 = ("q_ptr", "bt_ptr", "seqlens_ptr", "meta_ptr", "nsplits_ptr", "out_ptr", "lse_ptr", "oacc_ptr",
             "lacc_ptr", "stride_qb", "stride_qs", "stride_qh")
    if timeline:
        div16 = div16 + ("tl_ptr", )
    # parameter order (the compile binds by position): a runtime tl_ptr sits between kh_desc and the constexprs
    sig = {n: sig.get(n, "constexpr") for n in fn.arg_names if n in sig or n in consts}
    return _compile_sm90_gluon(fn, sig, consts, div16, num_warps=4)
