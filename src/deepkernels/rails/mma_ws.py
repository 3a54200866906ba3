"""Functional model of ``tcgen05.mma.ws.cta_group::1.kind::f16`` with A in tensor memory (the "TS" form).

What the instruction does, as the model implements it (PTX ISA 9.5 §9.7.18.10.10.3 tcgen05.mma.ws; the data
path layouts of §9.7.18.10.5; the seed article §1.2/§2.2/§2.4):

* Shapes: M ∈ {32, 64, 128}, N ∈ {64, 128, 256}, K = 16 (kind::f16, dense, cta_group::1 only; PTX Table
  "Various combinations of .kind and shapes"). A and B are both f16 or both bf16, D is fp32 (or f16).
* The 128 TMEM lanes form G = 128/M lane groups of M lanes. Lane group g holds its own A_g (rows 0..M-1 of
  A in lanes g·M … g·M+M-1, K/2 = 8 columns of packed 16-bit values from ``a_tmem_col``), multiplies it by
  the g-th N-slice of B (B is read from shared memory, which every group can see), and writes the g-th
  N-slice of D back into its own lanes, columns ``d_tmem_col … d_tmem_col + N/G - 1``:

      D_g = A_g × B_g        (g = 0 … G-1;   B_g = B[g·N/G : (g+1)·N/G, :],   D = [D_0 | D_1 | …])

  M = 128 is Layout D (one group, identity), M = 64 is Layout E (the "2×2" datapath: two groups of 64 lanes,
  each taking half of N), M = 32 is Layout G (four groups of 32 lanes, each a quarter of N).
* The hardware does not check that the A_g are equal. The usual (CUTLASS/CuTe) use stores a copy of the same
  A in every group, which gives D = A × B; FlashMLA's multi-rail GEMM stores different feature slices
  (:mod:`deepkernels.rails.multirail`).

Numerics of the model: each instruction computes A_g·B_gᵀ exactly in float64 from the stored 16-bit values,
adds the old D (when ``enable_input_d``) and rounds once to the D dtype. Real tensor cores accumulate in fp32
with an unspecified internal order; exact integer inputs (|D| < 2²⁴) give identical results either way.
Not modelled: collector buffers (``.collector::b0..b3::fill/use/lastuse``), the zero-column mask, sparsity,
shared-memory swizzles and descriptors (B is passed as the logical [N, K] matrix the descriptor describes).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from .._validate import check_shape, check_tensor
from .tmem import TMEM_LANES, TensorMemory, columns_for

__all__ = [
    "WS_M", "WS_N", "K_PER_INSTRUCTION", "DatapathLayout", "datapath_layout", "WsInstr",
    "store_a_groups", "load_d_groups", "tcgen05_mma_ws", "mma_ws_gemm",
]

WS_M = (32, 64, 128)                 # legal M of tcgen05.mma.ws (cta_group::1)
WS_N = (64, 128, 256)                # legal N of tcgen05.mma.ws, dense kind::f16/tf32/f8f6f4/i8
K_PER_INSTRUCTION = {"f16": 16}      # K of one kind::f16 instruction (32 bytes of 16-bit elements)
_A_DTYPES = (torch.bfloat16, torch.float16)
_D_DTYPES = (torch.float32, torch.float16)


@dataclass(frozen=True)
class DatapathLayout:
    """Where an MMA with M rows puts row ``r`` / column ``c`` of D in TMEM (PTX §9.7.18.10.5 in ISA 9.5).

    ``name`` is the PTX layout letter, ``lane_groups`` the number of M-lane groups N is split over
    (128/M for .ws; 1 for Layout D; Layout F uses 64 of the 128 lanes, 16 per warp, with N unsplit).
    """
    name: str
    m: int
    ws: bool
    lane_groups: int

    def d_location(self, row: int, col: int, n: int) -> tuple[int, int]:
        """(lane, column offset from the D base column) of D[row, col] for an M×N MMA with this layout."""
        if not (0 <= row < self.m and 0 <= col < n):
            raise ValueError(f"row/col: ({row}, {col}) outside D of shape [{self.m}, {n}]")
        if self.name == "F":                      # 4×1, half datapath: rows 16w..16w+15 on warp w's lanes
            return 32 * (row // 16) + row % 16, col
        slice_n = n // self.lane_groups
        g = col // slice_n
        return g * self.m + row, col - g * slice_n

    @property
    def lanes_used(self) -> int:
        """Number of TMEM lanes (of 128) the layout writes D into."""
        return 64 if self.name == "F" else self.m * self.lane_groups


def datapath_layout(m: int, *, ws: bool = True) -> DatapathLayout:
    """The cta_group::1 data path layout for an MMA with ``m`` rows: D (M=128), E (M=64 .ws, 2×2),
    F (M=64 without .ws, half datapath), G (M=32 .ws, four groups). Raises ValueError for other ``m``
    (M=32 exists only with .ws)."""
    if ws:
        if m not in WS_M:
            raise ValueError(f"m must be one of {WS_M} for tcgen05.mma.ws, got {m}")
        return DatapathLayout({128: "D", 64: "E", 32: "G"}[m], m, True, TMEM_LANES // m)
    if m not in (64, 128):
        raise ValueError(f"m must be 64 or 128 for tcgen05.mma without .ws (cta_group::1), got {m}")
    return DatapathLayout("D" if m == 128 else "F", m, False, 1)


@dataclass(frozen=True)
class WsInstr:
    """Instruction descriptor of one ``tcgen05.mma.ws.cta_group::1.kind::f16`` (dense).

    m ∈ {32, 64, 128}; n ∈ {64, 128, 256}; kind "f16" (K = 16); a_dtype bf16 or f16 (B has the same dtype);
    d_dtype fp32 or f16. Raises ValueError naming the field for an illegal value (TypeError for dtypes).
    """
    m: int
    n: int
    kind: str = "f16"
    a_dtype: torch.dtype = torch.bfloat16
    d_dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if self.kind not in K_PER_INSTRUCTION:
            raise ValueError(f"kind must be 'f16' (the only kind modelled; tf32/f8f6f4/i8 are not), got {self.kind!r}")
        if self.m not in WS_M:
            raise ValueError(f"m must be one of {WS_M} for tcgen05.mma.ws, got {self.m}")
        if self.n not in WS_N:
            raise ValueError(f"n must be one of {WS_N} for tcgen05.mma.ws kind::f16 dense, got {self.n}")
        if self.a_dtype not in _A_DTYPES:
            raise TypeError(f"a_dtype must be torch.bfloat16 or torch.float16 for kind::f16, got {self.a_dtype}")
        if self.d_dtype not in _D_DTYPES:
            raise TypeError(f"d_dtype must be torch.float32 or torch.float16 for kind::f16, got {self.d_dtype}")

    @property
    def k(self) -> int:
        """K of one instruction (16 for kind::f16)."""
        return K_PER_INSTRUCTION[self.kind]

    @property
    def layout(self) -> DatapathLayout:
        """The data path layout of this M (.ws): D, E or G."""
        return datapath_layout(self.m, ws=True)

    @property
    def lane_groups(self) -> int:
        """G = 128/M lane groups; group g owns lanes g·M … g·M+M-1."""
        return TMEM_LANES // self.m

    @property
    def n_per_group(self) -> int:
        """Columns of D (and rows of B) each lane group handles: N/G."""
        return self.n // self.lane_groups

    @property
    def a_columns(self) -> int:
        """TMEM columns one lane of A occupies per instruction (K 16-bit values, 2 per column: 8)."""
        return columns_for(self.k, self.a_dtype)

    @property
    def d_columns(self) -> int:
        """TMEM columns of D per lane: N/G for fp32 D (N/G/2 for f16 D)."""
        return columns_for(self.n_per_group, self.d_dtype)

    @property
    def multiplies(self) -> int:
        """Scalar multiplies one instruction performs: M·N·K."""
        return self.m * self.n * self.k

    @property
    def ptx(self) -> str:
        """The PTX opcode the descriptor belongs to."""
        return f"tcgen05.mma.ws.cta_group::1.kind::{self.kind}"


def _group_lanes(instr: WsInstr, g: int) -> int:
    return g * instr.m


def store_a_groups(tmem: TensorMemory, instr: WsInstr, a_groups: Sequence[torch.Tensor], a_tmem_col: int) -> None:
    """Write one A operand per lane group: ``a_groups[g]`` [M, K_total] (instr.a_dtype) goes to lanes
    g·M … g·M+M-1, columns a_tmem_col … a_tmem_col + K_total/2 - 1 (two 16-bit values per column).

    This is what the kernel's tcgen05.cp / tcgen05.st of Q does; the instruction later reads group g's A only
    from group g's lanes. Raises ValueError if len(a_groups) != 128/M, a shape differs or the region leaves TMEM.
    """
    if len(a_groups) != instr.lane_groups:
        raise ValueError(f"a_groups must hold {instr.lane_groups} tensors (one per lane group at M={instr.m}), "
                         f"got {len(a_groups)}")
    k_total = None
    for g, a in enumerate(a_groups):
        check_tensor(f"a_groups[{g}]", a, ndim=2, dtype=instr.a_dtype)
        k_total = a.shape[1] if k_total is None else k_total
        check_shape(f"a_groups[{g}]", a, [instr.m, k_total])
        tmem.store(_group_lanes(instr, g), a_tmem_col, a)


def load_d_groups(tmem: TensorMemory, instr: WsInstr, d_tmem_col: int) -> list[torch.Tensor]:
    """Read D back per lane group: element g is D_g [M, N/G] (instr.d_dtype) from lanes g·M … g·M+M-1,
    columns d_tmem_col … (the tcgen05.ld a softmax warpgroup would do)."""
    return [tmem.load(_group_lanes(instr, g), instr.m, d_tmem_col, instr.n_per_group, instr.d_dtype)
            for g in range(instr.lane_groups)]


def _check_no_overlap(instr: WsInstr, a_tmem_col: int, d_tmem_col: int) -> None:
    a_lo, a_hi = a_tmem_col, a_tmem_col + instr.a_columns
    d_lo, d_hi = d_tmem_col, d_tmem_col + instr.d_columns
    if a_lo < d_hi and d_lo < a_hi:
        raise ValueError(f"d_tmem_col: D columns [{d_lo}, {d_hi}) overlap the A columns [{a_lo}, {a_hi}) "
                         f"read by the same instruction (a_tmem_col={a_tmem_col})")


def tcgen05_mma_ws(tmem: TensorMemory, instr: WsInstr, *, a_tmem_col: int, b: torch.Tensor, d_tmem_col: int,
                   enable_input_d: bool) -> None:
    """Execute one ``tcgen05.mma.ws`` (A from TMEM, B from shared memory) on the TMEM model, in place.

    Args:
        tmem: the CTA's :class:`TensorMemory`.
        instr: shape and types (:class:`WsInstr`; K = 16).
        a_tmem_col: first TMEM column of A; group g reads lanes g·M … g·M+M-1, columns a_tmem_col … +7.
        b: [N, 16] instr.a_dtype, the B operand as the shared-memory descriptor describes it, K-major
            (row n = column n of the math B). Group g uses rows g·N/G … (g+1)·N/G - 1.
        d_tmem_col: first TMEM column of D; group g writes D_g [M, N/G] into its own lanes.
        enable_input_d: D_g += A_g·B_gᵀ if True, D_g = A_g·B_gᵀ if False.

    Raises ValueError/TypeError naming the argument for a wrong ``b`` shape/dtype, a region outside TMEM, or D
    overlapping A. Source: PTX ISA tcgen05.mma.ws; FlashMLA kerutils ``SM100_MMA_F16BF16_WS_TS_NOELECT``.
    """
    check_tensor("b", b, ndim=2, dtype=instr.a_dtype)
    check_shape("b", b, [instr.n, instr.k])
    TensorMemory.check_region(0, TMEM_LANES, a_tmem_col, instr.a_columns, col_arg="a_tmem_col")
    TensorMemory.check_region(0, TMEM_LANES, d_tmem_col, instr.d_columns, col_arg="d_tmem_col")
    _check_no_overlap(instr, a_tmem_col, d_tmem_col)
    ng = instr.n_per_group
    b64 = b.detach().cpu().to(torch.float64)
    results = []
    for g in range(instr.lane_groups):           # all groups read before any writes (one instruction)
        lane = _group_lanes(instr, g)
        a_g = tmem.load(lane, instr.m, a_tmem_col, instr.k, instr.a_dtype).to(torch.float64)
        d_g = a_g @ b64[g * ng:(g + 1) * ng].T
        if enable_input_d:
            d_g = d_g + tmem.load(lane, instr.m, d_tmem_col, ng, instr.d_dtype).to(torch.float64)
        results.append((lane, d_g.to(instr.d_dtype)))
    for lane, d_g in results:
        tmem.store(lane, d_tmem_col, d_g)


def mma_ws_gemm(tmem: TensorMemory, instr: WsInstr, *, a_tmem_col: int, b: torch.Tensor, d_tmem_col: int,
                accumulate: bool = False) -> int:
    """Issue the K/16 instructions of an M×N×K GEMM whose A already sits in TMEM (per lane group, K/2 columns
    from ``a_tmem_col``) and whose B is ``b`` [N, K] (instr.a_dtype, K-major). Instruction i reads A columns
    a_tmem_col + 8i … and B[:, 16i:16i+16]; the first one overwrites D unless ``accumulate``.

    Returns the number of instructions issued (K/16). Raises ValueError naming ``b`` if K is not a positive
    multiple of 16 or N != instr.n.
    """
    check_tensor("b", b, ndim=2, dtype=instr.a_dtype)
    n, k_total = b.shape
    if n != instr.n:
        raise ValueError(f"b must have shape [{instr.n}, K] (N = instr.n), got {list(b.shape)}")
    if k_total <= 0 or k_total % instr.k:
        raise ValueError(f"b: K = {k_total} must be a positive multiple of {instr.k} (K of one kind::f16 "
                         f"instruction), shape {list(b.shape)}")
    a_cols = columns_for(k_total, instr.a_dtype)
    TensorMemory.check_region(0, TMEM_LANES, a_tmem_col, a_cols, col_arg="a_tmem_col")
    if a_tmem_col < d_tmem_col + instr.d_columns and d_tmem_col < a_tmem_col + a_cols:
        raise ValueError(f"d_tmem_col: D columns [{d_tmem_col}, {d_tmem_col + instr.d_columns}) overlap the A "
                         f"columns [{a_tmem_col}, {a_tmem_col + a_cols})")
    steps = k_total // instr.k
    for i in range(steps):
        tcgen05_mma_ws(tmem, instr, a_tmem_col=a_tmem_col + i * instr.a_columns,
                       b=b[:, i * instr.k:(i + 1) * instr.k], d_tmem_col=d_tmem_col,
                       enable_input_d=accumulate or i > 0)
    return steps

