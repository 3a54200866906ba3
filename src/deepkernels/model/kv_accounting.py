"""KV-cache accounting: bytes per token per layer for MHA, GQA, MQA and MLA in BF16 and FlashMLA's packed formats.

Units: bytes (B); KiB = 1024 B. The ratio to MHA is reported as ``1/N`` with ``N = MHA bytes / scheme bytes``
rounded to the nearest integer, which is how the seed article prints it ("1/57" for 65536/1152 = 56.9).

Reproduces the "cache 账本" table of ``shared/seeds/deepgemm-flashmla-explained.zh.txt`` §6 for DeepSeek-V3
(128 heads × 128 dims, BF16), plus the packed formats of docs/spec/mla.md §2.1:

    MHA 64 KiB · GQA(8) 4 KiB · MQA 512 B · MLA BF16 1152 B · V3.2 FP8 656 B · MODEL1 584 B · V4.1 FP8 528 B ·
    V4.1 FP4 288 B

Where the seed's prose disagrees with its table (see benchmarks/notes/model.md):
- "8 组就是 8 KiB,省 8 倍" (GQA with 8 groups): 2·8·128·2 B = 4 KiB, 1/16 of MHA; the table's 4 KiB is right.
- 528 B (V4.1) and 288 B (FP4) rows are for a 512-dim latent with RoPE *inside* it (448 NoPE + 64 RoPE), not
  V3's 576-dim [512 ‖ 64] row; a V3-shaped row in those encodings would not be 528/288 B.
- "61 层就是约 3.9 MiB 每 token,128K 上下文要 500 GB": 61 × 64 KiB = 3.81 MiB (4.0 MB) per token, and
  × 131072 tokens = 488 GiB = 524 GB; the prose mixes binary and decimal units.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KV_FORMAT_BYTES", "KV_FORMAT_DIMS", "kv_bytes_per_token", "mha_bytes_per_token",
           "KVRow", "seed_table", "format_bytes", "kv_cache_bytes"]

#: Packed bytes per token of each latent-cache format (docs/spec/mla.md §2.1); "bf16" is the 576-dim dense row.
KV_FORMAT_BYTES = {
    "bf16": 576 * 2,                  # [512 c_KV ‖ 64 k_R] bf16
    "v32": 512 + 4 * 4 + 64 * 2,      # 512 e4m3 NoPE, 4 fp32 scales (tile 128), 64 bf16 RoPE = 656
    "model1": 448 + 64 * 2 + 7 + 1,   # 448 e4m3 NoPE, 64 bf16 RoPE, 7 ue8m0 scales (tile 64), 1 pad = 584
    "v41": 512 + 16,                  # 512 e4m3 (RoPE included), 16 ue8m0 scales (tile 32) = 528
    "fp4": 512 // 2 + 32,             # 512 e2m1 two per byte, 32 e4m3 scales (tile 16) = 288
}
#: (d_qk, d_v) of each format: the latent width it stores and the width the decode kernel returns as V.
KV_FORMAT_DIMS = {"bf16": (576, 512), "v32": (576, 512), "model1": (512, 512), "v41": (512, 512),
                  "fp4": (512, 512)}


def mha_bytes_per_token(num_kv_heads: int, head_dim: int, dtype_bytes: int = 2) -> int:
    """K and V of every KV head: ``2 · n_kv_heads · head_dim · sizeof(dtype)`` (MHA, GQA and MQA alike)."""
    for name, v in (("num_kv_heads", num_kv_heads), ("head_dim", head_dim), ("dtype_bytes", dtype_bytes)):
        if v <= 0:
            raise ValueError(f"{name} must be > 0, got {v}")
    return 2 * num_kv_heads * head_dim * dtype_bytes


def kv_bytes_per_token(scheme: str, *, num_heads: int = 128, head_dim: int = 128, groups: int = 8,
                       kv_lora_rank: int = 512, qk_rope_head_dim: int = 64, dtype_bytes: int = 2) -> int:
    """Bytes per token per layer of ``scheme``.

    Schemes: ``"mha"`` (num_heads KV heads), ``"gqa"`` (``groups`` KV heads), ``"mqa"`` (1 KV head), ``"mla"``
    (one ``kv_lora_rank + qk_rope_head_dim`` row at ``dtype_bytes``), or a packed latent format name in
    :data:`KV_FORMAT_BYTES` (``"bf16"``, ``"v32"``, ``"model1"``, ``"v41"``, ``"fp4"``; fixed sizes from
    FlashMLA, docs/spec/mla.md §2.1). Raises ValueError for an unknown scheme.
    """
    if scheme == "mha":
        return mha_bytes_per_token(num_heads, head_dim, dtype_bytes)
    if scheme == "gqa":
        if num_heads % groups:
            raise ValueError(f"GQA needs num_heads % groups == 0, got {num_heads} % {groups}")
        return mha_bytes_per_token(groups, head_dim, dtype_bytes)
    if scheme == "mqa":
        return mha_bytes_per_token(1, head_dim, dtype_bytes)
    if scheme == "mla":
        return (kv_lora_rank + qk_rope_head_dim) * dtype_bytes
    if scheme in KV_FORMAT_BYTES:
        return KV_FORMAT_BYTES[scheme]
    raise ValueError(f"unknown KV scheme {scheme!r}; expected mha, gqa, mqa, mla or one of {list(KV_FORMAT_BYTES)}")


def kv_cache_bytes(scheme: str, tokens: int, layers: int = 61, **kw) -> int:
    """Whole-model cache size in bytes for ``tokens`` tokens over ``layers`` layers (V3 has 61)."""
    return kv_bytes_per_token(scheme, **kw) * tokens * layers


def format_bytes(n: int) -> str:
    """``65536 -> '64 KiB'``, ``1152 -> '1152 B'``: KiB only for exact multiples of 1024."""
    return f"{n // 1024} KiB" if n >= 1024 and n % 1024 == 0 else f"{n} B"


@dataclass(frozen=True)
class KVRow:
    scheme: str
    label: str
    bytes_per_token: int
    ratio_to_mha: float   # MHA bytes / this scheme's bytes

    @property
    def ratio_str(self) -> str:
        r = round(self.ratio_to_mha)
        return "1×" if r == 1 else f"1/{r}"


def seed_table(num_heads: int = 128, head_dim: int = 128, groups: int = 8) -> list[KVRow]:
    """The seed's table for DeepSeek-V3 (plus the MODEL1 and FP4 rows), in order:
    MHA, GQA(8), MQA, MLA BF16, V3.2 FP8, MODEL1 FP8, V4.1 FP8, V4.1 FP4."""
    mha = kv_bytes_per_token("mha", num_heads=num_heads, head_dim=head_dim)
    spec = [("mha", f"MHA ({num_heads} heads × {head_dim} dims, BF16)"),
            ("gqa", f"GQA ({groups} groups)"),
            ("mqa", "MQA (1 group)"),
            ("mla", "MLA (512 + 64, BF16)"),
            ("v32", "MLA V3.2 FP8 (512 e4m3 + 4 fp32 + 64 bf16)"),
            ("model1", "MLA MODEL1 FP8 (448 e4m3 + 64 bf16 + 8)"),
            ("v41", "MLA V4.1 FP8 (512 e4m3 + 16 ue8m0)"),
            ("fp4", "MLA V4.1 FP4 (512 e2m1 + 32 e4m3)")]
    rows = []
    for scheme, label in spec:
        b = kv_bytes_per_token(scheme, num_heads=num_heads, head_dim=head_dim, groups=groups)
        rows.append(KVRow(scheme, label, b, mha / b))
    return rows
