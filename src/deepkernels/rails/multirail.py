"""Two ways to fill ``tcgen05.mma.ws`` for the decode QKᵀ (P = Q·Kᵀ), and the wrong one in between.

The hardware formula is fixed (lane group g: D_g = A_g × B_g, see :mod:`deepkernels.rails.mma_ws`); the
fillings differ only in what is written into A_g and B (seed article §2.4 table, docs/spec/mla.md §8.1):

=========================  ===========================================  ===========================================
                           official (CuTe, FOLD_DEGREE = 1)             multi-rail (FlashMLA MRGEMM, R rails)
=========================  ===========================================  ===========================================
A_g                        the same full Q [M, D] in every lane group   Q restricted to rail r's features [M, D/R]
B                          K [T, D]; N = T, group g gets T/G tokens     K re-viewed as [R·T, D/R], rows r·T+t =
                                                                        token t restricted to rail r's features
shape                      M × T × D                                    M × R·T × D/R
D_g                        scores of tokens g·T/G …                     partial scores of rail r (over its tokens)
P                          concatenate [D_0 | D_1 | …]                  add the rails: P = Σ_r D_(rail r)
=========================  ===========================================  ===========================================

Rails: D is cut into ``block``-wide feature blocks (64 in FlashMLA); rail r takes blocks r, r+R, r+2R, …
(for R = 2 the even and the odd blocks). With G = 128/M lane groups and R | G, rail r's A sits on the G/R
groups r·G/R … (r+1)·G/R - 1 (``tmem_frg_elastic`` with FOLD_DEGREE = R: element (m, k, r) at lane
m + r·128/R, replicated G/R times), and B's N-slices line up with those groups.

The "wrong" filling splits Q into rails but leaves B as rail 0's features for every group (the B descriptor
is not re-pointed per rail), so group g of rail r computes the cross term Q_{R_r}·K_{R_0}ᵀ (seed §2.5).

Sources: shared/seeds/multi-rail-gemm.zh.txt §2; docs/spec/mla.md §8.1–8.2; FlashMLA sm100 head64 ``config.h``
(``QK_MRGEMM_N = (128/64)·B_TOPK``, ``QK_MRGEMM_K = D_V/(128/64)``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .._validate import check_dtype, check_tensor
from .mma_ws import WS_M, WS_N, WsInstr, load_d_groups, mma_ws_gemm, store_a_groups
from .tmem import TMEM_LANES, TensorMemory, columns_for

__all__ = [
    "RAIL_BLOCK", "rail_feature_index", "split_rails", "merge_rails", "rail_view_kv", "kv_smem_tiles",
    "official_operands", "multirail_operands", "wrong_multirail_operands", "ws_formula",
    "combine_official", "rail_partials", "combine_multirail", "QKOnWs", "qk_official_ws", "qk_multirail_ws",
]

RAIL_BLOCK = 64      # FlashMLA's rail granularity: 64 features (128 bytes of bf16, one SW128 atom column)


# --------------------------------------------------------------------------------------------------------
# feature bookkeeping
# --------------------------------------------------------------------------------------------------------
def rail_feature_index(d: int, rails: int, block: int = RAIL_BLOCK) -> torch.Tensor:
    """Feature indices of every rail: int64 [rails, d/rails]; row r lists blocks r, r+rails, … in order.

    ``d`` features are cut into ``block``-wide blocks; requires d % (rails·block) == 0 (ValueError naming
    ``d``), rails >= 1 and block >= 1. Example: d=512, rails=2 → rail 0 = features 0–63, 128–191, …
    """
    if rails < 1:
        raise ValueError(f"rails must be >= 1, got {rails}")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if d < 1 or d % (rails * block):
        raise ValueError(f"d must be a positive multiple of rails·block = {rails}·{block} = {rails * block}, got {d}")
    blocks = torch.arange(d // block).view(-1, rails).T            # [rails, d/(rails·block)] block ids
    return (blocks[..., None] * block + torch.arange(block)).reshape(rails, d // rails)


def split_rails(x: torch.Tensor, rails: int, block: int = RAIL_BLOCK) -> torch.Tensor:
    """Split the last (feature) dim of ``x`` [..., d] into rails: returns [rails, ..., d/rails] (a copy)."""
    idx = rail_feature_index(x.shape[-1], rails, block)
    return torch.stack([x[..., idx[r]] for r in range(rails)])


def merge_rails(x_rails: torch.Tensor, block: int = RAIL_BLOCK) -> torch.Tensor:
    """Inverse of :func:`split_rails`: [rails, ..., d/rails] → [..., d]."""
    rails, d = x_rails.shape[0], x_rails.shape[0] * x_rails.shape[-1]
    idx = rail_feature_index(d, rails, block)
    out = x_rails.new_empty((*x_rails.shape[1:-1], d))
    for r in range(rails):
        out[..., idx[r]] = x_rails[r]
    return out


def rail_view_kv(kv: torch.Tensor, rails: int, block: int = RAIL_BLOCK) -> torch.Tensor:
    """B of the multi-rail QK GEMM: ``kv`` [T, d] re-viewed as [rails·T, d/rails], row r·T + t = token t
    restricted to rail r's features. On the GPU this is a different shared-memory descriptor over the same
    K-major tile (see :func:`kv_smem_tiles`); here it is materialised."""
    check_tensor("kv", kv, ndim=2)
    return split_rails(kv, rails, block).reshape(rails * kv.shape[0], kv.shape[1] // rails)


def kv_smem_tiles(kv: torch.Tensor, block: int = RAIL_BLOCK) -> torch.Tensor:
    """The order a K-major shared-memory tile keeps ``kv`` [T, d] in: [d/block, T, block] — the feature
    blocks ("atom columns", 128 B each for bf16 at block 64) one after another, T rows each. The 128-byte
    swizzle inside each 8-row × 128 B atom is not modelled: it permutes bytes within an atom and does not
    change which atom holds what. Flattened to [d/block·T, block], rail-view row r·T + t of K block i is
    row (i·rails + r)·T + t: the B of K block i is a contiguous run of rails·T rows, i.e. a plain view."""
    check_tensor("kv", kv, ndim=2)
    t, d = kv.shape
    if d % block:
        raise ValueError(f"kv: d = {d} must be a multiple of block = {block}")
    return kv.reshape(t, d // block, block).permute(1, 0, 2).contiguous()


# --------------------------------------------------------------------------------------------------------
# operand fillings and the hardware formula (any sizes; no TMEM)
# --------------------------------------------------------------------------------------------------------
def _check_qkv(q: torch.Tensor, kv: torch.Tensor) -> None:
    check_tensor("q", q, ndim=2)
    check_tensor("kv", kv, ndim=2)
    if kv.shape[1] != q.shape[1]:
        raise ValueError(f"kv must have shape [T, {q.shape[1]}] (d of q), got {list(kv.shape)}")
    if kv.dtype != q.dtype:
        raise TypeError(f"kv must have the dtype of q ({q.dtype}), got {kv.dtype}")


def _check_groups(lane_groups: int, rails: int) -> None:
    if lane_groups < 1:
        raise ValueError(f"lane_groups must be >= 1, got {lane_groups}")
    if rails < 1 or lane_groups % rails:
        raise ValueError(f"rails must divide lane_groups = {lane_groups} (NUM_MRGEMM_RAILS | FOLD_FACTOR), got {rails}")


def official_operands(q: torch.Tensor, kv: torch.Tensor, lane_groups: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Official .ws filling: returns (A per lane group = ``q`` [M, d] in every group, B = ``kv`` [T, d]).
    N = T; lane group g gets tokens g·T/G …; requires T % lane_groups == 0 (ValueError naming ``kv``)."""
    _check_qkv(q, kv)
    _check_groups(lane_groups, 1)
    if kv.shape[0] % lane_groups:
        raise ValueError(f"kv: T = {kv.shape[0]} tokens must split evenly over {lane_groups} lane groups")
    return [q] * lane_groups, kv


