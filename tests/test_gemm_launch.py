"""Host fast path (any tier, no device): deepkernels._launch.KernelLauncher with a stand-in JIT function, and
the dense GEMMs' validated-signature plan cache (every check still applies to a new signature)."""
import pytest
import torch

from deepkernels import _launch
from deepkernels.gemm import dense
from deepkernels.gemm._configs import GemmConfig
from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8


pytestmark = pytest.mark.usefixtures("descriptor_cache_on")   # the cache is off by default (conftest)


class _Param:
    def __init__(self, name, default=None, has_default=False):
        self.name, self.default, self.has_default = name, default, has_default


class _FakeCompiled:
    function = "fn-handle"
    packed_metadata = "packed"

    def __init__(self, log):
        self.log = log

    def run(self, *args):
        self.log.append(("fast", args))


class _FakeJit:
    """Looks like a JITFunction: params, and fn[grid](*args, **meta) launching + returning a compiled kernel."""
    params = [_Param("x"), _Param("n"), _Param("BLOCK"), _Param("FLAG", False, True)]

    def __init__(self):
        self.log = []
        self.compiled = _FakeCompiled(self.log)

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.log.append(("slow", grid, args, meta))
            return self.compiled
        return launch


def test_launcher_binds_after_first_call_and_passes_constexpr_tail(monkeypatch):
    monkeypatch.setattr(_launch, "_bindable", lambda args: True)
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(_launch, "_stream_getter", lambda: (lambda dev: 1234))
    fn = _FakeJit()
    launcher = _launch.KernelLauncher(fn, dict(BLOCK=128, num_warps=4))
    x = torch.zeros(4)
    launcher((3,), x, 7)
    launcher((3, 2), x, 7)
    assert fn.log[0][0] == "slow" and fn.log[0][3] == dict(BLOCK=128, num_warps=4)
    kind, args = fn.log[1]
    # grid, stream, function, packed metadata, launch metadata, hooks, then every parameter in order
    assert kind == "fast" and args[:9] == (3, 2, 1, 1234, "fn-handle", "packed", None, None, None)
    assert args[9] is x and args[10:] == (7, 128, False)
    assert (launcher.fast_calls, launcher.slow_calls) == (1, 1)


def test_launcher_slow_path_with_hooks_or_other_device(monkeypatch):
    from triton import knobs
    monkeypatch.setattr(_launch, "_bindable", lambda args: True)
    dev = [0]
    monkeypatch.setattr(_launch, "_current_device", lambda: dev[0])
    monkeypatch.setattr(_launch, "_stream_getter", lambda: (lambda d: 0))
    fn = _FakeJit()
    launcher = _launch.KernelLauncher(fn, dict(BLOCK=64))
    launcher((1,), 1, 2)
    dev[0] = 1
    launcher((1,), 1, 2)
    dev[0] = 0
    hook = lambda *a: None  # noqa: E731
    if hasattr(knobs.runtime.launch_enter_hook, "add"):  # Triton 3.6: a HookChain, empty by default
        knobs.runtime.launch_enter_hook.add(hook)
        try:
            launcher((1,), 1, 2)
        finally:
            knobs.runtime.launch_enter_hook.remove(hook)
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
        launcher((1,), 1, 2)
    assert [e[0] for e in fn.log] == ["slow", "slow", "slow"]


def test_launcher_never_binds_for_cpu_tensors():
    fn = _FakeJit()
    launcher = _launch.KernelLauncher(fn, {})
    launcher((1,), torch.zeros(2), 1)
    launcher((1,), torch.zeros(2), 1)
    assert launcher.slow_calls == 2 and launcher._run is None


def test_spec_key():
    a = torch.zeros(64)
    assert _launch.spec_key(a, 1, 32) != _launch.spec_key(a[1:], 1, 32)   # alignment
    assert _launch.spec_key(a, 1, 32) != _launch.spec_key(a, 2, 32)       # value 1
    assert _launch.spec_key(a, 1, 32) != _launch.spec_key(a, 1, 33)       # divisibility
    assert _launch.spec_key(a, 1, 32) == _launch.spec_key(a.clone(), 1, 48)


# ------------------------------------------------------------------------------------- plan cache (mocked)
@pytest.fixture
def recorded(monkeypatch):
    """Route the GEMMs to the kernel path on CPU tensors, recording launches instead of running them."""
    log = []
    monkeypatch.setattr(dense, "use_kernels", lambda *t: True)
    monkeypatch.setattr(_launch.KernelLauncher, "__call__", lambda self, grid, *args: log.append((self, args)))
    dense._FP8_PLANS.clear()
    dense._BF16_PLANS.clear()
    yield log
    dense._FP8_PLANS.clear()
    dense._BF16_PLANS.clear()


