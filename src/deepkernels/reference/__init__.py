"""deepkernels.reference: the PyTorch definition of every op (float32/float64 math, CPU and GPU).

Kernels are tested against these; public ops fall back to them for CPU tensors."""
from . import gemm, grouped_gemm, mla, mla_sparse, mla_prefill  # noqa: F401
