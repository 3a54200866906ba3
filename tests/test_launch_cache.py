"""Launcher caches (any tier, no device): ``deepkernels._launch.cached_launcher``, :func:`spec_key` on host
``TensorDescriptor`` arguments (checked against the installed Triton's own specialisation), the slow-path fallbacks
of a bound launcher, and the three Gluon MLA launches routed through ``KernelLauncher`` (stand-in kernels with the
real kernels' parameter lists). GPU tier: each Gluon path through its public op twice -- the second call launches
the compiled kernel directly, and both outputs equal the slow path's bit for bit."""
from __future__ import annotations

import itertools

import pytest
import torch

from deepkernels import _launch
from deepkernels._gluon import available as gluon_available

needs_gluon = pytest.mark.skipif(not gluon_available(), reason="Gluon not importable")


# ----------------------------------------------------------------------------------------------- stand-ins
class _Compiled:
    function, packed_metadata = "fn-handle", "packed"

    def __init__(self, log):
        self.log = log

    def run(self, *args):
        # grid x/y/z, stream, function, packed metadata, launch metadata, hooks, then every parameter in order
        self.log.append(("fast", args[:3], args[9:]))


class _StandIn:
    """Looks like a (Gluon) JITFunction: the real kernel's ``params``; ``fn[grid](*args, **meta)`` records the launch
    and returns a compiled kernel whose ``run`` records a fast launch."""

    def __init__(self, real=None, params=None):
        self.params = real.params if real is not None else params
        self.log = []
        self.compiled = _Compiled(self.log)

    def __getitem__(self, grid):
        def launch(*args, **meta):
            self.log.append(("slow", tuple(grid), args, meta))
            return self.compiled
        return launch

    def full_args(self, entry):
        """Every parameter of a recorded launch, in order (a slow launch's constexprs come from its meta)."""
        if entry[0] == "fast":
            return entry[2]
        args, meta = entry[2], entry[3]
        return tuple(args) + tuple(meta[p.name] for p in self.params[len(args):])


class _P:
    def __init__(self, name):
        self.name, self.default, self.has_default = name, None, False


@pytest.fixture
def bind_on_cpu(monkeypatch):
    """Let KernelLauncher bind on CPU tensors (device 0, stream 0)."""
    monkeypatch.setattr(_launch, "_bindable", lambda args: True)
    monkeypatch.setattr(_launch, "_current_device", lambda: 0)
    monkeypatch.setattr(_launch, "_stream_getter", lambda: (lambda dev: 0))


def _norm(x, ptr=True):
    """Comparable view of one launch argument (tensors and descriptors by what the launcher reads)."""
    if isinstance(x, torch.Tensor):
        return ("T", x.dtype, tuple(x.shape), x.data_ptr() if ptr else None)
    if hasattr(x, "block_shape") and hasattr(x, "base"):
        return ("D", type(x).__name__, x.base.dtype, x.base.data_ptr() if ptr else None, tuple(x.shape),
                tuple(x.strides), tuple(x.block_shape), repr(getattr(x, "layout", None)), x.padding)
    return x


# ----------------------------------------------------------------------------------------------- cached_launcher
def test_cached_launcher_reuses_builds_meta_once_and_is_bounded():
    cache, built = {}, []

    def meta():
        built.append(1)
        return dict(BLOCK=64, num_warps=4)

    fn_a, fn_b = _StandIn(params=[]), _StandIn(params=[])
    la = _launch.cached_launcher(cache, fn_a, ("k", 1), meta)
    assert _launch.cached_launcher(cache, fn_a, ("k", 1), meta) is la and len(built) == 1
    assert la.fn is fn_a and la.meta == dict(BLOCK=64, num_warps=4)
    lb = _launch.cached_launcher(cache, fn_b, ("k", 1), meta)          # another kernel object: its own launcher
    lc = _launch.cached_launcher(cache, fn_a, ("k", 2), dict(BLOCK=32))  # a plain dict works too
    assert len({id(la), id(lb), id(lc)}) == 3 and len(cache) == 3 and lc.meta == dict(BLOCK=32)
    small = {}
    for i in range(5):
        _launch.cached_launcher(small, fn_a, i, {}, limit=3)
    assert len(small) == 2      # emptied at the limit, then refilled: never more than `limit` launchers


