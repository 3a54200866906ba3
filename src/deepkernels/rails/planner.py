"""TMEM planner for the SM100 sparse-decode CTA, and the seed's resource table for the QK GEMM.

A decode CTA keeps three things in its 512 TMEM columns (128 lanes each): the fp32 output accumulator O,
the Q operand of the QK MMA (bf16, two features per column) and the fp32 scores P. :func:`plan_tmem` lays
them out in that order (O, Q NoPE, Q RoPE tail, P) and refuses a layout over 512 columns;
:func:`qk_resources` / :func:`format_resource_table` give the seed article's §3.1 comparison of the
official ``.ws`` filling with the multi-rail one.

Column counts, per lane (G = 128/heads lane groups, R rails, T = topk_block, e = elements per column):
  O  = heads·d_v/128            (SV accumulator: N split over the G groups, 64×512 fp32 → 256 at heads 64)
  Q  = d/(R·e)                  (each group holds its rail's d/R features; R = 1: the full d, copied)
  Q_rope = d_rope/(R·e)         (the RoPE tail, rails of d_rope/R features)
  P  = R·T/G  per buffer        (D of the QK MMA: N = R·T split over G groups)

With heads 64, d 512, d_rope 64, bf16, T 64, R 2 this is FlashMLA's head64 decode map: O 0–255, Q 256–383,
Q tail 384–399, P 400–463 (docs/spec/mla.md §8.4, ``csrc/sm100/decode/head64/config.h``). With d_rope 0 and two
P buffers it is the fused core-attn map: O 0, Q 256, P_0 384, P_1 448. With R = 1 (the official filling)
O and Q alone take 512 columns and the plan is refused, which is the point of the seed article (§1.5).

Sources: shared/seeds/multi-rail-gemm.zh.txt §1.5, §3.1, §3.2; docs/spec/mla.md §8.2, §8.4.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .mma_ws import WS_M, WS_N, K_PER_INSTRUCTION
from .multirail import RAIL_BLOCK
from .tmem import TMEM_COLUMNS, TMEM_LANES

__all__ = [
    "DTYPES", "DecodeConfig", "TmemRegion", "TmemPlan", "TmemOverflowError", "plan_tmem",
    "QKResources", "qk_resources", "resource_table", "format_resource_table",
]

DTYPES = {"bf16": 2, "fp16": 2}     # Q/K dtype → elements per 32-bit TMEM column (kind::f16 only)


@dataclass(frozen=True)
class DecodeConfig:
    """One decode CTA's shape.

    heads: query heads per CTA = M of the QK MMA ∈ {32, 64, 128}. d: features of the QK GEMM's main part
    (NoPE, = D_V = 512 in FlashMLA). d_rope: RoPE features whose Q also sits in TMEM (64 for d_qk = 576; 0
    for d_qk = 512). dtype: "bf16" or "fp16". topk_block: tokens per QK step (B_TOPK). rails: NUM_MRGEMM_RAILS,
    1 = the official filling. d_v: width of O (default d). p_buffers: P buffers (1, or 2 for ping-pong).
    Raises ValueError naming the field for an illegal or unmodelled value.
    """
    heads: int = 64
    d: int = 512
    d_rope: int = 64
    dtype: str = "bf16"
    topk_block: int = 64
    rails: int = 2
    d_v: int | None = None
    p_buffers: int = 1

    def __post_init__(self) -> None:
        if self.heads not in WS_M:
            raise ValueError(f"heads must be one of {WS_M} (M of tcgen05.mma.ws on one CTA), got {self.heads}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {tuple(DTYPES)} (kind::f16), got {self.dtype!r}")
        if self.rails < 1 or self.lane_groups % self.rails:
            raise ValueError(f"rails must divide the {self.lane_groups} lane groups of M = {self.heads}, "
                             f"got {self.rails}")
        unit = self.rails * RAIL_BLOCK
        if self.d < 1 or self.d % unit:
            raise ValueError(f"d must be a positive multiple of rails·{RAIL_BLOCK} = {unit}, got {self.d}")
        step = self.rails * K_PER_INSTRUCTION["f16"]
        if self.d_rope < 0 or self.d_rope % step:
            raise ValueError(f"d_rope must be a non-negative multiple of rails·16 = {step}, got {self.d_rope}")
        if self.topk_block < 1 or self.rails * self.topk_block not in WS_N:
            raise ValueError(f"topk_block: N = rails·topk_block = {self.rails}·{self.topk_block} must be one of "
                             f"{WS_N} for tcgen05.mma.ws")
        if self.d_v is not None and (self.d_v < 1 or self.d_v * self.heads % TMEM_LANES):
            raise ValueError(f"d_v must be positive with heads·d_v a multiple of {TMEM_LANES}, got {self.d_v}")
        if self.p_buffers < 1:
            raise ValueError(f"p_buffers must be >= 1, got {self.p_buffers}")

    @property
    def lane_groups(self) -> int:
        """G = 128/heads."""
        return TMEM_LANES // self.heads

    @property
    def elements_per_column(self) -> int:
        """Q elements per 32-bit TMEM column (2 for bf16/fp16)."""
        return DTYPES[self.dtype]

    @property
    def o_columns(self) -> int:
        """Columns of the fp32 O accumulator: heads·d_v/128."""
        return self.heads * (self.d if self.d_v is None else self.d_v) // TMEM_LANES

    @property
    def q_columns(self) -> int:
        """Columns of Q (NoPE) per lane group: d/(rails·elements_per_column)."""
        return self.d // (self.rails * self.elements_per_column)

    @property
    def q_rope_columns(self) -> int:
        """Columns of Q's RoPE tail per lane group: d_rope/(rails·elements_per_column)."""
        return self.d_rope // (self.rails * self.elements_per_column)

    @property
    def p_columns(self) -> int:
        """Columns of one fp32 P per lane group: rails·topk_block/lane_groups (N/G)."""
        return self.rails * self.topk_block // self.lane_groups

    def with_rails(self, rails: int) -> "DecodeConfig":
        """The same config with another rail count (validated again)."""
        return DecodeConfig(self.heads, self.d, self.d_rope, self.dtype, self.topk_block, rails, self.d_v,
                            self.p_buffers)