def _fp8(m=64, n=256, k=512):
    A = per_token_cast_to_fp8(torch.randn(m, k).bfloat16(), use_ue8m0=False)
    B = per_block_cast_to_fp8(torch.randn(n, k).bfloat16(), use_ue8m0=False)
    return A, B, torch.empty(m, n, dtype=torch.bfloat16)


def test_plan_cached_and_reused(recorded):
    A, B, d = _fp8()
    dense.fp8_gemm_nt(A, B, d)
    dense.fp8_gemm_nt(A, B, d)
    A2, B2, d2 = _fp8()  # other tensors, same signature: same plan
    dense.fp8_gemm_nt(A2, B2, d2)
    assert len(dense._FP8_PLANS) == 1 and len(recorded) == 3
    assert recorded[0][0] is recorded[2][0] and recorded[2][1][0] is A2[0] and recorded[2][1][2] is d2
    assert recorded[0][1][6:] == recorded[2][1][6:]  # ints: m, n, k, strides, grid


def test_new_signature_is_validated_again(recorded):
    A, B, d = _fp8()
    dense.fp8_gemm_nt(A, B, d)
    buf = torch.empty(64 * 512 + 16, dtype=torch.float8_e4m3fn)
    shifted = buf[8:8 + 64 * 512].view(64, 512)  # same shape/strides, base not 16-B aligned
    with pytest.raises(ValueError, match="16-byte"):
        dense.fp8_gemm_nt((shifted, A[1]), B, d)
    with pytest.raises(TypeError, match="d must have dtype"):
        dense.fp8_gemm_nt(A, B, d.half())
    with pytest.raises(ValueError, match="c shares d's storage"):
        dense.fp8_gemm_nt(A, B, d, c=d.as_strided((64, 256), (0, 1)))
    with pytest.raises(ValueError, match="b\\[1\\]"):
        dense.fp8_gemm_nt(A, (B[0], B[1][:, :1]), d)
    assert len(dense._FP8_PLANS) == 1 and len(recorded) == 1


def test_copies_and_reference_are_not_cached(recorded, monkeypatch):
    A, B, d = _fp8()
    mn_major = A[0].T.contiguous().T  # copied to K-major on every call
    dense.fp8_gemm_nt((mn_major, A[1]), B, d)
    assert not dense._FP8_PLANS and len(recorded) == 1
    dense.fp8_gemm_nt(A, B, d)
    monkeypatch.setenv("DEEPKERNELS_FORCE_REFERENCE", "1")
    monkeypatch.setattr(dense, "use_kernels", lambda *t: False)
    d.fill_(float("nan"))
    dense.fp8_gemm_nt(A, B, d)  # cached signature, but the reference is forced: no launch
    assert len(recorded) == 2 and not torch.isnan(d).any()


def test_plan_keys_config_and_num_sms(recorded):
    A, B, d = _fp8()
    dense.fp8_gemm_nt(A, B, d, _config=GemmConfig(64, 64, 4, 2))
    dense.fp8_gemm_nt(A, B, d, _config=GemmConfig(64, 128, 4, 2))
    dense.set_num_sms(3)
    try:
        dense.fp8_gemm_nt(A, B, d, _config=GemmConfig(64, 128, 4, 2))
    finally:
        dense.set_num_sms(0)
    assert len(dense._FP8_PLANS) == 3 and recorded[2][1][-1] == 2  # grid = min(tiles=2, 3 SMs)


def test_bf16_plan(recorded):
    a, b = torch.randn(64, 256).bfloat16(), torch.randn(128, 256).bfloat16()
    d = torch.empty(64, 128, dtype=torch.bfloat16)
    dense.bf16_gemm_nt(a, b, d)
    dense.bf16_gemm_nt(a, b.T.contiguous().T, d)  # MN-major B: another signature, another kernel
    dense.bf16_gemm_nt(a, b, d)
    assert len(dense._BF16_PLANS) == 2 and len(recorded) == 3 and recorded[0][0] is recorded[2][0]


# ----------------------------------------------------------------------------------------------- GPU tier
def _sm90_gluon():
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        return False
    from deepkernels.gemm import _gluon_fp8
    return _gluon_fp8.available()


def _gluon_launcher(plans):
    """The descriptor-caching KernelLauncher of the (single) Gluon plan in a plan cache."""
    found = []
    for p in plans.values():
        for obj in (p, getattr(p, "plan", None)):
            ln = getattr(obj, "launcher", None) if obj is not None else None
            if isinstance(ln, _launch.KernelLauncher) and ln.cache_descriptors:
                found.append(ln)
    assert len(found) == 1, f"expected one Gluon plan launcher, found {len(found)} in {list(plans.values())}"
    return found[0]