def test_module_caches_use_the_shared_helper(bind_on_cpu, monkeypatch):
    """The Triton launch sites of decode, sparse decode and the scheduler key one launcher per (kernel,
    specialisation) through cached_launcher (the combine's: the sparse decode test below)."""
    import deepkernels.mla.decode as dec
    import deepkernels.mla.metadata as md
    import deepkernels.mla.sparse_decode as sd
    seen = []
    real = _launch.cached_launcher

    def spy(cache, fn, key, meta, limit=1024):
        seen.append(cache)
        return real(cache, fn, key, meta, limit)

    for mod in (dec, md, sd):
        monkeypatch.setattr(mod, "cached_launcher", spy)
        monkeypatch.setattr(mod, "_LAUNCHERS", {})
    fn = _StandIn(params=[_P("x")])
    l1 = dec._main_launcher(fn, (1, 2), 4, 2, ("spec",))
    assert dec._main_launcher(fn, (1, 2), 4, 2, ("spec",)) is l1 and l1.meta["num_warps"] == 4
    l2 = sd._fwd_launcher(fn, (0,) * 14, 8, 2, ("spec",))
    assert sd._fwd_launcher(fn, (0,) * 14, 8, 2, ("spec",)) is l2 and l2.meta["NUM_STAGES"] == 0
    monkeypatch.setattr(md, "_mla_sched_metadata_kernel", fn)
    l3 = md._sched_launcher(5, True, True)
    assert md._sched_launcher(5, True, True) is l3 and l3.meta["OVERHEAD"] == 5
    assert seen == [dec._LAUNCHERS] * 2 + [sd._LAUNCHERS] * 2 + [md._LAUNCHERS] * 2
    assert [len(c) for c in (dec._LAUNCHERS, sd._LAUNCHERS, md._LAUNCHERS)] == [1, 1, 1]


# ----------------------------------------------------------------------------------------------- spec_key
def _samples():
    """Launch arguments of every kind Triton specialises: tensors (dtype, alignment), ints (1, %16, i32/i64/u64),
    floats, bools, None, and host tensor descriptors (Triton's and Gluon's)."""
    from triton.tools.tensor_descriptor import TensorDescriptor as TD
    x = torch.zeros(4096, dtype=torch.bfloat16)
    out = [x, x[1:], x[8:], x.float(), x.float()[1:], x.int(), torch.zeros(3, dtype=torch.uint8)]
    out += [0, 1, 2, 16, 17, -16, -1, 2 ** 31 - 16, 2 ** 31, 2 ** 31 + 1, 2 ** 40, 2 ** 63 - 1, 2 ** 63, -2 ** 31,
            -2 ** 31 - 16, 0.5, 1.0, 3e38, True, False, None]
    m = torch.zeros(256, 576, dtype=torch.bfloat16)
    h = torch.zeros(256, 576, dtype=torch.float16)
    out += [TD(m, [256, 576], [576, 1], [64, 512]), TD(m[16:], [240, 576], [576, 1], [64, 512]),
            TD(m, [256, 512], [576, 1], [64, 512], "nan"), TD(m, [256, 576], [576, 1], [64, 64]),
            TD(h, [256, 576], [576, 1], [64, 512])]
    if gluon_available():
        from deepkernels._gluon import TensorDescriptor as GTD
        from deepkernels._gluon import gl
        l128 = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        l64 = gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)
        out += [GTD(m, [256, 576], [576, 1], [64, 512], l128), GTD(m[64:], [192, 576], [576, 1], [64, 512], l128),
                GTD(m, [255, 576], [576, 1], [64, 512], l128, "nan"), GTD(m, [256, 576], [576, 1], [64, 64], l128),
                GTD(m, [256, 576], [576, 1], [64, 512], l64), GTD(h, [256, 576], [576, 1], [64, 512], l128)]
    return out


