"""Gluon (``triton.experimental.gluon``, Triton 3.6) sparse top-k MLA prefill for sm90.

Same semantics as the Triton kernel in :mod:`deepkernels.mla.prefill` (FlashMLA ``flash_mla_sparse_fwd``):
one program per (query token, 64-head group), the token's top-k KV rows gathered 64 at a time, the 576-wide rows
split as 512 NoPE (also V) + 64 RoPE, online softmax in base 2 with the running max in raw-score units (the max
element gives exactly ``exp2(0)``), P rounded to bf16 only as the PV operand, invalid indices (``< 0``,
``>= s_kv``, positions ``>= topk_length``) never dereferenced and their rows zero-filled.

Why Gluon: Triton puts every warp on M for the chained dots, so with 64 heads both warpgroups computed the same
64x64 score tile (QK tensor-core work doubled, ``notes/mla_prefill.md``). Here the layouts are explicit:

* 8 warps = 2 warpgroups, MMA layouts ``warps_per_cta=[4, 2]``: for ``S = Q K^T`` each warpgroup computes 32 of
  the 64 token columns (no duplicated work); for ``O += P V`` each owns 256 of the 512 output columns
  (a ``[64, 256]`` fp32 accumulator, 128 registers per thread).
* The row max / row sum reduce across the two warpgroups (the compiler exchanges partials through shared
  memory); P goes to a ``[64, 64]`` bf16 shared tile that both warpgroups read as the A operand of PV.
* KV rows are gathered with ``cp.async`` (masked: invalid rows are zero-filled, never read) into a 2-deep ring
  of ``[64, 512] + [64, 64]`` tiles, so block j+1's gather runs under block j's MMAs and softmax. Q lives in
  shared memory for the whole program (64 KB + 8 KB).

Shared memory: Q 72 KB + ring 2 x 72 KB + P 8 KB = 224 KB (d_qk 576); the H200 allows 227 KB per block.
Two variants. ``"single"``: one 8-warp instruction stream, the overlap comes from cp.async; measured on the H200
(``results/mla_prefill_gluon-h200-2026-11-29*.json``) 331-338 TFLOPS at s_q 4096, h_q 128, topk 2048 vs 235-260 for
the Triton kernel. ``"ws"`` (dispatched): a 4-warp producer partition does the gather into an mbarrier ring and the
8 consumer warps only compute; 360-401 TFLOPS in the same run (``results/mla_prefill_gluon-ws-h200-2026-11-29.json``).
A software-pipelined variant (ring of 4 x 32-token or 8 x 16-token tiles, S(j+1) and PV(j) in flight together) was
correct but slower, 244 and 141 TFLOPS: with smaller tiles the per-block barriers, cross-warpgroup reductions and
narrow wgmmas cost more than the overlap wins (commit e495a5c has it).

``"seesaw"`` (experimental, not dispatched; ``_sparse_prefill_gluon_ss_kernel``): blocks are taken in pairs, each
consumer warpgroup computes the whole S of its own block, so S is an N=64 wgmma and the softmax needs no
cross-warpgroup reduction inside a block.

* Partitions (``num_warps=4``, 384 threads, ``maxnreg`` 168 at entry): WG0 = the default partition, WG1 = worker 0,
  the cp.async producer = worker 1 (4 warps). ``setmaxnreg``: 232 / 232 / 40. ptxas (d_qk 576): 196-204 spill
  bytes; in SASS WG0 has 3 local accesses (setup), the producer 12-14, WG1 56-62: WG1 keeps the loop-invariant Q
  wgmma descriptors in local memory (~10 LDL at the top of each pair, L1 hits), WG0 keeps them in uniform registers;
  more registers for WG1 (240, 248) do not change that.
* Pair i = blocks 2i (WG0) and 2i+1 (WG1). Slots alternate: WG0's block goes to slot ``i & 1``, WG1's to the other
  (a fixed slot per warpgroup made every wgmma descriptor loop-invariant: LICM hoisted ~60 64-bit descriptors and
  ptxas spilled 1.2 KB per thread inside the consumer loop).
* Per pair, each WG: wait ``ready[own slot]`` -> S = Q K^T (36 x m64n64k16, K 576, Q from shared memory) -> mask ->
  row max to ``x_buf[W]``, arrive ``mx_bar[W]``, wait ``mx_bar[1-W]`` -> m_new = max(m_old, max_0, max_1), the same
  bits in both WGs -> P = exp2((S - m_new) * scale * log2 e), own row sum l_W += sum(P) (fp32, before rounding) ->
  P (bf16) into the own slot's RoPE tile (``kv_p[own]``: after S nothing reads it, and it has P's size and NVMMA
  layout; with d_qk 512 a separate ``[2, 64, 64]`` tile) -> arrive ``p_bar[W]`` -> acc *= alpha ->
  O[:, 256W:256W+256] += P_1 V_1 (WG1's block) then += P_0 V_0, two commit groups; ``wait(1)`` -> arrive
  ``empty[WG1's slot]``, ``wait(0)`` -> arrive ``empty[WG0's slot]``. WG1 issues P_1 V_1 (its own P) before
  waiting ``p_bar[0]``; WG0 waits ``p_bar[1]`` first.
* Row sums stay per warpgroup (both are scaled by the same alphas) and are added once at the end through ``x_buf``
  + ``fin_bar``; l_0 + l_1 is the same fp32 value in both (addition commutes). One add per row instead of an
  exchange per pair; the sum differs from "ws" only in association order (inside the FlashMLA tolerances).
* Barriers: ``ready[2]`` (count 1: per producer thread an async cp.async arrive + one arrive), ``empty[2]`` (count
  2: one arrive per consumer WG), ``mx_bar[2]`` / ``p_bar[2]`` / ``fin_bar[2]`` (count 1, indexed by WG),
  ``q_bar`` (count 2: each WG stores 32 of Q's 64 head rows). Phases: pair i waits parity ``i & 1``; the
  producer waits ``empty`` with parity ``(i & 1) ^ 1`` (a fresh barrier passes). Buffer reuse: ``x_buf[W]`` and
  (d_qk 512) ``p_buf`` are rewritten in pair i+1 only after the other WG's ``p_bar`` / ``mx_bar`` arrive of a later
  point in program order (it read the max before publishing P; it finished its PV of pair i before publishing the
  max of pair i+1); with d_qk 576 P lives in a ring slot, which the producer refills only after both WGs released it.
* Dependency / release order: the ring holds exactly one pair (Q 72 KB + 2 x 72 KB = 216 KB; a third 72 KB slot or
  separate P tiles do not fit next to it in 227 KB — hence P in the RoPE tiles). The next pair's first block can
  only land in a slot whose PV readers are done, so both WGs run P_1 V_1 first and release WG1's slot after it:
  the producer gathers block 2i+2 (WG0's next, into that slot) while P_0 V_0 runs; block 2i+3 (WG1's next) is
  gathered after P_0 V_0, so one block gather per pair is only hidden by WG0's S of the next pair, WG1 waits for
  the rest of it and WG0 then waits for WG1's max. That exposed gather is the cost of the pair structure.
* Odd block counts: the last pair's second block is past ``topk_length``/topk, so every row is masked: the
  producer's cp.async zero-fills it without a global read, S = 0 is masked to -inf, P = 0, PV adds 0 — the loop stays
  uniform (one wasted block per query only when the count is odd; topk 2048 gives 32 blocks).
* Shared memory: 222,064 bytes (d_qk 576), 213,840 (512); limit 232,448.
* ``"seesaw-split"``: the same kernel with ``SPLIT``: the producer gathers K columns [0, 256) of a block, arms
  ``ready_lo[slot]`` (cp.async arrive + arrive, count 1), then columns [256, 512) + RoPE and arms ``ready[slot]``; the
  consumer issues the first 16 S k-steps after ``ready_lo`` and the remaining 20 after ``ready``, so the S of the late
  block (WG1's, see above) starts while the second half of its gather is in flight. Registers 224 / 224 / 56 (the
  split producer spilled ~150 local accesses per pair at 40); ptxas 228-284 spill bytes (WG1 53-74 local accesses as
  above, producer 26-37). Its own prediction: +0-8 % over "seesaw" (hides up to ~45 % of the exposed gather).
* Prediction (s_q 4096, h_q 128, topk 2048, H200): per pair the tensor work is 4.7 M (S) + 4.2 M (PV) MAC
  = ~4,350 clk at 2,048 MAC/clk/SM; "ws" at 360-401 TFLOPS takes ~10,300 clk per two blocks (1.75 GHz), so ~6,000
  clk of non-MMA time per pair. This variant removes the 4 cross-warpgroup reductions (+ their barriers) per pair and
  runs S as N=64 instead of N=32 wgmmas (estimate -1,500 to -2,500 clk) but exposes part of one 72 KB block gather
  per pair (+1,000 to +2,000 clk, the upper end at s_kv 128K where rows come from HBM). Expected 0.9-1.2x "ws",
  ~330-470 TFLOPS: below FlashMLA (494-540) and the 640 target. Softmax still does not overlap tensor work (both
  WGs do it at the same time); next steps: split ``ready`` barriers (K columns 0-255 vs the rest, so S of a block
  starts on the first half) and an FA3-style stagger of the two warpgroups.
"""
from __future__ import annotations

