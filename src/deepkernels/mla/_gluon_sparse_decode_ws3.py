"""Sparse FP8 MLA decode, split consumer + 2-CTA cluster producer sharing (h_q a multiple of 128; dispatched: :func:`dispatch_on`).

Same contract, arguments and outputs as :func:`_gluon_sparse_decode_ws2.launch_sparse_decode_gluon_ws2` (read that
module's and ``_gluon_sparse_decode_ws``'s docstrings); formats V3.2 (656 B/token) and V4.1 (528 B/token); with an
extra cache (V4.1 + FP4, V4.1 + V4.1, V3.2 + V3.2) only through the opt-in entry of section "Extra cache" (never
dispatched). Calls with ``h_q % 128 != 0`` go to the WS2 launcher unchanged (with an extra cache: to WS).

Design (FlashMLA's sm90 "crossover" idea, built from inline PTX because Gluon 3.6 has no cluster API):

* The kernel is compiled as an ordinary 1-CTA kernel (``num_ctas`` 1: no CGA layouts, every layout and helper of the
  WS / WS2 kernels reused) and LAUNCHED as 2-CTA clusters: the launcher passes the packed metadata
  ``(num_warps, 2, shared)`` to Triton's CUDA launcher, which then launches ``2 x gridX`` CTAs with
  ``CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION`` (2, 1, 1). The grid is the WS2 grid (scheduler part, query position,
  64-head block) with the head block innermost (``_g_part``: ``hb = pid % (h_q / 64)``), so the two CTAs of a
  cluster (``ctaid.x`` 2k, 2k+1) are the two 64-head halves of the same (part, query position): the same requests,
  the same token blocks, the same top-k indices.
* Per 64-token block each CTA's producer dequantises only HALF of the NoPE columns -- CTA rank ``r = hb & 1`` the
  scale groups 2r, 2r+1 = columns [256 r, 256 r + 256) -- into its own ring slot, and pushes each 128-column chunk
  (16 KB) to the same offset of the peer CTA's ring with one ``cp.async.bulk.shared::cluster.shared::cta.
  mbarrier::complete_tx::bytes`` (a DSMEM bulk copy, no registers) that completes on the peer's ``ready[slot]``.
  The RoPE rows (8 KB, cp.async, no dequant) and the validity mask stay per CTA (both CTAs load the 64 indices).
  Per block and CTA: gather 64 x (256 + 8 + 128) B = 25 KB instead of 42 KB, dequantise 16 K elements instead of
  32 K, carry 2 chunks (32 registers) of the next block's raw words instead of 4 (64).
* Consumers: the WS2 softmax warpgroup and PV warpgroup (``_w2_softmax_wg`` / ``_w2_pv_wg`` with ``CLUSTER``) with one
  addition: after each local ``empty[slot]`` arrive, the warpgroup also arrives on the PEER's ``empty[slot]``
  (``mapa`` + ``mbarrier.arrive.shared::cluster``, default .release.cta semantics as CUTLASS's ClusterBarrier:
  ``.release.cluster`` costs a ``MEMBAR.ALL.GPU`` per block in ptxas), so a producer reuses a slot only when both
  CTAs' consumers are done with it (its bulk copies write the peer's slot).

Shared-memory addresses for the inline PTX: Gluon 3.6 exposes no address of a shared allocation, so the launcher
reads the allocation offsets of ``kv_n`` / ``ready`` / ``empty`` from the compiled kernel's own TTGIR by running
Triton's shared-memory allocation pass on it (:func:`smem_offsets`, the passes ``make_llir`` runs before lowering)
and passes them as runtime arguments (``ring_off``, ``ready_off``, ``empty_off``); the PTX forms addresses as
``global_smem + offset``, ``global_smem`` read once per partition before its loops (section "Uniform registers").
The compile tier checks them against the layout (ring at 0, barriers after the data).

Barrier protocol (``it`` = ring counter, same sequence in both CTAs):

1. ``ready[s]`` (count 1 + tx): local producer's arrive (after a 128-thread barrier, as WS2; V3.2 also the
   RoPE cp.async arrive, net zero) + 32,768 tx bytes from the peer's two bulk copies; the local producer announces
   them with ``mbarrier.expect_tx`` (one thread) right after its ``empty`` wait, before its own arrive, so the phase
   cannot complete early (a peer byte count arriving first makes the tx-count transiently negative: allowed). The
   peer cannot write phase k+1's bytes before phase k completed here: it waits its ``empty[s]``, which needs this
   CTA's consumers' arrivals of phase k, made after they passed ``ready[s]`` phase k.
2. ``empty[s]`` (count 4): softmax WG + PV WG of this CTA and of the peer (remote arrives), each after its wgmma
   reads of the slot completed. The producer waits parity ``((it // 2) & 1) ^ 1`` as before.
3. ``pready`` / ``pfree``: the WS2 softmax -> PV handshake, unchanged, CTA-local.
4. Each chunk push: every producer thread ``fence.proxy.async`` after its ``st.shared``s (generic -> async proxy),
   a 128-thread barrier, then one thread issues the bulk copy.
5. Cluster: after ``mbarrier.init`` the default partition runs ``fence.mbarrier_init.release.cluster``; every
   partition starts and ends with ``barrier.cluster.arrive.release`` + ``wait.acquire`` (the peer's barriers are
   initialised before any remote access; no CTA exits while its peer may still copy into it or arrive on it).

Shared memory: the WS2 layout (no new buffers): 230,064 B (V3.2) / 205,472 B (V4.1) of 232,448.

Registers (launch maxnreg 168 x 12 warps; setmaxnreg PV 160, producer :data:`WS3_PRODUCER_REGS` 136 (V3.2) / 120
(V4.1), the softmax warpgroup the rest: 208 / 224 -- the WS2 split).

Cross-compile (Triton 3.6 wheel, ptxas sm_90a; page shift 6 / -1 x lengths x sink = 4 configs per format; SASS
instructions and spill instructions per innermost loop; session 17, after the uniform-register fix below):

=========  =========  ==================  ===================  =============  ===================
format     smem (B)   softmax token loop  PV token loop        producer loop  spill st / ld (B)
=========  =========  ==================  ===================  =============  ===================
V3.2       230,080-   610, 40 HGMMA,      190, 4 HGMMA, 0      640-676, 1-3   24-56 / 24-56
           230,096    0 spills            spills               spills
V4.1       205,488-   574, 36 HGMMA,      186, 4 HGMMA, 0      763-786, 0     0 / 0
           205,504    0 spills            spills               spills
=========  =========  ==================  ===================  =============  ===================

(WS2 for comparison: softmax loop 605 / 569 instructions with 0 spills, producer loop 968-1,340 with 5-14; the first
WS3 version, measured on the H200 in session 16: softmax loop 867 / 809 with 35 / 24 spills, spill stores 412-420 /
332-336 B.) The producer loop halves as designed (V3.2 with the asm dequant: 1,010 -> 640-676; V4.1 1,380 -> 763-786
and its 12-14 spills gone). ``mbarrier.arrive.release.cluster`` cost a ``MEMBAR.ALL.GPU`` per block in the loops,
so the remote arrive uses the default (.release.cta) form, as CUTLASS's ClusterBarrier does; the cluster barriers at
partition start / end keep theirs (6 per CTA in all).

Uniform registers (why the first version's softmax loop spilled; found in session 17 by editing the compiled PTX and
re-running ptxas, :func:`tests.test_mla_sparse_decode_ws3.test_compile_uniform_register_triggers` is the
reproducer). WS2's softmax loop computes its wgmma descriptors in uniform registers (SASS ``UIADD3.64`` 60 per block,
``R2UR`` 14); the first WS3 version rebuilt them in vector registers (``UIADD3.64`` 0, ``R2UR`` 157) and spilled the
64-bit Q descriptors (28 ``LDL.64`` per block). Not the ``volatile`` asm, the ``.reg .pred`` in it, ``mapa``,
``%cluster_ctarank``, the remote ``mbarrier.arrive`` or the bulk copy (each replaced or removed in turn: no effect).
Two independent triggers, each enough on its own:

(a) ``mov.u32 t, %tid.x`` inside the asm of a WORKER partition's loop (the producer's expect_tx / push predicate
    ``tid % 128 == 0``, or the PV warpgroup's remote arrive): softmax loop ``R2UR`` 157, 35-39 spills. The same
    read inside the softmax loop itself is harmless. Triton's PTX reads ``%tid.x`` once, at kernel entry (all its
    thread indices derive from that read); one more PTX read in a worker's loop is enough.
(b) ``mov.u32 a, global_smem`` inside the SOFTMAX partition's request / token loop nest (its remote arrive's
    address): ``R2UR`` 78, 39 spills. The same ``mov`` at the partition's top (outside both loops) or inside the PV
    or producer loops is harmless; ptxas apparently merges it with Triton's own ``global_smem`` (the descriptors'
    base) and the base is then defined inside the loop nest.

The mechanism inside ptxas is not known (closed source; ptxas of the Triton 3.6 wheel); the rules are measured.
What the kernel does now (same instructions executed, same threads elected, same addresses -- semantics unchanged):
the one-thread predicate is an operand (``lane == 0`` with ``lane`` = :func:`_c_lane`, a Gluon ``arange`` that LLVM
folds into Triton's own ``(%tid.x & 127) == 0`` predicate: the PTX has a single ``%tid.x`` read, the compile test
checks it), and ``global_smem`` is read once per partition (:func:`_c_smem_base`, 3 reads + Triton's 2); the
softmax / PV remote arrive adds the offsets inside its asm (``gs + empty_off + 8 slot``: the hoisted sum was one
more long-lived register and cost V3.2 one spill per block) and reads ``%cluster_ctarank`` there; the producer
keeps the hoisted peer rank (:func:`_c_peer_rank`; reading it per push cost it 2 spills).

Prediction (H200, h_q 128, topk 2048; per (CTA, 64-token block); measured for WS2 at V3.2 b 128 s_q 1: kernel
~4.4 us = 266 TFLOPS, consumers alone 2.1-2.4 us, producer alone 3.2 us with asm dequant + L2 prefetch).
Producer: the session-15 lesson is that it is latency- and SM-sharing-bound, not issue-bound (-27 % instructions
gave -5 %); this variant halves what each CTA gathers from NoPE (256 of 512 B per token; 25 KB per block with
scales and RoPE instead of 42 KB), its dequantisation (16 K elements) and its in-flight registers, and the push is
an asynchronous bulk copy (32 KB over DSMEM per block, ~0.2 us of transfer, no issue slots): producer alone
~1.8-2.3 us. Consumers: WS2's plus ~35 spill instructions per block in the softmax loop (~+5-10 %): 2.2-2.6 us
(session 17: the spills are gone, consumers as WS2's + 2 remote arrives per block).
Coupling: both CTAs' consumers must release a slot before either producer refills it (lockstep per block pair, one
DSMEM arrive latency ~0.2-0.5 us on the critical path only when the producers are behind). With the lighter
producer sharing the SM the overlap penalty (~1 us in WS/WS2) should shrink: block ~2.9-3.4 us -> V3.2 h_q 128
~340-400 TFLOPS (1.25-1.45x WS2); V4.1 the same ratio on its ~250 (~310-360). Falsifiers: a cluster
co-scheduling limit below the grid's clusters (66 on 132 SMs; the bench prints ``cuOccupancyMaxActiveClusters``)
would add a second wave (~0.5x); a hang means the tx / count protocol is wrong (the device script's smoke guard).
Numerics: the tile bytes and the consumer instruction sequence are WS2's, so out / lse are expected bit-identical
to WS2 (``test_gpu_ws3_equals_ws2``).

Unverified when written: everything that needs the GPU -- the cluster launch through Triton's launcher with
``num_ctas`` 2 in the packed metadata of a 1-CTA compile, ``global_smem`` + allocation offsets as DSMEM
addresses, the tx accounting (negative transient tx-count), correctness and speed.

Measured (session 16, H200, git de9dbf4694ae, ``GIT_SHA=de9dbf4694ae bash benchmarks/device_sparse_ws3.sh``,
results/sparse_decode_ws3-h200-2026-11-29-s16.json): the cluster launch, DSMEM bulk pushes and tx accounting WORK:
41/43 GPU tests (the 2 failures were an h_q 256 grid case the public op rejects -- a test bug, fixed after), output
bit-identical to WS2 at all 6 bench shapes, 66/66 clusters co-resident. Speed: V3.2 0.807-0.817x WS2 (217.5 vs
268.2 TFLOPS at b 128 s_q 1), V4.1 0.986-1.006x -- the predicted 1.25-1.45x missed. Not profiled yet; candidates:
the softmax loop's 24-35 spill instructions per block (ptxas stops keeping the wgmma descriptors in uniform
registers once the cluster PTX is present), and the per-block lockstep of the two CTAs (each slot refilled only
after BOTH CTAs' consumers released it). Kept (not dispatched) as the working cluster/DSMEM scaffold.

Session 17 (CPU only, no device time): the first candidate is removed -- softmax loop 0 spills for both formats
(section "Uniform registers"; 867 -> 610 / 809 -> 574 SASS instructions per block, WS2 605 / 569), PV loop
unchanged (0), producer loop 640-786 with 0-3 spills. The cluster PTX executes the same operations by the same
threads on the same addresses (only where its operands are computed moved), so out / lse are expected bit-identical
to WS2 as before. UNVERIFIED on the GPU: correctness of this build and its speed (if the ~35 L1-hit spill
instructions per block were the gap, V3.2 should move from 0.81x toward >= 1.0x WS2; if it stays near 0.81x the
per-block lockstep of the two CTAs is the next suspect). Next device run: ``GIT_SHA=<sha> OUT=$OUT bash
benchmarks/device_sparse_ws3.sh``.

Measured (session 17, H200, git 0b54eb4785ad, ``device_sparse_ws3.sh``, results/sparse_decode_ws3-h200-2026-11-29-s17
.json): 43/43 GPU tests, bit-identical to WS2 at all 6 shapes, 66/66 clusters; ws3 / ws2 1.16-1.25x (V3.2 336.6 /
360.5 TFLOPS at b 128 s_q 1 / 2; V4.1 304.7 / 326.4) -- the spills were the gap; inside the predicted 1.25-1.45x
only at its bottom. Paired rotated rounds over batch sizes (git 7d103e6, ``sparse_decode_ws3_paired.py``,
results/sparse_decode_ws3_paired-h200-2026-11-29-s17.json; t_ws3 / t_ws2): 0.80-0.85 at 31-124 blocks per CTA,
0.91-0.99 at 15.5 (topk 2048), but 1.01-1.06 at topk 512 (15.5 blocks, 8 per request) and 1.03-1.05 at b 1 / 8
(0.5-4 blocks): the cluster's fixed costs -> dispatched with :data:`DISPATCH_MIN_BLOCKS`. Through the public op in
``deepkernels bench`` (git c1ff888): V3.2 h_q 128 305.5-373.4 TFLOPS (session 16: 255.6-293.7), V4.1 287.4-347.4
(249.2-292.5).

RoPE rows (opt-in ``ROPE_ROWS``: launcher / compile keyword ``rope_rows``, default :data:`WS3_ROPE_ROWS`, empty: the
default build is unchanged, its cleaned PTX pinned by ``tests/test_mla_sparse_decode_ws3.py::
test_default_ptx_unchanged``). V3.2 only: V4.1 (528-B record) has no bf16 RoPE rows to gather (its 64 RoPE columns
are FP8 like the NoPE ones, part of the 512 dequantised columns; ``kv_p`` aliases ``p_smem``), so ``rope_rows`` is
ignored for it (no second specialisation).

* Problem (ncu source counters on the WS kernel, benchmarks/notes/profiling.md "Source-level counters"): the four
  RoPE ``LDGSTS.E.BYPASS.128`` per producer thread take ~24 shared wavefronts per warp instruction against an ideal
  4. With the default layout ``[1, 32] / [16, 2]`` one warp instruction covers 16 token rows x 2 lanes x 16 B, and
  the 128-B RoPE slice of a 656-B record (offset 528) straddles two 128-B lines: ~16 x 2 lines per instruction.
* Option: the [64, 64] bf16 RoPE tile is gathered with ``BlockedLayout([4, 8], [4, 8], [4, 1], [1, 0])``: warp w
  owns tokens 16 w .. 16 w + 15 as before, lane l the 16-B column piece l % 8 of tokens 16 w + 4 (l // 8) + k, so
  cp.async number k of a warp covers 4 whole tokens x 8 lanes = 4 full 128-B rows of the swizzled tile (~2 lines
  each). Still 4 ``LDGSTS`` per thread and block, the same bytes to the same tile addresses (the destination
  follows the shared layout, not the register layout) and the same zero fill (masked cp.async, src-size 0) for an
  invalid token, whose address stays ``kv_ptr + 528``. The row offsets and validity move from the chunk layout
  (16 rows x 2 lanes per warp) to this one in ONE ``convert_layout`` of ``where(valid, rec, -16)`` (rec >= 0; -16
  keeps rec's known 16-B divisibility, which the 16-byte cp.async needs), issued after the ``empty`` wait. Triton
  3.6 lowers it through shared memory, not shuffles, though it is warp-local (intra-warp: a ``bar.warp.sync``, no
  CTA barrier; 240 B of scratch): per thread one ``STS.64`` + two ``LDS.128``. Reloading the indices in the new
  layout instead cost +75 (paged) / +130 (page size not a power of two: 4 divisions) SASS instructions per block and
  2 more spills; converting rec and valid separately added a 128-thread barrier per block.
* Cross-compile (Triton 3.6 wheel, ptxas sm_90a; V3.2, page shift 6 / -1 x lengths x sink; default in brackets):
  producer loop 680 / 718 / 680 / 718 SASS instructions [643 / 676 / 640 / 676], spill instructions in it 1 in every
  config [1-3], ptxas spill bytes 20-56 [24-56], 4 ``LDGSTS.E.BYPASS.128`` [4], shared memory 230,336 B [230,080-
  230,096] of 232,448; softmax loop 610 / 0 spills and PV loop 190-191 / 0 spills [610 / 190] -- the consumers'
  code is untouched (168 registers per thread, the launch maxnreg, as the default).
* Prediction (UNVERIFIED on GPU; H200, V3.2, h_q 128, b 128, s_q 1, topk 2048): per (CTA, 64-token block) the
  16 RoPE warp instructions go from ~24 to ~8 wavefronts each (4 rows x ~2 lines), -256, plus ~+16 for the
  convert (4 warps x (1 STS.64 + 2 LDS.128), mostly broadcast): ~-240 wavefronts per block and CTA, ~2.0 M of the
  launch's (8,192 CTA-blocks). In the WS kernel the RoPE excess was 2.6 M of 32.6 M wavefronts and removing the
  4.2 M excess of the NoPE stores (WS ``ROW_LANES``) measured +1.5 % (WS) / +3.5 % (WS2); WS3's producer does half
  the NoPE stores, so the RoPE share of its shared pipe is larger: expected +1-3 % (V3.2 ~340 -> ~345-350 TFLOPS),
  0 on V4.1 (same code). ncu should show the 4 LDGSTS at <= ~8 wavefronts each. Falsifiers: no change (the producer
  waits on ``empty`` / latency, not on the shared pipe) or a loss from the +37-42 instructions per block. Out / lse
  bit-identical to the default (``test_gpu_ws3_rope_rows_bit_identical``). Paired bench:
  ``GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_ws3_rope.sh``.
* Not done (session 18, documented only): splitting the RoPE gather between the two CTAs (each cp.asyncs its 32
  tokens' rows, 4 KB, rows [32 r, 32 r + 32) of the slot's tile -- contiguous, the 128-B swizzle repeats every 8
  rows -- and pushes them to the peer with a 4 KB bulk copy next to its first NoPE push, ``expect_tx`` 32,768 +
  4,096). What it needs beyond the push: the shared offset of ``kv_p`` as a fourth runtime offset argument (the
  kernel's parameter list and the launcher's offset plumbing change), a ``cp.async.wait_group 0`` before the first
  push (the bulk copy reads what the cp.async wrote; the existing fence.proxy.async + 128-thread barrier then
  serve both pushes), and the 32 rows' offsets in a [32, 64] layout (an index reload of 2 rows per thread: the
  rows sit in 2 of the 4 warps of the chunk layout, a convert would cross warps). Prediction (UNVERIFIED): per
  (CTA, block) -4 KB of the 25 KB gathered (-16 %) and 8 of the 16 RoPE warp instructions (-64 wavefronts with
  ROPE_ROWS, -192 without), +1 bulk copy; the wait_group costs nothing if the RoPE rows landed during the chunk-0
  dequant (issued ~300 instructions earlier): +1-3 % on top of ROPE_ROWS at V3.2 h_q 128 b 128 s_q 1, if the
  producer's gathers (not the consumers) bound the block time.

Row lanes (``ROW_LANES``: launcher / compile keyword ``row_lanes``, default :data:`WS3_ROW_LANES` -- V4.1 since
session 17, see "Measured" below; the build with it off is pinned, ``test_default_ptx_unchanged``). The WS kernel's ``ROW_LANES`` (``_gluon_sparse_decode_ws.
WS_ROW_LANES``) applied to this producer: the chunk layout's lanes run over token rows first (V3.2 ``[64, 32]`` words
``BlockedLayout([1, 16], [16, 2], [4, 1], [0, 1])``, V4.1 ``[64, 4, 8]`` order ``[2, 0, 1]``), so each quarter-warp
of a dequantised 16-byte shared store writes 8 different rows = 8 distinct 16-byte bank groups of the 128-B-swizzled
ring piece (ncu on WS: 8 wavefronts per ``STS.128`` with 2 lanes per row, 4 ideal). Without ``ROPE_ROWS`` the RoPE
gather's layout takes the same order (as in WS: the rec / valid convert to it stays trivial); with ``ROPE_ROWS`` the
RoPE gather keeps its 4 x 8 layout (one convert, as before). Only which lane stores / loads what changes: the same
bytes land at the same addresses and the global loads cover the same records per warp instruction, so out / lse are
bit-identical to the default (``test_gpu_ws3_row_lanes_bit_identical``, V3.2 alone and with ``rope_rows``; V4.1
``test_gpu_ws3_row_lanes_v41_bit_identical``).

* Cross-compile (Triton 3.6 wheel, ptxas sm_90a; V3.2, page shift 6 / -1 x lengths x sink; default in brackets):
  producer loop 642 / 675 / 642 / 675 SASS instructions [643 / 676 / 640 / 676], 1 spill instruction in every config
  [3 / 1 / 1 / 1], ptxas spill bytes 48-64 [24-56], the same 16 ``STS.128`` + 4 ``LDGSTS`` + 2 bulk pushes per
  block, shared memory as the default; with ``ROPE_ROWS`` too: 679 / 715 / 678 / 716, 1 spill instruction, 24-52 B,
  230,336 B of shared memory (the ROPE_ROWS figures). Softmax 610 / PV 190-191 instructions, 0 spills, unchanged.
  V4.1: producer loop 761 / 784 [763 / 786], 0 spills [0].
* Prediction (UNVERIFIED on GPU; H200, V3.2 h_q 128): the 16 NoPE ``STS.128`` per thread and block (half of WS's
  32) from 8 to 4 wavefronts: -16 x 4 warps x 4 = -256 wavefronts per (CTA, block), ~2.1 M per launch at b 128
  s_q 1 -- about as much as ROPE_ROWS removes. WS / WS2 gained 1.5 % / 3.5 % from twice as many stores; here
  +0.5-2 %, roughly additive with ROPE_ROWS. V4.1: WS measured 2 % slower (its [64, 4, 8] layout's conversions), so
  expected ~0 or a loss. Falsifier: no change at all (the producer is latency-bound and waits on ``empty``). Paired
  bench (variants ``ws3_rl``, ``ws3_rl_rope`` against the default): ``GIT_SHA=<sha> OUT=$OUT bash
  benchmarks/device_sparse_ws3_rope.sh``.

Measured (session 17, H200; git c1ff888 ``device_sparse_ws3_rope.sh`` and git b446a4b ``sparse_decode_ws3_rope.py
--v41``, paired rotated rounds, 5 rounds, A/A control 0.997-1.001; results/sparse_decode_ws3_rope-h200-2026-11-29-s17
*.json): 21/21 GPU tests of both options, every variant bit-identical to the default at every shape.
* ROPE_ROWS, V3.2: t / t_ws3 1.046-1.126 -- SLOWER at all 5 shapes (predicted 0.97-0.99: wrong sign). The extra
  instructions (37-42 per block) and the shared-memory convert cost more than the saved RoPE wavefronts; the producer
  is not bound by those wavefronts. Not dispatched.
* ROW_LANES, V3.2: 0.995-1.038 (no gain); V4.1: 0.943-0.982 at 5 shapes (b 128 s_q 1 315.0 vs 302.3 TFLOPS, s_q 2
  340.1 vs 322.7, b 32 s_q 4 336.9 vs 317.9) -- the opposite of the WS kernel (V3.2 +1.5 %, V4.1 -2 %). Dispatched for
  V4.1 (:data:`WS3_ROW_LANES`).

Index loads ahead (session 18: launcher / compile keywords ``idx_ahead`` / ``pf_lines``, defaults
:data:`WS3_IDX_AHEAD` / :data:`WS3_PF_LINES`; the session-17 build's PTX stays pinned with the options off). The ncu
profile of the dispatched V3.2 kernel (benchmarks/notes/profiling.md, "WS3 sparse decode, V3.2 (session 18)") found the producer
busy ~89 % of each block (~5,200 of ~5,660 cycles) and both consumers waiting on its ``ready`` barrier, the producer
itself mostly not issuing: ~1,100 cycles on the two index loads it uses right after issuing them (block j + 2's for
the L2 prefetch, block j + 1's for the next chunk loads) and ~950 on the bulk prefetch, whose
``cp.async.bulk.prefetch.L2`` needs a warp-uniform address (ptxas loops over the lanes). ``IDX_AHEAD``: every block's
indices are loaded one iteration before use and carried in registers (one int32 per thread and block ahead; -1
past ``t_end``, validity recomputed as ``_g_load_idx``'s), so the loads' latency hides under a whole block.
``PF_LINES``: the prefetch as ``prefetch.global.L2`` per thread, 4 line addresses per token (2 per thread;
:func:`_w3_prefetch_lines`). Compiled (sm90 ptxas, page shift 6 + lengths + sink): V3.2 producer loop 630 SASS
instructions and 0 spills with IDX_AHEAD (default 643, 3 spill instructions), 608 with both; V4.1 IDX_AHEAD alone
6 spills (default 0), with PF_L2 + PF_LINES 0. Results must be bit-identical (only load timing / prefetches change).
Measured (H200, paired rotated rounds, A/A 0.999-1.001, bit-identical at every shape): V3.2 IDX_AHEAD 0.919-0.946 of
the time (b 128 s_q 1 / 2, b 64 s_q 1; 337.6 -> 363.4, 360.1 -> 392.8, 298.3 -> 315.4 TFLOPS), + PF_LINES 0.933-0.955,
PF_LINES alone 0.947-0.959, IDX_AHEAD with the prefetch off 1.045-1.051 (the prefetch pays once the indices are
early); V4.1 IDX_AHEAD alone 1.038-1.052 (its 6 spills), PF_L2 + PF_LINES 0.941-0.947, all three 0.882-0.898 (320.3
-> 362.0, 343.3 -> 388.0, 281.5 -> 313.3). V4.1 + FP4 extra with IDX_AHEAD (main-loop prefetch off) 0.985-0.987.
Dispatched: V3.2 IDX_AHEAD, V4.1 IDX_AHEAD + PF_L2 + PF_LINES (the extra entry's main loop too; extra loops never
prefetch).

Q by cp.async (session 18, ``Q_ASYNC``: the softmax warpgroup's ``_w2_softmax_wg`` option, default
:data:`WS3_Q_ASYNC`). A second profile after IDX_AHEAD (benchmarks/notes/profiling.md, "WS3 sparse decode after
IDX_AHEAD") put ~7 us per request piece before the first block on the softmax warpgroup's Q load (9 chunks, each a
global load -> shared store round trip in series) and found V3.2 balanced between producer and softmax warpgroup.
With all 9 chunks as cp.async in flight: predicted 0.90-0.95 of the time; measured V3.2 0.966-0.974 (bit-identical,
A/A 1.001-1.005) -> on for V3.2 (and so for V3.2 + V3.2 extra calls, not timed); V4.1 0.988 at b 128 (s_q 1 / 2),
1.053 at b 64 where the A/A read 1.034, V4.1 + FP4 0.989-0.997 -> off.

Extra cache (session 17 built, session 18 measured: :func:`launch_sparse_decode_gluon_ws3` with ``extra_k_cache`` /
``extra_indices`` / ``xfmt`` / ``extra_topk_length``, pairs :data:`WS3_EXTRA_PAIRS` = the WS kernel's V3.2 + V3.2,
V4.1 + V4.1, V4.1 + FP4, any other pair ValueError; the public op sends the pairs :data:`DISPATCH_EXTRA_PAIRS` here
with the no-extra work threshold, extra blocks counted -- all three pairs, measured 0.67-0.79 of WS's time at >= 29
blocks per CTA, topk 2048 + 512, H200, even at 15-19 blocks, 1.03-1.06x slower below 10):

* A separate entry, :func:`_sparse_decode_gluon_ws3_x_kernel` (the WS x kernel's runtime arguments + the three shared
  offsets after ``sm_scale_log2``, the no-extra constexprs, then ``XPAGE_SHIFT`` / ``HAS_XLEN`` / ``XFMT`` with
  defaults), launched by :class:`_ClusterLauncherX` (the cluster launcher with that JIT kernel): the no-extra
  kernel's parameters and PTX are untouched (``test_default_ptx_unchanged`` passes with the pinned hashes). The
  partition functions take the extra arguments as trailing parameters with defaults (``HAS_EXTRA`` False), so the
  no-extra entry's calls are unchanged.
* The line is WS's virtual line (``_gluon_sparse_decode_ws._w_xrange``): main positions [t_lo, min(t_hi, n)), then
  extra positions [max(t_lo - off, 0), min(t_hi - off, n_x)) with ``off = 64 ceil(n / 64)``. Softmax and PV warpgroups
  only add the extra blocks to their per-request block count (the slot's validity comes from the producer's mask,
  the per-block code is WS2's); the epilogue and the combine (``extra_lengths`` / ``extra_topk``) are WS's.
* Producer: per request :func:`_w3_blocks` over the main positions, then :func:`_w3_blocks` again over the extra
  positions with the extra cache's pointer / strides / page / format (``FMT`` = ``XFMT``), the ring counter running on
  -- the same sequence in both CTAs of a cluster (same part, query position and requests). Each CTA dequantises its
  half of the extra block's NoPE columns exactly as for main blocks: chunks 2 r, 2 r + 1 of 128 columns (FP4: bytes
  [128 r, 128 r + 128) of the e2m1 pairs + their 16 e4m3 scale bytes, WS's ``_w_dequant_store_fp4``, 2 chunks in
  flight = 24 data registers instead of WS's 48), writes them to its slot pieces and pushes each 16 KB piece to the
  peer (same ``expect_tx`` 32,768, same ``ready`` / ``empty`` protocol). V3.2 extra: the RoPE rows by cp.async per CTA
  as for main blocks. The extra loop runs without the L2 prefetch (as WS's extra loops); V3.2's asm dequant and V4.1's
  row lanes as the main loop's (same values).
* Cross-compile (Triton 3.6 wheel, ptxas sm_90a; page shift 6 / -1 x lengths x sink x extra page shift 6 / -1 / 4 x
  extra lengths = 4 configs per pair; :func:`compile_sm90_ws3_extra`, ``tests/test_mla_sparse_decode_ws3_extra.py``;
  SASS instructions per innermost loop, spill instructions, ptxas spill-store bytes of the whole kernel):

  ==============  ===========  ============  ========  ==================  ==================  ============
  pair            smem (B)     softmax loop  PV loop   producer main loop  producer extra      spill st (B)
                                                                           loop
  ==============  ===========  ============  ========  ==================  ==================  ============
  V4.1 + FP4      205,536      574, 0        186-187   759-782, 0          1,098-1,122, 0      84-96
  V4.1 + V4.1     205,536      574, 0        186, 0    759-783, 0          759-784, 0          28-40
  V3.2 + V3.2     230,128-144  610, 0        190-191   635-673, 1          584-608, 0          36-60
  ==============  ===========  ============  ========  ==================  ==================  ============

  The consumer loops equal the no-extra build's in instruction count (softmax 610 / 574 with ``R2UR`` 14 / 10, PV
  190 / 186, 0 spills): one ``%tid.x`` read, ``global_smem`` read once per partition, no ``MEMBAR.ALL.GPU`` in any
  loop, 2 bulk pushes + 1 ``expect_tx`` per producer loop. FP4's extra loop (2 chunks, 8 ``LDG.E.64`` per thread) is
  1,098 instructions against WS's 4-chunk FP4 loop of ~2,040 with 6 spills. Shared memory +32-48 B over the no-extra
  build (the extra arguments' partition state).
* Prediction (UNVERIFIED, no GPU run yet; H200, V4.1 + FP4, h_q 128, topk 2048 + extra 512; WS measured 211-238
  TFLOPS in session 15, 220-247 since): 32 main + 8 extra blocks per request; the main blocks go as WS3's V4.1 (1.2-1.3x
  WS: WS2 1.04-1.05x WS, WS3 1.16-1.25x WS2); an FP4 extra block costs each CTA's producer ~1,100 instructions (main:
  ~760) but the consumers bound the block (their loop is unchanged), so extra blocks go at about the main rate; one
  un-overlapped extra-loop prologue per request (index load + first gather, ~1-2 us, partly covered by the 2 filled
  slots) costs ~1-2 %. Expected t_ws3x / t_ws 0.78-0.88 (paired median), i.e. ~255-300 TFLOPS, b 64 s_q 1 lowest.
  Numerics: within FlashMLA's tolerances of the reference, not bit-identical to WS (WS2's consumers). Falsifiers:
  t_ws3x / t_ws >= 0.95 (the extra loop's producer -- FP4 dequant or the per-request prologue -- binds, or the
  cluster lockstep stalls at the main / extra boundary); a hang (the device script's smoke guard) would mean the two
  CTAs' block sequences diverge (they must be identical). Device run:
  ``GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_ws3_extra.sh``.

Q ahead (session 20, ``Q_AHEAD``: launcher / compile keyword ``q_ahead``, default :data:`WS3_Q_AHEAD` = no format,
but the launcher's main-cache defaults :data:`WS3_MAIN_TUNED` turn it on for V4.1 with the inline-PTX dequant at 144
producer registers, measured 0.963-0.972 of the time, bit-identical;
the build without it is unchanged, ``test_default_ptx_unchanged``). The session-20 ncu profile of the V4.1 kernel
(benchmarks/notes/mla_sparse_gluon.md, "Session 20 attribution (V4.1)") shows the producer pacing each request piece
and then idling once per piece: its ``empty`` try-wait fails in 3.9 % of blocks, ~0.88 times per warp and piece, for
~12,800 cycles (7.3 us) each -- 576 cycles per mean block of 5,060 -- while the softmax warpgroup spends 546 + 305
cycles per block (12,150 + 6,750 per piece) loading the next request's Q and writing the epilogue, computing no S.
The 2-slot ring lets the producer run only 2 blocks (~8,300 cycles) ahead. With ``Q_AHEAD`` the softmax warpgroup
is :func:`_gluon_sparse_decode_ws2._w2_softmax_wg` with ``Q_AHEAD``: the first request's Q by cp.async before the request
loop, every later request's Q by cp.async right after the previous request's token loop, before its epilogue (the
copies fly during the lse / output stores; ``q_n`` is free once the last S completed), the request top waits
(``wait_group 0``, proxy fence, 128-thread barrier). No new barrier, no new shared memory; a part without requests
issues no copy, the last request of a part issues none (every cp.async group is waited for). Same Q bytes, same
consumer expressions: out / lse bit-identical to the build without it. q with strides that are not 16-element
multiples keeps the build without it (:func:`_q_ahead`, the ``Q_ASYNC`` gate).

* Cross-compile (Triton 3.6 wheel, ptxas sm_90a; 3 page shift / lengths / sink configs per format in the compile
  tests): shared memory equal to the default build's; 0 spill instructions in the softmax, PV and producer loops
  (page shift 6, no lengths / sink: softmax loop V3.2 610 / V4.1 582 SASS instructions per block with 40 / 36
  HGMMA, PV 190, producer 630 / 790; the dispatched build 610 / 574, 190 / 186, 630 / 782); 2 x 36 / 2 x 32 Q
  cp.async per softmax thread, one ``%tid.x`` read; the extra-cache entry: 0 spills in the consumer loops, its
  producer loops no worse than the default build's. ``tests/test_mla_sparse_decode_ws3_s20.py``.
* Prediction (UNVERIFIED on GPU; H200, h_q 128, topk 2048, paired against the dispatched build, A/A alongside):
  by the profile's boundary model the producer's per-piece bubble (Q load + epilogue - 2 ring blocks - its
  request prologue) goes to ~0 for every piece but the first, and the first piece's Q is async: V4.1 b 128 s_q 1
  ~0.92-0.94 of the time, b 64 s_q 1 ~0.91, b 128 s_q 2 ~0.93; V3.2 (Q_ASYNC already on, its boundary ~3,500 cycles
  shorter) 0.97-1.00; V4.1 + FP4 (40 blocks per request) 0.94-0.99. But session 18's Q_ASYNC (the same copies at the
  request top, the serial 12,150-cycle load cut to ~1 round trip) was predicted ~0.92 by the same model and measured
  0.988 on V4.1, so the stated ranges are V4.1 0.92-0.99 (b 64 the lowest), V3.2 0.97-1.00, V4.1 + FP4 0.93-0.99.
  Falsifier: V4.1 qh >= 0.99 at all three shapes with the A/A within +-0.5 % -- the long ``empty`` waits are not
  the softmax warpgroup's boundary phase (the bench's ``qa`` column, Q_ASYNC alone, tells "latency of the Q load"
  from "Q on the boundary at all" apart). Bench: ``benchmarks/sparse_decode_s20.py``; device run:
  ``GIT_SHA=<sha> PYTHONPATH=$PWD/src OUT=$OUT bash benchmarks/device_sparse_decode_s20.sh``.

Timeline (session 21, opt-in, never dispatched; benchmarks/notes/sparse_decode_timeline.md): launcher keyword
``timeline=`` (a zeroed int64 ``[CTAs, _gluon_sparse_decode_ws2.TL_WORDS]`` tensor) runs the TIMELINE entry
:func:`_sparse_decode_gluon_ws3_tl_kernel` (:class:`_ClusterLauncherTL`; both entries call :func:`_w3_body`), whose
softmax warpgroup stamps ``%globaltimer`` per CTA (entry, start / end cluster barrier, loop done; ``%smid``, cluster
rank) and per request piece (start, Q ready, first K block ready, token loop done, epilogue done), the PV warpgroup
and the producer their loop ends. The dispatched entry's cleaned PTX is unchanged (pinned in
tests/test_sparse_decode_timeline.py); the TIMELINE build keeps every token loop's SASS and its 0 spills.
"""
from __future__ import annotations

