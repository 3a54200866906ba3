"""Warp-specialised Gluon sparse MLA decode for the V3.2 and V4.1 FP8 main caches (sm90; issue #6). Dispatched for V3.2
and V4.1 without an extra cache (:data:`DISPATCH`, :data:`DISPATCH_FMTS`); measured 229-266 TFLOPS at h_q 128, topk
2048 on the H200 for V3.2, 1.20-1.30x the single-partition kernel, bit-identical to it (prediction below: 300-380,
missed by ~1.3x); V4.1 219-257 (section "V4.1"). With an extra cache (V3.2 + V3.2, V4.1 + V4.1, V4.1 + FP4; section
"Extra cache" at the end): dispatched since its first device run (:data:`DISPATCH_EXTRA`), bit-identical to the
single-partition kernel and 1.17-1.33x the kernels that served those calls before.

Same contract as :mod:`deepkernels.mla._gluon_sparse_decode` (the dispatched single-partition kernel; read its
docstring) and, by construction, the same output bit for bit: one CTA per (scheduler part, query position,
64-head block), persistent over the requests of its part, split boundaries clamped to the token line, the last
split of a request running to its end, indices valid iff ``position < topk_length`` and
``0 <= idx < num_blocks * page_block_size`` (anything else never dereferenced, its K/V row zero), single-split
requests write ``out``/``lse`` (sink applied), split requests write ``O/L`` and ``log2 L + m`` to accumulator row
``num_splits[req] + split`` for the unchanged ``combine_splits_``. Launcher :func:`launch_sparse_decode_gluon_ws`
has the signature of ``launch_sparse_decode_gluon`` (drop-in). Scope (:func:`supported_ws`): main cache V3.2
(656 B/token: 512 e4m3, 4 fp32 scales, 64 bf16 RoPE; d_qk 576) or V4.1 (528 B/token: 512 e4m3 incl. RoPE, 16 UE8M0
exponents; d_qk 512), no extra cache or one of :data:`WS_EXTRA_PAIRS` (the single-partition kernel's pairs).

Structure (``gl.warp_specialize``, modelled on ``_gluon_sparse_prefill._sparse_prefill_gluon_ws_kernel``):

* Producer partition, 4 warps (128 threads), :func:`_w_producer`: walks the same (request, 64-token block)
  sequence as the consumers (same scheduler arithmetic, :func:`_gluon_sparse_decode._g_req_range`); per block it waits ``empty[slot]``,
  cp.asyncs the 64 x 64 bf16 RoPE rows (masked: zero-filled, never read) straight into ``kv_p[slot]``, and
  dequantises the NoPE part in 4 chunks of one scale group each (``[64 tokens, 128 B]`` = 32 int32 words per
  token, 16 registers per thread): ``bf16(fp32(e4m3) * fp32 scale)`` -- the same ops as ``_g_byte`` -- stored to
  columns ``[128 g, 128 g + 128)`` of ``kv_n[slot]``; the block's validity mask (int8 per token) goes to
  ``vmask[slot]``, so that the consumers' loop has no global load at all. Right after chunk g is dequantised, chunk g of the NEXT block
  is loaded into the same registers (16-byte ``ld.global.v4``), so the raw records of block j+1 are in flight
  while block j is dequantised and while the producer waits for the slot: 64 data registers carried, 32 KB in
  flight per CTA. Then ``ready[slot]`` (count 1: a per-thread ``cp.async.mbarrier.arrive`` for the RoPE copies,
  net zero, plus the partition's ordinary arrive, which Gluon lowers to a 128-thread barrier + one arrive).
* Default partition, 8 warps = 2 consumer warpgroups, :func:`_w_consumer`: Q of each request to shared memory,
  then per block: wait ``ready[slot]``, ``fence.proxy.async`` (the producer's generic-proxy stores before the
  wgmma reads, as the prefill WS consumer does for its cp.async data), S = Q K^T split by token columns
  (``[4, 2]`` layouts), the online softmax of the single-partition kernel (V3.2: row sum reduced per block), P to
  shared memory, ``acc *= alpha``, O += P V split by value columns, wait, ``empty[slot]`` arrive (a barrier of the
  8 warps + one arrive: both warpgroups' P V done, P tile free). Epilogue identical to the single-partition one.
  The consumers issue no gather instruction and no dequant instruction.

Numerics: the consumer's instruction sequence per block is the single-partition kernel's (same wgmma shapes and
order: NoPE k-steps then RoPE k-steps into one accumulator, same softmax expressions, same epilogue); the K tile
bytes are the same (identical dequant ops; invalid rows +0 in both). So out / lse are expected BIT-IDENTICAL to
``launch_sparse_decode_gluon`` (tests/test_mla_sparse_decode_ws.py checks ``torch.equal``).

Shared memory: Q 64 KB + 8 KB RoPE, ring 2 x (64 KB + 8 KB), P 8 KB = 224 KB, + 2 x 64 B validity masks + 548 B
(4 mbarriers, the softmax's cross-warpgroup reduction scratch, warp_specialize state): 230,052 B of the 232,448 B
limit.

Registers (ptxas of the Triton 3.6 wheel, cross-compiled): launch ``maxnreg`` 168 (12 warps x 32 x 168 = 64,512 of
the 65,536 registers), producer ``setmaxnreg`` 136 (:data:`WS_PRODUCER_REGS`), which makes Triton give the 8 consumer
warps (64,512 - 128 x 136) / 256 = 184. Producer: 64 carried raw-record registers + 4 scales + 2 record addresses +
a 32-register dequant chunk -> 5 spill instructions in its block loop (of ~1,320); consumers: 128 accumulator
registers + S/P, 0 spill instructions in the token loop (~500 instructions); 88 B of spill stores in all (request
setup, epilogue). Register splits tried (spill instructions in the producer loop / consumer loop): producer 128 ->
7 / 0, 136 -> 5 / 0, 144 -> 6 / 3 (before the validity mask moved to shared memory: 104 -> 45 / 0, 120 -> 8 / 0,
152 -> 6 / 6). Why 4 producer warps: 8 would put 16 warps on 64K
registers (<= 128 each at launch) while the consumers need ~184; fewer than 4 leaves SM sub-partitions without a
producer warp and doubles the per-thread dequant and its registers.

Prediction (h_q 128, topk 2048, b 64/128; per CTA and 64-token block, one CTA per SM at 224 KB of shared memory):
consumers 64x64x576 + 64x512x64 = 4.46 M MAC = 8.9 MFLOP. At 2048 bf16 MAC/clk/SM that is 2,176 clk of math, but S
is m64n32k16 with A (Q) re-read from shared memory every k-step (3 KB per 32 K MAC: ~24 clk of shared bandwidth vs
16 of math), so S ~1,700 clk + P V ~1,000 clk + the softmax with its cross-warpgroup reductions and 3 consumer
barriers (~500-800 clk): ~3,300-3,500 clk = 1.8-1.9 us per block at 1.83 GHz -- the consumer of the sparse PREFILL
WS kernel, which measured 360-401 TFLOPS. Producer per block: 64 x 656 B = 42 KB gathered (the two head-block CTAs
of an h_q = 128 row read the same records; ~0.7-1 TB/s of DRAM at these rates, far under 4.8 TB/s: latency, not
bandwidth -> 32 KB kept in flight) and 32K elements dequantised: per thread 128 F2FP e4m3x2->f16x2, 256 HADD2.F32,
256 FMUL, 128 F2FP bf16x2 packs, ~300 integer ops, 32 STS.128 (~1,100 issue slots per producer warp, one per SM
sub-partition; ~2,000 clk = 1.1 us if F2FP runs at 16/clk/SM) -- under the consumer time, so the block time should
be the consumer's. The single-partition kernel measured ~5.5 us per block (215 TFLOPS): the same dequant sits
between its P V issue and wait, and block j+1's gather latency is covered only by S_j + softmax. Predicted:
300-380 TFLOPS at h_q 128 (1.4-1.8x the single-partition kernel), capped near the prefill WS's 360-401 by the same
consumer; 420 is not expected from this structure alone (it needs a cheaper S: Q from registers or another
warpgroup split). h_q 64: the same per-block gain on lower absolute numbers. Untested on a GPU when written:
correctness (bit-identity with the single-partition kernel) and speed are for the device run.

V4.1 (``FMT`` = 2; the V3.2 instruction stream is unchanged: cross-compiled PTX of the 8 V3.2 configurations
page shift 6/-1 x has_len x has_sink identical before/after, .loc/.file/debug/labels stripped):

* Producer :func:`_w_producer41` (same loop, ring, prefetch and mask as :func:`_w_producer`, no RoPE cp.async): a
  chunk is 128 B of each record = 4 UE8M0 groups of 32 e4m3, ``[64, 4, 8]`` int32 words, 2 threads per token (2 groups
  x 8 words = 4 ``ld.global.v4`` each) + the 2 exponent bytes of its groups (one 16-bit load); dequant with the
  single-partition kernel's own helpers ``_g_ue8m0`` (2^(e-127), 0 -> 2^-127, 255 -> NaN, masked ``other`` 127) and
  ``_g_byte``; 4 chunks of the next block in flight (64 data registers + 4 exponent registers).
* Consumers: no RoPE wgmma / Q tile; the row sum per column (``[64, 64]`` fp32, the single-partition kernel's PSUM)
  reduced once per request after the token loop -- the same expressions in the same order, so out / lse are expected
  bit-identical to ``launch_sparse_decode_gluon`` for V4.1 too.
* Shared memory: Q 64 KB + ring 2 x 64 KB + P 8 KB + masks/barriers/scratch = 205,476 B.
* Registers: the PSUM accumulator costs 16 consumer registers: producer ``setmaxnreg`` 136 (consumers 184) left 5 spill
  instructions in the consumers' token loop; :data:`WS_PRODUCER_REGS_V41` = 120 gives the consumers 192: 0 spills in
  their loop (447 instructions), 14 in the producer's block loop (~1,380 instructions; 112 -> 19, 104 -> 45), ~150 B
  spill stores in all.
* Prediction (h_q 128, topk 2048): per block the consumers do 64x64x512 + 64x512x64 = 4.19 M MAC (0.94x V3.2's 4.46 M)
  and one cross-warpgroup reduction less (PSUM); the producer gathers 64 x 528 B = 33.8 KB (0.8x) and dequantises the
  same 32K elements (+ a few integer ops per exponent, no RoPE copy). FlashMLA's FLOP count per token falls by the same
  0.94 (512 + 512 vs 576 + 512), so at the V3.2 WS block time the TFLOPS would be ~0.94x of V3.2's; the consumer
  being ~0.9x cheaper gives some back: 210-260 TFLOPS at h_q 128, 1.2-1.4x the single-partition V4.1 kernel
  (measured 167-187), bit-identical to it. Untested on a GPU when written.

Extra cache (FlashMLA's second token list, ``extra_k_cache`` / ``extra_indices_in_kvcache`` / ``extra_topk_length``,
attended in the same softmax; :func:`_sparse_decode_gluon_ws_x_kernel`, a separate entry with the single-partition
kernel's argument list, so the no-extra kernel's parameters and PTX are untouched):

* The token line of a request is the single-partition kernel's virtual line: main positions [0, n), then extra
  positions from ``off = 64 * ceil(n / 64)``; a CTA's slice [t_lo, t_hi) of it (split boundaries anywhere, in either
  part) is main positions [t_lo, min(t_hi, n)) then extra positions [max(t_lo - off, 0), min(t_hi - off, n_x))
  (:func:`_w_xrange`, the same expressions as the single-partition kernel's second ``_g_attend`` call).
* Producer: per request the main block loop, then the extra block loop of the extra format, the ring counter running
  on (the block loops are helpers shared by both: :func:`_w_blocks32` for V3.2 records incl. the RoPE cp.async,
  :func:`_w_blocks41` for V4.1, :func:`_w_blocks_fp4` for FP4). FP4 records (288 B: 256 B of e2m1 pairs + 32 e4m3
  scales, one per 16 elements) go in 4 chunks of 64 B per record ([64 tokens, 8 scale groups, 2 words], 2 threads per
  token: 4 x 8-byte e2m1 vectors + one 4-byte scale load per thread per chunk, 4 chunks of the next block in flight =
  48 data registers), dequantised with the single-partition kernel's ``_g_nib`` (e2m1 magnitude bits to fp32, x
  2^126, x fp32(e4m3 scale): exact, so bf16 equals the product) into the same bf16 ring tile [64, 512] (FP4 extra is
  d_qk 512 beside V4.1, no RoPE tile; a V3.2 extra cache fills the RoPE tile as the main one does). The extra blocks'
  validity (position < extra end, 0 <= idx < extra blocks x extra page) goes to the same mask.
* Consumers: unchanged per block (the pairs keep the main format's tile shapes); only their block count per request
  is main + extra blocks. The single-partition kernel runs the same per-block expressions on the same (m_i, l_i,
  acc) in its second token loop (PSUM for V4.1 main caches, over main and extra blocks alike), so out / lse are
  expected bit-identical to it.
* Shared memory as without (the extra blocks use the same ring): 230,052 B (V3.2 + V3.2), 205,476 B (V4.1 + *).
* Registers (:data:`WS_PRODUCER_REGS_X`: the main formats' splits; ptxas of the Triton 3.6 wheel, 9 configurations
  page shift x lengths x sink): consumers 0 spill instructions in their token loop (504 / 447 instructions for
  V3.2 / V4.1 main) and no global load in it; spill instructions in the producer's two block loops: V3.2 + V3.2
  (136) 5-7 each (~1,320 instructions), V4.1 + V4.1 (120) 12-14 each (~1,380), V4.1 + FP4 (120) 12-14 in the V4.1
  loop and 6 in the FP4 loop (~2,040; producer 112: 19 / 7; 128 gives the consumers 184: 5 spills in their loop);
  spill stores in all 116-128 / 184-192 / 168-176 B. The FP4 extra loop is ~2,040 SASS instructions per block (V4.1's ~1,380): ``_g_nib`` costs ~8
  instructions per element (shifts/masks, 2 FMUL, half a pack) against ~5 for e4m3 (paired F2FP conversions) -- still
  far under the consumer's per-block time (V4.1 measured ~4.3 us per block at 219-257 TFLOPS, ~8,000 clk; the
  producer warp issues ~2,000).
* Prediction (h_q 128, topk 2048 + extra 512, FlashMLA FLOPs counting the extra tokens): the extra blocks cost what
  main blocks of the main format cost (consumer-bound; their records are 288 B instead of 528 B for FP4), one more
  producer prologue per request is covered by the 2-slot ring: V4.1 + FP4 at about the V4.1 WS rate, 210-255 TFLOPS
  (b 64 s_q 1 lowest), 1.15-1.4x the Triton kernel that serves it (176-195 in ``deepkernels bench``); V3.2 + V3.2
  225-265, 1.2-1.35x the single-partition kernel; h_q 64: 150-230. Untested on a GPU when written.
* Measured (H200, session 15, git 3d9a1b17f99b, ``benchmarks/device_sparse_decode_ws.sh``): 25/25 extra-cache GPU
  tests; bit-identical to the single-partition kernel on all 12 bench shapes. V4.1 + FP4 at h_q 128: 211-238 TFLOPS
  (prediction 210-255: inside), h_q 64: 168-221; 1.17-1.28x the Triton kernel (144-193). V3.2 + V3.2 at h_q 128:
  241-274 (prediction 225-265), 1.30-1.33x the single-partition kernel. Dispatched since (:data:`DISPATCH_EXTRA`).
"""
from __future__ import annotations