import torch

from .._backend import gluon_disabled, interpret_mode
from .._launch import cached_launcher, spec_key
from .._gluon import (IMPORT_ERROR as _IMPORT_ERROR, available, gl, async_copy, fence_async_shared, mbarrier,
                      warpgroup_mma, warpgroup_mma_wait)
from .._gluon import compile_sm90 as _compile_sm90_gluon, jit as _jit

__all__ = ["available", "supported", "launch_sparse_prefill_gluon"]

BLOCK_H = 64
BLOCK_N = 64
D_V = 512
NUM_WARPS = 8
_LOG2E = 1.4426950408889634




# ----------------------------------------------------------------------------------------------- device code

@_jit
def _g_gather(kvn_buf, kvp_buf, kv_ptr, idx_row, start, n, s_kv, stride_kvs,
              BLOCK_N: gl.constexpr, D_V: gl.constexpr, D_PE: gl.constexpr,
              LN: gl.constexpr, LP: gl.constexpr, COMMIT: gl.constexpr = True):
    """cp.async the KV rows of top-k positions [start, start + BLOCK_N) into one ring slot; invalid rows
    (index < 0, >= s_kv, or position >= n) are zero-filled and never dereferenced."""
    offs_n = start + gl.arange(0, BLOCK_N, gl.SliceLayout(1, LN))
    idx = gl.load(idx_row + offs_n, mask=offs_n < n, other=-1)
    ok = (idx >= 0) & (idx < s_kv)
    rows = kv_ptr + gl.where(ok, idx, 0).to(gl.int64)[:, None] * stride_kvs
    offs_d = gl.arange(0, D_V, gl.SliceLayout(0, LN))
    async_copy.async_copy_global_to_shared(kvn_buf, rows + offs_d[None, :], mask=ok[:, None])
    if D_PE > 0:
        offs_np = start + gl.arange(0, BLOCK_N, gl.SliceLayout(1, LP))
        idxp = gl.load(idx_row + offs_np, mask=offs_np < n, other=-1)
        okp = (idxp >= 0) & (idxp < s_kv)
        rowsp = kv_ptr + gl.where(okp, idxp, 0).to(gl.int64)[:, None] * stride_kvs
        offs_p = gl.arange(0, D_PE, gl.SliceLayout(0, LP))
        async_copy.async_copy_global_to_shared(kvp_buf, rowsp + D_V + offs_p[None, :], mask=okp[:, None])
    if COMMIT:      # single-partition kernel: tracked by commit groups; the WS producer uses an mbarrier instead
        async_copy.commit_group()


