"""deepkernels.quant: FP8/FP4/UE8M0 casting, scale-factor layouts and KV-cache formats, bit for bit with upstream.

- :mod:`.fp8`: DeepGEMM quantizers (``per_token_cast_to_fp8``, ``per_block_cast_to_fp8``, ...) and UE8M0 helpers.
- :mod:`.layout`: TMA-aligned / MN-major scale layouts and ``transform_sf_into_required_layout``.
"""
from . import fp8, layout
from .fp8 import *  # noqa: F401,F403
from .layout import *  # noqa: F401,F403

__all__ = [*fp8.__all__, *layout.__all__]
