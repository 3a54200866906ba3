"""Compile tier helper: cross-compile a Triton kernel for sm90 on any machine (no GPU needed).

``triton.compile(ASTSource(...), target=GPUTarget("cuda", 90, 32))`` runs the whole NVIDIA pipeline on the
CPU (ptxas ships in the Triton wheel) and returns TTGIR, PTX and cubin, so tests can assert what must be in a
production config: wgmma, TMA bulk copies, shared memory under the 227 KB limit, no local memory.
"""
from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

__all__ = ["compile_sm90", "CompiledSM90", "SM90_SMEM_LIMIT", "nvidia_tool", "ptxas_sm90", "PtxasReport",
           "ptxas_sm90_cached", "ptxas_sm90_or_skip", "sass_loops", "sass_count", "n_spill", "n_hgmma",
           "setmaxnreg_values", "clean_ptx"]

SM90_SMEM_LIMIT = 232448  # bytes of shared memory a block may opt into on sm90 (227 KB)


@dataclass
class CompiledSM90:
    ttgir: str
    ptx: str
    shared: int          # bytes of shared memory the kernel needs
    num_warps: int

    @property
    def has_wgmma(self) -> bool:
        """True when the PTX issues warpgroup MMAs (``wgmma.mma_async``)."""
        return "wgmma.mma_async" in self.ptx

    @property
    def has_tma(self) -> bool:
        """True when the PTX issues TMA bulk tensor copies (``cp.async.bulk.tensor``)."""
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

    @property
    def spills(self) -> tuple[int, int] | None:
        """(spill store bytes, spill load bytes) from ptxas's ``N bytes spill stores, M bytes spill loads`` line;
        None when the log has no such line (callers assert it is there)."""
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", self.log)
        return (int(m.group(1)), int(m.group(2))) if m else None


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


def ptxas_sm90_cached(ptx: str, sass: bool = True) -> PtxasReport | None:
    """``ptxas_sm90(ptx, sass=sass)`` memoised on the PTX text (per process): for compile tests that assemble the
    same cached kernel in several tests (ptxas + nvdisasm take seconds). Defaults to ``sass=True``."""
    return _ptxas_sm90_memo(ptx, bool(sass))


@functools.lru_cache(maxsize=None)
def _ptxas_sm90_memo(ptx: str, sass: bool) -> PtxasReport | None:
    """The cache behind ``ptxas_sm90_cached`` (one key per (PTX, sass) however the caller spells the arguments)."""
    return ptxas_sm90(ptx, sass=sass)


def ptxas_sm90_or_skip(ptx: str, *, sass: bool = False, cached: bool = False,
                       reason: str = "ptxas not available") -> PtxasReport:
    """``ptxas_sm90`` (``ptxas_sm90_cached`` with ``cached=True``) for a pytest test: skips the test with ``reason``
    when the tool(s) are not found, so the report returned is never None."""
    rep = ptxas_sm90_cached(ptx, sass) if cached else ptxas_sm90(ptx, sass=sass)
    if rep is None:
        import pytest
        pytest.skip(reason)
    return rep


# ------------------------------------------------------------------ SASS / PTX text helpers for compile tests
def sass_loops(sass: str) -> list[list[str]]:
    """Innermost loops of an ``nvdisasm -c`` listing (``PtxasReport.sass``) as lists of instruction texts, in
    program order (a loop = a backward ``BRA`` to a ``.L_x_N`` label; a loop that contains another is dropped)."""
    ins, labels, pending = [], {}, []
    for line in sass.splitlines():
        lm = re.match(r"^(\.L_x_\d+):", line)
        if lm:
            pending.append(lm.group(1))
            continue
        m = re.match(r"\s+/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if m:
            pc = int(m.group(1), 16)
            labels.update({p: pc for p in pending})
            pending = []
            ins.append((pc, m.group(2)))
    loops = []
    for pc, txt in ins:
        m = re.search(r"BRA `\((\.L_x_\d+)\)", txt)
        if m and labels.get(m.group(1), 1 << 62) < pc:
            loops.append((labels[m.group(1)], pc))
    inner = [lp for lp in loops if not any(o != lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]
    return [[t for pc, t in ins if a <= pc <= b_] for a, b_ in inner]


def sass_count(loop, pattern: str) -> int:
    """Instructions of ``loop`` (a list of SASS texts, e.g. one of ``sass_loops``) in which regex ``pattern`` is
    found (``re.search``)."""
    return sum(1 for t in loop if re.search(pattern, t))


def n_spill(loop) -> int:
    """Spill instructions (local-memory ``STL`` / ``LDL``) in ``loop``."""
    return sass_count(loop, r"\b(STL|LDL)\b")


def n_hgmma(loop) -> int:
    """``HGMMA`` (wgmma) instructions in ``loop``."""
    return sass_count(loop, "HGMMA")


def ws_loop_roles(sass: str, min_loads: int = 8):
    """The innermost loops of a warp-specialised MLA kernel's SASS (:func:`sass_loops`) by role: ``(soft, pv, prod)``
    = loops with more than 4 ``HGMMA`` (the softmax warpgroup's S + its P V), exactly 4 (the PV warpgroup's), and none
    but at least ``min_loads`` global loads (``LDG``, predicated or not: the producer's gather)."""
    loops = sass_loops(sass)
    soft = [lp for lp in loops if n_hgmma(lp) > 4]
    pv = [lp for lp in loops if n_hgmma(lp) == 4]
    prod = [lp for lp in loops if not n_hgmma(lp) and sass_count(lp, r"^(@!?P\w+\s+)?LDG") >= min_loads]
    return soft, pv, prod


def setmaxnreg_values(ptx: str, *, skip=(120, 256), keep=(), unique: bool = True) -> list[tuple[str, int]]:
    """``("inc" | "dec", registers)`` of every ``setmaxnreg`` in ``ptx``, leaving out register counts in ``skip``
    (default: Triton's 256 / 120 entry and exit dance) unless the pair is in ``keep`` (e.g. ``[("inc", 120)]`` where
    a partition's own value is 120). ``unique=True``: a sorted list without repeats; ``unique=False``: every
    occurrence in PTX order (``dict()`` of it keeps the last value per direction)."""
    regs = [(d, int(n)) for d, n in re.findall(r"setmaxnreg\.(inc|dec)\.sync\.aligned\.u32\s+(\d+)", ptx)]
    regs = [(d, n) for d, n in regs if n not in skip or (d, n) in keep]
    return sorted(set(regs)) if unique else regs


def clean_ptx(ptx: str) -> str:
    """PTX without debug information: ``.loc`` / ``.file`` lines, comments, label lines, debug sections (what a
    byte-identity hash of a kernel's PTX should cover)."""
    out, skip = [], False
    for ln in ptx.splitlines():
        s = ln.strip()
        if s.startswith(".section") and "debug" in s:
            skip = "}" not in s
            continue
        if skip:
            skip = s != "}"
            continue
        s = re.sub(r"//.*$", "", s).strip()
        if not s or s.startswith((".loc", ".file")) or re.match(r"^[$\w.]+:$", s):
            continue
        out.append(s)
    return "\n".join(out)