@_jit
def _g_scores(q_n, q_p, kv_n, kv_p, slot, s_zero, D_PE: gl.constexpr):
    """Issue S = Q_nope K_nope^T (+ Q_rope K_rope^T) for one ring slot, async; returns the token."""
    tok = warpgroup_mma(q_n, kv_n.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
    if D_PE > 0:
        tok = warpgroup_mma(q_p, kv_p.index(slot).permute((1, 0)), tok, is_async=True)
    return tok


@_jit
def _g_softmax(s, idx_row, start, n, s_kv, m_i, l_i, scale_log2, BLOCK_N: gl.constexpr, S_L: gl.constexpr):
    """Online-softmax step on the raw scores of top-k positions [start, start + BLOCK_N): returns
    (P fp32, new running max, new row sum, alpha = rescale factor for the accumulator)."""
    offs_n = start + gl.arange(0, BLOCK_N, gl.SliceLayout(0, S_L))
    idx = gl.load(idx_row + offs_n, mask=offs_n < n, other=-1)
    valid = (idx >= 0) & (idx < s_kv)
    s = gl.where(valid[None, :], s, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(s, 1))
    m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = gl.exp2((m_i - m_safe) * scale_log2)
    p = gl.exp2((s - m_safe[:, None]) * scale_log2)
    return p, m_new, l_i * alpha + gl.sum(p, 1), alpha


@_jit
def _g_block(q_n, q_p, kv_n, kv_p, p_smem, slot, s_zero, acc, m_i, l_i, idx_row, start, n, s_kv, scale_log2,
             D_PE: gl.constexpr, BLOCK_N: gl.constexpr, S_L: gl.constexpr, O_L: gl.constexpr):
    """One 64-token block already in ring slot ``slot``: S (split by token columns), online softmax, P through
    shared memory (both warpgroups' halves), O += P V (split by value columns). Returns (acc, m_i, l_i)."""
    tok_s = _g_scores(q_n, q_p, kv_n, kv_p, slot, s_zero, D_PE)
    s = warpgroup_mma_wait(0, deps=(tok_s, ))
    p, m_i, l_i, alpha = _g_softmax(s, idx_row, start, n, s_kv, m_i, l_i, scale_log2, BLOCK_N, S_L)
    p_smem.store(p.to(gl.bfloat16))
    fence_async_shared()
    gl.thread_barrier()          # both halves of P written before either warpgroup reads it
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
    tok_o = warpgroup_mma(p_smem, kv_n.index(slot), acc, is_async=True)
    acc = warpgroup_mma_wait(0, deps=(tok_o, ))
    return acc, m_i, l_i


@_jit
def _g_finish(acc, m_i, l_i, tok, hb, sink_ptr, out_ptr, ml_ptr, lse_ptr, sm_scale, stride_os, stride_oh, H_Q,
              HAS_SINK: gl.constexpr, S_L: gl.constexpr, O_L: gl.constexpr):
    """Epilogue: out = acc / (L [+ exp(sink - m)]) in bf16, lse and max_logits in natural-log units; rows with no
    valid token: out 0, lse +inf, max_logits -inf."""
    BLOCK_H: gl.constexpr = 64
    D_V: gl.constexpr = 512
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(1, S_L))
    denom = l_safe
    if HAS_SINK:
        sink = gl.load(sink_ptr + offs_h)
        m_nat = gl.where(empty, 0.0, m_i * sm_scale)
        denom = l_safe + gl.exp(sink - m_nat)
    inv = gl.where(empty, 0.0, 1.0 / denom)
    out = acc * gl.convert_layout(inv, gl.SliceLayout(1, O_L))[:, None]
    offs_ho = hb * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(1, O_L))
    offs_d = gl.arange(0, D_V, gl.SliceLayout(0, O_L))
    o_rows = out_ptr + tok * stride_os + offs_ho.to(gl.int64)[:, None] * stride_oh
    gl.store(o_rows + offs_d[None, :], out.to(gl.bfloat16))
    lse = gl.where(empty, float("inf"), m_i * sm_scale + gl.log(l_safe))
    mx = gl.where(empty, float("-inf"), m_i * sm_scale)
    gl.store(lse_ptr + tok * H_Q + offs_h, lse)
    gl.store(ml_ptr + tok * H_Q + offs_h, mx)


@_jit
def _sparse_prefill_gluon_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr,
    s_kv, topk, sm_scale, scale_log2,
    stride_qs, stride_qh, stride_kvs, stride_is, stride_os, stride_oh, H_Q,
    D_PE: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr,
):
    BLOCK_H: gl.constexpr = 64
    BLOCK_N: gl.constexpr = 64
    D_V: gl.constexpr = 512
    # MMA layouts: 2 warpgroups side by side along N (S: 32 token columns each; O: 256 value columns each)
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    # gather layouts: 16-byte (8 x bf16) vectors, a warp covers one 512-wide row (NoPE) or 4 x 64 (RoPE)
    LN: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
    LP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    SH_N: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], gl.bfloat16)
    SH_P: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 64], gl.bfloat16)
    SH_PB: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)

    NUM_HB = H_Q // BLOCK_H
    pid = gl.program_id(0)
    tok = (pid // NUM_HB).to(gl.int64)
    hb = pid % NUM_HB

    # Q -> shared memory (once)
    q_n = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_V], SH_N)
    offs_hq = hb * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(1, LN))
    q_rows = q_ptr + tok * stride_qs + offs_hq.to(gl.int64)[:, None] * stride_qh
    q_n.store(gl.load(q_rows + gl.arange(0, D_V, gl.SliceLayout(0, LN))[None, :]))
    kv_n = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, D_V], SH_N)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], SH_PB)
    if D_PE > 0:
        q_p = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_PE], SH_P)
        offs_hp = hb * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(1, LP))
        q_rows_p = q_ptr + tok * stride_qs + offs_hp.to(gl.int64)[:, None] * stride_qh
        q_p.store(gl.load(q_rows_p + D_V + gl.arange(0, D_PE, gl.SliceLayout(0, LP))[None, :]))
        kv_p = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, D_PE], SH_P)
    else:
        q_p = q_n
        kv_p = kv_n

    n = topk
    if HAS_LEN:
        n = gl.minimum(gl.maximum(gl.load(len_ptr + tok), 0), topk)
    idx_row = idx_ptr + tok * stride_is
    num_blocks = gl.cdiv(n, BLOCK_N)

    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))   # running max of raw q.k
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, S_L))
    acc = gl.zeros([BLOCK_H, D_V], gl.float32, O_L)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, S_L)

    if num_blocks > 0:
        _g_gather(kv_n.index(0), kv_p.index(0), kv_ptr, idx_row, 0, n, s_kv, stride_kvs,
                  BLOCK_N, D_V, D_PE, LN, LP)
    for j in range(num_blocks):
        slot = j % 2
        # every warp finished block j-1's PV (which read slot 1 - slot) before anyone refills that slot
        gl.thread_barrier()
        if j + 1 < num_blocks:
            _g_gather(kv_n.index(1 - slot), kv_p.index(1 - slot), kv_ptr, idx_row, (j + 1) * BLOCK_N, n, s_kv,
                      stride_kvs, BLOCK_N, D_V, D_PE, LN, LP)
            async_copy.wait_group(1)
        else:
            async_copy.wait_group(0)
        fence_async_shared()
        gl.thread_barrier()          # block j's rows (copied by all threads) visible to both warpgroups
        acc, m_i, l_i = _g_block(q_n, q_p, kv_n, kv_p, p_smem, slot, s_zero, acc, m_i, l_i, idx_row, j * BLOCK_N, n,
                                 s_kv, scale_log2, D_PE, BLOCK_N, S_L, O_L)

    _g_finish(acc, m_i, l_i, tok, hb, sink_ptr, out_ptr, ml_ptr, lse_ptr, sm_scale, stride_os, stride_oh, H_Q,
              HAS_SINK, S_L, O_L)