import re
import tempfile
import os

import torch

from .._gluon import (IMPORT_ERROR as _IMPORT_ERROR, available, gl, async_copy, fence_async_shared,  # noqa: F401
                      mbarrier, warpgroup_mma, warpgroup_mma_wait)
from .._gluon import compile_sm90 as _compile_sm90_gluon, jit as _jit
from .._launch import triton_aligned
from ._gluon_sparse_decode import (GLUON_FMTS, _XFMT_CODES, _g_load_idx, _g_part, _g_req_range, _g_rows, _page_shift,
                                   _xfmt)
from . import _gluon_sparse_decode_ws as _ws
from . import _gluon_sparse_decode_ws2 as _ws2
from ._gluon_sparse_decode_ws import (WS_FMTS, WS_MAXNREG, _w_dequant_store,
                                      _w_dequant_store41, _w_dequant_store_fp4, _w_xrange)
from ._gluon_sparse_decode_ws2 import TL_WORDS, WS2_PV_REGS, _s_tl_stamp, _w2_pv_wg, _w2_softmax_wg
from ._gluon_cluster import (_c_expect_tx, _c_init_fence, _c_lane, _c_peer_rank, _c_push, _c_remote_arrive,  # noqa: F401
                             _c_smem_base, _c_sync)

__all__ = ["available", "supported_ws3", "launch_sparse_decode_gluon_ws3", "compile_sm90_ws3", "smem_offsets",
           "WS3_PRODUCER_REGS", "WS3_NUM_WARPS", "DISPATCH", "DISPATCH_FMTS", "DISPATCH_MIN_BLOCKS",
           "DISPATCH_EXTRA_PAIRS", "dispatch_on", "enough_work", "extends_ws", "WS3_EXTRA_PAIRS", "compile_sm90_ws3_extra"]