import torch

from .._gluon import (IMPORT_ERROR as _IMPORT_ERROR, available, gl, async_copy, fence_async_shared, mbarrier,
                      warpgroup_mma, warpgroup_mma_wait)
from .._gluon import compile_sm90 as _compile_sm90_gluon, jit as _jit
from .._launch import cached_launcher, spec_key
from ._gluon_sparse_decode import (GLUON_FMTS, _XFMT_CODES, _g_byte, _g_epilogue, _g_load_idx, _g_nib, _g_part,
                                   _g_req_range, _g_rows, _g_ue8m0, _page_shift, _xfmt, supported)

__all__ = ["available", "supported_ws", "launch_sparse_decode_gluon_ws", "compile_sm90_ws", "WS_PRODUCER_WARPS",
           "WS_PRODUCER_REGS", "WS_PRODUCER_REGS_V41", "WS_PRODUCER_REGS_X", "WS_MAXNREG", "WS_FMTS", "DISPATCH_FMTS",
           "WS_EXTRA_PAIRS", "DISPATCH_EXTRA"]

BLOCK_H = 64
NUM_WARPS = 8                 # the default (consumer) partition: 2 warpgroups
WS_PRODUCER_WARPS = 4          # (the literal [4] in the kernel: Gluon reads no Python globals)
WS_PRODUCER_REGS = 136        # setmaxnreg of the producer; the 8 consumer warps get (168 * 384 - 136 * 128) / 256 = 184
# V4.1: the consumers' per-column row sum (PSUM, 16 more registers) spills 5 instructions in their token loop at 184;
# producer 120 -> consumers 192: 0 there, 14 spill instructions in the producer's block loop instead (of ~1,380)
WS_PRODUCER_REGS_V41 = 120
WS_MAXNREG = 168              # launch cap: 12 warps x 32 x 168 <= 64K registers; Triton hands the consumers the rest
WS_PRODUCER_FENCE = False     # also fence.proxy.async in the producer before ``ready`` (the consumer always fences)
# Producer options per main-cache format (no extra cache), measured session 15 (H200, git 63bd59e28dc7,
# results/sparse_decode_ws_profile-h200-2026-11-29-s15c.json; 12/12 bit-identity GPU tests): the dequantisation through
# one inline-PTX block per word (_w_e4m3x4: same values; V3.2 producer loop 1,320 -> 968 SASS instructions) and an L2
# prefetch of block j+2's records (cp.async.bulk.prefetch.L2, one per token). V3.2, both: 1.066-1.076x the kernel
# without them at all 4 shapes (h_q 128 b 128 s_q 1: 272.9 vs 254.8 TFLOPS; s_q 2: 286.0 vs 268.2; b 64: 247.4 vs
# 231.7; h_q 64: 233.1 vs 216.6), bit-identical; the producer alone 3.57 -> 3.17 us per block. V4.1: the asm dequant
# spills in its 120-register producer (42 STL in the loop) and ran 0.64x; the prefetch alone 0.95-1.00x: neither.
WS_DEQ_ASM = frozenset({"v32"})
WS_PF_L2 = frozenset({"v32"})
# ROW_LANES (session 16): the producer's lanes run over token rows first (BlockedLayout order
# [0, 1] instead of [1, 0]), so each quarter-warp of a 16-byte shared store writes 8 rows -> 8 distinct 16-byte bank
# groups of the 128-B-swizzled ring tile. Nsight Compute (results/ncu-h200-2026-11-29-s16, V3.2 WS kernel) found
# every dequantised STS.128 at 8 wavefronts against the ideal 4: with 2 lanes per row, lanes 2r / 2r+1 of a quarter
# write the same bank group of the two 64-column subtiles. The global loads cover the same addresses per instruction
# (only the lane order changes) and the values are the same (bit-identical output). Measured (H200, git de9dbf4694ae,
# results/sparse_decode_rowlanes-h200-2026-11-29-s16.json, 5 rotated rounds, paired ratios; 10/10 bit-identity GPU
# tests): V3.2 WS 0.984-0.985 of the time without (277.0 vs 273.0 TFLOPS at b 128 s_q 1), WS2 0.962-0.967; V4.1 WS
# 1.020-1.023, WS2 1.014-1.017 (slower: its [64, 4, 8] layout's conversions cost more than the conflicts). On for V3.2.
WS_ROW_LANES = frozenset({"v32"})
# sparse_decode.py sends the calls supported_ws() takes here (True since its first device run, 2026-11-29, git
# 9385c63fe481: GPU tests passed, bit-identical to the single-partition kernel, 1.20-1.30x it -- 229-266 TFLOPS at
# h_q 128, topk 2048; results/mla_sparse_decode_ws-h200-2026-11-29.json)
DISPATCH = True
# main-cache formats the kernel implements (no extra cache in either) and those sparse_decode.py sends here. V4.1 since
# its first device run (2026-11-29, git 33b781d74e9c, results/mla_sparse_decode_ws-h200-2026-11-29-v41.json): 36/36
# GPU tests, bit-identical to the single-partition kernel, 219-257 TFLOPS at h_q 128 (1.40-1.44x it, 1.35-1.41x the
# Triton kernel that served V4.1 before), 153-230 at h_q 64 (1.17-1.35x)
WS_FMTS = ("v32", "v41")
DISPATCH_FMTS = frozenset({"v32", "v41"})
# extra caches the kernel implements beside each main format (the single-partition kernel's pairs) and whether
# sparse_decode.py sends calls with an extra cache here: True since their first device run (2026-11-29, git
# 3d9a1b17f99b, session 15): 25/25 extra-cache GPU tests, bit-identical to the single-partition kernel on every bench
# shape; V4.1 + FP4 (topk 2048 + extra 512) 168-238 TFLOPS vs the Triton kernel that served it 144-193 (1.17-1.28x),
# V3.2 + V3.2 241-274 vs the single-partition kernel 184-206 (1.30-1.33x)
WS_EXTRA_PAIRS = {"v32": ("v32", ), "v41": ("v41", "fp4")}
DISPATCH_EXTRA = True
# producer setmaxnreg per (main, extra) pair: the main producers' values (the consumers' budget is the same)
WS_PRODUCER_REGS_X = {("v32", "v32"): WS_PRODUCER_REGS, ("v41", "v41"): WS_PRODUCER_REGS_V41,
                      ("v41", "fp4"): WS_PRODUCER_REGS_V41}
