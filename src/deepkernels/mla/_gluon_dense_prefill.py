"""Gluon (Triton 3.6) warp-specialised dense MHA-mode prefill forward for sm90 — EXPERIMENTAL, never run on a GPU.

Same contract as the Triton kernel in :mod:`deepkernels.mla.dense_prefill` (``flash_attn_varlen_func``: varlen via
cu_seqlens, causal bottom-right aligned, GQA, d_qk 192 or 128 with d_v 128, lse ``[h, total_q]`` natural log, rows
that see no key give out 0 and lse +inf). Not dispatched: :func:`launch_dense_prefill_gluon` is for tests and
benchmarks until a device run shows it correct and faster.

Structure (FlashAttention-3's idea without its explicit ping-pong): one CTA per (128-row query block, sequence,
head) with three partitions —

* a producer (worker, 1 warp, padded by Triton to a warpgroup) that TMA-loads K (``[64 keys, 128]`` + ``[64, 64]``
  when d_qk is 192) and V (``[64, 128]``) tiles of the sequence's kv head into a ``NUM_STAGES`` ring
  (``kv_ready`` with the transaction bytes, ``kv_empty`` with one arrive per consumer);
* two consumer warpgroups (default partition and a worker), each owning 64 query rows: ``S = Q K^T`` (wgmma, Q in
  shared memory), mask (keys past the sequence, causal), online softmax in base 2 with the running max in raw-score
  units, ``O += P V`` with P as the register A operand. The two warpgroups run independently on the same K/V tiles,
  so one's softmax overlaps the other's MMAs.

Rows of a K/V tile past the sequence belong to the next sequence (or are TMA zero-fill past ``total_k``); their
scores are masked by selection and their V rows meet P = 0 (inputs are assumed finite, as in every attention
kernel).
"""
from __future__ import annotations

import torch

from .._backend import gluon_disabled, interpret_mode
from .._gluon import (IMPORT_ERROR as _IMPORT_ERROR, available, gl, mbarrier, tma, warpgroup_mma,
                      warpgroup_mma_wait, fence_async_shared, TensorDescriptor)
from .._gluon import compile_sm90 as _compile_sm90_gluon, jit as _jit

__all__ = ["available", "supported", "launch_dense_prefill_gluon", "compile_sm90"]

BLOCK_M = 128        # query rows per CTA (2 consumer warpgroups x 64)
BLOCK_N = 64         # keys per K/V tile
NUM_STAGES = 2
_LOG2E = 1.4426950408889634


@_jit
def _g_coords(cu_q_ptr, cu_k_ptr, n_m_blocks, H, GROUP):
    pid = gl.program_id(0)
    m_block = n_m_blocks - 1 - pid % n_m_blocks          # longest causal blocks first
    bh = pid // n_m_blocks
    b = bh // H
    h = bh % H
    q0 = gl.load(cu_q_ptr + b)
    s_q = gl.load(cu_q_ptr + b + 1) - q0
    k0 = gl.load(cu_k_ptr + b)
    s_k = gl.load(cu_k_ptr + b + 1) - k0
    return m_block, h, h // GROUP, q0, s_q, k0, s_k


@_jit
def _g_key_range(m_block, s_q, s_k, CAUSAL: gl.constexpr):
    """Keys [0, hi) the CTA's rows may see (bottom-right causal: row i sees keys j <= i + s_k - s_q)."""
    if CAUSAL:
        row_end = gl.minimum((m_block + 1) * 128, s_q)
        hi = gl.minimum(gl.maximum(row_end + s_k - s_q, 0), s_k)
    else:
        hi = s_k
    hi = gl.where(m_block * 128 < s_q, hi, 0)             # a block past the sequence does nothing
    return gl.cdiv(hi, 64)


