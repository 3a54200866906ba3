"""PyTorch reference: dense paged MLA decode, split-KV partials and combine, scheduler metadata (FlashMLA).

Semantics follow FlashMLA ``flash_mla_with_kvcache`` (dense path, commit 9241ae3; docs/spec/mla.md §1.2, §3, §4):

- q ``[b, s_q, h_q, d_qk]`` (bf16/fp16), k_cache ``[num_blocks, page_block_size, h_kv, d_qk]`` (same dtype),
  V = the first ``d_v`` columns of K, ``block_table [b, max_blocks_per_seq]`` int32, ``cache_seqlens [b]`` int32.
- Query head ``h`` reads KV head ``h // (h_q // h_kv)``.
- Causal masking is bottom-right aligned: query position ``i`` of ``s_q`` sees keys ``j < seqlen - (s_q - 1 - i)``;
  it has no effect when ``s_q == 1``.
- A (batch, query, head) row with no attendable key gets ``out = 0`` and ``lse = +inf``.
- ``lse`` is ``[b, h_q, s_q]`` fp32, natural log of ``sum_j exp(score_j * softmax_scale)``.

Split-KV internals (§3): partial results carry a **base-2** lse (``log2 L + m``; ``-inf`` for an empty split) and the
already-normalised partial output ``O / L``; the combine returns the natural-log lse. The scheduler metadata is a
``[num_sm_parts, 8]`` int32 table of :data:`META_FIELDS` plus the ``num_splits [b + 1]`` prefix sum.

Two schedulers are defined here: :func:`flashmla_schedule` is a line-by-line port of FlashMLA's greedy
``get_mla_metadata_kernel``; :func:`linear_schedule` is the closed-form schedule that deepkernels computes on the
device (every part evaluates its own record in parallel; see ``deepkernels.mla.metadata``). Both produce the same
record format and either can drive the kernels: results do not depend on the schedule beyond fp32 rounding.
"""
from __future__ import annotations

import math

import torch

from ._softmax import softmax_lse

__all__ = [
    "META_FIELDS", "SCHED_BLOCK", "FIXED_OVERHEAD_BLOCKS",
    "dense_decode", "flashmla_schedule", "linear_schedule", "num_sm_parts_dense",
    "split_kv_partials", "combine_splits", "dense_decode_via_splits",
]

META_FIELDS = ("begin_req_idx", "end_req_idx", "begin_block_idx", "end_block_idx", "begin_split_idx",
               "is_first_req_splitted", "is_last_req_splitted", "pad")
SCHED_BLOCK = 64            # scheduler granularity in tokens (independent of the page size)
FIXED_OVERHEAD_BLOCKS = 5   # FlashMLA's per-split fixed cost, in blocks


def _key_limits(seqlen: int, s_q: int, causal: bool) -> list[int]:
    """Number of attendable keys for each query position (bottom-right aligned causal)."""
    if not causal or s_q == 1:
        return [max(seqlen, 0)] * s_q
    return [max(seqlen - (s_q - 1 - i), 0) for i in range(s_q)]


def _gather_kv(k_cache: torch.Tensor, block_table: torch.Tensor, i: int, n: int) -> torch.Tensor:
    """Tokens ``[0, n)`` of request ``i`` as ``[n, h_kv, d_qk]`` (only the pages they occupy are read)."""
    page = k_cache.shape[1]
    if n <= 0:
        return k_cache.new_zeros((0,) + tuple(k_cache.shape[2:]))
    npages = (n + page - 1) // page
    # page ids clamped to [0, num_blocks) exactly as the kernels do (the public op rejects them on CPU inputs)
    pages = block_table[i, :npages].long().to(k_cache.device).clamp(0, k_cache.shape[0] - 1)
    return k_cache[pages].reshape(-1, *k_cache.shape[2:])[:n]


