"""Loading MLA attention weights from a tiny DeepSeek-V3-format safetensors checkpoint the test writes."""
import json

import pytest
import torch

from deepkernels.model import MLAAttention, MLAConfig, YarnScaling
from deepkernels.model.checkpoint import attention_key_names, load_mla_attention, read_attention_state_dict

pytestmark = pytest.mark.reference
safetensors_torch = pytest.importorskip("safetensors.torch")
quant = pytest.importorskip("deepkernels.quant")

HF_CONFIG = {"hidden_size": 200, "num_attention_heads": 4, "q_lora_rank": 136, "kv_lora_rank": 512,
             "qk_nope_head_dim": 16, "qk_rope_head_dim": 64, "v_head_dim": 16, "rope_theta": 10000.0,
             "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "num_hidden_layers": 2,
             "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32,
                              "beta_fast": 32, "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0}}


def write_checkpoint(tmp_path, layer=1, sharded=True):
    """Random attention weights for ``layer``: projections as FP8 + 128×128 weight_scale_inv (DeepSeek-V3's
    layout; sizes that are not multiples of 128 included), norms as bf16. Returns the dequantized weights."""
    cfg = MLAConfig.from_hf_config(HF_CONFIG)
    pre = f"model.layers.{layer}.self_attn."
    shapes = {k: tuple(v.shape) for k, v in MLAAttention(cfg, device="meta").state_dict().items()}
    tensors, expect = {}, {}
    for name in attention_key_names(cfg):
        if "layernorm" in name:
            w = (1 + 0.1 * torch.randn(shapes[name])).bfloat16()
            tensors[pre + name], expect[name] = w, w.float()
        else:
            w = torch.randn(shapes[name]) * 0.05
            w8, sf = quant.per_block_cast_to_fp8(w)
            tensors[pre + name], tensors[pre + name + "_scale_inv"] = w8, sf
            expect[name] = w8.float() * sf.repeat_interleave(128, 0)[:w.shape[0]].repeat_interleave(128, 1)[:, :w.shape[1]]
    tensors["model.layers.0.self_attn.o_proj.weight"] = torch.zeros(3)        # another layer: never read
    (tmp_path / "config.json").write_text(json.dumps(HF_CONFIG))
    if sharded:
        keys = sorted(tensors)
        shards = {"model-00001-of-00002.safetensors": keys[::2], "model-00002-of-00002.safetensors": keys[1::2]}
        for fn, ks in shards.items():
            safetensors_torch.save_file({k: tensors[k].contiguous() for k in ks}, str(tmp_path / fn))
        index = {"weight_map": {k: fn for fn, ks in shards.items() for k in ks}}
        (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    else:
        safetensors_torch.save_file(tensors, str(tmp_path / "model.safetensors"))
    return cfg, expect


@pytest.mark.parametrize("sharded", [True, False])
def test_load_fp8_checkpoint(tmp_path, sharded):
    cfg, expect = write_checkpoint(tmp_path, layer=1, sharded=sharded)
    path = str(tmp_path) if sharded else str(tmp_path / "model.safetensors")
    mod = load_mla_attention(path, layer=1, dtype=torch.float32, cfg=None if sharded else cfg)
    assert mod.cfg == cfg and mod.cfg.rope_scaling == YarnScaling(factor=4.0, original_max_position_embeddings=32)
    sd = mod.state_dict()
    for name, w in expect.items():
        assert torch.equal(sd[name], w), name                  # W8 · S, exact in float32
    x = torch.randn(1, 3, 200)
    with torch.no_grad():
        assert torch.isfinite(mod(x, path="naive")).all()
    bf = read_attention_state_dict(path, 1, cfg, dtype=torch.bfloat16)
    assert all(t.dtype == torch.bfloat16 for t in bf.values())


def test_checkpoint_errors(tmp_path):
    cfg, _ = write_checkpoint(tmp_path, layer=1, sharded=False)
    path = str(tmp_path / "model.safetensors")
    with pytest.raises(KeyError, match="model.layers.0.self_attn.q_a_proj.weight"):
        read_attention_state_dict(path, 0, cfg)
    with pytest.raises(ValueError, match="does not match"):
        read_attention_state_dict(path, 1, MLAConfig.from_hf_config({**HF_CONFIG, "num_attention_heads": 2}))
    t = safetensors_torch.load_file(path)
    t["model.layers.1.self_attn.o_proj.weight_scale_inv"] = torch.ones(1, 1)
    safetensors_torch.save_file(t, path)
    with pytest.raises(ValueError, match="weight_scale_inv"):
        read_attention_state_dict(path, 1, cfg)
    del t["model.layers.1.self_attn.o_proj.weight_scale_inv"]
    safetensors_torch.save_file(t, path)
    with pytest.raises(KeyError, match="weight_scale_inv"):
        read_attention_state_dict(path, 1, cfg)
    with pytest.raises(FileNotFoundError):
        load_mla_attention(str(tmp_path / "nope"))
