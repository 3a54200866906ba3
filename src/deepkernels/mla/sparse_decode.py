"""Sparse top-k MLA decode over FP8/FP4 KV caches (FlashMLA V3.2, MODEL1, V4.1, FP4) -- the sparse path of
``flash_mla_with_kvcache``.

``deepkernels.mla.decode.flash_mla_with_kvcache`` routes every call with ``indices`` here
(:func:`_sparse_decode_forward`). Semantics: :mod:`deepkernels.reference.mla_sparse` (FlashMLA
``flash_mla_with_kvcache`` sparse mode, docs/spec/mla.md §1.2, §2, §3, §4, §9). Kernels:
:mod:`deepkernels.mla._sparse_kernels` (split-KV stage) and the combine shared with dense decode
(:func:`deepkernels.mla.combine.combine_splits_`), scheduled by :func:`deepkernels.mla.metadata.compute_schedule`
driven by the per-request token count (``topk_length`` or ``topk``; with an extra cache
``64*ceil(n_main/64) + n_extra``, FlashMLA's rule); the metadata contract is
:func:`deepkernels.mla.metadata.resolve_schedule`, shared with dense decode.

Host path (as dense decode): every argument check is a function of the call's *signature* (dtype, shape, strides,
device and 16-byte alignment of each tensor, the flags, the interpreter / forced-reference switches), so a
signature that passed once is cached (``_PLANS``) and a repeated call skips the checks; the split-KV kernel is
launched through a :class:`deepkernels._launch.KernelLauncher` keyed by that plan (direct compiled-kernel launch on
the GPU), and so is the combine (``combine_splits_(..., _spec=plan)``). softmax_scale, num_splits and the metadata
object (type, state, configuration) are checked on every call.

Batch-invariant mode (no split-KV, so a request's result never depends on the other requests of the batch): call
``deepkernels.set_sparse_decode_batch_invariant(True)`` or set ``DEEPKERNELS_BATCH_INVARIANT=1`` in the
environment; each (request, query position, head block) is then computed by one program in one pass.
"""
from __future__ import annotations

import math
import os
from typing import Optional

import torch

from .._backend import device_of, interpret_mode, use_kernels
from .._launch import KernelLauncher, cached_launcher, spec_key
from .._validate import check_tensor, rewrite_nonpositive_scale
from ..quant.kvcache import KV_FORMATS
from ..reference.mla_sparse import detect_sparse_formats, sparse_decode_ref
from . import _gluon_sparse_decode as _gsd
from . import _gluon_sparse_decode_ws as _gsdw
from . import _gluon_sparse_decode_ws2 as _gsdw2
from . import _gluon_sparse_decode_ws3 as _gsdw3
from . import _sparse_kernels as _sk
from .combine import combine_splits_
from .decode import FlashMLASchedMeta, _check_metadata_empty, _num_sms   # _num_sms: set_mla_num_sms / set_num_sms
from .metadata import FIXED_OVERHEAD_BLOCKS, SCHED_BLOCK, compute_schedule, resolve_schedule

__all__ = ["set_sparse_decode_batch_invariant", "sparse_decode_batch_invariant", "sparse_decode_config",
           "SPARSE_DECODE_CONFIGS", "SPARSE_DECODE_CANDIDATES"]

_LOG2E = 1.4426950408889634
_CACHE_DTYPES = (torch.float8_e4m3fn, torch.int8, torch.uint8)