@_jit
def _g_ws_rows(len_ptr, tok, topk, HAS_LEN: gl.constexpr):
    """Top-k positions this query token attends (topk_length clamped to [0, topk]) and its number of 64-blocks."""
    n = topk
    if HAS_LEN:
        n = gl.minimum(gl.maximum(gl.load(len_ptr + tok), 0), topk)
    return n, gl.cdiv(n, 64)


@_jit
def _g_ws_producer(kv_n, kv_p, ready, empty, kv_ptr, idx_ptr, len_ptr, s_kv, topk, stride_kvs, stride_is, H_Q,
                   D_PE: gl.constexpr, HAS_LEN: gl.constexpr, NUM_SLOTS: gl.constexpr):
    """Worker partition (4 warps): gather each 64-token block with cp.async into ring slot j % NUM_SLOTS once the
    consumers freed it; ``ready[slot]`` completes when every producer thread's copies have landed (an async
    cp.async.mbarrier.arrive per thread, net zero on the count, plus one ordinary arrive: count 1)."""
    LN4: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    LP4: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    tok = (gl.program_id(0) // (H_Q // 64)).to(gl.int64)
    n, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    idx_row = idx_ptr + tok * stride_is
    for j in range(num_blocks):
        slot = j % NUM_SLOTS
        mbarrier.wait(empty.index(slot), ((j // NUM_SLOTS) & 1) ^ 1)   # a fresh barrier passes phase 1
        _g_gather(kv_n.index(slot), kv_p.index(slot), kv_ptr, idx_row, j * 64, n, s_kv, stride_kvs,
                  64, 512, D_PE, LN4, LP4, False)
        async_copy.mbarrier_arrive(ready.index(slot))
        mbarrier.arrive(ready.index(slot))


@_jit
def _g_ws_consumer(q_n, q_p, kv_n, kv_p, p_smem, ready, empty, q_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, ml_ptr,
                   lse_ptr, s_kv, topk, sm_scale, scale_log2, stride_qs, stride_qh, stride_is, stride_os, stride_oh,
                   H_Q, D_PE: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr,
                   NUM_SLOTS: gl.constexpr):
    """Default partition (8 warps = the two consumer warpgroups): Q to shared memory, then per block wait
    ``ready``, S (split by token columns), softmax, P to shared memory, O += P V (split by value columns), release
    the slot (``empty``: the arrive lowers to a barrier of these 8 warps, so both warpgroups' P V are done and P's
    tile is free); epilogue as the single-partition kernel."""
    BLOCK_H: gl.constexpr = 64
    BLOCK_N: gl.constexpr = 64
    D_V: gl.constexpr = 512
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    LN: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [8, 1], [1, 0])
    LP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    NUM_HB = H_Q // BLOCK_H
    pid = gl.program_id(0)
    tok = (pid // NUM_HB).to(gl.int64)
    hb = pid % NUM_HB
    offs_hq = hb * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(1, LN))
    q_rows = q_ptr + tok * stride_qs + offs_hq.to(gl.int64)[:, None] * stride_qh
    q_n.store(gl.load(q_rows + gl.arange(0, D_V, gl.SliceLayout(0, LN))[None, :]))
    if D_PE > 0:
        offs_hp = hb * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(1, LP))
        q_rows_p = q_ptr + tok * stride_qs + offs_hp.to(gl.int64)[:, None] * stride_qh
        q_p.store(gl.load(q_rows_p + D_V + gl.arange(0, D_PE, gl.SliceLayout(0, LP))[None, :]))
    fence_async_shared()
    gl.thread_barrier()
    n, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    idx_row = idx_ptr + tok * stride_is
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, S_L))
    acc = gl.zeros([BLOCK_H, D_V], gl.float32, O_L)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, S_L)
    for j in range(num_blocks):
        slot = j % NUM_SLOTS
        mbarrier.wait(ready.index(slot), (j // NUM_SLOTS) & 1)
        fence_async_shared()         # the cp.async writes (generic proxy) before the wgmma reads (async proxy)
        acc, m_i, l_i = _g_block(q_n, q_p, kv_n, kv_p, p_smem, slot, s_zero, acc, m_i, l_i, idx_row, j * BLOCK_N, n,
                                 s_kv, scale_log2, D_PE, BLOCK_N, S_L, O_L)
        mbarrier.arrive(empty.index(slot))
    _g_finish(acc, m_i, l_i, tok, hb, sink_ptr, out_ptr, ml_ptr, lse_ptr, sm_scale, stride_os, stride_oh, H_Q,
              HAS_SINK, S_L, O_L)


@_jit
def _sparse_prefill_gluon_ws_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr,
    s_kv, topk, sm_scale, scale_log2,
    stride_qs, stride_qh, stride_kvs, stride_is, stride_os, stride_oh, H_Q,
    D_PE: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr,
    NUM_SLOTS: gl.constexpr, PRODUCER_REGS: gl.constexpr,
):
    """Warp-specialised variant (dispatched): a 4-warp producer partition does the
    cp.async gather into a NUM_SLOTS ring (mbarriers ``ready`` / ``empty``), the 8-warp default partition computes
    exactly what the single-partition kernel does, without issuing a single gather instruction."""
    BLOCK_H: gl.constexpr = 64
    BLOCK_N: gl.constexpr = 64
    D_V: gl.constexpr = 512
    SH_N: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], gl.bfloat16)
    SH_P: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 64], gl.bfloat16)
    SH_PB: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)
    q_n = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_V], SH_N)
    kv_n = gl.allocate_shared_memory(gl.bfloat16, [NUM_SLOTS, BLOCK_N, D_V], SH_N)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], SH_PB)
    if D_PE > 0:
        q_p = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_PE], SH_P)
        kv_p = gl.allocate_shared_memory(gl.bfloat16, [NUM_SLOTS, BLOCK_N, D_PE], SH_P)
    else:
        q_p = q_n
        kv_p = kv_n
    ready = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [NUM_SLOTS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_SLOTS):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.warp_specialize([
        (_g_ws_consumer, (q_n, q_p, kv_n, kv_p, p_smem, ready, empty, q_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr,
                          ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2, stride_qs, stride_qh, stride_is,
                          stride_os, stride_oh, H_Q, D_PE, HAS_LEN, HAS_SINK, NUM_SLOTS)),
        (_g_ws_producer, (kv_n, kv_p, ready, empty, kv_ptr, idx_ptr, len_ptr, s_kv, topk, stride_kvs, stride_is, H_Q,
                          D_PE, HAS_LEN, NUM_SLOTS)),
    ], [4], [PRODUCER_REGS])


