"""`deep_gemm.testing`: DeepGEMM's test utilities (``calc_diff``, ``count_bytes``) served by deepkernels.testing."""
from deepkernels.testing.numerics import calc_diff, count_bytes  # noqa: F401

__all__ = ["calc_diff", "count_bytes"]