BLOCK_H = 64
WS3_NUM_WARPS = 4
# producer setmaxnreg per format (the softmax warpgroup gets (168 * 384 - (PV + producer) * 128) / 128)
WS3_PRODUCER_REGS = {"v32": 136, "v41": 120}
# producer options per format (the WS kernel's measured choice; V4.1's asm dequant spilled at 4 chunks in flight)
WS3_DEQ_ASM = frozenset({"v32"})
WS3_PF_L2 = frozenset({"v32", "v41"})     # V4.1 since session 18, with PF_LINES (its bulk prefetch lost)
# formats whose RoPE rows are gathered 4 tokens x 8 lanes per cp.async instruction (module docstring, "RoPE rows";
# opt-in, V3.2 only: the default build is the measured one)
WS3_ROPE_ROWS = frozenset()
# formats whose producer lanes run over token rows first (the WS kernel's ROW_LANES, ``_gluon_sparse_decode_ws.
# WS_ROW_LANES``: conflict-free 16-byte stores of the dequantised NoPE chunks into the swizzled ring; module
# docstring, "Row lanes"): V4.1 since session 17 (H200, git b446a4b7f73a, paired rotated rounds, t_rl / t_ws3
# 0.943-0.982 at 5 shapes, bit-identical; results/sparse_decode_ws3_rope-h200-2026-11-29-s17*.json); V3.2 0.994-1.038:
# off
WS3_ROW_LANES = frozenset({"v41"})
# formats whose producer loads each block's indices an iteration ahead / L2-prefetches per thread (module docstring,
# "Index loads ahead"), since session 18 (H200, git 94b454e4060a, paired over 5 rotated rounds, A/A 0.999-1.001,
# bit-identical, results/sparse_decode_ws3_idx-h200-2026-11-30-s18.json): V3.2 IDX_AHEAD 0.919-0.946 of the time at
# b 128 s_q 1 / 2 and b 64 (with PF_LINES too 0.933-0.955); V4.1 IDX_AHEAD + PF_L2 + PF_LINES 0.882-0.898 (IDX_AHEAD
# alone 1.04-1.05: 6 producer spills; PF_L2 + PF_LINES alone 0.941-0.947)
WS3_IDX_AHEAD = frozenset({"v32", "v41"})
WS3_PF_LINES = frozenset({"v41"})
# formats whose softmax warpgroup loads each request's Q by cp.async, all chunks in flight (``_w2_softmax_wg``'s
# ``Q_ASYNC``; session 18's second profile: ~7 us per request piece on 9 serial load -> store round trips). Measured
# (H200, git 2e7f93585c7d, paired 5 rotated rounds, bit-identical; results/sparse_decode_ws3_qasync-h200-2026-11-30-
# s18.json; predicted 0.90-0.95): V3.2 0.966-0.974 (A/A 1.001-1.005) -> on; V4.1 0.988 / 0.988 / 1.053 (that shape's
# A/A 1.034: noise) and V4.1 + FP4 0.989-0.997 -> off
WS3_Q_ASYNC = frozenset({"v32"})
# formats whose softmax warpgroup copies the NEXT request's Q during the current request's epilogue (``Q_AHEAD``,
# module docstring "Q ahead"; session 20, opt-in until measured: no format)
WS3_Q_AHEAD = frozenset()
# What launches WITHOUT an extra cache take by format when the caller leaves the knobs None (the extra-cache entry keeps
# the tables above): V4.1 since session 20 -- Q ahead + the WS kernel's inline-PTX dequant at producer setmaxnreg 144
# ("qhd"). H200, git 6d50be0fba36, benchmarks/device_sparse_decode_s20.sh (24/24 GPU tests, out / lse bit-identical),
# paired 5 rotated rounds, A/A 0.9997-1.0009 (results/sparse_decode_s20-h200-2026-11-30-s20.json), t / t_dispatched at
# h_q 128, topk 2048: qhd 0.9715 / 0.9671 / 0.9630 at (b, s_q) = (64, 1) / (128, 1) / (128, 2); Q ahead alone
# 0.981-0.984, the dequant alone 0.984-0.994. V3.2 Q ahead 1.005-1.014 (off); V4.1 + FP4 (extra cache) Q ahead
# 0.993-0.998 (off: within 0.7 %).
WS3_MAIN_TUNED = {"v41": dict(q_ahead=True, deq_asm=True, producer_regs=144)}
# sparse_decode.py sends the calls WS / WS2 would take (no extra cache, h_q a multiple of 128) here for the formats in
# DISPATCH_FMTS (DEEPKERNELS_SPARSE_WS3=0 / =1 override): both, since session 17 (H200, git 0b54eb4785ad, after the
# softmax-loop spills were removed: 43/43 GPU tests, bit-identical to WS2, ws3 / ws2 1.16-1.25x at 6 shapes,
# results/sparse_decode_ws3-h200-2026-11-29-s17.json).
DISPATCH_FMTS = frozenset({"v32", "v41"})
DISPATCH = True
# ... and only when each CTA gets at least this many 64-token blocks (b * ceil(topk / 64) / scheduler parts; one CTA
# per part, query position and head block): the cluster's fixed costs lose below (session 17, H200, paired rotated
# rounds, results/sparse_decode_ws3_paired-h200-2026-11-29-s17.json, t_ws3 / t_dispatched: 31-124 blocks per CTA
# 0.79-0.85; 15.5 blocks: 0.91-0.99 at topk 2048 but 1.01-1.06 at topk 512 (8 blocks per request); 0.5-4 blocks
# 1.03-1.05)
DISPATCH_MIN_BLOCKS = 24
# extra-cache pairs (main, extra) the public op sends here, since session 18, with the same work threshold (extra
# blocks counted). H200, 35/35 GPU tests of the launcher, 151 + 43 public-op GPU tests (the second run forced WS3);
# t_ws3x / t_ws paired over 5 rotated rounds, topk 2048 + 512: V4.1 + FP4 0.67-0.72 at 39-155 blocks per CTA
# (291-349 TFLOPS vs WS's 209-235), V4.1 + V4.1 0.689, V3.2 + V3.2 0.791 (b 128 s_q 1); the threshold sweep (V4.1 +
# FP4, s_q 1): 29.1 / 31.0 blocks per CTA 0.70 / 0.74, 19.4 / 15.5 0.99, 9.7 1.03, 4.8 1.06
# (results/sparse_decode_ws3_extra-h200-2026-11-29-s18.json, ..._extra_sweep-h200-2026-11-30-s18.json)
DISPATCH_EXTRA_PAIRS = frozenset({("v41", "fp4"), ("v41", "v41"), ("v32", "v32")})
# the launcher drives Triton's compiled-kernel launcher and shared-memory allocation pass directly (internal APIs of
# this exact version): any other Triton never takes the dispatched path
_TRITON_VERSION = "3.6.0"


