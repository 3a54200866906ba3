"""PyTorch reference: m-grouped contiguous/masked and k-grouped GEMMs (DeepGEMM)."""
from __future__ import annotations

__all__: list[str] = []
