"""Compile tier: every dense-GEMM candidate config cross-compiles for sm90 with wgmma + TMA, fits 227 KB of
shared memory, declares no local memory in PTX, and (ptxas -v) spills at most a few registers."""

import pytest

from deepkernels.gemm._configs import (BF16_CANDIDATES, BF16_TABLE, FP8_CANDIDATES, FP8_TABLE, FP8_WS_EXPERIMENTAL,
                                       GemmConfig)
from deepkernels.testing import SM90_SMEM_LIMIT, compile_sm90
from deepkernels.testing.compile import ptxas_sm90

pytestmark = pytest.mark.compile

MAX_SPILL_BYTES = 64  # a few spilled registers at 255/thread are tolerated; > 1 KB configs were dropped

_FP8_SIG = {"a_ptr": "*fp8e4nv", "b_ptr": "*fp8e4nv", "d_ptr": "*bf16", "sfa_ptr": "*fp32", "sfb_ptr": "*fp32",
            "ws_ptr": "*fp32", "M": "i32", "N": "i32", "K": "i32", "stride_am": "i32", "stride_bn": "i32",
            "stride_dm": "i32", "sfa_sm": "i32", "sfa_sk": "i32", "sfb_sn": "i32", "sfb_sk": "i32",
            "num_progs": "i32"}
_BF16_SIG = {"a_ptr": "*bf16", "b_ptr": "*bf16", "d_ptr": "*bf16", "ws_ptr": "*fp32", "M": "i32", "N": "i32",
             "K": "i32", "stride_a": "i32", "stride_b": "i32", "stride_dm": "i32", "num_progs": "i32"}


WS_MAX_SPILL_BYTES = 512  # autoWS kernels: ptxas reports ~360 B (measured on sm90 cross-compiles)


def _fp8(cfg: GemmConfig, per_row=False, acc=False, out="*bf16"):
    from deepkernels.gemm._fp8_kernels import _fp8_gemm_nt_kernel, _fp8_gemm_nt_ws_kernel
    sig = dict(_FP8_SIG, d_ptr=out)
    if cfg.warp_spec:
        sig.pop("ws_ptr")
        return compile_sm90(_fp8_gemm_nt_ws_kernel, sig, dict(
            SFB_PER_ROW=per_row, ACCUMULATE=acc, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=128,
            GROUP_M=cfg.group_m, NUM_STAGES=cfg.num_stages), num_warps=4, num_stages=cfg.num_stages)
    return compile_sm90(_fp8_gemm_nt_kernel, sig, dict(
        SFB_PER_ROW=per_row, ACCUMULATE=acc, SPLIT_K=cfg.split_k, TMA_STORE=cfg.tma_store and cfg.split_k == 1,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=128, GROUP_M=cfg.group_m, NUM_STAGES=cfg.num_stages,
        FLATTEN=cfg.flatten), num_warps=cfg.num_warps, num_stages=cfg.num_stages)


def _check(c, cfg, max_spill=MAX_SPILL_BYTES):
    assert c.has_wgmma, f"{cfg.name()}: no wgmma"
    assert c.has_tma, f"{cfg.name()}: no TMA"
    assert c.shared <= SM90_SMEM_LIMIT, f"{cfg.name()}: {c.shared} B shared memory"
    assert not c.uses_local_memory, f"{cfg.name()}: local memory in PTX"
    rep = ptxas_sm90(c.ptx)
    spill = rep.spill_bytes if rep is not None else 0
    assert spill <= max_spill, f"{cfg.name()}: ptxas spills {spill} B"


_FP8_ALL = list(dict.fromkeys(FP8_CANDIDATES + list(FP8_TABLE.values()) + FP8_WS_EXPERIMENTAL))
_BF16_ALL = list(dict.fromkeys(BF16_CANDIDATES + list(BF16_TABLE.values())))


@pytest.mark.parametrize("cfg", _FP8_ALL, ids=lambda c: c.name())
def test_fp8_config_compiles_for_sm90(cfg):
    c = _fp8(cfg)
    _check(c, cfg, max_spill=WS_MAX_SPILL_BYTES if cfg.warp_spec else MAX_SPILL_BYTES)
    if cfg.warp_spec:  # the autoWS pass silently gives up on some loop bodies: make sure it specialised
        assert "ttg.warp_specialize" in c.ttgir, f"{cfg.name()}: not warp-specialised"
        assert "setmaxnreg" in c.ptx


