"""``FP8Linear``: a bias-free linear layer whose weight is stored as DeepSeek-V3 checkpoints store it — e4m3 data with
128×128 block ``weight_scale_inv`` — and whose forward runs deepkernels' FP8 GEMM (DeepGEMM ``fp8_gemm_nt``, 1D2D).

``y = x @ W.T`` with ``W = weight · weight_scale_inv[n // 128, k // 128]``; the activation is quantised per token
and 128 channels (``per_token_cast_to_fp8``, FP32 scales) on every call and the GEMM accumulates in FP32 with one
FP32 promotion per 128-wide K block, rounding to BF16 once — DeepSeek-V3's inference numerics for these
projections. CPU tensors run the PyTorch reference of the GEMM, CUDA tensors the kernels.
"""
from __future__ import annotations

import torch
from torch import nn

from ..gemm import fp8_gemm_nt
from ..quant import per_block_cast_to_fp8, per_token_cast_to_fp8
from ..quant.fp8 import cast_back_from_fp8

__all__ = ["FP8Linear"]


class FP8Linear(nn.Module):
    """Bias-free ``y = x @ W.T`` over an FP8 (e4m3, 128×128 block-scaled) weight.

    Buffers (the checkpoint's names, so ``load_state_dict`` takes a DeepSeek-V3 FP8 state dict as is):
        weight: ``[out_features, in_features]`` float8_e4m3fn.
        weight_scale_inv: ``[ceil(out/128), ceil(in/128)]`` float32 (the dequantisation multiplier of each block).
    Forward: ``x [..., in_features]`` (bf16/fp16/fp32, any leading shape) → ``[..., out_features]`` bf16.
    Raises ValueError for ``in_features`` not a multiple of 16 (FP8 rows must be 16-byte aligned for TMA, as in
    DeepGEMM) and for an input whose last dim is not ``in_features``.
    """

    def __init__(self, in_features: int, out_features: int, device=None):
        if in_features % 16:
            raise ValueError(f"FP8Linear needs in_features % 16 == 0 (16-byte FP8 rows for TMA), got {in_features}")
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.float8_e4m3fn,
                                                   device=device))
        self.register_buffer("weight_scale_inv", torch.ones(-(-out_features // 128), -(-in_features // 128),
                                                            dtype=torch.float32, device=device))

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> "FP8Linear":
        """Quantise a bias-free ``nn.Linear``'s weight per 128×128 block (``per_block_cast_to_fp8``)."""
        if linear.bias is not None:
            raise ValueError("FP8Linear has no bias; got a Linear with a bias")
        m = cls(linear.in_features, linear.out_features, device=linear.weight.device)
        w8, sf = per_block_cast_to_fp8(linear.weight.detach().float())
        m.weight.copy_(w8)
        m.weight_scale_inv.copy_(sf)
        return m

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """``W = weight · weight_scale_inv`` block-wise, ``[out_features, in_features]`` in ``dtype``."""
        return cast_back_from_fp8(self.weight, self.weight_scale_inv, gran_k=128, out_dtype=torch.float32).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must have last dim in_features={self.in_features}, got shape {list(x.shape)}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        a = per_token_cast_to_fp8(x2)
        d = torch.empty(x2.shape[0], self.out_features, dtype=torch.bfloat16, device=x.device)
        fp8_gemm_nt(a, (self.weight, self.weight_scale_inv), d)
        return d.view(*lead, self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weight=e4m3 + 128x128 scales"