_LOG2E = 1.4426950408889634


# ----------------------------------------------------------------------------------------------- device code

@_jit
def _w_xrange(req, end_req, end_blk, split, nsp, n, t_lo, xlen_ptr, xtopk, HAS_XLEN: gl.constexpr,
              SBLOCK: gl.constexpr):
    """The extra cache's part of this CTA's slice of the request's virtual line (the single-partition kernel's
    arithmetic): extra positions [x_lo, x_end) of the extra index row, the extra part starting at 64 * ceil(n / 64)
    of the line (``n``: the main length); x_lo a multiple of 64, the range empty when the split ends in the main
    part, the main range empty when it starts in the extra part."""
    t_hi = gl.minimum(gl.where((req == end_req) & (split < nsp - 1), end_blk, 1 << 24), 1 << 24) * SBLOCK
    nx = xtopk + req * 0
    if HAS_XLEN:
        nx = gl.minimum(gl.maximum(gl.load(xlen_ptr + req), 0), xtopk)
    off = (n + SBLOCK - 1) // SBLOCK * SBLOCK
    return gl.maximum(t_lo - off, 0), gl.minimum(t_hi - off, nx)


@_jit
def _w_load_chunk(kv_ptr, rec, valid, G: gl.constexpr, LW: gl.constexpr):
    """Masked loads of scale group G of 64 V3.2 records: the 128 e4m3 bytes as 32 packed int32 words per token
    ([64, 32], 16-byte vectors) and the group's fp32 scale ([64]); invalid tokens load zeros."""
    w = gl.arange(0, 32, gl.SliceLayout(0, LW))
    wp = (kv_ptr + rec).to(gl.pointer_type(gl.int32))
    raw = gl.load(wp[:, None] + (G * 32 + w)[None, :], mask=valid[:, None] & (w >= 0)[None, :], other=0)
    sp = (kv_ptr + rec + (512 + 4 * G)).to(gl.pointer_type(gl.float32))
    sc = gl.load(sp, mask=valid, other=0.0)
    return raw, sc


@_jit
def _w_byte(raw, sc, K: gl.constexpr):
    """bf16(fp32(e4m3 byte K of each word) * scale) -- the ops of ``_gluon_sparse_decode._g_byte``."""
    b = ((raw >> (8 * K)) & 0xFF).to(gl.uint8)
    return (b.to(gl.float8e4nv, bitcast=True).to(gl.float32) * sc[:, None]).to(gl.bfloat16)


@_jit
def _w_e4m3x4(raw, sc):
    """The 4 e4m3 bytes of each int32 word of ``raw`` times ``sc`` (fp32, broadcast to ``raw``'s shape) as 4 bf16
    tensors (byte k -> k-th result): ``bf16(fp32(e4m3) * sc)`` with the ops of :func:`_w_byte` -- e4m3 pair -> f16x2
    (``cvt.rn.f16x2.e4m3x2``, exact), f16 -> f32 (exact), ``mul.rn.f32``, ``cvt.rn.bf16x2.f32`` -- in one inline-PTX
    block per word: the 16-bit halves of the word feed the pair conversion directly, so none of Triton's per-byte
    shift / mask / repack instructions (ptxas: ~5 integer instructions per word in :func:`_w_byte`'s lowering).
    ``inline_asm_elementwise`` broadcasts ``sc`` to ``raw``'s shape."""
    return gl.inline_asm_elementwise(
        asm="""{
        .reg .b16 lo, hi;
        .reg .b32 p0, p1;
        .reg .f16 h0, h1, h2, h3;
        .reg .f32 f0, f1, f2, f3;
        mov.b32 {lo, hi}, $4;
        cvt.rn.f16x2.e4m3x2 p0, lo;
        cvt.rn.f16x2.e4m3x2 p1, hi;
        mov.b32 {h0, h1}, p0;
        mov.b32 {h2, h3}, p1;
        cvt.f32.f16 f0, h0;
        cvt.f32.f16 f1, h1;
        cvt.f32.f16 f2, h2;
        cvt.f32.f16 f3, h3;
        mul.rn.f32 f0, f0, $5;
        mul.rn.f32 f1, f1, $5;
        mul.rn.f32 f2, f2, $5;
        mul.rn.f32 f3, f3, $5;
        cvt.rn.bf16x2.f32 p0, f1, f0;
        cvt.rn.bf16x2.f32 p1, f3, f2;
        mov.b32 {$0, $1}, p0;
        mov.b32 {$2, $3}, p1;
        }""",
        constraints="=h,=h,=h,=h,r,f", args=[raw, sc], dtype=(gl.bfloat16, gl.bfloat16, gl.bfloat16, gl.bfloat16),
        is_pure=True, pack=1)


@_jit
def _w_dequant_store(raw, sc, dst, ASM: gl.constexpr = False):
    """One scale group: [64, 32] words -> [64, 128] bf16 (byte k of word w is element 4w + k) -> ``dst``. ``ASM``:
    the same values through :func:`_w_e4m3x4` (:data:`WS_DEQ_ASM`)."""
    if ASM:
        b0, b1, b2, b3 = _w_e4m3x4(raw, sc[:, None])
        x = gl.join(gl.join(b0, b2), gl.join(b1, b3))
    else:
        x = gl.join(gl.join(_w_byte(raw, sc, 0), _w_byte(raw, sc, 2)),
                    gl.join(_w_byte(raw, sc, 1), _w_byte(raw, sc, 3)))
    dst.store(gl.reshape(x, [64, 128]))


@_jit
def _w_prefetch_l2(kv_ptr, rec, valid, RB: gl.constexpr):
    """``cp.async.bulk.prefetch.L2`` of each valid token's whole record (``RB`` bytes, a multiple of 16; records at
    16-byte aligned addresses only: the others are skipped) -- no registers or shared memory held, so the producer
    can ask for block j+2 while block j+1's records are in flight in registers (:data:`WS_PF_L2`)."""
    gl.static_assert(RB == 656 or RB == 528 or RB == 288)
    ptrs = kv_ptr + rec
    ok = (valid & ((rec & 15) == 0)).to(gl.int32)
    if RB == 656:
        gl.inline_asm_elementwise(
            asm="{ .reg .pred p; setp.ne.b32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], 656; mov.u32 $0, 0; }",
            constraints="=r,l,r", args=[ptrs, ok], dtype=gl.int32, is_pure=False, pack=1)
    elif RB == 528:
        gl.inline_asm_elementwise(
            asm="{ .reg .pred p; setp.ne.b32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], 528; mov.u32 $0, 0; }",
            constraints="=r,l,r", args=[ptrs, ok], dtype=gl.int32, is_pure=False, pack=1)
    else:
        gl.inline_asm_elementwise(
            asm="{ .reg .pred p; setp.ne.b32 p, $2, 0; @p cp.async.bulk.prefetch.L2.global [$1], 288; mov.u32 $0, 0; }",
            constraints="=r,l,r", args=[ptrs, ok], dtype=gl.int32, is_pure=False, pack=1)