def _triton_version() -> str:
    try:
        import triton
        return triton.__version__
    except ImportError:  # pragma: no cover - the package depends on triton
        return ""


_TRITON_OK = _triton_version() == _TRITON_VERSION     # read once: dispatch_on runs on every public-op call
# extra caches the extra-cache entry implements beside each main format (the WS kernel's pairs,
# ``_gluon_sparse_decode_ws.WS_EXTRA_PAIRS``); opt-in through the launcher only, never dispatched (module docstring,
# "Extra cache")
WS3_EXTRA_PAIRS = {"v32": ("v32", ), "v41": ("v41", "fp4")}
_HALF_TX = 32768          # bytes the peer pushes into each ring slot per block: 64 rows x 256 bf16 columns


@_jit
def _w3_prefetch_l2(kv_ptr, rec, valid, hb, RB: gl.constexpr):
    """``cp.async.bulk.prefetch.L2`` of this CTA's part of each valid token's record: bytes [0, 256) for head block
    rank 0, [256, RB) for rank 1 (its NoPE half + the scales / RoPE); 16-byte aligned records only."""
    gl.static_assert(RB == 656 or RB == 528)
    r1 = (hb & 1).to(gl.int32) + rec.to(gl.int32) * 0
    ptrs = kv_ptr + rec + r1.to(gl.int64) * 256
    ok = (valid & ((rec & 15) == 0)).to(gl.int32)
    if RB == 656:
        gl.inline_asm_elementwise(
            asm="""{ .reg .pred p, q, a, b; setp.ne.b32 p, $2, 0; setp.ne.b32 q, $3, 0; and.pred a, p, q;
            not.pred q, q; and.pred b, p, q;
            @b cp.async.bulk.prefetch.L2.global [$1], 256; @a cp.async.bulk.prefetch.L2.global [$1], 400;
            mov.u32 $0, 0; }""",
            constraints="=r,l,r,r", args=[ptrs, ok, r1], dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise(
            asm="""{ .reg .pred p, q, a, b; setp.ne.b32 p, $2, 0; setp.ne.b32 q, $3, 0; and.pred a, p, q;
            not.pred q, q; and.pred b, p, q;
            @b cp.async.bulk.prefetch.L2.global [$1], 256; @a cp.async.bulk.prefetch.L2.global [$1], 272;
            mov.u32 $0, 0; }""",
            constraints="=r,l,r,r", args=[ptrs, ok, r1], dtype=gl.int32, is_pure=False, pack=1)


@_jit
def _w3_prefetch_lines(kv_ptr, rec, valid, hb, RB: gl.constexpr, LPF: gl.constexpr):
    """``prefetch.global.L2`` per thread (no uniform-address loop, unlike :func:`_w3_prefetch_l2`'s bulk prefetch)
    of the 128-B lines of this CTA's part of each valid token's record, [0, 256) for head block rank 0, [256, RB)
    for rank 1: 4 addresses per token, ``min(lo + 128 k, hi - 1)`` for k < 4 -- lines L0 .. L0 + 3 from the part's
    first line, and a 16-B aligned part of <= 400 B spans <= 4 lines. ``LPF`` [64, 4]: 2 addresses per producer
    thread, its rows mapped as the chunk layout's token rows (``rec`` / ``valid`` convert without data movement)."""
    gl.static_assert(RB == 656 or RB == 528)
    k = gl.arange(0, 4, gl.SliceLayout(0, LPF))
    r1 = (hb & 1).to(gl.int32)
    lo = r1 * 256
    hi = 256 + r1 * (RB - 256)
    off = gl.minimum(lo + k * 128, hi - 1)
    recl = gl.convert_layout(rec, gl.SliceLayout(1, LPF))
    ok = gl.convert_layout(valid, gl.SliceLayout(1, LPF)).to(gl.int32)
    ptrs = kv_ptr + recl[:, None] + off[None, :].to(gl.int64)
    gl.inline_asm_elementwise(
        asm="""{ .reg .pred p; setp.ne.b32 p, $2, 0; @p prefetch.global.L2 [$1]; mov.u32 $0, 0; }""",
        constraints="=r,l,r", args=[ptrs, ok[:, None] + k[None, :] * 0], dtype=gl.int32, is_pure=False, pack=1)


@_jit
def _w3_prefetch(kv_ptr, idx, valid, page, stride_kb, hb, RB: gl.constexpr, PAGE_SHIFT: gl.constexpr,
                 PF_LINES: gl.constexpr, LPF: gl.constexpr):
    """The L2 prefetch of one block's records (indices ``idx``, ``valid``): per thread (:func:`_w3_prefetch_lines`)
    with ``PF_LINES``, else the bulk prefetch (:func:`_w3_prefetch_l2`)."""
    rec = _g_rows(idx, valid, page, stride_kb, RB, PAGE_SHIFT)
    if PF_LINES:
        _w3_prefetch_lines(kv_ptr, rec, valid, hb, RB, LPF)
    else:
        _w3_prefetch_l2(kv_ptr, rec, valid, hb, RB)


@_jit
def _w3_idx_raw(idx_row, start, t_end, LAY: gl.constexpr):
    """Indices of positions [start, start + 64) in layout LAY, -1 past ``t_end`` (``IDX_AHEAD``: loaded an iteration
    before use; :func:`_w3_idx_valid` gives ``_g_load_idx``'s validity from them)."""
    offs = start + gl.arange(0, 64, LAY)
    return gl.load(idx_row + offs, mask=offs < t_end, other=-1)


@_jit
def _w3_idx_valid(idx, num_tok):
    return (idx >= 0) & (idx < num_tok)


# ----------------------------------------------------------------------------------------------- producer

@_jit
def _w3_load_chunk(kv_ptr, rec, valid, G, LW: gl.constexpr):
    """``_gluon_sparse_decode_ws._w_load_chunk`` with a runtime scale group ``G`` (V3.2: 32 words + 1 fp32 scale)."""
    w = gl.arange(0, 32, gl.SliceLayout(0, LW))
    wp = (kv_ptr + rec).to(gl.pointer_type(gl.int32))
    raw = gl.load(wp[:, None] + (G * 32 + w)[None, :], mask=valid[:, None] & (w >= 0)[None, :], other=0)
    sp = (kv_ptr + rec + (512 + 4 * G)).to(gl.pointer_type(gl.float32))
    sc = gl.load(sp, mask=valid, other=0.0)
    return raw, sc


@_jit
def _w3_load_chunk41(kv_ptr, rec, valid, G, L3: gl.constexpr):
    """``_gluon_sparse_decode_ws._w_load_chunk41`` with a runtime chunk ``G`` (V4.1: 4 UE8M0 groups of 8 words)."""
    g = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    w = gl.arange(0, 8, gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    vm2 = valid[:, None] & (g >= 0)[None, :]
    wp = (kv_ptr + rec).to(gl.pointer_type(gl.int32))
    raw = gl.load((wp[:, None] + (G * 32 + g * 8)[None, :])[:, :, None] + w[None, None, :], mask=vm2[:, :, None],
                  other=0)
    eb = gl.load(kv_ptr + (rec + (512 + 4 * G))[:, None] + g[None, :], mask=vm2, other=127)
    return raw, eb


@_jit
def _w3_load_chunk_fp4(kv_ptr, rec, valid, G, L3: gl.constexpr):
    """``_gluon_sparse_decode_ws._w_load_chunk_fp4`` with a runtime chunk ``G`` of 128 columns (FP4 extra cache,
    288-B records: bytes [64 G, 64 G + 64) of the e2m1 pairs = 8 scale groups of 2 words, their 8 e4m3 scale bytes
    at 256 + 8 G); invalid tokens load zeros."""
    g = gl.arange(0, 8, gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    w = gl.arange(0, 2, gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    vm2 = valid[:, None] & (g >= 0)[None, :]
    wp = (kv_ptr + rec).to(gl.pointer_type(gl.int32))
    raw = gl.load((wp[:, None] + (G * 16 + g * 2)[None, :])[:, :, None] + w[None, None, :], mask=vm2[:, :, None],
                  other=0)
    eb = gl.load(kv_ptr + (rec + (256 + 8 * G))[:, None] + g[None, :], mask=vm2, other=0)
    return raw, eb


@_jit
def _w3_blocks(kv8, kv_p, vmask, ready, empty, kv_ptr, idx_ptr, req, si64, stride_ib, stride_is, t_lo, t_end,
               num_tok, page, stride_kb, it, dr, hb, ring_off, ready_off, lane, gs, peer,
               PAGE_SHIFT: gl.constexpr, FMT: gl.constexpr, DEQ_ASM: gl.constexpr, PF_L2: gl.constexpr,
               ROPE_ROWS: gl.constexpr = False, ROW_LANES: gl.constexpr = False, IDX_AHEAD: gl.constexpr = False,
               PF_LINES: gl.constexpr = False):
    """The producer's block loop over positions [t_lo, t_end) (ring counter ``it`` in and out): per block the
    validity mask, (V3.2) the 64 RoPE rows by cp.async, and this CTA's half of the NoPE columns -- chunks
    ``2 r, 2 r + 1`` (``r = hb & 1``) of 128 columns, dequantised into ``kv8[4 slot + 2 r + c]`` (the ring viewed as
    16 KB pieces of [64, 128]) and each pushed to the peer CTA (:func:`_c_push`); the next block's 2 chunks in flight
    in registers meanwhile (the WS producer's scheme with 2 chunks instead of 4). ``ROW_LANES``: the chunk (and,
    without ``ROPE_ROWS``, the RoPE) layouts' lanes run over token rows first, as the WS producer's (module
    docstring, "Row lanes"). ``FMT`` 3: an FP4 extra cache (288-B records; chunk ``G`` = bytes [64 G, 64 G + 64) of
    the e2m1 pairs + their 8 e4m3 scales, WS's dequantisation; no RoPE tile, as V4.1). ``IDX_AHEAD`` (module
    docstring, "Index loads ahead"): each block's indices are loaded one iteration before they are used (block j + 2
    in iteration j, and with ``PF_L2`` block j + 3 for the prefetch of iteration j + 1), carried in registers.
    ``PF_LINES``: the L2 prefetch per thread (:func:`_w3_prefetch_lines`) instead of the bulk prefetch."""
    LPF: gl.constexpr = gl.BlockedLayout([1, 2], [16, 2], [4, 1], [0, 1] if ROW_LANES else [1, 0])
    if FMT == 0:
        RB: gl.constexpr = 656
        L: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [4, 1], [0, 1] if ROW_LANES else [1, 0])  # [64, 32] words
        LT: gl.constexpr = gl.SliceLayout(1, L)
    elif FMT == 2:
        RB: gl.constexpr = 528
        L: gl.constexpr = gl.BlockedLayout([1, 2, 8], [16, 2, 1], [4, 1, 1],
                                           [2, 0, 1] if ROW_LANES else [2, 1, 0])   # [64, 4, 8] words
        LT: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, L))
    else:   # FMT 3: an FP4 extra cache (288 B/token), WS's [64, 8, 2] words per 128-column chunk
        RB: gl.constexpr = 288
        L: gl.constexpr = gl.BlockedLayout([1, 4, 2], [16, 2, 1], [4, 1, 1], [2, 1, 0])
        LT: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, L))
    if ROPE_ROWS:
        LP4: gl.constexpr = gl.BlockedLayout([4, 8], [4, 8], [4, 1], [1, 0])   # 4 tokens x 8 lanes x 16 B
    else:
        LP4: gl.constexpr = gl.BlockedLayout([1, 32], [16, 2], [4, 1], [0, 1] if ROW_LANES else [1, 0])
    LTP: gl.constexpr = gl.SliceLayout(1, LP4)
    r = hb & 1
    g0 = 2 * r
    nblocks = gl.maximum(t_end - t_lo + 63, 0) // 64
    idx_row = idx_ptr + req.to(gl.int64) * stride_ib + si64 * stride_is
    i0, v = _g_load_idx(idx_row, t_lo, t_end, num_tok, LT)
    if IDX_AHEAD:
        n1 = _w3_idx_raw(idx_row, t_lo + 64, t_end, LT)
        if PF_L2:
            n2 = _w3_idx_raw(idx_row, t_lo + 128, t_end, LT)
    rec = _g_rows(i0, v, page, stride_kb, RB, PAGE_SHIFT)
    if FMT == 0:
        r0, s0 = _w3_load_chunk(kv_ptr, rec, v, g0, L)
        r1, s1 = _w3_load_chunk(kv_ptr, rec, v, g0 + 1, L)
    elif FMT == 2:
        r0, s0 = _w3_load_chunk41(kv_ptr, rec, v, g0, L)
        r1, s1 = _w3_load_chunk41(kv_ptr, rec, v, g0 + 1, L)
    else:
        r0, s0 = _w3_load_chunk_fp4(kv_ptr, rec, v, g0, L)
        r1, s1 = _w3_load_chunk_fp4(kv_ptr, rec, v, g0 + 1, L)
    if PF_L2:
        if IDX_AHEAD:
            ia = n1
            va = _w3_idx_valid(ia, num_tok)
        else:
            ia, va = _g_load_idx(idx_row, t_lo + 64, t_end, num_tok, LT)
        _w3_prefetch(kv_ptr, ia, va, page, stride_kb, hb, RB, PAGE_SHIFT, PF_LINES, LPF)
    for j in range(nblocks):
        slot = it % 2
        t0 = t_lo + j * 64
        if PF_L2:
            if IDX_AHEAD:
                ia = n2
                va = _w3_idx_valid(ia, num_tok)
                n3 = _w3_idx_raw(idx_row, t0 + 192, t_end, LT)
            else:
                ia, va = _g_load_idx(idx_row, t0 + 128, t_end, num_tok, LT)
            _w3_prefetch(kv_ptr, ia, va, page, stride_kb, hb, RB, PAGE_SHIFT, PF_LINES, LPF)
        if FMT == 0:
            if ROPE_ROWS:
                # rec and v packed (rec >= 0 always; -16 marks an invalid token and keeps rec's known divisibility
                # for the 16-byte cp.async), converted to the RoPE gather's layout after the empty wait
                rv = gl.where(v, rec, -16)
                vp = v
            else:
                recp = gl.convert_layout(rec, LTP)
                vp = gl.convert_layout(v, LTP)
                vr = vp
        else:
            vp = v
        if IDX_AHEAD:
            i1 = n1
            v = _w3_idx_valid(i1, num_tok)
            if PF_L2:
                n1 = n2
                n2 = n3
            else:
                n1 = _w3_idx_raw(idx_row, t0 + 128, t_end, LT)
        else:
            i1, v = _g_load_idx(idx_row, t0 + 64, t_end, num_tok, LT)
        rec = _g_rows(i1, v, page, stride_kb, RB, PAGE_SHIFT)
        mbarrier.wait(empty.index(slot), ((it // 2) & 1) ^ 1)       # both CTAs' consumers released the slot
        bar = gs + ready_off + slot * 8
        _c_expect_tx(lane, bar)                                     # the peer's 32 KB of this block
        if FMT == 0:
            if ROPE_ROWS:
                rv = gl.convert_layout(rv, LTP)
                vr = rv >= 0
                recp = gl.maximum(rv, 0)
            pp = (kv_ptr + recp + 528).to(gl.pointer_type(gl.bfloat16))
            async_copy.async_copy_global_to_shared(kv_p.index(slot), pp[:, None] + dr[None, :],
                                                   mask=vr[:, None] & (dr >= 0)[None, :])
        vmask.index(slot).store(vp.to(gl.int8))
        q0 = slot * 4 + g0
        if FMT == 0:
            _w_dequant_store(r0, s0, kv8.index(q0), DEQ_ASM)
            r0, s0 = _w3_load_chunk(kv_ptr, rec, v, g0, L)
        elif FMT == 2:
            _w_dequant_store41(r0, s0, kv8.index(q0), DEQ_ASM)
            r0, s0 = _w3_load_chunk41(kv_ptr, rec, v, g0, L)
        else:
            _w_dequant_store_fp4(r0, s0, kv8.index(q0))
            r0, s0 = _w3_load_chunk_fp4(kv_ptr, rec, v, g0, L)
        fence_async_shared()
        gl.thread_barrier()
        _c_push(lane, gs + ring_off + q0 * 16384, bar, peer)
        if FMT == 0:
            _w_dequant_store(r1, s1, kv8.index(q0 + 1), DEQ_ASM)
            r1, s1 = _w3_load_chunk(kv_ptr, rec, v, g0 + 1, L)
        elif FMT == 2:
            _w_dequant_store41(r1, s1, kv8.index(q0 + 1), DEQ_ASM)
            r1, s1 = _w3_load_chunk41(kv_ptr, rec, v, g0 + 1, L)
        else:
            _w_dequant_store_fp4(r1, s1, kv8.index(q0 + 1))
            r1, s1 = _w3_load_chunk_fp4(kv_ptr, rec, v, g0 + 1, L)
        fence_async_shared()
        gl.thread_barrier()
        _c_push(lane, gs + ring_off + (q0 + 1) * 16384, bar, peer)
        if FMT == 0:
            async_copy.mbarrier_arrive(ready.index(slot))
        mbarrier.arrive(ready.index(slot))
        it += 1
    return it


@_jit
def _w3_producer(kv8, kv_p, vmask, ready, empty, kv_ptr, idx_ptr, len_ptr, meta_ptr, nsplits_ptr, stride_kb, page,
                 num_tok, stride_ib, stride_is, b, s_q, h_q, topk, ring_off, ready_off,
                 PAGE_SHIFT: gl.constexpr, HAS_LEN: gl.constexpr, SBLOCK: gl.constexpr, FMT: gl.constexpr,
                 DEQ_ASM: gl.constexpr, PF_L2: gl.constexpr, ROPE_ROWS: gl.constexpr,
                 ROW_LANES: gl.constexpr = False, xkv_ptr=None, xidx_ptr=None, xlen_ptr=None, stride_xkb=None,
                 xpage=None, xnum_tok=None, stride_xib=None, stride_xis=None, xtopk=None,
                 HAS_EXTRA: gl.constexpr = False, HAS_XLEN: gl.constexpr = False, XPAGE_SHIFT: gl.constexpr = 0,
                 XFMT: gl.constexpr = 0, IDX_AHEAD: gl.constexpr = False, PF_LINES: gl.constexpr = False,
                 TIMELINE: gl.constexpr = False, tl_ptr=None):
    """Worker partition (4 warps): this CTA's half of every block of its (request, block) line (:func:`_w3_blocks`).
    ``HAS_EXTRA`` (the ``x*`` arguments; their defaults without): after a request's main blocks its extra-cache blocks
    (:func:`_gluon_sparse_decode_ws._w_xrange`) of format ``XFMT`` through the same helper, the ring counter running
    on (module docstring, "Extra cache"). ``TIMELINE``: header words 5 / 6 (``_gluon_sparse_decode_ws2.TL_WORDS``;
    outside the loops)."""
    if ROPE_ROWS:
        LP4: gl.constexpr = gl.BlockedLayout([4, 8], [4, 8], [4, 1], [1, 0])   # the RoPE gather's (module docstring)
    else:
        LP4: gl.constexpr = gl.BlockedLayout([1, 32], [16, 2], [4, 1], [0, 1] if ROW_LANES else [1, 0])
    hb, si, begin_req, end_req, begin_blk, end_blk, begin_split = _g_part(meta_ptr, b, s_q, h_q)
    _c_sync()
    if TIMELINE:
        _s_tl_stamp(tl_ptr, -1, 0, 5)                       # header: producer's start cluster barrier passed
    lane = _c_lane()
    gs = _c_smem_base()
    peer = _c_peer_rank()
    si64 = si.to(gl.int64)
    dr = gl.arange(0, 64, gl.SliceLayout(0, LP4))
    it = 0
    for req in range(begin_req, end_req + 1):
        n, base_row, nsp, split, t_lo, _, t_end = _g_req_range(req, begin_req, end_req, begin_blk, end_blk,
                                                               begin_split, len_ptr, nsplits_ptr, topk, HAS_LEN,
                                                               SBLOCK)
        it = _w3_blocks(kv8, kv_p, vmask, ready, empty, kv_ptr, idx_ptr, req, si64, stride_ib, stride_is, t_lo,
                        t_end, num_tok, page, stride_kb, it, dr, hb, ring_off, ready_off, lane, gs, peer, PAGE_SHIFT,
                        FMT, DEQ_ASM, PF_L2, ROPE_ROWS, ROW_LANES, IDX_AHEAD, PF_LINES)
        if HAS_EXTRA:
            x_lo, x_end = _w_xrange(req, end_req, end_blk, split, nsp, n, t_lo, xlen_ptr, xtopk, HAS_XLEN, SBLOCK)
            it = _w3_blocks(kv8, kv_p, vmask, ready, empty, xkv_ptr, xidx_ptr, req, si64, stride_xib, stride_xis, x_lo,
                            x_end, xnum_tok, xpage, stride_xkb, it, dr, hb, ring_off, ready_off, lane, gs, peer,
                            XPAGE_SHIFT, XFMT, DEQ_ASM, False, ROPE_ROWS, ROW_LANES, IDX_AHEAD)
    if TIMELINE:
        _s_tl_stamp(tl_ptr, -1, 0, 6)                       # header: producer's request loop done
    _c_sync()


# ----------------------------------------------------------------------------------------------- consumers

@_jit
def _w3_smem(FMT: gl.constexpr):
    """The WS2 shared memory (``_w2_smem``) with ``empty`` counting 4 arrivals (both CTAs' two consumer warpgroups)
    and ``kv8``, the ring viewed as [8, 64, 128] (16 KB pieces: slot s, columns [128 q, 128 q + 128) is piece
    4 s + q -- NVMMA 128-byte swizzle stores each 64-column strip of 64 rows contiguously)."""
    D_V: gl.constexpr = 512
    SH_N: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, D_V], gl.bfloat16)
    SH_C: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 128], gl.bfloat16)
    SH_P: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
    q_n = gl.allocate_shared_memory(gl.bfloat16, [64, D_V], SH_N)
    kv_n = gl.allocate_shared_memory(gl.bfloat16, [2, 64, D_V], SH_N)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [64, 64], SH_P)
    if FMT == 0:
        q_p = gl.allocate_shared_memory(gl.bfloat16, [64, 64], SH_P)
        kv_p = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 64], SH_P)
    else:
        q_p = p_smem
        kv_p = p_smem
    a_smem = gl.allocate_shared_memory(gl.float32, [64], gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    vmask = gl.allocate_shared_memory(gl.int8, [2, 64], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    pready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    pfree = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=4)      # softmax WG + PV WG of this CTA and of the peer
    mbarrier.init(pready, count=1)
    mbarrier.init(pfree, count=1)
    kv8 = kv_n._reinterpret(gl.bfloat16, [8, 64, 128], SH_C)
    return q_n, q_p, kv_n, kv8, kv_p, p_smem, a_smem, vmask, ready, empty, pready, pfree


_NO_SPEC = ["page", "num_tok", "b", "s_q", "h_q", "topk", "acc_rows", "ring_off", "ready_off", "empty_off"]


@_jit(do_not_specialize=_NO_SPEC)
def _sparse_decode_gluon_ws3_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
    stride_qb, stride_qs, stride_qh, stride_kb, page, num_tok, stride_ib, stride_is,
    b, s_q, h_q, topk, acc_rows, sm_scale_log2, ring_off, ready_off, empty_off,
    PAGE_SHIFT: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, SBLOCK: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, FMT: gl.constexpr, DEQ_ASM: gl.constexpr, PV_REGS: gl.constexpr,
    PF_L2: gl.constexpr, Q_AHEAD: gl.constexpr, ROPE_ROWS: gl.constexpr, ROW_LANES: gl.constexpr,
    IDX_AHEAD: gl.constexpr = False, PF_LINES: gl.constexpr = False, Q_ASYNC: gl.constexpr = False,
):
    """WS2's arguments + the shared offsets of the ring / ``ready`` / ``empty`` (:func:`smem_offsets`). Launched as
    2-CTA clusters only (:func:`launch_sparse_decode_gluon_ws3`)."""
    _w3_body(q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
             stride_qb, stride_qs, stride_qh, stride_kb, page, num_tok, stride_ib, stride_is,
             b, s_q, h_q, topk, acc_rows, sm_scale_log2, ring_off, ready_off, empty_off,
             PAGE_SHIFT, HAS_LEN, HAS_SINK, SBLOCK, PRODUCER_REGS, FMT, DEQ_ASM, PV_REGS, PF_L2, Q_AHEAD, ROPE_ROWS,
             ROW_LANES, IDX_AHEAD, PF_LINES, Q_ASYNC)


