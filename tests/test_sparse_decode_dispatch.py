"""Which sparse decode kernel the public op (``flash_mla_with_kvcache`` with ``indices``) takes, CPU with the launches
stubbed: since session 17 the 2-CTA cluster kernel (``_gluon_sparse_decode_ws3``) for h_q a multiple of 128 without
an extra cache (V3.2 and V4.1), since session 18 also with an extra cache (``DISPATCH_EXTRA_PAIRS``: V4.1 + FP4,
V4.1 + V4.1, V3.2 + V3.2), WS / WS2 otherwise; ``DEEPKERNELS_SPARSE_WS3=0`` / ``=1`` override it; another Triton
version than the one its launcher was written against never takes it."""
from __future__ import annotations

import pytest

import deepkernels.mla.sparse_decode as sd
from deepkernels.mla import _gluon_sparse_decode as G
from deepkernels.mla import _gluon_sparse_decode_ws as W
from deepkernels.mla import _gluon_sparse_decode_ws2 as W2
from deepkernels.mla import _gluon_sparse_decode_ws3 as W3

from test_mla_sparse_reference import _public, make_case


@pytest.fixture
def took(monkeypatch):
    names = []
    for name, mod, attr in (("ws", W, "launch_sparse_decode_gluon_ws"), ("ws2", W2, "launch_sparse_decode_gluon_ws2"),
                            ("ws3", W3, "launch_sparse_decode_gluon_ws3"), ("single", G, "launch_sparse_decode_gluon"),
                            ("triton", sd, "_launch_sparse_decode")):
        monkeypatch.setattr(mod, attr, lambda *a, _n=name, **k: names.append(_n))
    for mod in (W, W2, G):
        monkeypatch.setattr(mod, "supported", lambda *a, **k: True)
    monkeypatch.setattr(sd, "use_kernels", lambda *t: True)
    monkeypatch.setattr(sd, "_PLANS", {})
    monkeypatch.delenv("DEEPKERNELS_SPARSE_WS2", raising=False)
    monkeypatch.delenv("DEEPKERNELS_SPARSE_WS3", raising=False)
    monkeypatch.setattr(W3, "DISPATCH_MIN_BLOCKS", 0)      # these small cases: the work threshold has its own tests
    return names


def _cases():
    return dict(v32_128=make_case(2, 1, 128, "v32", 64, 80, 16), v41_128=make_case(2, 2, 128, "v41", 64, 80, 16),
                v32_64=make_case(2, 1, 64, "v32", 64, 80, 16), v41_64=make_case(2, 1, 64, "v41", 64, 80, 16),
                fp4_128=make_case(2, 1, 128, "v41", 64, 80, 16, xfmt="fp4", xtopk=64),
                fp4_64=make_case(2, 1, 64, "v41", 64, 80, 16, xfmt="fp4", xtopk=64),
                v41x_128=make_case(2, 1, 128, "v41", 64, 80, 16, xfmt="v41", xtopk=64),
                v32x_128=make_case(2, 1, 128, "v32", 64, 80, 16, xfmt="v32", xtopk=64))


def test_default_routes(took):
    assert W3.DISPATCH and W3.DISPATCH_FMTS == frozenset({"v32", "v41"})
    assert W3.DISPATCH_EXTRA_PAIRS == frozenset({("v41", "fp4"), ("v41", "v41"), ("v32", "v32")})
    c = _cases()
    for k in ("v32_128", "v41_128", "v32_64", "v41_64", "fp4_128", "fp4_64", "v41x_128", "v32x_128"):
        _public(c[k])
    # h_q 128 without an extra cache: the cluster kernel; h_q 64: WS (V3.2) / WS2 (V4.1); every extra pair at h_q 128:
    # the cluster kernel, at h_q 64 WS
    assert took == ["ws3", "ws3", "ws", "ws2", "ws3", "ws", "ws3", "ws3"], took


def test_extra_pairs_override(took, monkeypatch):
    """DEEPKERNELS_SPARSE_WS3=1 sends every pair WS3 implements there (h_q 128) even with DISPATCH_EXTRA_PAIRS
    empty; =0 keeps them on WS."""
    c = _cases()
    monkeypatch.setattr(W3, "DISPATCH_EXTRA_PAIRS", frozenset())
    _public(c["v41x_128"])
    assert took == ["ws"], took
    took.clear()
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS3", "1")
    for k in ("v41x_128", "v32x_128", "fp4_128"):
        _public(c[k])
    assert took == ["ws3", "ws3", "ws3"], took
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS3", "0")
    _public(c["fp4_128"])
    assert took[3:] == ["ws"], took


