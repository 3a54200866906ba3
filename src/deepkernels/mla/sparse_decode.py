"""Sparse top-k MLA decode over FP8/FP4 KV caches (FlashMLA V3.2, MODEL1, V4.1, FP4)."""
from __future__ import annotations

__all__: list[str] = []
