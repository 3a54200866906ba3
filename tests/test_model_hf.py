"""Cross-check of the MLA layer against Hugging Face transformers' DeepseekV3Attention (optional dependency).

Same tiny random config and weights; prefill then a few decode steps, transformers keeping its own
(compressed-latent) DynamicCache and ours the paged cache. Skipped when transformers is not installed.
"""
import pytest
import torch

from deepkernels.model import MLAAttention, MLAConfig, PagedLatentCache

pytestmark = pytest.mark.reference
transformers = pytest.importorskip("transformers")
hf_v3 = pytest.importorskip("transformers.models.deepseek_v3.modeling_deepseek_v3")

ROPE = {
    "yarn": dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=32,
                 beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
    "yarn-mscale": dict(rope_type="yarn", rope_theta=5000.0, factor=4.0, original_max_position_embeddings=32,
                        beta_fast=16, beta_slow=2, mscale=0.9, mscale_all_dim=0.7),
    "plain": dict(rope_type="default", rope_theta=10000.0),
}


def hf_pair(rope, q_lora_rank):
    from transformers import DeepseekV3Config
    from transformers.cache_utils import DynamicCache

    hcfg = DeepseekV3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_lora_rank,
                            kv_lora_rank=512, qk_nope_head_dim=16, qk_rope_head_dim=64, v_head_dim=16,
                            max_position_embeddings=128, rope_parameters=dict(ROPE[rope]), num_hidden_layers=1,
                            attn_implementation="eager")
    att = hf_v3.DeepseekV3Attention(hcfg, layer_idx=0).double().eval()
    with torch.no_grad():
        for p in att.parameters():
            p.normal_(0, 0.1)
    rot = hf_v3.DeepseekV3RotaryEmbedding(hcfg).double()
    return hcfg, att, rot, DynamicCache(config=hcfg)


@torch.no_grad()
@pytest.mark.parametrize("rope,q_lora_rank", [("yarn", 32), ("yarn-mscale", 32), ("plain", None)])
def test_matches_transformers_prefill_and_decode(rope, q_lora_rank):
    hcfg, att, rot, hf_cache = hf_pair(rope, q_lora_rank)
    cfg = MLAConfig.from_hf_config(hcfg.to_dict())
    assert cfg.softmax_scale == pytest.approx(att.scaling, rel=1e-12)
    ref = MLAAttention(cfg, dtype=torch.float64)
    ref.load_state_dict(att.state_dict())                        # same key names
    low = MLAAttention(cfg, dtype=torch.bfloat16)
    low.load_state_dict(att.state_dict())
    b, s = 2, 9
    c_ref = PagedLatentCache(b, 128, 576, "fp64")
    c_low = PagedLatentCache(b, 128, 576, "bf16", block_table=torch.randperm(4).to(torch.int32).view(2, 2))
    pos = 0
    for n in (s, 1, 1, 1):
        x = torch.randn(b, n, 64, dtype=torch.float64)
        cos, sin = rot(x, torch.arange(pos, pos + n).expand(b, n))
        mask = None
        if n > 1:
            mask = torch.full((n, pos + n), float("-inf"), dtype=torch.float64).triu(pos + 1)[None, None]
        y_hf, _ = att(x, (cos, sin), mask, cache=hf_cache)
        y_ref = ref(x, c_ref, path="naive")
        y_abs = low(x.bfloat16(), c_low, path="absorbed")
        # float64 vs float64 (transformers builds cos/sin in float32): tight
        assert torch.allclose(y_ref, y_hf, rtol=1e-5, atol=1e-5 * y_hf.abs().max().item())
        # bf16 weights and cache through flash_mla_with_kvcache: bf16 tolerance
        err = ((y_abs.double() - y_hf).norm() / y_hf.norm()).item()
        assert err < 2e-2, (n, err)
        pos += n