def _attend(q: torch.Tensor, k: torch.Tensor, d_v: int, scale: float, limits: list[int], dtype=torch.float32):
    """q ``[s_q, h_q, d]``, k ``[n, h_kv, d]`` → (O/L ``[s_q, h_q, d_v]``, natural lse ``[s_q, h_q]``) in ``dtype``.

    Keys ``>= limits[i]`` are masked for query position i; rows with no key give O 0 and lse +inf.
    Query head h reads kv head ``h // (h_q // h_kv)`` (computed grouped, without repeating K).
    """
    s_q, h_q, d = q.shape
    n, h_kv = k.shape[0], k.shape[1]
    group = h_q // h_kv
    qf = q.to(dtype).reshape(s_q, h_kv, group, d)
    kf = k.to(dtype)
    s = torch.einsum("skgd,nkd->skgn", qf, kf).reshape(s_q, h_q, n) * scale      # [s_q, h_q, n]
    pos = torch.arange(n, device=q.device)
    lim = torch.tensor(limits, device=q.device)
    mask = pos[None, :] < lim[:, None]                                            # [s_q, n]
    s = torch.where(mask[:, None, :], s, torch.tensor(float("-inf"), dtype=dtype, device=q.device))
    p, lse, empty = softmax_lse(s)   # max-shifted; masked (-inf) scores give p = 0 exactly
    o = torch.einsum("skgn,nkd->skgd", p.reshape(s_q, h_kv, group, n), kf[..., :d_v]).reshape(s_q, h_q, d_v)
    o = torch.where(empty[..., None], torch.zeros_like(o), o)
    lse = torch.where(empty, torch.full_like(lse, float("inf")), lse)
    return o, lse


def dense_decode(q: torch.Tensor, k_cache: torch.Tensor, block_table: torch.Tensor, cache_seqlens: torch.Tensor,
                 head_dim_v: int = 512, softmax_scale: float | None = None, causal: bool = False,
                 compute_dtype: torch.dtype = torch.float32):
    """Dense paged MLA decode (FlashMLA ``flash_mla_with_kvcache`` without ``indices``).

    Args:
        q: ``[b, s_q, h_q, d_qk]`` bf16/fp16 (any strides).
        k_cache: ``[num_blocks, page_block_size, h_kv, d_qk]`` same dtype; V = ``k[..., :head_dim_v]``.
        block_table: ``[b, max_blocks_per_seq]`` int32; entries past ``ceil(seqlen / page_block_size)`` are never read.
        cache_seqlens: ``[b]`` int32 (a negative length counts as 0).
        head_dim_v: d_v. softmax_scale: default ``d_qk ** -0.5``. causal: bottom-right aligned, no effect if s_q == 1.
        compute_dtype: float32 (as FlashMLA's test reference) or float64.
    Returns:
        ``out [b, s_q, h_q, head_dim_v]`` in q's dtype (rounded once) and ``lse [b, h_q, s_q]`` float32, natural log.
    """
    b, s_q, h_q, d = q.shape
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    out = torch.empty(b, s_q, h_q, head_dim_v, dtype=q.dtype, device=q.device)
    lse = torch.empty(b, h_q, s_q, dtype=torch.float32, device=q.device)
    seqlens = cache_seqlens.tolist()
    for i in range(b):
        n = max(int(seqlens[i]), 0)
        k = _gather_kv(k_cache, block_table, i, n)
        o, l_ = _attend(q[i], k, head_dim_v, scale, _key_limits(n, s_q, causal), compute_dtype)
        out[i] = o.to(q.dtype)
        lse[i] = l_.transpose(0, 1).float()
    return out, lse


# ---------------------------------------------------------------------------------------------------------------
# Scheduler metadata (spec §3.1-3.3)
# ---------------------------------------------------------------------------------------------------------------

