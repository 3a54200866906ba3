"""`deep_gemm.utils`: DeepGEMM's pure-PyTorch quantization and layout helpers (served by deepkernels.quant)."""
from deepkernels.quant import *  # noqa: F401,F403
from deepkernels.quant import __all__  # noqa: F401
