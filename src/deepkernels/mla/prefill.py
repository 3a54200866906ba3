"""Sparse top-k MLA prefill: flash_mla_sparse_fwd (FlashMLA)."""
from __future__ import annotations

__all__: list[str] = []
