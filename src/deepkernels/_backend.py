"""Backend selection shared by every public op.

A public op runs its Triton kernel when all its tensors live on a CUDA device, or, on any device, when
Triton's interpreter is on (``TRITON_INTERPRET=1`` set before ``deepkernels`` is imported; that is how the
``interpret`` test tier drives the real kernels on the CPU). Otherwise it runs the PyTorch reference in
:mod:`deepkernels.reference`, so the whole API works on a machine with no GPU.
"""
from __future__ import annotations

import os

import torch

__all__ = ["interpret_mode", "use_kernels", "ensure_tma_allocator", "device_of", "gluon_disabled", "GLUON_KERNELS"]


def interpret_mode() -> bool:
    """True when Triton kernels run in the CPU interpreter (``TRITON_INTERPRET=1``)."""
    try:
        from triton import knobs

        return bool(knobs.runtime.interpret)
    except Exception:  # pragma: no cover - older triton
        return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def device_of(*tensors: torch.Tensor | None) -> torch.device:
    """The one device all given tensors share; raises ValueError naming the devices otherwise."""
    devs = {t.device for t in tensors if t is not None}
    if len(devs) > 1:
        raise ValueError(f"all tensors must be on one device, got {sorted(str(d) for d in devs)}")
    return devs.pop() if devs else torch.device("cpu")


def use_kernels(*tensors: torch.Tensor | None) -> bool:
    """Whether a public op should launch its Triton kernel for these tensors (see module docstring)."""
    dev = device_of(*tensors)
    if os.environ.get("DEEPKERNELS_FORCE_REFERENCE", "0") not in ("", "0"):
        return False
    if dev.type == "cuda":
        return True
    return interpret_mode()


_ALLOCATOR_SET = False


def ensure_tma_allocator() -> None:
    """Install a torch-backed allocator for Triton's device-side TMA descriptors (``tl.make_tensor_descriptor``)."""
    global _ALLOCATOR_SET
    if _ALLOCATOR_SET:
        return
    import triton

    def _alloc(size: int, alignment: int, stream):
        dev = "cuda" if torch.cuda.is_available() and not interpret_mode() else "cpu"
        return torch.empty(size, device=dev, dtype=torch.int8)

    triton.set_allocator(_alloc)
    _ALLOCATOR_SET = True


GLUON_KERNELS = ("gemm", "gemm_small", "grouped_gemm", "dense_decode", "sparse_decode", "sparse_prefill",
                 "dense_prefill")


def gluon_disabled(kernel: str) -> bool:
    """``DEEPKERNELS_DISABLE_GLUON``: unset / ``0`` = every sm90 Gluon kernel may run; ``1`` (or ``all``) = none;
    otherwise a comma-separated list of the kernels to keep on Triton, from :data:`GLUON_KERNELS`
    (e.g. ``DEEPKERNELS_DISABLE_GLUON=sparse_decode``)."""
    v = os.environ.get("DEEPKERNELS_DISABLE_GLUON", "").strip().lower()
    if v in ("", "0"):
        return False
    if v in ("1", "all", "true"):
        return True
    return kernel in {x.strip() for x in v.split(",")}