@dataclass(frozen=True)
class TmemRegion:
    """Columns [start, start + columns) of every lane, holding ``content``."""
    name: str
    start: int
    columns: int
    content: str

    @property
    def end(self) -> int:
        """One past the last column."""
        return self.start + self.columns

    @property
    def span(self) -> str:
        """Inclusive range as the seed writes it, e.g. "256–383"."""
        return f"{self.start}–{self.end - 1}"


class TmemOverflowError(ValueError):
    """A plan needs more than the 512 TMEM columns of a CTA."""


@dataclass(frozen=True)
class TmemPlan:
    """Result of :func:`plan_tmem`: ordered regions, columns used and the tcgen05.alloc size (a power of
    two ≥ 32 covering them)."""
    config: DecodeConfig
    regions: tuple = field(default=())

    @property
    def used_columns(self) -> int:
        """One past the last column any region uses."""
        return max((r.end for r in self.regions), default=0)

    @property
    def allocated_columns(self) -> int:
        """Columns tcgen05.alloc would take: the smallest power of two ≥ 32 covering used_columns."""
        n = 32
        while n < self.used_columns:
            n *= 2
        return n

    def region(self, name: str) -> TmemRegion:
        """The region called ``name`` ("O", "Q", "Q_rope", "P" or "P0"/"P1"); KeyError if absent."""
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(f"no TMEM region {name!r}; have {[r.name for r in self.regions]}")

    def format(self) -> str:
        """Human-readable plan: one line per region (name, inclusive column span, width, content)."""
        c = self.config
        head = (f"TMEM plan: heads={c.heads} d={c.d} d_rope={c.d_rope} {c.dtype} topk_block={c.topk_block} "
                f"rails={c.rails} (M={c.heads}, {c.lane_groups} lane group(s) of {c.heads} lanes)")
        lines = [head, f"  {'region':<7} {'columns':<9} {'width':>5}  holds"]
        for r in self.regions:
            lines.append(f"  {r.name:<7} {r.span:<9} {r.columns:>5}  {r.content}")
        lines.append(f"  used {self.used_columns} of {TMEM_COLUMNS} columns; tcgen05.alloc {self.allocated_columns}")
        return "\n".join(lines)


def _regions(c: DecodeConfig) -> list[TmemRegion]:
    g, r, col = c.lane_groups, c.rails, 0
    d_v = c.d if c.d_v is None else c.d_v
    regions = []

    def add(name, cols, content):
        nonlocal col
        regions.append(TmemRegion(name, col, cols, content))
        col += cols

    add("O", c.o_columns, f"O accumulator fp32, {c.heads}×{d_v} split over {g} lane group(s)")
    q_what = (f"Q {c.dtype}, the full {c.d} features copied into each of {g} lane group(s)" if r == 1 else
              f"Q {c.dtype}, rail r = {RAIL_BLOCK}-wide blocks r, r+{r}, …: {c.d // r} features per lane group")
    add("Q", c.q_columns, q_what)
    if c.d_rope:
        add("Q_rope", c.q_rope_columns, f"Q RoPE tail {c.dtype}, {c.d_rope // r} features per lane group")
    p_what = ("P fp32, tokens split over the lane groups" if r == 1 else
              f"partial P fp32 of {r} rails ({c.topk_block} tokens each), summed by the softmax warpgroup")
    for i in range(c.p_buffers):
        add("P" if c.p_buffers == 1 else f"P{i}", c.p_columns, p_what)
    return regions