def test_supported_ws3_extra(monkeypatch):
    """The gate: h_q a multiple of 128 and an implemented pair; the WS kernel's own gate (stubbed here) decides the
    rest."""
    monkeypatch.setattr(W, "supported", lambda *a, **k: True)
    c = _cases()
    for k, want in (("fp4_128", True), ("v41x_128", True), ("v32x_128", True), ("fp4_64", False)):
        kw = c[k]
        fmt = "v32" if kw["k_cache"].shape[-1] == 656 else "v41"
        assert W3.supported_ws3(kw["q"], kw["k_cache"], fmt, kw["extra_k_cache"]) is want, k


def test_env_override(took, monkeypatch):
    c = _cases()
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS3", "0")
    _public(c["v32_128"])
    _public(c["v41_128"])
    assert took == ["ws", "ws2"], took
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS3", "1")
    monkeypatch.setattr(W3, "DISPATCH_FMTS", frozenset())
    _public(c["v32_128"])
    _public(c["v32_64"])                       # h_q 64 cannot form head-block pairs: never the cluster kernel
    assert took[2:] == ["ws3", "ws"], took
    monkeypatch.delenv("DEEPKERNELS_SPARSE_WS3")
    _public(c["v32_128"])                      # DISPATCH_FMTS empty, no override: WS
    assert took[4:] == ["ws"], took


def test_work_threshold(took, monkeypatch):
    """Below DISPATCH_MIN_BLOCKS 64-token blocks per CTA the call stays on the kernel it would take without WS3 (WS
    for V3.2 and V4.1 + FP4, WS2 for V4.1); DEEPKERNELS_SPARSE_WS3=1 ignores the threshold."""
    c = _cases()
    monkeypatch.setattr(W3, "DISPATCH_MIN_BLOCKS", 10 ** 6)
    _public(c["v32_128"])
    _public(c["v41_128"])
    _public(c["fp4_128"])
    assert took == ["ws", "ws2", "ws"], took
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS3", "1")
    _public(c["v32_128"])
    _public(c["fp4_128"])
    assert took[3:] == ["ws3", "ws3"], took


def test_enough_work_values(monkeypatch):
    """The measured boundary (H200, 66 parts at s_q 1): b 64 / 128 at topk 2048 (31 / 62 blocks per CTA) take WS3;
    b 32 at topk 2048 and b 128 at topk 512 (15.5) and b 8 (3.9) do not."""
    monkeypatch.delenv("DEEPKERNELS_SPARSE_WS3", raising=False)
    assert W3.DISPATCH_MIN_BLOCKS == 24
    assert W3.enough_work(128, 2048, 66) and W3.enough_work(64, 2048, 66) and W3.enough_work(32, 2048, 16)
    assert not W3.enough_work(32, 2048, 66) and not W3.enough_work(128, 512, 66) and not W3.enough_work(8, 2048, 66)
    assert W3.enough_work(64, 2047, 66) == W3.enough_work(64, 2048, 66)      # blocks counted rounded up
    # with an extra cache its blocks count too: b 32 at topk 2048 + 512 has 32 * 40 / 66 = 19.4 blocks per CTA,
    # b 64 38.8; at b 32 the boundary is 24 * 66 / 32 = 49.5 blocks per request: 2048 + 1088 has 32 + 17 = 49,
    # 2048 + 1089 has 50 (rounded up per cache)
    assert not W3.enough_work(32, 2048, 66, 512) and W3.enough_work(64, 2048, 66, 512)
    assert not W3.enough_work(32, 2048, 66, 1088) and W3.enough_work(32, 2048, 66, 1089)
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS3", "1")
    assert W3.enough_work(1, 64, 66)


def test_other_triton_version_never_dispatches(took, monkeypatch):
    """The version is read once at import (``_TRITON_OK``); another one closes the path even under the override."""
    import triton
    assert W3._TRITON_OK == (triton.__version__ == W3._TRITON_VERSION)
    monkeypatch.setattr(triton, "__version__", "3.7.0")
    assert W3._triton_version() == "3.7.0"
    monkeypatch.setattr(W3, "_TRITON_OK", W3._triton_version() == W3._TRITON_VERSION)
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS3", "1")
    assert not W3.dispatch_on("v32")
    _public(_cases()["v32_128"])
    assert took == ["ws"], took


def test_ws_dispatch_off_closes_ws3(took, monkeypatch):
    """The cluster kernel sits under the WS kernel's dispatch: with that off, V3.2 takes the single-partition kernel."""
    monkeypatch.setattr(W, "DISPATCH", False)
    _public(_cases()["v32_128"])
    assert took == ["single"], took