@_jit(do_not_specialize=_NO_SPEC)
def _sparse_decode_gluon_ws3_tl_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
    stride_qb, stride_qs, stride_qh, stride_kb, page, num_tok, stride_ib, stride_is,
    b, s_q, h_q, topk, acc_rows, sm_scale_log2, ring_off, ready_off, empty_off,
    PAGE_SHIFT: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, SBLOCK: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, FMT: gl.constexpr, DEQ_ASM: gl.constexpr, PV_REGS: gl.constexpr,
    PF_L2: gl.constexpr, Q_AHEAD: gl.constexpr, ROPE_ROWS: gl.constexpr, ROW_LANES: gl.constexpr,
    IDX_AHEAD: gl.constexpr = False, PF_LINES: gl.constexpr = False, Q_ASYNC: gl.constexpr = False,
    tl_ptr=None,
):
    """TIMELINE entry (opt-in, never dispatched; launcher keyword ``timeline``, :class:`_ClusterLauncherTL`):
    :func:`_sparse_decode_gluon_ws3_kernel`'s parameters + the int64 buffer ``tl_ptr`` (last; layout
    ``_gluon_sparse_decode_ws2.TL_WORDS``), the same body with TIMELINE on. A separate entry, so the dispatched
    kernel's parameters and PTX are untouched."""
    _w3_body(q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
             stride_qb, stride_qs, stride_qh, stride_kb, page, num_tok, stride_ib, stride_is,
             b, s_q, h_q, topk, acc_rows, sm_scale_log2, ring_off, ready_off, empty_off,
             PAGE_SHIFT, HAS_LEN, HAS_SINK, SBLOCK, PRODUCER_REGS, FMT, DEQ_ASM, PV_REGS, PF_L2, Q_AHEAD, ROPE_ROWS,
             ROW_LANES, IDX_AHEAD, PF_LINES, Q_ASYNC, True, tl_ptr)


