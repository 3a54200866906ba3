"""deepkernels.model: RoPE/YaRN, the MLA layer's naive and absorbed paths over BF16 and packed caches."""
import math

import pytest
import torch

from deepkernels.model import MLAAttention, MLAConfig, PagedLatentCache, YarnScaling, apply_rope, rope_cos_sin
from deepkernels.model.rope import rope_inv_freq

pytestmark = pytest.mark.reference


def tiny_cfg(kv_lora_rank=512, q_lora_rank=32, yarn=True, **kw):
    y = YarnScaling(factor=4.0, original_max_position_embeddings=32) if yarn else None
    return MLAConfig(hidden_size=64, num_heads=4, q_lora_rank=q_lora_rank, kv_lora_rank=kv_lora_rank,
                     qk_nope_head_dim=16, qk_rope_head_dim=64, v_head_dim=16, rope_scaling=y,
                     max_position_embeddings=128, **kw)


def pair(cfg, std=0.1):
    """A float64 module with random weights and its bf16 copy."""
    ref = MLAAttention(cfg, dtype=torch.float64)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, std)
        for n in ("q_a_layernorm", "kv_a_layernorm"):
            if hasattr(ref, n):
                getattr(ref, n).weight.add_(1.0)
    low = MLAAttention(cfg, dtype=torch.bfloat16)
    low.load_state_dict(ref.state_dict())
    return ref, low