def _gemm_case(path):
    """(call(a, b) -> d, d, (a, b) inputs, clone of the inputs at new addresses, plan cache) of one Gluon GEMM path."""
    import deepkernels as dk
    from deepkernels.gemm import grouped
    dev = "cuda"
    torch.manual_seed(0)
    if path == "dense":
        m, n, k = 1024, 2112, 7168
        A = per_token_cast_to_fp8(torch.randn(m, k, device=dev).bfloat16(), use_ue8m0=False)
        B = per_block_cast_to_fp8(torch.randn(n, k, device=dev).bfloat16(), use_ue8m0=False)
        d = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
        return (lambda a, b: dk.fp8_gemm_nt(a, b, d)), d, (A, B), dense._FP8_PLANS
    g, m_max, n, k, expected_m = 3, 384, 4096, 2048, 256
    qa = [per_token_cast_to_fp8(torch.randn(m_max, k, device=dev).bfloat16(), use_ue8m0=False) for _ in range(g)]
    qb = [per_block_cast_to_fp8(torch.randn(n, k, device=dev).bfloat16(), use_ue8m0=False) for _ in range(g)]
    A = (torch.stack([x[0] for x in qa]), torch.stack([x[1] for x in qa]))
    B = (torch.stack([x[0] for x in qb]), torch.stack([x[1] for x in qb]))
    mm = torch.tensor([384, 200, 0], dtype=torch.int32, device=dev)
    d = torch.empty(g, m_max, n, dtype=torch.bfloat16, device=dev)
    return (lambda a, b: dk.m_grouped_fp8_gemm_nt_masked(a, b, d, mm, expected_m)), d, (A, B), grouped._PLANS


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90_gluon(), reason="needs an sm90 GPU and Gluon")
@pytest.mark.parametrize("path", ["dense", "masked"])
def test_gpu_gluon_gemm_descriptor_cache(path, monkeypatch):
    """Public Gluon GEMM paths with the descriptor cache: hits from the third call on, outputs bit-identical to the
    uncached launch (set_descriptor_cache(False)), inputs at new addresses re-encode and stay correct, CUDA-graph
    capture and replay give the same result."""
    for var in ("DEEPKERNELS_DISABLE_GLUON", "DEEPKERNELS_GROUPED_GLUON", "DEEPKERNELS_FORCE_REFERENCE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(_launch, "_DESC_ON", [True])
    call, d, (A, B), plans = _gemm_case(path)
    plans.clear()

    def run(a=A, b=B):
        d.zero_()
        call(a, b)
        torch.cuda.synchronize()
        return d.clone()

    ref = run()                         # slow: checks, compiles, binds
    launcher = _gluon_launcher(plans)
    assert launcher.desc_state == "on", launcher.desc_state
    # A and B descriptors, + D's with the TMA-store epilogue (the default configs since session 15)
    (plan,) = [p for p in plans.values() if getattr(p, "launcher", None) is launcher]
    nd = 3 if plan.config.epi_tma else 2
    run()                               # first fast launch: encodes every descriptor
    h0, m0 = launcher.desc_hits, launcher.desc_misses
    assert m0 == nd
    out = run()
    assert (launcher.desc_hits - h0, launcher.desc_misses) == (nd, nd), "same tensors: every descriptor reused"
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    prev = _launch.set_descriptor_cache(False)
    try:
        h1 = launcher.desc_hits
        f1 = launcher.fast_calls
        off = run()
        assert launcher.desc_hits == h1 and launcher.fast_calls == f1 + 1
    finally:
        _launch.set_descriptor_cache(prev)
    torch.testing.assert_close(off, out, rtol=0, atol=0)
    A2 = (A[0].clone(), A[1].clone())   # second copies at new addresses
    B2 = (B[0].clone(), B[1].clone())
    assert A2[0].data_ptr() != A[0].data_ptr() and B2[0].data_ptr() != B[0].data_ptr()
    m1 = launcher.desc_misses
    new = run(A2, B2)
    assert launcher.desc_misses == m1 + 2            # A and B re-encoded; D (same tensor) still a hit
    torch.testing.assert_close(new, out, rtol=0, atol=0)
    Bz = (torch.zeros_like(B[0]), B[1].clone())   # different data at a new address: no stale map
    zero = run(A, Bz)
    assert not zero.abs().any() and launcher.desc_misses == m1 + 3
    torch.testing.assert_close(run(), out, rtol=0, atol=0)      # original tensors: still hits
    # CUDA graph: capture one launch (encodings from the cache), replay after clobbering d
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call(A, B)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(A, B)
    d.fill_(float("nan")) if path == "dense" else d.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(d, out, rtol=0, atol=0)