def _triton_spec(x):
    """The installed Triton's specialisation of one argument (what JITFunction.run puts in its cache key)."""
    try:
        from triton._C.libtriton import native_specialize_impl
        from triton.backends.compiler import BaseBackend
    except ImportError:  # pragma: no cover - another Triton
        pytest.skip("triton._C.libtriton.native_specialize_impl not available")
    return native_specialize_impl(BaseBackend, x, False, True, True)


def test_spec_key_is_at_least_as_fine_as_tritons_specialisation():
    """Equal spec_key => equal Triton specialisation, for every pair of sample arguments (so a launcher bound on one
    argument is valid for every argument with the same key)."""
    samples = _samples()
    keys = [_launch.spec_key(x) for x in samples]
    specs = [_triton_spec(x) for x in samples]
    for (ka, sa, a), (kb, sb, b) in itertools.combinations(zip(keys, specs, samples), 2):
        if ka == kb:
            assert sa == sb, (_norm(a), _norm(b), sa, sb)


def test_spec_key_descriptors():
    """Descriptors: distinct dtype / block shape / layout / class -> distinct keys; base address, shape, strides and
    padding are runtime values (not in Triton's key either) -> the same key, so the launcher is reused."""
    from triton.tools.tensor_descriptor import TensorDescriptor as TD
    m = torch.zeros(512, 576, dtype=torch.bfloat16)
    k = _launch.spec_key
    a = TD(m, [512, 576], [576, 1], [64, 512])
    assert k(a) == k(TD(m[64:], [448, 576], [576, 1], [64, 512], "nan")) == k(TD(m.clone(), [512, 512], [576, 1],
                                                                                [64, 512]))
    assert k(a) != k(TD(m, [512, 576], [576, 1], [64, 64]))                       # block shape
    assert k(a) != k(TD(m.half(), [512, 576], [576, 1], [64, 512]))               # dtype
    assert _triton_spec(a) == _triton_spec(TD(m[64:], [448, 576], [576, 1], [64, 512], "nan"))
    assert _triton_spec(a)[1] is None               # Triton: no value part for a descriptor
    hash(k(a))
    if gluon_available():
        from deepkernels._gluon import TensorDescriptor as GTD
        from deepkernels._gluon import gl
        lay = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)
        g = GTD(m, [512, 576], [576, 1], [64, 512], lay)
        assert k(g) == k(GTD(m[128:], [384, 576], [576, 1], [64, 512],
                             gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)))
        assert k(g) != k(a)                                                          # Gluon's carries its layout
        assert k(g) != k(GTD(m, [512, 576], [576, 1], [64, 512],
                             gl.NVMMASharedLayout(swizzle_byte_width=64, element_bitwidth=16, rank=2)))
        hash(k(g))


def test_spec_key_scalars():
    k = _launch.spec_key
    assert k(2 ** 31) != k(2 ** 31 - 16) and k(2 ** 63) != k(2 ** 62)        # i32 / i64 / u64
    assert k(0.25) == k(3.0) != k(3)                                            # floats: fp32, never specialised
    assert k(True) != k(1)


