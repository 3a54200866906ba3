"""DeepSeek-V3 attention (MLA) configuration: head geometry, low-rank ranks, RoPE theta and YaRN scaling.

Field names follow the DeepSeek-V3 ``config.json`` (and Hugging Face ``DeepseekV3Config``), so a checkpoint's
config maps one to one (:meth:`MLAConfig.from_hf_config`). Defaults are DeepSeek-V3/R1's published values:
7168 hidden, 128 heads, ``q_lora_rank`` 1536, ``kv_lora_rank`` 512, ``qk_nope_head_dim`` 128,
``qk_rope_head_dim`` 64, ``v_head_dim`` 128, ``rope_theta`` 10000, YaRN factor 40 over 4096 original
positions (``beta_fast`` 32, ``beta_slow`` 1, ``mscale`` = ``mscale_all_dim`` = 1), 163840 max positions.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

__all__ = ["YarnScaling", "MLAConfig", "yarn_get_mscale"]


def yarn_get_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature term ``0.1·mscale·ln(factor) + 1`` (1 when ``factor <= 1``).

    Source: YaRN (Peng et al. 2023, eq. for sqrt(1/t)); DeepSeek-V3 multiplies the softmax scale by the square
    of this value with ``mscale = mscale_all_dim`` (1.3689² ≈ 1.874 for factor 40).
    """
    if factor <= 1:
        return 1.0
    return 0.1 * mscale * math.log(factor) + 1.0


@dataclass(frozen=True)
class YarnScaling:
    """YaRN RoPE scaling as in the V3 config's ``rope_scaling`` (``"type": "yarn"``).

    ``factor``: context extension ratio (s); ``original_max_position_embeddings``: pre-training context (L);
    ``beta_fast``/``beta_slow``: rotation counts bounding the linear ramp between extrapolated (high-frequency)
    and interpolated (low-frequency) dims; ``mscale``/``mscale_all_dim``: temperature terms. The cos/sin get the
    factor ``mscale(factor, mscale)/mscale(factor, mscale_all_dim)`` (1 for V3), the softmax scale gets
    ``mscale(factor, mscale_all_dim)²``.
    """
    factor: float = 40.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 1.0

    def __post_init__(self):
        if not self.factor > 0:
            raise ValueError(f"YaRN factor must be > 0, got {self.factor}")
        if self.original_max_position_embeddings <= 0:
            raise ValueError(f"original_max_position_embeddings must be > 0, got "
                             f"{self.original_max_position_embeddings}")
        if not self.beta_fast > self.beta_slow > 0:
            raise ValueError(f"need beta_fast > beta_slow > 0, got {self.beta_fast}, {self.beta_slow}")

    @property
    def attention_factor(self) -> float:
        """Multiplier on cos/sin (YaRN's sqrt(1/t) split between q·k and the softmax scale)."""
        if self.mscale and self.mscale_all_dim:
            return yarn_get_mscale(self.factor, self.mscale) / yarn_get_mscale(self.factor, self.mscale_all_dim)
        return yarn_get_mscale(self.factor)


@dataclass(frozen=True)
class MLAConfig:
    """Attention geometry of one DeepSeek-V3 layer (all sizes in elements, not bytes).

    ``q_lora_rank=None`` selects the direct query projection (DeepSeek-V2-Lite style ``q_proj``).
    ``rope_scaling=None`` is plain RoPE. Raises ValueError for non-positive sizes or an odd
    ``qk_rope_head_dim``.
    """
    hidden_size: int = 7168
    num_heads: int = 128
    q_lora_rank: int | None = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    rope_theta: float = 10000.0
    rope_scaling: YarnScaling | None = field(default_factory=YarnScaling)
    max_position_embeddings: int = 163840
    rms_norm_eps: float = 1e-6

    def __post_init__(self):
        for f in ("hidden_size", "num_heads", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
                  "v_head_dim", "max_position_embeddings"):
            if int(getattr(self, f)) <= 0:
                raise ValueError(f"{f} must be > 0, got {getattr(self, f)}")
        if self.q_lora_rank is not None and self.q_lora_rank <= 0:
            raise ValueError(f"q_lora_rank must be > 0 or None, got {self.q_lora_rank}")
        if self.qk_rope_head_dim % 2:
            raise ValueError(f"qk_rope_head_dim must be even (RoPE rotates pairs), got {self.qk_rope_head_dim}")

    # ---- derived sizes -------------------------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        """Per-head query/key width of the naive path: nope + rope (192 for V3)."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def kv_cache_dim(self) -> int:
        """Width of one latent cache row [c_KV ‖ k_R] = d_qk of the absorbed MQA (576 for V3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        """Scale on q·k: ``qk_head_dim**-0.5`` times YaRN's ``mscale(factor, mscale_all_dim)²``.

        Both forward paths use this one value: absorption changes the dot product's width (576) but not its
        value, so FlashMLA's default ``576**-0.5`` would be wrong here and is always overridden.
        """
        s = self.qk_head_dim ** -0.5
        if self.rope_scaling is not None and self.rope_scaling.mscale_all_dim:
            m = yarn_get_mscale(self.rope_scaling.factor, self.rope_scaling.mscale_all_dim)
            s = s * m * m
        return s

    # ---- constructors --------------------------------------------------------------------------------
    @classmethod
    def deepseek_v3(cls, **overrides) -> "MLAConfig":
        """DeepSeek-V3/R1 attention config (671B), optionally with fields overridden."""
        return replace(cls(), **overrides)

    @classmethod
    def from_hf_config(cls, cfg) -> "MLAConfig":
        """Build from a DeepSeek-V3 ``config.json`` dict (or an object with those attributes).

        Reads ``num_attention_heads``, the lora ranks, head dims, ``rope_theta`` and ``rope_scaling`` (or the
        newer ``rope_parameters``); a ``rope_scaling`` whose type is not ``"yarn"`` raises ValueError.
        """
        get = (lambda k, d=None: cfg.get(k, d)) if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
        rs = get("rope_scaling") or get("rope_parameters")
        theta = get("rope_theta")
        scaling = None
        if rs:
            theta = rs.get("rope_theta", theta)
            kind = rs.get("type", rs.get("rope_type", "default"))
            if kind == "yarn":
                names = {f.name for f in fields(YarnScaling)}
                scaling = YarnScaling(**{k: v for k, v in rs.items() if k in names and v is not None})
            elif kind != "default":
                raise ValueError(f"rope_scaling type {kind!r} is not supported (only 'yarn' and none)")
        return cls(hidden_size=get("hidden_size"), num_heads=get("num_attention_heads"),
                   q_lora_rank=get("q_lora_rank"), kv_lora_rank=get("kv_lora_rank"),
                   qk_nope_head_dim=get("qk_nope_head_dim"), qk_rope_head_dim=get("qk_rope_head_dim"),
                   v_head_dim=get("v_head_dim"), rope_theta=float(theta if theta is not None else 10000.0),
                   rope_scaling=scaling, max_position_embeddings=get("max_position_embeddings", 163840),
                   rms_norm_eps=get("rms_norm_eps", 1e-6))
