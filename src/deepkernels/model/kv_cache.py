"""Paged latent KV cache for MLA: one ``[c_KV ‖ k_R]`` row per token, in FlashMLA's page layout.

Dense formats (``"bf16"``, ``"fp16"``; ``"fp32"``/``"fp64"`` for float references) store the rows as
``k_cache [num_blocks, page_block_size, 1, d_qk]`` — the tensor ``flash_mla_with_kvcache`` reads in its dense
mode. Packed formats (``"v32"`` 656 B, ``"model1"`` 584 B, ``"v41"`` 528 B, ``"fp4"`` 288 B per token;
docs/spec/mla.md §2) store what :func:`deepkernels.quant.quantize_kv_cache` produces for the page tensor.

Writes go to ``block_table[b, pos // page_block_size]``, row ``pos % page_block_size``. For a packed format the
new rows are encoded on their own with the quant helper and each token's byte records (MODEL1: its data
record and its scale record, which live in different regions of the page) are copied to its slot, following
the format geometry of :class:`deepkernels.quant.KVCacheFormat`. Earlier rows are never touched, so the cache
holds exactly what a one-shot quantization of all rows would (tests/test_model_mla.py checks it bit for bit).
"""
from __future__ import annotations

import copy

import torch

from .kv_accounting import KV_FORMAT_BYTES, KV_FORMAT_DIMS

__all__ = ["PagedLatentCache", "DENSE_FORMATS", "PACKED_FORMATS"]

DENSE_FORMATS = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32, "fp64": torch.float64}
PACKED_FORMATS = ("v32", "model1", "v41", "fp4")


def _quant():
    try:
        from deepkernels.quant import dequantize_kv_cache, quantize_kv_cache
    except ImportError as e:  # the quant helpers land separately
        raise NotImplementedError("packed KV formats need deepkernels.quant.quantize_kv_cache / "
                                  "dequantize_kv_cache, which are not available in this build") from e
    return quantize_kv_cache, dequantize_kv_cache


