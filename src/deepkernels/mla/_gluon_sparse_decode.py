"""Gluon (``triton.experimental.gluon``, Triton 3.6) sparse top-k MLA decode over FP8 KV caches for sm90.

Same contract as the Triton split-KV kernel :func:`deepkernels.mla._sparse_kernels._sparse_decode_fwd_kernel`
(which stays the fallback for everything this one does not take): one CTA per (scheduler part, query position,
64-head block), persistent over the requests of its part (FlashMLA scheduler records, spec/mla.md §3), split
boundaries clamped to the actual token line and the last split of a request running to its end, indices valid iff
``position < topk_length`` and ``0 <= idx < num_blocks * page_block_size`` (anything else is never dereferenced:
masked loads), single-split requests write ``out``/``lse`` (sink applied here), split requests write ``O/L`` and
the base-2 ``log2 L + m`` to accumulator row ``num_splits[req] + split`` for the unchanged ``combine_splits_``.

Formats: main cache V3.2 (656 B/token: 512 e4m3, 4 fp32 scales, 64 bf16 RoPE; d_qk 576) or V4.1 (528 B/token:
512 e4m3 incl. RoPE, 16 UE8M0 scales; d_qk 512); optional extra cache of the same format, or FP4 (288 B/token:
256 B of e2m1 pairs, 32 e4m3 scales) next to V4.1, attended in the same online softmax after the main blocks
(virtual line: main positions, then extra positions from ``64 * ceil(n_main / 64)``; a second token loop).
Dequantisation is the Triton kernel's, bit for bit: ``bf16(fp32(e4m3) * fp32 scale)`` rounded once (UE8M0:
``2^(e-127)``, 0 -> 2^-127, 255 -> NaN; FP4: ``e2m1 * e4m3``, exact).

Structure (one partition, 8 warps = 2 warpgroups, like the Gluon sparse prefill kernel):

* MMA layouts ``warps_per_cta=[4, 2]``: ``S = Q K^T`` -- each warpgroup computes 32 of the 64 token columns (no
  duplicated QK work, the Triton kernel's structural loss); ``O += P V`` -- each owns 256 of the 512 columns.
* A 2-slot ring of dequantised bf16 K (= V) tiles ``[64, 512]`` (+ ``[64, 64]`` RoPE for V3.2) in shared memory.
  Per 64-token block j: issue the gather of block j+1's raw FP8 records (plain masked ``ld.global`` of 16-byte
  vectors into registers, as packed int32 words) and block j+2's indices -> S_j (wgmma, slot j%2) -> online softmax
  (running max in raw-score units) -> P to a ``[64, 64]`` bf16 shared tile -> ``acc *= alpha`` -> P V_j issued
  asynchronously; *while it runs* block j+1's records are dequantised into the other slot. The gather is issued at
  the top of the iteration, not right after the previous dequant: every ``fence.proxy.async`` becomes
  ``MEMBAR.ALL.CTA`` in SASS, and if that waits for outstanding global loads, a gather issued before the
  end-of-iteration fence would be fully exposed (not measured; this order leaves S_j + softmax to hide it either way).
* V4.1: the row sum is kept per column (``[64, 64]`` fp32, 16 registers) and reduced once per request, so the
  only per-block cross-warpgroup reduction is the row max (2 barriers instead of 4); V3.2 has no registers left
  for it (spills in the token loop) and reduces per block.
* Q of the current request lives in shared memory (64 x 576 bf16).

Shared memory: V3.2 Q 72 KB + ring 2 x 72 KB + P 8 KB = 224 KB; V4.1 200 KB.
No interpreter support (Gluon); cross-compiles on a CPU (:func:`compile_sm90`).
"""
from __future__ import annotations

import torch

from .._backend import gluon_disabled, interpret_mode
from .._launch import cached_launcher, spec_key
from .._gluon import (IMPORT_ERROR as _IMPORT_ERROR, available, gl, fence_async_shared, warpgroup_mma,
                      warpgroup_mma_wait)
from .._gluon import compile_sm90 as _compile_sm90_gluon, jit as _jit

__all__ = ["available", "supported", "launch_sparse_decode_gluon", "compile_sm90", "GLUON_FMTS"]

BLOCK_H = 64
BLOCK_N = 64
NUM_WARPS = 8
_LOG2E = 1.4426950408889634
GLUON_FMTS = {"v32": 0, "v41": 2}     # main-cache format codes as in _sparse_kernels.FMT_CODES
# main-cache formats the public op sends here (a policy on top of `supported`): those measured faster than the
# Triton kernel on the H200 in the same run (results/mla_sparse_gluon-h200-2026-11-29.json: V3.2 1.09-1.12x; V4.1
# 0.96-0.98x and V4.1 + FP4 slower too, so V4.1 stays on Triton)
DISPATCH_FMTS = frozenset({"v32"})
_XFMT_CODES = {"v32": 0, "v41": 2, "fp4": 3}
_BPT = {"v32": 656, "v41": 528}




