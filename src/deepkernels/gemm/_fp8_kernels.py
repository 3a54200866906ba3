"""Triton kernels for the dense FP8 block-scaled GEMM (DeepGEMM ``sm90_fp8_gemm_1d2d`` / ``_1d1d`` semantics).

Reusable pieces (also meant for the grouped GEMMs of ``gemm/grouped.py``; interface in
``benchmarks/notes/gemm.md``):

- :func:`_tile_coords`: L2-friendly ("grouped along M") tile order.
- :func:`_fp8_mma_tile`: one ``[BLOCK_M, BLOCK_N]`` FP32 output tile of ``A @ B.T`` over a range of 128-wide K
  blocks, with DeepGEMM's promotion (a fresh ``tl.dot`` partial per K block, scaled by ``sfa * sfb`` and
  accumulated in FP32 registers). The caller chooses the A row / B row (a per-group B base offset is just a
  different ``b_row``), the scale rows and the K-block range.
- :func:`_store_tile`: masked, int64-offset epilogue store (optionally adding the old D, for C accumulation).
- :func:`_gemm_splitk_reduce_kernel`: deterministic sum of the split-K FP32 partials (fixed order).
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """Map a linear tile id to (pid_m, pid_n), visiting GROUP_M row-blocks per column sweep (L2 reuse of B)."""
    num_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_in_group
    first_m = group_id * GROUP_M
    group_size = tl.minimum(num_pid_m - first_m, GROUP_M)
    pid_m = first_m + (tile_id % group_size)
    pid_n = (tile_id % num_in_group) // group_size
    return pid_m, pid_n


@triton.jit
def _fp8_mma_tile(a_desc, b_desc, a_row, b_row,
                  sfa_ptr, sfa_sm, sfa_sk, sfa_row0, sfa_rows,
                  sfb_ptr, sfb_sn, sfb_sk, sfb_n0, sfb_cols,
                  kb_begin, kb_end,
                  SFB_PER_ROW: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr):
    """FP32 tile ``sum_kb fp32(A[a_row:+BM, kb] @ B[b_row:+BN, kb].T) * sfa[m, kb] * sfb[., kb]``.

    a_desc/b_desc: TMA descriptors over K-major FP8 A ``[*, K]`` and B ``[*, K]`` (block [BM, 128] / [BN, 128];
    out-of-range rows and the K tail are zero-filled by TMA). sfa: element (m, kb) at
    ``sfa_ptr + m * sfa_sm + kb * sfa_sk`` for logical rows ``sfa_row0 + [0, BM)`` (masked at ``sfa_rows``).
    sfb: 128x128 blocks (``SFB_PER_ROW=False``; element (n // 128, kb)) or per row (``True``; element (n, kb)),
    for logical columns ``sfb_n0 + [0, BN)`` masked at ``sfb_cols``; with BLOCK_N <= 128 the tile lies in one
    128-row weight block (``sfb_n0`` must be a multiple of BLOCK_N) and one scalar scale is loaded.
    """
    offs_m = sfa_row0 + tl.arange(0, BLOCK_M)
    m_mask = offs_m < sfa_rows
    sfa_base = sfa_ptr + offs_m.to(tl.int64) * sfa_sm
    offs_n = sfb_n0 + tl.arange(0, BLOCK_N)
    n_mask = offs_n < sfb_cols
    if SFB_PER_ROW:
        sfb_base = sfb_ptr + offs_n.to(tl.int64) * sfb_sn
    elif BLOCK_N <= 128:
        sfb_scalar = sfb_ptr + (sfb_n0 // 128).to(tl.int64) * sfb_sn
    else:
        sfb_base = sfb_ptr + (offs_n // 128).to(tl.int64) * sfb_sn
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in tl.range(kb_begin, kb_end, num_stages=NUM_STAGES):
        k = kb * BLOCK_K
        a = a_desc.load([a_row, k])
        b = b_desc.load([b_row, k])
        partial = tl.dot(a, b.T)  # fresh FP32 partial per 128-wide K block (no imprecise accumulation)
        sa = tl.load(sfa_base + kb * sfa_sk, mask=m_mask, other=0.0)
        if SFB_PER_ROW:
            sb = tl.load(sfb_base + kb * sfb_sk, mask=n_mask, other=0.0)
            acc += partial * (sa[:, None] * sb[None, :])
        elif BLOCK_N <= 128:
            sb = tl.load(sfb_scalar + kb * sfb_sk)
            acc += partial * (sa * sb)[:, None]
        else:
            sb = tl.load(sfb_base + kb * sfb_sk, mask=n_mask, other=0.0)
            acc += partial * (sa[:, None] * sb[None, :])
    return acc


@triton.jit
def _store_tile(d_ptr, acc, offs_m, offs_n, M, N, stride_dm, ACCUMULATE: tl.constexpr):
    """Store an FP32 tile into D (bf16/fp32) at rows offs_m, cols offs_n, masked, int64 row offsets.

    With ACCUMULATE the current D (pre-filled with C) is added in FP32 first: one rounding at the end."""
    mask = (offs_m < M)[:, None] & (offs_n < N)[None, :]
    ptrs = d_ptr + offs_m.to(tl.int64)[:, None] * stride_dm + offs_n[None, :]
    if ACCUMULATE:
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, acc.to(d_ptr.dtype.element_ty), mask=mask)


@triton.jit(do_not_specialize=["num_progs"])  # grid size: no recompiles per grid
def _fp8_gemm_nt_kernel(a_ptr, b_ptr, d_ptr, sfa_ptr, sfb_ptr, ws_ptr,
                        M, N, K, stride_am, stride_bn, stride_dm,
                        sfa_sm, sfa_sk, sfb_sn, sfb_sk, num_progs,
                        SFB_PER_ROW: tl.constexpr, ACCUMULATE: tl.constexpr, SPLIT_K: tl.constexpr,
                        TMA_STORE: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        GROUP_M: tl.constexpr, NUM_STAGES: tl.constexpr, FLATTEN: tl.constexpr = False):
    """Persistent FP8 NT GEMM: ``num_progs`` programs loop over (split, M-block, N-block) tiles.

    A ``[M, K]`` / B ``[N, K]`` e4m3, K-major; D ``[M, N]`` bf16/fp32 row-major (row stride ``stride_dm``).
    With SPLIT_K > 1 each tile covers a contiguous share of the K blocks and writes FP32 partials to
    ``ws [SPLIT_K, M, N]``; :func:`_gemm_splitk_reduce_kernel` sums them into D.

    FLATTEN: flatten the tile and K loops into one pipelined loop (no pipeline drain between tiles; ignored by
    the interpreter). The warp-specialised variant is :func:`_fp8_gemm_nt_ws_kernel`.
    """
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, 1],
                                       block_shape=[BLOCK_N, BLOCK_K])
    if TMA_STORE:
        d_desc = tl.make_tensor_descriptor(d_ptr, shape=[M, N], strides=[stride_dm, 1],
                                           block_shape=[BLOCK_M, BLOCK_N])
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_mn = num_pid_m * num_pid_n
    num_kb = tl.cdiv(K, BLOCK_K)
    kb_per_split = tl.cdiv(num_kb, SPLIT_K)
    num_tiles = num_mn * SPLIT_K
    for tile_id in tl.range(pid, num_tiles, num_progs, flatten=FLATTEN):
        split = tile_id // num_mn
        pid_m, pid_n = _tile_coords(tile_id % num_mn, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        kb0 = split * kb_per_split
        kb1 = tl.minimum(kb0 + kb_per_split, num_kb)
        acc = _fp8_mma_tile(a_desc, b_desc, off_m, off_n,
                            sfa_ptr, sfa_sm, sfa_sk, off_m, M,
                            sfb_ptr, sfb_sn, sfb_sk, off_n, N,
                            kb0, kb1, SFB_PER_ROW, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        if SPLIT_K == 1:
            if TMA_STORE:
                if ACCUMULATE:
                    acc += d_desc.load([off_m, off_n]).to(tl.float32)
                d_desc.store([off_m, off_n], acc.to(d_ptr.dtype.element_ty))
            else:
                _store_tile(d_ptr, acc, offs_m, offs_n, M, N, stride_dm, ACCUMULATE)
        else:
            ws = ws_ptr + split.to(tl.int64) * M * N
            _store_tile(ws, acc, offs_m, offs_n, M, N, N, False)


@triton.jit(do_not_specialize=["num_progs"])  # grid size: no recompiles per grid
def _fp8_gemm_nt_ws_kernel(a_ptr, b_ptr, d_ptr, sfa_ptr, sfb_ptr,
                           M, N, K, stride_am, stride_bn, stride_dm,
                           sfa_sm, sfa_sk, sfb_sn, sfb_sk, num_progs,
                           SFB_PER_ROW: tl.constexpr, ACCUMULATE: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                           GROUP_M: tl.constexpr, NUM_STAGES: tl.constexpr):
    """Persistent FP8 NT GEMM with Triton's automatic warp specialisation of the tile loop (sm90 autoWS).

    Same semantics as :func:`_fp8_gemm_nt_kernel` without split-K / TMA store. Compiled with num_warps=4 the
    sm90 pipeline turns the tile loop into one TMA producer warpgroup plus two consumer warpgroups, each doing
    the wgmma + FP32 promotion of half the BLOCK_M rows (DeepGEMM's 1 producer + 2 math warpgroups): one
    consumer's promotion overlaps the other's wgmma. The loop body is kept minimal on purpose (a split-K
    range or a data-dependent epilogue branch makes the pass silently not specialise; the compile tier
    asserts ``ttg.warp_specialize`` in TTGIR). BLOCK_N <= 128 for 128x128 weight scales (one scalar per K block).
    """
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_bn, 1],
                                       block_shape=[BLOCK_N, BLOCK_K])
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    num_kb = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(pid, num_tiles, num_progs, warp_specialize=True):
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        sfa_base = sfa_ptr + offs_m.to(tl.int64) * sfa_sm
        if SFB_PER_ROW:
            sfb_base = sfb_ptr + offs_n.to(tl.int64) * sfb_sn
        else:
            sfb_scalar = sfb_ptr + (off_n // 128).to(tl.int64) * sfb_sn
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for kb in tl.range(0, num_kb, num_stages=NUM_STAGES):
            k = kb * BLOCK_K
            a = a_desc.load([off_m, k])
            b = b_desc.load([off_n, k])
            partial = tl.dot(a, b.T)  # fresh FP32 partial per 128-wide K block
            sa = tl.load(sfa_base + kb * sfa_sk, mask=offs_m < M, other=0.0)
            if SFB_PER_ROW:
                sb = tl.load(sfb_base + kb * sfb_sk, mask=offs_n < N, other=0.0)
                acc += partial * (sa[:, None] * sb[None, :])
            else:
                sb = tl.load(sfb_scalar + kb * sfb_sk)
                acc += partial * (sa * sb)[:, None]
        _store_tile(d_ptr, acc, offs_m, offs_n, M, N, stride_dm, ACCUMULATE)


@triton.jit
def _gemm_splitk_reduce_kernel(ws_ptr, d_ptr, total, N, stride_dm,
                               SPLIT_K: tl.constexpr, ACCUMULATE: tl.constexpr, BLOCK: tl.constexpr):
    """``D[m, n] (+)= sum_s ws[s, m, n]`` in a fixed order (deterministic), one rounding to D's dtype.

    ``total`` = M * N is computed on the host (Triton passes it as i64 when it exceeds 2^31, and as a
    constexpr when it is 1, so no ``.to()`` is applied to it here)."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < total
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):
        acc += tl.load(ws_ptr + s * total + offs, mask=mask, other=0.0)
    row = offs // N
    col = offs - row * N
    ptrs = d_ptr + row * stride_dm + col
    if ACCUMULATE:
        acc += tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(ptrs, acc.to(d_ptr.dtype.element_ty), mask=mask)
