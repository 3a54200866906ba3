"""`flash_mla`-named module: FlashMLA's Python API (docs/spec/mla.md §1) served by deepkernels.

Names are resolved lazily; an upstream name deepkernels does not implement raises AttributeError saying so.
"""
from ._forward import make_dir, make_getattr

__version__ = "1.0.0"  # the FlashMLA API revision these signatures follow

_MAP = {n: f"deepkernels:{n}" for n in [
    "get_mla_metadata", "flash_mla_with_kvcache", "flash_mla_sparse_fwd", "FlashMLASchedMeta",
    "flash_attn_varlen_func", "flash_attn_varlen_qkvpacked_func", "flash_attn_varlen_kvpacked_func",
]}

__all__ = sorted(_MAP)
__getattr__ = make_getattr(__name__, "flash_mla", _MAP)
__dir__ = make_dir(_MAP, ("flash_mla_interface",))
__path__: list[str] = []  # a package for the import system, so `flash_mla.flash_mla_interface` resolves
