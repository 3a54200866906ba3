"""deepkernels.model: the DeepSeek-V3 MLA layer on top of the kernels, KV-cache accounting and the roofline.

- :class:`MLAConfig` / :class:`YarnScaling` — V3 attention geometry, RoPE theta and YaRN scaling.
- :class:`MLAAttention` — the layer with its naive (MHA) and absorbed (MQA over the latent through
  ``flash_mla_with_kvcache``) forward paths; :class:`PagedLatentCache` — the paged [c_KV ‖ k_R] cache in BF16 or a
  packed FP8/FP4 format.
- :func:`load_mla_attention` — attention weights from a DeepSeek-V3 safetensors checkpoint (FP8 + weight_scale_inv).
- :mod:`~deepkernels.model.kv_accounting` — bytes per token per layer; :mod:`~deepkernels.model.roofline` — FLOPs,
  bytes and the compute/memory verdict per op.
"""
from .config import MLAConfig, YarnScaling, yarn_get_mscale
from .rope import apply_rope, rope_cos_sin, rope_inv_freq
from .kv_cache import PagedLatentCache
from .fp8_linear import FP8Linear
from .mla import MLAAttention, RMSNorm, latent_attention
from .kv_accounting import kv_bytes_per_token, seed_table
from .checkpoint import load_mla_attention, read_attention_state_dict
from .roofline import GPUS, mla_decode_ops

__all__ = ["FP8Linear", "MLAConfig", "YarnScaling", "yarn_get_mscale", "apply_rope", "rope_cos_sin", "rope_inv_freq",
           "PagedLatentCache", "MLAAttention", "RMSNorm", "latent_attention", "kv_bytes_per_token", "seed_table",
           "load_mla_attention", "read_attention_state_dict", "GPUS", "mla_decode_ops"]