# Config table by h_q: (BLOCK_H, BLOCK_N, num_warps, num_stages, parts_per_sm). BLOCK_H <= 64 keeps the
# [64, 512] fp32 accumulator at 128 registers/thread over two warpgroups (a 128-head accumulator is the whole
# register file, which is why FlashMLA splits h_q=128 over a 2-CTA cluster; plain Triton has no DSMEM, so h_q=128
# runs as two 64-head programs that each dequantise the tokens). MODEL1 uses BLOCK_N=32: its RoPE is spliced into
# dims 448..511 of the K = V tile and at BLOCK_N=64 ptxas spills inside the token loop. Every entry compiles for
# sm90 within 227 KB of shared memory with no spills inside the token loop (SASS checked:
# tests/test_mla_sparse_kernels.py, compile tier); candidates are timed by benchmarks/mla_sparse_decode.py --sweep.
SPARSE_DECODE_CONFIGS = {
    16: (16, 64, 8, 2, 1),
    32: (64, 64, 8, 2, 1),      # 32 heads padded to a 64-row wgmma tile (a 32-row mma.sync tile spills)
    64: (64, 64, 8, 2, 1),
    128: (64, 64, 8, 2, 1),
}
# Candidates timed by benchmarks/mla_sparse_decode.py --sweep (h_q in {64, 128}); all compile without spills inside
# the token loop (compile tier).
SPARSE_DECODE_CANDIDATES = [
    (64, 64, 8, 2, 1),
    (64, 32, 8, 3, 1),
    (64, 32, 8, 2, 1),
    (64, 64, 8, 3, 1),
    (64, 64, 8, 2, 2),
]
_FMT_BLOCK_N = {"model1": 32}     # MODEL1 splices its RoPE into the tile: more registers, smaller token tiles


def sparse_decode_config(h_q: int, fmt: str) -> tuple:
    """The (BLOCK_H, BLOCK_N, num_warps, num_stages, parts_per_sm) used for ``h_q`` heads and a main-cache format
    (the extra cache's token tile is ``_block_n(config, extra_fmt)``)."""
    bh, bn, w, st, per_sm = SPARSE_DECODE_CONFIGS[h_q]
    return bh, _block_n(bn, fmt), w, st, per_sm


def _block_n(bn: int, fmt: str) -> int:
    return min(bn, _FMT_BLOCK_N.get(fmt, bn))


_BATCH_INVARIANT = os.environ.get("DEEPKERNELS_BATCH_INVARIANT", "0") not in ("", "0")
_POISON_OUTPUTS = False   # test knob: fill out/lse/accumulators with NaN before launch (checks every element is written)


def set_sparse_decode_batch_invariant(enabled: bool) -> None:
    """Disable (True) or re-enable (False) split-KV for sparse decode. With splitting disabled, every (request,
    query position, head block) is one program over all of the request's tokens, so results are bit-identical
    whatever else is in the batch (FlashMLA [2026-09+] ``enable_batch_invariant``). Default: the
    ``DEEPKERNELS_BATCH_INVARIANT`` environment variable (unset = splitting on). Raises TypeError for a non-bool."""
    global _BATCH_INVARIANT
    if not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool, got {type(enabled).__name__}")
    _BATCH_INVARIANT = enabled


def sparse_decode_batch_invariant() -> bool:
    """Whether sparse decode currently runs without split-KV (see :func:`set_sparse_decode_batch_invariant`)."""
    return _BATCH_INVARIANT


