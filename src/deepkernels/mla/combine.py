"""Split-KV combine for MLA decode (FlashMLA ``flash_fwd_mla_combine_kernel`` math, spec/mla.md §3.5).

Inputs are the per-split partials a decode kernel wrote: ``o_accum [rows, s_q, h_q, d_v]`` fp32 holding ``O/L``
(0 for an empty split) and ``lse_accum [rows, s_q, h_q]`` fp32 holding the **base-2** ``log2 L + m`` (``-inf`` for
an empty split); split ``n`` of request ``i`` lives at row ``num_splits[i] + n``. For each (request, query, head):

    mx = max_k lse_k (0 if all -inf);  S = sum_k 2^(lse_k - mx);  G = S == 0 ? +inf : log2 S + mx
    lse = G * ln 2  (natural log, written before the sink)
    sink σ = sink·log2 e:  G = G finite ? G + log2(1 + 2^(σ - G)) : (sink == -inf ? +inf : σ)
    out = round(sum_k 2^(lse_k - G) · o_k)   (fp32 accumulation in increasing k)

A request with **no** split (``num_splits`` planned for a smaller batch and padded) is written too: out 0 / lse +inf
when its query row sees no key (or no lengths are given), NaN when it does (it cannot be computed here).

Grid: ``(b * s_q, ceil(h_q / HEADS))`` — ``b·s_q`` on axis 0 (no 65,535 limit), a head block on axis 1.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._launch import KernelLauncher

__all__ = ["combine_splits_"]

_COMBINE_HEADS = 8


# acc_rows (= b + num_sm_parts) only bounds the split count: not specialised, no recompile per batch size.
@triton.jit(do_not_specialize=["acc_rows"])
def _mla_decode_combine_kernel(oacc_ptr, lacc_ptr, nsplits_ptr, out_ptr, lse_ptr, sink_ptr, len_ptr,
                               s_q, h_q, acc_rows,
                               HAS_SINK: tl.constexpr, ALL_REQUESTS: tl.constexpr,
                               HEADS: tl.constexpr, D_V: tl.constexpr,
                               HAS_LEN: tl.constexpr = False, CAUSAL: tl.constexpr = False):
    pid = tl.program_id(0).to(tl.int64)
    bi = pid // s_q
    si = pid % s_q
    heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    hm = heads < h_q
    # a stale/garbage num_splits never reads outside the accumulators: both ends clamped to [0, acc_rows]
    start = tl.minimum(tl.maximum(tl.load(nsplits_ptr + bi), 0), acc_rows)
    nsp = tl.minimum(tl.maximum(tl.load(nsplits_ptr + bi + 1), start), acc_rows) - start
    if ALL_REQUESTS:
        active = nsp >= 1
    else:
        active = nsp > 1                          # single-split requests were finished by the decode kernel
    if active:
        mx = tl.full([HEADS], float("-inf"), tl.float32)
        for k in range(0, nsp):
            row = (start + k).to(tl.int64)
            lk = tl.load(lacc_ptr + (row * s_q + si) * h_q + heads, mask=hm, other=float("-inf"))
            mx = tl.maximum(mx, lk)
        mx = tl.where(mx == float("-inf"), 0.0, mx)
        ssum = tl.zeros([HEADS], dtype=tl.float32)
        for k in range(0, nsp):
            row = (start + k).to(tl.int64)
            lk = tl.load(lacc_ptr + (row * s_q + si) * h_q + heads, mask=hm, other=float("-inf"))
            ssum += tl.exp2(lk - mx)
        g = tl.where(ssum == 0.0, float("inf"), tl.log2(ssum) + mx)
        tl.store(lse_ptr + (bi * h_q + heads) * s_q + si, g * 0.6931471805599453, mask=hm)
        if HAS_SINK:
            sig = tl.load(sink_ptr + heads, mask=hm, other=float("-inf")) * 1.4426950408889634
            g_fin = g + tl.log2(1.0 + tl.exp2(sig - g))
            g = tl.where(g != float("inf"), g_fin, tl.where(sig == float("-inf"), g, sig))
        dv = tl.arange(0, D_V)
        acc = tl.zeros([HEADS, D_V], dtype=tl.float32)
        for k in range(0, nsp):
            row = (start + k).to(tl.int64)
            lk = tl.load(lacc_ptr + (row * s_q + si) * h_q + heads, mask=hm, other=float("-inf"))
            w = tl.exp2(lk - g)
            o = tl.load(oacc_ptr + ((row * s_q + si) * h_q + heads)[:, None] * D_V + dv[None, :],
                        mask=hm[:, None], other=0.0)
            acc += w[:, None] * o
        optr = out_ptr + ((bi * s_q + si) * h_q + heads)[:, None] * D_V + dv[None, :]
        tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=hm[:, None])
    elif nsp <= 0:
        # no split planned for this request (num_splits of a smaller batch, padded): empty if it has no key,
        # else NaN (it cannot be computed here; never a plausible-looking wrong value)
        n = si * 0
        if HAS_LEN:
            n = tl.load(len_ptr + bi).to(tl.int64)
            if CAUSAL:
                n = n - (s_q - 1 - si)
        bad = n > 0
        tl.store(lse_ptr + (bi * h_q + heads) * s_q + si,
                 tl.zeros([HEADS], tl.float32) + tl.where(bad, float("nan"), float("inf")), mask=hm)
        dv = tl.arange(0, D_V)
        o = tl.zeros([HEADS, D_V], tl.float32) + tl.where(bad, float("nan"), 0.0)
        optr = out_ptr + ((bi * s_q + si) * h_q + heads)[:, None] * D_V + dv[None, :]
        tl.store(optr, o.to(out_ptr.dtype.element_ty), mask=hm[:, None])


def combine_splits_(out: torch.Tensor, lse: torch.Tensor, o_accum: torch.Tensor, lse_accum: torch.Tensor,
                    num_splits: torch.Tensor, attn_sink: torch.Tensor | None = None,
                    all_requests: bool = False, lengths: torch.Tensor | None = None,
                    causal: bool = False) -> None:
    """Launch the combine in place (out-parameter launcher; no validation, callers own the shapes).

    Args:
        out: ``[b, s_q, h_q, d_v]`` contiguous, bf16/fp16 (written for requests with > 1 split, or all requests
            when ``all_requests``).
        lse: ``[b, h_q, s_q]`` contiguous fp32, natural log (same rows written).
        o_accum: ``[rows, s_q, h_q, d_v]`` contiguous fp32; lse_accum: ``[rows, s_q, h_q]`` contiguous fp32 base 2.
        num_splits: ``[b + 1]`` int32 prefix sum from :func:`deepkernels.mla.metadata.compute_schedule`.
        attn_sink: optional ``[h_q]`` fp32; applied here (never in a split) — with ``all_requests=True`` this
            is the one place it is applied, which is what a sparse path with a sink wants.
        all_requests: also combine single-split requests (their decode kernel then writes only partials).
        lengths: optional ``[b]`` int32 key counts (dense: ``cache_seqlens``); ``causal``: query ``i`` of ``s_q``
            sees ``lengths - (s_q - 1 - i)`` keys. Every request with **no** split (``num_splits`` planned for a
            smaller batch and padded, the vLLM CUDA-graph pattern) is written here: out 0 / lse +inf when it has no
            key (or ``lengths`` is None), else NaN out and lse (its attention cannot be computed without a split).
    """
    b, s_q, h_q, d_v = out.shape
    if b * s_q == 0 or h_q == 0:
        return
    sink = attn_sink if attn_sink is not None else lse_accum
    grid = (b * s_q, triton.cdiv(h_q, _COMBINE_HEADS))
    acc_rows = o_accum.shape[0]
    # Triton's specialisation facts of this launch (dtypes, 16-B alignment, s_q/h_q == 1 / % 16, i32 range)
    lens = lengths if lengths is not None else num_splits
    causal = bool(causal) and s_q > 1 and lengths is not None
    ptrs = (o_accum, lse_accum, num_splits, out, lse, sink, lens)
    key = (_mla_decode_combine_kernel, attn_sink is not None, bool(all_requests), d_v, lengths is not None, causal,
           tuple((t.dtype, t.data_ptr() & 15 == 0) for t in ptrs),
           s_q == 1, s_q % 16 == 0, h_q == 1, h_q % 16 == 0, max(s_q, h_q, acc_rows) < 2 ** 31)
    launcher = _LAUNCHERS.get(key)
    if launcher is None:
        if len(_LAUNCHERS) >= 256:
            _LAUNCHERS.clear()
        launcher = _LAUNCHERS[key] = KernelLauncher(_mla_decode_combine_kernel, dict(
            HAS_SINK=attn_sink is not None, ALL_REQUESTS=bool(all_requests), HEADS=_COMBINE_HEADS, D_V=d_v,
            HAS_LEN=lengths is not None, CAUSAL=causal, num_warps=4))
    launcher(grid, o_accum, lse_accum, num_splits, out, lse, sink, lens, s_q, h_q, acc_rows)


_LAUNCHERS: dict = {}   # specialisation key -> KernelLauncher (deepkernels._launch: cached compiled-kernel launch)
