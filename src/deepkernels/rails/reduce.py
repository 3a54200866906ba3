"""Masking and reducing the rails' partial scores: P = P_0 + P_1 with invalid tokens at -inf.

Three orders of "mask" and "reduce", and what each does with a NaN (or +inf) in a masked K row:

* :func:`mask_then_reduce` with every rail masked (select-style ``where``): the masked token's partials are
  all replaced by -inf before the add, so whatever the K row held, the score is -inf. Safe.
* :func:`retrieve_mask_and_reduce_p` — FlashMLA's SM100 routine, modelled warp by warp: each thread masks
  only the half of the tokens it keeps (its own rail) and adds its peer rail's partial unmasked. -inf + x is
  -inf for finite x, so one masked half suffices, except when the peer's partial is NaN or +inf: then
  -inf + NaN = NaN and -inf + inf = NaN leak into P. This is the caveat of docs/spec/mla.md §1.3 (a NaN in a K
  row that is valid in [0, s_kv) but past ``topk_length`` can make the output NaN on SM100).
* :func:`reduce_then_mask` — reduce first, then mask. With ``how="additive"`` (add a -inf bias) the NaN of
  the sum survives (NaN + -inf = NaN): it leaks. With ``how="select"`` (``where``) it is replaced: safe.

The semantics deepkernels wants (docs/spec/mla.md §9.2: select-style masking, NaN never multiplied in) is
:func:`masked_scores_reference`.

Sources: docs/spec/mla.md §1.3, §8.3, §9.2; seed article §2.3; FlashMLA ``common_subroutine.h``
``retrieve_mask_and_reduce_p``.
"""
from __future__ import annotations

from typing import Iterable

import torch

from .._validate import check_shape, check_tensor
from .tmem import LANES_PER_WARP, TensorMemory

__all__ = ["masked_scores_reference", "mask_then_reduce", "reduce_then_mask", "retrieve_mask_and_reduce_p"]

_NEG_INF = float("-inf")


def _check_valid(valid: torch.Tensor, t: int) -> torch.Tensor:
    check_tensor("valid", valid, ndim=1, dtype=torch.bool)
    check_shape("valid", valid, [t])
    return valid


