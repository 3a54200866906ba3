"""FP8 projections of the MLA layer (deepkernels.model.FP8Linear, MLAAttention.quantize_projections_, FP8 checkpoint
loading): reference tier on CPU tensors and the interpreter tier through the real Triton GEMM kernel."""
import pytest
import torch

from deepkernels.model import MLAAttention, MLAConfig
from deepkernels.model.fp8_linear import FP8Linear
from deepkernels.testing import calc_diff

TIERS = [pytest.param("reference", marks=pytest.mark.reference), pytest.param("interpret", marks=pytest.mark.interpret)]


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("k,n", [(256, 128), (208, 72), (512, 576)])
def test_fp8_linear_matches_float64(k, n, tier):
    lin = torch.nn.Linear(k, n, bias=False)
    with torch.no_grad():
        lin.weight.normal_(0, 0.05)
    f = FP8Linear.from_linear(lin)
    x = torch.randn(3, 5, k).bfloat16()
    y = f(x)
    assert y.shape == (3, 5, n) and y.dtype == torch.bfloat16
    # against the exact product of the *quantised* weight: only the activation quantisation and rounding remain
    ref = x.double() @ f.dequantized_weight(torch.float64).T
    assert float(calc_diff(y, ref)) < 1e-3
    # and against the original weight: the weight quantisation adds about as much again
    assert float(calc_diff(y, x.double() @ lin.weight.double().T)) < 2e-3
    with pytest.raises(ValueError, match="in_features"):
        f(torch.randn(2, k + 1).bfloat16())


@pytest.mark.reference
def test_fp8_linear_rejects_bias_and_unaligned_rows():
    with pytest.raises(ValueError, match="bias"):
        FP8Linear.from_linear(torch.nn.Linear(128, 128, bias=True))
    with pytest.raises(ValueError, match="in_features"):
        FP8Linear.from_linear(torch.nn.Linear(200, 128, bias=False))


def _cfg():
    return MLAConfig(hidden_size=256, num_heads=4, q_lora_rank=128, kv_lora_rank=512, qk_nope_head_dim=32,
                     qk_rope_head_dim=64, v_head_dim=32, max_position_embeddings=256)


@pytest.mark.reference
@pytest.mark.parametrize("fold_output", [False, True])
def test_layer_with_fp8_projections_tracks_the_bf16_layer(fold_output):
    torch.manual_seed(0)
    dense = MLAAttention(_cfg(), dtype=torch.bfloat16)
    for p in dense.parameters():
        torch.nn.init.normal_(p, 0, 0.05) if p.dim() == 2 else torch.nn.init.ones_(p)
    fp8 = MLAAttention(_cfg(), dtype=torch.bfloat16)
    fp8.load_state_dict(dense.state_dict())
    fp8.quantize_projections_()
    assert isinstance(fp8.o_proj, FP8Linear) and isinstance(fp8.q_b_proj, FP8Linear)
    assert isinstance(fp8.kv_b_proj, torch.nn.Linear)           # per-head halves used by the absorbed path
    h = torch.randn(2, 7, 256).bfloat16()
    y_dense = dense(h, fold_output=fold_output)
    y_fp8 = fp8(h, fold_output=fold_output)
    assert y_fp8.shape == y_dense.shape and torch.isfinite(y_fp8).all()
    # four FP8 GEMMs (weights and activations quantised to e4m3) in series vs the bf16 layer
    assert float(calc_diff(y_fp8, y_dense)) < 5e-3


@pytest.mark.reference
def test_fp8_checkpoint_loads_projections_as_stored(tmp_path, monkeypatch):
    """fp8_projections=True keeps the checkpoint's e4m3 weights and 128x128 scales bit for bit (no dequantise /
    requantise round trip through bf16) and the layer runs through the FP8 GEMM."""
    pytest.importorskip("safetensors.torch")
    import test_model_checkpoint as tmc
    from safetensors.torch import load_file
    from deepkernels.model.checkpoint import load_mla_attention

    monkeypatch.setitem(tmc.HF_CONFIG, "hidden_size", 256)
    monkeypatch.setitem(tmc.HF_CONFIG, "q_lora_rank", 128)
    cfg, _ = tmc.write_checkpoint(tmp_path, layer=1, sharded=False)
    stored = load_file(str(tmp_path / "model.safetensors"))
    mod = load_mla_attention(str(tmp_path / "model.safetensors"), layer=1, cfg=cfg, dtype=torch.bfloat16,
                             fp8_projections=True)
    sd = mod.state_dict()
    for name in ("q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj"):
        assert isinstance(getattr(mod, name), FP8Linear), name
        key = f"model.layers.1.self_attn.{name}.weight"
        assert torch.equal(sd[f"{name}.weight"].view(torch.uint8), stored[key].view(torch.uint8)), name
        assert torch.equal(sd[f"{name}.weight_scale_inv"], stored[key + "_scale_inv"]), name
    dense = load_mla_attention(str(tmp_path / "model.safetensors"), layer=1, cfg=cfg, dtype=torch.bfloat16)
    h = torch.randn(1, 5, 256).bfloat16()
    assert float(calc_diff(mod(h), dense(h))) < 5e-3
