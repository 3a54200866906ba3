"""FP8 and BF16 dense GEMMs (DeepGEMM fp8_gemm_nt & co., bf16_gemm_nt & co., runtime knobs)."""
from __future__ import annotations

__all__: list[str] = []
