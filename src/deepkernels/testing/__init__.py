"""Test helpers matching the upstream harnesses (DeepGEMM ``calc_diff``, FlashMLA ``check_is_allclose``)
and the sm90 compile-tier helper."""
from .compile import compile_sm90, CompiledSM90, SM90_SMEM_LIMIT  # noqa: F401
from .numerics import *  # noqa: F401,F403