@_jit
def _w3_body(q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
             stride_qb, stride_qs, stride_qh, stride_kb, page, num_tok, stride_ib, stride_is,
             b, s_q, h_q, topk, acc_rows, sm_scale_log2, ring_off, ready_off, empty_off,
             PAGE_SHIFT: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, SBLOCK: gl.constexpr,
             PRODUCER_REGS: gl.constexpr, FMT: gl.constexpr, DEQ_ASM: gl.constexpr, PV_REGS: gl.constexpr,
             PF_L2: gl.constexpr, Q_AHEAD: gl.constexpr, ROPE_ROWS: gl.constexpr, ROW_LANES: gl.constexpr,
             IDX_AHEAD: gl.constexpr, PF_LINES: gl.constexpr, Q_ASYNC: gl.constexpr,
             TIMELINE: gl.constexpr = False, tl_ptr=None):
    """The no-extra kernel's body (shared by the dispatched entry and the TIMELINE entry)."""
    q_n, q_p, kv_n, kv8, kv_p, p_smem, a_smem, vmask, ready, empty, pready, pfree = _w3_smem(FMT)
    _c_init_fence(h_q)
    gl.warp_specialize([
        (_w2_softmax_wg, (q_n, q_p, kv_n, kv_p, p_smem, a_smem, vmask, ready, empty, pready, pfree, q_ptr,
                          len_ptr, sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
                          stride_qb, stride_qs, stride_qh, b, s_q, h_q, topk, acc_rows, sm_scale_log2, HAS_LEN,
                          HAS_SINK, SBLOCK, FMT, empty_off, True, None, None, False, False, Q_ASYNC, Q_AHEAD,
                          TIMELINE, tl_ptr)),
        (_w2_pv_wg, (kv_n, p_smem, a_smem, ready, empty, pready, pfree, len_ptr, meta_ptr, nsplits_ptr, out_ptr,
                     oacc_ptr, b, s_q, h_q, topk, acc_rows, HAS_LEN, SBLOCK, empty_off, True, None, None, False,
                     False, TIMELINE, tl_ptr)),
        (_w3_producer, (kv8, kv_p, vmask, ready, empty, kv_ptr, idx_ptr, len_ptr, meta_ptr, nsplits_ptr,
                        stride_kb, page, num_tok, stride_ib, stride_is, b, s_q, h_q, topk, ring_off, ready_off,
                        PAGE_SHIFT, HAS_LEN, SBLOCK, FMT, DEQ_ASM, PF_L2, ROPE_ROWS, ROW_LANES, None, None, None,
                        None, None, None, None, None, None, False, False, 0, 0, IDX_AHEAD, PF_LINES, TIMELINE,
                        tl_ptr)),
    ], [4, 4], [PV_REGS, PRODUCER_REGS])


_NO_SPEC_X = _NO_SPEC + ["xpage", "xnum_tok", "xtopk"]


@_jit(do_not_specialize=_NO_SPEC_X)
def _sparse_decode_gluon_ws3_x_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, xkv_ptr, xidx_ptr, xlen_ptr, sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr,
    oacc_ptr, lacc_ptr,
    stride_qb, stride_qs, stride_qh, stride_kb, page, num_tok, stride_ib, stride_is,
    stride_xkb, xpage, xnum_tok, stride_xib, stride_xis,
    b, s_q, h_q, topk, xtopk, acc_rows, sm_scale_log2, ring_off, ready_off, empty_off,
    PAGE_SHIFT: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, SBLOCK: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, FMT: gl.constexpr, DEQ_ASM: gl.constexpr, PV_REGS: gl.constexpr,
    PF_L2: gl.constexpr, Q_AHEAD: gl.constexpr, ROPE_ROWS: gl.constexpr, ROW_LANES: gl.constexpr,
    IDX_AHEAD: gl.constexpr = False, PF_LINES: gl.constexpr = False, Q_ASYNC: gl.constexpr = False,
    XPAGE_SHIFT: gl.constexpr = 6,
    HAS_XLEN: gl.constexpr = False, XFMT: gl.constexpr = 3,
):
    """With an extra cache (module docstring, "Extra cache"): the WS x kernel's runtime arguments
    (``_gluon_sparse_decode_ws._sparse_decode_gluon_ws_x_kernel``) + the shared offsets, the no-extra kernel's
    constexprs, then the extra ones. A separate entry, so the no-extra kernel's parameters and PTX are untouched.
    Pairs :data:`WS3_EXTRA_PAIRS`: V3.2 + V3.2 (FMT 0, XFMT 0), V4.1 + V4.1 (2, 2), V4.1 + FP4 (2, 3)."""
    q_n, q_p, kv_n, kv8, kv_p, p_smem, a_smem, vmask, ready, empty, pready, pfree = _w3_smem(FMT)
    _c_init_fence(h_q)
    gl.warp_specialize([
        (_w2_softmax_wg, (q_n, q_p, kv_n, kv_p, p_smem, a_smem, vmask, ready, empty, pready, pfree, q_ptr,
                          len_ptr, sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
                          stride_qb, stride_qs, stride_qh, b, s_q, h_q, topk, acc_rows, sm_scale_log2, HAS_LEN,
                          HAS_SINK, SBLOCK, FMT, empty_off, True, xlen_ptr, xtopk, True, HAS_XLEN, Q_ASYNC, Q_AHEAD)),
        (_w2_pv_wg, (kv_n, p_smem, a_smem, ready, empty, pready, pfree, len_ptr, meta_ptr, nsplits_ptr, out_ptr,
                     oacc_ptr, b, s_q, h_q, topk, acc_rows, HAS_LEN, SBLOCK, empty_off, True, xlen_ptr, xtopk,
                     True, HAS_XLEN)),
        (_w3_producer, (kv8, kv_p, vmask, ready, empty, kv_ptr, idx_ptr, len_ptr, meta_ptr, nsplits_ptr,
                        stride_kb, page, num_tok, stride_ib, stride_is, b, s_q, h_q, topk, ring_off, ready_off,
                        PAGE_SHIFT, HAS_LEN, SBLOCK, FMT, DEQ_ASM, PF_L2, ROPE_ROWS, ROW_LANES, xkv_ptr,
                        xidx_ptr, xlen_ptr, stride_xkb, xpage, xnum_tok, stride_xib, stride_xis, xtopk, True,
                        HAS_XLEN, XPAGE_SHIFT, XFMT, IDX_AHEAD, PF_LINES)),
    ], [4, 4], [PV_REGS, PRODUCER_REGS])


# ----------------------------------------------------------------------------------------------- host code