def rel_err(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# ---- config and RoPE ----------------------------------------------------------------------------------
def test_v3_config_defaults():
    c = MLAConfig.deepseek_v3()
    assert (c.num_heads, c.q_lora_rank, c.kv_lora_rank, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim) == \
        (128, 1536, 512, 128, 64, 128)
    assert c.kv_cache_dim == 576 and c.qk_head_dim == 192
    m = 0.1 * math.log(40) + 1
    assert c.softmax_scale == pytest.approx(192 ** -0.5 * m * m, rel=1e-12)
    assert c.rope_scaling.attention_factor == 1.0
    hf = {"hidden_size": 7168, "num_attention_heads": 128, "q_lora_rank": 1536, "kv_lora_rank": 512,
          "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "rope_theta": 10000,
          "max_position_embeddings": 163840, "rms_norm_eps": 1e-6,
          "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                           "original_max_position_embeddings": 4096, "type": "yarn"}}
    assert MLAConfig.from_hf_config(hf) == c
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        MLAConfig(qk_rope_head_dim=63)
    with pytest.raises(ValueError, match="not supported"):
        MLAConfig.from_hf_config({**hf, "rope_scaling": {"type": "linear", "factor": 2}})


def test_yarn_inv_freq_ramp():
    plain = rope_inv_freq(MLAConfig.deepseek_v3(rope_scaling=None))
    yarn = rope_inv_freq(MLAConfig.deepseek_v3())
    assert torch.allclose(plain, 10000.0 ** (-torch.arange(0, 64, 2, dtype=torch.float64) / 64))
    # V3 (d=64, L=4096, base 1e4): ramp from floor(10.2)=10 to ceil(22.9)=23 in pair index
    assert torch.equal(yarn[:10], plain[:10])                     # fast dims extrapolate (unchanged)
    assert torch.allclose(yarn[23:], plain[23:] / 40)             # slow dims interpolate by the factor
    mid = (yarn[10:23] / plain[10:23])
    assert bool((mid[1:] <= mid[:-1]).all()) and mid[0] == 1.0 and mid[-1] > 1 / 40


def test_apply_rope_is_a_relative_rotation():
    cfg = tiny_cfg(yarn=False)
    q, k = torch.randn(64, dtype=torch.float64), torch.randn(64, dtype=torch.float64)
    pos = torch.tensor([3, 10, 40, 47])
    cos, sin = rope_cos_sin(pos, cfg)
    qr, kr = apply_rope(q.expand(4, -1), cos, sin), apply_rope(k.expand(4, -1), cos, sin)
    assert torch.allclose(qr.norm(dim=-1), q.norm().expand(4))
    assert torch.allclose(qr[1] @ kr[0], qr[3] @ kr[2])           # depends on 10-3 == 47-40 only
    # adjacent pairs rotate as complex numbers (DeepSeek's convention)
    z = torch.view_as_complex(q.view(32, 2).contiguous()) * torch.polar(torch.ones(32, dtype=torch.float64),
                                                                        7 * rope_inv_freq(cfg))
    c7, s7 = rope_cos_sin(torch.tensor(7), cfg)
    assert torch.allclose(apply_rope(q, c7, s7), torch.view_as_real(z).flatten())
    with pytest.raises(TypeError):
        rope_cos_sin(torch.tensor([1.0]), cfg)


# ---- the layer ----------------------------------------------------------------------------------------
def naive_eq(mod: MLAAttention, x: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V2 eq. 9-19 written out per head and per token in float64 (no cache, causal from 0)."""
    c = mod.cfg
    b, s, _ = x.shape
    pos = torch.arange(s).expand(b, s)
    q_nope, q_rope, lat = mod.project(x, pos)
    c_kv, k_r = lat[..., :c.kv_lora_rank], lat[..., c.kv_lora_rank:]
    out = torch.zeros(b, s, c.num_heads, c.v_head_dim, dtype=torch.float64)
    for i in range(c.num_heads):
        w = mod.kv_b_proj.weight.view(c.num_heads, -1, c.kv_lora_rank)[i]
        w_uk, w_uv = w[:c.qk_nope_head_dim], w[c.qk_nope_head_dim:]
        k = torch.cat([c_kv @ w_uk.T, k_r], -1)                                    # [b, s, 192]
        v = c_kv @ w_uv.T
        q = torch.cat([q_nope[:, :, i], q_rope[:, :, i]], -1)
        sc = torch.einsum("bsd,btd->bst", q, k) * c.softmax_scale
        sc = sc.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
        out[:, :, i] = torch.softmax(sc, -1) @ v
    return mod.o_proj(out.flatten(2))


@torch.no_grad()
@pytest.mark.parametrize("q_lora_rank", [32, None])
def test_naive_path_matches_equations(q_lora_rank):
    ref, _ = pair(tiny_cfg(q_lora_rank=q_lora_rank))
    x = torch.randn(2, 7, 64, dtype=torch.float64)
    assert torch.allclose(ref(x, path="naive"), naive_eq(ref, x), rtol=1e-10, atol=1e-10)


@torch.no_grad()
def test_absorbed_matches_naive_bf16_paged_prefill_and_decode():
    cfg = tiny_cfg()
    ref, low = pair(cfg)
    b, s, page = 2, 70, 64                                # prefill crosses a page boundary
    perm = torch.randperm(2 * 3).to(torch.int32).view(2, 3)
    c_ref = PagedLatentCache(b, 3 * page, cfg.kv_cache_dim, "fp64", block_table=perm.clone())
    c_low = PagedLatentCache(b, 3 * page, cfg.kv_cache_dim, "bf16", block_table=perm.clone())
    c_nv = PagedLatentCache(b, 3 * page, cfg.kv_cache_dim, "bf16", block_table=perm.clone())
    for step, n in enumerate([s, 1, 1, 3]):               # prefill, two decode steps, a 3-token (MTP) step
        x = torch.randn(b, n, 64, dtype=torch.float64)
        y_ref = ref(x, c_ref, path="naive")
        y_abs = low(x.bfloat16(), c_low, path="absorbed")
        assert low.last_route == "dense"                  # flash_mla_with_kvcache, dense BF16 mode
        y_nv = low(x.bfloat16(), c_nv, path="naive")
        assert low.last_route == "naive"
        assert rel_err(y_abs, y_ref) < 2e-2, step
        assert rel_err(y_abs, y_nv) < 2e-2, step
        assert torch.equal(c_low.k_cache, c_nv.k_cache)   # both paths wrote the same latent rows
    assert c_low.cache_seqlens.tolist() == [s + 5, s + 5]
    # the cached row is [RMSNorm(c_KV) ‖ RoPE(k_R)] of each token, at block_table[pos // 64], row pos % 64
    lat = c_ref.read(1)
    assert lat.shape == (s + 5, 576)
    assert torch.equal(c_ref.k_cache[perm[1, 1], 3, 0], lat[page + 3])


@torch.no_grad()
@pytest.mark.parametrize("fmt", ["bf16", "v32"])
def test_decode_batch_of_different_lengths(fmt):
    """Requests prefilled separately (70 and 5 tokens) through cache.select, then decoded together."""
    if fmt != "bf16":
        _need_quant()
    cfg = tiny_cfg()
    ref, low = pair(cfg)
    perm = torch.randperm(4).to(torch.int32).view(2, 2)
    c_low = PagedLatentCache(2, 128, 576, fmt, block_table=perm.clone())
    c_ref = [PagedLatentCache(1, 128, 576, "fp64") for _ in range(2)]
    xs = [torch.randn(1, 70, 64, dtype=torch.float64), torch.randn(1, 5, 64, dtype=torch.float64)]
    for i, x in enumerate(xs):
        low(x.bfloat16(), c_low.select([i]), path="absorbed")
        ref(x, c_ref[i], path="naive")
    assert c_low.cache_seqlens.tolist() == [70, 5]
    for _ in range(2):
        x = torch.randn(2, 1, 64, dtype=torch.float64)
        y = low(x.bfloat16(), c_low, path="absorbed")
        y_ref = torch.cat([ref(x[i:i + 1], c_ref[i], path="naive") for i in range(2)])
        assert rel_err(y, y_ref) < (2e-2 if fmt == "bf16" else 8e-2)
    assert c_low.cache_seqlens.tolist() == [72, 7]
    with pytest.raises(ValueError, match="ids"):
        c_low.select([2])


@torch.no_grad()
def test_fold_output_and_no_cache():
    cfg = tiny_cfg()
    ref, low = pair(cfg)
    x = torch.randn(3, 5, 64, dtype=torch.float64)
    y = low(x.bfloat16(), path="absorbed")
    yf = low(x.bfloat16(), path="absorbed", fold_output=True)
    y_ref = ref(x, path="naive")
    assert rel_err(y, y_ref) < 2e-2 and rel_err(yf, y_ref) < 2e-2
    w_ouv = ref.w_ouv()                                   # W^O_i W^UV_i
    i = 2
    assert torch.allclose(w_ouv[i], ref.o_proj.weight[:, i * 16:(i + 1) * 16] @ ref.w_uv()[i])


def test_layer_errors():
    cfg = tiny_cfg()
    ref, low = pair(cfg)
    with pytest.raises(ValueError, match="hidden"):
        low(torch.randn(1, 2, 63, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="path"):
        low(torch.randn(1, 2, 64, dtype=torch.bfloat16), path="mha")
    with pytest.raises(ValueError, match="bf16/fp16"):
        ref(torch.randn(1, 2, 64, dtype=torch.float64), path="absorbed")
    c = PagedLatentCache(1, 4, 576, "bf16")
    with pytest.raises(ValueError, match="overflows"):
        low(torch.randn(1, 65, 64, dtype=torch.bfloat16), c)
    with pytest.raises(ValueError, match="fmt"):
        PagedLatentCache(1, 4, 576, "e5m2")
    with pytest.raises(ValueError, match="d_qk=576"):
        PagedLatentCache(1, 4, 512, "v32")
    with pytest.raises(ValueError, match="block_table"):
        PagedLatentCache(2, 128, 576, block_table=torch.zeros(2, 1, dtype=torch.int32))


# ---- packed (FP8 / FP4) caches -------------------------------------------------------------------------
PACKED = [("v32", 512), ("model1", 448), ("v41", 448), ("fp4", 448)]


def _need_quant():
    q = pytest.importorskip("deepkernels.quant")
    if not hasattr(q, "quantize_kv_cache"):
        pytest.skip("deepkernels.quant.quantize_kv_cache not available in this build")
    return q


@torch.no_grad()
@pytest.mark.parametrize("fmt,kv_lora_rank", PACKED)
def test_packed_cache_paths_agree(fmt, kv_lora_rank):
    quant = _need_quant()
    cfg = tiny_cfg(kv_lora_rank=kv_lora_rank)
    ref, low = pair(cfg)
    b, page = 2, 64
    perm = torch.randperm(4).to(torch.int32).view(2, 2)
    c_abs = PagedLatentCache(b, 2 * page, cfg.kv_cache_dim, fmt, block_table=perm.clone())
    c_nv = PagedLatentCache(b, 2 * page, cfg.kv_cache_dim, fmt, block_table=perm.clone())
    c_ref = PagedLatentCache(b, 2 * page, cfg.kv_cache_dim, "fp64", block_table=perm.clone())
    c_bf = PagedLatentCache(b, 2 * page, cfg.kv_cache_dim, "bf16", block_table=perm.clone())
    tol_q = {"fp4": 0.25}.get(fmt, 0.08)                  # quantization error of the cache vs float64
    for n in (66, 1, 2):
        x = torch.randn(b, n, 64, dtype=torch.float64)
        y_abs = low(x.bfloat16(), c_abs, path="absorbed")
        y_nv = low(x.bfloat16(), c_nv, path="naive")
        y_ref = ref(x, c_ref, path="naive")
        c_bf.append(low.project(x.bfloat16(), c_bf.cache_seqlens.long()[:, None] + torch.arange(n))[2])
        assert rel_err(y_abs, y_nv) < 2e-2                # same quantized cache: bf16 agreement
        assert rel_err(y_abs, y_ref) < tol_q
        assert torch.equal(c_abs.k_cache.view(torch.uint8), c_nv.k_cache.view(torch.uint8))
    # page re-encoding left earlier rows intact: the cache equals a one-shot quantization of all rows
    rows = c_bf.dense_pages(torch.bfloat16)
    used = perm.flatten().long()
    one_shot = quant.quantize_kv_cache(rows[used], fmt)
    assert torch.equal(c_abs.k_cache[used].view(torch.uint8), one_shot.view(torch.uint8))
    assert c_abs.bytes_per_token == {"v32": 656, "model1": 584, "v41": 528, "fp4": 288}[fmt]


@torch.no_grad()
@pytest.mark.parametrize("fmt,kv_lora_rank", [("v32", 512), ("model1", 448)])
def test_sparse_route_indices(monkeypatch, fmt, kv_lora_rank):
    """The sparse FP8 route's per-query index lists (physical page·B + row, causal, -1 padded to 64) select
    exactly the tokens the dense route attends to. The sparse kernel is stood in for by a float32 gather."""
    quant = _need_quant()
    import deepkernels
    from deepkernels.model import mla as mla_mod

    def fake_sparse(q, k_cache, block_table, cache_seqlens, head_dim_v, meta, softmax_scale=None,
                    is_fp8_kvcache=False, indices=None, **kw):
        assert is_fp8_kvcache and indices.dtype == torch.int32 and indices.shape[-1] % 64 == 0
        rows = quant.dequantize_kv_cache(k_cache, fmt).flatten(0, 2).float()     # [num_blocks·B, d_qk]
        kv = rows[indices.clamp(min=0).long()]                                     # [b, s_q, topk, d]
        sc = torch.einsum("bshd,bstd->bsht", q.float(), kv) * softmax_scale
        sc = sc.masked_fill((indices < 0)[:, :, None, :], float("-inf"))
        out = torch.einsum("bsht,bstd->bshd", torch.softmax(sc, -1), kv[..., :head_dim_v])
        return out.to(q.dtype), None

    monkeypatch.setattr(mla_mod, "_flash_mla", lambda: (fake_sparse, deepkernels.get_mla_metadata))
    cfg = tiny_cfg(kv_lora_rank=kv_lora_rank)
    _, low = pair(cfg)
    perm = torch.randperm(6).to(torch.int32).view(2, 3)
    c_sp = PagedLatentCache(2, 192, cfg.kv_cache_dim, fmt, block_table=perm.clone())
    c_dn = PagedLatentCache(2, 192, cfg.kv_cache_dim, fmt, block_table=perm.clone())
    for n in (70, 1, 3):
        x = torch.randn(2, n, 64).bfloat16()
        y_sp = low(x, c_sp, path="absorbed", route="auto")
        assert low.last_route == "sparse"
        monkeypatch.setattr(mla_mod, "_flash_mla", lambda: None)                # dense reference route
        y_dn = low(x, c_dn, path="absorbed", route="dense")
        monkeypatch.setattr(mla_mod, "_flash_mla", lambda: (fake_sparse, deepkernels.get_mla_metadata))
        assert rel_err(y_sp, y_dn) < 1e-2


# ---- the real Triton decode kernel under TRITON_INTERPRET=1 ----------------------------------------------
@pytest.mark.interpret
@torch.no_grad()
def test_absorbed_through_interpreted_kernel():
    cfg = tiny_cfg()
    ref, low = pair(cfg)
    c_abs = PagedLatentCache(1, 128, 576, "bf16", block_table=torch.tensor([[1, 0]], dtype=torch.int32))
    c_ref = PagedLatentCache(1, 128, 576, "fp64")
    for n in (5, 1):
        x = torch.randn(1, n, 64, dtype=torch.float64)
        y = low(x.bfloat16(), c_abs, path="absorbed")
        assert low.last_route == "dense"
        assert rel_err(y, ref(x, c_ref, path="naive")) < 2e-2


# ---- device: the real kernel at DeepSeek-V3 head counts ------------------------------------------------
@pytest.mark.gpu
@pytest.mark.parametrize("fmt", ["bf16", "v32"])
@torch.no_grad()
def test_absorbed_v3_heads_on_device(fmt, device="cuda"):
    """DeepSeek-V3 attention geometry (128 heads, 576/512 latent, YaRN) through the real decode kernel."""
    cfg = MLAConfig.deepseek_v3(hidden_size=1024, q_lora_rank=256)
    ref = MLAAttention(cfg, dtype=torch.float32, device=device)
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.03)
    low = MLAAttention(cfg, dtype=torch.bfloat16, device=device)
    low.load_state_dict(ref.state_dict())
    b = 4
    c_abs = PagedLatentCache(b, 1024, 576, fmt, device=device,
                             block_table=torch.randperm(b * 16, device=device).to(torch.int32).view(b, 16))
    c_ref = PagedLatentCache(b, 1024, 576, "fp32", device=device)
    for n in (300, 1, 1):
        x = torch.randn(b, n, 1024, device=device)
        y = low(x.bfloat16(), c_abs, path="absorbed")
        y_ref = ref(x, c_ref, path="naive")
        assert low.last_route == ("dense" if fmt == "bf16" else low.last_route)   # v32: sparse once it exists
        assert rel_err(y, y_ref) < (2e-2 if fmt == "bf16" else 8e-2)
