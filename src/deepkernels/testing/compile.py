"""Compile tier helper: cross-compile a Triton kernel for sm90 on any machine (no GPU needed).

``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`` runs the whole NVIDIA pipeline on the
CPU (ptxas ships in the Triton wheel) and returns TTGIR, PTX and cubin, so tests can assert what must be in a
production config: wgmma, TMA bulk copies, shared memory under the 227 KB limit, no local memory.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

__all__ = ["compile_sm90", "CompiledSM90", "SM90_SMEM_LIMIT", "nvidia_tool", "ptxas_sm90", "PtxasReport"]

SM90_SMEM_LIMIT = 232448  # bytes of shared memory a block may opt into on sm90 (227 KB)


@dataclass
class CompiledSM90:
    ttgir: str
    ptx: str
    shared: int          # bytes of shared memory the kernel needs
    num_warps: int

    @property
    def has_wgmma(self) -> bool:
        return "wgmma.mma_async" in self.ptx

    @property
    def has_tma(self) -> bool:
        return "cp.async.bulk.tensor" in self.ptx

    @property
    def uses_local_memory(self) -> bool:
        """True when PTX declares or touches thread-local memory (register spills or local arrays)."""
        return bool(re.search(r"\.local\b|ld\.local|st\.local", self.ptx))


def compile_sm90(fn, signature: dict, constexprs: dict | None = None, *, num_warps: int = 4,
                 num_stages: int = 3, divisible_by_16=None, **options) -> CompiledSM90:
    """Compile ``fn`` (a ``@triton.jit`` function) for sm90.

    ``signature`` maps each non-constexpr argument name to a Triton type string ("*fp8e4nv", "*bf16",
    "*fp32", "i32", "i64", "fp32", ...); constexpr arguments are listed in ``constexprs`` and marked
    "constexpr" in the signature automatically.

    ``divisible_by_16``: argument names to hint as multiples of 16 (``tt.divisibility``), as Triton's launcher
    does for 16-B-aligned pointers and integer arguments divisible by 16. Default: every pointer argument,
    which is what a launch with torch-allocated tensors sees; without the hints Triton may not vectorise or
    pipeline (cp.async) the loads, so the compiled code would not be what runs. Pass ``()`` for none.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    jit_fn = getattr(fn, "fn", None) if not hasattr(fn, "arg_names") else fn
    if jit_fn is None or not hasattr(jit_fn, "arg_names"):
        raise TypeError("compile_sm90 needs a @triton.jit function (it cannot run under TRITON_INTERPRET=1)")
    sig = dict(signature)
    for k in (constexprs or {}):
        sig[k] = "constexpr"
    if divisible_by_16 is None:
        divisible_by_16 = [k for k, v in signature.items() if isinstance(v, str) and v.startswith("*")]
    attrs = {(jit_fn.arg_names.index(n),): [["tt.divisibility", 16]] for n in divisible_by_16}
    src = ASTSource(jit_fn, signature=sig, constexprs=dict(constexprs or {}), attrs=attrs)
    opts = {"num_warps": num_warps, "num_stages": num_stages, **options}
    c = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts)
    return CompiledSM90(ttgir=c.asm["ttgir"], ptx=c.asm["ptx"], shared=int(c.metadata.shared), num_warps=num_warps)


def nvidia_tool(name: str) -> str | None:
    """Path of an NVIDIA binary (``ptxas``, ``nvdisasm``): the one bundled in the Triton wheel, else on PATH, else
    None."""
    import triton

    p = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", name)
    return p if os.path.exists(p) else shutil.which(name)


@dataclass
class PtxasReport:
    log: str            # ptxas -v output (stderr): registers, spills, warnings such as C7514
    sass: str | None    # nvdisasm -c of the cubin when asked for, else None

    @property
    def spill_bytes(self) -> int:
        """Bytes of spill stores ptxas reports (0 when it reports none)."""
        m = re.search(r"(\d+) bytes spill stores", self.log)
        return int(m.group(1)) if m else 0


def ptxas_sm90(ptx: str, *, sass: bool = False, timeout: float = 300) -> PtxasReport | None:
    """Assemble ``ptx`` for sm_90a with ``ptxas -v`` (and, with ``sass=True``, disassemble the cubin with
    ``nvdisasm -c``). The PTX declares no local memory even when ptxas spills, so register allocation is only
    visible here. Returns None when the tool(s) are not found; raises RuntimeError when ptxas fails."""
    ptxas = nvidia_tool("ptxas")
    nvdisasm = nvidia_tool("nvdisasm") if sass else None
    if ptxas is None or (sass and nvdisasm is None):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(src, "w") as fh:
            fh.write(ptx)
        r = subprocess.run([ptxas, "-arch=sm_90a", "-v", src, "-o", cubin], capture_output=True, text=True,
                           timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"ptxas failed ({r.returncode}): {r.stderr[-2000:]}")
        dis = None
        if sass:
            dis = subprocess.run([nvdisasm, "-c", cubin], capture_output=True, text=True, timeout=timeout).stdout
    return PtxasReport(log=r.stderr, sass=dis)
