"""MoE grouped GEMMs: m-grouped contiguous, m-grouped masked, k-grouped (DeepGEMM)."""
from __future__ import annotations

__all__: list[str] = []