# ------------------------------------------------------------------------------ "seesaw" variant (experimental)
# Two consumer partitions of one warpgroup each (WG0 = the default partition, WG1 = a worker) plus the 4-warp
# producer. Pair i = blocks 2i (WG0, ring slot i & 1) and 2i + 1 (WG1, the other slot). Protocol: module docstring.

@_jit
def _g_ss_rows(kv_ptr, idx_row, start, n, s_kv, stride_kvs, L: gl.constexpr):
    """Row pointers (invalid rows: row 0, never read) and validity of top-k positions [start, start + 64)."""
    offs_n = start + gl.arange(0, 64, gl.SliceLayout(1, L))
    idx = gl.load(idx_row + offs_n, mask=offs_n < n, other=-1)
    ok = (idx >= 0) & (idx < s_kv)
    return kv_ptr + gl.where(ok, idx, 0).to(gl.int64)[:, None] * stride_kvs, ok


@_jit
def _g_ss_gather_split(kvn_buf, kvp_buf, ready_lo, kv_ptr, idx_row, start, n, s_kv, stride_kvs, D_PE: gl.constexpr):
    """Like :func:`_g_gather` (producer, 4 warps) in two parts: K columns [0, 256), then ``ready_lo`` is armed (its
    cp.async arrive completes when this thread's copies so far have landed), then columns [256, 512) + RoPE."""
    LH: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    LP4: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    rows, ok = _g_ss_rows(kv_ptr, idx_row, start, n, s_kv, stride_kvs, LH)
    offs_d = gl.arange(0, 256, gl.SliceLayout(0, LH))
    async_copy.async_copy_global_to_shared(kvn_buf.slice(0, 256, dim=1), rows + offs_d[None, :], mask=ok[:, None])
    async_copy.mbarrier_arrive(ready_lo)
    mbarrier.arrive(ready_lo)
    async_copy.async_copy_global_to_shared(kvn_buf.slice(256, 256, dim=1), rows + 256 + offs_d[None, :],
                                           mask=ok[:, None])
    if D_PE > 0:
        rowsp, okp = _g_ss_rows(kv_ptr, idx_row, start, n, s_kv, stride_kvs, LP4)
        offs_p = gl.arange(0, D_PE, gl.SliceLayout(0, LP4))
        async_copy.async_copy_global_to_shared(kvp_buf, rowsp + 512 + offs_p[None, :], mask=okp[:, None])


@_jit
def _g_ss_producer(kv_n, kv_p, ready, ready_lo, empty, kv_ptr, idx_ptr, len_ptr, s_kv, topk, stride_kvs, stride_is,
                   H_Q, D_PE: gl.constexpr, HAS_LEN: gl.constexpr, SPLIT: gl.constexpr):
    """Producer (4 warps): for each pair i, slot i & 1 <- block 2i (WG0's), then slot (i + 1) & 1 <- block 2i + 1
    (WG1's), each once both consumer warpgroups released it (``empty[s]``, count 2; the first of the two is the slot
    released first). A block past the last one (odd block count) is still "gathered":
    every row is masked, so cp.async zero-fills the slot without a global read and the pair stays uniform."""
    LN4: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    LP4: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    tok = (gl.program_id(0) // (H_Q // 64)).to(gl.int64)
    n, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    idx_row = idx_ptr + tok * stride_is
    for i in range(gl.cdiv(num_blocks, 2)):
        for w in gl.static_range(2):
            slot = (i + w) & 1          # block 2i + w -> the slot warpgroup w owns in pair i
            mbarrier.wait(empty.index(slot), (i & 1) ^ 1)    # a fresh barrier passes phase 1
            if SPLIT:
                _g_ss_gather_split(kv_n.index(slot), kv_p.index(slot), ready_lo.index(slot), kv_ptr, idx_row,
                                   (2 * i + w) * 64, n, s_kv, stride_kvs, D_PE)
            else:
                _g_gather(kv_n.index(slot), kv_p.index(slot), kv_ptr, idx_row, (2 * i + w) * 64, n, s_kv,
                          stride_kvs, 64, 512, D_PE, LN4, LP4, False)
            async_copy.mbarrier_arrive(ready.index(slot))
            mbarrier.arrive(ready.index(slot))


@_jit
def _g_ss_finish(acc, m_i, l_i, tok, hb, sink_ptr, out_ptr, ml_ptr, lse_ptr, sm_scale, stride_os, stride_oh, H_Q,
                 W: gl.constexpr, HAS_SINK: gl.constexpr, S_L: gl.constexpr, O_L: gl.constexpr):
    """Epilogue of one seesaw warpgroup: its 256 output columns (``l_i`` is already the sum of both warpgroups'
    row sums); warpgroup 0 also writes lse and max_logits. Same formulas as :func:`_g_finish`."""
    BLOCK_H: gl.constexpr = 64
    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    offs_h = hb * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(1, S_L))
    denom = l_safe
    if HAS_SINK:
        sink = gl.load(sink_ptr + offs_h)
        m_nat = gl.where(empty, 0.0, m_i * sm_scale)
        denom = l_safe + gl.exp(sink - m_nat)
    inv = gl.where(empty, 0.0, 1.0 / denom)
    out = acc * gl.convert_layout(inv, gl.SliceLayout(1, O_L))[:, None]
    offs_ho = hb * BLOCK_H + gl.arange(0, BLOCK_H, gl.SliceLayout(1, O_L))
    offs_d = W * 256 + gl.arange(0, 256, gl.SliceLayout(0, O_L))
    o_rows = out_ptr + tok * stride_os + offs_ho.to(gl.int64)[:, None] * stride_oh
    gl.store(o_rows + offs_d[None, :], out.to(gl.bfloat16))
    if W == 0:
        lse = gl.where(empty, float("inf"), m_i * sm_scale + gl.log(l_safe))
        mx = gl.where(empty, float("-inf"), m_i * sm_scale)
        gl.store(lse_ptr + tok * H_Q + offs_h, lse)
        gl.store(ml_ptr + tok * H_Q + offs_h, mx)