# ----------------------------------------------------------------------------------------------- device code

@_jit
def _g_ue8m0(e):
    """UE8M0 byte -> fp32 2^(e-127): 0 -> 2^-127 (subnormal bits), 255 -> NaN (as the Triton kernel)."""
    e32 = e.to(gl.int32)
    bits = gl.where(e32 == 0, 0x00400000, e32 << 23)
    v = bits.to(gl.float32, bitcast=True)
    return gl.where(e32 == 255, float("nan"), v)


@_jit
def _g_rows(idx, valid, page, stride_kb, RB: gl.constexpr, PAGE_SHIFT: gl.constexpr):
    """int64 byte offset of each token's record (invalid tokens -> 0, never dereferenced: masked)."""
    idx = gl.where(valid, idx, 0)
    if PAGE_SHIFT >= 0:
        blk = idx >> PAGE_SHIFT
        row = idx & ((1 << PAGE_SHIFT) - 1)
    else:
        blk = idx // page
        row = idx - blk * page
    return blk.to(gl.int64) * stride_kb + row.to(gl.int64) * RB


@_jit
def _g_load_idx(idx_row, start, t_end, num_tok, LAY: gl.constexpr):
    """Indices of positions [start, start + 64) in layout LAY and their validity (position < t_end, in range)."""
    offs = start + gl.arange(0, 64, LAY)
    inb = offs < t_end
    idx = gl.load(idx_row + offs, mask=inb, other=-1)
    return idx, inb & (idx >= 0) & (idx < num_tok)


@_jit
def _g_gather(kv_ptr, idx, valid, idx_p, valid_p, page, stride_kb,
              FMT: gl.constexpr, PAGE_SHIFT: gl.constexpr, L3: gl.constexpr, LP: gl.constexpr):
    """Issue the masked loads of 64 token records: the e4m3 bytes as packed int32 words [64, G, E/4] (4 bytes per
    register: a loop-carried tensor of 8-bit elements would take one register per byte), scales [64, G] (fp32),
    and for V3.2 the bf16 RoPE [64, 64] (zeros otherwise). Invalid tokens load zeros (V zero), never
    dereferenced."""
    LS2: gl.constexpr = gl.SliceLayout(2, L3)
    G: gl.constexpr = 4 if FMT == 0 else (16 if FMT == 2 else 32)
    W: gl.constexpr = 128 // G if FMT != 3 else 2
    RB: gl.constexpr = 656 if FMT == 0 else (528 if FMT == 2 else 288)
    rec = _g_rows(idx, valid, page, stride_kb, RB, PAGE_SHIFT)
    g = gl.arange(0, G, gl.SliceLayout(0, LS2))
    w = gl.arange(0, W, gl.SliceLayout(0, gl.SliceLayout(1, L3)))
    vm2 = valid[:, None] & (g >= 0)[None, :]
    wp = (kv_ptr + rec).to(gl.pointer_type(gl.int32))
    raw = gl.load((wp[:, None] + (g * W)[None, :])[:, :, None] + w[None, None, :], mask=vm2[:, :, None], other=0)
    if FMT == 0:
        sp = (kv_ptr + rec + 512).to(gl.pointer_type(gl.float32))
        sc = gl.load(sp[:, None] + g[None, :], mask=vm2, other=0.0)
        recp = _g_rows(idx_p, valid_p, page, stride_kb, RB, PAGE_SHIFT)
        pp = (kv_ptr + recp + 528).to(gl.pointer_type(gl.bfloat16))
        dr = gl.arange(0, 64, gl.SliceLayout(0, LP))
        rope = gl.load(pp[:, None] + dr[None, :], mask=valid_p[:, None] & (dr >= 0)[None, :], other=0.0)
    elif FMT == 2:
        eb = gl.load(kv_ptr + (rec + 512)[:, None] + g[None, :], mask=vm2, other=127)
        sc = _g_ue8m0(eb)
        rope = gl.zeros([64, 64], gl.bfloat16, LP)
    else:               # FP4: [256 B of e2m1 pairs][32 e4m3 scales, one per 8 bytes = 16 elements]
        eb = gl.load(kv_ptr + (rec + 256)[:, None] + g[None, :], mask=vm2, other=0)
        sc = eb.to(gl.float8e4nv, bitcast=True).to(gl.float32)
        rope = gl.zeros([64, 64], gl.bfloat16, LP)
    return raw, sc, rope