# ----------------------------------------------------------------------------------------------- fallbacks
def test_bound_launcher_falls_back_to_the_slow_path(bind_on_cpu, monkeypatch):
    """A launcher bound with a descriptor argument: interpreter, launch hooks and a device change take the slow
    path (fn[grid](...)); CPU-only arguments never bind."""
    from triton import knobs
    from triton.tools.tensor_descriptor import TensorDescriptor as TD
    fn = _StandIn(params=[_P("desc"), _P("n"), _P("BLOCK")])
    desc = TD(torch.zeros(64, 64), [64, 64], [64, 1], [16, 16])
    launcher = _launch.KernelLauncher(fn, dict(BLOCK=16))
    launcher((2,), desc, 5)
    launcher((2,), desc, 5)
    assert [e[0] for e in fn.log] == ["slow", "fast"] and fn.log[1][2] == (desc, 5, 16)
    dev = [0]
    monkeypatch.setattr(_launch, "_current_device", lambda: dev[0])
    dev[0] = 1
    launcher((2,), desc, 5)
    dev[0] = 0
    monkeypatch.setattr(knobs.runtime, "interpret", True)
    launcher((2,), desc, 5)
    monkeypatch.setattr(knobs.runtime, "interpret", False)
    hook = lambda *a: None  # noqa: E731
    if hasattr(knobs.runtime.launch_enter_hook, "add"):     # Triton 3.6: a HookChain, empty by default
        knobs.runtime.launch_enter_hook.add(hook)
        try:
            launcher((2,), desc, 5)
        finally:
            knobs.runtime.launch_enter_hook.remove(hook)
    else:
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", hook)
        launcher((2,), desc, 5)
        monkeypatch.setattr(knobs.runtime, "launch_enter_hook", None)
    launcher((2,), desc, 5)
    assert [e[0] for e in fn.log] == ["slow", "fast", "slow", "slow", "slow", "fast"]
    assert (launcher.fast_calls, launcher.slow_calls) == (2, 4)
    monkeypatch.undo()
    cpu = _launch.KernelLauncher(_StandIn(params=[_P("desc"), _P("n")]), {})
    cpu((1,), desc, 1)
    cpu((1,), desc, 1)
    assert cpu.slow_calls == 2 and cpu._run is None      # no CUDA tensor: never bound


# ----------------------------------------------------------------------------------------------- Gluon launches
@needs_gluon
def test_gluon_dense_decode_launch_goes_through_kernel_launcher(bind_on_cpu, monkeypatch):
    from deepkernels.mla import _gluon_dense_decode as G
    fn = _StandIn(G._mla_decode_gluon_kernel)
    monkeypatch.setattr(G, "_mla_decode_gluon_kernel", fn)
    monkeypatch.setattr(G, "_LAUNCHERS", {})

    def case(dtype=torch.bfloat16, b=2, h_q=128, nb=6):
        q = torch.randn(b, 1, h_q, 576).to(dtype)
        k = torch.randn(nb, 64, 1, 576).to(dtype)
        bt = torch.arange(b * 3, dtype=torch.int32).view(b, 3)
        sl = torch.full((b,), 100, dtype=torch.int32)
        sched = torch.zeros(4, 8, dtype=torch.int32)
        ns = torch.zeros(b + 1, dtype=torch.int32)
        acc = b + 4
        return (q, k, bt, sl, sched, ns, 0.04, False, torch.empty(b, 1, h_q, 512, dtype=dtype),
                torch.empty(b, h_q, 1), torch.empty(acc, 1, h_q, 512), torch.empty(acc, 1, h_q))

    c1, c2 = case(), case()
    G.gluon_dense_launch(*c1)
    G.gluon_dense_launch(*c2)                         # other tensors, same specialisation: fast
    assert [e[0] for e in fn.log] == ["slow", "fast"] and len(G._LAUNCHERS) == 1
    slow, fast = fn.full_args(fn.log[0]), fn.full_args(fn.log[1])
    assert len(slow) == len(fn.params) == len(fast)
    assert [_norm(a, ptr=False) for a in slow] == [_norm(a, ptr=False) for a in fast]
    assert fn.log[0][1] == (4 * 1 * 2, ) and fast[-4:] == (False, *G.GLUON_DEFAULT)
    kn, kp = fast[1], fast[2]                          # fresh descriptors over this call's k_cache
    assert kn.base is c2[1] and kp.base is c2[1] and list(kn.block_shape) == [64, 512]
    assert list(kp.block_shape) == [64, 64] and list(kn.shape) == [6 * 64, 576]
    G.gluon_dense_launch(*case(torch.float16))        # fp16 descriptors: another specialisation
    G.gluon_dense_launch(*c1, config=(3, 232, 40))    # another constexpr
    G.gluon_dense_launch(*c1, _spec=("plan",))        # a caller's key
    G.gluon_dense_launch(*c2, _spec=("plan",))
    assert [e[0] for e in fn.log] == ["slow", "fast", "slow", "slow", "slow", "fast"] and len(G._LAUNCHERS) == 4