@_jit
def _g_producer(k_desc, kr_desc, v_desc, k1, k2, vb, kv_ready, kv_empty, cu_q_ptr, cu_k_ptr, n_m_blocks, H, GROUP,
                stride_kh, stride_vh, D2: gl.constexpr, CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr):
    m_block, h, kh, q0, s_q, k0, s_k = _g_coords(cu_q_ptr, cu_k_ptr, n_m_blocks, H, GROUP)
    n_tiles = _g_key_range(m_block, s_q, s_k, CAUSAL)
    for j in range(n_tiles):
        slot = j % NUM_STAGES
        mbarrier.wait(kv_empty.index(slot), ((j // NUM_STAGES) & 1) ^ 1)    # a fresh barrier passes phase 1
        bar = kv_ready.index(slot)
        if D2 > 0:
            mbarrier.expect(bar, k_desc.block_type.nbytes + kr_desc.block_type.nbytes + v_desc.block_type.nbytes)
        else:
            mbarrier.expect(bar, k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        row = k0 + j * 64
        tma.async_copy_global_to_shared(k_desc, [row, kh * stride_kh], bar, k1.index(slot))
        if D2 > 0:
            tma.async_copy_global_to_shared(kr_desc, [row, kh * stride_kh + 128], bar, k2.index(slot))
        tma.async_copy_global_to_shared(v_desc, [row, kh * stride_vh], bar, vb.index(slot))


@_jit
def _g_consumer(q1_s, q2_s, k1, k2, vb, kv_ready, kv_empty, q_ptr, out_ptr, lse_ptr, cu_q_ptr, cu_k_ptr,
                sm_scale, scale_log2, n_m_blocks, total_q, stride_qt, stride_qh, stride_ot, stride_oh, H, GROUP,
                ROW0: gl.constexpr, D2: gl.constexpr, CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr):
    """One consumer warpgroup: query rows [ROW0, ROW0 + 64) of the CTA's 128-row block."""
    DT: gl.constexpr = k1.dtype
    L_S: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 64, 16])
    L_O: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 128, 16])
    L_P: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=L_O, k_width=2)
    L_Q: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [4, 1], [1, 0])
    m_block, h, kh, q0, s_q, k0, s_k = _g_coords(cu_q_ptr, cu_k_ptr, n_m_blocks, H, GROUP)
    n_tiles = _g_key_range(m_block, s_q, s_k, CAUSAL)
    row_lo = m_block * 128 + ROW0

    # Q rows -> this warpgroup's shared tiles (rows past the sequence load as 0 and are never stored)
    rq = row_lo + gl.arange(0, 64, gl.SliceLayout(1, L_Q))
    q_rows = q_ptr + (q0.to(gl.int64) + rq)[:, None] * stride_qt + h.to(gl.int64) * stride_qh
    okq = (rq < s_q)[:, None]
    q1_s.store(gl.load(q_rows + gl.arange(0, 128, gl.SliceLayout(0, L_Q))[None, :], mask=okq, other=0.0))
    if D2 > 0:
        q2_s.store(gl.load(q_rows + 128 + gl.arange(0, 64, gl.SliceLayout(0, L_Q))[None, :], mask=okq, other=0.0))
    fence_async_shared()
    gl.thread_barrier()

    rows = row_lo + gl.arange(0, 64, gl.SliceLayout(1, L_S))
    diag = s_k - s_q
    m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, L_S))
    l_i = gl.zeros([64], gl.float32, gl.SliceLayout(1, L_S))
    acc = gl.zeros([64, 128], gl.float32, L_O)
    s_zero = gl.zeros([64, 64], gl.float32, L_S)
    for j in range(n_tiles):
        slot = j % NUM_STAGES
        mbarrier.wait(kv_ready.index(slot), (j // NUM_STAGES) & 1)
        tok = warpgroup_mma(q1_s, k1.index(slot).permute((1, 0)), s_zero, use_acc=False, is_async=True)
        if D2 > 0:
            tok = warpgroup_mma(q2_s, k2.index(slot).permute((1, 0)), tok, is_async=True)
        s = warpgroup_mma_wait(0, deps=(tok, ))
        keys = j * 64 + gl.arange(0, 64, gl.SliceLayout(0, L_S))
        ok = (keys < s_k)[None, :]
        if CAUSAL:
            ok = ok & (keys[None, :] <= rows[:, None] + diag)
        s = gl.where(ok, s, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(s, 1))
        m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2((m_i - m_safe) * scale_log2)
        p = gl.exp2((s - m_safe[:, None]) * scale_log2)
        l_i = l_i * alpha + gl.sum(p, 1)
        m_i = m_new
        acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, L_O))[:, None]
        p_op = gl.convert_layout(p.to(DT), L_P)
        tok_o = warpgroup_mma(p_op, vb.index(slot), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(tok_o, ))
        mbarrier.arrive(kv_empty.index(slot))

    empty = l_i == 0.0
    l_safe = gl.where(empty, 1.0, l_i)
    inv = gl.where(empty, 0.0, 1.0 / l_safe)
    out = acc * gl.convert_layout(inv, gl.SliceLayout(1, L_O))[:, None]
    ro = row_lo + gl.arange(0, 64, gl.SliceLayout(1, L_O))
    o_rows = out_ptr + (q0.to(gl.int64) + ro)[:, None] * stride_ot + h.to(gl.int64) * stride_oh
    gl.store(o_rows + gl.arange(0, 128, gl.SliceLayout(0, L_O))[None, :], out.to(out_ptr.dtype.element_ty),
             mask=(ro < s_q)[:, None])
    lse = gl.where(empty, float("inf"), m_i * sm_scale + gl.log(l_safe))
    gl.store(lse_ptr + h.to(gl.int64) * total_q + q0 + rows, lse, mask=rows < s_q)


