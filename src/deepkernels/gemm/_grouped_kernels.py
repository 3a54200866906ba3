"""Triton kernels for the MoE grouped GEMMs (DeepGEMM m-grouped contiguous / masked, k-grouped contiguous).

All kernels are persistent (``num_progs`` programs stride over a tile space) and compute their group-aware
schedule on the device from device tensors (no host sync, so the masked GEMM is CUDA-graph capturable). The
FP8 main loop is the dense GEMM's :func:`_fp8_mma_tile` (one fresh ``tl.dot`` partial per 128-wide K block,
promoted into FP32 with ``sfa * sfb``); BF16 uses FP32 tensor-core accumulation.

Stores are masked pointer stores with int64 row offsets: a grouped output tile may end inside another group's
rows (masked layout, padding rows), which a TMA store box cannot express. Loads go through TMA descriptors over
the flattened ``[G * rows, K]`` operands; rows read past a group's end only feed output rows/columns that are
never stored.
"""
from __future__ import annotations

import triton
import triton.language as tl

from ._fp8_kernels import _fp8_mma_tile, _tile_coords


@triton.jit
def _bf16_grouped_tile(a_desc, b_desc, a_row, b_row, b_k0, num_kb,
                       B_KMAJOR: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr):
    """FP32 ``A[a_row:+BM, :K] @ B_g[b_row:+BN, :K].T`` for K-major A; B K-major (``[G*N, K]``, rows ``b_row``)
    or MN-major (``[G*K, N]``: K rows start at ``b_k0``, columns ``b_row``)."""
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for kb in tl.range(0, num_kb, num_stages=NUM_STAGES):
        k = kb * BLOCK_K
        a = a_desc.load([a_row, k])
        if B_KMAJOR:
            b = b_desc.load([b_row, k]).T
        else:
            b = b_desc.load([b_k0 + k, b_row])
        if UPCAST:  # the interpreter multiplies raw bf16 bit patterns: upcast there only
            acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _grouped_tile(IS_FP8: tl.constexpr, a_desc, b_desc, a_row, g, N, K,
                  sfa_ptr, sfa_sm, sfa_sk, sfa_row0, sfa_rows, sfb_ptr, sfb_sg, sfb_sn, sfb_sk, off_n,
                  B_KMAJOR: tl.constexpr, UPCAST: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr, NUM_STAGES: tl.constexpr):
    """One ``[BLOCK_M, BLOCK_N]`` FP32 tile of ``A[a_row:] @ B[g].T`` (FP8 with promotion, or BF16)."""
    g64 = g.to(tl.int64)
    num_kb = tl.cdiv(K, BLOCK_K)
    if IS_FP8:
        acc = _fp8_mma_tile(a_desc, b_desc, a_row, g * N + off_n,
                            sfa_ptr, sfa_sm, sfa_sk, sfa_row0, sfa_rows,
                            sfb_ptr + g64 * sfb_sg, sfb_sn, sfb_sk, off_n, N,
                            0, num_kb, False, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES)
    else:
        if B_KMAJOR:
            acc = _bf16_grouped_tile(a_desc, b_desc, a_row, g * N + off_n, 0, num_kb, True, UPCAST,
                                     BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES)
        else:
            acc = _bf16_grouped_tile(a_desc, b_desc, a_row, off_n, g * K, num_kb, False, UPCAST,
                                     BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES)
    return acc


@triton.jit
def _row_gids(gid_ptr, offs_m, M, G):
    """Per-row group ids of a tile; rows past M and ids outside [0, G) read as -1 (padding)."""
    gids = tl.load(gid_ptr + offs_m, mask=offs_m < M, other=-1)
    return tl.where((gids >= 0) & (gids < G), gids, -1)


@triton.jit
def _store_rows(d_ptr, acc, offs_m, offs_n, row_sel, N, stride_dm):
    """Masked store of an FP32 tile into rows ``offs_m[row_sel]`` (int64 row offsets; pointers built here, after
    the main loop, so they are not live across it)."""
    ptrs = d_ptr + offs_m.to(tl.int64)[:, None] * stride_dm + offs_n[None, :]
    tl.store(ptrs, acc.to(d_ptr.dtype.element_ty), mask=row_sel[:, None] & (offs_n < N)[None, :])


