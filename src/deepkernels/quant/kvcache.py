"""Paged MLA KV-cache formats of FlashMLA, byte for byte: V3.2 (656 B), MODEL1 (584 B), V4.1 FP8 (528 B), V4.1 FP4 (288 B).

Source of the semantics: FlashMLA ``tests/quant.py`` at ``9241ae3`` and the [2026-09+] revisions (docs/spec/mla.md §2).

Byte layouts (per token unless said otherwise; ``B`` = page_block_size; all offsets in bytes):

=======  ====  ======================================================================================================
format   B/tok layout
=======  ====  ======================================================================================================
v32      656   ``[0,512)`` 512 e4m3 NoPE · ``[512,528)`` 4 fp32 power-of-two scales (tile 128) · ``[528,656)`` 64 bf16
               RoPE. Decoded K = 576 dims ``[NoPE ‖ RoPE]``; V = the 512 NoPE dims.
model1   584   **per page block, two regions**: ``[0, B·576)`` B records ``[448 e4m3 NoPE][64 bf16 RoPE]``, then
               ``[B·576, B·584)`` B records ``[7 UE8M0 scales (tile 64)][1 pad byte]``. K = V = 512 dims. Block stride
               is padded to a multiple of 576 bytes (``ceil(B·584/576)·576``, what SM100 requires).
v41      528   ``[0,512)`` 512 e4m3 for all dims, RoPE (dims 448..511) included · ``[512,528)`` 16 UE8M0 scales
               (tile 32). K = V = 512 dims.
fp4      288   ``[0,256)`` 512 e2m1, two per byte, even index in the low nibble · ``[256,288)`` 32 e4m3 scales
               (tile 16). K = V = 512 dims (the V4.1 extra cache).
=======  ====  ======================================================================================================

Addressing (what a kernel computes; :class:`KVCacheFormat` gives the numbers): for token ``r`` of page block
``blk`` in a cache whose ``stride(0)`` is ``S`` bytes,

- quantised data at ``blk*S + r*fmt.data_stride + fmt.data_offset``,
- its scales at ``blk*S + fmt.scales_start(B) + r*fmt.scale_stride``,
- bf16 RoPE (v32, model1) at ``blk*S + r*fmt.data_stride + fmt.rope_offset``.

Quantisation (FP8 formats): per token and tile, ``amax`` of the bf16 input in FP32,
``s = 2^ceil(log2(max(amax/448, 1e-4)))`` (a power of two rounded up; an all-zero tile gives ``2^-13``; NaN
gives a NaN scale), ``q = e4m3(x.float() / s)`` (RNE; ``|x/s| <= 448`` by construction). The power of two is taken
from the FP32 bits (exact), which equals FlashMLA's float ``log2``/``ceil``/``pow`` for every bf16 input (tested
exhaustively). FP4: :func:`deepkernels.quant.fp4.quantize_fp4_e2m1`.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import NamedTuple, Optional, Union

import torch

from .._validate import check_tensor
from .fp4 import dequantize_fp4_e2m1, quantize_fp4_e2m1
from .fp8 import E4M3_MAX, ceil_to_ue8m0

__all__ = [
    "KVCacheFormat", "KV_FORMATS", "get_kv_format", "kv_format_from_bytes_per_token", "quantize_kv_cache",
    "dequantize_kv_cache", "kv_cache_views", "KVCacheViews", "abs_indices_to_kvcache_indices",
]


@dataclass(frozen=True)
class KVCacheFormat:
    """Byte geometry of one paged KV-cache format (all sizes in bytes unless named ``d_*``/``num_*``).

    Attributes:
        name: ``"v32"``, ``"model1"``, ``"v41"`` or ``"fp4"``.
        bytes_per_token: last dim of the cache tensor (656, 584, 528, 288).
        d_qk, d_v: decoded K / V widths (V = first ``d_v`` dims of K).
        d_nope, d_rope: dims without / with rotary embedding (``d_nope + d_rope == d_qk``).
        d_quant: dims stored quantised (v32/model1: the NoPE dims; v41/fp4: all 512, RoPE included).
        tile_size, num_tiles: quantisation tile (elements per scale) and tiles per token.
        data_kind: ``"e4m3"`` or ``"e2m1"`` (two per byte).
        scale_kind: ``"fp32"`` (4 B), ``"ue8m0"`` (1 B, value ``2^(byte-127)``) or ``"e4m3"`` (1 B).
        split_block: MODEL1's per-page-block split into a data region then a scale region.
        data_stride: bytes from one token's data record to the next (656 / 576 / 528 / 288).
        data_offset: offset of the quantised data in a data record (0).
        data_bytes: bytes of quantised data per token (512 / 448 / 512 / 256).
        rope_offset: offset of the bf16 RoPE in a data record (528 / 448), ``None`` when RoPE is quantised.
        scale_offset: offset of the scales in a token record (512 / 0 / 512 / 256; MODEL1: in its scale record).
        scale_stride: bytes between the scale records of consecutive tokens (656 / 8 / 528 / 288).
        scale_bytes: bytes of real scales per token (16 / 7 / 16 / 32); MODEL1 has 1 pad byte after them.
    """
    name: str
    bytes_per_token: int
    d_qk: int
    d_v: int
    d_nope: int
    d_rope: int
    d_quant: int
    tile_size: int
    num_tiles: int
    data_kind: str
    scale_kind: str
    split_block: bool
    data_stride: int
    data_offset: int
    data_bytes: int
    rope_offset: Optional[int]
    scale_offset: int
    scale_stride: int
    scale_bytes: int

    def scales_start(self, page_block_size: int) -> int:
        """Offset, from the start of a page block, of token 0's scales (MODEL1: ``B*576``; else ``scale_offset``)."""
        return page_block_size * self.data_stride + self.scale_offset if self.split_block else self.scale_offset

    def block_bytes(self, page_block_size: int) -> int:
        """Bytes of one page block's payload: ``B * bytes_per_token``."""
        return page_block_size * self.bytes_per_token

    def default_block_stride(self, page_block_size: int) -> int:
        """``stride(0)`` (bytes) :func:`quantize_kv_cache` uses: MODEL1 rounds up to a multiple of 576 (as FlashMLA's
        tests and SM100 require); the others are dense."""
        b = self.block_bytes(page_block_size)
        return -(-b // 576) * 576 if self.split_block else b

    def data_address(self, block: int, row: int, block_stride: int) -> int:
        """Byte address (from the cache base) of the quantised data of token ``row`` in page block ``block``."""
        return block * block_stride + row * self.data_stride + self.data_offset

    def scale_address(self, block: int, row: int, block_stride: int, page_block_size: int) -> int:
        """Byte address of the first scale of token ``row`` in page block ``block``."""
        return block * block_stride + self.scales_start(page_block_size) + row * self.scale_stride

    def rope_address(self, block: int, row: int, block_stride: int) -> Optional[int]:
        """Byte address of the bf16 RoPE of token ``row`` (``None`` for v41/fp4, whose RoPE is quantised)."""
        if self.rope_offset is None:
            return None
        return block * block_stride + row * self.data_stride + self.rope_offset


KV_FORMATS = {
    "v32": KVCacheFormat("v32", 656, 576, 512, 512, 64, 512, 128, 4, "e4m3", "fp32", False,
                         656, 0, 512, 528, 512, 656, 16),
    "model1": KVCacheFormat("model1", 584, 512, 512, 448, 64, 448, 64, 7, "e4m3", "ue8m0", True,
                            576, 0, 448, 448, 0, 8, 7),
    "v41": KVCacheFormat("v41", 528, 512, 512, 448, 64, 512, 32, 16, "e4m3", "ue8m0", False,
                         528, 0, 512, None, 512, 528, 16),
    "fp4": KVCacheFormat("fp4", 288, 512, 512, 448, 64, 512, 16, 32, "e2m1", "e4m3", False,
                         288, 0, 256, None, 256, 288, 32),
}
_BY_BYTES = {f.bytes_per_token: name for name, f in KV_FORMATS.items()}


def get_kv_format(fmt: Union[str, KVCacheFormat]) -> KVCacheFormat:
    """The :class:`KVCacheFormat` for a name (``"v32"``, ``"model1"``, ``"v41"``, ``"fp4"``; case-insensitive,
    ``"v3.2"``/``"v4.1"`` accepted) or the object itself. Raises ValueError for an unknown name."""
    if isinstance(fmt, KVCacheFormat):
        return fmt
    key = str(fmt).lower().replace(".", "").replace("_", "")
    if key not in KV_FORMATS:
        raise ValueError(f"fmt must be one of {sorted(KV_FORMATS)}, got {fmt!r}")
    return KV_FORMATS[key]


def kv_format_from_bytes_per_token(bytes_per_token: int) -> str:
    """Format name from a cache's last dim: 656 -> ``"v32"``, 584 -> ``"model1"``, 528 -> ``"v41"``, 288 -> ``"fp4"``.

    Raises ValueError for any other size (a BF16 cache has 576 or 512 *elements*, not bytes, per token).
    """
    if bytes_per_token not in _BY_BYTES:
        raise ValueError(f"bytes_per_token must be one of {sorted(_BY_BYTES)} (fp8/fp4 KV caches), "
                         f"got {bytes_per_token}")
    return _BY_BYTES[bytes_per_token]


def _pow2_scale(amax: torch.Tensor) -> torch.Tensor:
    """FlashMLA's ``2^ceil(log2(max(amax/448, 1e-4)))`` with the power of two taken exactly from the FP32 bits.

    NaN stays NaN and inf stays inf (as with ``torch.pow``/``log2``)."""
    s = (amax / E4M3_MAX).clamp(min=1e-4)
    return torch.where(torch.isfinite(s), ceil_to_ue8m0(s), s)


def _ue8m0_bytes(s: torch.Tensor) -> torch.Tensor:
    """Exponent byte of a power-of-two FP32 scale; NaN/inf -> 0xFF (the e8m0 NaN)."""
    b = ((s.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    return torch.where(torch.isfinite(s), b, torch.full_like(b, 0xFF))


def _as_bytes(t: torch.Tensor, last: int) -> torch.Tensor:
    return t.contiguous().view(torch.uint8).reshape(*t.shape[:-1], last)


def quantize_kv_cache(kv: torch.Tensor, fmt: Union[str, KVCacheFormat], *,
                      block_stride: Optional[int] = None) -> torch.Tensor:
    """Quantise a BF16 paged KV cache into one of FlashMLA's FP8/FP4 formats (FlashMLA ``quantize_k_cache``).

    Args:
        kv: bfloat16 ``[num_blocks, page_block_size, 1, d_qk]`` (``d_qk`` 576 for ``"v32"``, 512 otherwise), any
            strides.
        fmt: ``"v32"``, ``"model1"``, ``"v41"``, ``"fp4"`` or a :class:`KVCacheFormat`.
        block_stride: bytes between page blocks (``stride(0)`` of the result); default
            :meth:`KVCacheFormat.default_block_stride`. A larger value gives a deliberately non-contiguous cache
            like FlashMLA's tests (V3.2 there: ``(B+1)*656``).
    Returns:
        float8_e4m3fn ``[num_blocks, page_block_size, 1, bytes_per_token]`` with strides
        ``(block_stride, bytes_per_token, bytes_per_token, 1)`` (a byte container: view it as uint8 for the raw
        bytes). Bytes not defined by the format (MODEL1's pad byte, block padding) are zero.
    Raises:
        TypeError if ``kv`` is not bfloat16; ValueError for a wrong rank, ``h_kv != 1``, a wrong ``d_qk``, an
        unknown format or a ``block_stride`` smaller than a block.
    """
    f = get_kv_format(fmt)
    check_tensor("kv", kv, ndim=4, dtype=torch.bfloat16)
    nb, bsz, h, d = kv.shape
    if h != 1 or d != f.d_qk:
        raise ValueError(f"kv must have shape [num_blocks, page_block_size, 1, {f.d_qk}] for fmt {f.name!r}, "
                         f"got {list(kv.shape)}")
    stride0 = f.default_block_stride(bsz) if block_stride is None else int(block_stride)
    if stride0 < f.block_bytes(bsz):
        raise ValueError(f"block_stride must be >= {f.block_bytes(bsz)} bytes for page_block_size={bsz} and fmt "
                         f"{f.name!r}, got {stride0}")
    x = kv.reshape(nb, bsz, d)
    buf = torch.zeros((max(nb, 1) * stride0,), dtype=torch.uint8, device=kv.device)
    blocks = buf[: nb * stride0].view(nb, stride0)
    payload = blocks[:, : f.block_bytes(bsz)]
    if f.split_block:
        data = payload[:, : bsz * f.data_stride].view(nb, bsz, f.data_stride)
        scale_rec = payload[:, bsz * f.data_stride:].view(nb, bsz, f.scale_stride)
    else:
        data = scale_rec = payload.view(nb, bsz, f.bytes_per_token)
    sc = slice(f.scale_offset, f.scale_offset + f.scale_bytes)
    if f.data_kind == "e2m1":
        packed, scales = quantize_fp4_e2m1(x, f.tile_size)
        data[..., f.data_offset:f.data_offset + f.data_bytes] = packed
        scale_rec[..., sc] = scales.view(torch.uint8)
    else:
        xt = x[..., : f.d_quant].reshape(nb, bsz, f.num_tiles, f.tile_size)
        s = _pow2_scale(xt.abs().amax(dim=-1).float())
        q = (xt.float() / s.unsqueeze(-1)).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        data[..., f.data_offset:f.data_offset + f.data_bytes] = q.view(torch.uint8).reshape(nb, bsz, f.d_quant)
        scale_rec[..., sc] = _as_bytes(s, 4 * f.num_tiles) if f.scale_kind == "fp32" else _ue8m0_bytes(s)
        if f.rope_offset is not None:
            data[..., f.rope_offset:f.rope_offset + 2 * f.d_rope] = _as_bytes(x[..., f.d_quant:], 2 * f.d_rope)
    return buf.view(torch.float8_e4m3fn).as_strided(
        (nb, bsz, 1, f.bytes_per_token), (stride0, f.bytes_per_token, f.bytes_per_token, 1))


class KVCacheViews(NamedTuple):
    """Typed parts of a packed cache, each ``[num_blocks, page_block_size, ...]`` (``data`` is a view of the cache;
    ``scales`` and ``rope`` are small copies, since their byte offsets need not be aligned to their dtype).

    data: uint8 ``[.., data_bytes]`` (e4m3 bytes, or packed e2m1); scales: float32 ``[.., 4]`` (v32),
    float8_e8m0fnu ``[.., num_tiles]`` (model1, v41) or float8_e4m3fn ``[.., 32]`` (fp4); rope: bfloat16
    ``[.., 64]`` or ``None``.
    """
    data: torch.Tensor
    scales: torch.Tensor
    rope: Optional[torch.Tensor]


def _check_packed(packed: torch.Tensor, f: Optional[KVCacheFormat], name: str = "packed") -> KVCacheFormat:
    check_tensor(name, packed, ndim=4, dtype=(torch.float8_e4m3fn, torch.uint8, torch.int8))
    if f is None:
        f = KV_FORMATS[kv_format_from_bytes_per_token(packed.size(-1))]
    nb, bsz, h, bpt = packed.shape
    if h != 1 or bpt != f.bytes_per_token:
        raise ValueError(f"{name} must have shape [num_blocks, page_block_size, 1, {f.bytes_per_token}] for fmt "
                         f"{f.name!r}, got {list(packed.shape)}")
    if (bsz > 1 and packed.stride(1) != bpt) or packed.stride(3) != 1:
        raise ValueError(f"{name} must have stride(1) == {bpt} (bytes_per_token) and stride(3) == 1, got strides "
                         f"{list(packed.stride())}")
    if nb > 1 and packed.stride(0) < f.block_bytes(bsz):
        raise ValueError(f"{name} stride(0) must be >= {f.block_bytes(bsz)} bytes (one page block), got "
                         f"{packed.stride(0)}")
    return f


def kv_cache_views(packed: torch.Tensor, fmt: Union[str, KVCacheFormat, None] = None) -> KVCacheViews:
    """Split a packed cache into typed data / scale / RoPE views, following the format's byte layout.

    Args:
        packed: float8_e4m3fn/uint8/int8 ``[num_blocks, page_block_size, 1, bytes_per_token]``,
            ``stride(1) == bytes_per_token``, ``stride(3) == 1``, any ``stride(0)`` covering a block.
        fmt: format name or object; ``None`` detects it from ``bytes_per_token``.
    Returns:
        :class:`KVCacheViews`.
    Raises:
        ValueError/TypeError for a wrong shape, stride or dtype.
    """
    f = _check_packed(packed, None if fmt is None else get_kv_format(fmt))
    nb, bsz = packed.shape[:2]
    u = packed.view(torch.uint8)
    s0 = u.stride(0) if nb > 1 else f.default_block_stride(bsz)
    blk = u.as_strided((nb, f.block_bytes(bsz)), (s0, 1), u.storage_offset())
    if f.split_block:
        data_rec = blk[:, : bsz * f.data_stride].unflatten(1, (bsz, f.data_stride))
        scale_rec = blk[:, bsz * f.data_stride:].unflatten(1, (bsz, f.scale_stride))
    else:
        data_rec = scale_rec = blk.unflatten(1, (bsz, f.bytes_per_token))
    data = data_rec[..., f.data_offset:f.data_offset + f.data_bytes]
    raw_scales = scale_rec[..., f.scale_offset:f.scale_offset + f.scale_bytes]
    scale_dtype = {"fp32": torch.float32, "ue8m0": torch.float8_e8m0fnu, "e4m3": torch.float8_e4m3fn}[f.scale_kind]
    scales = raw_scales.contiguous().view(scale_dtype)
    rope = None
    if f.rope_offset is not None:
        rope = data_rec[..., f.rope_offset:f.rope_offset + 2 * f.d_rope].contiguous().view(torch.bfloat16)
    return KVCacheViews(data, scales, rope)


def dequantize_kv_cache(packed: torch.Tensor, fmt: Union[str, KVCacheFormat, None] = None, *,
                        numerics: str = "reference") -> torch.Tensor:
    """Decode a packed cache back to BF16 K (FlashMLA ``dequantize_k_cache``).

    Numerics (docs/spec/mla.md §2.4-2.5):

    - v32, ``numerics="reference"`` (FlashMLA's test dequant): ``bf16(fp32(e4m3) * fp32 scale)``, one rounding.
      ``numerics="sm90"`` (what the SM90 sparse-decode kernel computes): ``bf16(e4m3) * bf16_rn(scale)`` rounded to
      bf16. The two agree bit for bit whenever the scales are powers of two (everything :func:`quantize_kv_cache`
      writes); they differ for foreign caches holding non-power-of-two scales (edge case B19).
    - model1, v41: ``bf16(e4m3) * bf16(e8m0)`` (exact).
    - fp4: ``value(e2m1) * float(e4m3 scale)`` (exact in bf16).
    - RoPE (v32, model1) is copied.

    Args:
        packed: ``[num_blocks, page_block_size, 1, bytes_per_token]`` as accepted by :func:`kv_cache_views`.
        fmt: format name or object; ``None`` detects it from ``bytes_per_token``.
        numerics: ``"reference"`` or ``"sm90"`` (only changes v32 with non-power-of-two scales).
    Returns:
        bfloat16 ``[num_blocks, page_block_size, 1, d_qk]`` contiguous.
    Raises:
        ValueError/TypeError for a wrong shape, stride, dtype, format or ``numerics``.
    """
    if numerics not in ("reference", "sm90"):
        raise ValueError(f"numerics must be 'reference' or 'sm90', got {numerics!r}")
    f = _check_packed(packed, None if fmt is None else get_kv_format(fmt))
    v = kv_cache_views(packed, f)
    nb, bsz = packed.shape[:2]
    out = torch.empty((nb, bsz, f.d_qk), dtype=torch.bfloat16, device=packed.device)
    if f.data_kind == "e2m1":
        out[:] = dequantize_fp4_e2m1(v.data, v.scales, f.tile_size)
    else:
        q = v.data.contiguous().view(torch.float8_e4m3fn).reshape(nb, bsz, f.num_tiles, f.tile_size)
        if f.scale_kind == "fp32" and numerics == "reference":
            deq = (q.float() * v.scales.unsqueeze(-1)).to(torch.bfloat16)
        else:
            deq = q.to(torch.bfloat16) * v.scales.to(torch.bfloat16).unsqueeze(-1)
        out[..., : f.d_quant] = deq.reshape(nb, bsz, f.d_quant)
        if v.rope is not None:
            out[..., f.d_quant:] = v.rope
    return out.view(nb, bsz, 1, f.d_qk)


def abs_indices_to_kvcache_indices(abs_indices: torch.Tensor, block_table: torch.Tensor,
                                   page_block_size: int) -> torch.Tensor:
    """Map logical token positions to physical cache rows (FlashMLA ``abs_indices2indices_in_kvcache``).

    ``out[b, ...] = block_table[b, a // B] * B + a % B`` for ``a = abs_indices[b, ...]``; ``-1`` stays ``-1``.
    Beyond upstream (which would fault or raise), any other negative ``a`` or ``a // B >= block_table.size(1)``
    also gives ``-1`` (invalid), so junk indices can never address a random block; with int32 ``abs_indices``, a
    physical row that does not fit in int32 (a junk block-table entry such as 2147480000) is ``-1`` too instead of
    wrapping around to a real-looking row. No host sync.

    Args:
        abs_indices: int32/int64 ``[b, s_q, topk]`` (any shape ``[b, ...]``), logical positions ``0 .. s_k-1``.
        block_table: int32/int64 ``[b, max_blocks_per_seq]``.
        page_block_size: ``B``, tokens per page block: a positive int (Python or NumPy); ValueError otherwise.
    Returns:
        Tensor of ``abs_indices``' shape and dtype (computed in int64).
    Raises:
        TypeError for non-integer dtypes; ValueError for mismatched batch sizes or a bad ``page_block_size``.
    """
    check_tensor("abs_indices", abs_indices, dtype=(torch.int32, torch.int64))
    check_tensor("block_table", block_table, ndim=2, dtype=(torch.int32, torch.int64))
    if abs_indices.dim() < 1 or abs_indices.size(0) != block_table.size(0):
        raise ValueError(f"abs_indices [b, ...] and block_table [b, max_blocks] must share b, got "
                         f"{list(abs_indices.shape)} and {list(block_table.shape)}")
    if isinstance(page_block_size, bool) or not isinstance(page_block_size, numbers.Integral) or page_block_size <= 0:
        raise ValueError(f"page_block_size must be a positive int, got {page_block_size!r}")
    page_block_size = int(page_block_size)   # NumPy ints as the int they equal
    b, max_blocks = block_table.shape
    # [b, per-request count] (explicit: reshape(b, -1) cannot infer -1 for b == 0, an empty batch)
    a = abs_indices.to(torch.int64).reshape(b, math.prod(abs_indices.shape[1:]))
    blk = torch.div(a, page_block_size, rounding_mode="floor")
    valid = (a >= 0) & (blk < max_blocks)
    if max_blocks == 0:
        phys = torch.zeros_like(a)
    else:
        phys = torch.gather(block_table.to(torch.int64), 1, torch.where(valid, blk, torch.zeros_like(blk)))
    row = phys * page_block_size + a % page_block_size
    if abs_indices.dtype == torch.int32:  # a row that int32 cannot hold (junk block-table entry) is invalid, never
        valid &= (row >= 0) & (row < 2 ** 31)  # wrapped into a real-looking row (edge case B51 kind)
    out = torch.where(valid, row, torch.full_like(a, -1))
    return out.to(abs_indices.dtype).reshape(abs_indices.shape)
