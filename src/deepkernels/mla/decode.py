"""MLA decode entry points: get_mla_metadata, FlashMLASchedMeta, flash_mla_with_kvcache (FlashMLA)."""
from __future__ import annotations

__all__: list[str] = []
