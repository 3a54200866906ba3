"""PyTorch reference: sparse top-k MLA decode over FP8/FP4 KV formats (FlashMLA)."""
from __future__ import annotations

__all__: list[str] = []