def multirail_operands(q: torch.Tensor, kv: torch.Tensor, lane_groups: int, rails: int,
                       block: int = RAIL_BLOCK) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Multi-rail filling: A_g = rail (g // (G/R)) of ``q`` [M, d/R]; B = :func:`rail_view_kv` [R·T, d/R].

    Requires rails | lane_groups, d % (rails·block) == 0 and T % (G/R) == 0 (ValueError naming the argument).
    """
    _check_qkv(q, kv)
    _check_groups(lane_groups, rails)
    per_rail = lane_groups // rails
    if kv.shape[0] % per_rail:
        raise ValueError(f"kv: T = {kv.shape[0]} tokens must split evenly over the {per_rail} lane groups of a rail")
    q_rails = split_rails(q, rails, block)
    return [q_rails[g // per_rail] for g in range(lane_groups)], rail_view_kv(kv, rails, block)


def wrong_multirail_operands(q: torch.Tensor, kv: torch.Tensor, lane_groups: int, rails: int,
                             block: int = RAIL_BLOCK) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The broken variant: A split into rails as in :func:`multirail_operands`, but B = rail 0's features of
    ``kv`` for every rail ([K_{R0}; K_{R0}; …], the B descriptor not re-pointed per rail). Rail r's groups
    then compute Q_{R_r}·K_{R_0}ᵀ, a cross term, and the sum is not Q·Kᵀ (seed §2.5)."""
    a_groups, _ = multirail_operands(q, kv, lane_groups, rails, block)
    k_rail0 = split_rails(kv, rails, block)[0]
    return a_groups, torch.cat([k_rail0] * rails)


def ws_formula(a_groups: Sequence[torch.Tensor], b: torch.Tensor) -> list[torch.Tensor]:
    """What ``.ws`` computes, without TMEM: D_g = A_g × B_gᵀ in float64 with B_g = rows g·N/G … of ``b``
    [N, K]. ``a_groups`` holds G tensors [M, K]. Raises ValueError if N % G != 0 or K differs."""
    g_count = len(a_groups)
    check_tensor("b", b, ndim=2)
    if g_count < 1 or b.shape[0] % g_count:
        raise ValueError(f"b: N = {b.shape[0]} must split evenly over {g_count} lane groups")
    ng = b.shape[0] // g_count
    out = []
    for g, a in enumerate(a_groups):
        check_tensor(f"a_groups[{g}]", a, ndim=2)
        if a.shape[1] != b.shape[1]:
            raise ValueError(f"a_groups[{g}] must have K = {b.shape[1]} columns (b's K), got {list(a.shape)}")
        out.append(a.to(torch.float64) @ b[g * ng:(g + 1) * ng].to(torch.float64).T)
    return out


def combine_official(d_groups: Sequence[torch.Tensor]) -> torch.Tensor:
    """Official filling: P = [D_0 | D_1 | …] (concatenate along tokens)."""
    return torch.cat(list(d_groups), dim=-1)


def rail_partials(d_groups: Sequence[torch.Tensor], rails: int) -> torch.Tensor:
    """Multi-rail: the partial P of every rail over all tokens, [rails, M, T]; rail r's partial is the
    concatenation of D_g for its G/R groups g = r·G/R + j (token chunk j)."""
    _check_groups(len(d_groups), rails)
    per_rail = len(d_groups) // rails
    return torch.stack([torch.cat(list(d_groups[r * per_rail:(r + 1) * per_rail]), dim=-1) for r in range(rails)])


def combine_multirail(d_groups: Sequence[torch.Tensor], rails: int) -> torch.Tensor:
    """Multi-rail: P = Σ_r (rail r's partial), no masking (see :mod:`deepkernels.rails.reduce` for the
    masked reduce). rails = 1 gives :func:`combine_official`."""
    return rail_partials(d_groups, rails).sum(0)


# --------------------------------------------------------------------------------------------------------
# the same on the TMEM + instruction model
# --------------------------------------------------------------------------------------------------------
@dataclass
class QKOnWs:
    """Result of running a QK filling on the instruction model.

    p: [M, T] float32, the combined P. d_groups: the D_g [M, N/G] float32 read back per lane group.
    instr: the :class:`WsInstr` (M, N); instructions: how many K=16 instructions were issued.
    filling: "official", "multi-rail" or "multi-rail (B not rearranged)". tmem: the TMEM afterwards.
    q_tmem_col / p_tmem_col: first columns of Q (A) and P (D).
    """
    p: torch.Tensor
    d_groups: list
    instr: WsInstr
    instructions: int
    filling: str
    rails: int
    tmem: TensorMemory
    q_tmem_col: int
    p_tmem_col: int

    @property
    def q_columns(self) -> int:
        """TMEM columns Q occupies in each lane group."""
        return self.instr.a_columns * self.instructions

    @property
    def p_columns(self) -> int:
        """TMEM columns one P (D) occupies in each lane group: N/G."""
        return self.instr.d_columns


def _lane_groups_of(q: torch.Tensor) -> int:
    check_tensor("q", q, ndim=2)
    check_dtype("q", q, (torch.bfloat16, torch.float16))
    if q.shape[0] not in WS_M:
        raise ValueError(f"q must have M = heads ∈ {WS_M} rows for tcgen05.mma.ws, got shape {list(q.shape)}")
    return TMEM_LANES // q.shape[0]


def _run(q, kv, a_groups, b, *, filling, rails, tmem, q_tmem_col, p_tmem_col) -> QKOnWs:
    m = q.shape[0]
    if b.shape[0] not in WS_N:
        raise ValueError(f"kv: T = {kv.shape[0]} tokens give N = {b.shape[0]} for the {filling} filling; "
                         f"tcgen05.mma.ws needs N ∈ {WS_N}")
    instr = WsInstr(m=m, n=b.shape[0], a_dtype=q.dtype)
    tmem = TensorMemory() if tmem is None else tmem
    q_cols = columns_for(b.shape[1], q.dtype)
    p_tmem_col = q_tmem_col + q_cols if p_tmem_col is None else p_tmem_col
    store_a_groups(tmem, instr, [a.contiguous() for a in a_groups], q_tmem_col)
    steps = mma_ws_gemm(tmem, instr, a_tmem_col=q_tmem_col, b=b.contiguous(), d_tmem_col=p_tmem_col)
    d_groups = load_d_groups(tmem, instr, p_tmem_col)
    p = combine_official(d_groups) if rails == 1 else combine_multirail(d_groups, rails)
    return QKOnWs(p, d_groups, instr, steps, filling, rails, tmem, q_tmem_col, p_tmem_col)


def qk_official_ws(q: torch.Tensor, kv: torch.Tensor, *, tmem: TensorMemory | None = None, q_tmem_col: int = 0,
                   p_tmem_col: int | None = None) -> QKOnWs:
    """P = Q·Kᵀ on the instruction model with the official filling (Q copied into every lane group).

    q: [M, d] bf16/f16, M = heads ∈ {32, 64, 128}; kv: [T, d] same dtype, T ∈ {64, 128, 256} (N = T), d a
    multiple of 16. Q takes d/2 columns per lane group from ``q_tmem_col``; P (fp32) N/G columns from
    ``p_tmem_col`` (default: right after Q). Raises ValueError/TypeError naming the argument.
    """
    a_groups, b = official_operands(q, kv, _lane_groups_of(q))
    return _run(q, kv, a_groups, b, filling="official", rails=1, tmem=tmem, q_tmem_col=q_tmem_col,
                p_tmem_col=p_tmem_col)


def qk_multirail_ws(q: torch.Tensor, kv: torch.Tensor, *, rails: int = 2, block: int = RAIL_BLOCK,
                    rearrange_b: bool = True, tmem: TensorMemory | None = None, q_tmem_col: int = 0,
                    p_tmem_col: int | None = None) -> QKOnWs:
    """P = Q·Kᵀ on the instruction model with the multi-rail filling (FlashMLA MRGEMM).

    q: [M, d] bf16/f16 with M ∈ {32, 64, 128}; kv: [T, d] same dtype; rails must divide 128/M and
    rails·T ∈ {64, 128, 256} (N); d % (rails·block) == 0 and (d/rails) % 16 == 0. Q takes d/(2·rails)
    columns per lane group, P rails·T/G. ``rearrange_b=False`` runs the wrong variant
    (:func:`wrong_multirail_operands`), whose ``p`` is not Q·Kᵀ. Raises ValueError/TypeError naming the argument.
    """
    groups = _lane_groups_of(q)
    fill = multirail_operands if rearrange_b else wrong_multirail_operands
    a_groups, b = fill(q, kv, groups, rails, block)
    name = "multi-rail" if rearrange_b else "multi-rail (B not rearranged)"
    return _run(q, kv, a_groups, b, filling=name, rails=rails, tmem=tmem, q_tmem_col=q_tmem_col,
                p_tmem_col=p_tmem_col)