@_jit
def _g_byte(raw, sc, K: gl.constexpr):
    """bf16(fp32(e4m3 byte K of each word) * scale)."""
    b = ((raw >> (8 * K)) & 0xFF).to(gl.uint8)
    return (b.to(gl.float8e4nv, bitcast=True).to(gl.float32) * sc[:, :, None]).to(gl.bfloat16)


@_jit
def _g_nib(raw, sc, K: gl.constexpr, C: gl.constexpr):
    """bf16(value(e2m1 nibble C of byte K of each word) * e4m3 scale): magnitude bits to fp32 bits 22..24, sign to
    bit 31, times 2^126 exactly (the Triton kernel's _e2m1_pair_to_f32), times the scale (exact)."""
    r = raw >> (8 * K + 4 * C)
    v = (((r & 7) << 22) | ((r & 8) << 28)).to(gl.float32, bitcast=True) * 8.507059173023462e37
    return (v * sc[:, :, None]).to(gl.bfloat16)


@_jit
def _g_dequant_store(raw, sc, rope, kv_n_slot, kv_p_slot, FMT: gl.constexpr, LN: gl.constexpr):
    """bf16(fp32(e4m3) * scale) -> the [64, 512] shared K/V tile (+ RoPE tile for V3.2). Byte k of word w is
    element 4w + k: join(join(b0, b2), join(b1, b3)) puts it at [w, k // 2, k % 2]."""
    if FMT == 3:
        # 8 e2m1 per word: element 2k + c = nibble c of byte k; Z[c][b][a] = nibble c of byte 2a + b, joined
        # innermost-first so that [a, b, c] flattens to 4a + 2b + c
        x = gl.join(gl.join(gl.join(_g_nib(raw, sc, 0, 0), _g_nib(raw, sc, 2, 0)),
                            gl.join(_g_nib(raw, sc, 1, 0), _g_nib(raw, sc, 3, 0))),
                    gl.join(gl.join(_g_nib(raw, sc, 0, 1), _g_nib(raw, sc, 2, 1)),
                            gl.join(_g_nib(raw, sc, 1, 1), _g_nib(raw, sc, 3, 1))))
    else:
        b0 = _g_byte(raw, sc, 0)
        b1 = _g_byte(raw, sc, 1)
        b2 = _g_byte(raw, sc, 2)
        b3 = _g_byte(raw, sc, 3)
        x = gl.join(gl.join(b0, b2), gl.join(b1, b3))
    x = gl.convert_layout(gl.reshape(x, [64, 512]), LN)
    kv_n_slot.store(x)
    if FMT == 0:
        kv_p_slot.store(rope)