def test_fp8_ws_variants_compile():
    """The warp-specialised kernel also specialises with per-row weight scales and with C accumulation."""
    cfg = GemmConfig(128, 128, 4, 4, warp_spec=True)
    for per_row, acc, out in ((True, False, "*bf16"), (False, True, "*fp32")):
        c = _fp8(cfg, per_row=per_row, acc=acc, out=out)
        assert "ttg.warp_specialize" in c.ttgir
        _check(c, cfg, max_spill=2048)  # the C load in the epilogue costs registers (~1.3 KB spill)


def test_fp8_variants_compile():
    cfg = GemmConfig(64, 128, 4, 4)
    # 1D1D (weight-gradient recipe): the [BM, BN] scale product costs registers; a few hundred bytes of spill
    _check(_fp8(cfg, per_row=True, acc=True, out="*fp32"), cfg, max_spill=512)
    cfg = GemmConfig(64, 256, 8, 3)  # BLOCK_N > 128: per-column weight scales
    _check(_fp8(cfg, acc=True), cfg, max_spill=512)


@pytest.mark.parametrize("cfg", _BF16_ALL, ids=lambda c: c.name())
@pytest.mark.parametrize("majors", [(True, True), (False, False)])
def test_bf16_config_compiles_for_sm90(cfg, majors):
    from deepkernels.gemm._bf16_kernels import _bf16_gemm_nt_kernel
    c = compile_sm90(_bf16_gemm_nt_kernel, _BF16_SIG, dict(
        A_KMAJOR=majors[0], B_KMAJOR=majors[1], ACCUMULATE=False, SPLIT_K=cfg.split_k, UPCAST=False,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_K=cfg.block_k, GROUP_M=cfg.group_m,
        NUM_STAGES=cfg.num_stages), num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    _check(c, cfg)


def test_splitk_reduce_compiles():
    from deepkernels.gemm._fp8_kernels import _gemm_splitk_reduce_kernel
    c = compile_sm90(_gemm_splitk_reduce_kernel, {"ws_ptr": "*fp32", "d_ptr": "*bf16", "total": "i64", "N": "i32",
                                                  "stride_dm": "i32"},
                     dict(SPLIT_K=2, ACCUMULATE=True, BLOCK=1024), num_warps=4)
    assert not c.uses_local_memory


def test_kernels_compile_with_unit_sizes():
    """Triton turns integer arguments equal to 1 into constexprs (M = 1, N = 1, unit strides): no kernel may
    call tensor methods on them (found on the H200: ``M.to()`` failed for M = 1 with split-K)."""
    from deepkernels.gemm._fp8_kernels import _fp8_gemm_nt_kernel, _gemm_splitk_reduce_kernel
    from deepkernels.gemm._bf16_kernels import _bf16_gemm_nt_kernel
    cfg = dict(SFB_PER_ROW=False, ACCUMULATE=True, SPLIT_K=2, TMA_STORE=False, BLOCK_M=64, BLOCK_N=64, BLOCK_K=128,
               GROUP_M=8, NUM_STAGES=3)
    ones = {"M": 1, "N": 1, "stride_dm": 1, "sfa_sm": 1, "sfb_sn": 1, "sfb_sk": 1}
    sig = {k: v for k, v in _FP8_SIG.items() if k not in ones}
    compile_sm90(_fp8_gemm_nt_kernel, sig, {**cfg, **ones}, num_warps=4, num_stages=3)
    compile_sm90(_gemm_splitk_reduce_kernel, {"ws_ptr": "*fp32", "d_ptr": "*bf16"},
                 dict(total=1, N=1, stride_dm=1, SPLIT_K=2, ACCUMULATE=True, BLOCK=1024), num_warps=4)
    bsig = {k: v for k, v in _BF16_SIG.items() if k not in ("M", "N", "stride_dm")}
    compile_sm90(_bf16_gemm_nt_kernel, bsig, dict(M=1, N=1, stride_dm=1, A_KMAJOR=True, B_KMAJOR=False,
                                                 ACCUMULATE=True, SPLIT_K=2, UPCAST=False, BLOCK_M=64, BLOCK_N=64,
                                                 BLOCK_K=64, GROUP_M=8, NUM_STAGES=3), num_warps=4, num_stages=3)