@_jit
def _g_ss_consumer(q_n, q_p, kv_n, kv_p, p_buf, x_buf, ready, ready_lo, empty, q_bar, mx_bar, p_bar, fin_bar,
                   q_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2,
                   stride_qs, stride_qh, stride_is, stride_os, stride_oh, H_Q,
                   W: gl.constexpr, D_PE: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr,
                   SPLIT: gl.constexpr):
    """Consumer warpgroup ``W`` (4 warps): per pair, the full 64x64 S of its own block (ring slot (i + W) & 1), row
    max exchanged with the other warpgroup (``x_buf[W]`` + ``mx_bar[W]``), P of its block into its slot's ``p_buf``
    tile (``p_bar[W]``), then O[:, 256W:256W+256] += P_1 V_1 + P_0 V_0, releasing WG1's slot as soon as P_1 V_1 is
    done and WG0's after P_0 V_0. Row sums stay per warpgroup and are added once at the end (``x_buf`` +
    ``fin_bar``)."""
    BLOCK_H: gl.constexpr = 64
    BLOCK_N: gl.constexpr = 64
    D_V: gl.constexpr = 512
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 256, 16])
    R_L: gl.constexpr = gl.SliceLayout(1, S_L)
    LN: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    LP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    NUM_HB = H_Q // BLOCK_H
    pid = gl.program_id(0)
    tok = (pid // NUM_HB).to(gl.int64)
    hb = pid % NUM_HB
    # Q -> shared memory: this warpgroup loads head rows [32W, 32W + 32); q_bar (count 2) = both halves stored
    offs_hq = hb * BLOCK_H + W * 32 + gl.arange(0, 32, gl.SliceLayout(1, LN))
    q_rows = q_ptr + tok * stride_qs + offs_hq.to(gl.int64)[:, None] * stride_qh
    q_n.slice(W * 32, 32, dim=0).store(gl.load(q_rows + gl.arange(0, D_V, gl.SliceLayout(0, LN))[None, :]))
    if D_PE > 0:
        offs_hp = hb * BLOCK_H + W * 32 + gl.arange(0, 32, gl.SliceLayout(1, LP))
        q_rows_p = q_ptr + tok * stride_qs + offs_hp.to(gl.int64)[:, None] * stride_qh
        q_p.slice(W * 32, 32, dim=0).store(gl.load(q_rows_p + D_V + gl.arange(0, D_PE, gl.SliceLayout(0, LP))[None, :]))
    fence_async_shared()
    gl.thread_barrier()
    mbarrier.arrive(q_bar)
    mbarrier.wait(q_bar, 0)

    n, num_blocks = _g_ws_rows(len_ptr, tok, topk, HAS_LEN)
    idx_row = idx_ptr + tok * stride_is
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, R_L)    # running max of raw q.k, identical in both WGs
    l_i = gl.zeros([BLOCK_H], gl.float32, R_L)                  # this warpgroup's blocks only
    acc = gl.zeros([BLOCK_H, 256], gl.float32, O_L)
    s_zero = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, S_L)
    for i in range(gl.cdiv(num_blocks, 2)):
        ph = i & 1
        s_own = (i + W) & 1             # WG0 owns slot i & 1, WG1 the other one (they alternate every pair)
        s_1 = (i + 1) & 1               # WG1's slot: its P V goes first, so this slot is released first
        s_0 = i & 1
        # S = Q K^T for the own block (M 64 heads, N 64 tokens, K 576)
        if SPLIT:                    # K columns [0, 256) first, the rest when it has landed
            mbarrier.wait(ready_lo.index(s_own), ph)
            fence_async_shared()
            k_own = kv_n.index(s_own)
            tok_s = warpgroup_mma(q_n.slice(0, 256, dim=1), k_own.slice(0, 256, dim=1).permute((1, 0)), s_zero,
                                  use_acc=False, is_async=True)
            mbarrier.wait(ready.index(s_own), ph)
            fence_async_shared()
            tok_s = warpgroup_mma(q_n.slice(256, 256, dim=1), k_own.slice(256, 256, dim=1).permute((1, 0)), tok_s,
                                  is_async=True)
            if D_PE > 0:
                tok_s = warpgroup_mma(q_p, kv_p.index(s_own).permute((1, 0)), tok_s, is_async=True)
        else:
            mbarrier.wait(ready.index(s_own), ph)
            fence_async_shared()     # the cp.async writes (generic proxy) before the wgmma reads (async proxy)
            tok_s = _g_scores(q_n, q_p, kv_n, kv_p, s_own, s_zero, D_PE)
        s = warpgroup_mma_wait(0, deps=(tok_s, ))
        offs_n = (2 * i + W) * BLOCK_N + gl.arange(0, BLOCK_N, gl.SliceLayout(0, S_L))
        idx = gl.load(idx_row + offs_n, mask=offs_n < n, other=-1)
        valid = (idx >= 0) & (idx < s_kv)
        s = gl.where(valid[None, :], s, float("-inf"))
        # row max exchange: both warpgroups end up with the same m_new (max is exact and commutative)
        mx = gl.max(s, 1)
        x_buf.slice(W * 64, 64).store(mx)
        gl.thread_barrier()
        mbarrier.arrive(mx_bar.index(W))
        mbarrier.wait(mx_bar.index(1 - W), ph)
        m_new = gl.maximum(m_i, gl.maximum(mx, x_buf.slice((1 - W) * 64, 64).load(R_L)))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2((m_i - m_safe) * scale_log2)
        p = gl.exp2((s - m_safe[:, None]) * scale_log2)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        # P of the own block (into the own slot's RoPE tile, read by S above and by nothing else)
        p_buf.index(s_own).store(p.to(gl.bfloat16))
        fence_async_shared()
        gl.thread_barrier()
        mbarrier.arrive(p_bar.index(W))
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        v_1 = kv_n.index(s_1).slice(W * 256, 256, dim=1)
        v_0 = kv_n.index(s_0).slice(W * 256, 256, dim=1)
        if W == 1:                   # P_1 is WG1's own: issue P_1 V_1 before waiting for WG0's P_0
            tok_a = warpgroup_mma(p_buf.index(s_1), v_1, acc, is_async=True)
            mbarrier.wait(p_bar.index(0), ph)
        else:
            mbarrier.wait(p_bar.index(1), ph)
            tok_a = warpgroup_mma(p_buf.index(s_1), v_1, acc, is_async=True)
        tok_b = warpgroup_mma(p_buf.index(s_0), v_0, tok_a, is_async=True)
        acc_t = warpgroup_mma_wait(1, deps=(tok_b, ))
        mbarrier.arrive(empty.index(s_1))        # P_1 V_1 retired: this WG no longer reads WG1's slot
        acc = warpgroup_mma_wait(0, deps=(acc_t, ))
        mbarrier.arrive(empty.index(s_0))
    # row sums: l = l_0 + l_1 (the same fp32 value in both warpgroups: addition is commutative)
    gl.thread_barrier()
    x_buf.slice(W * 64, 64).store(l_i)
    gl.thread_barrier()
    mbarrier.arrive(fin_bar.index(W))
    mbarrier.wait(fin_bar.index(1 - W), 0)
    l_i = l_i + x_buf.slice((1 - W) * 64, 64).load(R_L)
    _g_ss_finish(acc, m_i, l_i, tok, hb, sink_ptr, out_ptr, ml_ptr, lse_ptr, sm_scale, stride_os, stride_oh, H_Q,
                 W, HAS_SINK, S_L, O_L)


