"""PyTorch reference: dense paged MLA decode, split-KV partials and combine, scheduler metadata (FlashMLA)."""
from __future__ import annotations

__all__: list[str] = []