@_jit
def _g_attend(m_i, l_i, acc, q_n, q_p, kv_n, kv_p, p_smem, s_zero, kv_ptr, idx_row, t_lo, t_end, num_tok, page,
              stride_kb, sm_scale_log2, FMT: gl.constexpr, PAGE_SHIFT: gl.constexpr, PSUM: gl.constexpr,
              S_L: gl.constexpr, O_L: gl.constexpr, LN: gl.constexpr, LP: gl.constexpr):
    """Online softmax + P V over the 64-token blocks of positions [t_lo, t_end) of one index row (t_lo a multiple
    of 64; positions >= t_end invalid) of a cache in format FMT; returns the updated (m_i, l_i, acc). Ring slot 0
    is free on entry (every earlier wgmma waited, CTA barrier passed); the same holds on exit."""
    HAS_ROPE: gl.constexpr = FMT == 0
    # raw-record layout (int32 words): a warp covers one record's quantised bytes with 16-byte (FP4: 8-byte)
    # vectors (lanes: G scale groups x the vectors of a group)
    if FMT == 0:
        L3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 4, 8], [8, 1, 1], [2, 1, 0])
    elif FMT == 2:
        L3: gl.constexpr = gl.BlockedLayout([1, 1, 4], [1, 16, 2], [8, 1, 1], [2, 1, 0])
    else:
        L3: gl.constexpr = gl.BlockedLayout([1, 1, 2], [1, 32, 1], [8, 1, 1], [2, 1, 0])
    LR: gl.constexpr = gl.SliceLayout(1, gl.SliceLayout(2, L3))     # token vector of the raw gather
    LRP: gl.constexpr = gl.SliceLayout(1, LP)                        # token vector of the RoPE gather
    LS: gl.constexpr = gl.SliceLayout(0, S_L)                        # token vector of the score tile
    nblocks = gl.maximum(t_end - t_lo + 63, 0) // 64
    # prologue: block 0 dequantised into slot 0; block 1's indices loaded
    i0, v0 = _g_load_idx(idx_row, t_lo, t_end, num_tok, LR)
    i0p, v0p = _g_load_idx(idx_row, t_lo, t_end, num_tok, LRP)
    raw, sc, rope = _g_gather(kv_ptr, i0, v0, i0p, v0p, page, stride_kb, FMT, PAGE_SHIFT, L3, LP)
    _g_dequant_store(raw, sc, rope, kv_n.index(0), kv_p.index(0), FMT, LN)
    i1, v1 = _g_load_idx(idx_row, t_lo + 64, t_end, num_tok, LR)
    i1p, v1p = _g_load_idx(idx_row, t_lo + 64, t_end, num_tok, LRP)
    fence_async_shared()
    gl.thread_barrier()

    for j in range(nblocks):
        slot = j % 2
        t0 = t_lo + j * 64
        # gather of block j+1's raw records (registers; dequantised under P V_j below), issued first so that
        # its memory latency hides under S_j and the softmax; then block j+2's indices and block j's validity
        raw, sc, rope = _g_gather(kv_ptr, i1, v1, i1p, v1p, page, stride_kb, FMT, PAGE_SHIFT, L3, LP)
        i1, v1 = _g_load_idx(idx_row, t0 + 128, t_end, num_tok, LR)
        i1p, v1p = _g_load_idx(idx_row, t0 + 128, t_end, num_tok, LRP)
        _, valid = _g_load_idx(idx_row, t0, t_end, num_tok, LS)
        tok = warpgroup_mma(q_n, kv_n.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if HAS_ROPE:
            tok = warpgroup_mma(q_p, kv_p.index(slot).permute((1, 0)), tok, is_async=True)
        s = warpgroup_mma_wait(0, deps=(tok, ))
        # online softmax step (as _sparse_kernels.online_softmax_step): invalid -> -inf by selection
        s = gl.where(valid[None, :], s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2((m_i - m_safe) * sm_scale_log2)
        p = gl.exp2((s - m_safe[:, None]) * sm_scale_log2)
        if PSUM:
            l_i = l_i * alpha[:, None] + p
        else:
            l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        p_smem.store(p.to(gl.bfloat16))
        fence_async_shared()
        gl.thread_barrier()          # both halves of P written before either warpgroup reads it
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, O_L))[:, None]
        tok_o = warpgroup_mma(p_smem, kv_n.index(slot), acc, is_async=True)
        # under P V_j: dequantise block j+1 into the other slot (last read by S_{j-1} / P V_{j-1}, waited by
        # every warp before the barrier above)
        if j + 1 < nblocks:
            _g_dequant_store(raw, sc, rope, kv_n.index(1 - slot), kv_p.index(1 - slot), FMT, LN)
        acc = warpgroup_mma_wait(0, deps=(tok_o, ))
        fence_async_shared()
        gl.thread_barrier()          # block j+1 visible to both warpgroups; P and slot j free
    return m_i, l_i, acc


# Integer arguments that vary per decode step / cache size only bound loops, clamps and masks: not specialised (no
# recompile when the batch becomes 1 or a multiple of 16); strides and the power-of-two page shift stay specialised.
_NO_SPEC = ["page", "num_tok", "xpage", "xnum_tok", "b", "s_q", "h_q", "topk", "xtopk", "acc_rows"]


def _jit_kernel(fn):
    return _jit(fn, do_not_specialize=_NO_SPEC)


@_jit
def _g_part(meta_ptr, b, s_q, h_q):
    """(head block, query position, begin_req, end_req, begin_blk, end_blk, begin_split) of this CTA: the grid is
    (scheduler part, query position, 64-head block), the part's record at ``meta_ptr + 8 * part``."""
    n_hb = h_q // 64
    pid = gl.program_id(0)
    hb = pid % n_hb
    tmp = pid // n_hb
    si = tmp % s_q
    part = tmp // s_q
    rec_ptr = meta_ptr + part * 8
    begin_req = gl.maximum(gl.load(rec_ptr + 0), 0)
    end_req = gl.minimum(gl.load(rec_ptr + 1), b - 1)
    begin_blk = gl.load(rec_ptr + 2)
    end_blk = gl.load(rec_ptr + 3)
    begin_split = gl.load(rec_ptr + 4)
    return hb, si, begin_req, end_req, begin_blk, end_blk, begin_split


