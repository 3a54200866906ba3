"""In-kernel TIMELINE stamps shared by the Gluon decode kernels (opt-in instrumentation, never dispatched).

A kernel's timeline buffer is a ZEROED int64 ``[CTAs, words]`` tensor: per CTA a header of ``header`` words, then
``piece`` words for each of its first ``max_pieces`` request pieces. :func:`tl_put` stores a value, :func:`tl_stamp`
``%globaltimer`` (ns) as ``red.global.max.u64`` (the time the LAST warp of the calling partition got there, so
events in program order give monotone stamps). Both run on lane 0 of each warp of the calling partition (callers
pass partition-uniform values); word ``word`` of the header for ``req < 0``, else of piece ``min(req - begin_req,
max_pieces - 1)``. Address, piece offset and predicate are formed inside the asm: as Gluon / LLVM values they stayed
live across the tile loops and added ptxas spills, and ``%tid.x`` read in the asm made ptxas stop keeping the wgmma
descriptors in uniform registers (``%laneid`` does not) -- benchmarks/notes/mla_decode_timeline.md.

Each kernel builds its layout's asm once, :func:`put_asm` / :func:`stamp_asm` as module-level ``gl.constexpr``
strings, and passes them to :func:`tl_put` / :func:`tl_stamp`.
"""
from __future__ import annotations

from .._gluon import gl, jit as _jit

__all__ = ["put_asm", "stamp_asm", "tl_put", "tl_stamp"]


def _asm(header: int, piece: int, max_pieces: int, words: int, regs: str, first: str, op: str) -> str:
    lines = [regs, ".reg .b32 c, t;", ".reg .pred p, h;", *first,
             "sub.s32 t, $2, $3;", f"min.s32 t, t, {max_pieces - 1};", f"mad.lo.s32 t, t, {piece}, {header};",
             "setp.lt.s32 h, $2, 0;", "selp.b32 t, 0, t, h;", "add.s32 t, t, $4;", "mov.u32 c, %ctaid.x;",
             f"mad.lo.u32 c, c, {words}, t;", "mad.wide.u32 a, c, 8, $1;", "mov.u32 t, %laneid;",
             "setp.eq.u32 p, t, 0;", op, "mov.u32 $0, 0;"]
    return "{\n" + "".join(f"        {ln}\n" for ln in lines) + "        }"


def put_asm(header: int, piece: int, max_pieces: int, words: int) -> str:
    """The asm of :func:`tl_put` for a buffer layout (operands: $1 buffer, $2 req, $3 begin_req, $4 word, $5 value)."""
    return _asm(header, piece, max_pieces, words, ".reg .b64 a;", [], "@p st.global.b64 [a], $5;")


def stamp_asm(header: int, piece: int, max_pieces: int, words: int) -> str:
    """The asm of :func:`tl_stamp` for a buffer layout (operands: $1 buffer, $2 req, $3 begin_req, $4 word)."""
    return _asm(header, piece, max_pieces, words, ".reg .b64 a, g;", ["mov.u64 g, %globaltimer;"],
                "@p red.global.max.u64 [a], g;")


@_jit
def tl_put(tl_ptr, req, begin_req, word, val, ASM: gl.constexpr):
    """Store ``val`` (int64) into the timeline word (module docstring); ``ASM`` = the layout's :func:`put_asm`."""
    return gl.inline_asm_elementwise(
        asm=ASM, constraints="=r,l,r,r,r,l",
        args=[tl_ptr.to(gl.int64, bitcast=True), req, begin_req, word, val.to(gl.int64)],
        dtype=gl.int32, is_pure=False, pack=1)


@_jit
def tl_stamp(tl_ptr, req, begin_req, word, ASM: gl.constexpr):
    """``%globaltimer`` as an atomic max into the timeline word; ``ASM`` = the layout's :func:`stamp_asm`."""
    return gl.inline_asm_elementwise(
        asm=ASM, constraints="=r,l,r,r,r", args=[tl_ptr.to(gl.int64, bitcast=True), req, begin_req, word],
        dtype=gl.int32, is_pure=False, pack=1)
