"""Load one layer's attention weights from a DeepSeek-V3-format safetensors checkpoint.

Key names are those of the published DeepSeek-V3/R1 checkpoints (Hugging Face layout)::

    model.layers.{L}.self_attn.q_a_proj.weight            float8_e4m3fn [q_lora_rank, hidden]
    model.layers.{L}.self_attn.q_a_proj.weight_scale_inv  float32 [ceil(N/128), ceil(K/128)]
    model.layers.{L}.self_attn.q_a_layernorm.weight       bf16 [q_lora_rank]
    model.layers.{L}.self_attn.q_b_proj.weight (+ _scale_inv)          [H·(nope+rope), q_lora_rank]
    model.layers.{L}.self_attn.kv_a_proj_with_mqa.weight (+ _scale_inv) [kv_lora_rank + rope, hidden]
    model.layers.{L}.self_attn.kv_a_layernorm.weight                    [kv_lora_rank]
    model.layers.{L}.self_attn.kv_b_proj.weight (+ _scale_inv)          [H·(nope+v), kv_lora_rank]
    model.layers.{L}.self_attn.o_proj.weight (+ _scale_inv)             [hidden, H·v]

An FP8 weight W8 with its 128×128 block scales S is the matrix ``W = W8 · S[n // 128, k // 128]`` (S is the
*inverse* quantization scale, i.e. amax/448 of the block), dequantized in float32 with
:func:`deepkernels.quant.cast_back_from_fp8` and rounded once to the requested dtype. BF16/FP32 weights without
a scale are taken as they are. The checkpoint may be one ``.safetensors`` file, or a directory with
``model.safetensors.index.json`` (sharded) or ``*.safetensors`` files, and ``config.json`` for the config.
"""
from __future__ import annotations

import glob
import json
import os

import torch

from .config import MLAConfig
from .mla import MLAAttention

__all__ = ["ATTENTION_KEYS", "attention_key_names", "read_attention_state_dict", "load_mla_attention",
           "dequantize_fp8_weight"]

#: Parameter names of the attention block, relative to ``model.layers.{L}.self_attn.``.
ATTENTION_KEYS = ("q_a_proj.weight", "q_a_layernorm.weight", "q_b_proj.weight", "kv_a_proj_with_mqa.weight",
                  "kv_a_layernorm.weight", "kv_b_proj.weight", "o_proj.weight")
_Q_DIRECT_KEYS = ("q_proj.weight", "kv_a_proj_with_mqa.weight", "kv_a_layernorm.weight", "kv_b_proj.weight",
                  "o_proj.weight")
PREFIX = "model.layers.{layer}.self_attn."


def attention_key_names(cfg: MLAConfig) -> tuple[str, ...]:
    """The module parameter names (= checkpoint key suffixes) for this config (``q_proj`` when q_lora_rank=None)."""
    return ATTENTION_KEYS if cfg.q_lora_rank is not None else _Q_DIRECT_KEYS


