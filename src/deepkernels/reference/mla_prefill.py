"""PyTorch reference: sparse MLA prefill and dense MHA-mode varlen prefill (FlashMLA)."""
from __future__ import annotations

__all__: list[str] = []
