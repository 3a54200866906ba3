"""`deep_gemm`-named module: DeepGEMM's Python API (docs/spec/gemm.md §1, §7) served by deepkernels.

Names are resolved lazily; an upstream name deepkernels does not implement raises AttributeError saying so.
"""
from ._forward import make_dir, make_getattr

__version__ = "2.6.1"  # the DeepGEMM API revision these signatures follow (54e2261)

_DK = "deepkernels"
_MAP = {n: f"{_DK}:{n}" for n in [
    # dense
    "fp8_gemm_nt", "fp8_gemm_nn", "fp8_gemm_tn", "fp8_gemm_tt",
    "bf16_gemm_nt", "bf16_gemm_nn", "bf16_gemm_tn", "bf16_gemm_tt",
    # grouped
    "m_grouped_fp8_gemm_nt_contiguous", "m_grouped_fp8_gemm_nn_contiguous", "m_grouped_fp8_gemm_nt_masked",
    "m_grouped_bf16_gemm_nt_contiguous", "m_grouped_bf16_gemm_nn_contiguous", "m_grouped_bf16_gemm_nt_masked",
    "k_grouped_fp8_gemm_nt_contiguous", "k_grouped_fp8_gemm_tn_contiguous", "k_grouped_bf16_gemm_tn_contiguous",
    # layout utilities and knobs
    "transform_sf_into_required_layout", "get_tma_aligned_size", "get_mn_major_tma_aligned_tensor",
    "get_mn_major_tma_aligned_packed_ue8m0_tensor", "get_mk_alignment_for_contiguous_layout",
    "set_mk_alignment_for_contiguous_layout", "get_theoretical_mk_alignment_for_contiguous_layout",
    "set_num_sms", "get_num_sms", "set_tc_util", "get_tc_util", "set_pdl", "get_pdl", "set_ignore_compile_dims",
    "set_block_size_multiple_of",
]}
# upstream aliases
_MAP.update({
    "fp8_fp4_gemm_nt": f"{_DK}:fp8_gemm_nt", "fp8_fp4_gemm_nn": f"{_DK}:fp8_gemm_nn",
    "fp8_fp4_gemm_tn": f"{_DK}:fp8_gemm_tn", "fp8_fp4_gemm_tt": f"{_DK}:fp8_gemm_tt",
    "m_grouped_fp8_fp4_gemm_nt_contiguous": f"{_DK}:m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_fp4_gemm_nn_contiguous": f"{_DK}:m_grouped_fp8_gemm_nn_contiguous",
    "m_grouped_fp8_fp4_gemm_nt_masked": f"{_DK}:m_grouped_fp8_gemm_nt_masked",
    "fp8_m_grouped_gemm_nt_masked": f"{_DK}:m_grouped_fp8_gemm_nt_masked",
    "bf16_m_grouped_gemm_nt_masked": f"{_DK}:m_grouped_bf16_gemm_nt_masked",
    "get_m_alignment_for_contiguous_layout": f"{_DK}:get_mk_alignment_for_contiguous_layout",
    "get_k_alignment_for_contiguous_layout": f"{_DK}:get_mk_alignment_for_contiguous_layout",
    "get_col_major_tma_aligned_tensor": f"{_DK}:get_mn_major_tma_aligned_tensor",
    "calc_diff": f"{_DK}.testing:calc_diff",
    "ceil_div": f"{_DK}:ceil_div",
    "align": f"{_DK}:align",
})
# the test utilities DeepGEMM ships in deep_gemm.utils
for _n in ["per_token_cast_to_fp8", "per_channel_cast_to_fp8", "per_block_cast_to_fp8", "cast_back_from_fp8",
           "ceil_to_ue8m0"]:
    _MAP[_n] = f"{_DK}:{_n}"

# upstream API (docs/spec/gemm.md §0, DeepGEMM 54e2261) that deepkernels does not serve
NOT_IMPLEMENTED = {
    **{n: "V3.2 indexer MQA logits" for n in ["fp8_mqa_logits", "fp8_paged_mqa_logits", "get_paged_mqa_logits_metadata",
                                             "fp8_fp4_mqa_logits", "fp8_fp4_paged_mqa_logits"]},
    "fp8_gemm_nt_skip_head_mid": "FP8 GEMM with a head-skip epilogue",
    "einsum": "BF16 einsum / batched GEMM", "fp8_einsum": "FP8 einsum / batched GEMM",
    "tf32_hc_prenorm_gemm": "HyperConnection pre-norm GEMM",
    **{f"cublaslt_gemm_{x}": "cuBLASLt wrapper" for x in ("nt", "nn", "tn", "tt")},
    **{n: "Mega MoE (SM100 only upstream)" for n in ["fp8_fp4_mega_moe", "bf16_mega_moe", "get_symm_buffer_for_mega_moe",
                                                   "transform_weights_for_mega_moe", "SymmBuffer"]},
    "get_k_grouped_mn_major_tma_aligned_packed_ue8m0_tensor": "packed UE8M0 layout for k-grouped SM100 GEMMs",
}

__all__ = sorted(_MAP)
__getattr__ = make_getattr(__name__, "deep_gemm", _MAP, NOT_IMPLEMENTED)
__dir__ = make_dir(_MAP, ("utils", "testing"))
__path__: list[str] = []  # a package for the import system, so `deep_gemm.utils` / `deep_gemm.testing` resolve