@_jit
def _sparse_prefill_gluon_ss_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr,
    s_kv, topk, sm_scale, scale_log2,
    stride_qs, stride_qh, stride_kvs, stride_is, stride_os, stride_oh, H_Q,
    D_PE: gl.constexpr, HAS_LEN: gl.constexpr, HAS_SINK: gl.constexpr,
    CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr, SPLIT: gl.constexpr = False,
):
    """Seesaw variant (experimental, launched with num_warps=4): default partition = consumer warpgroup 0, worker 0 =
    consumer warpgroup 1, worker 1 = the cp.async producer. See the module docstring for the protocol."""
    BLOCK_H: gl.constexpr = 64
    BLOCK_N: gl.constexpr = 64
    D_V: gl.constexpr = 512
    SH_N: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, D_V], gl.bfloat16)
    SH_P: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 64], gl.bfloat16)
    SH_PB: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)
    SH_X: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, order=[0])
    WG0: gl.constexpr = 0
    WG1: gl.constexpr = 1
    q_n = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_V], SH_N)
    kv_n = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, D_V], SH_N)
    if D_PE > 0:
        q_p = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, D_PE], SH_P)
        kv_p = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, D_PE], SH_P)
        p_buf = kv_p         # P of block 2i + w overwrites its own slot's RoPE tile once S of that block is done
    else:
        q_p = q_n
        kv_p = kv_n
        p_buf = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_H, BLOCK_N], SH_PB)
    x_buf = gl.allocate_shared_memory(gl.float32, [2 * BLOCK_H], SH_X)   # [WG0 | WG1]: row max per pair, row sums
    ready = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    mx_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    p_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    fin_bar = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    if SPLIT:                # "seesaw-split": K columns [0, 256) of a slot landed
        ready_lo = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(ready_lo.index(i), count=1)
    else:
        ready_lo = ready
    for i in gl.static_range(2):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=2)
        mbarrier.init(mx_bar.index(i), count=1)
        mbarrier.init(p_bar.index(i), count=1)
        mbarrier.init(fin_bar.index(i), count=1)
    mbarrier.init(q_bar, count=2)
    gl.warp_specialize([
        (_g_ss_consumer, (q_n, q_p, kv_n, kv_p, p_buf, x_buf, ready, ready_lo, empty, q_bar, mx_bar, p_bar, fin_bar,
                          q_ptr,
                          idx_ptr, len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2,
                          stride_qs, stride_qh, stride_is, stride_os, stride_oh, H_Q, WG0, D_PE, HAS_LEN, HAS_SINK,
                          SPLIT)),
        (_g_ss_consumer, (q_n, q_p, kv_n, kv_p, p_buf, x_buf, ready, ready_lo, empty, q_bar, mx_bar, p_bar, fin_bar,
                          q_ptr,
                          idx_ptr, len_ptr, sink_ptr, out_ptr, ml_ptr, lse_ptr, s_kv, topk, sm_scale, scale_log2,
                          stride_qs, stride_qh, stride_is, stride_os, stride_oh, H_Q, WG1, D_PE, HAS_LEN, HAS_SINK,
                          SPLIT)),
        (_g_ss_producer, (kv_n, kv_p, ready, ready_lo, empty, kv_ptr, idx_ptr, len_ptr, s_kv, topk, stride_kvs,
                          stride_is, H_Q, D_PE, HAS_LEN, SPLIT)),
    ], [4, 4], [CONSUMER_REGS, PRODUCER_REGS])


# ----------------------------------------------------------------------------------------------- host code