@_jit
def _g_req_range(req, begin_req, end_req, begin_blk, end_blk, begin_split, len_ptr, nsplits_ptr, topk,
                 HAS_LEN: gl.constexpr, SBLOCK: gl.constexpr):
    """A request's slice of this part: (n = valid main length, base_row and nsp = its accumulator rows and split
    count, split = this slice's index, t_lo / t_hi = the slice's line positions, t_end = min(t_hi, n)); the last
    split of a request runs to the end of the line."""
    n = topk + req * 0
    if HAS_LEN:
        n = gl.minimum(gl.maximum(gl.load(len_ptr + req), 0), topk)
    base_row = gl.load(nsplits_ptr + req)
    nsp = gl.load(nsplits_ptr + req + 1) - base_row
    split = gl.where(req == begin_req, begin_split, 0)
    t_lo = gl.minimum(gl.maximum(gl.where(req == begin_req, begin_blk, 0), 0), 1 << 24) * SBLOCK
    t_hi = gl.minimum(gl.where((req == end_req) & (split < nsp - 1), end_blk, 1 << 24), 1 << 24) * SBLOCK
    t_end = gl.minimum(t_hi, n)
    return n, base_row, nsp, split, t_lo, t_hi, t_end


@_jit
def _g_epilogue(m_i, l_i, acc, hb, req64, si64, nsp, base_row, split, sink_ptr, out_ptr, lse_ptr, oacc_ptr, lacc_ptr,
                s_q, h_q, acc_rows, sm_scale_log2, HAS_SINK: gl.constexpr, S_L: gl.constexpr, O_L: gl.constexpr):
    """A request's epilogue (as the Triton kernel): a single-split request writes ``out`` (sink applied) and ``lse``
    (natural log; +inf for a row with no valid token, whose output is 0); a split one writes O / L and the base-2
    ``log2 L + m`` to accumulator row ``base_row + split`` for ``combine_splits_``. Shared by the warp-specialised
    kernel (``_gluon_sparse_decode_ws``)."""
    D_V: gl.constexpr = 512
    empty = (l_i == 0.0) | (l_i != l_i)
    l_safe = gl.where(empty, 1.0, l_i)
    m_log2 = m_i * sm_scale_log2
    heads = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, S_L))
    heads_o = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, O_L))
    da = gl.arange(0, D_V, gl.SliceLayout(0, O_L))
    if nsp <= 1:
        denom = l_safe
        if HAS_SINK:
            sink = gl.load(sink_ptr + heads) * 1.4426950408889634
            denom = l_safe + gl.exp2(sink - gl.where(empty, 0.0, m_log2))
        inv = gl.where(empty, 0.0, 1.0 / denom)
        lse = gl.where(empty, float("inf"), (gl.log2(l_safe) + m_log2) * 0.6931471805599453)
        row_off = (req64 * s_q + si64) * h_q + heads.to(gl.int64)
        gl.store(lse_ptr + row_off, lse)
        row_off_o = (req64 * s_q + si64) * h_q + heads_o.to(gl.int64)
        o = acc * gl.convert_layout(inv, gl.SliceLayout(1, O_L))[:, None]
        gl.store(out_ptr + row_off_o[:, None] * 512 + da[None, :], o.to(gl.bfloat16))
    else:
        inv = gl.where(empty, 0.0, 1.0 / l_safe)
        acc_row = (base_row + split).to(gl.int64)
        ok = (acc_row >= 0) & (acc_row < acc_rows)
        a_off = (acc_row * s_q + si64) * h_q + heads.to(gl.int64)
        gl.store(lacc_ptr + a_off, gl.where(empty, float("-inf"), gl.log2(l_safe) + m_log2),
                 mask=(heads >= 0) & ok)
        a_off_o = (acc_row * s_q + si64) * h_q + heads_o.to(gl.int64)
        o = acc * gl.convert_layout(inv, gl.SliceLayout(1, O_L))[:, None]
        gl.store(oacc_ptr + a_off_o[:, None] * 512 + da[None, :], o, mask=((heads_o >= 0) & ok)[:, None])


