"""deepkernels.parallel: the kernels in tensor- and expert-parallel layers on ``torch.distributed``.

- :class:`TPMLAAttention` — MLA attention with heads split across ranks (column-parallel per-head up-projections,
  row-parallel ``o_proj`` + ``all_reduce``); each rank runs ``flash_mla_with_kvcache`` at ``h_q / world_size``
  heads over its own full copy of the latent cache.
- :class:`EPMoE` — a DeepSeek-style routed MoE with experts split across ranks: counts and tokens exchanged with
  ``all_to_all_single``, local experts run with the masked grouped GEMMs; :class:`MoELayer` holds all experts.
- :mod:`~deepkernels.parallel.launch` — process-group set-up (NCCL / gloo), free port, NVLink multicast kept off,
  and a spawn helper with a hard timeout.
"""
from .launch import (MULTICAST_OFF_ENV, DistributedRunError, free_port, init_distributed, set_multicast_off,
                     shutdown_distributed, spawn_distributed)
from .tp_mla import TPMLAAttention, head_range, shard_mla_attention, shard_mla_state_dict
from .ep_moe import EPMoE, MoEConfig, MoELayer, masked_grouped_ops, moe_reference, route, run_experts_masked

__all__ = ["MULTICAST_OFF_ENV", "DistributedRunError", "free_port", "init_distributed", "set_multicast_off",
           "shutdown_distributed", "spawn_distributed", "TPMLAAttention", "head_range", "shard_mla_attention",
           "shard_mla_state_dict", "EPMoE", "MoEConfig", "MoELayer", "masked_grouped_ops", "moe_reference", "route",
           "run_experts_masked"]