class PagedLatentCache:
    """A paged ``[c_KV ‖ k_R]`` cache for ``batch`` requests.

    Args:
        batch: number of requests b.
        max_seq_len: tokens each request may hold (sets ``max_blocks_per_seq``).
        d_qk: row width (``kv_lora_rank + qk_rope_head_dim``; 576 for V3). Packed formats fix it:
            576 for ``"v32"``, 512 for ``"model1"``, ``"v41"``, ``"fp4"``.
        fmt: one of :data:`DENSE_FORMATS` or :data:`PACKED_FORMATS`.
        page_block_size: tokens per page (FlashMLA dense decode needs 64).
        block_table: optional ``[batch, max_blocks_per_seq]`` int32 page ids (e.g. shuffled); the default gives
            request i the pages ``[i·m, (i+1)·m)``.
        num_blocks: pages allocated (default ``batch · max_blocks_per_seq`` or ``block_table.max() + 1``).
    Attributes:
        k_cache: the page tensor; block_table ``[b, m]`` int32; cache_seqlens ``[b]`` int32 (tokens written).
    Raises:
        ValueError for an unknown format, a d_qk the format cannot hold, or a block_table of the wrong shape.
    """

    def __init__(self, batch: int, max_seq_len: int, d_qk: int, fmt: str = "bf16", page_block_size: int = 64,
                 block_table: torch.Tensor | None = None, num_blocks: int | None = None, device=None):
        if fmt not in DENSE_FORMATS and fmt not in PACKED_FORMATS:
            raise ValueError(f"fmt must be one of {list(DENSE_FORMATS) + list(PACKED_FORMATS)}, got {fmt!r}")
        if fmt in PACKED_FORMATS and KV_FORMAT_DIMS[fmt][0] != d_qk:
            raise ValueError(f"format {fmt!r} stores d_qk={KV_FORMAT_DIMS[fmt][0]} rows, got d_qk={d_qk} "
                             f"(kv_lora_rank + qk_rope_head_dim)")
        if batch <= 0 or max_seq_len <= 0 or page_block_size <= 0:
            raise ValueError(f"batch, max_seq_len and page_block_size must be > 0, got {batch}, {max_seq_len}, "
                             f"{page_block_size}")
        self.fmt, self.d_qk, self.page_block_size, self.batch = fmt, d_qk, page_block_size, batch
        m = -(-max_seq_len // page_block_size)
        if block_table is None:
            block_table = torch.arange(batch * m, dtype=torch.int32, device=device).view(batch, m)
        elif block_table.dtype != torch.int32 or block_table.dim() != 2 or block_table.shape[0] != batch \
                or block_table.shape[1] < m:
            raise ValueError(f"block_table must be int32 [batch={batch}, >= {m}], got {block_table.dtype} "
                             f"{list(block_table.shape)}")
        self.block_table = block_table.to(device)
        if num_blocks is None:
            num_blocks = int(self.block_table.max()) + 1
        self.num_blocks = num_blocks
        self.max_seq_len = self.block_table.shape[1] * page_block_size
        self.cache_seqlens = torch.zeros(batch, dtype=torch.int32, device=device)
        shape = (num_blocks, page_block_size, 1, d_qk)
        if fmt in DENSE_FORMATS:
            self.k_cache = torch.zeros(shape, dtype=DENSE_FORMATS[fmt], device=device)
        else:
            quantize, _ = _quant()
            self.k_cache = quantize(torch.zeros(shape, dtype=torch.bfloat16, device=device), fmt)

    # ------------------------------------------------------------------------------------------------
    @property
    def is_packed(self) -> bool:
        return self.fmt in PACKED_FORMATS

    @property
    def bytes_per_token(self) -> int:
        """Bytes one token occupies in this cache (KV accounting; dense: d_qk × element size)."""
        if self.is_packed:
            return KV_FORMAT_BYTES[self.fmt]
        return self.d_qk * self.k_cache.element_size()

    def select(self, ids) -> "PagedLatentCache":
        """A cache over requests ``ids`` (a list or int64 tensor of request indices) that shares this cache's pages.

        Appending to it writes into the shared ``k_cache`` and advances this cache's ``cache_seqlens[ids]``, so
        requests can be prefilled separately (different lengths) and then decoded together.
        """
        ids = torch.as_tensor(ids, dtype=torch.long, device=self.cache_seqlens.device).flatten()
        if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= self.batch:
            raise ValueError(f"ids must be non-empty request indices in [0, {self.batch}), got {ids.tolist()}")
        sub = copy.copy(self)
        sub.block_table, sub.cache_seqlens, sub.batch = self.block_table[ids], self.cache_seqlens[ids], ids.numel()
        sub._parent = (self, ids)
        return sub

    def _slots(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """positions ``[b, s]`` → (page ids, rows in page), each ``[b, s]`` int64."""
        logical = positions // self.page_block_size
        pages = torch.gather(self.block_table.long(), 1, logical)
        return pages, positions % self.page_block_size

    def append(self, latent: torch.Tensor) -> torch.Tensor:
        """Write ``latent [b, s, d_qk]`` at each request's next ``s`` positions and advance ``cache_seqlens``.

        Rows are cast to the cache dtype (dense) or encoded with the format's quantizer (packed).
        Returns the positions written, ``[b, s]`` int64. Raises ValueError on a shape mismatch or overflow.
        """
        b, s = self.batch, latent.shape[1] if latent.dim() == 3 else -1
        if latent.dim() != 3 or latent.shape[0] != b or latent.shape[2] != self.d_qk:
            raise ValueError(f"latent must have shape [{b}, s, {self.d_qk}], got {list(latent.shape)}")
        start = self.cache_seqlens.long()
        if int((start + s).max()) > self.max_seq_len:
            raise ValueError(f"appending {s} tokens overflows the cache: lengths {start.tolist()}, "
                             f"capacity {self.max_seq_len}")
        positions = start[:, None] + torch.arange(s, device=start.device)
        pages, rows = self._slots(positions)
        if not self.is_packed:
            self.k_cache[pages.flatten(), rows.flatten(), 0] = latent.reshape(-1, self.d_qk).to(self.k_cache.dtype)
        else:
            self._write_packed(pages.flatten(), rows.flatten(), latent.reshape(-1, self.d_qk))
        self.cache_seqlens += s
        parent = getattr(self, "_parent", None)
        if parent is not None:
            parent[0].cache_seqlens[parent[1]] = self.cache_seqlens
        return positions

    def _write_packed(self, pages: torch.Tensor, rows: torch.Tensor, latent: torch.Tensor) -> None:
        """Encode n new rows on their own and copy each token's byte records to its (page, row) slot.

        Only the new tokens' records are touched: re-encoding a whole page is not idempotent (a tile whose
        amax sits just above a power of two, e.g. 3.52 → scale 2^-6, decodes to 3.5 and would re-encode
        with scale 2^-7), so earlier rows must never pass through quantize(dequantize(·)) again.
        """
        from deepkernels.quant import get_kv_format
        quantize, _ = _quant()
        f = get_kv_format(self.fmt)
        n, B = latent.shape[0], self.page_block_size
        tmp = quantize(latent.to(torch.bfloat16).view(1, n, 1, self.d_qk), f).view(torch.uint8)
        src = tmp.as_strided((f.block_bytes(n),), (1,), tmp.storage_offset())
        u = self.k_cache.view(torch.uint8)
        stride0 = u.stride(0) if self.num_blocks > 1 else f.default_block_stride(B)
        dst = u.as_strided((self.num_blocks * stride0,), (1,), u.storage_offset())
        k = torch.arange(n, device=latent.device)
        # data records (for non-split formats the whole token record: data, scales, RoPE)
        j = torch.arange(f.data_stride, device=latent.device)
        dst[(pages * stride0 + rows * f.data_stride)[:, None] + j] = src[(k * f.data_stride)[:, None] + j]
        if f.split_block:  # MODEL1: scale records live after the page's B data records
            j = torch.arange(f.scale_stride, device=latent.device)
            at = pages * stride0 + B * f.data_stride + rows * f.scale_stride
            dst[at[:, None] + j] = src[(n * f.data_stride + k * f.scale_stride)[:, None] + j]

    def read(self, i: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        """Request i's rows ``[cache_seqlens[i], d_qk]`` (packed formats dequantized to bf16), optionally cast."""
        n = int(self.cache_seqlens[i])
        npages = -(-n // self.page_block_size)
        pages = self.k_cache[self.block_table[i, :npages].long()]
        if self.is_packed:
            pages = _quant()[1](pages, self.fmt)
        rows = pages.reshape(-1, self.d_qk)[:n]
        return rows if dtype is None else rows.to(dtype)

    def dense_pages(self, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """The whole cache as dense ``[num_blocks, page_block_size, 1, d_qk]`` rows (packed: dequantized)."""
        if self.is_packed:
            return _quant()[1](self.k_cache, self.fmt).to(dtype)
        return self.k_cache.to(dtype)
