"""deepkernels.rails: Blackwell multi-rail GEMM, a checked model of ``tcgen05.mma.ws`` and a TMEM planner.

Hopper has no tensor memory, so nothing here runs on a GPU. It is a faithful, tested model a kernel author
can plan an SM100 kernel with (docs/rails.md has the plan for a real SM100 path):

- :mod:`.tmem`      — TMEM as 128 lanes × 512 columns × 32 bit, bit-exact, with the per-warp lane restriction.
- :mod:`.mma_ws`    — ``tcgen05.mma.ws`` kind::f16 at M = 32/64/128, N = 64/128/256, K = 16: per-lane-group A
                      from TMEM, B from shared memory, D slice g back to lane group g (Layouts D, E, G).
- :mod:`.multirail` — the official filling (A copied, N split by tokens, P = [D0 | D1]) and FlashMLA's
                      multi-rail one (Q's features split into rails by interleaved 64-wide blocks, K re-viewed
                      as R·T × D/R, P = D0 + D1), and the wrong variant that yields cross terms.
- :mod:`.reduce`    — mask-before-reduce of the rails' partials, FlashMLA's ``retrieve_mask_and_reduce_p``
                      step by step, and where a NaN in a masked K row leaks.
- :mod:`.planner`   — TMEM plan of a decode CTA (O, Q, P columns; refuses > 512) and the seed's §3.1 table.
- :mod:`.cli`       — ``python -m deepkernels.rails plan --heads 64 --d 512 --topk-block 64``.

Sources: shared/seeds/multi-rail-gemm.zh.txt; docs/spec/mla.md §1.3, §8; PTX ISA 9.5 §9.7.18 (tcgen05).
"""
from .tmem import (LANES_PER_WARP, TMEM_BYTES, TMEM_CELL_BITS, TMEM_COLUMNS, TMEM_LANES, TensorMemory,
                   columns_for, elements_per_column)
from .mma_ws import (K_PER_INSTRUCTION, WS_M, WS_N, DatapathLayout, WsInstr, datapath_layout, load_d_groups,
                     mma_ws_gemm, store_a_groups, tcgen05_mma_ws)
from .multirail import (RAIL_BLOCK, QKOnWs, combine_multirail, combine_official, kv_smem_tiles, merge_rails,
                        multirail_operands, official_operands, qk_multirail_ws, qk_official_ws, rail_feature_index,
                        rail_partials, rail_view_kv, split_rails, wrong_multirail_operands, ws_formula)
from .reduce import mask_then_reduce, masked_scores_reference, reduce_then_mask, retrieve_mask_and_reduce_p
from .planner import (DTYPES, DecodeConfig, QKResources, TmemOverflowError, TmemPlan, TmemRegion,
                      format_resource_table, plan_tmem, qk_resources, resource_table)

__all__ = [
    "LANES_PER_WARP", "TMEM_BYTES", "TMEM_CELL_BITS", "TMEM_COLUMNS", "TMEM_LANES", "TensorMemory", "columns_for",
    "elements_per_column",
    "K_PER_INSTRUCTION", "WS_M", "WS_N", "DatapathLayout", "WsInstr", "datapath_layout", "load_d_groups",
    "mma_ws_gemm", "store_a_groups", "tcgen05_mma_ws",
    "RAIL_BLOCK", "QKOnWs", "combine_multirail", "combine_official", "kv_smem_tiles", "merge_rails",
    "multirail_operands", "official_operands", "qk_multirail_ws", "qk_official_ws", "rail_feature_index",
    "rail_partials", "rail_view_kv", "split_rails", "wrong_multirail_operands", "ws_formula",
    "mask_then_reduce", "masked_scores_reference", "reduce_then_mask", "retrieve_mask_and_reduce_p",
    "DTYPES", "DecodeConfig", "QKResources", "TmemOverflowError", "TmemPlan", "TmemRegion",
    "format_resource_table", "plan_tmem", "qk_resources", "resource_table",
]
