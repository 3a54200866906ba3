"""PyTorch reference: dense FP8/BF16 GEMM semantics (DeepGEMM)."""
from __future__ import annotations

__all__: list[str] = []
