"""Decoupled RoPE for MLA: YaRN-scaled inverse frequencies and the interleaved-pair rotation DeepSeek uses.

DeepSeek-V3 rotates *adjacent pairs* ``(x[2i], x[2i+1])`` by angle ``pos·θ_i`` (its reference inference code
treats them as complex numbers), not the two halves of the vector. The rotation is applied to the 64-dim
``q_R`` of every head and to the single shared ``k_R`` before ``k_R`` is written to the cache, so cached keys
are position-encoded and the up-projection ``W^UK`` stays position-free (DeepSeek-V2 eq. 14-16).

Hugging Face's ``apply_rotary_pos_emb_interleave`` returns the same rotation with the output dims permuted
(evens then odds); q_R·k_R is unchanged, so attention outputs agree, but the cached ``k_R`` bytes differ.
"""
from __future__ import annotations

import math

import torch

from .config import MLAConfig

__all__ = ["rope_inv_freq", "rope_cos_sin", "apply_rope"]


def _correction_dim(num_rotations: float, dim: int, base: float, max_pos: int) -> float:
    # The dim index whose wavelength makes `num_rotations` full turns over `max_pos` positions (YaRN §3.2).
    return dim * math.log(max_pos / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def rope_inv_freq(cfg: MLAConfig) -> torch.Tensor:
    """Inverse frequencies θ_i, float64 ``[qk_rope_head_dim // 2]`` (radians per position).

    Plain RoPE: ``θ_i = rope_theta^(-2i/d)``. With YaRN (``cfg.rope_scaling``), dims rotating more than
    ``beta_fast`` times over the original context keep θ_i (extrapolation), dims rotating fewer than
    ``beta_slow`` times get ``θ_i / factor`` (interpolation), with a linear ramp between the two bounds
    (floored/ceiled and clamped to [0, d-1] as in DeepSeek-V3 and transformers).
    Source: YaRN (arXiv 2309.00071) "NTK-by-parts"; DeepSeek-V3 ``config.json`` parameters.
    """
    d = cfg.qk_rope_head_dim
    theta = cfg.rope_theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    y = cfg.rope_scaling
    if y is None:
        return theta
    low = math.floor(_correction_dim(y.beta_fast, d, cfg.rope_theta, y.original_max_position_embeddings))
    high = math.ceil(_correction_dim(y.beta_slow, d, cfg.rope_theta, y.original_max_position_embeddings))
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # a single-point ramp would divide by zero
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    return theta / y.factor * ramp + theta * (1 - ramp)


def rope_cos_sin(positions: torch.Tensor, cfg: MLAConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``positions[..., None] · θ`` times YaRN's attention factor.

    Args:
        positions: integer tensor of absolute token positions (any shape), ``0 <= pos``.
    Returns:
        ``(cos, sin)``, float64, shape ``positions.shape + [qk_rope_head_dim // 2]``, on positions' device.
    Raises:
        TypeError for a floating ``positions``; ValueError for a negative position.
    """
    if positions.is_floating_point() or positions.is_complex():
        raise TypeError(f"positions must be an integer tensor, got {positions.dtype}")
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be >= 0, got min {int(positions.min())}")
    ang = positions.to(torch.float64).unsqueeze(-1) * rope_inv_freq(cfg).to(positions.device)
    mult = 1.0 if cfg.rope_scaling is None else cfg.rope_scaling.attention_factor
    return ang.cos() * mult, ang.sin() * mult


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate adjacent pairs of the last dim: ``(a, b) -> (a·cos − b·sin, a·sin + b·cos)``.

    Args:
        x: ``[..., d]`` (d even), any float dtype.
        cos, sin: ``[..., d/2]`` broadcastable against ``x[..., ::2]`` (e.g. ``[T, 1, d/2]`` for ``x [T, H, d]``).
    Returns:
        Tensor of x's shape and dtype; the math is done in float32 (float64 when x is float64), rounded once.
    """
    if x.shape[-1] % 2:
        raise ValueError(f"apply_rope needs an even last dim, got x of shape {list(x.shape)}")
    wide = torch.float64 if x.dtype == torch.float64 else torch.float32
    xp = x.to(wide).unflatten(-1, (-1, 2))
    a, b = xp[..., 0], xp[..., 1]
    c, s = cos.to(wide), sin.to(wide)
    return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2).to(x.dtype)