def plan_tmem(config: DecodeConfig) -> TmemPlan:
    """Allocate O, Q (and its RoPE tail) and P columns for ``config`` in that order.

    Returns a :class:`TmemPlan`. Raises :class:`TmemOverflowError` (a ValueError) naming ``config`` and every
    region when they need more than 512 columns, e.g. the official filling at heads 64, d 512.
    """
    if not isinstance(config, DecodeConfig):
        raise TypeError(f"config must be a DecodeConfig, got {type(config).__name__}")
    plan = TmemPlan(config, tuple(_regions(config)))
    if plan.used_columns > TMEM_COLUMNS:
        listing = ", ".join(f"{r.name} {r.span}" for r in plan.regions)
        raise TmemOverflowError(f"config: needs {plan.used_columns} TMEM columns ({listing}) but a CTA has "
                                f"{TMEM_COLUMNS} per lane (rails={config.rails}, heads={config.heads}, d={config.d})")
    return plan


@dataclass(frozen=True)
class QKResources:
    """The seed's §3.1 rows for one filling of the QK GEMM over the ``d`` main features (RoPE not counted).

    m×n×k: the whole GEMM (k summed over instructions); instructions of K = k_per_instruction each;
    multiplies per instruction (M·N·16) and in total; q_columns / p_columns: TMEM columns per lane group of Q
    and of one P; reduce_needed: whether the rails' partial P must be added.
    """
    filling: str
    rails: int
    m: int
    n: int
    k: int
    k_per_instruction: int
    instructions: int
    multiplies_per_instruction: int
    multiplies_total: int
    q_columns: int
    p_columns: int
    reduce_needed: bool

    @property
    def mma_shape(self) -> str:
        """Whole-GEMM shape as the seed writes it, e.g. "64×128×256"."""
        return f"{self.m}×{self.n}×{self.k}"

    @property
    def p_postprocessing(self) -> str:
        """What P needs after the MMA: "read back, ready to use" or "needs P0 + P1 …"."""
        if not self.reduce_needed:
            return "read back, ready to use"
        return "needs " + " + ".join(f"P{i}" for i in range(self.rails))


def qk_resources(config: DecodeConfig) -> QKResources:
    """Resource numbers of the QK MMA for ``config`` (official if rails = 1, else multi-rail).

    N = rails·topk_block, K = d/rails, instructions = K/16, multiplies = M·N·16 per instruction.
    """
    r, kpi = config.rails, K_PER_INSTRUCTION["f16"]
    m, n, k = config.heads, r * config.topk_block, config.d // r
    per = m * n * kpi
    return QKResources("official .ws" if r == 1 else f"multi-rail ({r} rails)", r, m, n, k, kpi, k // kpi, per,
                       per * (k // kpi), config.q_columns, config.p_columns, r > 1)


def resource_table(config: DecodeConfig | None = None) -> list[QKResources]:
    """The seed's comparison: [official .ws, config's multi-rail] (just [official] when config.rails = 1).
    Default config: heads 64, d 512, bf16, topk_block 64, 2 rails, which reproduces seed §3.1 exactly."""
    config = DecodeConfig() if config is None else config
    rows = [qk_resources(config.with_rails(1))]
    if config.rails > 1:
        rows.append(qk_resources(config))
    return rows


_ROWS = (
    ("MMA shape (M×N×K)", lambda q: q.mma_shape),
    ("instructions (K=16 each)", lambda q: f"{q.instructions}"),
    ("multiplies per instruction", lambda q: f"{q.multiplies_per_instruction:,}"),
    ("multiplies in total", lambda q: f"{q.multiplies_total:,}"),
    ("Q TMEM columns per lane group", lambda q: f"{q.q_columns}"),
    ("one P, TMEM columns per lane group", lambda q: f"{q.p_columns}"),
    ("P post-processing", lambda q: q.p_postprocessing),
)


def format_resource_table(rows: list[QKResources]) -> str:
    """Plain-text table in the seed's §3.1 order: one row per item, one column per filling."""
    cells = [[label] + [fn(q) for q in rows] for label, fn in _ROWS]
    header = ["item"] + [q.filling for q in rows]
    widths = [max(len(r[i]) for r in cells + [header]) for i in range(len(header))]
    fmt = lambda r: "  ".join(s.ljust(w) for s, w in zip(r, widths)).rstrip()   # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells])
