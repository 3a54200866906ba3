"""Tensor memory (TMEM) of one SM100 SM: 128 lanes × 512 columns of 32-bit cells (256 KB).

The model stores raw bits (an int32 tensor ``cells[lane, column]``) so that what sits in a column is exactly
what the hardware would hold: one fp32 value, or two packed 16-bit values (bf16/f16, the element with the
lower index in the low half). Reads and writes go through :meth:`TensorMemory.store` and
:meth:`TensorMemory.load`, which check the lane and column ranges and, when a ``warp`` is named, the
PTX ISA tcgen05 "Access restrictions" (§9.7.18.8.1 in ISA 9.5): warp ``w`` of a warpgroup (``warpid % 4``) may only
touch lanes ``32w … 32w+31``.

Sources: PTX ISA, tcgen05 "Tensor Memory" (128 lanes × 512 columns per CTA, 32-bit cells; §9.7.18 in ISA 9.5),
the seed article shared/seeds/multi-rail-gemm.zh.txt §1.3/§1.5, docs/spec/mla.md §8.
"""
from __future__ import annotations

import torch

__all__ = [
    "TMEM_LANES", "TMEM_COLUMNS", "TMEM_CELL_BITS", "TMEM_BYTES", "LANES_PER_WARP",
    "elements_per_column", "columns_for", "TensorMemory",
]

TMEM_LANES = 128          # rows ("lanes") of tensor memory
TMEM_COLUMNS = 512        # 32-bit columns per lane
TMEM_CELL_BITS = 32
TMEM_BYTES = TMEM_LANES * TMEM_COLUMNS * TMEM_CELL_BITS // 8   # 262,144 B = 256 KB
LANES_PER_WARP = 32       # warp w of a warpgroup owns lanes 32w..32w+31 (its "sub-partition")

_ELEMENT_BITS = {torch.float32: 32, torch.bfloat16: 16, torch.float16: 16}
_INT16_OF = {torch.bfloat16: torch.int16, torch.float16: torch.int16}


def elements_per_column(dtype: torch.dtype) -> int:
    """Elements of ``dtype`` one 32-bit TMEM column holds per lane: 1 for float32, 2 for bfloat16/float16.

    Raises TypeError for any other dtype (the model covers the kind::f16 MMA: f16/bf16 operands, fp32 D).
    """
    bits = _ELEMENT_BITS.get(dtype)
    if bits is None:
        raise TypeError(f"dtype must be torch.float32, torch.bfloat16 or torch.float16 for TMEM, got {dtype}")
    return TMEM_CELL_BITS // bits


