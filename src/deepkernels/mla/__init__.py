"""deepkernels.mla: FlashMLA-compatible MLA decode (dense, sparse) and prefill."""
from .decode import *  # noqa: F401,F403
from .sparse_decode import *  # noqa: F401,F403
from .prefill import *  # noqa: F401,F403
from .dense_prefill import *  # noqa: F401,F403
from . import decode as _d, sparse_decode as _s, prefill as _p, dense_prefill as _dp

__all__ = [*_d.__all__, *_s.__all__, *_p.__all__, *_dp.__all__]