_ALLOC_RE = re.compile(r"%(\w+) = ttg\.local_alloc \{allocation\.offset = (\d+) : i32\}")


def smem_offsets(ttgir: str) -> dict:
    """Shared-memory offsets of the kernel's named allocations (``{"kv_n": 0, "ready": ..., ...}``): Triton's own
    shared-memory allocation pass (the passes ``make_llir`` runs before it, Triton 3.6) applied to the compiled
    kernel's TTGIR -- the offsets the lowering then uses (``global_smem + offset``)."""
    from triton._C.libtriton import ir, passes, nvidia
    from triton.backends.compiler import GPUTarget
    from triton.backends.nvidia import compiler as nvc
    ctx = ir.context()
    ir.load_dialects(ctx)
    backend = nvc.CUDABackend(GPUTarget("cuda", 90, 32))
    backend.load_dialects(ctx)
    with tempfile.NamedTemporaryFile("w", suffix=".ttgir", delete=False) as f:
        f.write(ttgir)
    try:
        mod = ir.parse_mlir_module(f.name, ctx)
    finally:
        os.unlink(f.name)
    pm = ir.pass_manager(ctx)
    passes.ttgpuir.add_combine_tensor_select_and_if(pm)
    passes.ttgpuir.add_allocate_warp_groups(pm)
    passes.convert.add_scf_to_cf(pm)
    passes.gluon.add_inliner(pm)
    ptx_version = nvc.get_ptx_version_from_options(backend.parse_options({}), 90)
    nvidia.passes.ttgpuir.add_allocate_shared_memory_nv(pm, 90, ptx_version)
    pm.run(mod, "ws3_smem_offsets")
    return {name: int(off) for name, off in _ALLOC_RE.findall(str(mod))}


def _offset_args(ttgir: str) -> tuple:
    """(ring_off, ready_off, empty_off) for the kernel; ValueError if the allocations are not found."""
    offs = smem_offsets(ttgir)
    try:
        return offs["kv_n"], offs["ready"], offs["empty"]
    except KeyError as e:
        raise ValueError(f"ws3: shared allocation {e} not found in the TTGIR (found {sorted(offs)})") from None


def dispatch_on(fmt: str, xfmt: str | None = None) -> bool:
    """Whether sparse_decode.py sends a call with main-cache format ``fmt`` (and extra-cache format ``xfmt``, None
    without one) that WS / WS2 would take here when :func:`supported_ws3`: ``fmt in DISPATCH_FMTS`` without an extra
    cache, ``(fmt, xfmt) in DISPATCH_EXTRA_PAIRS`` with one (with :data:`DISPATCH`), and Triton
    :data:`_TRITON_VERSION`; ``DEEPKERNELS_SPARSE_WS3=1`` / ``=0`` override the format choice (read per call; ``=1``
    still needs a pair of :data:`WS3_EXTRA_PAIRS`, which :func:`supported_ws3` checks)."""
    if not _TRITON_OK:
        return False
    env = os.environ.get("DEEPKERNELS_SPARSE_WS3", "")
    if env in ("0", "1"):
        return env == "1"
    if xfmt is not None:
        return DISPATCH and (fmt, xfmt) in DISPATCH_EXTRA_PAIRS
    return DISPATCH and fmt in DISPATCH_FMTS