def masked_scores_reference(q: torch.Tensor, kv: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The intended masked scores, float64 [M, T]: q·kᵀ for valid tokens, -inf for the others.

    q: [M, d]; kv: [T, d] (any float dtype; masked rows may hold NaN/inf); valid: bool [T]. Masked rows are
    zeroed before the product, so nothing they hold can reach a valid score, and their scores are set with
    ``where``. Raises ValueError/TypeError naming the argument.
    """
    check_tensor("q", q, ndim=2)
    check_tensor("kv", kv, ndim=2)
    _check_valid(valid, kv.shape[0])
    kv_safe = torch.where(valid[:, None], kv.to(torch.float64), 0.0)
    s = q.to(torch.float64) @ kv_safe.T
    return torch.where(valid, s, _NEG_INF)


def _check_partials(partials: torch.Tensor, valid: torch.Tensor) -> None:
    check_tensor("partials", partials, ndim=3)
    if not partials.is_floating_point():
        raise TypeError(f"partials must be a floating-point tensor [rails, M, T], got {partials.dtype}")
    _check_valid(valid, partials.shape[2])


def mask_then_reduce(partials: torch.Tensor, valid: torch.Tensor, *,
                     masked_rails: Iterable[int] | None = None) -> torch.Tensor:
    """Mask before reduce: set each listed rail's partial to -inf at invalid tokens (``where``), then sum.

    partials: [rails, M, T] float (one partial P per rail, as :func:`~deepkernels.rails.multirail.rail_partials`
    returns); valid: bool [T]; masked_rails: which rails to mask (default: all, which is NaN-safe; a single
    rail reproduces the "one half suffices" shortcut and its NaN leak). Returns [M, T] in partials' dtype;
    the sum runs rail 0 + rail 1 + … in that dtype. Raises ValueError naming the argument.
    """
    _check_partials(partials, valid)
    rails = partials.shape[0]
    masked = set(range(rails) if masked_rails is None else masked_rails)
    for r in masked:
        if r not in range(rails):
            raise ValueError(f"masked_rails: rail {r} outside 0..{rails - 1}")
    out = None
    for r in range(rails):
        p = torch.where(valid, partials[r], _NEG_INF) if r in masked else partials[r]
        out = p.clone() if out is None else out + p
    return out


def reduce_then_mask(partials: torch.Tensor, valid: torch.Tensor, *, how: str = "select") -> torch.Tensor:
    """Reduce first (sum the rails), then mask invalid tokens.

    how="select": ``where(valid, sum, -inf)`` (NaN-safe); how="additive": ``sum + bias`` with bias = 0 or
    -inf (a NaN in a masked row survives: NaN + -inf = NaN). partials: [rails, M, T] float; valid: bool [T].
    Returns [M, T] in partials' dtype. Raises ValueError naming ``how`` for another value.
    """
    _check_partials(partials, valid)
    s = partials.sum(0)
    if how == "select":
        return torch.where(valid, s, _NEG_INF)
    if how == "additive":
        return s + torch.where(valid, 0.0, _NEG_INF).to(s.dtype)
    raise ValueError(f"how must be 'select' or 'additive', got {how!r}")


def retrieve_mask_and_reduce_p(tmem: TensorMemory, *, p_tmem_col: int, valid: torch.Tensor,
                               b_topk: int = 64) -> torch.Tensor:
    """FlashMLA's ``retrieve_mask_and_reduce_p`` for the head64, 2-rail QK (M = 64, N = 2·b_topk), step by step.

    TMEM holds the two rails' partial P (fp32): lanes 0–63 rail 0, lanes 64–127 rail 1 (heads 0–63 each),
    columns p_tmem_col … p_tmem_col + b_topk - 1 (one column per token). The 128-thread softmax warpgroup
    runs it; warp w reads only its own lanes 32w … 32w+31 (enforced), n = b_topk/2:

    1. warps 0–1 (rail 0) keep tokens [0, n) as ``p`` and set aside [n, 2n) as ``p_peer``; warps 2–3 (rail 1)
       keep [n, 2n) and set aside [0, n);
    2. mask before reduce: ``p = -inf`` where the token is invalid (own half only);
    3. each warp writes ``p_peer`` into the exchange slot of warp w^2, and (after the pair barrier) adds
       what it received to its ``p`` in fp32.

    Result (returned as one [64, b_topk] float32 tensor): warp 0 = heads 0–31 × tokens [0, n), warp 2 =
    heads 0–31 × [n, 2n), warp 1 = heads 32–63 × [0, n), warp 3 = heads 32–63 × [n, 2n). A NaN/+inf in the
    peer half of an invalid token leaks (docs/spec/mla.md §1.3). valid: bool [b_topk]; b_topk even, 2·b_topk a
    legal N (64 → N = 128). Raises ValueError naming the argument.
    """
    if b_topk < 2 or b_topk % 2:
        raise ValueError(f"b_topk must be a positive even number of tokens, got {b_topk}")
    _check_valid(valid, b_topk)
    n = b_topk // 2
    exchange = torch.empty((4, LANES_PER_WARP, n), dtype=torch.float32)     # p_exchange_buf[4][32·N]
    kept = {}
    for w in range(4):
        vals = tmem.load(LANES_PER_WARP * w, LANES_PER_WARP, p_tmem_col, b_topk, torch.float32, warp=w)
        rail = w // 2
        own = slice(0, n) if rail == 0 else slice(n, 2 * n)
        peer = slice(n, 2 * n) if rail == 0 else slice(0, n)
        kept[w] = (own, torch.where(valid[own], vals[:, own], _NEG_INF))      # mask before reduce
        exchange[w ^ 2] = vals[:, peer]
    out = torch.empty((64, b_topk), dtype=torch.float32)
    for w, (own, p) in kept.items():                                          # after the 64-thread barrier
        heads = slice(LANES_PER_WARP * (w % 2), LANES_PER_WARP * (w % 2 + 1))
        out[heads, own] = p + exchange[w]
    return out