@needs_gluon
def test_gluon_sparse_decode_public_op_takes_the_fast_path(bind_on_cpu, monkeypatch):
    """V3.2 through the public op (Gluon dispatch forced on CPU): the Gluon split-KV kernel and the combine are
    launched through bound KernelLaunchers from the second call on, keyed by the cached call plan."""
    import deepkernels.mla._gluon_sparse_decode as gsd
    import deepkernels.mla.combine as comb
    import deepkernels.mla.sparse_decode as sd
    from test_mla_sparse_reference import _public, make_case
    fn = _StandIn(gsd._sparse_decode_gluon_kernel)
    cfn = _StandIn(comb._mla_decode_combine_kernel)
    monkeypatch.setattr(gsd, "_sparse_decode_gluon_kernel", fn)
    monkeypatch.setattr(comb, "_mla_decode_combine_kernel", cfn)
    monkeypatch.setattr(gsd, "supported", lambda *a, **k: True)
    monkeypatch.setattr(sd, "use_kernels", lambda *t: True)
    monkeypatch.setattr(sd, "_PLANS", {})
    monkeypatch.setattr(sd._gsdw, "DISPATCH", False)     # the single-partition kernel (the WS one: next test)
    for mod in (gsd, sd, comb):
        monkeypatch.setattr(mod, "_LAUNCHERS", {})
    kw = make_case(2, 1, 64, "v32", 64, 80, 16, with_len=True, sink=True)
    for _ in range(3):
        _public(kw)
    assert [e[0] for e in fn.log] == ["slow", "fast", "fast"] and [e[0] for e in cfn.log] == ["slow", "fast", "fast"]
    assert len(gsd._LAUNCHERS) == 1 and not sd._LAUNCHERS and len(sd._PLANS) == 1
    slow, fast = fn.full_args(fn.log[0]), fn.full_args(fn.log[2])
    assert len(slow) == len(fn.params) == len(fast)
    assert [_norm(a, ptr=False) for a in slow] == [_norm(a, ptr=False) for a in fast]
    assert fast[0] is kw["q"] and fast[3] is kw["topk_length"]
    launcher = next(iter(gsd._LAUNCHERS.values()))
    assert launcher.fast_calls == 2 and launcher.meta["FMT"] == gsd.GLUON_FMTS["v32"] and len(comb._LAUNCHERS) == 1


