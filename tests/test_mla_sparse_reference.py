"""Sparse MLA decode: case generator, reference checked against naive per-token loops, validation and the
sparse rows of shared/cases/edge-cases.md (reference tier, CPU)."""
import math
import struct

import pytest
import torch

import deepkernels as dk
from deepkernels.quant.kvcache import KV_FORMATS, abs_indices_to_kvcache_indices, quantize_kv_cache
from deepkernels.reference.mla_sparse import sparse_decode_ref, sparse_valid_mask
from deepkernels.testing.numerics import check_is_allclose

D_QK = {"v32": 576, "model1": 512, "v41": 512}
TOL_OUT = dict(abs_tol=1e-3, rel_tol=2.01 / 128, cos_diff_tol=5e-6)     # FlashMLA sparse decode (spec §5.2)
TOL_LSE = dict(abs_tol=1e-6, rel_tol=8.01 / 65536)
JUNK = [-2**31, -123456, -7, 2**31 - 1, 2147480000]


def _cache(kv_bf16, fmt, page):
    f = KV_FORMATS[fmt]
    stride = (page + 1) * f.bytes_per_token if fmt in ("v32", "v41", "fp4") else None   # FlashMLA: non-contiguous
    return quantize_kv_cache(kv_bf16, fmt, block_stride=stride)