def columns_for(n_elements: int, dtype: torch.dtype) -> int:
    """32-bit columns per lane needed for ``n_elements`` values of ``dtype`` in one lane (rounded up)."""
    if n_elements < 0:
        raise ValueError(f"n_elements must be >= 0, got {n_elements}")
    epc = elements_per_column(dtype)
    return -(-n_elements // epc)


def _to_int32_bits(x: torch.Tensor) -> torch.Tensor:
    """uint32 values held in int64 -> the int32 tensor with the same bits."""
    return torch.where(x >= 2 ** 31, x - 2 ** 32, x).to(torch.int32)


class TensorMemory:
    """Bit-exact model of one CTA's tensor memory: ``cells`` is an int32 tensor [128 lanes, 512 columns].

    A fresh instance is zero-filled (real TMEM is not initialised; tests that care fill it with NaN bits
    via :meth:`fill`). Addresses are (lane, column) pairs as in a TMEM address ``lane << 16 | column``.
    """

    def __init__(self) -> None:
        self.cells = torch.zeros((TMEM_LANES, TMEM_COLUMNS), dtype=torch.int32)

    # -- checks -------------------------------------------------------------------------------------------
    @staticmethod
    def check_region(lane: int, n_lanes: int, col: int, n_cols: int, *, warp: int | None = None,
                     lane_arg: str = "lane", col_arg: str = "col") -> None:
        """Raise ValueError (naming the argument) unless lanes [lane, lane+n_lanes) × columns [col, col+n_cols)
        lie inside TMEM and, if ``warp`` (0..3) is given, inside that warp's lanes 32·warp … 32·warp+31."""
        if not (0 <= lane and n_lanes >= 1 and lane + n_lanes <= TMEM_LANES):
            raise ValueError(f"{lane_arg}: lanes [{lane}, {lane + n_lanes}) are outside TMEM lanes [0, {TMEM_LANES})")
        if not (0 <= col and n_cols >= 0 and col + n_cols <= TMEM_COLUMNS):
            raise ValueError(f"{col_arg}: columns [{col}, {col + n_cols}) are outside TMEM columns "
                             f"[0, {TMEM_COLUMNS})")
        if warp is not None:
            if warp not in range(4):
                raise ValueError(f"warp must be the warp's index in its warpgroup (0..3), got {warp}")
            lo = LANES_PER_WARP * warp
            if lane < lo or lane + n_lanes > lo + LANES_PER_WARP:
                raise ValueError(f"{lane_arg}: warp {warp} may only access lanes [{lo}, {lo + LANES_PER_WARP}) "
                                 f"(PTX tcgen05 access restriction), got lanes [{lane}, {lane + n_lanes})")

    # -- raw access ---------------------------------------------------------------------------------------
    def fill(self, value: float) -> None:
        """Set every cell to the float32 bit pattern of ``value`` (e.g. NaN to catch reads of unwritten cells)."""
        self.cells.copy_(torch.full(self.cells.shape, value, dtype=torch.float32).view(torch.int32))

    def store(self, lane: int, col: int, values: torch.Tensor, *, warp: int | None = None) -> None:
        """Write ``values`` [n_lanes, n] at lanes lane … lane+n_lanes-1, starting at column ``col`` (tcgen05.st).

        ``values`` dtype: float32 (one per column) or bfloat16/float16 (two per column, packed low half first,
        so ``n`` must be even). Raises TypeError for other dtypes and ValueError for a region outside TMEM or
        outside ``warp``'s lanes.
        """
        if not isinstance(values, torch.Tensor) or values.dim() != 2:
            raise ValueError(f"values must be a 2-D tensor [n_lanes, n], got {getattr(values, 'shape', values)}")
        epc = elements_per_column(values.dtype)
        n_lanes, n = values.shape
        if n % epc:
            raise ValueError(f"values: {n} 16-bit elements per lane do not fill whole 32-bit columns "
                             f"(need a multiple of {epc})")
        n_cols = n // epc
        self.check_region(lane, n_lanes, col, n_cols, warp=warp)
        v = values.detach().cpu().contiguous()
        if epc == 1:
            bits = v.view(torch.int32)
        else:
            h = v.view(_INT16_OF[v.dtype]).to(torch.int64) & 0xFFFF
            bits = _to_int32_bits(h[:, 0::2] | (h[:, 1::2] << 16))
        self.cells[lane:lane + n_lanes, col:col + n_cols] = bits

    def load(self, lane: int, n_lanes: int, col: int, n: int, dtype: torch.dtype, *,
             warp: int | None = None) -> torch.Tensor:
        """Read ``n`` elements of ``dtype`` per lane for lanes lane … lane+n_lanes-1 from column ``col`` on.

        Returns a tensor [n_lanes, n] of ``dtype`` (tcgen05.ld, bit-exact). Errors as in :meth:`store`.
        """
        epc = elements_per_column(dtype)
        if n % epc:
            raise ValueError(f"n: {n} 16-bit elements do not fill whole 32-bit columns (need a multiple of {epc})")
        n_cols = n // epc
        self.check_region(lane, n_lanes, col, n_cols, warp=warp)
        bits = self.cells[lane:lane + n_lanes, col:col + n_cols]
        if epc == 1:
            return bits.clone().view(torch.float32)
        w = bits.to(torch.int64) & 0xFFFFFFFF
        halves = torch.stack([w & 0xFFFF, (w >> 16) & 0xFFFF], dim=-1).reshape(n_lanes, n)
        return torch.where(halves >= 2 ** 15, halves - 2 ** 16, halves).to(torch.int16).view(dtype)