def enough_work(b: int, topk: int, parts: int, extra_topk: int = 0) -> bool:
    """Whether a dispatched call (:func:`dispatch_on`) has enough blocks per CTA for the cluster kernel to win:
    ``b * (ceil(topk / 64) + ceil(extra_topk / 64)) >= DISPATCH_MIN_BLOCKS * parts`` (``parts`` = the schedule's SM
    parts; ``extra_topk`` 0 without an extra cache); always True under ``DEEPKERNELS_SPARSE_WS3=1``."""
    if os.environ.get("DEEPKERNELS_SPARSE_WS3", "") == "1":
        return True
    return b * (-(-topk // 64) + -(-extra_topk // 64)) >= DISPATCH_MIN_BLOCKS * parts


def extends_ws(q: torch.Tensor, fmt: str, xfmt=None) -> bool:
    """What this kernel needs beyond the WS kernel's gate (``_gluon_sparse_decode_ws.supported_ws``): h_q a multiple
    of 128 (two 64-head blocks per cluster) and, with an extra cache of format ``xfmt``, a pair of
    :data:`WS3_EXTRA_PAIRS` (sparse_decode.py asks only this once the WS gate passed)."""
    return q.shape[2] % 128 == 0 and (xfmt is None or xfmt in WS3_EXTRA_PAIRS.get(fmt, ()))


def supported_ws3(q: torch.Tensor, k_cache: torch.Tensor, fmt: str, extra_k_cache=None, config=None) -> bool:
    """:func:`extends_ws` and the WS kernel's gate (``supported_ws``; without an extra cache that is
    ``supported_ws2``)."""
    xfmt = None if extra_k_cache is None else _xfmt(extra_k_cache)
    return extends_ws(q, fmt, xfmt) and _ws.supported_ws(q, k_cache, fmt, extra_k_cache, config)


class _ClusterLauncher:
    """One compiled specialisation launched as 2-CTA clusters: compiled through the JIT without launching
    (``warmup``), its shared offsets read once (:func:`smem_offsets`), then every call goes through the compiled
    kernel's CUDA launcher with the packed metadata ``(num_warps, 2, shared)`` -- Triton's launcher then launches
    ``2 x gridX`` CTAs with cluster dimension (2, 1, 1)."""

    __slots__ = ("meta", "kernel", "offsets", "packed", "tail", "run", "function")

    def __init__(self, meta: dict):
        self.meta = meta
        self.kernel = None

    def _jit_kernel(self):
        """The JIT kernel this launcher compiles (read at the first call: a test's stand-in module attribute counts;
        subclasses for other cluster kernels override this only)."""
        return _sparse_decode_gluon_ws3_kernel

    def __call__(self, gx: int, args: tuple, scale_log2: float, timeline=None):
        """Launch ``2 x gx`` CTAs: ``args`` = the kernel's runtime arguments before ``sm_scale_log2``; the shared
        offsets (``ring_off``, ``ready_off``, ``empty_off``) follow it, then the constexprs of ``meta`` (parameters
        after them that ``meta`` does not name -- ``tl_ptr`` / ``TIMELINE`` -- take their defaults). ``timeline``
        (:class:`_ClusterLauncherTL` only): this call's buffer, passed as ``tl_ptr``."""
        fn = self._jit_kernel()
        if self.kernel is None:
            extra = {} if timeline is None else {"tl_ptr": timeline}
            k = fn.warmup(*args, scale_log2, 0, 0, 0, grid=(gx, ), **self.meta, **extra)
            self.offsets = _offset_args(k.asm["ttgir"])
            self.packed = (k.metadata.num_warps, 2, k.metadata.shared)
            params = fn.params[len(args) + 4:]
            self.tail = tuple(self.meta[p.name] if p.name in self.meta else getattr(p, "default", None)
                              for p in params)
            self.run = k.run
            self.function = k.function
            self.kernel = k
        stream = torch.cuda.current_stream().cuda_stream
        tail = self.tail
        if timeline is not None:     # tl_ptr: the TIMELINE entry's last parameter
            tail = tail[:-1] + (timeline, )
        self.run(gx, 1, 1, stream, self.function, self.packed, None, None, None, *args, scale_log2, *self.offsets,
                 *tail)


class _ClusterLauncherTL(_ClusterLauncher):
    """:class:`_ClusterLauncher` of the TIMELINE entry :func:`_sparse_decode_gluon_ws3_tl_kernel` (same arguments,
    then ``tl_ptr``: each call passes its buffer as ``timeline``)."""

    __slots__ = ()

    def _jit_kernel(self):
        return _sparse_decode_gluon_ws3_tl_kernel


class _ClusterLauncherX(_ClusterLauncher):
    """:class:`_ClusterLauncher` of the extra-cache entry :func:`_sparse_decode_gluon_ws3_x_kernel` (same argument
    tail: runtime arguments, ``sm_scale_log2``, the three shared offsets, the constexprs)."""

    __slots__ = ()

    def _jit_kernel(self):
        return _sparse_decode_gluon_ws3_x_kernel


def _rope_rows(fmt: str, rope_rows) -> bool:
    """The ROPE_ROWS constexpr: ``rope_rows`` (default :data:`WS3_ROPE_ROWS` by format); V3.2 only (V4.1 has no
    bf16 RoPE rows to gather -- its RoPE is part of the 512 dequantised FP8 columns), so V4.1 never compiles a
    second specialisation."""
    return bool((fmt in WS3_ROPE_ROWS) if rope_rows is None else rope_rows) and fmt == "v32"


def _row_lanes(fmt: str, row_lanes) -> bool:
    """The ROW_LANES constexpr: ``row_lanes`` (default :data:`WS3_ROW_LANES` by format); both formats (the WS
    kernel's V4.1 row-lanes layout exists, it measured slower there)."""
    return bool((fmt in WS3_ROW_LANES) if row_lanes is None else row_lanes)


def _idx_ahead(fmt: str, idx_ahead) -> bool:
    """The IDX_AHEAD constexpr: ``idx_ahead`` (default :data:`WS3_IDX_AHEAD` by format)."""
    return bool((fmt in WS3_IDX_AHEAD) if idx_ahead is None else idx_ahead)


def _pf_lines(fmt: str, pf_lines) -> bool:
    """The PF_LINES constexpr: ``pf_lines`` (default :data:`WS3_PF_LINES` by format); only read with PF_L2."""
    return bool((fmt in WS3_PF_LINES) if pf_lines is None else pf_lines)


def _q_async(fmt: str, q_async, q: torch.Tensor | None = None) -> bool:
    """The Q_ASYNC constexpr: ``q_async`` (default :data:`WS3_Q_ASYNC` by format), and, given ``q``, only when its
    base is 16-byte aligned and its batch / position / head strides are multiples of 16 elements: the 16-byte
    cp.async needs the divisibility Triton only derives for multiples of 16 (a head stride of 584 elements has
    16-byte rows, but the kernel would compile 2-byte cp.async, which does not exist: such q keep the plain loads;
    tests/test_review_s18.py)."""
    on = bool((fmt in WS3_Q_ASYNC) if q_async is None else q_async)
    return on and (q is None or triton_aligned(q, *q.stride()[:3]))


def _q_ahead(fmt: str, q_ahead, q: torch.Tensor | None = None) -> bool:
    """The Q_AHEAD constexpr: ``q_ahead`` (default :data:`WS3_Q_AHEAD` by format), with :func:`_q_async`'s gate on
    ``q`` (16-byte cp.async: base and batch / position / head strides multiples of 16 elements); otherwise the build
    without it runs."""
    on = bool((fmt in WS3_Q_AHEAD) if q_ahead is None else q_ahead)
    return on and (q is None or triton_aligned(q, *q.stride()[:3]))


def _launch_device(q: torch.Tensor) -> int:
    """The device part of a cluster launcher's key: the CURRENT CUDA device (its ``warmup`` loads the compiled function
    into that device's context and every launch goes to that device's current stream, as Triton launches), never
    ``q``'s -- a function loaded for one device must not be launched on another; -1 for CPU tensors (stubbed tests)."""
    return torch.cuda.current_device() if q.is_cuda else -1


_LAUNCHERS: dict = {}
_LAUNCHER_LIMIT = 256
_CONSTEXPRS = ("PAGE_SHIFT", "HAS_LEN", "HAS_SINK", "SBLOCK", "PRODUCER_REGS", "FMT", "DEQ_ASM", "PV_REGS", "PF_L2",
               "Q_AHEAD", "ROPE_ROWS", "ROW_LANES", "IDX_AHEAD", "PF_LINES", "Q_ASYNC")
_CONSTEXPRS_X = _CONSTEXPRS + ("XPAGE_SHIFT", "HAS_XLEN", "XFMT")


def launch_sparse_decode_gluon_ws3(out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt, attn_sink=None,
                                   extra_k_cache=None, extra_indices=None, xfmt=None, topk_length=None,
                                   extra_topk_length=None, config=None, _spec=None, *, timeline=None, pv_regs=None,
                                   producer_regs=None, maxnreg=None, deq_asm=None, pf_l2=None, q_ahead=None,
                                   rope_rows=None, row_lanes=None, idx_ahead=None, pf_lines=None, q_async=None):
    """Drop-in for ``launch_sparse_decode_gluon_ws2`` (same arguments and outputs; ``config`` ignored). ``h_q`` not
    a multiple of 128: the WS2 launcher runs the call. Keyword knobs (benchmarks): PV / producer ``setmaxnreg``,
    launch ``maxnreg``, ``deq_asm`` / ``pf_l2`` (default :data:`WS3_DEQ_ASM` / :data:`WS3_PF_L2` by format),
    ``rope_rows`` (V3.2 RoPE gather 4 tokens x 8 lanes per cp.async, default :data:`WS3_ROPE_ROWS`; module
    docstring, "RoPE rows"), ``row_lanes`` (producer lanes over token rows first, default :data:`WS3_ROW_LANES`;
    module docstring, "Row lanes"), ``idx_ahead`` / ``pf_lines`` (default :data:`WS3_IDX_AHEAD` /
    :data:`WS3_PF_LINES`; module docstring, "Index loads ahead"), ``q_async`` (default :data:`WS3_Q_ASYNC`: Q by
    cp.async), ``q_ahead`` (default :data:`WS3_Q_AHEAD`: the next request's Q copied during this request's epilogue;
    module docstring, "Q ahead"). Without an extra cache, knobs left None take :data:`WS3_MAIN_TUNED` for the format
    first (V4.1: ``q_ahead``, ``deq_asm`` and producer registers 144). With an extra cache (dispatched for :data:`DISPATCH_EXTRA_PAIRS`; module
    docstring, "Extra cache"):
    the pairs :data:`WS3_EXTRA_PAIRS` run on :func:`_sparse_decode_gluon_ws3_x_kernel` (h_q not a multiple of 128:
    on the WS kernel's extra-cache entry), any other pair raises ValueError. ``timeline``: None (every dispatched
    call), or a ZEROED contiguous int64 CUDA tensor ``[CTAs, TL_WORDS]`` (CTAs = parts * s_q * h_q / 64; layout
    ``_gluon_sparse_decode_ws2.TL_WORDS``) that the TIMELINE build (same math, a few stamps per request piece) fills;
    no extra cache, h_q a multiple of 128 (else ValueError)."""
    from .combine import combine_splits_
    from .metadata import SCHED_BLOCK

    has_x = extra_k_cache is not None
    xf = (xfmt or _xfmt(extra_k_cache)) if has_x else None
    tuned = WS3_MAIN_TUNED.get(fmt) if not has_x else None
    if tuned:          # the measured main-cache defaults (WS3_MAIN_TUNED); explicit knobs win
        q_ahead = tuned["q_ahead"] if q_ahead is None else q_ahead
        deq_asm = tuned["deq_asm"] if deq_asm is None else deq_asm
        producer_regs = producer_regs or tuned["producer_regs"]
    if fmt not in WS_FMTS or (has_x and xf not in WS3_EXTRA_PAIRS[fmt]):
        raise ValueError(f"launch_sparse_decode_gluon_ws3: main cache {fmt!r}, extra cache {xf!r}: V3.2 or V4.1 main "
                         f"cache, no extra cache or {WS3_EXTRA_PAIRS} only")
    b, s_q, h_q, _ = q.shape
    if timeline is not None and (h_q % 128 or has_x):
        raise ValueError("timeline: the no-extra cluster kernel only (h_q a multiple of 128, no extra cache)")
    if h_q % 128:
        if has_x:
            return _ws.launch_sparse_decode_gluon_ws(out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt,
                                                     attn_sink, extra_k_cache, extra_indices, xfmt, topk_length,
                                                     extra_topk_length, config, _spec)
        return _ws2.launch_sparse_decode_gluon_ws2(out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt,
                                                   attn_sink, None, None, None, topk_length, None, config, _spec)
    parts = sched.shape[0]
    o_acc, l_acc, acc_rows = _ws._acc_buffers(out, lse_buf, q, sched)
    kv = k_cache.view(torch.uint8)
    topk = indices.shape[2]
    if has_x:      # the WS x kernel's argument list (extra cache, indices, lengths after the main ones)
        dummy = l_acc
        xkv = extra_k_cache.view(torch.uint8)
        xtopk = extra_indices.shape[2]
        ptrs = (q, kv, indices, topk_length if topk_length is not None else dummy, xkv, extra_indices,
                extra_topk_length if extra_topk_length is not None else dummy,
                attn_sink if attn_sink is not None else dummy, sched, num_splits, out, lse_buf, o_acc, l_acc)
        ints = (q.stride(0), q.stride(1), q.stride(2), kv.stride(0), kv.shape[1], kv.shape[0] * kv.shape[1],
                indices.stride(0), indices.stride(1), xkv.stride(0), xkv.shape[1], xkv.shape[0] * xkv.shape[1],
                extra_indices.stride(0), extra_indices.stride(1), b, s_q, h_q, topk, xtopk, acc_rows)
    else:
        ptrs, ints = _ws._main_args(out, lse_buf, q, kv, indices, sched, num_splits, attn_sink, topk_length, o_acc,
                                    l_acc, acc_rows)
    spec = _ws._launch_spec(_spec, ptrs, ints, acc_rows, sched, num_splits)
    constexprs = (_page_shift(kv.shape[1]), topk_length is not None, attn_sink is not None, SCHED_BLOCK,
                  producer_regs or WS3_PRODUCER_REGS[fmt], GLUON_FMTS[fmt],
                  bool((fmt in WS3_DEQ_ASM) if deq_asm is None else deq_asm), pv_regs or WS2_PV_REGS,
                  bool((fmt in WS3_PF_L2) if pf_l2 is None else pf_l2), _q_ahead(fmt, q_ahead, q),
                  _rope_rows(fmt, rope_rows), _row_lanes(fmt, row_lanes), _idx_ahead(fmt, idx_ahead),
                  _pf_lines(fmt, pf_lines), _q_async(fmt, q_async, q))
    names, cls = _CONSTEXPRS, _ClusterLauncher
    if timeline is not None:
        ctas = parts * s_q * (h_q // BLOCK_H)
        if (has_x or timeline.dtype != torch.int64 or tuple(timeline.shape) != (ctas, TL_WORDS)
                or not timeline.is_contiguous() or timeline.device != q.device):
            raise ValueError(f"timeline must be a contiguous int64 [{ctas}, {TL_WORDS}] tensor on {q.device} (no "
                             f"extra cache), got {timeline.dtype} {tuple(timeline.shape)} on {timeline.device}")
        cls = _ClusterLauncherTL
    if has_x:
        names, cls = _CONSTEXPRS_X, _ClusterLauncherX
        constexprs += (_page_shift(xkv.shape[1]), extra_topk_length is not None, _XFMT_CODES[xf])
    opts = (WS3_NUM_WARPS, maxnreg or WS_MAXNREG)
    key = (names, constexprs, opts, spec, _launch_device(q))
    if timeline is not None:
        key += ("timeline", )
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        if len(_LAUNCHERS) >= _LAUNCHER_LIMIT:
            _LAUNCHERS.clear()
        launcher = _LAUNCHERS[key] = cls(dict(zip(names, constexprs), num_warps=opts[0], maxnreg=opts[1]))
    if timeline is None:
        launcher(parts * s_q * (h_q // BLOCK_H) // 2, (*ptrs, *ints), scale * _ws2._LOG2E)
    else:
        launcher(parts * s_q * (h_q // BLOCK_H) // 2, (*ptrs, *ints), scale * _ws2._LOG2E, timeline)
    combine_splits_(out, lse_buf.transpose(1, 2), o_acc, l_acc, num_splits, attn_sink=attn_sink,
                    lengths=topk_length, topk=topk, extra_lengths=extra_topk_length if has_x else None,
                    extra_topk=xtopk if has_x else None, rne=False, _spec=_spec)


def compile_sm90_ws3(fmt: str = "v32", page_shift: int = 6, has_len: bool = True, has_sink: bool = True,
                     pv_regs=None, producer_regs=None, maxnreg=None, deq_asm=None, pf_l2=None, q_ahead=None,
                     rope_rows=None, row_lanes=None, idx_ahead=None, pf_lines=None, q_async=None):
    """Cross-compile the kernel for sm90 (no GPU needed), the launch's divisibility facts. Returns the
    CompiledKernel (``.asm['ptx']``, ``.asm['ttgir']``, ``.metadata.shared``). With an extra cache:
    :func:`compile_sm90_ws3_extra`; the TIMELINE entry: :func:`compile_sm90_ws3_tl`."""
    return _compile_ws3(fmt, page_shift, has_len, has_sink, pv_regs, producer_regs, maxnreg, deq_asm, pf_l2,
                        rope_rows, row_lanes, idx_ahead=idx_ahead, pf_lines=pf_lines, q_async=q_async,
                        q_ahead=q_ahead)


def compile_sm90_ws3_tl(fmt: str = "v32", page_shift: int = 6, has_len: bool = True, has_sink: bool = True,
                        **knobs):
    """:func:`compile_sm90_ws3` (same knobs) of the TIMELINE entry :func:`_sparse_decode_gluon_ws3_tl_kernel`."""
    return _compile_ws3(fmt, page_shift, has_len, has_sink, knobs.pop("pv_regs", None),
                        knobs.pop("producer_regs", None), knobs.pop("maxnreg", None), knobs.pop("deq_asm", None),
                        knobs.pop("pf_l2", None), knobs.pop("rope_rows", None), knobs.pop("row_lanes", None),
                        timeline=True, **knobs)


def compile_sm90_ws3_extra(fmt: str = "v41", xfmt: str = "fp4", page_shift: int = 6, has_len: bool = True,
                           has_sink: bool = True, xpage_shift: int = 6, has_xlen: bool = True, pv_regs=None,
                           producer_regs=None, maxnreg=None, deq_asm=None, pf_l2=None, q_ahead=None,
                           rope_rows=None, row_lanes=None, idx_ahead=None, pf_lines=None, q_async=None):
    """:func:`compile_sm90_ws3` of the extra-cache entry :func:`_sparse_decode_gluon_ws3_x_kernel` (a pair of
    :data:`WS3_EXTRA_PAIRS`, else ValueError), with the extra cache's page shift and lengths flag."""
    if xfmt not in WS3_EXTRA_PAIRS.get(fmt, ()):
        raise ValueError(f"no WS3 kernel for main cache {fmt!r} + extra cache {xfmt!r}")
    return _compile_ws3(fmt, page_shift, has_len, has_sink, pv_regs, producer_regs, maxnreg, deq_asm, pf_l2,
                        rope_rows, row_lanes, xfmt, xpage_shift, has_xlen, idx_ahead, pf_lines, q_async, q_ahead)


def _compile_ws3(fmt, page_shift, has_len, has_sink, pv_regs, producer_regs, maxnreg, deq_asm, pf_l2, rope_rows,
                 row_lanes, xfmt=None, xpage_shift=6, has_xlen=True, idx_ahead=None, pf_lines=None, q_async=None,
                 q_ahead=None, timeline=False):
    if xfmt is not None:
        fn = _sparse_decode_gluon_ws3_x_kernel
        sig = dict(q_ptr="*bf16", kv_ptr="*u8", idx_ptr="*i32", len_ptr="*i32", xkv_ptr="*u8", xidx_ptr="*i32",
                   xlen_ptr="*i32", sink_ptr="*fp32", meta_ptr="*i32", nsplits_ptr="*i32", out_ptr="*bf16",
                   lse_ptr="*fp32", oacc_ptr="*fp32", lacc_ptr="*fp32",
                   stride_qb="i32", stride_qs="i32", stride_qh="i32", stride_kb="i32", page="i32", num_tok="i32",
                   stride_ib="i32", stride_is="i32", stride_xkb="i32", xpage="i32", xnum_tok="i32",
                   stride_xib="i32", stride_xis="i32", b="i32", s_q="i32", h_q="i32", topk="i32", xtopk="i32",
                   acc_rows="i32", sm_scale_log2="fp32", ring_off="i32", ready_off="i32", empty_off="i32")
    else:
        fn = _sparse_decode_gluon_ws3_kernel
        sig = dict(q_ptr="*bf16", kv_ptr="*u8", idx_ptr="*i32", len_ptr="*i32", sink_ptr="*fp32", meta_ptr="*i32",
                   nsplits_ptr="*i32", out_ptr="*bf16", lse_ptr="*fp32", oacc_ptr="*fp32", lacc_ptr="*fp32",
                   stride_qb="i32", stride_qs="i32", stride_qh="i32", stride_kb="i32", page="i32", num_tok="i32",
                   stride_ib="i32", stride_is="i32", b="i32", s_q="i32", h_q="i32", topk="i32", acc_rows="i32",
                   sm_scale_log2="fp32", ring_off="i32", ready_off="i32", empty_off="i32")
    # every constexpr, in parameter order (the cross-compile binds constexprs by position)
    consts = dict(PAGE_SHIFT=page_shift, HAS_LEN=has_len, HAS_SINK=has_sink, SBLOCK=64,
                  PRODUCER_REGS=producer_regs or WS3_PRODUCER_REGS[fmt], FMT=GLUON_FMTS[fmt],
                  DEQ_ASM=bool((fmt in WS3_DEQ_ASM) if deq_asm is None else deq_asm), PV_REGS=pv_regs or WS2_PV_REGS,
                  PF_L2=bool((fmt in WS3_PF_L2) if pf_l2 is None else pf_l2), Q_AHEAD=_q_ahead(fmt, q_ahead),
                  ROPE_ROWS=_rope_rows(fmt, rope_rows), ROW_LANES=_row_lanes(fmt, row_lanes),
                  IDX_AHEAD=_idx_ahead(fmt, idx_ahead),
                  PF_LINES=_pf_lines(fmt, pf_lines), Q_ASYNC=_q_async(fmt, q_async))
    hinted = [k for k, v in sig.items() if v.startswith("*")] + ["stride_qb", "stride_qs", "stride_qh", "stride_kb",
                                                                  "stride_ib", "stride_is"]
    if xfmt is not None:
        consts.update(XPAGE_SHIFT=xpage_shift, HAS_XLEN=has_xlen, XFMT=_XFMT_CODES[xfmt])
        hinted += ["stride_xkb", "stride_xib", "stride_xis"]
    if timeline:        # the TIMELINE entry: a runtime *i64 after the constexprs (parameter order kept)
        if xfmt is not None:
            raise ValueError("TIMELINE: the no-extra kernel only")
        fn = _sparse_decode_gluon_ws3_tl_kernel
        sig["tl_ptr"] = "*i64"
        hinted += ["tl_ptr"]
        sig = {n: sig.get(n, "constexpr") for n in fn.arg_names if n in sig or n in consts}
    return _compile_sm90_gluon(fn, sig, consts, hinted, num_warps=WS3_NUM_WARPS, maxnreg=maxnreg or WS_MAXNREG)