@_jit_kernel
def _sparse_decode_gluon_kernel(
    q_ptr, kv_ptr, idx_ptr, len_ptr, xkv_ptr, xidx_ptr, xlen_ptr, sink_ptr, meta_ptr, nsplits_ptr, out_ptr, lse_ptr,
    oacc_ptr, lacc_ptr,
    stride_qb, stride_qs, stride_qh, stride_kb, page, num_tok, stride_ib, stride_is,
    stride_xkb, xpage, xnum_tok, stride_xib, stride_xis,
    b, s_q, h_q, topk, xtopk, acc_rows, sm_scale_log2,
    FMT: gl.constexpr, XFMT: gl.constexpr, PAGE_SHIFT: gl.constexpr, XPAGE_SHIFT: gl.constexpr,
    HAS_EXTRA: gl.constexpr, HAS_LEN: gl.constexpr, HAS_XLEN: gl.constexpr, HAS_SINK: gl.constexpr,
    SBLOCK: gl.constexpr,
):
    D_V: gl.constexpr = 512
    HAS_ROPE: gl.constexpr = FMT == 0
    # V4.1 has the registers for a [64, 64] row-sum accumulator (16 per thread) without spilling in the token loop;
    # V3.2 (RoPE tiles, fp32 scales) does not: it reduces the row sum per block
    PSUM: gl.constexpr = FMT == 2
    # MMA layouts: 2 warpgroups side by side along N (S: 32 token columns each; O: 256 value columns each)
    S_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    O_L: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 256, 16])
    LN: gl.constexpr = gl.BlockedLayout([1, 16], [1, 32], [8, 1], [1, 0])
    LP: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [8, 1], [1, 0])
    SH_N: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, D_V], gl.bfloat16)
    SH_P: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)

    hb, si, begin_req, end_req, begin_blk, end_blk, begin_split = _g_part(meta_ptr, b, s_q, h_q)

    q_n = gl.allocate_shared_memory(gl.bfloat16, [64, D_V], SH_N)
    kv_n = gl.allocate_shared_memory(gl.bfloat16, [2, 64, D_V], SH_N)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [64, 64], SH_P)
    if HAS_ROPE:
        q_p = gl.allocate_shared_memory(gl.bfloat16, [64, 64], SH_P)
        kv_p = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 64], SH_P)
    else:
        q_p = p_smem
        kv_p = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 64], SH_P)   # unused stand-in (8 KB x 2)

    si64 = si.to(gl.int64)
    hq = hb * 64 + gl.arange(0, 64, gl.SliceLayout(1, LP))
    dq = gl.arange(0, 64, gl.SliceLayout(0, LP))
    s_zero = gl.zeros([64, 64], gl.float32, S_L)
    for req in range(begin_req, end_req + 1):
        req64 = req.to(gl.int64)
        # Q of this request -> shared memory (every wgmma of the previous request has completed and was waited)
        gl.thread_barrier()
        q_rows = q_ptr + req64 * stride_qb + si64 * stride_qs + hq.to(gl.int64)[:, None] * stride_qh
        for c in gl.static_range(8):
            q_n.slice(c * 64, 64, dim=1).store(gl.load(q_rows + (c * 64 + dq)[None, :]))
        if HAS_ROPE:
            q_p.store(gl.load(q_rows + (D_V + dq)[None, :]))

        n, base_row, nsp, split, t_lo, t_hi, t_end = _g_req_range(req, begin_req, end_req, begin_blk, end_blk,
                                                                   begin_split, len_ptr, nsplits_ptr, topk, HAS_LEN,
                                                                   SBLOCK)
        idx_row = idx_ptr + req64 * stride_ib + si64 * stride_is

        m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, S_L))   # running max of raw q.k
        if PSUM:     # per-column partial row sums, reduced once at the end (no cross-warpgroup reduction per block)
            l_i = gl.zeros([64, 64], gl.float32, S_L)
        else:
            l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, S_L))
        acc = gl.zeros([64, D_V], gl.float32, O_L)
        m_i, l_i, acc = _g_attend(m_i, l_i, acc, q_n, q_p, kv_n, kv_p, p_smem, s_zero, kv_ptr, idx_row, t_lo, t_end,
                                  num_tok, page, stride_kb, sm_scale_log2, FMT, PAGE_SHIFT, PSUM, S_L, O_L, LN, LP)
        if HAS_EXTRA:
            # the extra cache continues the virtual token line at 64 * ceil(n / 64) (FlashMLA's block order)
            nx = xtopk + req * 0
            if HAS_XLEN:
                nx = gl.minimum(gl.maximum(gl.load(xlen_ptr + req), 0), xtopk)
            off = (n + SBLOCK - 1) // SBLOCK * SBLOCK
            xidx_row = xidx_ptr + req64 * stride_xib + si64 * stride_xis
            m_i, l_i, acc = _g_attend(m_i, l_i, acc, q_n, q_p, kv_n, kv_p, p_smem, s_zero, xkv_ptr, xidx_row,
                                      gl.maximum(t_lo - off, 0), gl.minimum(t_hi - off, nx), xnum_tok, xpage,
                                      stride_xkb, sm_scale_log2, XFMT, XPAGE_SHIFT, PSUM, S_L, O_L, LN, LP)

        if PSUM:
            l_i = gl.sum(l_i, 1)
        # epilogue (as the Triton kernel)
        _g_epilogue(m_i, l_i, acc, hb, req64, si64, nsp, base_row, split, sink_ptr, out_ptr, lse_ptr, oacc_ptr,
                    lacc_ptr, s_q, h_q, acc_rows, sm_scale_log2, HAS_SINK, S_L, O_L)