@_jit
def _w_blocks32(kv_n, kv_p, vmask, ready, empty, kv_ptr, idx_ptr, req, si64, stride_ib, stride_is, t_lo, t_end,
                num_tok, page, stride_kb, it, dr, PAGE_SHIFT: gl.constexpr, PRODUCER_FENCE: gl.constexpr,
                DEQ_ASM: gl.constexpr = False, PF_L2: gl.constexpr = False, ROW_LANES: gl.constexpr = False):
    """The producer's block loop over positions [t_lo, t_end) of the index row of (req, query si64) of a V3.2 cache
    (the main cache, then the extra one if any), ring counter ``it`` in and out; ``dr``: the RoPE columns (made by
    the caller, before its request loop, as before this was a helper: same instruction order)."""
    # one token per thread: a scale group of a record (128 B = 32 words) is 2 threads x 4 16-byte vectors, so a
    # thread carries 1 scale and 1 record address per chunk (not 4, as with 8 lanes per token)
    # (ROW_LANES: lanes over rows first, :data:`WS_ROW_LANES`)
    LW: gl.constexpr = gl.BlockedLayout([1, 16], [16, 2], [4, 1], [0, 1] if ROW_LANES else [1, 0])   # [64, 32] words
    LT: gl.constexpr = gl.SliceLayout(1, LW)
    LP4: gl.constexpr = gl.BlockedLayout([1, 32], [16, 2], [4, 1],
                                         [0, 1] if ROW_LANES else [1, 0])  # [64, 64] bf16 RoPE: 4 x 16-B cp.async
    LTP: gl.constexpr = gl.SliceLayout(1, LP4)
    nblocks = gl.maximum(t_end - t_lo + 63, 0) // 64
    idx_row = idx_ptr + req.to(gl.int64) * stride_ib + si64 * stride_is
    # prologue: block 0's raw records (4 scale groups) in flight
    i0, v = _g_load_idx(idx_row, t_lo, t_end, num_tok, LT)
    rec = _g_rows(i0, v, page, stride_kb, 656, PAGE_SHIFT)
    r0, s0 = _w_load_chunk(kv_ptr, rec, v, 0, LW)
    r1, s1 = _w_load_chunk(kv_ptr, rec, v, 1, LW)
    r2, s2 = _w_load_chunk(kv_ptr, rec, v, 2, LW)
    r3, s3 = _w_load_chunk(kv_ptr, rec, v, 3, LW)
    if PF_L2:       # block 1's records towards L2 (block j+2's in iteration j)
        ia, va = _g_load_idx(idx_row, t_lo + 64, t_end, num_tok, LT)
        _w_prefetch_l2(kv_ptr, _g_rows(ia, va, page, stride_kb, 656, PAGE_SHIFT), va, 656)
    for j in range(nblocks):
        slot = it % 2
        t0 = t_lo + j * 64
        if PF_L2:
            ia, va = _g_load_idx(idx_row, t0 + 128, t_end, num_tok, LT)
            _w_prefetch_l2(kv_ptr, _g_rows(ia, va, page, stride_kb, 656, PAGE_SHIFT), va, 656)
        recp = gl.convert_layout(rec, LTP)      # block j's records and validity for the RoPE copy
        vp = gl.convert_layout(v, LTP)
        i1, v = _g_load_idx(idx_row, t0 + 64, t_end, num_tok, LT)          # block j+1 (may be all invalid)
        rec = _g_rows(i1, v, page, stride_kb, 656, PAGE_SHIFT)
        mbarrier.wait(empty.index(slot), ((it // 2) & 1) ^ 1)              # a fresh barrier passes phase 1
        pp = (kv_ptr + recp + 528).to(gl.pointer_type(gl.bfloat16))
        async_copy.async_copy_global_to_shared(kv_p.index(slot), pp[:, None] + dr[None, :],
                                               mask=vp[:, None] & (dr >= 0)[None, :])
        vmask.index(slot).store(vp.to(gl.int8))
        dst = kv_n.index(slot)
        _w_dequant_store(r0, s0, dst.slice(0, 128, dim=1), DEQ_ASM)
        r0, s0 = _w_load_chunk(kv_ptr, rec, v, 0, LW)
        _w_dequant_store(r1, s1, dst.slice(128, 128, dim=1), DEQ_ASM)
        r1, s1 = _w_load_chunk(kv_ptr, rec, v, 1, LW)
        _w_dequant_store(r2, s2, dst.slice(256, 128, dim=1), DEQ_ASM)
        r2, s2 = _w_load_chunk(kv_ptr, rec, v, 2, LW)
        _w_dequant_store(r3, s3, dst.slice(384, 128, dim=1), DEQ_ASM)
        r3, s3 = _w_load_chunk(kv_ptr, rec, v, 3, LW)
        if PRODUCER_FENCE:
            fence_async_shared()
        async_copy.mbarrier_arrive(ready.index(slot))
        mbarrier.arrive(ready.index(slot))
        it += 1
    return it


@_jit
def _w_blocks_skip(vmask, ready, empty, idx_ptr, req, si64, stride_ib, stride_is, t_lo, t_end, num_tok, it):
    """Timing diagnostic (``PROFILE`` 1, never dispatched): the producer's ring protocol for positions [t_lo, t_end)
    without any gather or dequantisation -- per block: wait ``empty``, store the block's validity, arrive ``ready``.
    The consumers then run their full per-block work on whatever the ring holds (results meaningless), so the
    kernel time is the consumers' alone."""
    LT: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    nblocks = gl.maximum(t_end - t_lo + 63, 0) // 64
    idx_row = idx_ptr + req.to(gl.int64) * stride_ib + si64 * stride_is
    for j in range(nblocks):
        slot = it % 2
        _, v = _g_load_idx(idx_row, t_lo + j * 64, t_end, num_tok, LT)
        mbarrier.wait(empty.index(slot), ((it // 2) & 1) ^ 1)
        vmask.index(slot).store(v.to(gl.int8))
        mbarrier.arrive(ready.index(slot))
        it += 1
    return it


@_jit
def _w_producer(kv_n, kv_p, vmask, ready, empty, kv_ptr, idx_ptr, len_ptr, meta_ptr, nsplits_ptr,
                stride_kb, page, num_tok, stride_ib, stride_is, b, s_q, h_q, topk,
                xkv_ptr, xidx_ptr, xlen_ptr, stride_xkb, xpage, xnum_tok, stride_xib, stride_xis, xtopk,
                PAGE_SHIFT: gl.constexpr, HAS_LEN: gl.constexpr, SBLOCK: gl.constexpr,
                PRODUCER_FENCE: gl.constexpr, HAS_EXTRA: gl.constexpr, HAS_XLEN: gl.constexpr,
                XPAGE_SHIFT: gl.constexpr, XFMT: gl.constexpr, PROFILE: gl.constexpr = 0,
                DEQ_ASM: gl.constexpr = False, PF_L2: gl.constexpr = False, ROW_LANES: gl.constexpr = False):
    """Worker partition (4 warps): gather + dequantise every 64-token block of this CTA's (request, block) line
    into ring slot ``it % 2`` (``it`` counts blocks over the requests, as the consumers do). HAS_EXTRA (the ``x*``
    arguments; constexpr None placeholders without): after a request's main blocks, its blocks of the V3.2 extra
    cache (:func:`_w_blocks32`), the same ring counter running on. ``PROFILE`` 1 (timing diagnostic, no extra
    cache): :func:`_w_blocks_skip` instead of the gather + dequant loop."""
    LP4: gl.constexpr = gl.BlockedLayout([1, 32], [16, 2], [4, 1],
                                         [0, 1] if ROW_LANES else [1, 0])  # [64, 64] bf16 RoPE: 4 x 16-B cp.async
    hb, si, begin_req, end_req, begin_blk, end_blk, begin_split = _g_part(meta_ptr, b, s_q, h_q)
    si64 = si.to(gl.int64)
    dr = gl.arange(0, 64, gl.SliceLayout(0, LP4))    # (made here, outside the request loop, as before)
    it = 0
    for req in range(begin_req, end_req + 1):
        n, base_row, nsp, split, t_lo, _, t_end = _g_req_range(req, begin_req, end_req, begin_blk, end_blk,
                                                               begin_split, len_ptr, nsplits_ptr, topk, HAS_LEN,
                                                               SBLOCK)
        if PROFILE == 1:
            it = _w_blocks_skip(vmask, ready, empty, idx_ptr, req, si64, stride_ib, stride_is, t_lo, t_end, num_tok,
                                it)
        else:
            it = _w_blocks32(kv_n, kv_p, vmask, ready, empty, kv_ptr, idx_ptr, req, si64, stride_ib, stride_is,
                             t_lo, t_end, num_tok, page, stride_kb, it, dr, PAGE_SHIFT, PRODUCER_FENCE, DEQ_ASM,
                             PF_L2, ROW_LANES)
        if HAS_EXTRA:
            x_lo, x_end = _w_xrange(req, end_req, end_blk, split, nsp, n, t_lo, xlen_ptr, xtopk, HAS_XLEN, SBLOCK)
            it = _w_blocks32(kv_n, kv_p, vmask, ready, empty, xkv_ptr, xidx_ptr, req, si64, stride_xib, stride_xis,
                             x_lo, x_end, xnum_tok, xpage, stride_xkb, it, dr, XPAGE_SHIFT, PRODUCER_FENCE)


@_jit
def _w_load_chunk41(kv_ptr, rec, valid, G: gl.constexpr, L3: gl.constexpr):
    """Masked loads of bytes [128 G, 128 G + 128) of 64 V4.1 records: 4 scale groups of 32 e4m3 as [64, 4, 8]
    packed int32 words (16-byte vectors) and the groups' UE8M0 exponent bytes ([64, 4] uint8, other 127 as in
    ``_gluon_sparse_decode._g_gather``); invalid tokens load zeros."""
    g = gl.arange(0, 4, gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    w = gl.arange(0, 8, gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    vm2 = valid[:, None] & (g >= 0)[None, :]
    wp = (kv_ptr + rec).to(gl.pointer_type(gl.int32))
    raw = gl.load((wp[:, None] + (G * 32 + g * 8)[None, :])[:, :, None] + w[None, None, :], mask=vm2[:, :, None],
                  other=0)
    eb = gl.load(kv_ptr + (rec + (512 + 4 * G))[:, None] + g[None, :], mask=vm2, other=127)
    return raw, eb


@_jit
def _w_dequant_store41(raw, eb, dst, ASM: gl.constexpr = False):
    """4 UE8M0 groups: [64, 4, 8] words -> [64, 128] bf16 -> ``dst``; bf16(fp32(e4m3) * 2^(e-127)) with the ops of
    ``_gluon_sparse_decode._g_byte`` / ``_g_ue8m0`` (element 32 g + 4 w + k = byte k of word w of group g). ``ASM``:
    the same values through :func:`_w_e4m3x4` (:data:`WS_DEQ_ASM`)."""
    sc = _g_ue8m0(eb)
    if ASM:
        b0, b1, b2, b3 = _w_e4m3x4(raw, sc[:, :, None])
        x = gl.join(gl.join(b0, b2), gl.join(b1, b3))
    else:
        x = gl.join(gl.join(_g_byte(raw, sc, 0), _g_byte(raw, sc, 2)),
                    gl.join(_g_byte(raw, sc, 1), _g_byte(raw, sc, 3)))
    dst.store(gl.reshape(x, [64, 128]))


@_jit
def _w_blocks_nope(kv_n, vmask, ready, empty, kv_ptr, idx_ptr, req, si64, stride_ib, stride_is, t_lo, t_end,
                   num_tok, page, stride_kb, it, PAGE_SHIFT: gl.constexpr, PRODUCER_FENCE: gl.constexpr,
                   REC_BYTES: gl.constexpr, L3: gl.constexpr, LOAD: gl.constexpr, DEQUANT: gl.constexpr,
                   DEQ_ASM: gl.constexpr = False, PF_L2: gl.constexpr = False):
    """The producer's block loop for a cache without a RoPE tile (V4.1, FP4): the next block's 4 chunks in flight
    while the current block is dequantised into ring slot ``it % 2``, its validity mask beside it, then ``ready``.
    ``LOAD(kv_ptr, rec, valid, C, L3)`` loads chunk C of 64 records of ``REC_BYTES``; ``DEQUANT(raw, scales, dst)``
    stores its 128 bf16 columns."""
    LT: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, L3))
    nblocks = gl.maximum(t_end - t_lo + 63, 0) // 64
    idx_row = idx_ptr + req.to(gl.int64) * stride_ib + si64 * stride_is
    i0, v = _g_load_idx(idx_row, t_lo, t_end, num_tok, LT)
    rec = _g_rows(i0, v, page, stride_kb, REC_BYTES, PAGE_SHIFT)
    r0, e0 = LOAD(kv_ptr, rec, v, 0, L3)
    r1, e1 = LOAD(kv_ptr, rec, v, 1, L3)
    r2, e2 = LOAD(kv_ptr, rec, v, 2, L3)
    r3, e3 = LOAD(kv_ptr, rec, v, 3, L3)
    if PF_L2:       # block 1's records towards L2 (block j+2's in iteration j)
        ia, va = _g_load_idx(idx_row, t_lo + 64, t_end, num_tok, LT)
        _w_prefetch_l2(kv_ptr, _g_rows(ia, va, page, stride_kb, REC_BYTES, PAGE_SHIFT), va, REC_BYTES)
    for j in range(nblocks):
        slot = it % 2
        t0 = t_lo + j * 64
        if PF_L2:
            ia, va = _g_load_idx(idx_row, t0 + 128, t_end, num_tok, LT)
            _w_prefetch_l2(kv_ptr, _g_rows(ia, va, page, stride_kb, REC_BYTES, PAGE_SHIFT), va, REC_BYTES)
        vc = v                                   # block j's validity
        i1, v = _g_load_idx(idx_row, t0 + 64, t_end, num_tok, LT)          # block j+1 (may be all invalid)
        rec = _g_rows(i1, v, page, stride_kb, REC_BYTES, PAGE_SHIFT)
        mbarrier.wait(empty.index(slot), ((it // 2) & 1) ^ 1)              # a fresh barrier passes phase 1
        vmask.index(slot).store(vc.to(gl.int8))
        dst = kv_n.index(slot)
        DEQUANT(r0, e0, dst.slice(0, 128, dim=1), DEQ_ASM)
        r0, e0 = LOAD(kv_ptr, rec, v, 0, L3)
        DEQUANT(r1, e1, dst.slice(128, 128, dim=1), DEQ_ASM)
        r1, e1 = LOAD(kv_ptr, rec, v, 1, L3)
        DEQUANT(r2, e2, dst.slice(256, 128, dim=1), DEQ_ASM)
        r2, e2 = LOAD(kv_ptr, rec, v, 2, L3)
        DEQUANT(r3, e3, dst.slice(384, 128, dim=1), DEQ_ASM)
        r3, e3 = LOAD(kv_ptr, rec, v, 3, L3)
        if PRODUCER_FENCE:
            fence_async_shared()
        mbarrier.arrive(ready.index(slot))
        it += 1
    return it


@_jit
def _w_blocks41(kv_n, vmask, ready, empty, kv_ptr, idx_ptr, req, si64, stride_ib, stride_is, t_lo, t_end,
                num_tok, page, stride_kb, it, PAGE_SHIFT: gl.constexpr, PRODUCER_FENCE: gl.constexpr,
                DEQ_ASM: gl.constexpr = False, PF_L2: gl.constexpr = False, ROW_LANES: gl.constexpr = False):
    """:func:`_w_blocks32` for a V4.1 cache (the main cache, then a V4.1 extra one if any): no RoPE copy; a chunk is
    128 B of a record = 4 scale groups (2 per thread)."""
    # one token per 2 threads; a thread holds 2 scale groups x 8 words = 64 contiguous bytes (4 x 16-B vectors)
    # (ROW_LANES: lanes over rows first, :data:`WS_ROW_LANES`)
    L3: gl.constexpr = gl.BlockedLayout([1, 2, 8], [16, 2, 1], [4, 1, 1],
                                        [2, 0, 1] if ROW_LANES else [2, 1, 0])   # [64, 4, 8] words
    return _w_blocks_nope(kv_n, vmask, ready, empty, kv_ptr, idx_ptr, req, si64, stride_ib, stride_is, t_lo, t_end,
                          num_tok, page, stride_kb, it, PAGE_SHIFT, PRODUCER_FENCE, 528, L3, _w_load_chunk41,
                          _w_dequant_store41, DEQ_ASM, PF_L2)


@_jit
def _w_producer41(kv_n, vmask, ready, empty, kv_ptr, idx_ptr, len_ptr, meta_ptr, nsplits_ptr,
                  stride_kb, page, num_tok, stride_ib, stride_is, b, s_q, h_q, topk,
                  xkv_ptr, xidx_ptr, xlen_ptr, stride_xkb, xpage, xnum_tok, stride_xib, stride_xis, xtopk,
                  PAGE_SHIFT: gl.constexpr, HAS_LEN: gl.constexpr, SBLOCK: gl.constexpr,
                  PRODUCER_FENCE: gl.constexpr, HAS_EXTRA: gl.constexpr, HAS_XLEN: gl.constexpr,
                XPAGE_SHIFT: gl.constexpr, XFMT: gl.constexpr, PROFILE: gl.constexpr = 0,
                DEQ_ASM: gl.constexpr = False, PF_L2: gl.constexpr = False, ROW_LANES: gl.constexpr = False):
    """Worker partition (4 warps), V4.1 main cache (528 B/token: 512 e4m3 incl. RoPE, 16 UE8M0 exponents): as
    :func:`_w_producer` without the RoPE copy; a chunk is 128 B of a record = 4 scale groups (2 per thread).
    HAS_EXTRA: then the request's extra-cache blocks, V4.1 (XFMT 2, :func:`_w_blocks41`) or FP4 (XFMT 3,
    :func:`_w_blocks_fp4`)."""
    hb, si, begin_req, end_req, begin_blk, end_blk, begin_split = _g_part(meta_ptr, b, s_q, h_q)
    si64 = si.to(gl.int64)
    it = 0
    for req in range(begin_req, end_req + 1):
        n, base_row, nsp, split, t_lo, _, t_end = _g_req_range(req, begin_req, end_req, begin_blk, end_blk,
                                                               begin_split, len_ptr, nsplits_ptr, topk, HAS_LEN,
                                                               SBLOCK)
        if PROFILE == 1:
            it = _w_blocks_skip(vmask, ready, empty, idx_ptr, req, si64, stride_ib, stride_is, t_lo, t_end, num_tok,
                                it)
        else:
            it = _w_blocks41(kv_n, vmask, ready, empty, kv_ptr, idx_ptr, req, si64, stride_ib, stride_is, t_lo,
                             t_end, num_tok, page, stride_kb, it, PAGE_SHIFT, PRODUCER_FENCE, DEQ_ASM, PF_L2,
                             ROW_LANES)
        if HAS_EXTRA:
            x_lo, x_end = _w_xrange(req, end_req, end_blk, split, nsp, n, t_lo, xlen_ptr, xtopk, HAS_XLEN, SBLOCK)
            if XFMT == 3:
                it = _w_blocks_fp4(kv_n, vmask, ready, empty, xkv_ptr, xidx_ptr, req, si64, stride_xib, stride_xis,
                                   x_lo, x_end, xnum_tok, xpage, stride_xkb, it, XPAGE_SHIFT, PRODUCER_FENCE)
            else:
                it = _w_blocks41(kv_n, vmask, ready, empty, xkv_ptr, xidx_ptr, req, si64, stride_xib, stride_xis,
                                 x_lo, x_end, xnum_tok, xpage, stride_xkb, it, XPAGE_SHIFT, PRODUCER_FENCE)


# ---------------------------------------------------------------- FP4 extra cache (beside V4.1)

@_jit
def _w_load_chunk_fp4(kv_ptr, rec, valid, C: gl.constexpr, L3: gl.constexpr):
    """Masked loads of bytes [64 C, 64 C + 64) of 64 FP4 records (288 B: 256 B of e2m1 pairs, then 32 e4m3 scales,
    one per 8 bytes = 16 elements): 8 scale groups of 2 packed int32 words ([64, 8, 2], 8-byte vectors) and their
    e4m3 scale bytes ([64, 8] uint8 from byte 256 + 8 C: one 4-byte load per thread); invalid tokens load zeros
    (other 0, as ``_gluon_sparse_decode._g_gather``)."""
    g = gl.arange(0, 8, gl.SliceLayout(0, gl.SliceLayout(2, L3)))
    w = gl.arange(0, 2, gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    vm2 = valid[:, None] & (g >= 0)[None, :]
    wp = (kv_ptr + rec).to(gl.pointer_type(gl.int32))
    raw = gl.load((wp[:, None] + (C * 16 + g * 2)[None, :])[:, :, None] + w[None, None, :], mask=vm2[:, :, None],
                  other=0)
    eb = gl.load(kv_ptr + (rec + (256 + 8 * C))[:, None] + g[None, :], mask=vm2, other=0)
    return raw, eb


@_jit
def _w_dequant_store_fp4(raw, eb, dst, ASM: gl.constexpr = False):
    """8 FP4 scale groups: [64, 8, 2] words -> [64, 128] bf16 -> ``dst``, with the single-partition kernel's ops and
    element order (``_g_nib``: e2m1 magnitude to fp32 bits x 2^126, x fp32(e4m3 scale), exact in bf16; element
    16 g + 8 w + 2 k + c = nibble c of byte k of word w of group g, the joins of ``_g_dequant_store``)."""
    sc = eb.to(gl.float8e4nv, bitcast=True).to(gl.float32)
    x = gl.join(gl.join(gl.join(_g_nib(raw, sc, 0, 0), _g_nib(raw, sc, 2, 0)),
                        gl.join(_g_nib(raw, sc, 1, 0), _g_nib(raw, sc, 3, 0))),
                gl.join(gl.join(_g_nib(raw, sc, 0, 1), _g_nib(raw, sc, 2, 1)),
                        gl.join(_g_nib(raw, sc, 1, 1), _g_nib(raw, sc, 3, 1))))
    dst.store(gl.reshape(x, [64, 128]))


@_jit
def _w_blocks_fp4(kv_n, vmask, ready, empty, kv_ptr, idx_ptr, req, si64, stride_ib, stride_is, t_lo, t_end,
                  num_tok, page, stride_kb, it,
                  PAGE_SHIFT: gl.constexpr, PRODUCER_FENCE: gl.constexpr):
    """The FP4 extra cache's blocks (beside V4.1): :func:`_w_blocks_nope` with 288-B records, a chunk = 64 B of each
    record = 8 scale groups, 2 threads per token (4 groups x 2 words + 4 scale bytes each)."""
    L3: gl.constexpr = gl.BlockedLayout([1, 4, 2], [16, 2, 1], [4, 1, 1], [2, 1, 0])   # [64, 8, 2] words
    return _w_blocks_nope(kv_n, vmask, ready, empty, kv_ptr, idx_ptr, req, si64, stride_ib, stride_is, t_lo, t_end,
                          num_tok, page, stride_kb, it, PAGE_SHIFT, PRODUCER_FENCE, 288, L3, _w_load_chunk_fp4,
                          _w_dequant_store_fp4)


@_jit
def _w_block_softmax(q_n, q_p, kv_n, kv_p, vmask, slot, s_zero, m_i, l_i, sm_scale_log2, FMT: gl.constexpr,
                     PSUM: gl.constexpr, LS: gl.constexpr):
    """One consumer block step up to P (shared by this kernel's consumers and ``_gluon_sparse_decode_ws2``'s softmax
    warpgroup): proxy fence after the ``ready`` wait (the producer's generic-proxy shared stores before the wgmma
    reads), S = Q K^T of ring slot ``slot`` (NoPE k-steps, then RoPE for V3.2) into ``s_zero``'s layout, the
    producer's validity mask (invalid -> -inf by selection), the online softmax with the running max in raw-score
    units; ``PSUM``: ``l_i`` is the per-column partial sum ([64, N]), else the row sum. Returns (p, alpha, m, l)."""
    fence_async_shared()
    tok = warpgroup_mma(q_n, kv_n.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    if FMT == 0:
        tok = warpgroup_mma(q_p, kv_p.index(slot).permute((1, 0)), tok, is_async=True)
    # block j's validity (position < t_end, 0 <= idx < num_tok), written by the producer next to the slot: no global
    # load in the token loop (a load in flight at the fence above would stall its MEMBAR.ALL.CTA, and one issued under
    # S is scheduled by ptxas after the wait, exposed)
    valid = vmask.index(slot).load(LS) != 0
    s = warpgroup_mma_wait(0, deps=(tok, ))
    s = gl.where(valid[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2((m_i - m_safe) * sm_scale_log2)
    p = gl.exp2((s - m_safe[:, None]) * sm_scale_log2)
    if PSUM:
        l_i = l_i * alpha[:, None] + p
    else:
        l_i = l_i * alpha + gl.sum(p, 1)
    return p, alpha, m_new, l_i


@_jit
def _w_consumer(q_n, q_p, kv_n, kv_p, p_smem, vmask, ready, empty, q_ptr, idx_ptr, len_ptr, sink_ptr, meta_ptr,
                nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr, stride_qb, stride_qs, stride_qh, num_tok,
                stride_ib, stride_is, b, s_q, h_q, topk, acc_rows, sm_scale_log2, xlen_ptr, xtopk,
                HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, SBLOCK: gl.constexpr, FMT: gl.constexpr,
                HAS_EXTRA: gl.constexpr, HAS_XLEN: gl.constexpr, PROFILE: gl.constexpr = 0):
    """Default partition (8 warps): the single-partition kernel's compute and epilogue, V3.2 (FMT 0) or V4.1 (FMT 2:
    no RoPE tiles, row sum kept per column and reduced once per request, as its PSUM). HAS_EXTRA: a request's
    extra-cache blocks follow its main blocks in the same loop (the producer dequantised them into the same ring in
    the main format's tile shapes, and wrote their validity), so only the block count changes: the single-partition
    kernel's second ``_g_attend`` runs the same per-block expressions on the same (m_i, l_i, acc)."""
    D_V: gl.constexpr = 512
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    LP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    LS: gl.constexpr = gl.SliceLayout(0, S_L)
    hb, si, begin_req, end_req, begin_blk, end_blk, begin_split = _g_part(meta_ptr, b, s_q, h_q)
    si64 = si.to(gl.int64)
    hq = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, LP))
    dq = gl.arange(0, 64, gl.SliceLayout(0, LP))
    s_zero = gl.zeros([64, 64], gl.float32, S_L)
    it = 0
    for req in range(begin_req, end_req + 1):
        req64 = req.to(gl.int64)
        gl.thread_barrier()            # every wgmma of the previous request read Q before it is overwritten
        q_rows = q_ptr + req64 * stride_qb + si64 * stride_qs + hq.to(gl.int64)[:, None] * stride_qh
        for c in gl.static_range(8):
            q_n.slice(c * 64, 64, dim=1).store(gl.load(q_rows + (c * 64 + dq)[None, :]))
        if FMT == 0:
            q_p.store(gl.load(q_rows + (D_V + dq)[None, :]))
        fence_async_shared()
        gl.thread_barrier()
        n, base_row, nsp, split, t_lo, _, t_end = _g_req_range(req, begin_req, end_req, begin_blk, end_blk,
                                                               begin_split, len_ptr, nsplits_ptr, topk, HAS_LEN,
                                                               SBLOCK)
        nblocks = gl.maximum(t_end - t_lo + 63, 0) // 64
        if HAS_EXTRA:
            x_lo, x_end = _w_xrange(req, end_req, end_blk, split, nsp, n, t_lo, xlen_ptr, xtopk, HAS_XLEN, SBLOCK)
            nblocks += gl.maximum(x_end - x_lo + 63, 0) // 64
        m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))   # running max of raw q.k
        if FMT == 2:     # PSUM: per-column partial row sums, reduced after the token loop
            l_i = gl.zeros([64, 64], gl.float32, S_L)
        else:
            l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, S_L))
        acc = gl.zeros([64, D_V], gl.float32, O_L)
        for j in range(nblocks):
            slot = it % 2
            mbarrier.wait(ready.index(slot), (it // 2) & 1)
            if PROFILE == 2:             # timing diagnostic (never dispatched): release the slot at once, no math
                mbarrier.arrive(empty.index(slot))
            else:
                # online softmax step, exactly as _gluon_sparse_decode._g_attend (PSUM off for V3.2, on for V4.1)
                p, alpha, m_i, l_i = _w_block_softmax(q_n, q_p, kv_n, kv_p, vmask, slot, s_zero, m_i, l_i,
                                                      sm_scale_log2, FMT, FMT == 2, LS)
                p_smem.store(p.to(gl.bfloat16))
                fence_async_shared()
                gl.thread_barrier()        # both halves of P written before either warpgroup reads it
                acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
                tok_o = warpgroup_mma(p_smem, kv_n.index(slot), acc, is_async=True)
                acc = warpgroup_mma_wait(0, deps=(tok_o, ))
                mbarrier.arrive(empty.index(slot))   # 8-warp barrier + one arrive: slot and P tile free
            it += 1

        if FMT == 2:
            l_i = gl.sum(l_i, 1)
        # epilogue (the single-partition kernel's)
        _g_epilogue(m_i, l_i, acc, hb, req64, si64, nsp, base_row, split, sink_ptr, out_ptr, lse_ptr, oacc_ptr,
                    lacc_ptr, s_q, h_q, acc_rows, sm_scale_log2, HAS_SINK, S_L, O_L)


@_jit
def _w_smem(FMT: gl.constexpr):
    """Both kernel entries' shared memory: Q, the 2-slot K (= V) ring, P; V3.2 (FMT 0) also the RoPE tiles (V4.1:
    ``p_smem`` stands in, never read); per slot the 64 tokens' validity (int8, written by the producer, read by the
    consumers' softmax); the ``ready`` / ``empty`` mbarriers, initialised."""
    D_V: gl.constexpr = 512
    SH_N: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, D_V], gl.bfloat16)
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
    vmask = gl.allocate_shared_memory(gl.int8, [2, 64], gl.SwizzledSharedLayout(1, 1, 1, [0]))
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    return q_n, q_p, kv_n, kv_p, p_smem, vmask, ready, empty


_NO_SPEC = ["page", "num_tok", "b", "s_q", "h_q", "topk", "acc_rows"]


@_jit(do_not_specialize=_NO_SPEC)
def _sparse_decode_gluon_ws_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
    stride_qb, stride_qs, stride_qh, stride_kb, page, num_tok, stride_ib, stride_is,
    b, s_q, h_q, topk, acc_rows, sm_scale_log2,
    PAGE_SHIFT: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr, SBLOCK: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, PRODUCER_FENCE: gl.constexpr, FMT: gl.constexpr, PROFILE: gl.constexpr = 0,
    DEQ_ASM: gl.constexpr = False, PF_L2: gl.constexpr = False, ROW_LANES: gl.constexpr = False,
):
    """``PROFILE`` (timing diagnostic, never dispatched; results meaningless): 1 = the producer only runs the ring
    protocol (no gather, no dequant: the consumers' time alone), 2 = the consumers release each slot at once (no
    math: the producer's time alone); 0 = the kernel. ``DEQ_ASM``: the producer dequantises through the inline-PTX
    :func:`_w_e4m3x4` (same values; :data:`WS_DEQ_ASM`); ``PF_L2``: it also asks L2 for block j+2's records
    (:func:`_w_prefetch_l2`, :data:`WS_PF_L2`); ``ROW_LANES``: its lanes run over token rows first
    (:data:`WS_ROW_LANES`)."""
    q_n, q_p, kv_n, kv_p, p_smem, vmask, ready, empty = _w_smem(FMT)
    if FMT == 0:
        gl.warp_specialize([
            (_w_consumer, (q_n, q_p, kv_n, kv_p, p_smem, vmask, ready, empty, q_ptr, idx_ptr, len_ptr, sink_ptr,
                           meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr, stride_qb, stride_qs, stride_qh,
                           num_tok, stride_ib, stride_is, b, s_q, h_q, topk, acc_rows, sm_scale_log2, None, None,
                           HAS_LEN, HAS_SINK, SBLOCK, FMT, False, False, PROFILE)),
            (_w_producer, (kv_n, kv_p, vmask, ready, empty, kv_ptr, idx_ptr, len_ptr, meta_ptr, nsplits_ptr,
                           stride_kb, page, num_tok, stride_ib, stride_is, b, s_q, h_q, topk, None, None, None, None,
                           None, None, None, None, None, PAGE_SHIFT, HAS_LEN, SBLOCK, PRODUCER_FENCE, False, False, 0,
                           0, PROFILE, DEQ_ASM, PF_L2, ROW_LANES)),
        ], [4], [PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_w_consumer, (q_n, q_p, kv_n, kv_p, p_smem, vmask, ready, empty, q_ptr, idx_ptr, len_ptr, sink_ptr,
                           meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr, stride_qb, stride_qs, stride_qh,
                           num_tok, stride_ib, stride_is, b, s_q, h_q, topk, acc_rows, sm_scale_log2, None, None,
                           HAS_LEN, HAS_SINK, SBLOCK, FMT, False, False, PROFILE)),
            (_w_producer41, (kv_n, vmask, ready, empty, kv_ptr, idx_ptr, len_ptr, meta_ptr, nsplits_ptr,
                             stride_kb, page, num_tok, stride_ib, stride_is, b, s_q, h_q, topk, None, None, None,
                             None, None, None, None, None, None, PAGE_SHIFT, HAS_LEN, SBLOCK, PRODUCER_FENCE, False,
                             False, 0, 0, PROFILE, DEQ_ASM, PF_L2, ROW_LANES)),
        ], [4], [PRODUCER_REGS])


_NO_SPEC_X = _NO_SPEC + ["xpage", "xnum_tok", "xtopk"]


@_jit(do_not_specialize=_NO_SPEC_X)
def _sparse_decode_gluon_ws_x_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, xkv_ptr, xidx_ptr, xlen_ptr, sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr,
    oacc_ptr, lacc_ptr,
    stride_qb, stride_qs, stride_qh, stride_kb, page, num_tok, stride_ib, stride_is,
    stride_xkb, xpage, xnum_tok, stride_xib, stride_xis,
    b, s_q, h_q, topk, xtopk, acc_rows, sm_scale_log2,
    PAGE_SHIFT: gl.constexpr, XPAGE_SHIFT: gl.constexpr, HAS_LEN: gl.constexpr, HAS_XLEN: gl.constexpr,
    HAS_SINK: gl.constexpr, SBLOCK: gl.constexpr, PRODUCER_REGS: gl.constexpr, PRODUCER_FENCE: gl.constexpr,
    FMT: gl.constexpr, XFMT: gl.constexpr,
):
    """With an extra cache (arguments as the single-partition kernel's): :func:`_sparse_decode_gluon_ws_kernel`'s
    shared memory and partitions, HAS_EXTRA on (a separate entry so that the no-extra kernel's parameter list, and
    so its PTX, stay as they were). Pairs: V3.2 + V3.2 (FMT 0, XFMT 0), V4.1 + V4.1 (2, 2), V4.1 + FP4 (2, 3)."""
    q_n, q_p, kv_n, kv_p, p_smem, vmask, ready, empty = _w_smem(FMT)
    if FMT == 0:
        gl.warp_specialize([
            (_w_consumer, (q_n, q_p, kv_n, kv_p, p_smem, vmask, ready, empty, q_ptr, idx_ptr, len_ptr, sink_ptr,
                           meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr, stride_qb, stride_qs, stride_qh,
                           num_tok, stride_ib, stride_is, b, s_q, h_q, topk, acc_rows, sm_scale_log2, xlen_ptr, xtopk,
                           HAS_LEN, HAS_SINK, SBLOCK, FMT, True, HAS_XLEN)),
            (_w_producer, (kv_n, kv_p, vmask, ready, empty, kv_ptr, idx_ptr, len_ptr, meta_ptr, nsplits_ptr,
                           stride_kb, page, num_tok, stride_ib, stride_is, b, s_q, h_q, topk, xkv_ptr, xidx_ptr,
                           xlen_ptr, stride_xkb, xpage, xnum_tok, stride_xib, stride_xis, xtopk, PAGE_SHIFT, HAS_LEN,
                           SBLOCK, PRODUCER_FENCE, True, HAS_XLEN, XPAGE_SHIFT, XFMT)),
        ], [4], [PRODUCER_REGS])
    else:
        gl.warp_specialize([
            (_w_consumer, (q_n, q_p, kv_n, kv_p, p_smem, vmask, ready, empty, q_ptr, idx_ptr, len_ptr, sink_ptr,
                           meta_ptr, nsplits_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr, stride_qb, stride_qs, stride_qh,
                           num_tok, stride_ib, stride_is, b, s_q, h_q, topk, acc_rows, sm_scale_log2, xlen_ptr, xtopk,
                           HAS_LEN, HAS_SINK, SBLOCK, FMT, True, HAS_XLEN)),
            (_w_producer41, (kv_n, vmask, ready, empty, kv_ptr, idx_ptr, len_ptr, meta_ptr, nsplits_ptr,
                             stride_kb, page, num_tok, stride_ib, stride_is, b, s_q, h_q, topk, xkv_ptr, xidx_ptr,
                             xlen_ptr, stride_xkb, xpage, xnum_tok, stride_xib, stride_xis, xtopk, PAGE_SHIFT, HAS_LEN,
                             SBLOCK, PRODUCER_FENCE, True, HAS_XLEN, XPAGE_SHIFT, XFMT)),
        ], [4], [PRODUCER_REGS])


# ----------------------------------------------------------------------------------------------- host code

def supported_ws(q: torch.Tensor, k_cache: torch.Tensor, fmt: str, extra_k_cache=None, config=None) -> bool:
    """Whether the WS kernel can take this call: everything :func:`_gluon_sparse_decode.supported` requires, plus
    main format V3.2 or V4.1 (:data:`WS_FMTS`) and no extra cache or one of :data:`WS_EXTRA_PAIRS` (V3.2 + V3.2,
    V4.1 + V4.1, V4.1 + FP4; the extra format follows from the record size). Whether sparse_decode.py sends a call
    here is :data:`DISPATCH_FMTS` and, with an extra cache, :data:`DISPATCH_EXTRA`."""
    if fmt not in WS_FMTS:
        return False
    if extra_k_cache is not None and _xfmt(extra_k_cache) not in WS_EXTRA_PAIRS[fmt]:
        return False
    return supported(q, k_cache, fmt, extra_k_cache, config)


def _acc_buffers(out, lse_buf, q, sched):
    """The split accumulators of one launch (``o_acc [b + parts, s_q, h_q, 512]``, ``l_acc [b + parts, s_q, h_q]``
    fp32) and their row count; with ``sparse_decode._POISON_OUTPUTS`` they and the outputs are NaN-filled first.
    Shared by the WS, WS2 and WS3 launchers."""
    from . import sparse_decode as sd
    b, s_q, h_q, _ = q.shape
    acc_rows = b + sched.shape[0]
    o_acc = torch.empty(acc_rows, s_q, h_q, 512, dtype=torch.float32, device=q.device)
    l_acc = torch.empty(acc_rows, s_q, h_q, dtype=torch.float32, device=q.device)
    if sd._POISON_OUTPUTS:
        for t in (out, lse_buf, o_acc, l_acc):
            t.fill_(float("nan"))
    return o_acc, l_acc, acc_rows


def _main_args(out, lse_buf, q, kv, indices, sched, num_splits, attn_sink, topk_length, o_acc, l_acc, acc_rows):
    """(pointer arguments, integer arguments) of the no-extra-cache kernels (WS, WS2, WS3 take the same list);
    ``kv`` is the cache viewed as bytes; absent optional tensors are replaced by ``l_acc`` (never read)."""
    b, s_q, h_q, _ = q.shape
    dummy = l_acc
    ptrs = (q, kv, indices, topk_length if topk_length is not None else dummy,
            attn_sink if attn_sink is not None else dummy, sched, num_splits, out, lse_buf, o_acc, l_acc)
    ints = (q.stride(0), q.stride(1), q.stride(2), kv.stride(0), kv.shape[1], kv.shape[0] * kv.shape[1],
            indices.stride(0), indices.stride(1), b, s_q, h_q, indices.shape[2], acc_rows)
    return ptrs, ints


def _launch_spec(_spec, ptrs, ints, acc_rows, sched, num_splits):
    """The launcher-cache specialisation key: :func:`deepkernels._launch.spec_key` of every argument, or, given the
    public op's call plan ``_spec``, that plan plus the only launch facts its signature does not fix
    (sched / num_splits / acc_rows)."""
    if _spec is None:
        return spec_key(*ptrs, *ints)
    return (_spec, acc_rows < 2 ** 31, sched.dtype, sched.data_ptr() & 15 == 0, num_splits.dtype,
            num_splits.data_ptr() & 15 == 0)


def launch_sparse_decode_gluon_ws(out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt, attn_sink=None,
                                  extra_k_cache=None, extra_indices=None, xfmt=None, topk_length=None,
                                  extra_topk_length=None, config=None, _spec=None, *,
                                  producer_regs=None, maxnreg=None, producer_fence=None, _profile=0,
                                  deq_asm=None, pf_l2=None, row_lanes=None):
    """Drop-in for ``launch_sparse_decode_gluon`` (same arguments and outputs; the caller checked
    :func:`supported_ws`; ``config`` ignored; ``_spec`` as there: the public op's cached call plan standing for the
    specialisation facts, or None to compute them with :func:`deepkernels._launch.spec_key`). Launches through a
    :class:`deepkernels._launch.KernelLauncher` (direct compiled-kernel launch once bound). Keyword-only tuning knobs
    (benchmarks): producer ``setmaxnreg``, launch ``maxnreg``, producer-side proxy fence; ``_profile`` 1 / 2: the
    kernel's timing diagnostics (consumers alone / producer alone; no extra cache; output meaningless);
    ``deq_asm``: the inline-PTX dequantisation (no extra cache; default: ``fmt in`` :data:`WS_DEQ_ASM`); ``pf_l2``:
    the producer's L2 prefetch of block j+2 (no extra cache; default: ``fmt in`` :data:`WS_PF_L2`)."""
    from .combine import combine_splits_
    from .metadata import SCHED_BLOCK

    has_x = extra_k_cache is not None
    xf = (xfmt or _xfmt(extra_k_cache)) if has_x else None
    if fmt not in WS_FMTS or (has_x and xf not in WS_EXTRA_PAIRS[fmt]):
        raise ValueError(f"launch_sparse_decode_gluon_ws: main cache {fmt!r}, extra cache {xf!r}: V3.2 or V4.1 main "
                         f"cache, no extra cache or {WS_EXTRA_PAIRS} only")
    if _profile and has_x:
        raise ValueError("launch_sparse_decode_gluon_ws: _profile is for calls without an extra cache")
    b, s_q, h_q, _ = q.shape
    parts = sched.shape[0]
    o_acc, l_acc, acc_rows = _acc_buffers(out, lse_buf, q, sched)
    kv = k_cache.view(torch.uint8)
    topk = indices.shape[2]
    dummy = l_acc
    if has_x:      # the single-partition kernel's argument list (extra cache, indices, lengths after the main ones)
        xkv = extra_k_cache.view(torch.uint8)
        xtopk = extra_indices.shape[2]
        ptrs = (q, kv, indices, topk_length if topk_length is not None else dummy, xkv, extra_indices,
                extra_topk_length if extra_topk_length is not None else dummy,
                attn_sink if attn_sink is not None else dummy, sched, num_splits, out, lse_buf, o_acc, l_acc)
        ints = (q.stride(0), q.stride(1), q.stride(2), kv.stride(0), kv.shape[1], kv.shape[0] * kv.shape[1],
                indices.stride(0), indices.stride(1), xkv.stride(0), xkv.shape[1], xkv.shape[0] * xkv.shape[1],
                extra_indices.stride(0), extra_indices.stride(1), b, s_q, h_q, topk, xtopk, acc_rows)
    else:
        ptrs, ints = _main_args(out, lse_buf, q, kv, indices, sched, num_splits, attn_sink, topk_length, o_acc,
                                l_acc, acc_rows)
    spec = _launch_spec(_spec, ptrs, ints, acc_rows, sched, num_splits)
    fence = WS_PRODUCER_FENCE if producer_fence is None else bool(producer_fence)
    opts = (NUM_WARPS, maxnreg or WS_MAXNREG)
    if has_x:
        kernel, names = _sparse_decode_gluon_ws_x_kernel, _CONSTEXPRS_X
        constexprs = (_page_shift(kv.shape[1]), _page_shift(xkv.shape[1]), topk_length is not None,
                      extra_topk_length is not None, attn_sink is not None, SCHED_BLOCK,
                      producer_regs or _producer_regs(fmt, xf), fence, GLUON_FMTS[fmt], _XFMT_CODES[xf])
    else:
        kernel, names = _sparse_decode_gluon_ws_kernel, _CONSTEXPRS
        constexprs = (_page_shift(kv.shape[1]), topk_length is not None, attn_sink is not None, SCHED_BLOCK,
                      producer_regs or _producer_regs(fmt), fence, GLUON_FMTS[fmt])
        if _profile:     # only then: the kernel's own launches keep their constexprs (and compiled kernel)
            names, constexprs = names + ("PROFILE", ), constexprs + (int(_profile), )
        if (fmt in WS_DEQ_ASM) if deq_asm is None else deq_asm:
            names, constexprs = names + ("DEQ_ASM", ), constexprs + (True, )
        if (fmt in WS_PF_L2) if pf_l2 is None else pf_l2:
            names, constexprs = names + ("PF_L2", ), constexprs + (True, )
        if (fmt in WS_ROW_LANES) if row_lanes is None else row_lanes:
            names, constexprs = names + ("ROW_LANES", ), constexprs + (True, )
    # the key names the constexprs too: the optional ones (PROFILE, DEQ_ASM) make tuples of different meaning whose
    # values can compare equal (True == 1)
    launcher = cached_launcher(_LAUNCHERS, kernel, (names, constexprs, opts, spec),
                               lambda: dict(zip(names, constexprs), num_warps=opts[0], maxnreg=opts[1]),
                               _LAUNCHER_LIMIT)
    launcher((parts * s_q * (h_q // BLOCK_H), ), *ptrs, *ints, scale * _LOG2E)
    combine_splits_(out, lse_buf.transpose(1, 2), o_acc, l_acc, num_splits, attn_sink=attn_sink,
                    lengths=topk_length, topk=topk, extra_lengths=extra_topk_length if has_x else None,
                    extra_topk=xtopk if has_x else None, rne=False, _spec=_spec)


def _producer_regs(fmt: str, xfmt=None) -> int:
    """The producer's setmaxnreg for a (main, extra) format pair (:data:`WS_PRODUCER_REGS_X` with an extra cache)."""
    if xfmt is not None:
        return WS_PRODUCER_REGS_X[(fmt, xfmt)]
    return WS_PRODUCER_REGS_V41 if fmt == "v41" else WS_PRODUCER_REGS


_CONSTEXPRS = ("PAGE_SHIFT", "HAS_LEN", "HAS_SINK", "SBLOCK", "PRODUCER_REGS", "PRODUCER_FENCE", "FMT")
_CONSTEXPRS_X = ("PAGE_SHIFT", "XPAGE_SHIFT", "HAS_LEN", "HAS_XLEN", "HAS_SINK", "SBLOCK", "PRODUCER_REGS",
                 "PRODUCER_FENCE", "FMT", "XFMT")
_LAUNCHERS: dict = {}   # (kernel, (constexprs, options, specialisation)) -> KernelLauncher
_LAUNCHER_LIMIT = 1024


def compile_sm90_ws(page_shift: int = 6, has_len: bool = True, has_sink: bool = True, producer_regs=None,
                    maxnreg=None, producer_fence=None, fmt: str = "v32", xfmt: str | None = None,
                    xpage_shift: int = 6, has_xlen: bool = True, profile: int = 0, deq_asm=None, pf_l2=None,
                    row_lanes=None):
    """Cross-compile the WS kernel for sm90 (no GPU needed) with the divisibility facts of an aligned launch;
    ``fmt``: main-cache format ("v32" / "v41"); ``xfmt``: extra-cache format (None: no extra cache, the
    no-extra kernel; "v32" / "v41" / "fp4": the extra-cache kernel, with ``xpage_shift`` / ``has_xlen``).
    Returns the CompiledKernel (``.asm['ptx']``, ``.metadata.shared``)."""
    if xfmt is not None:
        return _compile_sm90_ws_x(page_shift, has_len, has_sink, producer_regs, maxnreg, producer_fence, fmt, xfmt,
                                  xpage_shift, has_xlen)
    fn = _sparse_decode_gluon_ws_kernel
    sig = dict(q_ptr="*bf16", kv_ptr="*u8", idx_ptr="*i32", len_ptr="*i32", sink_ptr="*fp32", meta_ptr="*i32",
               nsplits_ptr="*i32", out_ptr="*bf16", lse_ptr="*fp32", oacc_ptr="*fp32", lacc_ptr="*fp32",
               stride_qb="i32", stride_qs="i32", stride_qh="i32", stride_kb="i32", page="i32", num_tok="i32",
               stride_ib="i32", stride_is="i32", b="i32", s_q="i32", h_q="i32", topk="i32", acc_rows="i32",
               sm_scale_log2="fp32")
    consts = dict(PAGE_SHIFT=page_shift, HAS_LEN=has_len, HAS_SINK=has_sink, SBLOCK=64,
                  PRODUCER_REGS=producer_regs or _producer_regs(fmt),
                  PRODUCER_FENCE=WS_PRODUCER_FENCE if producer_fence is None else bool(producer_fence),
                  FMT=GLUON_FMTS[fmt])
    # the optional constexprs always, in parameter order (the cross-compile binds constexprs by position)
    consts.update(PROFILE=int(profile), DEQ_ASM=bool((fmt in WS_DEQ_ASM) if deq_asm is None else deq_asm),
                  PF_L2=bool((fmt in WS_PF_L2) if pf_l2 is None else pf_l2),
                  ROW_LANES=bool((fmt in WS_ROW_LANES) if row_lanes is None else row_lanes))
    hinted = [k for k, v in sig.items() if v.startswith("*")] + ["stride_qb", "stride_qs", "stride_qh", "stride_kb",
                                                                  "stride_ib", "stride_is"]
    return _compile_sm90_gluon(fn, sig, consts, hinted, num_warps=NUM_WARPS, maxnreg=maxnreg or WS_MAXNREG)


def _compile_sm90_ws_x(page_shift, has_len, has_sink, producer_regs, maxnreg, producer_fence, fmt, xfmt,
                       xpage_shift, has_xlen):
    if xfmt not in WS_EXTRA_PAIRS.get(fmt, ()):
        raise ValueError(f"no WS kernel for main cache {fmt!r} + extra cache {xfmt!r}")
    fn = _sparse_decode_gluon_ws_x_kernel
    sig = dict(q_ptr="*bf16", kv_ptr="*u8", idx_ptr="*i32", len_ptr="*i32", xkv_ptr="*u8", xidx_ptr="*i32",
               xlen_ptr="*i32", sink_ptr="*fp32", meta_ptr="*i32", nsplits_ptr="*i32", out_ptr="*bf16",
               lse_ptr="*fp32", oacc_ptr="*fp32", lacc_ptr="*fp32",
               stride_qb="i32", stride_qs="i32", stride_qh="i32", stride_kb="i32", page="i32", num_tok="i32",
               stride_ib="i32", stride_is="i32", stride_xkb="i32", xpage="i32", xnum_tok="i32", stride_xib="i32",
               stride_xis="i32", b="i32", s_q="i32", h_q="i32", topk="i32", xtopk="i32", acc_rows="i32",
               sm_scale_log2="fp32")
    consts = dict(PAGE_SHIFT=page_shift, XPAGE_SHIFT=xpage_shift, HAS_LEN=has_len, HAS_XLEN=has_xlen,
                  HAS_SINK=has_sink, SBLOCK=64, PRODUCER_REGS=producer_regs or _producer_regs(fmt, xfmt),
                  PRODUCER_FENCE=WS_PRODUCER_FENCE if producer_fence is None else bool(producer_fence),
                  FMT=GLUON_FMTS[fmt], XFMT=_XFMT_CODES[xfmt])
    hinted = [k for k, v in sig.items() if v.startswith("*")] + ["stride_qb", "stride_qs", "stride_qh", "stride_kb",
                                                                  "stride_ib", "stride_is", "stride_xkb",
                                                                  "stride_xib", "stride_xis"]
    return _compile_sm90_gluon(fn, sig, consts, hinted, num_warps=NUM_WARPS, maxnreg=maxnreg or WS_MAXNREG)