@needs_gluon
def test_gluon_sparse_decode_ws_public_op_takes_the_fast_path(bind_on_cpu, monkeypatch):
    """V3.2 through the public op dispatches to the warp-specialised kernel (the default), which is launched through
    a bound KernelLauncher from the second call on, keyed by the cached call plan; V4.1 does not take it."""
    import deepkernels.mla._gluon_sparse_decode as gsd
    import deepkernels.mla._gluon_sparse_decode_ws as gsdw
    import deepkernels.mla.combine as comb
    import deepkernels.mla.sparse_decode as sd
    from test_mla_sparse_reference import _public, make_case
    fn = _StandIn(gsdw._sparse_decode_gluon_ws_kernel)
    single = _StandIn(gsd._sparse_decode_gluon_kernel)
    cfn = _StandIn(comb._mla_decode_combine_kernel)
    monkeypatch.setattr(gsdw, "_sparse_decode_gluon_ws_kernel", fn)
    monkeypatch.setattr(gsd, "_sparse_decode_gluon_kernel", single)
    monkeypatch.setattr(comb, "_mla_decode_combine_kernel", cfn)
    monkeypatch.setattr(gsd, "supported", lambda *a, **k: True)
    monkeypatch.setattr(gsdw, "supported", lambda *a, **k: True)
    monkeypatch.setattr(sd, "use_kernels", lambda *t: True)
    monkeypatch.setattr(sd, "_PLANS", {})
    for mod in (gsd, gsdw, sd, comb):
        monkeypatch.setattr(mod, "_LAUNCHERS", {})
    kw = make_case(2, 1, 64, "v32", 64, 80, 16, with_len=True, sink=True)
    for _ in range(3):
        _public(kw)
    assert [e[0] for e in fn.log] == ["slow", "fast", "fast"] and not single.log
    assert len(gsdw._LAUNCHERS) == 1 and not gsd._LAUNCHERS and not sd._LAUNCHERS
    slow, fast = fn.full_args(fn.log[0]), fn.full_args(fn.log[2])
    assert len(slow) == len(fn.params) == len(fast)
    assert [_norm(a, ptr=False) for a in slow] == [_norm(a, ptr=False) for a in fast]
    launcher = next(iter(gsdw._LAUNCHERS.values()))
    assert launcher.fast_calls == 2 and launcher.meta["maxnreg"] == gsdw.WS_MAXNREG
    assert launcher.meta["FMT"] == 0 and launcher.meta["PRODUCER_REGS"] == gsdw.WS_PRODUCER_REGS
    # V4.1 (main cache only) is dispatched to the WS kernel too: a second WS launcher (FMT constexpr, V4.1 producer
    # registers); with the WS dispatch closed for it and the single-partition one opened, that kernel takes it
    assert gsdw.supported_ws(kw["q"], kw["k_cache"], "v41") and "v41" in gsdw.DISPATCH_FMTS
    kw41 = make_case(2, 1, 64, "v41", 64, 80, 16, with_len=True, sink=True)
    for _ in range(2):
        _public(kw41)
    assert [e[0] for e in fn.log] == ["slow", "fast", "fast", "slow", "fast"] and not single.log
    assert fn.log[3][3]["FMT"] == 2 and fn.log[3][3]["PRODUCER_REGS"] == gsdw.WS_PRODUCER_REGS_V41
    monkeypatch.setattr(gsdw, "DISPATCH_FMTS", frozenset({"v32"}))
    monkeypatch.setattr(gsd, "DISPATCH_FMTS", frozenset({"v32", "v41"}))
    monkeypatch.setattr(sd, "_PLANS", {})
    _public(kw41)
    assert [e[0] for e in single.log] == ["slow"] and len(fn.log) == 5
    assert single.log[0][3]["FMT"] == gsd.GLUON_FMTS["v41"]
    assert len(gsdw._LAUNCHERS) == 2


@needs_gluon
def test_gluon_sparse_prefill_launch_goes_through_kernel_launcher(bind_on_cpu, monkeypatch):
    from deepkernels.mla import _gluon_sparse_prefill as G
    fws, fsingle = _StandIn(G._sparse_prefill_gluon_ws_kernel), _StandIn(G._sparse_prefill_gluon_kernel)
    monkeypatch.setattr(G, "_sparse_prefill_gluon_ws_kernel", fws)
    monkeypatch.setattr(G, "_sparse_prefill_gluon_kernel", fsingle)
    monkeypatch.setattr(G, "_LAUNCHERS", {})

    def case(s_q=8, h_q=128, s_kv=200, topk=64, d=576):
        q = torch.randn(s_q, h_q, d).bfloat16()
        kv = torch.randn(s_kv, 1, d).bfloat16()
        ind = torch.randint(0, s_kv, (s_q, 1, topk), dtype=torch.int32)
        return (torch.empty(s_q, h_q, 512, dtype=torch.bfloat16), torch.empty(s_q, h_q), torch.empty(s_q, h_q), q,
                kv, ind, 0.05)

    c = case()
    G.launch_sparse_prefill_gluon(*c)
    G.launch_sparse_prefill_gluon(*case()[:6], 0.07)    # other tensors and scale, same specialisation: fast
    assert [e[0] for e in fws.log] == ["slow", "fast"] and not fsingle.log
    slow, fast = fws.full_args(fws.log[0]), fws.full_args(fws.log[1])
    assert len(slow) == len(fws.params) == len(fast)
    assert [_norm(a, ptr=False) for a in slow][:10] == [_norm(a, ptr=False) for a in fast][:10]
    assert fast[10:12] == (0.07, 0.07 * G._LOG2E) and fws.log[0][1] == (8 * 2, )
    assert fws.log[0][3]["maxnreg"] == G.WS_MAXNREG and fws.log[0][3]["NUM_SLOTS"] == G.WS_SLOTS
    G.launch_sparse_prefill_gluon(*c, variant="single")
    G.launch_sparse_prefill_gluon(*c, topk_length=torch.full((8,), 3, dtype=torch.int32))   # HAS_LEN
    G.launch_sparse_prefill_gluon(*case(d=512))                                             # D_PE 0
    assert [e[0] for e in fsingle.log] == ["slow"] and [e[0] for e in fws.log] == ["slow", "fast", "slow", "slow"]
    assert len(G._LAUNCHERS) == 4