# ----------------------------------------------------------------------------------------------- host code

def supported(q: torch.Tensor, k_cache: torch.Tensor, fmt: str, extra_k_cache=None, config=None) -> bool:
    """Whether the Gluon path takes this call: Gluon importable, not disabled (``DEEPKERNELS_DISABLE_GLUON=1``),
    not under the interpreter, CUDA sm90 tensors, main cache V3.2 or V4.1, no extra cache or one of the pairs
    V3.2 + V3.2, V4.1 + V4.1, V4.1 + FP4, h_q a multiple of 64, no explicit kernel config, and caches whose records
    are 16-byte aligned (base, stride(0)); ``fmt`` is the main format name (the extra one follows from its size)."""
    if not available() or gluon_disabled("sparse_decode"):
        return False
    if interpret_mode() or not q.is_cuda:
        return False
    if config is not None or fmt not in GLUON_FMTS:
        return False
    if q.dim() != 4 or q.shape[2] % BLOCK_H or q.dtype != torch.bfloat16 or q.stride(-1) != 1:
        return False
    caches = (k_cache, ) if extra_k_cache is None else (k_cache, extra_k_cache)
    if extra_k_cache is not None and _xfmt(extra_k_cache) not in _EXTRA_PAIRS[fmt]:
        return False
    if any(c.data_ptr() % 16 or (c.shape[0] > 1 and c.stride(0) % 16) for c in caches):
        return False
    return torch.cuda.get_device_capability(q.device)[0] == 9


_EXTRA_PAIRS = {"v32": ("v32", ), "v41": ("v41", "fp4")}
_BYTES_FMT = {656: "v32", 528: "v41", 288: "fp4"}


def _xfmt(c: torch.Tensor):
    return _BYTES_FMT.get(int(c.shape[-1]))


def _page_shift(page: int) -> int:
    return page.bit_length() - 1 if page & (page - 1) == 0 and page <= 4096 else -1