def _num_sm_parts(device, s_q: int, h_q: int, config) -> int:
    block_h, _, _, _, per_sm = config
    return max(_num_sms(device) * per_sm // s_q // -(-h_q // block_h), 1)


def _check_cache(name: str, c: torch.Tensor, fmt: str):
    check_tensor(name, c, ndim=4, dtype=_CACHE_DTYPES)
    f = KV_FORMATS[fmt]
    nb, page, h_k, bpt = c.shape
    if h_k != 1:
        raise ValueError(f"{name} must have h_k = 1 (shape [num_blocks, page_block_size, 1, {bpt}]), got "
                         f"{list(c.shape)}")
    if nb < 1 or page < 1:
        raise ValueError(f"{name} must have >= 1 block and page_block_size >= 1, got shape {list(c.shape)}")
    if (page > 1 and c.stride(1) != bpt) or c.stride(3) != 1:
        raise ValueError(f"{name} must have stride(1) == bytes_per_token ({bpt}) and a contiguous last dim, got "
                         f"strides {list(c.stride())}")
    if nb > 1 and c.stride(0) < f.block_bytes(page):
        raise ValueError(f"{name} stride(0) must cover one page block ({f.block_bytes(page)} bytes), got "
                         f"{c.stride(0)}")
    if c.data_ptr() % 4 or (nb > 1 and c.stride(0) % 4):
        raise ValueError(f"{name} must start on a 4-byte boundary with stride(0) a multiple of 4 bytes (fp32 scales, "
                         f"bf16 RoPE), got address % 4 = {c.data_ptr() % 4}, stride(0) = {c.stride(0)}")
    if nb * page >= 2 ** 31:
        raise ValueError(f"{name} holds {nb * page} tokens; indices are int32, so at most 2^31 - 1")


def _check_indices(name: str, ind: torch.Tensor, b: int, s_q: int) -> None:
    check_tensor(name, ind, ndim=3, dtype=torch.int32)
    if ind.shape[0] != b or ind.shape[1] != s_q:
        raise ValueError(f"{name} must have shape [b={b}, s_q={s_q}, topk], got {list(ind.shape)}")


def _check_len(name: str, t: Optional[torch.Tensor], b: int) -> None:
    if t is None:
        return
    check_tensor(name, t, ndim=1, dtype=torch.int32)
    if t.shape[0] != b:
        raise ValueError(f"{name} must have shape [b={b}], got {list(t.shape)}")


def _token_counts(b, topk, topk_length, xtopk, extra_topk_length, has_extra, device):
    """Per-request scheduler token counts on the device (no host sync): n_main, or 64*ceil(n_main/64) + n_extra."""
    n = (topk_length.clamp(0, topk) if topk_length is not None
         else torch.full((b,), topk, dtype=torch.int32, device=device))
    if not has_extra:
        return n.to(torch.int32)
    nx = (extra_topk_length.clamp(0, xtopk) if extra_topk_length is not None
          else torch.full((b,), xtopk, dtype=torch.int32, device=device))
    return ((n + SCHED_BLOCK - 1) // SCHED_BLOCK * SCHED_BLOCK + nx).to(torch.int32)


# FlashMLA's greedy split-KV schedule (metadata.compute_schedule(algorithm="greedy"), a device port, exact) for
# sparse calls planned into a FlashMLASchedMeta (once per decode step) when the batch has at most 2 requests per
# scheduler part: it then gives a part whole requests (no split pieces, nothing to combine) where the linear schedule
# splits every request. Measured (H200, session 21, git 5829daf8bdc7, results/mla_sched-h200-2026-11-30-s21.json,
# public call, CUDA-graph replay, 3 rotated rounds, A/A 0.998-1.003): h_q 128 topk 2048, V3.2 / V4.1 / V4.1+FP4
# b 64 s_q 1 (0.97 requests per part) 0.930 / 0.914 / 0.917x the time; V3.2 / V4.1 b 128 s_q 1 (1.94) 0.978 /
# 0.975x; b 128 s_q 2 (3.9 per part) 1.008x -> excluded by the rule. h_q 64 (132 parts at s_q 1, 66 at s_q 2: every
# bench row inside the rule; git 1dab19d5a473, results/mla_sched_h64-h200-2026-11-30-s21.json, A/A 0.998-1.001):
# V3.2 / V4.1 b 64 s_q 1 0.977 / 0.981x, b 128 s_q 1 0.934 / 0.931x, b 128 s_q 2 0.975 / 0.967x.
# DEEPKERNELS_SPARSE_GREEDY_SCHED=0 keeps the linear schedule everywhere.
_GREEDY_SCHED = os.environ.get("DEEPKERNELS_SPARSE_GREEDY_SCHED", "1") != "0"


def _use_greedy(b: int, parts: int) -> bool:
    return _GREEDY_SCHED and 0 < b <= 2 * parts


def _trivial_schedule(b: int, device):
    """Batch-invariant plan: part i = request i, whole line, one split."""
    meta = torch.zeros(b, 8, dtype=torch.int32, device=device)
    meta[:, 0] = torch.arange(b, dtype=torch.int32, device=device)
    meta[:, 1] = meta[:, 0]
    meta[:, 3] = 1 << 24
    return meta, torch.arange(b + 1, dtype=torch.int32, device=device)


_FWD_CONSTEXPRS = ("FMT", "XFMT", "PAGE_SHIFT", "XPAGE_SHIFT", "HAS_EXTRA", "HAS_LEN", "HAS_XLEN", "HAS_SINK",
                   "BLOCK_H", "BLOCK_N", "XBLOCK_N", "SBLOCK", "UPCAST", "NUM_STAGES")
_LAUNCHERS: dict = {}
_LAUNCHER_LIMIT = 1024


def _fwd_launcher(fn, constexprs: tuple, warps: int, stages: int, spec) -> KernelLauncher:
    """KernelLauncher of the split-KV kernel for one specialisation ``spec`` (Triton's facts about the non-constexpr
    arguments). Keyed by the kernel object too, so a test's stand-in kernel (monkeypatched module attribute) is what
    gets called."""
    return cached_launcher(_LAUNCHERS, fn, (constexprs, warps, stages, spec),
                           lambda: dict(zip(_FWD_CONSTEXPRS, constexprs), num_warps=warps, num_stages=stages),
                           _LAUNCHER_LIMIT)


def _launch_sparse_decode(out, lse_buf, q, k_cache, indices, sched, num_splits, scale, fmt, attn_sink=None,
                          extra_k_cache=None, extra_indices=None, xfmt=None, topk_length=None,
                          extra_topk_length=None, config=None, _spec=None):
    """Out-parameter launcher (inputs already validated): ``out [b, s_q, h_q, 512]`` contiguous bf16,
    ``lse_buf [b, s_q, h_q]`` contiguous fp32 natural log; ``sched [parts, 8]``/``num_splits [b + 1]`` int32.
    ``_spec``: a hashable object standing for the specialisation facts of every kernel argument except
    sched/num_splits/acc_rows (the public op passes its cached call plan, whose signature fixes them); None computes
    them here with :func:`deepkernels._launch.spec_key`."""
    b, s_q, h_q, _ = q.shape
    block_h, block_n, warps, stages, _ = config or sparse_decode_config(h_q, fmt)
    parts = sched.shape[0]
    acc_rows = b + parts
    dev = q.device
    o_acc = torch.empty(acc_rows, s_q, h_q, 512, dtype=torch.float32, device=dev)
    l_acc = torch.empty(acc_rows, s_q, h_q, dtype=torch.float32, device=dev)
    if _POISON_OUTPUTS:
        for t in (out, lse_buf, o_acc, l_acc):
            t.fill_(float("nan"))
    kv = k_cache.view(torch.uint8)
    has_x = extra_k_cache is not None
    xkv = extra_k_cache.view(torch.uint8) if has_x else kv
    xind = extra_indices if has_x else indices
    topk, xtopk = indices.shape[2], (xind.shape[2] if has_x else 0)
    dummy = l_acc
    ptrs = (q, kv, indices, topk_length if topk_length is not None else dummy,
            xkv, xind, extra_topk_length if extra_topk_length is not None else dummy,
            attn_sink if attn_sink is not None else dummy)
    ints = (q.stride(0), q.stride(1), q.stride(2),
            kv.stride(0), kv.shape[1], kv.shape[0] * kv.shape[1], indices.stride(0), indices.stride(1),
            xkv.stride(0), xkv.shape[1], xkv.shape[0] * xkv.shape[1], xind.stride(0), xind.stride(1),
            b, s_q, h_q, topk, xtopk, acc_rows)
    plan_spec = _spec
    if _spec is None:
        _spec = spec_key(*ptrs, out, lse_buf, o_acc, l_acc, *ints)
    else:   # sched/num_splits/acc_rows are the only launch facts the public op's signature does not fix
        _spec = (_spec, acc_rows < 2 ** 31)
    spec = (_spec, sched.dtype, sched.data_ptr() & 15 == 0, num_splits.dtype, num_splits.data_ptr() & 15 == 0)
    interp = interpret_mode()
    constexprs = (_sk.FMT_CODES[fmt], _sk.FMT_CODES[xfmt] if has_x else _sk.FMT_CODES[fmt],
                  _page_shift(kv.shape[1]), _page_shift(xkv.shape[1]), has_x, topk_length is not None,
                  extra_topk_length is not None, attn_sink is not None, block_h, block_n,
                  _block_n(block_n, xfmt) if has_x else block_n, SCHED_BLOCK, interp, stages)
    launcher = _fwd_launcher(_sk._sparse_decode_fwd_kernel, constexprs, warps, stages, spec)
    launcher(_fwd_grid(parts, s_q, h_q, block_h), *ptrs, sched, num_splits, out, lse_buf, o_acc, l_acc, *ints,
             scale * _LOG2E)
    # every request row is written: > 1 split combined here (sink applied once, here); 0 splits (padded
    # num_splits) -> out 0 / lse +inf without a token position, else NaN (combine.py)
    combine_splits_(out, lse_buf.transpose(1, 2), o_acc, l_acc, num_splits, attn_sink=attn_sink,
                    lengths=topk_length, topk=topk, extra_lengths=extra_topk_length if has_x else None,
                    extra_topk=xtopk if has_x else None, rne=interp, _spec=plan_spec)


def _page_shift(page: int) -> int:
    """log2(page) for power-of-two page sizes up to 2^12 (shift/mask addressing), else -1 (runtime division)."""
    return page.bit_length() - 1 if page & (page - 1) == 0 and page <= 4096 else -1


def _fwd_grid(parts: int, s_q: int, h_q: int, block_h: int) -> tuple:
    """Split-KV grid: (part, s_q position, head block) flattened on axis 0 (no 65,535 limit; B08/B09)."""
    return (parts * s_q * -(-h_q // block_h),)


_T = torch.Tensor
_PLANS: dict = {}
_PLAN_LIMIT = 1024


class _CallPlan:
    """One validated call signature of the sparse path (see :func:`_call_sig`); hashed by identity (launch key)."""

    __slots__ = ("cfg", "fmt", "xfmt", "config", "dev", "empty", "kernels")


def _tsig(t) -> tuple:
    if t is None:
        return None
    if type(t) is not _T:
        raise TypeError   # unusual argument type: no signature (the full path runs and reports it)
    return (t.dtype, t.shape, t.stride(), t.device, t.data_ptr() & 15)


def _call_sig(q, k_cache, indices, head_dim_v, is_fp8_kvcache, attn_sink, extra_k_cache, extra_indices,
              topk_length, extra_topk_length, causal, config):
    """Hashable signature of a sparse call: dtype/shape/strides/device/16-B alignment of every tensor (None for an
    absent optional one), head_dim_v, the truth of is_fp8_kvcache and causal, the config override, the interpreter
    flag and DEEPKERNELS_FORCE_REFERENCE (both decide the backend). Every argument check of the sparse path except
    softmax_scale and the metadata state is a function of it, so a signature that passed once passes again; it also
    fixes every specialisation fact of the split-KV launch except sched/num_splits/acc_rows. None for unusual
    argument types (full path every time)."""
    try:
        if type(q) is not _T or type(k_cache) is not _T or type(indices) is not _T or type(head_dim_v) is not int:
            return None
        sig = (_tsig(q), _tsig(k_cache), _tsig(indices), _tsig(attn_sink), _tsig(extra_k_cache),
               _tsig(extra_indices), _tsig(topk_length), _tsig(extra_topk_length), head_dim_v,
               bool(is_fp8_kvcache), bool(causal), config, interpret_mode(),
               os.environ.get("DEEPKERNELS_FORCE_REFERENCE", "0") not in ("", "0"))
        hash(sig)
        return sig
    except Exception:
        return None


def _validate_call(q, k_cache, indices, head_dim_v, softmax_scale, is_fp8_kvcache, attn_sink, extra_k_cache,
                   extra_indices_in_kvcache, topk_length, extra_topk_length, causal, config, sig) -> _CallPlan:
    """Every argument check of the sparse path, in the order the errors are reported (softmax_scale between the
    tensor checks and the device check, as it always was); caches the plan under ``sig`` (when not None)."""
    if not is_fp8_kvcache:
        raise ValueError("is_fp8_kvcache must be True when indices is given (sparse decode runs on FP8/FP4 caches)")
    if causal:
        raise ValueError("causal must be False when indices is given (sparse decode)")
    check_tensor("q", q, ndim=4, dtype=torch.bfloat16)
    check_tensor("k_cache", k_cache, ndim=4, dtype=_CACHE_DTYPES)
    if extra_k_cache is not None:
        check_tensor("extra_k_cache", extra_k_cache, ndim=4, dtype=_CACHE_DTYPES)
    fmt, xfmt = detect_sparse_formats(k_cache, extra_k_cache)
    f = KV_FORMATS[fmt]
    b, s_q, h_q, d_qk = q.shape
    if d_qk != f.d_qk:
        raise ValueError(f"q: d_qk must be {f.d_qk} for a {k_cache.shape[-1]}-byte ({fmt}) cache, got q shape "
                         f"{list(q.shape)}")
    if head_dim_v != 512:
        raise ValueError(f"head_dim_v must be 512, got {head_dim_v}")
    if h_q not in SPARSE_DECODE_CONFIGS:
        raise ValueError(f"q: h_q must be one of {sorted(SPARSE_DECODE_CONFIGS)}, got shape {list(q.shape)}")
    _check_cache("k_cache", k_cache, fmt)
    _check_indices("indices", indices, b, s_q)
    if (extra_k_cache is None) != (extra_indices_in_kvcache is None):
        raise ValueError("extra_indices_in_kvcache is required with extra_k_cache and forbidden without it")
    if extra_k_cache is None and extra_topk_length is not None:
        raise ValueError("extra_topk_length is only allowed with extra_k_cache")
    if extra_k_cache is not None:
        _check_cache("extra_k_cache", extra_k_cache, xfmt)
        _check_indices("extra_indices_in_kvcache", extra_indices_in_kvcache, b, s_q)
    _check_len("topk_length", topk_length, b)
    _check_len("extra_topk_length", extra_topk_length, b)
    if attn_sink is not None:
        check_tensor("attn_sink", attn_sink, ndim=1, dtype=torch.float32)
        if attn_sink.shape[0] != h_q:
            raise ValueError(f"attn_sink must have shape [h_q={h_q}], got {list(attn_sink.shape)}")
    _scale(softmax_scale, d_qk)
    plan = _CallPlan()
    plan.dev = device_of(q, k_cache, indices, attn_sink, extra_k_cache, extra_indices_in_kvcache, topk_length,
                         extra_topk_length)
    plan.fmt, plan.xfmt = fmt, xfmt
    plan.cfg = FlashMLASchedMeta.Config(
        b=b, s_q=s_q, h_q=h_q, page_block_size=k_cache.shape[1], h_k=1, causal=False, is_fp8_kvcache=True,
        topk=indices.shape[2], extra_page_block_size=None if extra_k_cache is None else extra_k_cache.shape[1],
        extra_topk=extra_indices_in_kvcache.shape[2] if extra_k_cache is not None else None)
    plan.config = config or sparse_decode_config(h_q, fmt)
    plan.empty = b == 0 or s_q == 0
    plan.kernels = use_kernels(q, k_cache, indices)
    if sig is not None:
        if len(_PLANS) >= _PLAN_LIMIT:
            _PLANS.clear()
        _PLANS[sig] = plan
    return plan


def _scale(softmax_scale, d_qk: int) -> float:
    scale = d_qk ** -0.5 if softmax_scale is None else float(softmax_scale)
    if not math.isfinite(scale):
        raise ValueError(f"softmax_scale must be finite, got {softmax_scale}")
    return scale


def _sparse_decode_forward(q, k_cache, indices, head_dim_v, tile_scheduler_metadata, num_splits=None,
                           softmax_scale=None, is_fp8_kvcache=False, attn_sink=None, extra_k_cache=None,
                           extra_indices_in_kvcache=None, topk_length=None, extra_topk_length=None, causal=False,
                           config=None):
    """Sparse path of ``flash_mla_with_kvcache`` (FlashMLA sparse decode; called by ``deepkernels.mla.decode``).

    Args:
        q: ``[b, s_q, h_q, d_qk]`` bf16, ``h_q`` in {16, 32, 64, 128}; d_qk 576 (V3.2) or 512 (MODEL1, V4.1).
            Any strides (a non-unit last-dim stride is copied).
        k_cache: ``[num_blocks, page_block_size, 1, bytes_per_token]`` float8_e4m3fn/int8/uint8 byte container;
            the format comes from bytes_per_token: 656 V3.2, 584 MODEL1, 528 V4.1 (288 FP4 is extra-only).
            ``stride(1) == bytes_per_token``; any ``stride(0)`` covering a block (16-byte aligned on the GPU); any
            page_block_size.
        indices: ``[b, s_q, topk]`` int32, ``page_block * page_block_size + offset``; -1, any negative value and
            any value ``>= num_blocks * page_block_size`` are invalid (never read). Any ``topk >= 0``.
        head_dim_v: must be 512.
        tile_scheduler_metadata: ``FlashMLASchedMeta`` from ``get_mla_metadata()`` (filled on first use; reuse with
            another configuration raises ValueError; reuse after topk_length / extra_topk_length changed is correct:
            splits are clamped to the actual token line and each request's last split runs to its end) or the
            legacy tensors (re-planned here). Anything else (None included) is a TypeError naming it, as on the dense
            path; empty work (b or s_q == 0) checks it the same way (a fresh one stays unfilled), as there.
        num_splits: None (or the legacy ``[b + 1]`` tensor, ignored).
        softmax_scale: default ``d_qk ** -0.5``; any finite value (<= 0 exact: the kernels run ``|scale|`` on
            ``-q``, or scale 1 on ``q * 0``). is_fp8_kvcache: must be True. causal: must be False.
        attn_sink: ``[h_q]`` fp32; out *= exp(lse) / (exp(lse) + exp(sink)); lse unchanged.
        extra_k_cache / extra_indices_in_kvcache: a second cache (same format, or FP4 next to V4.1) and its
            ``[b, s_q, extra_topk]`` int32 indices, in the same softmax.
        topk_length / extra_topk_length: ``[b]`` int32, leading entries used per request (clamped to [0, topk]).
    Returns:
        ``out [b, s_q, h_q, 512]`` bf16 and ``lse [b, h_q, s_q]`` fp32 natural log, the transposed view of a
        contiguous ``[b, s_q, h_q]``. No valid token: out 0, lse +inf.
    Raises:
        TypeError / ValueError naming the argument for bad types, shapes, strides, formats or flags (the checks a
        call's signature decides run once per signature, in the same order; softmax_scale and the metadata
        argument are checked on every call).
    """
    sig = _call_sig(q, k_cache, indices, head_dim_v, is_fp8_kvcache, attn_sink, extra_k_cache,
                    extra_indices_in_kvcache, topk_length, extra_topk_length, causal, config)
    plan = None if sig is None else _PLANS.get(sig)
    if plan is None:
        plan = _validate_call(q, k_cache, indices, head_dim_v, softmax_scale, is_fp8_kvcache, attn_sink,
                              extra_k_cache, extra_indices_in_kvcache, topk_length, extra_topk_length, causal,
                              config, sig)
    cfg, dev = plan.cfg, plan.dev
    b, s_q, h_q = cfg.b, cfg.s_q, cfg.h_q
    scale = _scale(softmax_scale, q.shape[3])
    # the copies the kernels need (none for the usual layouts; which ones is fixed by the signature)
    if q.stride(-1) != 1:
        q = q.contiguous()
    if indices.shape[2] > 1 and indices.stride(2) != 1:
        indices = indices.contiguous()
    has_x = extra_k_cache is not None
    if has_x and extra_indices_in_kvcache.shape[2] > 1 and extra_indices_in_kvcache.stride(2) != 1:
        extra_indices_in_kvcache = extra_indices_in_kvcache.contiguous()
    if topk_length is not None:
        topk_length = topk_length.contiguous()
    if extra_topk_length is not None:
        extra_topk_length = extra_topk_length.contiguous()
    if attn_sink is not None:
        attn_sink = attn_sink.contiguous()
    if plan.empty:   # the metadata is checked as for a call with work (a fresh one stays fresh); nothing launched
        _check_metadata_empty(tile_scheduler_metadata, num_splits, cfg,
                              lambda m: (m, num_splits) if isinstance(m, torch.Tensor) else None, dev)
        return (torch.zeros(b, s_q, h_q, 512, dtype=q.dtype, device=dev),
                torch.full((b, s_q, h_q), float("inf"), device=dev).transpose(1, 2))
    # sm90 Gluon kernels, unless a Triton config is forced (DEEPKERNELS_DISABLE_GLUON=sparse_decode keeps Triton):
    # 1. the warp-specialised kernel (producer warps gather + dequantise) for its formats without an extra cache
    #    (_gsdw.DISPATCH_FMTS: V3.2 and V4.1; bit-identical to the single-partition kernel, 1.20-1.30x it for V3.2 and
    #    1.17-1.44x for V4.1 on the H200, results/mla_sparse_decode_ws-h200-2026-11-29*.json); with an extra cache
    #    while _gsdw.DISPATCH_EXTRA is set (since session 15: bit-identical, 1.17-1.33x the previous kernels);
    # 2. the single-partition kernel for the formats where it measured faster than Triton (_gsd.DISPATCH_FMTS: V3.2,
    #    i.e. V3.2 with an extra cache); 3. everything else: the Triton kernel
    launch, below_ws3 = _launch_sparse_decode, None
    if config is None:
        if (_gsdw.DISPATCH and plan.fmt in _gsdw.DISPATCH_FMTS and (not has_x or _gsdw.DISPATCH_EXTRA)
                and _gsdw.supported_ws(q, k_cache, plan.fmt, extra_k_cache)):
            launch = _gsdw.launch_sparse_decode_gluon_ws
            # the split-consumer WS kernel in its place (no extra cache) for _gsdw2.DISPATCH_FMTS (V4.1: 1.04-1.05x)
            # (supported_ws2 is the WS gate just passed, without an extra cache: not asked again)
            if not has_x and _gsdw2.dispatch_on(plan.fmt):
                launch = _gsdw2.launch_sparse_decode_gluon_ws2
            # the 2-CTA cluster kernel (WS2's consumers, each CTA's producer gathers half the NoPE columns and pushes
            # them to its peer) for h_q a multiple of 128: without an extra cache for _gsdw3.DISPATCH_FMTS (V3.2 and
            # V4.1, 1.12-1.25x WS / WS2 with >= 31 blocks per CTA, bit-identical to WS2), with one for
            # _gsdw3.DISPATCH_EXTRA_PAIRS (all three WS pairs, 1.26-1.49x WS), when the schedule gives each CTA enough
            # blocks (_gsdw3.enough_work, checked below once the schedule is known)
            xf = plan.xfmt if has_x else None
            if _gsdw3.dispatch_on(plan.fmt, xf) and _gsdw3.extends_ws(q, plan.fmt, xf):
                launch, below_ws3 = _gsdw3.launch_sparse_decode_gluon_ws3, launch
        elif plan.fmt in _gsd.DISPATCH_FMTS and _gsd.supported(q, k_cache, plan.fmt, extra_k_cache):
            launch = _gsd.launch_sparse_decode_gluon
    config, batch_invariant = plan.config, _BATCH_INVARIANT
    topk, xtopk = cfg.topk, cfg.extra_topk

    def replan(greedy_ok=True):
        counts = _token_counts(b, topk, topk_length, xtopk, extra_topk_length, has_x, dev)
        parts = _num_sm_parts(dev, s_q, h_q, config)
        return compute_schedule(counts, parts, FIXED_OVERHEAD_BLOCKS,
                                algorithm="greedy" if greedy_ok and _use_greedy(b, parts) else "linear")

    def legacy(meta):
        # legacy call form (tensors from the old get_mla_metadata, planned without the extra cache): re-planned, so
        # that a plan made for other lengths can never drop tokens. Anything else (None included: FlashMLA requires
        # the metadata on both paths) is the dense path's TypeError, raised by resolve_schedule before any launch.
        # Re-planned on every call here, so the cheaper linear schedule (the greedy one costs 3-23 us more to plan)
        if isinstance(meta, torch.Tensor):
            return _trivial_schedule(b, dev) if batch_invariant else replan(greedy_ok=False)
        return None

    sched, ns = resolve_schedule(tile_scheduler_metadata, num_splits, cfg, replan, legacy, FlashMLASchedMeta, dev)
    if batch_invariant and isinstance(tile_scheduler_metadata, FlashMLASchedMeta):
        sched, ns = _trivial_schedule(b, dev)
    if below_ws3 is not None and not _gsdw3.enough_work(b, topk, sched.shape[0], xtopk if has_x else 0):
        launch = below_ws3
    if not plan.kernels:
        return sparse_decode_ref(q, k_cache, indices, 512, scale, attn_sink, extra_k_cache,
                                 extra_indices_in_kvcache, topk_length, extra_topk_length)
    q, scale, exact = rewrite_nonpositive_scale(q, scale)   # scale <= 0: exact rewrite (kernel max in raw-score units)
    out = torch.empty(b, s_q, h_q, 512, dtype=q.dtype, device=dev)
    lse_buf = torch.empty(b, s_q, h_q, dtype=torch.float32, device=dev)
    launch(out, lse_buf, q, k_cache, indices, sched, ns, scale, plan.fmt, attn_sink, extra_k_cache,
           extra_indices_in_kvcache, plan.xfmt, topk_length, extra_topk_length, config,
           plan if sig is not None and exact else None)
    return out, lse_buf.transpose(1, 2)
