"""Drop-in modules under the upstream names, so serving code written for DeepGEMM / FlashMLA runs unchanged.

    import deepkernels.compat
    deepkernels.compat.install()      # now `import deep_gemm` and `import flash_mla` resolve to deepkernels
    import deep_gemm, flash_mla

`install()` refuses to shadow a real, already-imported `deep_gemm`/`flash_mla` unless ``force=True``.
"""
from __future__ import annotations

import sys

__all__ = ["install", "uninstall"]

_NAMES = {"deep_gemm": "deepkernels.compat.deep_gemm", "flash_mla": "deepkernels.compat.flash_mla"}
# submodules upstream code imports: name -> (compat module, parent attribute)
_SUBMODULES = {"deep_gemm.utils": "deepkernels.compat.deep_gemm_utils",
               "deep_gemm.testing": "deepkernels.compat.deep_gemm_testing",
               "flash_mla.flash_mla_interface": "deepkernels.compat.flash_mla"}


def install(force: bool = False) -> None:
    """Register ``deep_gemm`` and ``flash_mla`` in ``sys.modules`` as the deepkernels compat modules.

    Raises RuntimeError if a different module of that name is already imported and ``force`` is False.
    """
    import importlib

    for name, target in _NAMES.items():
        mod = importlib.import_module(target)
        cur = sys.modules.get(name)
        if cur is not None and cur is not mod and not force:
            raise RuntimeError(f"a module named {name!r} is already imported from "
                               f"{getattr(cur, '__file__', '?')}; pass force=True to replace it")
        sys.modules[name] = mod
    for name, target in _SUBMODULES.items():
        sub = importlib.import_module(target)
        sys.modules[name] = sub
        parent, _, attr = name.partition(".")
        setattr(sys.modules[parent], attr, sub)


def uninstall() -> None:
    """Undo :func:`install` (only entries that point at the compat modules are removed)."""
    for key, target in {**_SUBMODULES, **_NAMES}.items():
        m = sys.modules.get(key)
        if m is not None and getattr(m, "__name__", "") == target:
            del sys.modules[key]
