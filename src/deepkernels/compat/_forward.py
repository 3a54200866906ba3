"""Lazy forwarding of upstream names to deepkernels functions (module-level ``__getattr__``)."""
from __future__ import annotations

import importlib


def make_getattr(module_name: str, upstream: str, mapping: dict[str, str], not_implemented: dict[str, str] = None):
    """``mapping``: upstream name -> 'module:attr' inside deepkernels. ``not_implemented``: upstream names deepkernels
    does not serve -> what they are; they raise AttributeError saying so (rather than a confusing ImportError at
    import time)."""
    not_implemented = not_implemented or {}

    def __getattr__(name: str):
        if name in not_implemented:
            raise AttributeError(f"{upstream}.{name} ({not_implemented[name]}) is not implemented by deepkernels; "
                                 f"see README 'Not implemented'")
        if name not in mapping:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        mod, _, attr = mapping[name].partition(":")
        try:
            return getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as e:
            raise AttributeError(f"{upstream}.{name} is not implemented by deepkernels yet ({e})") from None

    return __getattr__


def make_dir(mapping: dict[str, str], extra=()):
    """``__dir__`` for a forwarding module: the upstream names it serves."""

    def __dir__():
        return sorted({*mapping, *extra})

    return __dir__
