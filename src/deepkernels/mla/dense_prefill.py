"""Dense MHA-mode prefill: flash_attn_varlen_func & co. (FlashMLA SM100 surface, on Hopper)."""
from __future__ import annotations

__all__: list[str] = []