def num_sm_parts_dense(num_sms: int, s_q: int, h_q: int, h_kv: int, block_m: int = 64) -> int:
    """FlashMLA SM90 dense decode: ``max(num_sms / h_kv / ceil(s_q*h_q/h_kv / block_m), 1)`` (integer divisions)."""
    m_blocks = -(-(s_q * h_q // h_kv) // block_m)
    return max(num_sms // h_kv // m_blocks, 1)


def _blocks(n: int) -> int:
    return (max(n - 1, 0) // SCHED_BLOCK) + 1


def flashmla_schedule(token_counts, num_sm_parts: int, fixed_overhead: int = FIXED_OVERHEAD_BLOCKS):
    """Python port of FlashMLA's greedy ``get_mla_metadata_kernel`` (spec §3.3).

    ``token_counts``: per-request attended tokens (dense: ``cache_seqlens``). Returns
    ``(meta [num_sm_parts, 8] int32, num_splits [b + 1] int32)`` on the CPU.
    """
    counts = [max(int(x), 0) for x in (token_counts.tolist() if torch.is_tensor(token_counts) else token_counts)]
    b = len(counts)
    blocks = [_blocks(n) for n in counts]
    total = sum(x + fixed_overhead for x in blocks)
    payload = -(-total // num_sm_parts) + fixed_overhead
    meta = torch.zeros(num_sm_parts, 8, dtype=torch.int32)
    num_splits = torch.zeros(b + 1, dtype=torch.int32)
    req, blk, nsplit, cum = 0, 0, 0, 0
    for p in range(num_sm_parts):
        begin_req, begin_blk, begin_split = req, blk, nsplit
        first_split = int(blk != 0)
        remain = payload
        while req < b:
            rest = blocks[req] - blk
            if remain >= rest + fixed_overhead:
                remain -= rest + fixed_overhead
                cum += nsplit + 1
                num_splits[req + 1] = cum
                req, blk, nsplit = req + 1, 0, 0
            else:
                if remain - fixed_overhead > 0:
                    blk += remain - fixed_overhead
                    nsplit += 1
                break
        if blk > 0:
            end_req, end_blk, last_split = req, blk, 1
        else:
            end_req = req - 1
            end_blk = (blocks[end_req] if counts[end_req] > 0 else 0) if end_req >= 0 else 0
            last_split = 0
        if begin_req >= b:
            meta[p] = torch.tensor([b, b - 1, 0, 0, 0, 0, 0, 0], dtype=torch.int32)
            continue
        if begin_req == end_req:
            first_split = last_split = first_split | last_split
        meta[p] = torch.tensor([begin_req, end_req, begin_blk, end_blk, begin_split, first_split, last_split, 0],
                               dtype=torch.int32)
    assert req == b, "FlashMLA schedule did not consume every request"
    return meta, num_splits


def linear_schedule(token_counts, num_sm_parts: int, fixed_overhead: int = FIXED_OVERHEAD_BLOCKS):
    """The closed-form schedule computed on the device by ``deepkernels.mla.metadata`` (same record format).

    Request ``i`` occupies the cost interval ``[S_i, S_i + fixed_overhead + blocks_i)`` of a line of length
    ``total = sum(blocks_i + fixed_overhead)``; its blocks sit at positions ``B_i + k`` with ``B_i = S_i + overhead``.
    Part ``p`` owns positions ``[p*W, (p+1)*W)`` with ``W = ceil(total / num_sm_parts)``. So every part gets at most
    ``W`` units of work (within one overhead of FlashMLA's greedy payload), every block is owned by exactly one part,
    and each record can be computed independently from prefix sums. A part that owns no block gets
    ``begin_req_idx = b`` (the kernel skips it).
    """
    counts = [max(int(x), 0) for x in (token_counts.tolist() if torch.is_tensor(token_counts) else token_counts)]
    b = len(counts)
    blocks = [_blocks(n) for n in counts]
    starts, acc = [], 0
    for x in blocks:
        starts.append(acc)
        acc += x + fixed_overhead
    total = acc
    W = -(-total // num_sm_parts)
    B = [s + fixed_overhead for s in starts]
    E = [s + fixed_overhead + x for s, x in zip(starts, blocks)]
    first = [x // W for x in B]
    last = [(e - 1) // W for e in E]
    nsp = [l_ - f + 1 for f, l_ in zip(first, last)]
    num_splits = torch.zeros(b + 1, dtype=torch.int32)
    num_splits[1:] = torch.tensor(nsp, dtype=torch.int64).cumsum(0).to(torch.int32)
    meta = torch.zeros(num_sm_parts, 8, dtype=torch.int32)
    for p in range(num_sm_parts):
        x0, x1 = p * W, min((p + 1) * W, total)
        begin = sum(1 for e in E if e <= x0)
        end = sum(1 for s in B if s < x1) - 1
        if begin >= b or begin > end:
            meta[p] = torch.tensor([b, b - 1, 0, 0, 0, 0, 0, 0], dtype=torch.int32)
            continue
        bb = max(x0 - B[begin], 0)
        eb = min(x1 - B[end], blocks[end])
        fs, ls = int(nsp[begin] > 1), int(nsp[end] > 1)
        meta[p] = torch.tensor([begin, end, bb, eb, p - first[begin], fs, ls, 0], dtype=torch.int32)
    return meta, num_splits


def _iter_splits(meta: torch.Tensor, num_splits: torch.Tensor, counts: list[int]):
    """Yield ``(req, split_row, key_begin, key_end)`` for every (part, request) piece of a schedule."""
    b = len(counts)
    for rec in meta.tolist():
        begin, end, bb, eb, bsplit = rec[0], rec[1], rec[2], rec[3], rec[4]
        if begin >= b:
            continue
        for req in range(begin, min(end, b - 1) + 1):
            sb = bb if req == begin else 0
            se = eb if req == end else _blocks(counts[req])
            split = bsplit if req == begin else 0
            yield req, int(num_splits[req]) + split, sb * SCHED_BLOCK, min(se * SCHED_BLOCK, counts[req])


def split_kv_partials(q, k_cache, block_table, cache_seqlens, meta, num_splits, head_dim_v: int = 512,
                      softmax_scale: float | None = None, causal: bool = False):
    """Per-split partial results of a schedule (spec §3.4, split case, for every split including single ones).

    Returns ``o_accum [b + num_sm_parts, s_q, h_q, d_v]`` fp32 (``O/L``, 0 for an empty split) and
    ``lse_accum [b + num_sm_parts, s_q, h_q]`` fp32 in **base 2** (``log2 L + m``; ``-inf`` for an empty split).
    Rows not owned by any split are NaN.
    """
    b, s_q, h_q, d = q.shape
    scale = d ** -0.5 if softmax_scale is None else float(softmax_scale)
    counts = [max(int(x), 0) for x in cache_seqlens.tolist()]
    rows = b + meta.shape[0]
    o_acc = torch.full((rows, s_q, h_q, head_dim_v), float("nan"))
    l_acc = torch.full((rows, s_q, h_q), float("nan"))
    for req, row, k0, k1 in _iter_splits(meta.cpu(), num_splits.cpu(), counts):
        k = _gather_kv(k_cache, block_table, req, counts[req]).cpu()[k0:max(k1, k0)]
        lim = [min(max(x - k0, 0), k.shape[0]) for x in _key_limits(counts[req], s_q, causal)]
        o, lse = _attend(q[req].cpu(), k, head_dim_v, scale, lim)
        o_acc[row] = o
        l_acc[row] = torch.where(torch.isposinf(lse), torch.full_like(lse, float("-inf")), lse / math.log(2))
    return o_acc, l_acc


def combine_splits(o_accum: torch.Tensor, lse_accum: torch.Tensor, num_splits: torch.Tensor,
                   out_dtype: torch.dtype = torch.bfloat16, attn_sink: torch.Tensor | None = None):
    """FlashMLA combine (spec §3.5) for every request, including single-split ones (same math, S = 1).

    ``lse_accum`` is base 2. Returns ``out [b, s_q, h_q, d_v]`` (``out_dtype``) and ``lse [b, h_q, s_q]`` fp32 natural
    log, ``+inf`` for a row with no key. ``attn_sink [h_q]`` fp32 scales the output by ``1/(1+exp(sink-lse))``
    and never changes lse.
    """
    ns = num_splits.cpu().tolist()
    b = len(ns) - 1
    _, s_q, h_q, d_v = o_accum.shape
    out = torch.empty(b, s_q, h_q, d_v, dtype=out_dtype)
    lse_out = torch.empty(b, h_q, s_q, dtype=torch.float32)
    for i in range(b):
        lk = lse_accum[ns[i]:ns[i + 1]].float().cpu()                    # [K, s_q, h_q]
        ok = o_accum[ns[i]:ns[i + 1]].float().cpu()
        mx = lk.max(dim=0).values
        mx = torch.where(torch.isneginf(mx), torch.zeros_like(mx), mx)
        S = torch.exp2(lk - mx).sum(0)
        G = torch.where(S == 0, torch.full_like(S, float("inf")), torch.log2(S) + mx)
        lse_out[i] = (G * math.log(2)).transpose(0, 1)
        if attn_sink is not None:
            sig = (attn_sink.float().cpu() * math.log2(math.e))[None, :].expand_as(G)
            fin = torch.isfinite(G)
            G = torch.where(fin, G + torch.log2(1 + torch.exp2(sig - G)),
                            torch.where(torch.isneginf(sig), G, sig))
        w = torch.exp2(lk - G)                                          # [K, s_q, h_q]
        o = torch.zeros(s_q, h_q, d_v)
        for k in range(lk.shape[0]):
            o = o + w[k][..., None] * ok[k]
        out[i] = o.to(out_dtype)
    return out, lse_out


def dense_decode_via_splits(q, k_cache, block_table, cache_seqlens, num_sm_parts: int, head_dim_v: int = 512,
                            softmax_scale: float | None = None, causal: bool = False, schedule=linear_schedule):
    """Dense decode through a schedule, per-split partials and the combine (checks the split-KV math)."""
    meta, ns = schedule(cache_seqlens, num_sm_parts)
    o_acc, l_acc = split_kv_partials(q, k_cache, block_table, cache_seqlens, meta, ns, head_dim_v,
                                     softmax_scale, causal)
    return combine_splits(o_acc, l_acc, ns, q.dtype)
