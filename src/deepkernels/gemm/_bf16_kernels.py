"""Triton kernels for the dense BF16 GEMM (DeepGEMM ``bf16_gemm_{nt,nn,tn,tt}`` semantics).

Both operands may be K-major or MN-major (wgmma takes either major for 16-bit types): an MN-major operand
gets a descriptor over its underlying ``[K, MN]`` row-major storage and the loaded block is transposed in
registers/SMEM for free. Accumulation is in the tensor core's FP32 accumulator (exact FP32 for BF16
products). ``UPCAST`` (interpreter only) converts operands to FP32 before ``tl.dot``, because the Triton
interpreter multiplies raw bf16 bit patterns.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._fp8_kernels import _store_tile, _tile_coords


@triton.jit
def _bf16_mma_tile(a_desc, b_desc, a_row, b_row, kb_begin, kb_end,
                   A_KMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr, UPCAST: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   NUM_STAGES: tl.constexpr):
    """FP32 tile ``A[a_row:+BM, K-range] @ B[b_row:+BN, K-range].T`` over K blocks [kb_begin, kb_end).

    A K-major: descriptor over ``[M, K]``, block [BM, BK]; MN-major: over ``[K, M]``, block [BK, BM].
    B K-major: over ``[N, K]``, block [BN, BK]; MN-major: over ``[K, N]``, block [BK, BN].
    """
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in tl.range(kb_begin, kb_end, num_stages=NUM_STAGES):
        k = kb * BLOCK_K
        if A_KMAJOR:
            a = a_desc.load([a_row, k])
        else:
            a = a_desc.load([k, a_row]).T
        if B_KMAJOR:
            b = b_desc.load([b_row, k]).T
        else:
            b = b_desc.load([k, b_row])
        if UPCAST:
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    return acc


@triton.jit(do_not_specialize=["num_progs"])  # grid size: no recompiles per grid
def _bf16_gemm_nt_kernel(a_ptr, b_ptr, d_ptr, ws_ptr,
                         M, N, K, stride_a, stride_b, stride_dm, num_progs,
                         A_KMAJOR: tl.constexpr, B_KMAJOR: tl.constexpr, ACCUMULATE: tl.constexpr,
                         SPLIT_K: tl.constexpr, UPCAST: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                         GROUP_M: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Persistent BF16 GEMM ``D (+)= A @ B.T`` (NT core; the other layouts are views). ``stride_a``/``stride_b``
    are the row strides of the underlying row-major storage (``[M, K]``/``[K, M]``, ``[N, K]``/``[K, N]``)."""
    if A_KMAJOR:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_a, 1],
                                           block_shape=[BLOCK_M, BLOCK_K])
    else:
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[K, M], strides=[stride_a, 1],
                                           block_shape=[BLOCK_K, BLOCK_M])
    if B_KMAJOR:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_b, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_b, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_mn = num_pid_m * num_pid_n
    num_kb = tl.cdiv(K, BLOCK_K)
    kb_per_split = tl.cdiv(num_kb, SPLIT_K)
    for tile_id in tl.range(pid, num_mn * SPLIT_K, num_progs):
        split = tile_id // num_mn
        pid_m, pid_n = _tile_coords(tile_id % num_mn, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        kb0 = split * kb_per_split
        kb1 = tl.minimum(kb0 + kb_per_split, num_kb)
        acc = _bf16_mma_tile(a_desc, b_desc, off_m, off_n, kb0, kb1, A_KMAJOR, B_KMAJOR, UPCAST,
                             BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        if SPLIT_K == 1:
            _store_tile(d_ptr, acc, offs_m, offs_n, M, N, stride_dm, ACCUMULATE)
        else:
            _store_tile(ws_ptr + split.to(tl.int64) * M * N, acc, offs_m, offs_n, M, N, N, False)
