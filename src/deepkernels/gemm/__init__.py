"""deepkernels.gemm: DeepGEMM-compatible FP8/BF16 dense and grouped GEMMs."""
from .dense import *  # noqa: F401,F403
from .grouped import *  # noqa: F401,F403
from . import dense as _dense, grouped as _grouped

__all__ = [*_dense.__all__, *_grouped.__all__]
