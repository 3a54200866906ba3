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

A "seesaw" variant (removed; added in 4cc5841, last present in c164f0f together with its barrier protocol in this
docstring) took the blocks in pairs: each of two one-warpgroup consumer partitions computed the full 64x64 S of its
own 64-token block of the pair (N=64 wgmmas, no cross-warpgroup reduction inside a block), the two warpgroups
exchanged the row max once per pair, P went into the block's RoPE tile of its ring slot, and both accumulated
P_1 V_1 + P_0 V_0 on their 256 value columns; "seesaw-split" also split the slot's ``ready`` barrier (S started on K
columns 0-255). Measured on the H200 in one process with "ws" (git 1f7e8fa, s_q 4096, h_q 128, topk 2048,
s_kv 8K-128K; ``results/mla_prefill_gluon-seesaw-h200-2026-11-29.json``): ws 359-405 TFLOPS, seesaw 348-404 (equal
at s_kv 8K, 4-5 % slower at 32K-128K), seesaw-split 293-342 (15-20 % slower). It did not pay: with a 2-slot ring (Q
72 KB + 2 x 72 KB leave no room for a third slot) the next pair's second block could only be gathered after both
warpgroups finished P_0 V_0, so one block gather per pair was exposed; and the softmax still did not overlap tensor
work (both warpgroups ran it at the same time).
"""
from __future__ import annotations

import torch

from .._backend import gluon_disabled, interpret_mode
from .._launch import cached_launcher, spec_key, triton_aligned
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
                   D_PE: gl.constexpr, HAS_LEN: gl.constexpr, NUM_SLOTS: gl.constexpr,
                   ROWS4: gl.constexpr = False):
    """Worker partition (4 warps): gather each 64-token block with cp.async into ring slot j % NUM_SLOTS once the
    consumers freed it; ``ready[slot]`` completes when every producer thread's copies have landed (an async
    cp.async.mbarrier.arrive per thread, net zero on the count, plus one ordinary arrive: count 1). ``ROWS4``
    (opt-in, session 18): the NoPE gather as 4 token rows x 8 lanes per warp instruction (the RoPE gather's layout)
    instead of 1 row x 32 lanes: each thread addresses 4 rows instead of 16 (fewer index loads / row offsets)."""
    if ROWS4:
        LN4: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    else:
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


# ----------------------------------------------------------------------------------------------- host code

def supported(q: torch.Tensor, kv: torch.Tensor) -> bool:
    """Whether the Gluon path takes this call: CUDA tensors on sm90, Gluon importable, h_q a multiple of 64,
    d_qk 576 or 512, q and kv 16-byte aligned with every stride but the last a multiple of 16 elements (the gather
    copies 16-byte vectors by cp.async, which needs the divisibility Triton derives only for multiples of 16: a row
    stride of 584 elements has 16-byte rows but would compile 2-byte copies; tests/test_review_s18.py), no
    interpreter, and ``DEEPKERNELS_DISABLE_GLUON`` unset."""
    if not available() or gluon_disabled("sparse_prefill"):
        return False
    if interpret_mode() or not q.is_cuda:
        return False
    if torch.cuda.get_device_capability(q.device)[0] != 9:
        return False
    aligned = all(t.stride(-1) == 1 and triton_aligned(t, *t.stride()[:-1]) for t in (q, kv))
    return aligned and q.shape[1] % BLOCK_H == 0 and q.shape[2] in (576, 512)


# "ws": the warp-specialised kernel (4-warp cp.async producer partition + 8 consumer warps). Dispatched: on the H200
# it measured 1.08-1.20x the single-partition kernel (360-401 vs 331-335 TFLOPS at s_q 4096, h_q 128, topk 2048,
# s_kv 8K-128K; git 3ea864ac1545, results/mla_prefill_gluon-ws-h200-2026-11-29.json). "single" stays selectable.
WS_SLOTS, WS_PRODUCER_REGS, WS_MAXNREG = 2, 40, 168
DISPATCH_VARIANT = "ws"


def _variant(variant):
    if variant is None:
        variant = DISPATCH_VARIANT
    if variant == "single":
        return _sparse_prefill_gluon_kernel, {}, {"num_warps": NUM_WARPS}
    if variant == "ws":
        return (_sparse_prefill_gluon_ws_kernel, {"NUM_SLOTS": WS_SLOTS, "PRODUCER_REGS": WS_PRODUCER_REGS},
                {"num_warps": NUM_WARPS, "maxnreg": WS_MAXNREG})
    raise ValueError(f"variant must be None, 'single', 'ws' or 'ws2', got {variant!r}")


def launch_sparse_prefill_gluon(out, max_logits, lse, q, kv, indices, sm_scale, attn_sink=None, topk_length=None,
                                variant=None):
    """Out-parameter launcher with the contract of ``prefill._launch_sparse_prefill`` (inputs validated by
    :func:`deepkernels.mla.prefill.flash_mla_sparse_fwd`; last dims contiguous; ``h_q % 64 == 0``).
    ``variant``: None (the dispatched one: the split-consumer kernel of :mod:`._gluon_sparse_prefill_ws2` while its
    ``dispatch_on()``, else :data:`DISPATCH_VARIANT`), ``"single"`` (one 8-warp partition), ``"ws"``
    (warp-specialised: producer partition + 8 consumer warps) or ``"ws2"`` (the split-consumer kernel). Launched
    through a
    :class:`deepkernels._launch.KernelLauncher` per (variant, flags, :func:`deepkernels._launch.spec_key` of the
    arguments) in ``_LAUNCHERS`` (direct compiled-kernel launch once bound)."""
    s_q, h_q, d_qk = q.shape
    if s_q == 0:
        return
    if variant in (None, "ws2"):
        from . import _gluon_sparse_prefill_ws2 as _ws2     # (imports this module: bound at call time)
        if variant == "ws2" or _ws2.dispatch_on():
            _ws2.launch_sparse_prefill_gluon_ws2(out, max_logits, lse, q, kv, indices, sm_scale, attn_sink,
                                                 topk_length)
            return
    fn, consts, opts = _variant(variant)
    args, ints = launch_args(out, max_logits, lse, q, kv, indices, attn_sink, topk_length)
    flags = (d_qk - D_V, topk_length is not None, attn_sink is not None)
    key = (flags, tuple(consts.items()), tuple(opts.items()), spec_key(*args, *ints))
    launcher = cached_launcher(_LAUNCHERS, fn, key, lambda: dict(
        D_PE=flags[0], HAS_LEN=flags[1], HAS_SINK=flags[2], **consts, **opts))
    launcher((s_q * (h_q // BLOCK_H), ), *args, float(sm_scale), float(sm_scale) * _LOG2E, *ints)


# (kernel, (flags, variant constexprs/options, specialisation)) -> KernelLauncher (deepkernels._launch.cached_launcher)
_LAUNCHERS: dict = {}

# the runtime arguments of every sparse prefill Gluon kernel (single, WS, WS2, WS4; WS3 moves scale_log2 behind H_Q),
# in order, for the sm90 cross-compiles, and the ones an aligned launch marks 16-divisible
SIG = {"q_ptr": "*bf16", "kv_ptr": "*bf16", "idx_ptr": "*i32", "len_ptr": "*i32", "sink_ptr": "*fp32",
       "out_ptr": "*bf16", "ml_ptr": "*fp32", "lse_ptr": "*fp32",
       "s_kv": "i32", "topk": "i32", "sm_scale": "fp32", "scale_log2": "fp32",
       "stride_qs": "i32", "stride_qh": "i32", "stride_kvs": "i32", "stride_is": "i32", "stride_os": "i32",
       "stride_oh": "i32", "H_Q": "i32"}
HINTED = ("q_ptr", "kv_ptr", "idx_ptr", "out_ptr", "stride_qs", "stride_qh", "stride_kvs", "stride_os", "stride_oh")


def launch_args(out, max_logits, lse, q, kv, indices, attn_sink, topk_length):
    """The launch arguments of :data:`SIG` around its two float scales: ``(args, ints)`` = the pointers (an absent
    length / sink tensor replaced by ``lse``, never read), s_kv, topk; then the strides and H_Q."""
    args = (q, kv, indices, topk_length if topk_length is not None else lse,
            attn_sink if attn_sink is not None else lse, out, max_logits, lse, kv.shape[0], indices.shape[-1])
    ints = (q.stride(0), q.stride(1), kv.stride(0), indices.stride(0), out.stride(0), out.stride(1), q.shape[1])
    return args, ints


def compile_sm90(d_pe: int = 64, has_len: bool = False, has_sink: bool = False, variant=None):
    """Cross-compile the kernel (``variant`` as in :func:`launch_sparse_prefill_gluon`) for sm90 (no GPU needed).
    Returns the CompiledKernel."""
    fn, extra, opts = _variant(variant)
    consts = {"D_PE": d_pe, "HAS_LEN": has_len, "HAS_SINK": has_sink, **extra}
    return _compile_sm90_gluon(fn, SIG, consts, HINTED, **opts)