@triton.jit
def _m_grouped_contiguous_mma_kernel(a_ptr, b_ptr, d_ptr, sfa_ptr, sfb_ptr, gid_ptr,
                                 M, N, K, G, stride_am, stride_b, stride_dm,
                                 sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs,
                                 IS_FP8: tl.constexpr, B_KMAJOR: tl.constexpr, UPCAST: tl.constexpr,
                                 BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                                 GROUP_M: tl.constexpr, NUM_STAGES: tl.constexpr):
    """M-grouped contiguous GEMM: ``D[i] = A[i] @ B[gid[i]].T`` for ``0 <= gid[i] < G``, zero otherwise.

    A ``[M, K]`` K-major; B ``[G, N, K]`` (K-major, flattened ``[G*N, K]``) or, BF16 only, ``[G, K, N]``
    (flattened ``[G*K, N]``); D ``[M, N]`` row-major. ``gid`` int32 ``[M]`` per-row group ids. The group of a
    tile is read from its rows; a tile whose rows belong to several groups (a layout that breaks the alignment
    rule) is computed once per group with per-row store masks, so any layout gives the reference result.
    Groups are visited in increasing order, so the passes over one tile are deterministic.
    """
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1], block_shape=[BLOCK_M, BLOCK_K])
    if B_KMAJOR:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[G * N, K], strides=[stride_b, 1],
                                           block_shape=[BLOCK_N, BLOCK_K])
    else:
        b_desc = tl.make_tensor_descriptor(b_ptr, shape=[G * K, N], strides=[stride_b, 1],
                                           block_shape=[BLOCK_K, BLOCK_N])
    # One (tile, group) pass per iteration of a flat loop with scalar state (tile_id, g_lo): a pass computes the
    # smallest group >= g_lo present in the tile; when none is left the padding rows get zeros and the program
    # moves to its next tile. (A loop nested around the main loop made ptxas spill.)
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    tile_id = pid
    g_lo = 0
    while tile_id < num_tiles:
        pid_m, pid_n = _tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        offs_m = off_m + tl.arange(0, BLOCK_M)
        gids = _row_gids(gid_ptr, offs_m, M, G)
        g = tl.min(tl.where(gids >= g_lo, gids, G), axis=0)
        if g < G:
            acc = _grouped_tile(IS_FP8, a_desc, b_desc, off_m, g, N, K,
                                sfa_ptr, sfa_sm, sfa_sk, off_m, M, sfb_ptr, sfb_sg, sfb_sn, sfb_sk, off_n,
                                B_KMAJOR, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES)
            offs_n = off_n + tl.arange(0, BLOCK_N)
            _store_rows(d_ptr, acc, offs_m, offs_n, _row_gids(gid_ptr, offs_m, M, G) == g, N, stride_dm)
            g_lo = g + 1
        else:
            pad = (offs_m < M) & (gids < 0)
            if tl.max(pad.to(tl.int32), axis=0) > 0:  # padding rows: exact zeros
                offs_n = off_n + tl.arange(0, BLOCK_N)
                _store_rows(d_ptr, tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), offs_m, offs_n, pad, N,
                            stride_dm)
            tile_id += num_progs
            g_lo = 0


