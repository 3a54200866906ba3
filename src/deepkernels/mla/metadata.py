"""Split-KV scheduler for MLA decode, computed on the device (no host sync, CUDA-graph capturable).

Produces FlashMLA's metadata format (docs/spec/mla.md §3.1): ``meta [num_sm_parts, 8]`` int32 records
``(begin_req, end_req (inclusive), begin_block, end_block (exclusive), begin_split, first_splitted,
last_splitted, pad)`` in 64-token scheduler blocks, and ``num_splits [b + 1]`` int32, the prefix sum of each
request's split count. Split ``n`` of request ``i`` owns accumulator row ``num_splits[i] + n``; the total number
of splits is at most ``b + num_sm_parts``. Every request of the batch owns >= 1 split (even at length 0), and the
decode kernels clamp each split to the request's actual length and run its last split to the actual end, so a
schedule stays correct (only less balanced) for any later lengths of the same batch.

The schedule is the closed-form "linear" one defined (and documented) by
:func:`deepkernels.reference.mla.linear_schedule`: request ``i`` costs ``blocks_i + 5`` units on a line, part ``p``
owns ``[p*W, (p+1)*W)`` with ``W = ceil(total / num_sm_parts)``. Each program of the kernel evaluates the records of
``PARTS`` parts independently from prefix sums over the requests, so the whole thing is one small launch.

Reusable by any decode path: it is driven by a per-request token-count tensor (dense: ``cache_seqlens``; sparse:
``topk_length`` or a derived count) rather than by the KV cache itself.

Opt-in alternative (``compute_schedule(..., algorithm="greedy")``, not dispatched by the decode paths): FlashMLA's greedy
``get_mla_metadata`` schedule (docs/spec/mla.md §3.3, host port :func:`deepkernels.reference.mla.flashmla_schedule`),
computed bit-exactly by one single-warp program (:func:`_mla_sched_greedy_kernel`). The greedy fill is a walk on
the same cost line: with ``s = ceil(total / num_sm_parts)`` a part opened at position ``x`` closes at ``y = x + s``
unless a request boundary (a prefix cost) lies in ``[y, y + overhead]``, in which case it closes exactly there (the
whole request fits the payload slack: no split). Boundaries are at least ``overhead + 1`` apart, so at most one lies
in that window, and one step is a vector test of 32 boundaries (one per lane) plus two warp reductions
(``redux.sync``): the loop over parts is sequential, the search inside a step is not.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._backend import use_kernels
from .._launch import KernelLauncher, cached_launcher

__all__ = ["compute_schedule", "resolve_schedule", "sched_record", "SCHED_BLOCK", "FIXED_OVERHEAD_BLOCKS",
           "SCHEDULE_ALGORITHMS"]

SCHED_BLOCK = 64
FIXED_OVERHEAD_BLOCKS = 5
_PARTS_PER_PROGRAM = 32
_CHUNK = 128
SCHEDULE_ALGORITHMS = ("linear", "greedy")
# greedy kernel: requests per window (one per lane of its single warp; 32 boundaries relative to the window's start
# always fit int32: 32 * (2**25 blocks + overhead) < 2**31 for int32 counts and overhead <= _GREEDY_MAX_OVERHEAD),
# and requests per iteration of its first pass (the total cost, int64)
_GW = 32
_GT = 1024
_GREEDY_MAX_OVERHEAD = 1 << 20
_POISON_OUTPUTS = False     # tests: the greedy path fills its outputs with -12345 before the launch


@triton.jit
def _request_costs(counts_ptr, offs, m, carry, OVERHEAD: tl.constexpr, SBLOCK: tl.constexpr):
    """Per request of one chunk: its SBLOCK-token blocks, its cost (blocks + fixed overhead; 0 past b), and where
    its KV work begins and ends on the line of all requests' costs (``carry`` = cost of earlier chunks)."""
    n = tl.maximum(tl.load(counts_ptr + offs, mask=m, other=0), 0)
    blocks = (tl.maximum(n - 1, 0) // SBLOCK) + 1
    cost = tl.where(m, blocks + OVERHEAD, 0)
    start = carry + tl.cumsum(cost, 0) - cost
    return blocks, cost, start + OVERHEAD, start + cost


@triton.jit
def sched_record(meta_ptr, part, b):
    """The fields of scheduler record ``part`` a decode kernel walks (format in the module docstring):
    ``(begin_req, end_req, begin_block, end_block, begin_split)`` with ``begin_req`` clamped to >= 0 and ``end_req``
    to <= b - 1 (a padded no-work part has begin_req = b > end_req: no request is visited)."""
    rec = meta_ptr + part * 8
    begin_req = tl.maximum(tl.load(rec + 0), 0)
    end_req = tl.minimum(tl.load(rec + 1), b - 1)
    return begin_req, end_req, tl.load(rec + 2), tl.load(rec + 3), tl.load(rec + 4)


# b and num_parts vary per decode step / config: not specialised (no recompile when the batch becomes 1 or a
# multiple of 16); the kernel only uses them as loop bounds and in masks.
@triton.jit(do_not_specialize=["b", "num_parts"])
def _mla_sched_metadata_kernel(counts_ptr, meta_ptr, nsplits_ptr, b, num_parts,
                               OVERHEAD: tl.constexpr, SBLOCK: tl.constexpr,
                               CHUNK: tl.constexpr, PARTS: tl.constexpr):
    pid = tl.program_id(0)
    offs_c = tl.arange(0, CHUNK)
    # pass 1: total cost of the line
    total = tl.sum(tl.zeros([CHUNK], dtype=tl.int32), 0)
    for c0 in range(0, b, CHUNK):
        offs = c0 + offs_c
        m = offs < b
        _, cost, _, _ = _request_costs(counts_ptr, offs, m, total * 0, OVERHEAD, SBLOCK)
        total += tl.sum(cost, 0)
    W = (total + num_parts - 1) // num_parts
    parts = pid * PARTS + tl.arange(0, PARTS)
    pmask = parts < num_parts
    x0 = parts * W
    x1 = tl.minimum(x0 + W, total)
    # pass 2: split counts (program 0 writes num_splits) and the begin/end request of every part
    carry = total * 0
    carry_ns = total * 0
    cnt_begin = tl.zeros([PARTS], dtype=tl.int32)
    cnt_end = tl.zeros([PARTS], dtype=tl.int32)
    for c0 in range(0, b, CHUNK):
        offs = c0 + offs_c
        m = offs < b
        blocks, cost, bpos, epos = _request_costs(counts_ptr, offs, m, carry, OVERHEAD, SBLOCK)
        ns = tl.where(m, (epos - 1) // W - bpos // W + 1, 0)
        tl.store(nsplits_ptr + offs + 1, carry_ns + tl.cumsum(ns, 0), mask=m & (pid == 0))
        cnt_begin += tl.sum(tl.where(m[None, :] & (epos[None, :] <= x0[:, None]), 1, 0), 1)
        cnt_end += tl.sum(tl.where(m[None, :] & (bpos[None, :] < x1[:, None]), 1, 0), 1)
        carry += tl.sum(cost, 0)
        carry_ns += tl.sum(ns, 0)
    tl.store(nsplits_ptr + offs_c, offs_c * 0, mask=(offs_c == 0) & (pid == 0))
    begin = cnt_begin
    end = cnt_end - 1
    # pass 3: gather what the records need about their begin and end requests
    carry = total * 0
    b_first = tl.zeros([PARTS], dtype=tl.int32)
    b_bpos = tl.zeros([PARTS], dtype=tl.int32)
    b_ns = tl.zeros([PARTS], dtype=tl.int32)
    e_bpos = tl.zeros([PARTS], dtype=tl.int32)
    e_blocks = tl.zeros([PARTS], dtype=tl.int32)
    e_ns = tl.zeros([PARTS], dtype=tl.int32)
    for c0 in range(0, b, CHUNK):
        offs = c0 + offs_c
        m = offs < b
        blocks, cost, bpos, epos = _request_costs(counts_ptr, offs, m, carry, OVERHEAD, SBLOCK)
        first = bpos // W
        ns = (epos - 1) // W - first + 1
        sb = m[None, :] & (offs[None, :] == begin[:, None])
        se = m[None, :] & (offs[None, :] == end[:, None])
        b_first += tl.sum(tl.where(sb, first[None, :], 0), 1)
        b_bpos += tl.sum(tl.where(sb, bpos[None, :], 0), 1)
        b_ns += tl.sum(tl.where(sb, ns[None, :], 0), 1)
        e_bpos += tl.sum(tl.where(se, bpos[None, :], 0), 1)
        e_blocks += tl.sum(tl.where(se, blocks[None, :], 0), 1)
        e_ns += tl.sum(tl.where(se, ns[None, :], 0), 1)
        carry += tl.sum(cost, 0)
    valid = (begin < b) & (begin <= end)
    rec = meta_ptr + parts * 8
    tl.store(rec + 0, tl.where(valid, begin, b), mask=pmask)
    tl.store(rec + 1, tl.where(valid, end, b - 1), mask=pmask)
    tl.store(rec + 2, tl.where(valid, tl.maximum(x0 - b_bpos, 0), 0), mask=pmask)
    tl.store(rec + 3, tl.where(valid, tl.minimum(x1 - e_bpos, e_blocks), 0), mask=pmask)
    tl.store(rec + 4, tl.where(valid, parts - b_first, 0), mask=pmask)
    tl.store(rec + 5, tl.where(valid & (b_ns > 1), 1, 0), mask=pmask)
    tl.store(rec + 6, tl.where(valid & (e_ns > 1), 1, 0), mask=pmask)
    tl.store(rec + 7, parts * 0, mask=pmask)


# ------------------------------------------------------------------------------------------ greedy (FlashMLA) schedule
@triton.jit
def _greedy_window(n_raw, offs, b, OVERHEAD: tl.constexpr, SBLOCK: tl.constexpr):
    """One window of requests from their raw counts: validity, cost (blocks + overhead; 0 past b) and the end block
    FlashMLA records for a part that ends at the request's end (its block count, 0 for a zero-length request)."""
    m = offs < b
    n = tl.maximum(n_raw, 0)
    blocks = (tl.maximum(n - 1, 0) // SBLOCK) + 1
    return m, tl.where(m, blocks + OVERHEAD, 0), tl.where(n > 0, blocks, 0)


@triton.jit(do_not_specialize=["b", "num_parts"])
def _mla_sched_greedy_kernel(counts_ptr, meta_ptr, nsplits_ptr, b, num_parts,
                             OVERHEAD: tl.constexpr, SBLOCK: tl.constexpr, W: tl.constexpr, TW: tl.constexpr):
    """FlashMLA's greedy schedule (docs/spec/mla.md §3.3), exactly; one program of one warp (module docstring).

    Positions on the cost line are int64 scalars. The requests are visited in windows of ``W`` (one per lane) whose
    boundaries are kept relative to the window's start (``base``) in int32; three windows ahead are loaded early.
    Per part: ``y = x + s``; windows whose last boundary lies below ``y`` are passed; then one reduction finds the
    boundary in ``[y, y + OVERHEAD]`` (snap, the part ends at a request end) or the last boundary below ``y`` (the
    part ends inside that request: a split), and a second counts the boundaries below ``y`` (the request index)."""
    BIG: tl.constexpr = 1 << 30
    MINV: tl.constexpr = -2147483648
    # pass 1: total cost (int64), next loads issued before the current chunk is summed
    offs_t = tl.arange(0, TW)
    acc = tl.zeros([TW], dtype=tl.int64)
    nxt = tl.load(counts_ptr + offs_t, mask=offs_t < b, other=0)
    for c0 in range(0, b, TW):
        cur = nxt
        o2 = c0 + TW + offs_t
        nxt = tl.load(counts_ptr + o2, mask=o2 < b, other=0)
        _, cost_t, _ = _greedy_window(cur, c0 + offs_t, b, OVERHEAD, SBLOCK)
        acc += cost_t.to(tl.int64)
    total = tl.sum(acc, 0)
    s = (total + num_parts - 1) // num_parts
    n_last = tl.maximum(tl.load(counts_ptr + b - 1), 0)
    eb_last = tl.where(n_last > 0, (tl.maximum(n_last - 1, 0) // SBLOCK) + 1, 0)
    tl.store(nsplits_ptr, b * 0)
    # window state: the first window and three more loaded ahead
    lane = tl.arange(0, W)
    q1 = tl.load(counts_ptr + W + lane, mask=W + lane < b, other=0)
    q2 = tl.load(counts_ptr + 2 * W + lane, mask=2 * W + lane < b, other=0)
    q3 = tl.load(counts_ptr + 3 * W + lane, mask=3 * W + lane < b, other=0)
    valid, cost, eb = _greedy_window(tl.load(counts_ptr + lane, mask=lane < b, other=0), lane, b, OVERHEAD, SBLOCK)
    e_rel = tl.cumsum(cost, 0)
    wsum = tl.sum(cost, 0)
    cs = b * 0                      # first request of the window
    base = total * 0                # cost line position of the window's start
    wend = base + wsum              # ... and of its last boundary
    # cursor: position x, its request r (first request not finished), start cr of request r, splits of r so far
    x = total * 0
    cr = total * 0
    r = b * 0
    nsplit = b * 0
    cum = b * 0                     # num_splits[r]
    p = b * 0
    # records of the current group of W parts, one part per lane (stored every W parts: no store per step)
    f_br = lane * 0
    f_er = lane * 0
    f_bb = lane * 0
    f_eb = lane * 0
    f_bs = lane * 0
    f_fs = lane * 0
    f_ls = lane * 0
    while (p < num_parts) & (x < total):
        y = x + s
        moved = p < 0
        while (wend < y) & (cs + W < b):
            base = wend
            cs += W
            valid, cost, eb = _greedy_window(q1, cs + lane, b, OVERHEAD, SBLOCK)
            q1 = q2
            q2 = q3
            o3 = cs + 3 * W + lane
            q3 = tl.load(counts_ptr + o3, mask=o3 < b, other=0)
            wsum = tl.sum(cost, 0)
            wend = base + wsum
            moved = p >= 0
        if moved:
            e_rel = tl.cumsum(cost, 0)
        # y relative to the window start, capped past its last boundary (then every boundary of it is below y)
        yr = tl.minimum(y - base, (wsum + OVERHEAD + 1).to(tl.int64)).to(tl.int32)
        diff = e_rel - yr
        inwin = valid & (diff >= 0) & (diff <= OVERHEAD)
        below = valid & (diff < 0)
        kmax = tl.max(tl.where(inwin, diff + BIG, tl.where(below, diff, MINV)), 0)
        nb = tl.sum(below.to(tl.int32), 0)
        g = tl.sum(tl.where(inwin, eb, 0), 0)
        snap = kmax >= BIG
        over = (kmax < BIG) & (y > total)
        bnd = snap | over
        xn = tl.where(snap, y + (kmax - BIG), tl.where(over, total, y))
        rn = cs + nb + snap.to(tl.int32)
        cn = tl.where(bnd, xn, tl.where(kmax > MINV, y + kmax, base))
        end_req = tl.where(bnd, rn - 1, rn)
        end_blk = tl.where(snap, g.to(tl.int64), tl.where(over, eb_last.to(tl.int64), xn - cn)).to(tl.int32)
        fs = (x != cr).to(tl.int32)
        ls = (~bnd).to(tl.int32)
        one = (r == end_req).to(tl.int32)
        j = p % W
        sel = lane == j
        f_br = tl.where(sel, r, f_br)
        f_er = tl.where(sel, end_req, f_er)
        f_bb = tl.where(sel, (x - cr).to(tl.int32), f_bb)
        f_eb = tl.where(sel, end_blk, f_eb)
        f_bs = tl.where(sel, nsplit, f_bs)
        f_fs = tl.where(sel, fs | (ls & one), f_fs)
        f_ls = tl.where(sel, ls | (fs & one), f_ls)
        if j == W - 1:
            rec = meta_ptr + (p - j + lane) * 8
            tl.store(rec + 0, f_br)
            tl.store(rec + 1, f_er)
            tl.store(rec + 2, f_bb)
            tl.store(rec + 3, f_eb)
            tl.store(rec + 4, f_bs)
            tl.store(rec + 5, f_fs)
            tl.store(rec + 6, f_ls)
            tl.store(rec + 7, lane * 0)
        # requests r .. rn-1 end in this part: r's splits so far + 1, then one split each
        o = r + lane
        tl.store(nsplits_ptr + 1 + o, cum + nsplit + 1 + lane, mask=o < rn)
        for c0 in range(r + W, rn, W):
            o = c0 + lane
            tl.store(nsplits_ptr + 1 + o, cum + nsplit + 1 + (o - r), mask=o < rn)
        cum += tl.where(rn > r, nsplit + (rn - r), 0)
        nsplit = tl.where(bnd, 0, tl.where(rn == r, nsplit + 1, 1))
        x = xn
        cr = cn
        r = rn
        p += 1
    # the last group's records, then the parts left without work
    j = p % W
    pm = lane < j
    rec = meta_ptr + (p - j + lane) * 8
    tl.store(rec + 0, f_br, mask=pm)
    tl.store(rec + 1, f_er, mask=pm)
    tl.store(rec + 2, f_bb, mask=pm)
    tl.store(rec + 3, f_eb, mask=pm)
    tl.store(rec + 4, f_bs, mask=pm)
    tl.store(rec + 5, f_fs, mask=pm)
    tl.store(rec + 6, f_ls, mask=pm)
    tl.store(rec + 7, lane * 0, mask=pm)
    for p0 in range(p, num_parts, W):
        pp = p0 + lane
        pm = pp < num_parts
        rec = meta_ptr + pp * 8
        tl.store(rec + 0, b + pp * 0, mask=pm)
        tl.store(rec + 1, b - 1 + pp * 0, mask=pm)
        for k in tl.static_range(2, 8):
            tl.store(rec + k, pp * 0, mask=pm)


def compute_schedule(token_counts: torch.Tensor, num_sm_parts: int, fixed_overhead: int = FIXED_OVERHEAD_BLOCKS,
                     algorithm: str = "linear") -> tuple[torch.Tensor, torch.Tensor]:
    """Split-KV schedule for a decode step, on ``token_counts``' device without a host sync.

    Args:
        token_counts: ``[b]`` int32, tokens each request attends (dense: ``cache_seqlens``; sparse: e.g.
            ``topk_length``). Negative counts are treated as 0; a zero-length request still gets one (empty)
            block so that its output row is written (out 0, lse +inf).
        num_sm_parts: number of parts (persistent programs per (kv head, query-row block)), ``>= 1``.
        fixed_overhead: per-split cost in 64-token blocks (FlashMLA uses 5).
        algorithm: ``"linear"`` (default, the closed form of :func:`deepkernels.reference.mla.linear_schedule`) or
            ``"greedy"`` (FlashMLA's greedy fill, equal to :func:`deepkernels.reference.mla.flashmla_schedule`;
            one single-warp program, ``0 <= fixed_overhead <= 2**20``). Without kernels (CPU tensors, no
            interpreter) the reference of the chosen algorithm runs.
    Returns:
        ``(meta [num_sm_parts, 8] int32, num_splits [b + 1] int32)`` (docs/spec/mla.md §3.1).
    Raises:
        TypeError/ValueError for a non-int32 or non-1-D ``token_counts``, ``num_sm_parts < 1``, an unknown
        ``algorithm`` or (greedy) ``fixed_overhead`` out of range.
    """
    if not isinstance(token_counts, torch.Tensor) or token_counts.dtype != torch.int32 or token_counts.dim() != 1:
        raise TypeError(f"token_counts must be a 1-D int32 tensor, got "
                        f"{getattr(token_counts, 'dtype', type(token_counts))} shape "
                        f"{tuple(getattr(token_counts, 'shape', ()))}")
    if int(num_sm_parts) < 1:
        raise ValueError(f"num_sm_parts must be >= 1, got {num_sm_parts}")
    if algorithm not in SCHEDULE_ALGORITHMS:
        raise ValueError(f"algorithm must be one of {SCHEDULE_ALGORITHMS}, got {algorithm!r}")
    num_sm_parts = int(num_sm_parts)
    b = token_counts.shape[0]
    dev = token_counts.device
    if b == 0:
        meta = torch.zeros(num_sm_parts, 8, dtype=torch.int32, device=dev)
        meta[:, 1] = -1
        return meta, torch.zeros(1, dtype=torch.int32, device=dev)
    if algorithm == "greedy":
        return _greedy_schedule(token_counts, num_sm_parts, int(fixed_overhead))
    if not use_kernels(token_counts):
        from ..reference.mla import linear_schedule
        meta, ns = linear_schedule(token_counts, num_sm_parts, fixed_overhead)
        return meta.to(dev), ns.to(dev)
    counts = token_counts.contiguous()
    meta = torch.empty(num_sm_parts, 8, dtype=torch.int32, device=dev)
    num_splits = torch.empty(b + 1, dtype=torch.int32, device=dev)
    grid = (triton.cdiv(num_sm_parts, _PARTS_PER_PROGRAM),)
    _sched_launcher(int(fixed_overhead), counts.data_ptr() & 15 == 0, b < 2 ** 31 and num_sm_parts < 2 ** 31)(
        grid, counts, meta, num_splits, b, num_sm_parts)
    return meta, num_splits


def _greedy_schedule(token_counts: torch.Tensor, num_sm_parts: int, fixed_overhead: int):
    if not 0 <= fixed_overhead <= _GREEDY_MAX_OVERHEAD:
        raise ValueError(f"fixed_overhead must be in [0, {_GREEDY_MAX_OVERHEAD}] for the greedy schedule, got "
                         f"{fixed_overhead}")
    b = token_counts.shape[0]
    dev = token_counts.device
    if not use_kernels(token_counts):
        from ..reference.mla import flashmla_schedule
        meta, ns = flashmla_schedule(token_counts, num_sm_parts, fixed_overhead)
        return meta.to(dev), ns.to(dev)
    if b >= 2 ** 31 - 4 * _GW - _GT or num_sm_parts >= 2 ** 28:
        raise ValueError(f"greedy schedule: b ({b}) and num_sm_parts ({num_sm_parts}) must stay below 2**31 / 2**28")
    counts = token_counts.contiguous()
    if _POISON_OUTPUTS:     # tests: every output element must be written by the kernel
        meta = torch.full((num_sm_parts, 8), -12345, dtype=torch.int32, device=dev)
        num_splits = torch.full((b + 1,), -12345, dtype=torch.int32, device=dev)
    else:
        meta = torch.empty(num_sm_parts, 8, dtype=torch.int32, device=dev)
        num_splits = torch.empty(b + 1, dtype=torch.int32, device=dev)
    _greedy_launcher(fixed_overhead, counts.data_ptr() & 15 == 0)((1,), counts, meta, num_splits, b, num_sm_parts)
    return meta, num_splits


def resolve_schedule(meta, num_splits, cfg, plan, legacy, meta_type, device=None):
    """The ``(tile_scheduler_metadata, num_splits)`` pair of one decode call: FlashMLA's metadata contract
    (docs/spec/mla.md §1.1), shared by the dense and the sparse decode paths.

    Args:
        meta: the call's ``tile_scheduler_metadata``. A ``meta_type`` instance (``FlashMLASchedMeta``) is filled on
            its first use with ``cfg`` and ``plan()`` and returned as is by later calls of the same ``cfg``; anything
            else is handed to ``legacy``.
        num_splits: the call's ``num_splits``; must be None with a ``FlashMLASchedMeta``.
        cfg: the call's ``FlashMLASchedMeta.Config`` (compared with ``==`` on reuse; the same object is accepted
            without comparing).
        plan: zero-argument callable returning a fresh ``(meta [num_sm_parts, 8], num_splits [b + 1])`` int32 pair
            (e.g. :func:`compute_schedule` of the call's token counts); called only for an unfilled metadata object.
        legacy: callable ``legacy(meta)`` returning the pair for the other metadata forms a path accepts (legacy
            tensors of the old ``get_mla_metadata``), or None for a form it does not accept.
        meta_type: the ``FlashMLASchedMeta`` class (it lives with the public op, which imports this module).
        device: the call's device (q's); a ``FlashMLASchedMeta`` filled on another device is a ValueError (its
            schedule tensors live there: the kernels would get pointers of another GPU). None: not checked.
    Returns:
        ``(tile_scheduler_metadata, num_splits)``.
    Raises:
        ValueError if ``num_splits`` is given with a ``FlashMLASchedMeta`` or the object was filled for another
        configuration or on another device; TypeError (naming tile_scheduler_metadata) for a form neither accepts.
    """
    if isinstance(meta, meta_type):
        if num_splits is not None:
            raise ValueError("num_splits must be None when tile_scheduler_metadata is a FlashMLASchedMeta")
        if meta.have_initialized:
            if meta.config is not cfg and meta.config != cfg:
                raise ValueError(f"tile_scheduler_metadata was built for {meta.config}, reused with {cfg}; "
                                 "call get_mla_metadata() again for a new configuration")
            if device is not None and meta.tile_scheduler_metadata.device != device:
                raise ValueError(f"tile_scheduler_metadata was filled on {meta.tile_scheduler_metadata.device}, "
                                 f"reused for a call on {device}; use one get_mla_metadata() object per device")
            return meta.tile_scheduler_metadata, meta.num_splits
        sched, ns = plan()
        meta.config, meta.tile_scheduler_metadata, meta.num_splits, meta.have_initialized = cfg, sched, ns, True
        return sched, ns
    pair = legacy(meta)
    if pair is None:
        raise TypeError(f"tile_scheduler_metadata must come from get_mla_metadata(), got {type(meta).__name__}")
    return pair


_LAUNCHERS: dict = {}


def _sched_launcher(overhead: int, aligned: bool, i32: bool) -> KernelLauncher:
    """One KernelLauncher per specialisation of the scheduler kernel: the counts pointer's 16-B alignment and the
    i32/i64 type of b / num_parts are the only facts Triton specialises on (meta and num_splits are fresh
    allocations, always aligned). Keyed by the kernel object too, so a test's stand-in kernel is honoured."""
    return cached_launcher(_LAUNCHERS, _mla_sched_metadata_kernel, (overhead, aligned, i32),
                           lambda: dict(OVERHEAD=overhead, SBLOCK=SCHED_BLOCK, CHUNK=_CHUNK, PARTS=_PARTS_PER_PROGRAM,
                                        num_warps=4), 64)


def _greedy_launcher(overhead: int, aligned: bool) -> KernelLauncher:
    """The greedy kernel's launcher per (overhead, counts alignment): one program of one warp (its loop over parts is
    sequential; a second warp would only add block-wide barriers to every step's reductions)."""
    return cached_launcher(_LAUNCHERS, _mla_sched_greedy_kernel, (overhead, aligned),
                           lambda: dict(OVERHEAD=overhead, SBLOCK=SCHED_BLOCK, W=_GW, TW=_GT, num_warps=1), 64)