def _indices(b, s_q, topk, s_k, page, device, zero_len=False, all_invalid=False, oob=True):
    """FlashMLA-style indices: unique random positions < seqlen mapped through a random block table; when
    seqlen < topk the tail holds -1 and junk (negative / past-the-cache) values. Returns (indices, num_blocks)."""
    pages_per = max(-(-s_k // page), 1)
    nb = b * pages_per
    bt = torch.randperm(nb).view(b, pages_per).int()
    seqlens = torch.clamp(torch.normal(float(s_k), s_k / 2, (b,)), min=1, max=s_k).long()
    if zero_len:
        seqlens[torch.rand(b) < 0.5] = 0
    ab = torch.full((b, s_q, topk), -1, dtype=torch.int32)
    for i in range(b):
        for s in range(s_q):
            n = min(int(seqlens[i]), topk)
            ab[i, s, :n] = torch.randperm(int(seqlens[i]))[:n].int()
            ab[i, s] = ab[i, s][torch.randperm(topk)]
    ind = abs_indices_to_kvcache_indices(ab, bt, page)
    if oob:   # junk beyond -1 in invalid slots: treated as invalid, never read (B19)
        j = torch.tensor(JUNK + [nb * page, nb * page + 3], dtype=torch.int32)
        pick = (ind == -1) & (torch.rand(ind.shape) < 0.5)
        ind[pick] = j[torch.randint(0, len(j), (int(pick.sum()),))]
    if all_invalid:
        ind[:] = -1
    return ind.to(device), nb


def make_case(b, s_q, h_q, fmt, topk, s_k, page, *, xfmt=None, xtopk=0, xs_k=None, xpage=None, with_len=False,
              with_xlen=False, sink=False, all_invalid=False, zero_len=False, nonpow2=False, lengths=None,
              xlengths=None, device="cpu"):
    """Inputs for a sparse decode call. NaN is written into every KV token no valid in-length index references
    (before quantisation, as FlashMLA's tests do); ``lengths``/``xlengths`` fix topk_length / extra_topk_length
    (set them here, not afterwards: the NaN fill depends on them). Returns flash_mla_with_kvcache keyword args."""
    d = D_QK[fmt]
    q = (torch.randn(b, s_q, h_q, d)).clamp(-1, 1).bfloat16()
    ind, nb = _indices(b, s_q, topk, s_k, page, "cpu", zero_len, all_invalid)
    tl_ = torch.randint(0, topk + 1, (b,), dtype=torch.int32) if with_len else None
    if lengths is not None:
        tl_ = torch.tensor(lengths, dtype=torch.int32)
    kw = dict(q=q, indices=ind, topk_length=tl_, softmax_scale=d ** -0.55)
    segs = [("k_cache", "indices", "topk_length", fmt, nb, page)]
    if xfmt is not None:
        xpage = xpage or page
        xind, xnb = _indices(b, s_q, xtopk, xs_k or s_k, xpage, "cpu", zero_len, all_invalid)
        kw["extra_indices_in_kvcache"] = xind
        kw["extra_topk_length"] = torch.randint(0, xtopk + 1, (b,), dtype=torch.int32) if with_xlen else None
        if xlengths is not None:
            kw["extra_topk_length"] = torch.tensor(xlengths, dtype=torch.int32)
        segs.append(("extra_k_cache", "extra_indices_in_kvcache", "extra_topk_length", xfmt, xnb, xpage))
    for cname, iname, lname, f, n_blocks, pg in segs:
        kv = (torch.randn(n_blocks, pg, 1, KV_FORMATS[f].d_qk) / 10).clamp(-1, 1).bfloat16()
        used = torch.zeros(n_blocks * pg, dtype=torch.bool)
        valid = sparse_valid_mask(kw[iname], n_blocks * pg, kw[lname])
        used[kw[iname][valid].long()] = True
        kv.view(-1, kv.shape[-1])[~used] = float("nan")
        cache = _cache(kv, f, pg)
        if nonpow2 and f == "v32":    # B19 (FlashMLA PR #184): data re-quantised with non-power-of-two scales
            u = cache.view(torch.uint8)
            nbk, bs = cache.shape[:2]
            x = kv.float().view(nbk, bs, 576)[..., :512].reshape(nbk, bs, 4, 128)
            tok = torch.arange(nbk * bs).view(nbk, bs, 1)
            sc = 0.0137 + (tok % 17).float() * 3.1e-4 + torch.arange(4).view(1, 1, 4) * 1.03e-3
            sc = sc * x.abs().amax(-1).nan_to_num(1.0).clamp(min=1e-3) / 6.0   # keep |x / sc| within e4m3 range
            data = (x / sc[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
            u[:, :, 0, :512] = data.reshape(nbk, bs, 512)
            u[:, :, 0, 512:528] = sc.contiguous().view(torch.uint8).reshape(nbk, bs, 16)
        kw[cname] = cache
    if sink:
        s = torch.randn(h_q)
        s[torch.rand(h_q) < 0.31] = math.inf
        s[torch.rand(h_q) < 0.31] = -math.inf
        kw["attn_sink"] = s
    return {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}


def ref_call(kw, **extra):
    return sparse_decode_ref(kw["q"], kw["k_cache"], kw["indices"], 512, kw.get("softmax_scale"),
                             kw.get("attn_sink"), kw.get("extra_k_cache"), kw.get("extra_indices_in_kvcache"),
                             kw.get("topk_length"), kw.get("extra_topk_length"), **extra)


# ------------------------------------------------------------------ naive per-token loops (independent decode)
def _naive_token(cache, fmt, idx):
    """Decode one token's K from raw bytes with struct/python arithmetic (no deepkernels.quant)."""
    f = KV_FORMATS[fmt]
    nb, page = cache.shape[:2]
    u = cache.view(torch.uint8)
    blk, r = idx // page, idx % page
    rec = u[blk, r, 0].tolist() if not f.split_block else None
    fp8 = lambda byte: torch.tensor([byte], dtype=torch.uint8).view(torch.float8_e4m3fn).float().item()  # noqa
    if fmt == "v32":
        sc = struct.unpack("<4f", bytes(rec[512:528]))
        k = [float(torch.tensor(fp8(rec[j]) * sc[j // 128], dtype=torch.float32).bfloat16()) for j in range(512)]
        rope = torch.tensor(rec[528:656], dtype=torch.uint8).view(torch.bfloat16).float().tolist()
        return k + rope
    if fmt == "model1":
        blkbytes = u.as_strided((u.stride(0) if nb > 1 else page * 584,), (1,), u.storage_offset() + blk * u.stride(0))
        data = blkbytes[r * 576:(r + 1) * 576].tolist()
        scb = blkbytes[page * 576 + r * 8:page * 576 + r * 8 + 7].tolist()
        k = [fp8(data[j]) * 2.0 ** (scb[j // 64] - 127) for j in range(448)]
        return k + torch.tensor(data[448:576], dtype=torch.uint8).view(torch.bfloat16).float().tolist()
    if fmt == "v41":
        return [fp8(rec[j]) * 2.0 ** (rec[512 + j // 32] - 127) for j in range(512)]
    mags = [0, 0.5, 1, 1.5, 2, 3, 4, 6]
    out = []
    for j in range(512):
        nib = (rec[j // 2] >> (4 * (j % 2))) & 0xF
        v = mags[nib & 7] * (-1 if nib & 8 else 1)
        out.append(v * fp8(rec[256 + j // 16]))
    return out


def naive_sparse_decode(kw):
    q = kw["q"].double()
    b, s_q, h_q, d = q.shape
    scale = kw.get("softmax_scale") or d ** -0.5
    segs = [(kw["k_cache"], kw["indices"], kw.get("topk_length"))]
    if kw.get("extra_k_cache") is not None:
        segs.append((kw["extra_k_cache"], kw["extra_indices_in_kvcache"], kw.get("extra_topk_length")))
    out = torch.zeros(b, s_q, h_q, 512, dtype=torch.float64)
    lse = torch.zeros(b, h_q, s_q, dtype=torch.float64)
    for i in range(b):
        for s in range(s_q):
            keys = []
            for cache, ind, length in segs:
                fmt = {656: "v32", 584: "model1", 528: "v41", 288: "fp4"}[cache.shape[-1]]
                ntok = cache.shape[0] * cache.shape[1]
                for j in range(ind.shape[-1]):
                    x = int(ind[i, s, j])
                    if 0 <= x < ntok and (length is None or j < int(length[i])):
                        keys.append(torch.tensor(_naive_token(cache, fmt, x), dtype=torch.float64))
            for h in range(h_q):
                if not keys:
                    lse[i, h, s] = math.inf
                    continue
                sc = [float(q[i, s, h] @ k) * scale for k in keys]
                m = max(sc)
                w = [math.exp(x - m) for x in sc]
                tot = sum(w)
                lse[i, h, s] = m + math.log(tot)
                o = sum(wi / tot * k[:512] for wi, k in zip(w, keys))
                if kw.get("attn_sink") is not None:
                    o = o / (1 + math.exp(float(kw["attn_sink"][h]) - lse[i, h, s]))
                out[i, s, h] = o
    return out, lse


@pytest.mark.reference
@pytest.mark.parametrize("fmt,xfmt,page", [("v32", None, 3), ("model1", "model1", 5), ("v41", "fp4", 2),
                                           ("v41", "v41", 7), ("v32", None, 61)])
def test_reference_matches_naive_loops(fmt, xfmt, page):
    kw = make_case(2, 2, 4, fmt, 9, 12, page, xfmt=xfmt, xtopk=5, with_len=True, with_xlen=xfmt is not None,
                   sink=True, nonpow2=fmt == "v32")
    o, l_ = ref_call(kw, compute_dtype=torch.float64)
    no, nl = naive_sparse_decode(kw)
    assert l_.shape == (2, 4, 2) and l_.stride() == (8, 1, 4)          # transposed view of [b, s_q, h_q]
    assert check_is_allclose("lse", l_.double(), nl, abs_tol=1e-9, rel_tol=1e-9)
    assert check_is_allclose("out", o.double(), no, abs_tol=2e-3, rel_tol=2.01 / 128, cos_diff_tol=1e-5)


@pytest.mark.reference
def test_reference_empty_rows_and_sinks():
    kw = make_case(3, 2, 8, "v41", 64, 40, 64, sink=True, lengths=[0, 64, 3])
    s = torch.zeros(8)
    s[0], s[1] = math.inf, -math.inf
    kw["attn_sink"] = s
    o, l_ = ref_call(kw)
    assert (o[0] == 0).all() and torch.isposinf(l_[0]).all()
    assert (o[1:, :, 0] == 0).all()                                     # +inf sink -> 0
    kw2 = dict(kw, attn_sink=None)
    o2, l2 = ref_call(kw2)
    assert torch.equal(o[1:, :, 1], o2[1:, :, 1]) and torch.equal(l_, l2)   # -inf sink: no effect; lse unchanged


# ------------------------------------------------------------------ public op on CPU (reference backend)
def _public(kw, meta=None):
    meta = meta or dk.get_mla_metadata()[0]
    return dk.flash_mla_with_kvcache(kw["q"], kw["k_cache"], None, None, 512, meta, softmax_scale=kw["softmax_scale"],
                                     is_fp8_kvcache=True, indices=kw["indices"], attn_sink=kw.get("attn_sink"),
                                     extra_k_cache=kw.get("extra_k_cache"),
                                     extra_indices_in_kvcache=kw.get("extra_indices_in_kvcache"),
                                     topk_length=kw.get("topk_length"),
                                     extra_topk_length=kw.get("extra_topk_length"))


@pytest.mark.reference
def test_validation_errors():
    kw = make_case(2, 1, 16, "v41", 64, 40, 16)
    q, c, ind = kw["q"], kw["k_cache"], kw["indices"]
    m = dk.get_mla_metadata()[0]
    call = lambda **a: dk.flash_mla_with_kvcache(**{**dict(q=q, k_cache=c, block_table=None, cache_seqlens=None,  # noqa
                                                           head_dim_v=512, tile_scheduler_metadata=m,
                                                           is_fp8_kvcache=True, indices=ind), **a})
    with pytest.raises(ValueError, match="is_fp8_kvcache"):
        call(is_fp8_kvcache=False)
    with pytest.raises(ValueError, match="causal"):
        call(causal=True)
    with pytest.raises(ValueError, match="h_q"):
        call(q=torch.zeros(2, 1, 48, 512, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="d_qk"):
        call(q=torch.zeros(2, 1, 16, 576, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="head_dim_v"):
        call(head_dim_v=576)
    with pytest.raises(ValueError, match="bytes_per_token"):
        call(k_cache=torch.zeros(4, 16, 1, 600, dtype=torch.uint8))
    with pytest.raises(ValueError, match="FP4"):
        call(k_cache=torch.zeros(4, 16, 1, 288, dtype=torch.uint8))
    with pytest.raises(ValueError, match="pair"):
        call(extra_k_cache=torch.zeros(4, 16, 1, 656, dtype=torch.uint8), extra_indices_in_kvcache=ind)
    with pytest.raises(ValueError, match="extra_indices_in_kvcache"):
        call(extra_k_cache=torch.zeros(4, 16, 1, 288, dtype=torch.uint8))
    with pytest.raises(ValueError, match="extra_topk_length"):
        call(extra_topk_length=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(TypeError, match="indices"):
        call(indices=ind.long())
    with pytest.raises(ValueError, match="indices"):
        call(indices=ind[:1])
    with pytest.raises(ValueError, match="topk_length"):
        call(topk_length=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match="attn_sink"):
        call(attn_sink=torch.zeros(8))
    with pytest.raises(ValueError, match="stride"):
        call(k_cache=torch.zeros(4, 16, 1, 528 * 2, dtype=torch.uint8)[..., :528])
    with pytest.raises(TypeError, match="q"):
        call(q=q.float())
    m2 = dk.get_mla_metadata()[0]
    call(tile_scheduler_metadata=m2)
    with pytest.raises(ValueError, match="reused"):
        call(tile_scheduler_metadata=m2, q=torch.zeros(2, 1, 32, 512, dtype=torch.bfloat16))


@pytest.mark.reference
def test_cpu_public_op_matches_reference_and_fills_meta():
    from deepkernels import _backend
    if _backend.interpret_mode():
        pytest.skip("CPU tensors run the kernel under the interpreter")
    kw = make_case(2, 2, 16, "model1", 70, 90, 61, xfmt="model1", xtopk=20, with_len=True, sink=True)
    meta = dk.get_mla_metadata()[0]
    o, l_ = _public(kw, meta)
    ro, rl = ref_call(kw)
    assert torch.equal(o, ro) and torch.equal(l_, rl) and l_.stride() == (32, 1, 16)
    assert meta.have_initialized and meta.config.topk == 70 and meta.config.extra_topk == 20
    assert meta.tile_scheduler_metadata.shape[1] == 8 and meta.num_splits.shape == (3,)


# ------------------------------------------------------------------ edge-case rows (reference tier)
@pytest.mark.reference
def test_B18_topk_length_past_topk_is_clamped():
    kw = make_case(1, 1, 16, "v41", 64, 64, 64, lengths=[100])
    o, l_ = _public(kw)
    o2, l2 = _public(dict(kw, topk_length=torch.tensor([64], dtype=torch.int32)))
    assert torch.equal(o, o2) and torch.equal(l_, l2)


@pytest.mark.reference
def test_B19_nonpow2_v32_scales_used_as_stored_and_oob_indices_invalid():
    kw = make_case(2, 1, 16, "v32", 64, 40, 64, nonpow2=True)
    nt = kw["k_cache"].shape[0] * kw["k_cache"].shape[1]
    kw["indices"][0, 0, -12:] = torch.arange(nt, nt + 12, dtype=torch.int32)       # OOB positive indices
    o, l_ = ref_call(kw)
    no, nl = naive_sparse_decode(kw)
    assert check_is_allclose("out", o.double(), no, **TOL_OUT)
    assert check_is_allclose("lse", l_.double(), nl, **TOL_LSE)


@pytest.mark.reference
def test_B21_B22_geometry_from_shapes():
    # B21: a 512-wide (no separate RoPE) query against a 656-byte cache is rejected, not misread
    kw = make_case(1, 1, 16, "v32", 64, 40, 1)                     # B22: page_block_size 1 taken from the cache
    with pytest.raises(ValueError, match="d_qk"):
        _public(dict(kw, q=kw["q"][..., :512].contiguous()))
    o, l_ = _public(kw)
    ro, rl = ref_call(kw)
    assert check_is_allclose("out", o.float(), ro.float(), **dict(TOL_OUT, cos_diff_tol=2e-5))


# ------------------------------------------------------------------ host path: validated-signature plan cache
@pytest.mark.reference
def test_plan_cache_skips_checks_on_a_repeated_signature_only(monkeypatch):
    """A call whose signature (dtype/shape/strides/device/alignment of every tensor, flags) passed once skips the
    argument checks; a new signature is checked again, and what the signature does not fix (softmax_scale, the
    metadata object's state and type, num_splits) is checked on every call, with the same errors."""
    import deepkernels.mla.sparse_decode as sd
    monkeypatch.setattr(sd, "_PLANS", {})
    checked = []
    real = sd._check_cache
    monkeypatch.setattr(sd, "_check_cache", lambda name, c, fmt: (checked.append(name), real(name, c, fmt)))
    kw = make_case(2, 1, 16, "v41", 64, 80, 16, xfmt="fp4", xtopk=32, xpage=8, with_len=True, sink=True)
    o1, l1 = _public(kw)
    assert checked == ["k_cache", "extra_k_cache"] and len(sd._PLANS) == 1
    o2, l2 = _public(kw)                                               # same signature: no check ran
    assert checked == ["k_cache", "extra_k_cache"] and torch.equal(o1, o2) and torch.equal(l1, l2)
    q_t = torch.zeros(2, 1, 16, 1024, dtype=torch.bfloat16)[..., :512]   # same values, other strides: checked
    q_t.copy_(kw["q"])
    o3, _ = _public(dict(kw, q=q_t))
    assert len(checked) == 4 and len(sd._PLANS) == 2 and torch.equal(o3, o1)
    with pytest.raises(ValueError, match="softmax_scale"):
        _public(dict(kw, softmax_scale=float("inf")))
    meta = dk.get_mla_metadata()[0]
    _public(kw, meta)
    with pytest.raises(ValueError, match="num_splits must be None"):
        dk.flash_mla_with_kvcache(kw["q"], kw["k_cache"], None, None, 512, meta, meta.num_splits,
                                  softmax_scale=kw["softmax_scale"], is_fp8_kvcache=True, indices=kw["indices"],
                                  attn_sink=kw["attn_sink"], extra_k_cache=kw["extra_k_cache"],
                                  extra_indices_in_kvcache=kw["extra_indices_in_kvcache"],
                                  topk_length=kw["topk_length"], extra_topk_length=kw["extra_topk_length"])
    with pytest.raises(ValueError, match="reused"):                    # same meta, another configuration
        _public(dict(kw, q=kw["q"][:, :, :, :].repeat(1, 1, 2, 1), attn_sink=kw["attn_sink"].repeat(2)), meta)
    with pytest.raises(TypeError, match="tile_scheduler_metadata"):
        _public(kw, meta=object())
    n_plans = len(sd._PLANS)
    with pytest.raises(ValueError, match="topk_length"):              # a failing signature is never cached
        _public(dict(kw, topk_length=torch.zeros(3, dtype=torch.int32)))
    with pytest.raises(ValueError, match="topk_length"):
        _public(dict(kw, topk_length=torch.zeros(3, dtype=torch.int32)))
    assert len(sd._PLANS) == n_plans