@triton.jit
def _m_grouped_masked_mma_kernel(a_ptr, b_ptr, d_ptr, sfa_ptr, sfb_ptr, masked_m_ptr,
                             M_MAX, N, K, G, stride_am, stride_b, stride_dm, stride_dg,
                             sfa_sg, sfa_sm, sfa_sk, sfb_sg, sfb_sn, sfb_sk, num_progs,
                             IS_FP8: tl.constexpr, UPCAST: tl.constexpr,
                             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                             GROUP_M: tl.constexpr, NUM_STAGES: tl.constexpr):
    """M-grouped masked GEMM: ``D[g, :m_g] = A[g, :m_g] @ B[g].T`` with ``m_g = clamp(masked_m[g], 0, M_MAX)``.

    A ``[G, M_MAX, K]`` (flattened ``[G*M_MAX, K]``), B ``[G, N, K]`` K-major; D ``[G, M_MAX, N]`` row-major.
    The tile schedule is built on the device: each program counts the real tiles
    ``sum_g ceil(m_g/BLOCK_M) * ceil(N/BLOCK_N)`` from ``masked_m`` and walks them with a group cursor that only
    moves forward. Rows ``>= m_g`` are never stored (no spill into the next group, no write for ``m_g == 0``).
    """
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[G * M_MAX, K], strides=[stride_am, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[G * N, K], strides=[stride_b, 1],
                                       block_shape=[BLOCK_N, BLOCK_K])
    pid = tl.program_id(0)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    total = 0
    for gg in range(0, G):
        mg = tl.minimum(tl.maximum(tl.load(masked_m_ptr + gg), 0), M_MAX)
        total += tl.cdiv(mg, BLOCK_M) * num_pid_n
    g = 0
    before = 0
    m_g = tl.minimum(tl.maximum(tl.load(masked_m_ptr), 0), M_MAX)
    tiles_g = tl.cdiv(m_g, BLOCK_M) * num_pid_n
    for tile_id in tl.range(pid, total, num_progs):
        while tile_id >= before + tiles_g:
            before += tiles_g
            g += 1
            m_g = tl.minimum(tl.maximum(tl.load(masked_m_ptr + g), 0), M_MAX)
            tiles_g = tl.cdiv(m_g, BLOCK_M) * num_pid_n
        pid_m, pid_n = _tile_coords(tile_id - before, tl.cdiv(m_g, BLOCK_M), num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        g64 = g.to(tl.int64)
        acc = _grouped_tile(IS_FP8, a_desc, b_desc, g * M_MAX + off_m, g, N, K,
                            sfa_ptr + g64 * sfa_sg, sfa_sm, sfa_sk, off_m, m_g,
                            sfb_ptr, sfb_sg, sfb_sn, sfb_sk, off_n,
                            True, UPCAST, BLOCK_M, BLOCK_N, BLOCK_K, NUM_STAGES)
        offs_m = off_m + tl.arange(0, BLOCK_M)
        offs_n = off_n + tl.arange(0, BLOCK_N)
        ptrs = d_ptr + g64 * stride_dg + offs_m.to(tl.int64)[:, None] * stride_dm + offs_n[None, :]
        tl.store(ptrs, acc.to(d_ptr.dtype.element_ty), mask=(offs_m < m_g)[:, None] & (offs_n < N)[None, :])


@triton.jit
def _k_grouped_mma_kernel(a_ptr, b_ptr, d_ptr, sfa_ptr, sfb_ptr, ks_ptr, koff_ptr, sfoff_ptr,
                      M, N, G, SUM_K, stride_dg, stride_dm, sfa_sm, sfa_sk, sfb_sn, sfb_sk, num_progs,
                      IS_FP8: tl.constexpr, MN_MAJOR: tl.constexpr, UPCAST: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      GROUP_M: tl.constexpr, NUM_STAGES: tl.constexpr):
    """K-grouped GEMM ``D[g] += A_g @ B_g.T`` (D pre-filled with C; fp32).

    ``MN_MAJOR=False`` (FP8 NT): group g's A is the row-major ``[M, k_g]`` chunk at element ``M * koff[g]`` of
    the flat A buffer (B likewise with N). ``MN_MAJOR=True`` (TN): A ``[sum_k, M]`` row-major, group g's rows
    ``[koff[g], koff[g] + k_g)``. FP8 scales per token: ``sfa[m, sfoff[g] + kb]`` at ``m*sfa_sm + col*sfa_sk``.
    A fresh descriptor is made for every tile (per-group strides; never a stale one when groups are skipped);
    ``k_g`` is clamped so that a group never reaches past ``SUM_K``. Each output tile is owned by exactly one
    program and summed in a fixed order: bit-identical results on every run.
    """
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    per_group = num_pid_m * num_pid_n
    for tile_id in tl.range(pid, G * per_group, num_progs):
        g = tile_id // per_group
        pid_m, pid_n = _tile_coords(tile_id - g * per_group, num_pid_m, num_pid_n, GROUP_M)
        k_off = tl.minimum(tl.maximum(tl.load(koff_ptr + g), 0), SUM_K)
        k_g = tl.minimum(tl.maximum(tl.load(ks_ptr + g), 0), SUM_K - k_off).to(tl.int32)
        if k_g > 0:
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            if MN_MAJOR:
                a_desc = tl.make_tensor_descriptor(a_ptr + k_off * M, shape=[k_g, M], strides=[M, 1],
                                                   block_shape=[BLOCK_K, BLOCK_M])
                b_desc = tl.make_tensor_descriptor(b_ptr + k_off * N, shape=[k_g, N], strides=[N, 1],
                                                   block_shape=[BLOCK_K, BLOCK_N])
            else:
                a_desc = tl.make_tensor_descriptor(a_ptr + k_off * M, shape=[M, k_g], strides=[k_g, 1],
                                                   block_shape=[BLOCK_M, BLOCK_K])
                b_desc = tl.make_tensor_descriptor(b_ptr + k_off * N, shape=[N, k_g], strides=[k_g, 1],
                                                   block_shape=[BLOCK_N, BLOCK_K])
            offs_m = off_m + tl.arange(0, BLOCK_M)
            offs_n = off_n + tl.arange(0, BLOCK_N)
            m_ok = offs_m < M
            n_ok = offs_n < N
            acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
            if IS_FP8:
                sf0 = tl.load(sfoff_ptr + g).to(tl.int64)
                sfa_base = sfa_ptr + offs_m.to(tl.int64) * sfa_sm + sf0 * sfa_sk
                sfb_base = sfb_ptr + offs_n.to(tl.int64) * sfb_sn + sf0 * sfb_sk
            for kb in tl.range(0, tl.cdiv(k_g, BLOCK_K), num_stages=NUM_STAGES):
                k = kb * BLOCK_K
                if MN_MAJOR:
                    a = a_desc.load([k, off_m]).T
                    b = b_desc.load([k, off_n])
                else:
                    a = a_desc.load([off_m, k])
                    b = b_desc.load([off_n, k]).T
                if IS_FP8:
                    partial = tl.dot(a, b)  # fresh FP32 partial per 128-wide K block
                    sa = tl.load(sfa_base + kb * sfa_sk, mask=m_ok, other=0.0)
                    sb = tl.load(sfb_base + kb * sfb_sk, mask=n_ok, other=0.0)
                    acc += partial * (sa[:, None] * sb[None, :])
                elif UPCAST:
                    acc = tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
                else:
                    acc = tl.dot(a, b, acc)
            ptrs = d_ptr + g.to(tl.int64) * stride_dg + offs_m.to(tl.int64)[:, None] * stride_dm + offs_n[None, :]
            mask = m_ok[:, None] & n_ok[None, :]
            old = tl.load(ptrs, mask=mask, other=0.0)
            tl.store(ptrs, old + acc, mask=mask)