@_jit
def _dense_prefill_gluon_kernel(q_ptr, k_desc, kr_desc, v_desc, out_ptr, lse_ptr, cu_q_ptr, cu_k_ptr,
                                sm_scale, scale_log2, n_m_blocks, total_q,
                                stride_qt, stride_qh, stride_kh, stride_vh, stride_ot, stride_oh, H, GROUP,
                                D2: gl.constexpr, CAUSAL: gl.constexpr, NUM_STAGES: gl.constexpr,
                                CONSUMER_REGS: gl.constexpr, PRODUCER_REGS: gl.constexpr):
    DT: gl.constexpr = k_desc.dtype
    SH_Q1: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 128], DT)
    SH_Q2: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], DT)
    q1a = gl.allocate_shared_memory(DT, [64, 128], SH_Q1)
    q1b = gl.allocate_shared_memory(DT, [64, 128], SH_Q1)
    k1 = gl.allocate_shared_memory(DT, [NUM_STAGES] + k_desc.block_type.shape, k_desc.layout)
    vb = gl.allocate_shared_memory(DT, [NUM_STAGES] + v_desc.block_type.shape, v_desc.layout)
    if D2 > 0:
        q2a = gl.allocate_shared_memory(DT, [64, 64], SH_Q2)
        q2b = gl.allocate_shared_memory(DT, [64, 64], SH_Q2)
        k2 = gl.allocate_shared_memory(DT, [NUM_STAGES] + kr_desc.block_type.shape, kr_desc.layout)
    else:
        q2a = q1a
        q2b = q1b
        k2 = k1
    kv_ready = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    kv_empty = gl.allocate_shared_memory(gl.int64, [NUM_STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(NUM_STAGES):
        mbarrier.init(kv_ready.index(i), count=1)
        mbarrier.init(kv_empty.index(i), count=2)          # one arrive per consumer warpgroup
    gl.warp_specialize([
        (_g_consumer, (q1a, q2a, k1, k2, vb, kv_ready, kv_empty, q_ptr, out_ptr, lse_ptr, cu_q_ptr, cu_k_ptr,
                       sm_scale, scale_log2, n_m_blocks, total_q, stride_qt, stride_qh, stride_ot, stride_oh, H,
                       GROUP, 0, D2, CAUSAL, NUM_STAGES)),
        (_g_consumer, (q1b, q2b, k1, k2, vb, kv_ready, kv_empty, q_ptr, out_ptr, lse_ptr, cu_q_ptr, cu_k_ptr,
                       sm_scale, scale_log2, n_m_blocks, total_q, stride_qt, stride_qh, stride_ot, stride_oh, H,
                       GROUP, 64, D2, CAUSAL, NUM_STAGES)),
        (_g_producer, (k_desc, kr_desc, v_desc, k1, k2, vb, kv_ready, kv_empty, cu_q_ptr, cu_k_ptr, n_m_blocks, H,
                       GROUP, stride_kh, stride_vh, D2, CAUSAL, NUM_STAGES)),
    ], [4, 1], [CONSUMER_REGS, PRODUCER_REGS])


# ----------------------------------------------------------------------------------------------- host code
CONSUMER_REGS, PRODUCER_REGS, MAXNREG = 232, 40, 168


def _smem_layout(dtype_bits=16):
    return gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=dtype_bits, rank=2)


def supported(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether the experimental kernel can take this call: Gluon importable, not disabled, not the interpreter,
    CUDA sm90, bf16/fp16, d_qk 192 or 128 with d_v 128, last dims contiguous, 16-byte aligned rows of K and V (TMA)."""
    if not available() or gluon_disabled("dense_prefill") or interpret_mode() or not q.is_cuda:
        return False
    if q.dtype not in (torch.bfloat16, torch.float16) or q.shape[-1] not in (192, 128) or v.shape[-1] != 128:
        return False
    if any(t.stride(-1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16 for t in (k, v)):
        return False
    return torch.cuda.get_device_capability(q.device)[0] == 9


def launch_dense_prefill_gluon(out, lse_hm, q, k, v, cu_q, cu_k, max_seqlen_q, softmax_scale, causal):
    """Out-parameter launcher with the contract of ``dense_prefill._launch_dense_prefill`` (inputs validated by
    :func:`deepkernels.mla.dense_prefill.flash_attn_varlen_func`): out ``[total_q, h, 128]``, lse_hm ``[h, total_q]``
    fp32. K and V are addressed as 2-D ``[total_k, row pitch]`` TMA descriptors (head ``kh`` at column
    ``kh * stride(1)``), so packed qkv / kv views work without a copy."""
    total_q, h, d_qk = q.shape
    b = cu_q.shape[0] - 1
    if total_q == 0 or b == 0 or max_seqlen_q == 0:
        return
    lay = _smem_layout()
    total_k, h_k = k.shape[0], k.shape[1]
    # 2-D views [total_k, last used column + 1] with the tensors' own row pitch: TMA never reads past an element
    # the tensor itself covers (zero-fill beyond total_k / the last column)
    kc = (h_k - 1) * k.stride(1) + d_qk
    vc = (h_k - 1) * v.stride(1) + 128
    k2d = k.as_strided((total_k, kc), (k.stride(0), 1))
    v2d = v.as_strided((total_k, vc), (v.stride(0), 1))
    k_desc = TensorDescriptor(k2d, [total_k, kc], [k.stride(0), 1], [BLOCK_N, 128], lay)
    kr_desc = TensorDescriptor(k2d, [total_k, kc], [k.stride(0), 1], [BLOCK_N, 64], lay)
    v_desc = TensorDescriptor(v2d, [total_k, vc], [v.stride(0), 1], [BLOCK_N, 128], lay)
    n_m = -(-int(max_seqlen_q) // BLOCK_M)
    _dense_prefill_gluon_kernel[(n_m * b * h, )](
        q, k_desc, kr_desc, v_desc, out, lse_hm, cu_q, cu_k,
        float(softmax_scale), float(softmax_scale) * _LOG2E, n_m, total_q,
        q.stride(0), q.stride(1), k.stride(1), v.stride(1), out.stride(0), out.stride(1), h, h // k.shape[1],
        d_qk - 128, bool(causal), NUM_STAGES, CONSUMER_REGS, PRODUCER_REGS, num_warps=4, maxnreg=MAXNREG)


def compile_sm90(d_qk: int = 192, causal: bool = True, dtype: str = "bf16"):
    """Cross-compile the kernel for sm90 (no GPU needed). Returns the CompiledKernel."""
    lay = repr(_smem_layout())
    sig = {"q_ptr": f"*{dtype}", "k_desc": f"tensordesc<{dtype}[{BLOCK_N}, 128],{lay}>",
           "kr_desc": f"tensordesc<{dtype}[{BLOCK_N}, 64],{lay}>", "v_desc": f"tensordesc<{dtype}[{BLOCK_N}, 128],{lay}>",
           "out_ptr": f"*{dtype}", "lse_ptr": "*fp32", "cu_q_ptr": "*i32", "cu_k_ptr": "*i32",
           "sm_scale": "fp32", "scale_log2": "fp32", "n_m_blocks": "i32", "total_q": "i32",
           "stride_qt": "i32", "stride_qh": "i32", "stride_kh": "i32", "stride_vh": "i32", "stride_ot": "i32",
           "stride_oh": "i32", "H": "i32", "GROUP": "i32"}
    consts = dict(D2=d_qk - 128, CAUSAL=causal, NUM_STAGES=NUM_STAGES, CONSUMER_REGS=CONSUMER_REGS,
                  PRODUCER_REGS=PRODUCER_REGS)
    return _compile_sm90_gluon(_dense_prefill_gluon_kernel, sig, consts,
                               ("q_ptr", "out_ptr", "lse_ptr", "stride_qt", "stride_qh", "stride_ot", "stride_oh"),
                               num_warps=4, maxnreg=MAXNREG)