def dequantize_fp8_weight(weight: torch.Tensor, scale_inv: torch.Tensor, out_dtype=torch.float32,
                          block: int = 128) -> torch.Tensor:
    """``weight [N, K]`` float8_e4m3fn × ``scale_inv [ceil(N/block), ceil(K/block)]`` float32 → ``[N, K]``.

    Raises ValueError when the scale grid does not match the weight (from the quant helper).
    """
    from deepkernels.quant import cast_back_from_fp8
    if tuple(scale_inv.shape) != (-(-weight.shape[0] // block), -(-weight.shape[1] // block)):
        raise ValueError(f"weight_scale_inv must have shape [ceil(N/{block}), ceil(K/{block})] = "
                         f"[{-(-weight.shape[0] // block)}, {-(-weight.shape[1] // block)}] for weight "
                         f"{list(weight.shape)}, got {list(scale_inv.shape)}")
    return cast_back_from_fp8(weight, scale_inv.float(), gran_k=block, out_dtype=torch.float32).to(out_dtype)


def _key_to_file(path: str) -> tuple[dict[str, str], str]:
    """Map every tensor name to the safetensors file holding it; also return the checkpoint directory."""
    if os.path.isfile(path):
        from safetensors import safe_open
        with safe_open(path, framework="pt") as f:
            return {k: path for k in f.keys()}, os.path.dirname(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"checkpoint path {path!r} is neither a .safetensors file nor a directory")
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as fh:
            wm = json.load(fh)["weight_map"]
        return {k: os.path.join(path, v) for k, v in wm.items()}, path
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files or model.safetensors.index.json in {path!r}")
    from safetensors import safe_open
    out = {}
    for fn in files:
        with safe_open(fn, framework="pt") as f:
            out.update({k: fn for k in f.keys()})
    return out, path


def read_attention_state_dict(path: str, layer: int, cfg: MLAConfig, dtype: torch.dtype = torch.bfloat16,
                              prefix: str = PREFIX, keep_fp8: bool = False) -> dict[str, torch.Tensor]:
    """Layer ``layer``'s attention weights as a state dict for :class:`MLAAttention` (FP8 weights dequantized).

    ``keep_fp8``: the FP8 weights of the projections :class:`MLAAttention` can run in FP8
    (``MLAAttention.FP8_PROJECTIONS``) are returned as stored — e4m3 ``{name}.weight`` plus float32
    ``{name}.weight_scale_inv`` — for a module after ``quantize_projections_()``; everything else is dequantized.
    Raises KeyError naming a missing tensor, ValueError for a tensor whose shape does not fit ``cfg``.
    """
    from safetensors import safe_open
    where, _ = _key_to_file(path)
    pre = prefix.format(layer=layer)
    ref = MLAAttention(cfg, device="meta").state_dict()
    out: dict[str, torch.Tensor] = {}
    handles: dict[str, object] = {}
    try:
        def get(key):
            fn = where[key]
            if fn not in handles:
                handles[fn] = safe_open(fn, framework="pt").__enter__()
            return handles[fn].get_tensor(key)

        for name in attention_key_names(cfg):
            key = pre + name
            if key not in where:
                raise KeyError(f"checkpoint {path!r} has no tensor {key!r}")
            t = get(key)
            if tuple(t.shape) != tuple(ref[name].shape):
                raise ValueError(f"{key}: shape {list(t.shape)} does not match the config's "
                                 f"{list(ref[name].shape)}")
            if t.dtype == torch.float8_e4m3fn:
                skey = key + "_scale_inv"
                if skey not in where:
                    raise KeyError(f"FP8 tensor {key!r} has no {skey!r} in checkpoint {path!r}")
                if keep_fp8 and name.split(".")[0] in MLAAttention.FP8_PROJECTIONS:
                    sf = get(skey)
                    dequantize_fp8_weight(t[:1, :1], sf[:1, :1])                 # dtype checks only
                    if tuple(sf.shape) != (-(-t.shape[0] // 128), -(-t.shape[1] // 128)):
                        raise ValueError(f"{skey}: shape {list(sf.shape)} does not fit {key} {list(t.shape)} "
                                         f"(128x128 blocks)")
                    out[name], out[name + "_scale_inv"] = t, sf.float()
                    continue
                t = dequantize_fp8_weight(t, get(skey), dtype)
            out[name] = t.to(dtype)
    finally:
        for h in handles.values():
            h.__exit__(None, None, None)
    return out


def load_mla_attention(path: str, layer: int = 0, cfg: MLAConfig | None = None,
                       dtype: torch.dtype = torch.bfloat16, device=None, prefix: str = PREFIX,
                       fp8_projections: bool = False) -> MLAAttention:
    """Build :class:`MLAAttention` for layer ``layer`` of the checkpoint at ``path``.

    ``cfg`` defaults to the checkpoint directory's ``config.json`` (:meth:`MLAConfig.from_hf_config`).
    ``fp8_projections``: keep the checkpoint's FP8 projection weights as stored and run those projections through
    the FP8 GEMM (:meth:`MLAAttention.quantize_projections_`; projections stored in another dtype are quantised).
    Raises FileNotFoundError when neither is available.
    """
    if cfg is None:
        _, root = _key_to_file(path)
        cj = os.path.join(root, "config.json")
        if not os.path.exists(cj):
            raise FileNotFoundError(f"no cfg given and no config.json next to {path!r}")
        with open(cj) as fh:
            cfg = MLAConfig.from_hf_config(json.load(fh))
    module = MLAAttention(cfg, dtype=dtype, device=device)
    sd = read_attention_state_dict(path, layer, cfg, dtype, prefix, keep_fp8=fp8_projections)
    if fp8_projections:
        # dense projections of a non-FP8 checkpoint: load them, then quantise; FP8 ones replace their buffers
        fp8 = {k: v for k, v in sd.items() if v.dtype == torch.float8_e4m3fn or k.endswith("_scale_inv")}
        module.load_state_dict({k: v for k, v in sd.items() if k not in fp8}, strict=False)
        module.quantize_projections_()
        module.load_state_dict(fp8, strict=False)
        missing = set(module.state_dict()) - set(sd) - {k + "_scale_inv" for k in sd}
        if missing:
            raise KeyError(f"checkpoint {path!r} did not provide {sorted(missing)}")
    else:
        module.load_state_dict(sd)
    return module
