"""Split-KV combine for MLA decode, dense and sparse (FlashMLA ``flash_fwd_mla_combine_kernel`` math, docs/spec/mla.md
§3.5).

Inputs are the per-split partials a decode kernel wrote: ``o_accum [rows, s_q, h_q, d_v]`` fp32 holding ``O/L``
(0 for an empty split) and ``lse_accum [rows, s_q, h_q]`` fp32 holding the **base-2** ``log2 L + m`` (``-inf`` for
an empty split); split ``n`` of request ``i`` lives at row ``num_splits[i] + n``. For each (request, query, head):

    mx = max_k lse_k (0 if all -inf);  S = sum_k 2^(lse_k - mx);  G = S == 0 ? +inf : log2 S + mx
    lse = G * ln 2  (natural log, written before the sink)
    sink σ = sink·log2 e:  G = G finite ? G + log2(1 + 2^(σ - G)) : (sink == -inf ? +inf : σ)
    out = round(sum_k 2^(lse_k - G) · o_k)   (fp32 accumulation in increasing k)

Both ends of a request's split range are clamped to ``[0, rows]``, so a stale or garbage ``num_splits`` never reads
outside the accumulators. A request with **no** split (``num_splits`` planned for a smaller batch and padded) is
written too: out 0 / lse +inf when its query row sees no key (or no lengths are given), NaN when it does (it cannot
be computed here).

One kernel serves both decode paths (:func:`combine_splits_`): the dense path (lse ``[b, h_q, s_q]`` contiguous,
key counts = ``cache_seqlens``, optionally causal) and the sparse path (lse the transposed view of a contiguous
``[b, s_q, h_q]``, key counts = top-k lengths clamped to ``[0, topk]`` plus the extra cache's, round-to-nearest
bf16 under the interpreter).

Grid: ``(b * s_q, ceil(h_q / HEADS))`` — ``b·s_q`` on axis 0 (no 65,535 limit), a head block on axis 1.

Fast combine (session 21; the default since its first device run, see ``_FAST`` below; DEEPKERNELS_FAST_COMBINE=0
off):
:func:`_mla_decode_combine_fast_kernel`, the same fp32 operations in the same order (bit-identical out and lse;
tests/test_mla_combine_fast.py), with fewer dependent memory round trips. The current kernel runs three loops over a request's splits (max, sum, output), one
load per iteration, each waiting for the previous: ``1 + 3·nsp`` dependent round trips for ``nsp`` splits. The fast
kernel reads ``CH`` splits per step (constexpr, 1..4):

* ``nsp <= CH`` (the usual case: at b 64-128 a request has 1-3 splits): one straight-line step issues every lse and
  o_accum load of the request at once, then max, sum, sink and output in the current order: ``num_splits`` + ONE
  round trip, then the store;
* ``nsp > CH``: the three loops, each step loading ``CH`` splits at once (``ceil(nsp / CH)`` round trips per loop).
* ``ROWS`` > 1 (config ``rows``): a program takes ``ROWS`` query rows in turn (grid ``ceil(b*s_q/ROWS)``): fewer
  programs, so the rows of single-split requests (nothing to combine: one ``num_splits`` load) cost less scheduling;
  the rows that do combine run one after another inside the program.

A split past the request's end (``k >= nsp`` in a step) is masked: lse ``-inf``, o 0. That adds exactly nothing:
``max(m, -inf) = m``; its sum term ``2^(-inf - mx) = 0`` and ``S + 0 = S`` (S starts at +0 and only grows, never
-0); its output term ``fma(2^(-inf - G), 0, acc) = acc`` (G is never -inf; acc is never -0 after its first term;
G NaN makes every real term NaN already). So the result is bit for bit the current kernel's, empty splits, sink
(±inf too), no-split requests and clamped ``num_splits`` ranges included (that code is the current kernel's, copied).

``PDL`` (constexpr) starts the kernel with ``griddepcontrol.wait`` (``tl.extra.cuda.gdc_wait``) and is launched with
Triton's ``launch_pdl`` option (programmatic stream serialisation): the combine grid may be scheduled before the
preceding decode kernel has fully retired and waits for its completion (and memory) on the device. Interpreter:
never (no inline asm there). Switches: :func:`set_fast_combine` (module-wide, what the decode paths get) or
``combine_splits_(..., fast=, pdl=, fast_config=)`` per call; config :class:`FastCombineConfig` (HEADS per program,
num_warps, CH, ROWS).
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .._launch import cached_launcher
from .._triton_helpers import rne_bf16 as _rne_bf16

__all__ = ["combine_splits_", "FastCombineConfig", "set_fast_combine", "fast_combine_settings"]

_COMBINE_HEADS = 8


@dataclass(frozen=True)
class FastCombineConfig:
    """Launch shape of the fast combine: ``heads`` per program (power of 2, grid axis 1 = ceil(h_q / heads)),
    ``num_warps``, ``ch`` splits loaded per step (1..4; registers: ch o-tiles of heads x 512 fp32 per program),
    ``rows`` query rows per program, taken in turn (grid axis 0 = ceil(b * s_q / rows))."""
    heads: int = 8
    num_warps: int = 4
    ch: int = 2
    rows: int = 1

    def __post_init__(self):
        if self.heads < 1 or self.heads & (self.heads - 1) or not 1 <= self.ch <= 4 \
                or self.num_warps not in (1, 2, 4, 8, 16) or not 1 <= self.rows <= 64:
            raise ValueError(f"bad FastCombineConfig {self}")


# Module-wide switches (what the decode paths, which never pass fast=/pdl=, get). The fast kernel is ON by default
# since its first device run (session 21, H200, git 25ef801e309c, results/mla_combine-h200-2026-11-30-s21.json: 23/23
# GPU tests; bit-identical on 18/18 bench cases; the combine alone 0.920x the current kernel's time (median, 0.852-
# 0.976), the whole public call 0.997x (0.978-1.059, A/A 0.998-1.023)); DEEPKERNELS_FAST_COMBINE=0 keeps the current
# kernel. PDL stays OFF: 0.882x for the combine alone but whole call 0.995x vs fast's 0.997x, not worth a launch
# attribute that older drivers and graph tooling may not honour.
_FAST = {"on": os.environ.get("DEEPKERNELS_FAST_COMBINE", "1") != "0", "pdl": False, "config": FastCombineConfig()}


def set_fast_combine(enabled: bool, pdl: bool = False, config: FastCombineConfig | None = None) -> tuple:
    """Turn the fast combine on/off for every caller that does not pass ``fast=`` (``pdl``: launch it with
    programmatic dependent launch; ``config``: its launch shape, None keeps the current one). Returns the previous
    ``(enabled, pdl, config)``."""
    prev = (_FAST["on"], _FAST["pdl"], _FAST["config"])
    _FAST["on"], _FAST["pdl"] = bool(enabled), bool(pdl)
    if config is not None:
        _FAST["config"] = config
    return prev


def fast_combine_settings() -> tuple:
    """The module-wide ``(enabled, pdl, config)``."""
    return _FAST["on"], _FAST["pdl"], _FAST["config"]


# acc_rows (= b + num_sm_parts) only bounds the split count, topk / xtopk only count the keys of a request with no
# split: not specialised, no recompile per batch size or top-k.
@triton.jit(do_not_specialize=["acc_rows", "topk", "xtopk"])
def _mla_decode_combine_kernel(oacc_ptr, lacc_ptr, nsplits_ptr, out_ptr, lse_ptr, sink_ptr, len_ptr,
                               s_q, h_q, acc_rows, xlen_ptr=None, topk=0, xtopk=0,
                               HAS_SINK: tl.constexpr = False, ALL_REQUESTS: tl.constexpr = False,
                               HEADS: tl.constexpr = 8, D_V: tl.constexpr = 512,
                               HAS_LEN: tl.constexpr = False, CAUSAL: tl.constexpr = False,
                               LSE_SHQ: tl.constexpr = False, TOPK_LEN: tl.constexpr = False,
                               HAS_EXTRA: tl.constexpr = False, HAS_XLEN: tl.constexpr = False,
                               RNE: tl.constexpr = False):
    """LSE_SHQ: lse is a contiguous [b, s_q, h_q] (else [b, h_q, s_q]). TOPK_LEN: key counts are top-k lengths,
    clamped to [0, topk] (``topk`` when HAS_LEN is off); else ``len_ptr`` holds plain key counts (0 without
    HAS_LEN). HAS_EXTRA / HAS_XLEN: add the extra cache's count (``extra_topk_length`` clamped to [0, xtopk], else
    xtopk). RNE: round the output to nearest-even bf16 explicitly (the interpreter's fp32->bf16 cast truncates).
    The xlen_ptr / topk / xtopk arguments are read only under TOPK_LEN / HAS_EXTRA."""
    pid = tl.program_id(0).to(tl.int64)
    bi = pid // s_q
    si = pid % s_q
    heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    hm = heads < h_q
    if LSE_SHQ:
        lse_off = (bi * s_q + si) * h_q + heads
    else:
        lse_off = (bi * h_q + heads) * s_q + si
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
        tl.store(lse_ptr + lse_off, g * 0.6931471805599453, mask=hm)
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
        if RNE:
            acc = _rne_bf16(acc)
        optr = out_ptr + ((bi * s_q + si) * h_q + heads)[:, None] * D_V + dv[None, :]
        tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=hm[:, None])
    elif nsp <= 0:
        dv = tl.arange(0, D_V)
        optr = out_ptr + ((bi * s_q + si) * h_q + heads)[:, None] * D_V + dv[None, :]
        _no_split_row(optr, lse_ptr, lse_off, len_ptr, xlen_ptr, bi, si, s_q, topk, xtopk, hm, HEADS, D_V, HAS_LEN,
                      TOPK_LEN, CAUSAL, HAS_EXTRA, HAS_XLEN)


@triton.jit
def _no_split_row(optr, lse_ptr, lse_off, len_ptr, xlen_ptr, bi, si, s_q, topk, xtopk, hm, HEADS: tl.constexpr,
                  D_V: tl.constexpr, HAS_LEN: tl.constexpr, TOPK_LEN: tl.constexpr, CAUSAL: tl.constexpr,
                  HAS_EXTRA: tl.constexpr, HAS_XLEN: tl.constexpr):
    """A request with no split planned (num_splits of a smaller batch, padded), both kernels: out 0 / lse +inf if its
    query row has no key, else NaN (it cannot be computed here; never a plausible-looking wrong value)."""
    n = si * 0
    if HAS_LEN:
        n = tl.load(len_ptr + bi).to(tl.int64)
    if TOPK_LEN:
        if HAS_LEN:
            n = tl.minimum(tl.maximum(n, 0), topk)
        else:
            n = n + topk
    if CAUSAL:
        n = n - (s_q - 1 - si)
    if HAS_EXTRA:
        nx = si * 0 + xtopk
        if HAS_XLEN:
            nx = tl.minimum(tl.maximum(tl.load(xlen_ptr + bi).to(tl.int64), 0), xtopk)
        n = n + nx
    bad = n > 0
    tl.store(lse_ptr + lse_off, tl.zeros([HEADS], tl.float32) + tl.where(bad, float("nan"), float("inf")), mask=hm)
    o = tl.zeros([HEADS, D_V], tl.float32) + tl.where(bad, float("nan"), 0.0)
    tl.store(optr, o.to(optr.dtype.element_ty), mask=hm[:, None])


@triton.jit
def _fast_ld(lacc_ptr, oacc_ptr, start, k, nsp, s_q, si, h_q, heads, hm, dv, D_V: tl.constexpr):
    """Split ``k`` of a request (rows ``start + k``): lse ``[HEADS]`` and o ``[HEADS, D_V]``; a split past the
    request's end (``k >= nsp``) reads lse -inf and o 0 (no memory access)."""
    m = hm & (k < nsp)
    # a scalar int64 row offset plus int32 element offsets (fewer 64-bit address registers than an int64 tile)
    rowoff = ((start + k).to(tl.int64) * s_q + si) * h_q
    lk = tl.load(lacc_ptr + rowoff + heads, mask=m, other=float("-inf"))
    o = tl.load((oacc_ptr + rowoff * D_V) + (heads[:, None] * D_V + dv[None, :]), mask=m[:, None], other=0.0)
    return lk, o


@triton.jit
def _fast_ld_lse(lacc_ptr, start, k, nsp, s_q, si, h_q, heads, hm):
    m = hm & (k < nsp)
    rowoff = ((start + k).to(tl.int64) * s_q + si) * h_q
    return tl.load(lacc_ptr + rowoff + heads, mask=m, other=float("-inf"))


@triton.jit
def _fast_lse_out(lse_ptr, lse_off, sink_ptr, heads, hm, mx, ssum, HAS_SINK: tl.constexpr):
    """The current kernel's lse tail: G from (mx, S), the natural-log lse store, the sink."""
    mx = tl.where(mx == float("-inf"), 0.0, mx)
    g = tl.where(ssum == 0.0, float("inf"), tl.log2(ssum) + mx)
    tl.store(lse_ptr + lse_off, g * 0.6931471805599453, mask=hm)
    if HAS_SINK:
        sig = tl.load(sink_ptr + heads, mask=hm, other=float("-inf")) * 1.4426950408889634
        g_fin = g + tl.log2(1.0 + tl.exp2(sig - g))
        g = tl.where(g != float("inf"), g_fin, tl.where(sig == float("-inf"), g, sig))
    return g


# Same arguments as the current kernel plus n_rows (= b * s_q), CH (splits per step), ROWS (query rows per program)
# and PDL; acc_rows / topk / xtopk / n_rows unspecialised.
@triton.jit(do_not_specialize=["acc_rows", "topk", "xtopk", "n_rows"])
def _mla_decode_combine_fast_kernel(oacc_ptr, lacc_ptr, nsplits_ptr, out_ptr, lse_ptr, sink_ptr, len_ptr,
                                    s_q, h_q, acc_rows, xlen_ptr=None, topk=0, xtopk=0, n_rows=1,
                                    HAS_SINK: tl.constexpr = False, ALL_REQUESTS: tl.constexpr = False,
                                    HEADS: tl.constexpr = 8, D_V: tl.constexpr = 512,
                                    HAS_LEN: tl.constexpr = False, CAUSAL: tl.constexpr = False,
                                    LSE_SHQ: tl.constexpr = False, TOPK_LEN: tl.constexpr = False,
                                    HAS_EXTRA: tl.constexpr = False, HAS_XLEN: tl.constexpr = False,
                                    RNE: tl.constexpr = False, CH: tl.constexpr = 2, ROWS: tl.constexpr = 1,
                                    PDL: tl.constexpr = False):
    """The current kernel's math and order (module docstring, "Fast combine"), ``CH`` splits per load step; a
    request with ``nsp <= CH`` splits is one straight-line step (all its loads in flight at once). ``ROWS`` > 1:
    each program takes query rows ``pid*ROWS ..`` in turn (fewer programs; a row whose request needs no combine
    costs one ``num_splits`` load). PDL: wait for the preceding grid (griddepcontrol.wait) before the first load."""
    if PDL:
        tl.extra.cuda.gdc_wait()
    if ROWS == 1:
        _fast_row(tl.program_id(0).to(tl.int64), oacc_ptr, lacc_ptr, nsplits_ptr, out_ptr, lse_ptr, sink_ptr,
                  len_ptr, s_q, h_q, acc_rows, xlen_ptr, topk, xtopk, HAS_SINK, ALL_REQUESTS, HEADS, D_V, HAS_LEN,
                  CAUSAL, LSE_SHQ, TOPK_LEN, HAS_EXTRA, HAS_XLEN, RNE, CH)
    else:
        for r in range(ROWS):
            row = tl.program_id(0).to(tl.int64) * ROWS + r
            if row < n_rows:
                _fast_row(row, oacc_ptr, lacc_ptr, nsplits_ptr, out_ptr, lse_ptr, sink_ptr, len_ptr, s_q, h_q,
                          acc_rows, xlen_ptr, topk, xtopk, HAS_SINK, ALL_REQUESTS, HEADS, D_V, HAS_LEN, CAUSAL,
                          LSE_SHQ, TOPK_LEN, HAS_EXTRA, HAS_XLEN, RNE, CH)


@triton.jit
def _fast_row(pid, oacc_ptr, lacc_ptr, nsplits_ptr, out_ptr, lse_ptr, sink_ptr, len_ptr, s_q, h_q, acc_rows, xlen_ptr,
              topk, xtopk, HAS_SINK: tl.constexpr, ALL_REQUESTS: tl.constexpr, HEADS: tl.constexpr,
              D_V: tl.constexpr, HAS_LEN: tl.constexpr, CAUSAL: tl.constexpr, LSE_SHQ: tl.constexpr,
              TOPK_LEN: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_XLEN: tl.constexpr, RNE: tl.constexpr,
              CH: tl.constexpr):
    """Query row ``pid`` (= bi * s_q + si), head block ``program_id(1)``: the fast kernel's body."""
    bi = pid // s_q
    si = pid % s_q
    heads = tl.program_id(1) * HEADS + tl.arange(0, HEADS)
    hm = heads < h_q
    if LSE_SHQ:
        lse_off = (bi * s_q + si) * h_q + heads
    else:
        lse_off = (bi * h_q + heads) * s_q + si
    start = tl.minimum(tl.maximum(tl.load(nsplits_ptr + bi), 0), acc_rows)
    nsp = tl.minimum(tl.maximum(tl.load(nsplits_ptr + bi + 1), start), acc_rows) - start
    if ALL_REQUESTS:
        active = nsp >= 1
    else:
        active = nsp > 1
    dv = tl.arange(0, D_V)
    optr = out_ptr + ((bi * s_q + si) * h_q + heads)[:, None] * D_V + dv[None, :]
    if active:
        mx = tl.full([HEADS], float("-inf"), tl.float32)
        ssum = tl.zeros([HEADS], dtype=tl.float32)
        acc = tl.zeros([HEADS, D_V], dtype=tl.float32)
        if nsp <= CH:
            # every load of the request at once (splits >= nsp masked: lse -inf, o 0 -- exact no-ops below)
            l0, o0 = _fast_ld(lacc_ptr, oacc_ptr, start, 0, nsp, s_q, si, h_q, heads, hm, dv, D_V)
            if CH >= 2:
                l1, o1 = _fast_ld(lacc_ptr, oacc_ptr, start, 1, nsp, s_q, si, h_q, heads, hm, dv, D_V)
            if CH >= 3:
                l2, o2 = _fast_ld(lacc_ptr, oacc_ptr, start, 2, nsp, s_q, si, h_q, heads, hm, dv, D_V)
            if CH >= 4:
                l3, o3 = _fast_ld(lacc_ptr, oacc_ptr, start, 3, nsp, s_q, si, h_q, heads, hm, dv, D_V)
            mx = tl.maximum(mx, l0)
            if CH >= 2:
                mx = tl.maximum(mx, l1)
            if CH >= 3:
                mx = tl.maximum(mx, l2)
            if CH >= 4:
                mx = tl.maximum(mx, l3)
            mxz = tl.where(mx == float("-inf"), 0.0, mx)
            ssum += tl.exp2(l0 - mxz)
            if CH >= 2:
                ssum += tl.exp2(l1 - mxz)
            if CH >= 3:
                ssum += tl.exp2(l2 - mxz)
            if CH >= 4:
                ssum += tl.exp2(l3 - mxz)
            g = _fast_lse_out(lse_ptr, lse_off, sink_ptr, heads, hm, mx, ssum, HAS_SINK)
            w = tl.exp2(l0 - g)
            acc += w[:, None] * o0
            if CH >= 2:
                w = tl.exp2(l1 - g)
                acc += w[:, None] * o1
            if CH >= 3:
                w = tl.exp2(l2 - g)
                acc += w[:, None] * o2
            if CH >= 4:
                w = tl.exp2(l3 - g)
                acc += w[:, None] * o3
        else:
            # the current three loops, CH splits loaded per step
            for k0 in range(0, nsp, CH):
                l0 = _fast_ld_lse(lacc_ptr, start, k0, nsp, s_q, si, h_q, heads, hm)
                if CH >= 2:
                    l1 = _fast_ld_lse(lacc_ptr, start, k0 + 1, nsp, s_q, si, h_q, heads, hm)
                if CH >= 3:
                    l2 = _fast_ld_lse(lacc_ptr, start, k0 + 2, nsp, s_q, si, h_q, heads, hm)
                if CH >= 4:
                    l3 = _fast_ld_lse(lacc_ptr, start, k0 + 3, nsp, s_q, si, h_q, heads, hm)
                mx = tl.maximum(mx, l0)
                if CH >= 2:
                    mx = tl.maximum(mx, l1)
                if CH >= 3:
                    mx = tl.maximum(mx, l2)
                if CH >= 4:
                    mx = tl.maximum(mx, l3)
            mxz = tl.where(mx == float("-inf"), 0.0, mx)
            for k0 in range(0, nsp, CH):
                l0 = _fast_ld_lse(lacc_ptr, start, k0, nsp, s_q, si, h_q, heads, hm)
                if CH >= 2:
                    l1 = _fast_ld_lse(lacc_ptr, start, k0 + 1, nsp, s_q, si, h_q, heads, hm)
                if CH >= 3:
                    l2 = _fast_ld_lse(lacc_ptr, start, k0 + 2, nsp, s_q, si, h_q, heads, hm)
                if CH >= 4:
                    l3 = _fast_ld_lse(lacc_ptr, start, k0 + 3, nsp, s_q, si, h_q, heads, hm)
                ssum += tl.exp2(l0 - mxz)
                if CH >= 2:
                    ssum += tl.exp2(l1 - mxz)
                if CH >= 3:
                    ssum += tl.exp2(l2 - mxz)
                if CH >= 4:
                    ssum += tl.exp2(l3 - mxz)
            g = _fast_lse_out(lse_ptr, lse_off, sink_ptr, heads, hm, mx, ssum, HAS_SINK)
            for k0 in range(0, nsp, CH):
                l0, o0 = _fast_ld(lacc_ptr, oacc_ptr, start, k0, nsp, s_q, si, h_q, heads, hm, dv, D_V)
                if CH >= 2:
                    l1, o1 = _fast_ld(lacc_ptr, oacc_ptr, start, k0 + 1, nsp, s_q, si, h_q, heads, hm, dv, D_V)
                if CH >= 3:
                    l2, o2 = _fast_ld(lacc_ptr, oacc_ptr, start, k0 + 2, nsp, s_q, si, h_q, heads, hm, dv, D_V)
                if CH >= 4:
                    l3, o3 = _fast_ld(lacc_ptr, oacc_ptr, start, k0 + 3, nsp, s_q, si, h_q, heads, hm, dv, D_V)
                w = tl.exp2(l0 - g)
                acc += w[:, None] * o0
                if CH >= 2:
                    w = tl.exp2(l1 - g)
                    acc += w[:, None] * o1
                if CH >= 3:
                    w = tl.exp2(l2 - g)
                    acc += w[:, None] * o2
                if CH >= 4:
                    w = tl.exp2(l3 - g)
                    acc += w[:, None] * o3
        if RNE:
            acc = _rne_bf16(acc)
        tl.store(optr, acc.to(out_ptr.dtype.element_ty), mask=hm[:, None])
    elif nsp <= 0:
        _no_split_row(optr, lse_ptr, lse_off, len_ptr, xlen_ptr, bi, si, s_q, topk, xtopk, hm, HEADS, D_V, HAS_LEN,
                      TOPK_LEN, CAUSAL, HAS_EXTRA, HAS_XLEN)


def combine_splits_(out: torch.Tensor, lse: torch.Tensor, o_accum: torch.Tensor, lse_accum: torch.Tensor,
                    num_splits: torch.Tensor, attn_sink: torch.Tensor | None = None,
                    all_requests: bool = False, lengths: torch.Tensor | None = None,
                    causal: bool = False, *, topk: int | None = None, extra_lengths: torch.Tensor | None = None,
                    extra_topk: int | None = None, rne: bool = False, _spec=None, fast: bool | None = None,
                    pdl: bool | None = None, fast_config: FastCombineConfig | None = None) -> None:
    """Launch the combine in place (out-parameter launcher; callers own the shapes, only lse's layout is checked).

    Args:
        out: ``[b, s_q, h_q, d_v]`` contiguous, bf16/fp16 (written for requests with > 1 split, or all requests
            when ``all_requests``, and for requests with no split).
        lse: ``[b, h_q, s_q]`` fp32, natural log (same rows written): contiguous (dense decode) or the transposed
            view of a contiguous ``[b, s_q, h_q]`` (sparse decode; strides ``(s_q*h_q, 1, h_q)``).
        o_accum: ``[rows, s_q, h_q, d_v]`` contiguous fp32; lse_accum: ``[rows, s_q, h_q]`` contiguous fp32 base 2.
        num_splits: ``[b + 1]`` int32 prefix sum from :func:`deepkernels.mla.metadata.compute_schedule`; each
            request's range is clamped to ``[0, rows]`` (a stale or garbage value never reads outside o_accum).
        attn_sink: optional ``[h_q]`` fp32; applied here (never in a split) — with ``all_requests=True`` this
            is the one place it is applied, which is what a sparse path with a sink wants.
        all_requests: also combine single-split requests (their decode kernel then writes only partials).
        lengths: optional ``[b]`` int32 key counts (dense: ``cache_seqlens``; with ``topk``: top-k lengths);
            ``causal``: query ``i`` of ``s_q`` sees ``lengths - (s_q - 1 - i)`` keys. Every request with **no**
            split (``num_splits`` planned for a smaller batch and padded, the vLLM CUDA-graph pattern) is written
            here: out 0 / lse +inf when it has no key (or no key count is known: ``lengths`` and ``topk`` None),
            else NaN out and lse (its attention cannot be computed without a split).
        topk: sparse decode: a request's key count is ``clamp(lengths[i], 0, topk)``, or ``topk`` when
            ``lengths`` is None. extra_topk / extra_lengths: an extra cache's count, ``clamp(extra_lengths[i], 0,
            extra_topk)`` or ``extra_topk``, added to it.
        rne: round the output to nearest-even explicitly (bf16 under the interpreter, whose fp32->bf16 cast
            truncates; the GPU cast already rounds to nearest even).
        _spec: a hashable object standing for the launch facts a caller's cached call plan fixes: dtype and 16-B
            alignment of every pointer argument except num_splits (which also stands in for absent lengths), the
            s_q / h_q / topk facts and lse's layout (its check is skipped). None: all computed (and checked) here.
        fast: run the fast combine (module docstring, "Fast combine"; bit-identical results); None: the module-wide
            switch (:func:`set_fast_combine`; on by default). pdl: launch the fast combine with programmatic
            dependent launch (None: the module-wide switch; never under the interpreter; ignored without fast).
            fast_config: its :class:`FastCombineConfig` (None: the module-wide one).
    Raises:
        ValueError if ``lse`` has neither layout (``_spec`` None).
    """
    b, s_q, h_q, d_v = out.shape
    if b * s_q == 0 or h_q == 0:
        return
    ls = lse.stride()
    lse_shq = ls[2] != 1 and s_q > 1        # s_q == 1 (or h_q == 1): both layouts are the same memory
    want = (s_q * h_q, 1, h_q) if lse_shq else (h_q * s_q, s_q, 1)
    if _spec is None and (lse.shape != (b, h_q, s_q) or any(n > 1 and st != w for n, st, w in zip(lse.shape, ls,
                                                                                                     want))):
        raise ValueError(f"lse must be [b, h_q, s_q] = {[b, h_q, s_q]}, contiguous or the transposed view of a "
                         f"contiguous [b, s_q, h_q]; got shape {list(lse.shape)} strides {list(ls)}")
    sink = attn_sink if attn_sink is not None else lse_accum
    grid = _combine_grid(b, s_q, h_q)
    acc_rows = o_accum.shape[0]
    lens = lengths if lengths is not None else num_splits
    xlens = extra_lengths if extra_lengths is not None else num_splits
    causal = bool(causal) and s_q > 1 and lengths is not None
    has_x = extra_topk is not None
    topk_i = 0 if topk is None else int(topk)
    xtopk_i = int(extra_topk) if has_x else 0
    flags = (attn_sink is not None, bool(all_requests), d_v, lengths is not None, causal, lse_shq, topk is not None,
             has_x, has_x and extra_lengths is not None, bool(rne))
    if _spec is None:
        # Triton's specialisation facts of this launch (dtypes, 16-B alignment, s_q/h_q == 1 / % 16, i32 range)
        ptrs = (o_accum, lse_accum, num_splits, out, lse, sink, lens, xlens)
        key = (flags, tuple((t.dtype, t.data_ptr() & 15 == 0) for t in ptrs),
               s_q == 1, s_q % 16 == 0, h_q == 1, h_q % 16 == 0,
               max(s_q, h_q, acc_rows, topk_i, xtopk_i) < 2 ** 31)
    else:   # num_splits and acc_rows are the only facts the caller's plan does not fix
        key = (flags, _spec, num_splits.dtype, num_splits.data_ptr() & 15 == 0, acc_rows < 2 ** 31)
    if fast if fast is not None else _FAST["on"]:
        cfg = fast_config if fast_config is not None else _FAST["config"]
        use_pdl = (pdl if pdl is not None else _FAST["pdl"]) and not _interpreting()
        launcher = cached_launcher(_LAUNCHERS, _mla_decode_combine_fast_kernel,
                                   (key, cfg, use_pdl, b * s_q < 2 ** 31), lambda: dict(
            HAS_SINK=flags[0], ALL_REQUESTS=flags[1], HEADS=cfg.heads, D_V=d_v, HAS_LEN=flags[3], CAUSAL=causal,
            LSE_SHQ=lse_shq, TOPK_LEN=flags[6], HAS_EXTRA=has_x, HAS_XLEN=flags[8], RNE=flags[9], CH=cfg.ch,
            ROWS=cfg.rows, PDL=use_pdl, num_warps=cfg.num_warps, launch_pdl=use_pdl), 256)
        launcher((triton.cdiv(b * s_q, cfg.rows), triton.cdiv(h_q, cfg.heads)), o_accum, lse_accum, num_splits, out,
                 lse, sink, lens, s_q, h_q, acc_rows, xlens, topk_i, xtopk_i, b * s_q)
        return
    launcher = cached_launcher(_LAUNCHERS, _mla_decode_combine_kernel, key, lambda: dict(
        HAS_SINK=flags[0], ALL_REQUESTS=flags[1], HEADS=_COMBINE_HEADS, D_V=d_v, HAS_LEN=flags[3], CAUSAL=causal,
        LSE_SHQ=lse_shq, TOPK_LEN=flags[6], HAS_EXTRA=has_x, HAS_XLEN=flags[8], RNE=flags[9], num_warps=4), 256)
    launcher(grid, o_accum, lse_accum, num_splits, out, lse, sink, lens, s_q, h_q, acc_rows, xlens, topk_i, xtopk_i)


def _interpreting() -> bool:
    from triton import knobs
    return bool(knobs.runtime.interpret)


def _combine_grid(b: int, s_q: int, h_q: int) -> tuple:
    """Combine grid: ``b * s_q`` on axis 0 (no 65,535 limit), head blocks of 8 on axis 1 (h_q <= 128 -> at most
    16)."""
    return (b * s_q, triton.cdiv(h_q, _COMBINE_HEADS))


_LAUNCHERS: dict = {}   # specialisation key -> KernelLauncher (deepkernels._launch: cached compiled-kernel launch)