def launch_sparse_decode_gluon(out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt, attn_sink=None,
                               extra_k_cache=None, extra_indices=None, xfmt=None, topk_length=None,
                               extra_topk_length=None, config=None, _spec=None):
    """Drop-in for ``sparse_decode._launch_sparse_decode`` (same arguments and outputs; the caller checked
    :func:`supported`; ``config`` is ignored): ``out [b, s_q, h_q, 512]`` bf16 and ``lse_buf [b, s_q, h_q]`` fp32
    contiguous; ``sched [parts, 8]`` / ``num_splits [b + 1]`` int32. Launches the Gluon split-KV kernel through a
    :class:`deepkernels._launch.KernelLauncher` (direct compiled-kernel launch once bound; ``_LAUNCHERS``) and the
    shared combine (``combine_splits_``, unchanged). ``_spec``: as for ``_launch_sparse_decode``, a hashable object
    standing for the specialisation facts of every kernel argument except sched/num_splits/acc_rows (the public op's
    cached call plan); None computes them here with :func:`deepkernels._launch.spec_key`."""
    from . import sparse_decode as sd
    from .combine import combine_splits_
    from .metadata import SCHED_BLOCK

    b, s_q, h_q, _ = q.shape
    parts = sched.shape[0]
    acc_rows = b + parts
    dev = q.device
    o_acc = torch.empty(acc_rows, s_q, h_q, 512, dtype=torch.float32, device=dev)
    l_acc = torch.empty(acc_rows, s_q, h_q, dtype=torch.float32, device=dev)
    if sd._POISON_OUTPUTS:
        for t in (out, lse_buf, o_acc, l_acc):
            t.fill_(float("nan"))
    kv = k_cache.view(torch.uint8)
    has_x = extra_k_cache is not None
    xkv = extra_k_cache.view(torch.uint8) if has_x else kv
    xind = extra_indices if has_x else indices
    xf = (xfmt or _xfmt(extra_k_cache)) if has_x else fmt
    topk, xtopk = indices.shape[2], (xind.shape[2] if has_x else 0)
    dummy = l_acc
    ptrs = (q, kv, indices, topk_length if topk_length is not None else dummy,
            xkv, xind, extra_topk_length if extra_topk_length is not None else dummy,
            attn_sink if attn_sink is not None else dummy, sched, num_splits, out, lse_buf, o_acc, l_acc)
    ints = (q.stride(0), q.stride(1), q.stride(2), kv.stride(0), kv.shape[1], kv.shape[0] * kv.shape[1],
            indices.stride(0), indices.stride(1),
            xkv.stride(0), xkv.shape[1], xkv.shape[0] * xkv.shape[1], xind.stride(0), xind.stride(1),
            b, s_q, h_q, topk, xtopk, acc_rows)
    plan_spec = _spec
    if _spec is None:
        spec = spec_key(*ptrs, *ints)
    else:   # sched/num_splits/acc_rows are the only launch facts the public op's signature does not fix
        spec = (_spec, acc_rows < 2 ** 31, sched.dtype, sched.data_ptr() & 15 == 0, num_splits.dtype,
                num_splits.data_ptr() & 15 == 0)
    constexprs = (GLUON_FMTS[fmt], _XFMT_CODES[xf], _page_shift(kv.shape[1]), _page_shift(xkv.shape[1]), has_x,
                  topk_length is not None, has_x and extra_topk_length is not None, attn_sink is not None, SCHED_BLOCK)
    launcher = cached_launcher(_LAUNCHERS, _sparse_decode_gluon_kernel, (constexprs, spec),
                               lambda: dict(zip(_CONSTEXPRS, constexprs), num_warps=NUM_WARPS), _LAUNCHER_LIMIT)
    launcher((parts * s_q * (h_q // BLOCK_H), ), *ptrs, *ints, scale * _LOG2E)
    combine_splits_(out, lse_buf.transpose(1, 2), o_acc, l_acc, num_splits, attn_sink=attn_sink,
                    lengths=topk_length, topk=topk, extra_lengths=extra_topk_length if has_x else None,
                    extra_topk=xtopk if has_x else None, rne=False, _spec=plan_spec)


_CONSTEXPRS = ("FMT", "XFMT", "PAGE_SHIFT", "XPAGE_SHIFT", "HAS_EXTRA", "HAS_LEN", "HAS_XLEN", "HAS_SINK", "SBLOCK")
_LAUNCHERS: dict = {}   # (kernel, (constexprs, specialisation)) -> KernelLauncher (deepkernels._launch.cached_launcher)
_LAUNCHER_LIMIT = 1024


def compile_sm90(fmt: str = "v41", page_shift: int = 6, has_len: bool = True, has_sink: bool = True,
                 xfmt: str | None = None, xpage_shift: int = 6, has_xlen: bool = True):
    """Cross-compile the kernel for sm90 (no GPU needed), with the divisibility facts a launch on aligned
    tensors sees (``xfmt``: extra-cache format or None). Returns the CompiledKernel."""
    fn = _sparse_decode_gluon_kernel
    sig = dict(q_ptr="*bf16", kv_ptr="*u8", idx_ptr="*i32", len_ptr="*i32", xkv_ptr="*u8", xidx_ptr="*i32",
               xlen_ptr="*i32", sink_ptr="*fp32", meta_ptr="*i32", nsplits_ptr="*i32", out_ptr="*bf16",
               lse_ptr="*fp32", oacc_ptr="*fp32", lacc_ptr="*fp32",
               stride_qb="i32", stride_qs="i32", stride_qh="i32", stride_kb="i32", page="i32", num_tok="i32",
               stride_ib="i32", stride_is="i32", stride_xkb="i32", xpage="i32", xnum_tok="i32", stride_xib="i32",
               stride_xis="i32", b="i32", s_q="i32", h_q="i32", topk="i32", xtopk="i32", acc_rows="i32",
               sm_scale_log2="fp32")
    consts = dict(FMT=GLUON_FMTS[fmt], XFMT=_XFMT_CODES[xfmt or fmt], PAGE_SHIFT=page_shift,
                  XPAGE_SHIFT=xpage_shift if xfmt else page_shift, HAS_EXTRA=xfmt is not None, HAS_LEN=has_len,
                  HAS_XLEN=bool(xfmt) and has_xlen, HAS_SINK=has_sink, SBLOCK=64)
    hinted = [k for k, v in sig.items() if v.startswith("*")] + ["stride_qb", "stride_qs", "stride_qh", "stride_kb",
                                                                  "stride_ib", "stride_is", "stride_xkb",
                                                                  "stride_xib", "stride_xis"]
    return _compile_sm90_gluon(fn, sig, consts, hinted, num_warps=NUM_WARPS)
