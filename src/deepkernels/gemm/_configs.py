"""Tile configurations for the dense GEMMs: candidates, the shape -> config table, and the fallback rule.

No autotuning happens at call time: :func:`select_fp8_config` / :func:`select_bf16_config` look the shape up
in a table chosen offline by ``benchmarks/gemm.py --sweep`` on an H200 (results in
``benchmarks/results/gemm-*.json``, summary in ``benchmarks/notes/gemm.md``) and fall back to a rule for
shapes outside it. Every candidate is checked by the compile tier (wgmma, TMA, <= 227 KB SMEM).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

from ..quant.fp8 import ceil_div


@dataclass(frozen=True)
class GemmConfig:
    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    split_k: int = 1
    progs_per_sm: int = 1       # persistent programs per SM (2 lets two CTAs overlap MMA and promotion);
                                # 0 = not persistent (one program per tile)
    group_m: int = 8            # L2 tile grouping along M
    tma_store: bool = False     # TMA store of D (needs 16-B aligned D rows; falls back to masked stores)
    block_k: int = 128
    warp_spec: bool = False     # FP8: tl.range(warp_specialize=True) on the tile loop (needs num_warps=4)
    flatten: bool = False       # FP8: tl.range(flatten=True) on the tile loop

    def name(self) -> str:
        s = f"{self.block_m}x{self.block_n}x{self.block_k}_w{self.num_warps}_s{self.num_stages}"
        if self.split_k > 1:
            s += f"_sk{self.split_k}"
        if self.progs_per_sm != 1:
            s += f"_p{self.progs_per_sm}"
        if self.tma_store:
            s += "_tma"
        if self.warp_spec:
            s += "_ws"
        if self.flatten:
            s += "_fl"
        return s

    def to_dict(self) -> dict:
        return asdict(self)


def _c(bm, bn, w, s, sk=1, p=1, tma=False, bk=128, ws=False, fl=False):
    return GemmConfig(bm, bn, w, s, split_k=sk, progs_per_sm=p, tma_store=tma, block_k=bk, warp_spec=ws, flatten=fl)


# ---- FP8 candidates (BLOCK_K is always 128 = one scale block) -------------------------------------------
FP8_SMALL_M_CANDIDATES = [
    *[_c(64, 64, 4, 6, sk, 2) for sk in (1, 2, 4)],
    *[_c(64, 128, 4, 4, sk, 2) for sk in (1, 2, 4)],
    *[_c(64, 128, 4, 8, sk, 1) for sk in (1, 2)],
    *[_c(64, 256, 8, 4, sk, 1) for sk in (1, 2)],
    _c(128, 128, 8, 4, 1, 1),
    *[_c(64, 128, 4, 4, sk, 0) for sk in (1, 2)],
]
FP8_LARGE_M_CANDIDATES = [
    _c(128, 128, 8, 4, 1, 1),
    _c(128, 128, 8, 4, 1, 0),
    _c(128, 128, 8, 4, 1, 1, tma=True),
    _c(64, 128, 4, 4, 1, 2),
    _c(64, 128, 4, 4, 1, 0),
    _c(64, 256, 8, 4, 1, 1),
    _c(64, 256, 8, 3, 1, 1, tma=True),
    # flattened persistent loop (no pipeline drain between tiles)
    _c(128, 128, 8, 4, 1, 1, fl=True),
    _c(64, 128, 4, 4, 1, 2, fl=True),
]
# Triton autoWS kernel (tl.range(warp_specialize=True), num_warps=4): NOT swept or selectable any more (H200 run of
# 2026-11-29, benchmarks/notes/gemm.md "Version 2 measured"):
# - 128-row tiles (128x64 s6, 128x128 s4/s5) left output elements unwritten/NaN on the GPU (every shape, incl.
#   M = 4096 with no partial tiles). Their TTGIR partitioning looks right (consumer 0 rows [0, 64), consumer 1
#   rows [64, 128), shared B with one empty barrier per consumer, disjoint convert_layout scratch), so the defect
#   is below TTGIR in Triton 3.6's WS lowering; not localised without a GPU.
# - 64-row tiles (64x128): both consumer warpgroups compute and store the *same* full tile (the pass cannot
#   split a 64-row wgmma across two warpgroups and duplicates it), i.e. 2x the tensor work -- why it measured
#   1.2-1.7x slower than the plain kernel everywhere -- and with C accumulation both read-add-store D (a race).
# Kept for the compile tier (the kernel still has to specialise); dense.py never routes C accumulation to it.
FP8_WS_EXPERIMENTAL = [
    _c(64, 128, 4, 4, ws=True),
    _c(128, 64, 4, 6, ws=True),
    _c(128, 128, 4, 4, ws=True),
    _c(128, 128, 4, 5, ws=True),
]
# rejected by the compile tier (ptxas spills > 1 KB at 255 registers): 128x256 w8, 256x128 w8, 128x128 w4,
# 64x256 w4 -- the fresh per-K-block partial doubles the accumulator registers.
FP8_CANDIDATES = list(dict.fromkeys(FP8_SMALL_M_CANDIDATES + FP8_LARGE_M_CANDIDATES))

# ---- BF16 candidates (BLOCK_K = 64, DeepGEMM's BF16 block_k) -------------------------------------------
BF16_CANDIDATES = [
    _c(128, 256, 8, 3, bk=64),
    _c(128, 128, 8, 4, bk=64),
    _c(64, 128, 4, 6, 1, 2, bk=64),
    _c(64, 128, 4, 6, 2, 2, bk=64),
    _c(128, 128, 8, 4, 1, 0, bk=64),
    _c(64, 64, 4, 8, 4, 2, bk=64),
]

# ---- shape table: (m_class, n, k) -> config; m_class = 64 (M <= 64), 128 (M <= 128), 4096 (M >= 1024) ---------
# Chosen from the H200 sweep "gemm v2" of 2026-11-29 13:29 UTC: benchmarks/results/gemm-h200-v2-2026-11-29.json,
# provenance git_sha 6da825e05752+dirty (no gemm file differs between 6da825e and the commit that set this
# table), triton 3.6.0, torch 2.11.0+cu130. Rule: per shape the fastest whole-call time (triton.testing.do_bench
# median, L2 flushed, host path included); candidates within 2 % of it are near-ties, broken by the CUDA-graph
# replay time. Only candidates that passed every GPU check of that run (tests/test_gemm.py GPU tier, sweep check)
# are eligible. Comments: whole-call us / graph us, cuBLAS blockwise (torch._scaled_mm) whole / graph, same run.
# Predicted from that sweep: geomean 0.90x cuBLAS whole-call, 0.93x graph (15 shapes cuBLAS accepts).
FP8_TABLE: dict[tuple[int, int, int], GemmConfig] = {
    (64, 2112, 7168): _c(64, 64, 4, 6, 4, 2),         # 17.2 / 10.2 us (cuBLAS refuses N % 128)
    (64, 24576, 1536): _c(64, 128, 4, 4, 1, 0),       # 21.9 / 11.8 us; cuBLAS 21.4 / 13.6
    (64, 32768, 512): _c(64, 128, 4, 4, 1, 2),        # 14.5 / 8.0 us; cuBLAS 14.0 / 9.0
    (64, 7168, 16384): _c(64, 64, 4, 6, 2, 2),        # 50.3 / 39.8 us; cuBLAS 54.7 / 46.8
    (64, 4096, 7168): _c(64, 128, 4, 4, 4, 2),        # 22.1 / 12.4 us; cuBLAS 26.0 / 21.5
    (64, 7168, 2048): _c(64, 64, 4, 6, 1, 2),         # 13.5 / 8.5 us; cuBLAS 13.5 / 8.5
    (128, 2112, 7168): _c(64, 64, 4, 6, 4, 2),        # 18.2 / 12.6 us (cuBLAS refuses)
    (128, 24576, 1536): _c(64, 128, 4, 4, 1, 2),      # 26.2 / 18.7 us; cuBLAS 21.1 / 13.5
    (128, 32768, 512): _c(64, 128, 4, 4, 1, 2),       # 17.0 / 11.5 us; cuBLAS 13.8 / 8.3
    (128, 7168, 16384): _c(64, 128, 4, 4, 2, 0),      # 54.0 / 48.1 us; cuBLAS 55.0 / 51.2
    (128, 4096, 7168): _c(64, 128, 4, 4, 4, 2),       # 24.0 / 14.9 us; cuBLAS 28.4 / 21.6
    (128, 7168, 2048): _c(64, 64, 4, 6, 1, 2),        # 14.6 / 11.0 us; cuBLAS 13.2 / 8.5
    (4096, 2112, 7168): _c(128, 128, 8, 4, 1, 1, tma=True),  # 170.0 / 169.9 us (cuBLAS refuses)
    (4096, 24576, 1536): _c(64, 128, 4, 4, 1, 2),     # 385.7 / 465.7 us; cuBLAS 271.5 / 326.8
    (4096, 32768, 512): _c(64, 128, 4, 4, 1, 2, fl=True),   # 270.8 / 267.6 us; cuBLAS 215.8 / 186.9
    (4096, 7168, 16384): _c(64, 128, 4, 4, 1, 2, fl=True),  # 1038.5 / 1182.5 us; cuBLAS 751.5 / 851.5
    (4096, 4096, 7168): _c(64, 128, 4, 4, 1, 2),      # 286.0 / 313.6 us; cuBLAS 206.5 / 224.6
    (4096, 7168, 2048): _c(64, 128, 4, 4, 1, 2, fl=True),   # 148.0 / 165.0 us; cuBLAS 129.2 / 126.6
}
# BF16: same sweep and rule for the 13 shapes it reached (the run's time cap cut the BF16 sweep after
# (4096, 2112, 7168)); the other five M = 4096 rows keep the v1 pick (gemm-h200-2026-11-29.json, git fa34fb0,
# whole-call time; at M = 4096 the v1 host floor was hidden behind the kernel). Comments: ours / torch.matmul us.
# Predicted from the v2 sweep: geomean 0.83x torch.matmul whole-call over those 13 shapes.
BF16_TABLE: dict[tuple[int, int, int], GemmConfig] = {
    (64, 2112, 7168): _c(64, 128, 4, 6, 2, 2, bk=64),    # 27.6 / 19.3
    (64, 24576, 1536): _c(128, 256, 8, 3, 1, 1, bk=64),  # 35.3 / 30.6
    (64, 32768, 512): _c(128, 256, 8, 3, 1, 1, bk=64),   # 20.4 / 18.4
    (64, 7168, 16384): _c(64, 128, 4, 6, 2, 2, bk=64),   # 74.6 / 72.6
    (64, 4096, 7168): _c(64, 128, 4, 6, 2, 2, bk=64),    # 32.9 / 25.7
    (64, 7168, 2048): _c(64, 128, 4, 6, 1, 2, bk=64),    # 19.5 / 16.0
    (128, 2112, 7168): _c(64, 128, 4, 6, 2, 2, bk=64),   # 27.4 / 20.0
    (128, 24576, 1536): _c(128, 256, 8, 3, 1, 1, bk=64),  # 36.5 / 31.7
    (128, 32768, 512): _c(128, 256, 8, 3, 1, 1, bk=64),  # 21.1 / 18.7
    (128, 7168, 16384): _c(64, 128, 4, 6, 1, 2, bk=64),  # 86.6 / 78.0
    (128, 4096, 7168): _c(64, 128, 4, 6, 2, 2, bk=64),   # 33.7 / 28.0
    (128, 7168, 2048): _c(64, 128, 4, 6, 1, 2, bk=64),   # 18.9 / 16.2
    (4096, 2112, 7168): _c(128, 128, 8, 4, 1, 0, bk=64),  # 229.7 / 159.4
    (4096, 24576, 1536): _c(128, 256, 8, 3, 1, 1, bk=64),  # v1: 495 us
    (4096, 32768, 512): _c(128, 256, 8, 3, 1, 1, bk=64),  # v1: 278 us
    (4096, 7168, 16384): _c(128, 256, 8, 3, 1, 1, bk=64),  # v1: 1378 us
    (4096, 4096, 7168): _c(128, 256, 8, 3, 1, 1, bk=64),  # v1: 340 us
    (4096, 7168, 2048): _c(128, 256, 8, 3, 1, 1, bk=64),  # v1: 180 us
}

LARGE_M = 1024  # the M = 4096 table rows and the large-M rule apply from here; 128 < M < 1024 uses the rule


def m_class(m: int) -> int | None:
    """Table row class of M: 64 (M <= 64), 128 (M <= 128), 4096 (M >= LARGE_M); None (129..1023: rule only)."""
    if m <= 64:
        return 64
    if m <= 128:
        return 128
    return 4096 if m >= LARGE_M else None


def _split_for(tiles: int, num_kb: int, slots: int, max_split: int = 4, fill: float = 0.75,
               min_kb: int = 12) -> int:
    """Smallest split-K (1, 2, 4) with ``tiles * split >= fill * slots``, keeping >= ``min_kb`` K blocks per split.

    Fitted to the 2026-11-29 v2 sweep: split-K won at K = 7168 / 16384 when the tiles did not fill the machine,
    and lost at K <= 2048 even with few tiles (8 K blocks per split are too few to amortise the extra pass)."""
    split = 1
    while split < max_split and tiles * split < slots * fill and num_kb // (split * 2) >= min_kb:
        split *= 2
    return split


def fp8_rule(m: int, n: int, k: int, num_sms: int) -> GemmConfig:
    """Fallback FP8 config for shapes outside the table (the pattern of the v2 sweep winners).

    M >= LARGE_M: the large-M winner, 64x128 tiles, two persistent CTAs per SM (one CTA's promotion overlaps the
    other's wgmma), flattened tile loop. Smaller M: 64-row tiles, two CTAs per SM; BLOCK_N = 128 when 64x128 tiles
    fill the SMs or K is long (>= 64 K blocks), else 64; split-K 2/4 when the tiles leave SMs idle and K is long.
    """
    if m >= LARGE_M:
        return _c(64, 128, 4, 4, 1, 2, fl=True)
    num_kb = ceil_div(k, 128)
    bn = 128 if ceil_div(m, 64) * ceil_div(n, 128) >= num_sms or num_kb >= 64 else 64
    tiles = ceil_div(m, 64) * ceil_div(n, bn)
    split = _split_for(tiles, num_kb, 2 * num_sms)
    return _c(64, bn, 4, 6 if bn == 64 else 4, split, 2)


def bf16_rule(m: int, n: int, k: int, num_sms: int) -> GemmConfig:
    """Fallback BF16 config (pattern of the v2 sweep winners): while 64x128 tiles number < 1.4x the SMs, 64x128
    tiles with 2 CTAs/SM and split-K 2 only when the tiles fill < 40 % of the slots and each split keeps >= 24 K
    blocks (split won at K = 7168 and at (64, 7168, 16384); lost at (128, 7168, 16384) and at K = 2048); with more
    tiles (N >= 24576 at M <= 128, and large M) 128x256 tiles."""
    num_kb = ceil_div(k, 64)
    tiles = ceil_div(m, 64) * ceil_div(n, 128)
    if tiles < 1.4 * num_sms:
        split = _split_for(tiles, num_kb, 2 * num_sms, max_split=2, fill=0.4, min_kb=24)
        return _c(64, 128, 4, 6, split, 2, bk=64)
    return _c(128, 256, 8, 3, bk=64)


def select_fp8_config(m: int, n: int, k: int, num_sms: int) -> GemmConfig:
    return FP8_TABLE.get((m_class(m), n, k)) or fp8_rule(m, n, k, num_sms)


def select_bf16_config(m: int, n: int, k: int, num_sms: int) -> GemmConfig:
    return BF16_TABLE.get((m_class(m), n, k)) or bf16_rule(m, n, k, num_sms)
