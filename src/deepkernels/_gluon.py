"""The Gluon (``triton.experimental.gluon``, Triton 3.6) names the sm90 Gluon kernels use, imported in one place.

Gluon is experimental: this module stays importable when it is missing or its API moved (then ``available()`` is
False, ``IMPORT_ERROR`` says why, every name is None and :func:`jit` leaves functions undecorated), so every kernel
module can be imported — and its Triton fallback used — on any Triton.
"""
from __future__ import annotations

import types

try:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (async_copy, fence_async_shared, mbarrier, tma,
                                                                  warpgroup_mma, warpgroup_mma_wait)
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor
    IMPORT_ERROR: Exception | None = None
except Exception as _e:  # pragma: no cover - depends on the installed Triton
    IMPORT_ERROR = _e
    gluon = None
    gl = types.SimpleNamespace(constexpr=None)
    async_copy = fence_async_shared = mbarrier = tma = warpgroup_mma = warpgroup_mma_wait = TensorDescriptor = None

__all__ = ["gluon", "gl", "async_copy", "fence_async_shared", "mbarrier", "tma", "warpgroup_mma",
           "warpgroup_mma_wait", "TensorDescriptor", "IMPORT_ERROR", "available", "jit", "compile_sm90"]


def available() -> bool:
    """True when the Gluon imports succeeded (says nothing about the device)."""
    return IMPORT_ERROR is None


def jit(fn=None, **kwargs):
    """``gluon.jit`` (with its keyword arguments, e.g. ``do_not_specialize``) when Gluon imported, else identity."""
    if fn is None:
        return lambda f: jit(f, **kwargs)
    return gluon.jit(fn, **kwargs) if gluon is not None else fn


def compile_sm90(fn, signature: dict, constexprs: dict, div16=(), **options):
    """Cross-compile the Gluon kernel ``fn`` for sm90 on any machine (no GPU): ``signature`` maps every argument to
    its Triton type string (``"*bf16"``, ``"i32"``, ``"tensordesc<...>"``; constexpr names are added here),
    ``div16`` names the arguments a real launch sees as 16-divisible (pointers from the caching allocator, padded
    strides), ``options`` go to ``triton.compile`` (``num_warps``, ``maxnreg``). Returns the CompiledKernel (``.asm``
    holds TTGIR / PTX / cubin, ``.metadata.shared`` the shared memory bytes)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    sig = dict(signature)
    sig.update({k: "constexpr" for k in constexprs})
    attrs = {(fn.arg_names.index(p), ): [["tt.divisibility", 16]] for p in div16}
    src = GluonASTSource(fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
