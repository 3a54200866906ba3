"""deepkernels.quant: FP8/FP4/UE8M0 casting, scale-factor layouts and KV-cache formats, bit for bit with upstream.

- :mod:`.fp8`: DeepGEMM quantizers (``per_token_cast_to_fp8``, ``per_block_cast_to_fp8``, ...) and UE8M0 helpers.
- :mod:`.layout`: TMA-aligned / MN-major scale layouts and ``transform_sf_into_required_layout``.
- :mod:`.fp4`: e2m1 rounding/packing, e4m3-per-16 FP4 quantisation, DeepGEMM's ``per_token_cast_to_fp4``.
- :mod:`.kvcache`: FlashMLA paged KV-cache formats (v32 656 B, model1 584 B, v41 528 B, fp4 288 B).
"""
from . import fp4, fp8, kvcache, layout
from .fp4 import *  # noqa: F401,F403
from .fp8 import *  # noqa: F401,F403
from .kvcache import *  # noqa: F401,F403
from .layout import *  # noqa: F401,F403

__all__ = [*fp8.__all__, *layout.__all__, *fp4.__all__, *kvcache.__all__]