# ----------------------------------------------------------------------------------------------- GPU tier
def _sm90():
    return torch.cuda.is_available() and gluon_available() and torch.cuda.get_device_capability()[0] == 9


def _gpu_case(path):
    """(public call, Gluon launcher cache) of one Gluon path at a small shape."""
    import deepkernels as dk
    if path == "sparse_decode_v32":     # dispatched to the warp-specialised kernel
        from deepkernels.mla import _gluon_sparse_decode_ws as G
        from test_mla_sparse_reference import _public, make_case
        kw = make_case(4, 1, 128, "v32", 64, 300, 64, with_len=True, sink=True)
        kw = {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        meta = dk.get_mla_metadata()[0]
        return (lambda: _public(kw, meta)), G._LAUNCHERS
    if path == "dense_decode_bf16":
        from deepkernels.mla import _gluon_dense_decode as G
        from test_mla_decode_reference import make_case
        q, k, bt, sl = make_case(4, 1, 128, 1, [300, 1, 4096, 64], device="cuda")
        meta = dk.get_mla_metadata()[0]
        return (lambda: dk.flash_mla_with_kvcache(q, k, bt, sl, 512, meta)), G._LAUNCHERS
    from deepkernels.mla import _gluon_sparse_prefill as G
    from test_mla_prefill import make_case
    q, kv, ind, *_ = make_case(64, 1024, 128, h_q=128, device="cuda", noncontig=False)
    return (lambda: dk.flash_mla_sparse_fwd(q, kv, ind, 576 ** -0.5)), G._LAUNCHERS


def _fast(cache):
    return sum(x.fast_calls for x in cache.values())


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU and Gluon")
@pytest.mark.parametrize("path", ["sparse_decode_v32", "dense_decode_bf16", "sparse_prefill"])
def test_gpu_gluon_path_second_call_is_fast_and_identical(path, monkeypatch):
    monkeypatch.delenv("DEEPKERNELS_DISABLE_GLUON", raising=False)
    call, cache = _gpu_case(path)
    calls = lambda: sum(x.fast_calls + x.slow_calls for x in cache.values())  # noqa: E731
    c0 = calls()
    first = call()
    torch.cuda.synchronize()
    assert calls() == c0 + 1, f"{path}: the Gluon kernel was not dispatched"
    f0 = _fast(cache)
    second = call()
    torch.cuda.synchronize()
    assert _fast(cache) - f0 == 1, f"{path}: second call did not launch the Gluon kernel directly"
    with monkeypatch.context() as m:                 # every launcher on Triton's own path (as with a launch hook)
        m.setattr(_launch, "_hooked", lambda hook: True)
        f1 = _fast(cache)
        slow = call()
        torch.cuda.synchronize()
        assert _fast(cache) == f1
    for a, b, c in zip(first, second, slow):
        torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(a, c, rtol=0, atol=0, equal_nan=True)