def supported(q: torch.Tensor, kv: torch.Tensor) -> bool:
    """Whether the Gluon path takes this call: CUDA tensors on sm90, Gluon importable, h_q a multiple of 64,
    d_qk 576 or 512, rows of q and kv 16-byte aligned (the gather copies 16-byte vectors), no interpreter,
    and ``DEEPKERNELS_DISABLE_GLUON`` unset."""
    if not available() or gluon_disabled("sparse_prefill"):
        return False
    if interpret_mode() or not q.is_cuda:
        return False
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    aligned = all(t.data_ptr() % 16 == 0 and t.stride(-1) == 1 and all(st % 8 == 0 for st in t.stride()[:-1])
                  for t in (q, kv))
    return aligned and q.shape[1] % BLOCK_H == 0 and q.shape[2] in (576, 512)


# "ws": the warp-specialised kernel (4-warp cp.async producer partition + 8 consumer warps). Dispatched: on the H200
# it measured 1.08-1.20x the single-partition kernel (360-401 vs 331-335 TFLOPS at s_q 4096, h_q 128, topk 2048,
# s_kv 8K-128K; git 3ea864ac1545, results/mla_prefill_gluon-ws-h200-2026-11-29.json). "single" stays selectable.
WS_SLOTS, WS_PRODUCER_REGS, WS_MAXNREG = 2, 40, 168
DISPATCH_VARIANT = "ws"
# "seesaw": experimental, not dispatched (module docstring); 3 partitions of 4 warps: consumer WG0 (default, gets the
# registers left over), consumer WG1, producer.
# "seesaw-split": the same kernel with split ready barriers (SPLIT); its producer holds the row pointers across the
# first arrive, so it gets 56 registers (at 40 it spilled ~150 local accesses per pair), the consumers 224.
SS_CONSUMER_REGS, SS_PRODUCER_REGS, SS_MAXNREG = 232, 40, 168
SS_SPLIT_CONSUMER_REGS, SS_SPLIT_PRODUCER_REGS = 224, 56


def _variant(variant):
    if variant is None:
        variant = DISPATCH_VARIANT
    if variant == "single":
        return _sparse_prefill_gluon_kernel, {}, {"num_warps": NUM_WARPS}
    if variant == "ws":
        return (_sparse_prefill_gluon_ws_kernel, {"NUM_SLOTS": WS_SLOTS, "PRODUCER_REGS": WS_PRODUCER_REGS},
                {"num_warps": NUM_WARPS, "maxnreg": WS_MAXNREG})
    if variant == "seesaw":
        return (_sparse_prefill_gluon_ss_kernel, {"CONSUMER_REGS": SS_CONSUMER_REGS, "PRODUCER_REGS": SS_PRODUCER_REGS},
                {"num_warps": 4, "maxnreg": SS_MAXNREG})
    if variant == "seesaw-split":
        return (_sparse_prefill_gluon_ss_kernel, {"CONSUMER_REGS": SS_SPLIT_CONSUMER_REGS,
                                                  "PRODUCER_REGS": SS_SPLIT_PRODUCER_REGS, "SPLIT": True},
                {"num_warps": 4, "maxnreg": SS_MAXNREG})
    raise ValueError(f"variant must be None, 'single', 'ws', 'seesaw' or 'seesaw-split', got {variant!r}")


def launch_sparse_prefill_gluon(out, max_logits, lse, q, kv, indices, sm_scale, attn_sink=None, topk_length=None,
                                variant=None):
    """Out-parameter launcher with the contract of ``prefill._launch_sparse_prefill`` (inputs validated by
    :func:`deepkernels.mla.prefill.flash_mla_sparse_fwd`; last dims contiguous; ``h_q % 64 == 0``).
    ``variant``: None (the dispatched one, :data:`DISPATCH_VARIANT`), ``"single"`` (one 8-warp partition) or
    ``"ws"`` (warp-specialised: producer partition + 8 consumer warps). Launched through a
    :class:`deepkernels._launch.KernelLauncher` per (variant, flags, :func:`deepkernels._launch.spec_key` of the
    arguments) in ``_LAUNCHERS`` (direct compiled-kernel launch once bound)."""
    s_q, h_q, d_qk = q.shape
    if s_q == 0:
        return
    fn, consts, opts = _variant(variant)
    dummy = lse
    args = (q, kv, indices, topk_length if topk_length is not None else dummy,
            attn_sink if attn_sink is not None else dummy, out, max_logits, lse,
            kv.shape[0], indices.shape[-1])
    ints = (q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), out.stride(0), out.stride(1), h_q)
    flags = (d_qk - D_V, topk_length is not None, attn_sink is not None)
    key = (flags, tuple(consts.items()), tuple(opts.items()), spec_key(*args, *ints))
    launcher = cached_launcher(_LAUNCHERS, fn, key, lambda: dict(
        D_PE=flags[0], HAS_LEN=flags[1], HAS_SINK=flags[2], **consts, **opts))
    launcher((s_q * (h_q // BLOCK_H), ), *args, float(sm_scale), float(sm_scale) * _LOG2E, *ints)


# (kernel, (flags, variant constexprs/options, specialisation)) -> KernelLauncher (deepkernels._launch.cached_launcher)
_LAUNCHERS: dict = {}


def compile_sm90(d_pe: int = 64, has_len: bool = False, has_sink: bool = False, variant=None):
    """Cross-compile the kernel (``variant`` as in :func:`launch_sparse_prefill_gluon`) for sm90 (no GPU needed).
    Returns the CompiledKernel."""
    fn, extra, opts = _variant(variant)
    sig = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "idx_ptr": "*i32", "len_ptr": "*i32", "sink_ptr": "*fp32",
           "out_ptr": "*bf16", "ml_ptr": "*fp32", "lse_ptr": "*fp32",
           "s_kv": "i32", "topk": "i32", "sm_scale": "fp32", "scale_log2": "fp32",
           "stride_qs": "i32", "stride_qh": "i32", "stride_kvs": "i32", "stride_is": "i32", "stride_os": "i32",
           "stride_oh": "i32", "H_Q": "i32"}
    consts = {"D_PE": d_pe, "HAS_LEN": has_len, "HAS_SINK": has_sink, **extra}
    hinted = ("q_ptr", "kv_ptr", "idx_ptr", "out_ptr", "stride_qs", "stride_qh", "stride_kvs", "stride_os",
              "stride_oh")
    return _compile_sm90_gluon(fn, sig, consts, hinted, **opts)
