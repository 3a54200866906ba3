"""deepkernels: DeepGEMM- and FlashMLA-compatible kernels in Triton.

Every public op is re-exported here under its upstream name. With CUDA tensors an op launches its Triton
kernel; with CPU tensors it runs the PyTorch reference in :mod:`deepkernels.reference` (or the real kernel
through Triton's interpreter when ``TRITON_INTERPRET=1``).
"""
__version__ = "0.1.0"

from .quant import *  # noqa: F401,F403
from .gemm import *  # noqa: F401,F403
from .mla import *  # noqa: F401,F403
from . import quant, gemm, mla, reference, testing  # noqa: F401
from . import compat  # noqa: F401,E402  (deepkernels.compat.install(): `import deep_gemm` / `import flash_mla`)
from . import ops  # noqa: F401,E402  (torch.ops.deepkernels.* custom ops for torch.compile / CUDA graphs)
