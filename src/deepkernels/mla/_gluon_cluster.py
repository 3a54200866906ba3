"""Inline-PTX helpers for 2-CTA cluster kernels (Gluon 3.6 has no cluster API): cluster barriers, the mbarrier-init
fence, the thread-lane operand, the shared window base, the peer rank, remote mbarrier arrives, expect_tx and DSMEM
bulk pushes. Used by the sparse decode cluster kernel (``_gluon_sparse_decode_ws3``, whose docstring explains the
protocol and, in "Uniform registers", why each helper takes the operands it takes), the split-consumer warpgroups
it shares with ``_gluon_sparse_decode_ws2`` and the sparse prefill cluster kernel."""
from __future__ import annotations

from .._gluon import gl, jit as _jit

__all__ = ["_c_sync", "_c_init_fence", "_c_lane", "_c_smem_base", "_c_peer_rank", "_c_remote_arrive", "_c_expect_tx",
           "_c_push"]


@_jit
def _c_sync():
    """``barrier.cluster.arrive.release`` + ``wait.acquire`` by every thread of the calling partition."""
    return gl.inline_asm_elementwise(
        asm="barrier.cluster.arrive.release.aligned; barrier.cluster.wait.acquire.aligned; mov.u32 $0, 0;",
        constraints="=r,r", args=[gl.program_id(0)], dtype=gl.int32, is_pure=False, pack=1)


@_jit
def _c_init_fence(x):
    """``fence.mbarrier_init.release.cluster`` (after the ``mbarrier.init``s, before the first cluster barrier)."""
    return gl.inline_asm_elementwise(asm="fence.mbarrier_init.release.cluster; mov.u32 $0, 0;",
                                     constraints="=r,r", args=[x], dtype=gl.int32, is_pure=False, pack=1)


@_jit
def _c_lane():
    """[128] thread index of the calling 4-warp partition, one element per thread, computed by Gluon (LLVM folds its
    ``%tid.x`` read into the kernel's single one). The per-block PTX helpers take it as an operand and elect the
    thread holding element 0: reading ``%tid.x`` again inside their asm made ptxas stop keeping the softmax loop's
    wgmma descriptors in uniform registers (``_gluon_sparse_decode_ws3`` docstring, "Uniform registers")."""
    return gl.arange(0, 128, gl.BlockedLayout([1], [32], [4], [0]))


@_jit
def _c_smem_base():
    """``global_smem`` (the shared window address of the kernel's shared memory), read ONCE per partition, outside
    its loops: a ``mov global_smem`` inside the softmax warpgroup's request / token loop nest made ptxas spill that
    loop's wgmma descriptors (``_gluon_sparse_decode_ws3`` docstring, "Uniform registers")."""
    return gl.inline_asm_elementwise(asm="mov.u32 $0, global_smem;", constraints="=r,r", args=[gl.program_id(0)],
                                     dtype=gl.int32, is_pure=False, pack=1)


@_jit
def _c_peer_rank():
    """``%cluster_ctarank ^ 1``, the peer CTA's rank in the 2-CTA cluster (read once per partition)."""
    return gl.inline_asm_elementwise(asm="mov.u32 $0, %cluster_ctarank; xor.b32 $0, $0, 1;", constraints="=r,r",
                                     args=[gl.program_id(0)], dtype=gl.int32, is_pure=False, pack=1)


@_jit
def _c_remote_arrive(lane, gs, off, slot8):
    """The thread holding ``lane`` element 0 (one per 128-thread group) arrives on the PEER CTA's mbarrier at local
    shared address ``gs + off + slot8`` (``gs`` = :func:`_c_smem_base`; the sum is formed inside the asm, a hoisted
    sum cost a register; ``mapa`` to rank ``%cluster_ctarank ^ 1``). The caller's local arrive (Gluon: a 128-thread
    barrier + one arrive) precedes it, so the whole group's wgmma reads are done."""
    return gl.inline_asm_elementwise(
        asm="""{
        .reg .b32 a, r;
        add.u32 a, $2, $3;
        add.u32 a, a, $4;
        mov.u32 r, %cluster_ctarank;
        xor.b32 r, r, 1;
        mapa.shared::cluster.u32 a, a, r;
        @$1 mbarrier.arrive.shared::cluster.b64 _, [a];
        mov.u32 $0, 0;
        }""", constraints="=r,b,r,r,r", args=[lane == 0, gs, off, slot8], dtype=gl.int32, is_pure=False, pack=1)


@_jit
def _c_expect_tx(lane, bar):
    """One thread (``lane`` element 0): ``mbarrier.expect_tx`` of the peer's bytes per block on the LOCAL mbarrier at
    shared address ``bar`` (no arrive)."""
    return gl.inline_asm_elementwise(
        asm="""{
        @$1 mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [$2], 32768;
        mov.u32 $0, 0;
        }""", constraints="=r,b,r", args=[lane == 0, bar], dtype=gl.int32, is_pure=False, pack=1)


@_jit
def _c_push(lane, src, bar, peer):
    """One thread (``lane`` element 0): bulk-copy the 16 KB at local shared address ``src`` to the same offset of the
    peer CTA (rank ``peer``), completing 16,384 tx bytes on the peer's mbarrier at local address ``bar``. The
    callers fenced (``fence.proxy.async``) and passed a 128-thread barrier after their stores."""
    return gl.inline_asm_elementwise(
        asm="""{
        .reg .b32 d, m;
        mapa.shared::cluster.u32 d, $2, $4;
        mapa.shared::cluster.u32 m, $3, $4;
        @$1 cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [d], [$2], 16384, [m];
        mov.u32 $0, 0;
        }""", constraints="=r,b,r,r,r", args=[lane == 0, src, bar, peer], dtype=gl.int32, is_pure=False, pack=1)
