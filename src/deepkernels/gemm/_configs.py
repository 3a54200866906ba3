"""Tile configurations for the dense GEMMs: candidates, the shape -> config table, and the fallback rule.

No autotuning happens at call time: :func:`select_fp8_config` / :func:`select_bf16_config` look the shape up
in a table chosen offline by ``benchmarks/gemm.py --sweep`` on an H200 (results in
``benchmarks/results/gemm-*.json``, summary in ``benchmarks/notes/gemm.md``) and fall back to a rule for
shapes outside it. Every candidate is checked by the compile tier (wgmma, TMA, <= 227 KB SMEM).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


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
    _c(64, 128, 4, 4, ws=True),            # autoWS: producer + 2 consumer warpgroups
    _c(128, 64, 4, 6, ws=True),
]
FP8_LARGE_M_CANDIDATES = [
    _c(128, 128, 8, 4, 1, 1),
    _c(128, 128, 8, 4, 1, 0),
    _c(128, 128, 8, 4, 1, 1, tma=True),
    _c(64, 128, 4, 4, 1, 2),
    _c(64, 128, 4, 4, 1, 0),
    _c(64, 256, 8, 4, 1, 1),
    _c(64, 256, 8, 3, 1, 1, tma=True),
    # Triton autoWS (tl.range(warp_specialize=True), num_warps=4): 1 TMA producer + 2 wgmma/promotion consumer
    # warpgroups of BLOCK_M/2 rows each -- one consumer's promotion overlaps the other's wgmma (compile tier
    # checks ttg.warp_specialize). ptxas reports ~360 B spill (128x64: none); 256x128 / 128x256 spill 2-4.7 KB.
    _c(128, 128, 4, 4, ws=True),
    _c(128, 128, 4, 5, ws=True),
    _c(128, 64, 4, 6, ws=True),
    _c(64, 128, 4, 4, ws=True),
    # flattened persistent loop (no pipeline drain between tiles)
    _c(128, 128, 8, 4, 1, 1, fl=True),
    _c(64, 128, 4, 4, 1, 2, fl=True),
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

# ---- shape table: (m_class, n, k) -> config; m_class = 64 (M <= 64), 128 (M <= 128), 4096 (larger) ------
# Best whole-call time per shape in the H200 sweep of 2026-11-29 (benchmarks/results/gemm-h200-2026-11-29.json,
# git fa34fb0, triton.testing.do_bench median, L2 flushed). Caveat: at M <= 128 those times were dominated by a
# ~150 us host-side floor (Python validation + SF copy + Triton launch), so the small-M picks are noisy and
# split-K (a second launch) was penalised; re-sweep with --graph once the host path is lean.
FP8_TABLE: dict[tuple[int, int, int], GemmConfig] = {
    (64, 2112, 7168): _c(64, 256, 8, 4, 1, 1),  # 179 us
    (64, 24576, 1536): _c(64, 256, 8, 4, 1, 1),  # 165 us
    (64, 32768, 512): _c(64, 64, 4, 6, 1, 2),  # 178 us
    (64, 7168, 16384): _c(64, 128, 4, 8, 2, 1),  # 211 us
    (64, 4096, 7168): _c(64, 128, 4, 4, 1, 0),  # 183 us
    (64, 7168, 2048): _c(64, 128, 4, 8, 1, 1),  # 223 us
    (128, 2112, 7168): _c(64, 128, 4, 4, 1, 0),  # 168 us
    (128, 24576, 1536): _c(64, 128, 4, 8, 1, 1),  # 194 us
    (128, 32768, 512): _c(64, 128, 4, 4, 1, 0),  # 156 us
    (128, 7168, 16384): _c(128, 128, 8, 4, 1, 1),  # 201 us
    (128, 4096, 7168): _c(64, 128, 4, 4, 1, 0),  # 156 us
    (128, 7168, 2048): _c(64, 128, 4, 4, 1, 0),  # 152 us
    (4096, 2112, 7168): _c(128, 128, 8, 4, 1, 1),  # 186 us
    (4096, 24576, 1536): _c(128, 128, 8, 4, 1, 1, tma=True),  # 404 us
    (4096, 32768, 512): _c(64, 128, 4, 4, 1, 2),  # 275 us
    (4096, 7168, 16384): _c(128, 128, 8, 4, 1, 1, tma=True),  # 1072 us
    (4096, 4096, 7168): _c(128, 128, 8, 4, 1, 1, tma=True),  # 274 us
    (4096, 7168, 2048): _c(128, 128, 8, 4, 1, 0),  # 222 us
}
BF16_TABLE: dict[tuple[int, int, int], GemmConfig] = {
    (64, 2112, 7168): _c(128, 256, 8, 3, 1, 1, bk=64),  # 77 us
    (64, 24576, 1536): _c(128, 128, 8, 4, 1, 0, bk=64),  # 98 us
    (64, 32768, 512): _c(128, 128, 8, 4, 1, 0, bk=64),  # 78 us
    (64, 7168, 16384): _c(128, 128, 8, 4, 1, 1, bk=64),  # 117 us
    (64, 4096, 7168): _c(128, 128, 8, 4, 1, 0, bk=64),  # 102 us
    (64, 7168, 2048): _c(128, 128, 8, 4, 1, 0, bk=64),  # 111 us
    (128, 2112, 7168): _c(128, 128, 8, 4, 1, 0, bk=64),  # 135 us
    (128, 24576, 1536): _c(128, 128, 8, 4, 1, 0, bk=64),  # 91 us
    (128, 32768, 512): _c(128, 128, 8, 4, 1, 0, bk=64),  # 73 us
    (128, 7168, 16384): _c(64, 128, 4, 6, 1, 2, bk=64),  # 87 us
    (128, 4096, 7168): _c(128, 128, 8, 4, 1, 0, bk=64),  # 91 us
    (128, 7168, 2048): _c(128, 128, 8, 4, 1, 0, bk=64),  # 80 us
    (4096, 2112, 7168): _c(128, 128, 8, 4, 1, 1, bk=64),  # 220 us
    (4096, 24576, 1536): _c(128, 256, 8, 3, 1, 1, bk=64),  # 495 us
    (4096, 32768, 512): _c(128, 256, 8, 3, 1, 1, bk=64),  # 278 us
    (4096, 7168, 16384): _c(128, 256, 8, 3, 1, 1, bk=64),  # 1378 us
    (4096, 4096, 7168): _c(128, 256, 8, 3, 1, 1, bk=64),  # 340 us
    (4096, 7168, 2048): _c(128, 256, 8, 3, 1, 1, bk=64),  # 180 us
}


def m_class(m: int) -> int:
    return 64 if m <= 64 else (128 if m <= 128 else 4096)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _split_for(tiles: int, num_kb: int, slots: int, max_split: int = 4) -> int:
    """Smallest split-K (1, 2, 4) that fills ``slots`` programs, keeping >= 4 K blocks per split."""
    split = 1
    while split < max_split and tiles * split < slots * 0.75 and num_kb // (split * 2) >= 4:
        split *= 2
    return split


def fp8_rule(m: int, n: int, k: int, num_sms: int) -> GemmConfig:
    """Fallback FP8 config for shapes outside the table."""
    num_kb = _cdiv(k, 128)
    if m <= 128:
        bn = 128 if _cdiv(m, 64) * _cdiv(n, 128) >= num_sms else 64
        tiles = _cdiv(m, 64) * _cdiv(n, bn)
        split = _split_for(tiles, num_kb, 2 * num_sms)
        return _c(64, bn, 4, 6 if bn == 64 else 4, split, 2)
    return _c(128, 128, 8, 4, 1, 1)


def bf16_rule(m: int, n: int, k: int, num_sms: int) -> GemmConfig:
    """Fallback BF16 config for shapes outside the table."""
    num_kb = _cdiv(k, 64)
    if m <= 128:
        tiles = _cdiv(m, 64) * _cdiv(n, 128)
        split = _split_for(tiles, num_kb, 2 * num_sms, max_split=2)
        return _c(64, 128, 4, 6, split, 2, bk=64)
    return _c(128, 256, 8, 3, bk=64)


def select_fp8_config(m: int, n: int, k: int, num_sms: int) -> GemmConfig:
    return FP8_TABLE.get((m_class(m), n, k)) or fp8_rule(m, n, k, num_sms)


def select_bf16_config(m: int, n: int, k: int, num_sms: int) -> GemmConfig:
    return BF16_TABLE.get((m_class(m), n, k)) or bf16_rule(m, n, k, num_sms)
