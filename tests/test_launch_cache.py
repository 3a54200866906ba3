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


pytestmark = pytest.mark.usefixtures("descriptor_cache_on")   # independent of DEEPKERNELS_DESC_CACHE (conftest)

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
        """Every parameter of a recorded launch, in order (a slow launch's constexprs come from its meta, or from
        the parameter's default when the launch leaves it out, as Triton's binder does)."""
        if entry[0] == "fast":
            return entry[2]
        args, meta = entry[2], entry[3]
        return tuple(args) + tuple(meta[p.name] if p.name in meta or not p.has_default else p.default
                                   for p in self.params[len(args):])


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
    assert all(x.cache_descriptors for x in G._LAUNCHERS.values())    # descriptor cache opted in


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
    monkeypatch.setitem(comb._FAST, "on", False)   # the stand-in replaces the current (not the fast) combine
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
    monkeypatch.setitem(comb._FAST, "on", False)   # the stand-in replaces the current (not the fast) combine
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
    # V4.1 (main cache only) on the WS kernel too (with WS2's dispatch -- V4.1's default since session 15, sharing
    # the WS gate stubbed here -- closed): a second WS launcher (FMT constexpr, V4.1 producer registers); with the WS
    # dispatch closed for it and the single-partition one opened, that kernel takes it
    monkeypatch.setenv("DEEPKERNELS_SPARSE_WS2", "0")
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
    G.launch_sparse_prefill_gluon(*c, variant="ws")     # (variant None: the split-consumer kernel, since session 16)
    G.launch_sparse_prefill_gluon(*case()[:6], 0.07, variant="ws")   # other tensors and scale, same spec.: fast
    assert [e[0] for e in fws.log] == ["slow", "fast"] and not fsingle.log
    slow, fast = fws.full_args(fws.log[0]), fws.full_args(fws.log[1])
    assert len(slow) == len(fws.params) == len(fast)
    assert [_norm(a, ptr=False) for a in slow][:10] == [_norm(a, ptr=False) for a in fast][:10]
    assert fast[10:12] == (0.07, 0.07 * G._LOG2E) and fws.log[0][1] == (8 * 2, )
    assert fws.log[0][3]["maxnreg"] == G.WS_MAXNREG and fws.log[0][3]["NUM_SLOTS"] == G.WS_SLOTS
    G.launch_sparse_prefill_gluon(*c, variant="single")
    G.launch_sparse_prefill_gluon(*c, topk_length=torch.full((8,), 3, dtype=torch.int32), variant="ws")  # HAS_LEN
    G.launch_sparse_prefill_gluon(*case(d=512), variant="ws")                                           # D_PE 0
    assert [e[0] for e in fsingle.log] == ["slow"] and [e[0] for e in fws.log] == ["slow", "fast", "slow", "slow"]
    assert len(G._LAUNCHERS) == 4


# ----------------------------------------------------------------------------------------------- descriptor cache
# A real triton CudaLauncher object (built without compiling: its attributes set by hand) whose ``launch`` is Triton's
# own wrap_handle_tensordesc closure around a recording stand-in for the compiled ``mod.launch``, and a stand-in for
# the active driver's ``utils.fill_tma_descriptor`` (a deterministic "map" + a call counter). The uncached path is
# Triton's code end to end (CudaLauncher.__call__ -> inner -> make_tensordesc_arg), so comparing the argument lists
# the stand-in mod.launch receives checks the cached path's ordering against Triton's.
_FAKE_LAY = "NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=8, rank=2)"


def _meta(block=(128, 128), elem_type=0, elem_size=1, swizzle=3, fp4=False):
    return {"swizzle": swizzle, "elem_size": elem_size, "elem_type": elem_type, "block_size": list(block),
            "fp4_padded": fp4}


class _FakeUtils:
    def __init__(self):
        self.calls = []

    def fill_tma_descriptor(self, ptr, swizzle, elem_size, elem_type, block, shape, strides, padding):
        self.calls.append(ptr)
        return ("MAP", ptr, swizzle, elem_size, elem_type, tuple(block), tuple(shape), tuple(strides), padding)


@pytest.fixture
def fake_tma(monkeypatch):
    """The active Triton driver replaced by one whose utils.fill_tma_descriptor records calls (CPU)."""
    import types

    import triton
    utils = _FakeUtils()
    monkeypatch.setattr(triton.runtime.driver, "_active", types.SimpleNamespace(utils=utils))
    monkeypatch.setattr(_launch, "_DESC_ON", [True])
    return utils


def _cuda_launcher(signature, metas, log, scratch=0):
    from triton.backends.nvidia import driver as drv
    r = drv.CudaLauncher.__new__(drv.CudaLauncher)

    def mod_launch(*args):
        log.append(args)

    r.launch = drv.wrap_handle_tensordesc(mod_launch, signature, metas)
    r.num_ctas, r.global_scratch_size, r.global_scratch_align = 1, scratch, 1
    r.profile_scratch_size, r.profile_scratch_align = 0, 1
    r.launch_cooperative_grid, r.launch_pdl = False, True
    return r


class _CompiledTD:
    function, packed_metadata = "fn-handle", "packed"

    def __init__(self, runner):
        self.run = runner


class _StandInTD(_StandIn):
    """A stand-in JIT function whose compiled kernel's ``run`` is a (fake-built) real CudaLauncher."""

    def __init__(self, params, runner):
        super().__init__(params=params)
        self.compiled = _CompiledTD(runner)


_SIG = {"a_desc": f"tensordesc<fp8e4nv[128, 128],{_FAKE_LAY}>", "x_ptr": "*bf16",
        "b_desc": f"tensordesc<fp8e4nv[64, 128],{_FAKE_LAY}>", "n": "i32", "BLOCK": "constexpr"}


def _td_launcher(metas=None, scratch=0, cache=True, sig=_SIG):
    log = []
    metas = [_meta(), _meta((64, 128))] if metas is None else metas
    runner = _cuda_launcher(sig, metas, log, scratch)
    fn = _StandInTD([_P(n) for n in sig], runner)
    return _launch.KernelLauncher(fn, dict(BLOCK=128), cache_descriptors=cache), runner, log


def _descs(t=None, rows=256, pad="zero"):
    from triton.tools.tensor_descriptor import TensorDescriptor as TD
    t = torch.zeros(512, 256, dtype=torch.uint8) if t is None else t
    return (TD(t, [rows, 256], [t.stride(0), 1], [128, 128], pad), TD(t, [rows, 256], [t.stride(0), 1], [64, 128]))


def _plain(xs):
    return [("T", x.data_ptr()) if isinstance(x, torch.Tensor) else x for x in xs]


def test_desc_cache_argument_order_matches_tritons_wrapper(bind_on_cpu, fake_tma):
    launcher, runner, log = _td_launcher()
    x = torch.zeros(8, dtype=torch.bfloat16)
    a, b = _descs()
    launcher((4, 2), a, x, b, 7)                 # slow: binds
    assert launcher.desc_state == "on" and not log
    launcher((4, 2), a, x, b, 7)                 # fast, cached path (2 misses)
    launcher((4, 2), a, x, b, 7)                 # 2 hits
    assert (launcher.desc_misses, launcher.desc_hits) == (2, 2) and len(fake_tma.calls) == 2
    runner(4, 2, 1, 0, "fn-handle", "packed", None, None, None, a, x, b, 7, 128)   # Triton's own path
    assert len(fake_tma.calls) == 4 and len(log) == 3   # Triton's path encoded both descriptors again
    assert _plain(log[0]) == _plain(log[1]) == _plain(log[2])
    # base args: grid, stream, function, coop, pdl, scratches, packed, launch metadata, hooks; then expanded params
    assert log[1][:13] == (4, 2, 1, 0, "fn-handle", False, True, None, None, "packed", None, None, None)
    exp = log[1][13:]
    assert exp[0][0] == "MAP" and exp[0][5] == (128, 128) and exp[1:5] == (256, 256, 256, 1) and exp[5] is x
    assert exp[6][5] == (64, 128) and exp[7:11] == (256, 256, 256, 1) and exp[11:] == (7, 128)
    assert log[0][13] is log[1][13]              # the cached map object itself is reused (kept alive by the cache)


def test_desc_cache_mixed_and_fp4_meta_match_tritons_wrapper(bind_on_cpu, fake_tma):
    """A descriptor not lowered to TMA (meta None: base, shape, strides, padding flag, shape, strides) next to an
    fp4-padded one (shape[-1] doubled): same expansion as Triton's."""
    launcher, runner, log = _td_launcher(metas=[None, _meta(fp4=True)])
    x = torch.zeros(8, dtype=torch.bfloat16)
    a, b = _descs(torch.zeros(512, 256, dtype=torch.bfloat16), pad="nan")[0], _descs()[1]
    for _ in range(3):
        launcher((1,), a, x, b, 3)
    runner(1, 1, 1, 0, "fn-handle", "packed", None, None, None, a, x, b, 3, 128)
    assert launcher.desc_state == "on" and (launcher.desc_misses, launcher.desc_hits) == (1, 1)
    assert len(log) == 3 and _plain(log[0]) == _plain(log[1]) == _plain(log[2])
    exp = log[0][13:]
    assert exp[0] is a.base and exp[1:6] == (256, 256, 256, 1, True) and exp[6:10] == (256, 256, 256, 1)
    assert exp[11][6] == (256, 512) and exp[12:16] == (256, 512, 256, 1)


def test_desc_cache_reencodes_on_any_changed_fact(bind_on_cpu, fake_tma):
    launcher, runner, log = _td_launcher(metas=[_meta(), _meta()])
    x = torch.zeros(8, dtype=torch.bfloat16)
    t = torch.zeros(512, 512, dtype=torch.uint8)
    from triton.tools.tensor_descriptor import TensorDescriptor as TD

    def go(d):
        n0 = len(fake_tma.calls)
        launcher((1,), d, x, d, 1)
        return len(fake_tma.calls) - n0

    launcher((1,), TD(t, [256, 256], [512, 1], [128, 128]), x, TD(t, [256, 256], [512, 1], [128, 128]), 1)  # bind
    base = TD(t, [256, 256], [512, 1], [128, 128])
    assert go(base) == 1                          # same meta at both positions: one encoding serves both
    assert go(TD(t, [256, 256], [512, 1], [128, 128])) == 0       # a new descriptor object, same facts: hit
    assert go(TD(t[16:], [256, 256], [512, 1], [128, 128])) == 1  # base pointer
    assert go(TD(t.clone(), [256, 256], [512, 1], [128, 128])) == 1
    assert go(TD(t, [255, 256], [512, 1], [128, 128])) == 1       # shape
    assert go(TD(t, [256, 256], [256, 1], [128, 128])) == 1       # strides
    assert go(base) == 0
    # different kernel meta (block size, elem type/size, swizzle) for the same descriptor: distinct keys
    l2, _, log2 = _td_launcher(metas=[_meta((128, 128)), _meta((64, 128))])
    l3, _, _ = _td_launcher(metas=[_meta(elem_type=5, elem_size=2), _meta(swizzle=2)])
    for lx in (l2, l3):
        for _ in range(3):
            lx((1,), base, x, base, 1)
        assert (lx.desc_misses, lx.desc_hits) == (2, 2)
    assert log2[-1][13][5] == (128, 128) and log2[-1][19][5] == (64, 128)


def test_desc_cache_padding_and_dtype_facts(bind_on_cpu, fake_tma):
    from triton.tools.tensor_descriptor import TensorDescriptor as TD
    launcher, _, log = _td_launcher()
    x = torch.zeros(8, dtype=torch.bfloat16)
    t = torch.zeros(256, 256, dtype=torch.bfloat16)
    z = (TD(t, [256, 256], [256, 1], [128, 128]), x, TD(t, [256, 256], [256, 1], [64, 128]), 1)
    nan = (TD(t, [256, 256], [256, 1], [128, 128], "nan"), x, TD(t, [256, 256], [256, 1], [64, 128], "nan"), 1)
    launcher((1,), *z)
    for args in (z, z, nan, nan, z):
        launcher((1,), *args)
    assert (launcher.desc_misses, launcher.desc_hits) == (4, 6)
    assert log[0][13][8] == 0 and log[2][13][8] == 1 and log[4][13][8] == 0


def test_desc_cache_is_bounded_lru(bind_on_cpu, fake_tma, monkeypatch):
    monkeypatch.setattr(_launch, "DESC_CACHE_LIMIT", 4)
    launcher, _, _ = _td_launcher()
    x = torch.zeros(8, dtype=torch.bfloat16)
    bufs = [torch.zeros(512, 256, dtype=torch.uint8) for _ in range(4)]
    a0, b0 = _descs(bufs[0])
    launcher((1,), a0, x, b0, 1)                  # bind
    for buf in bufs[:2]:                           # 4 entries (2 per call)
        launcher((1,), *_descs(buf)[:1], x, _descs(buf)[1], 1)
    desc = launcher._desc
    assert len(desc.cache) == 4 and launcher.desc_misses == 4
    launcher((1,), *_descs(bufs[0])[:1], x, _descs(bufs[0])[1], 1)   # bufs[0]: hits, most recently used
    launcher((1,), *_descs(bufs[2])[:1], x, _descs(bufs[2])[1], 1)   # evicts bufs[1]'s two entries
    assert len(desc.cache) == 4 and (launcher.desc_misses, launcher.desc_hits) == (6, 2)
    launcher((1,), *_descs(bufs[0])[:1], x, _descs(bufs[0])[1], 1)
    assert (launcher.desc_misses, launcher.desc_hits) == (6, 4)
    launcher((1,), *_descs(bufs[1])[:1], x, _descs(bufs[1])[1], 1)
    assert (launcher.desc_misses, launcher.desc_hits) == (8, 4) and len(desc.cache) == 4
    for i in range(20):
        launcher((1,), *_descs(bufs[i % 4])[:1], x, _descs(bufs[i % 4])[1], 1)
        assert len(desc.cache) <= 4


def _assert_uncached(launcher, log, fake_tma, state_prefix):
    x = torch.zeros(8, dtype=torch.bfloat16)
    a, b = _descs()
    for _ in range(3):
        launcher((1,), a, x, b, 1)
    assert launcher.desc_state.startswith(state_prefix), launcher.desc_state
    assert launcher._desc is None and launcher.desc_hits == 0 and launcher.fast_calls == 2
    assert len(fake_tma.calls) == 4 and len(log) == 2      # Triton's path: two encodings per fast launch


def test_desc_cache_falls_back_on_unexpected_structure(bind_on_cpu, fake_tma, monkeypatch):
    import triton
    launcher, _, log = _td_launcher(cache=False)           # not asked for
    _assert_uncached(launcher, log, fake_tma, "off")
    fake_tma.calls.clear()
    import types

    from triton.runtime import _allocation
    monkeypatch.setattr(_allocation, "_allocator", types.SimpleNamespace(get=lambda: (lambda size, al, st: None)))
    launcher, _, log = _td_launcher(scratch=256)           # scratch buffers (CudaLauncher.__call__ allocates)
    _assert_uncached(launcher, log, fake_tma, "fallback: kernel needs scratch")
    fake_tma.calls.clear()
    launcher, runner, log = _td_launcher()                 # launch is not wrap_handle_tensordesc's closure
    inner = runner.launch
    runner.launch = lambda *a: inner(*a)
    _assert_uncached(launcher, log, fake_tma, "fallback: launch is not")
    fake_tma.calls.clear()
    launcher, runner, log = _td_launcher()
    monkeypatch.setattr(triton, "__version__", "3.7.0")    # another Triton
    _assert_uncached(launcher, log, fake_tma, "fallback: triton 3.7.0")
    monkeypatch.setattr(triton, "__version__", _launch._TRITON_VERSION)
    fake_tma.calls.clear()
    cpu = _launch.KernelLauncher(_StandIn(params=[_P("d"), _P("x"), _P("e"), _P("n"), _P("BLOCK")]),
                                 dict(BLOCK=1), cache_descriptors=True)
    a, b = _descs()
    cpu((1,), a, torch.zeros(1), b, 1)                     # run is a plain method, not a CudaLauncher
    assert cpu.desc_state.startswith("fallback: launcher is") and cpu._desc is None
    from triton.backends.nvidia import driver as drv        # a kernel without descriptor arguments
    log = []
    r = _cuda_launcher({"x_ptr": "*bf16", "n": "i32"}, None, log)
    assert r.launch.__qualname__ != "wrap_handle_tensordesc.<locals>.inner"    # Triton returns mod.launch as is
    plain = _launch.KernelLauncher(_StandInTD([_P("x"), _P("n")], r), {}, cache_descriptors=True)
    plain((1,), torch.zeros(1), 1)
    plain((1,), torch.zeros(1), 1)
    assert plain.desc_state.startswith("fallback") and len(log) == 1 and plain.fast_calls == 1
    assert drv._BASE_ARGS_FORMAT_LEN == 13
    # descriptors none of which is lowered to TMA: nothing to cache
    launcher2, _, log2 = _td_launcher(metas=[None, None])
    x = torch.zeros(8, dtype=torch.bfloat16)
    a, b = _descs()
    launcher2((1,), a, x, b, 1)
    launcher2((1,), a, x, b, 1)
    assert launcher2.desc_state.startswith("fallback: no descriptor lowered") and len(log2) == 1


def test_desc_cache_global_switch_and_slow_paths(bind_on_cpu, fake_tma):
    launcher, runner, log = _td_launcher()
    x = torch.zeros(8, dtype=torch.bfloat16)
    a, b = _descs()
    launcher((1,), a, x, b, 1)
    launcher((1,), a, x, b, 1)
    assert len(fake_tma.calls) == 2
    prev = _launch.set_descriptor_cache(False)
    try:
        assert prev is True and not _launch.descriptor_cache_enabled()
        launcher((1,), a, x, b, 1)                 # Triton's per-call encoding
        assert len(fake_tma.calls) == 4 and launcher.desc_hits == 0
    finally:
        _launch.set_descriptor_cache(prev)
    launcher((1,), a, x, b, 1)
    assert len(fake_tma.calls) == 4 and launcher.desc_hits == 2
    assert _plain(log[0]) == _plain(log[1]) == _plain(log[2])


def test_desc_cache_never_raises_at_bind(bind_on_cpu, fake_tma, monkeypatch):
    def boom(*a, **k):
        raise RuntimeError("inspection failed")
    monkeypatch.setattr(_launch._DescriptorLaunch, "_build", staticmethod(boom))
    launcher, _, log = _td_launcher()
    _assert_uncached(launcher, log, fake_tma, "fallback: RuntimeError: inspection failed")


def test_gluon_call_sites_opt_in(monkeypatch):
    """The Gluon GEMM plans (dense WS, m-grouped masked / contiguous) and the dense MLA decode launch create their
    KernelLaunchers with the descriptor cache on."""
    from deepkernels.gemm import _gluon_fp8 as GF
    from deepkernels.gemm import dense, grouped
    seen = []
    rec = lambda *a, **k: seen.append(k.get("launcher", a[-1] if a else None))  # noqa: E731
    monkeypatch.setattr(GF, "_launch_fp8_gluon", rec)
    monkeypatch.setattr(GF, "_launch_fp8_gluon_m_masked", rec)
    monkeypatch.setattr(GF, "_launch_fp8_gluon_m_contiguous", rec)
    z = torch.zeros(1, 1)
    p = dense._GluonPlan()
    p.config = GF.GLUON_DEFAULT if GF.GLUON_DEFAULT.warp_spec else GF.GLUON_WS_128_S4
    p(z, z, z, z, z, None)
    grouped._GluonPlan(GF.GLUON_WS_128_S4, True)(z, z, z, z, z, z)
    grouped._GluonPlan(GF.GLUON_WS_128_S6, False)(z, z, z, z, z, z)
    assert len(seen) == 3 and all(isinstance(l, _launch.KernelLauncher) and l.cache_descriptors for l in seen)
    assert [l.fn for l in seen] == [GF._fp8_gluon_ws_kernel, GF._fp8_gluon_m_masked_kernel,
                                    GF._fp8_gluon_m_contiguous_kernel]


def _real_signature_case(compiled, fn, args, tail_meta):
    """Fast launches of ``fn`` (stand-in with the real params) whose launcher is a CudaLauncher shell built from a
    real cross-compiled kernel's signature and tensordesc_meta: cached expansion == Triton's."""
    log = []
    runner = _cuda_launcher(dict(compiled.src.signature), compiled.metadata.tensordesc_meta, log)
    stand = _StandInTD(fn.params, runner)
    launcher = _launch.KernelLauncher(stand, tail_meta, cache_descriptors=True)
    for _ in range(3):
        launcher((3,), *args)
    assert launcher.desc_state == "on", launcher.desc_state
    runner(3, 1, 1, 0, "fn-handle", "packed", None, None, None, *args, *launcher._tail)
    assert len(log) == 3 and _plain(log[0]) == _plain(log[1]) == _plain(log[2])
    return launcher, log


@pytest.mark.compile
@needs_gluon
def test_desc_cache_order_with_real_gluon_signatures(bind_on_cpu, fake_tma):
    """The dense MLA decode kernel (two descriptors over one k_cache, one encoding) and the dense / masked Gluon
    GEMM kernels: signatures and tensordesc_meta from a real sm90 cross-compile."""
    from deepkernels._gluon import TensorDescriptor as GTD
    from deepkernels.gemm import _gluon_fp8 as GF
    from deepkernels.mla import _gluon_dense_decode as G
    c = G._compile_sm90()
    k = torch.zeros(6, 64, 1, 576, dtype=torch.bfloat16)
    lay = G._smem_layout()
    kn = GTD(k, [384, 576], [576, 1], [64, 512], lay)
    kp = GTD(k, [384, 576], [576, 1], [64, 64], lay)
    t = torch.zeros(4, dtype=torch.int32)
    args = (torch.zeros(2, 1, 128, 576, dtype=torch.bfloat16), kn, kp, t, t, t, t, t, t, t, t,
            *range(14), 0.5, 0.7)
    launcher, log = _real_signature_case(c, G._mla_decode_gluon_kernel, args,
                                         dict(zip(G._CONSTEXPRS, (False, *G.GLUON_DEFAULT)), num_warps=4))
    assert (launcher.desc_misses, launcher.desc_hits) == (1, 3)     # kn / kp encode the same map (meta block 64x64)
    cfg = GF.GLUON_WS_128_S4
    glay = GF._smem_layout()
    a = torch.zeros(256, 512, dtype=torch.float8_e4m3fn)
    b = torch.zeros(384, 512, dtype=torch.float8_e4m3fn)
    ad = GTD(a, [256, 512], [512, 1], [cfg.block_m, GF.BLOCK_K], glay)
    bd = GTD(b, [384, 512], [512, 1], [cfg.block_n, GF.BLOCK_K], glay)
    f = torch.zeros(4)
    launcher, _ = _real_signature_case(GF._compile_sm90(cfg), GF._fp8_gluon_ws_kernel,
                                       (ad, bd, f, f, f, *range(1, 9), 7), GF.ws_meta(cfg))
    assert (launcher.desc_misses, launcher.desc_hits) == (2, 2)
    launcher, _ = _real_signature_case(GF._compile_sm90_m_masked(cfg), GF._fp8_gluon_m_masked_kernel,
                                       (ad, bd, f, f, f, t, *range(1, 13), 7), GF.m_masked_meta(cfg))
    assert (launcher.desc_misses, launcher.desc_hits) == (2, 2)


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
    from deepkernels.mla import _gluon_sparse_prefill as G, _gluon_sparse_prefill_ws2 as G2
    from test_mla_prefill import make_case
    q, kv, ind, *_ = make_case(64, 1024, 128, h_q=128, device="cuda", noncontig=False)
    # the split-consumer kernel takes the WS kernel's calls while dispatched (since session 16)
    return (lambda: dk.flash_mla_sparse_fwd(q, kv, ind, 576 ** -0.5)), (G2 if G2.dispatch_on() else G)._LAUNCHERS


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


def _desc_launchers(cache):
    return [x for x in cache.values() if x.cache_descriptors]


@pytest.mark.gpu
@pytest.mark.skipif(not _sm90(), reason="needs an sm90 GPU and Gluon")
def test_gpu_dense_decode_descriptor_cache(monkeypatch):
    """Dense MLA decode on the Gluon kernel with the descriptor cache (two descriptors over k_cache, two over q with
    Q by TMA):
    repeated calls hit and equal the uncached launch bit for bit, a k_cache copy at a new address re-encodes and is
    still correct, CUDA-graph capture + replay gives the same result."""
    import deepkernels as dk
    from deepkernels.mla import _gluon_dense_decode as G
    from test_mla_decode_reference import make_case
    monkeypatch.delenv("DEEPKERNELS_DISABLE_GLUON", raising=False)
    monkeypatch.setattr(_launch, "_DESC_ON", [True])
    monkeypatch.setattr(G, "_LAUNCHERS", {})
    q, k, bt, sl = make_case(4, 1, 128, 1, [300, 1, 4096, 64], device="cuda")
    meta = dk.get_mla_metadata()[0]

    def call(kc=k):
        o, lse = dk.flash_mla_with_kvcache(q, kc, bt, sl, 512, meta)
        torch.cuda.synchronize()
        return o.clone(), lse.clone()

    first = call()                                # slow: binds
    launchers = _desc_launchers(G._LAUNCHERS)
    assert len(launchers) == 1, "the Gluon dense decode kernel was not dispatched"
    ln = launchers[0]
    assert ln.desc_state == "on", ln.desc_state
    call()
    # descriptors per launch: 2 over k_cache, + 2 over q with Q by TMA (dispatched since session 16), + PVR's [64, 256]
    # K half-slot descriptor at 128 heads (dispatched since session 20)
    n = sum(1 for _, m in ln._desc.items if m is not None)
    qt = G.DISPATCH_Q_TMA and G.q_tma_supported(q, 1)
    assert n == (2 + 2 * qt + (qt and G.DISPATCH_PVR and q.shape[2] >= G.DISPATCH_PVR_MIN_HEADS)), n
    h0, m0 = ln.desc_hits, ln.desc_misses
    assert m0 >= 1 and h0 + m0 == n
    out = call()
    assert (ln.desc_hits - h0, ln.desc_misses) == (n, m0)
    prev = _launch.set_descriptor_cache(False)
    try:
        f0, h1 = ln.fast_calls, ln.desc_hits
        off = call()
        assert ln.fast_calls == f0 + 1 and ln.desc_hits == h1
    finally:
        _launch.set_descriptor_cache(prev)
    k2 = k.clone()                                # second copy at a new address
    m1 = ln.desc_misses
    new = call(k2)
    assert ln.desc_misses > m1
    for a, b, c, e in zip(first, out, off, new):
        torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(c, b, rtol=0, atol=0, equal_nan=True)
        torch.testing.assert_close(e, b, rtol=0, atol=0, equal_nan=True)
    k2.zero_()                                     # same address, new data: the map is still right (no stale data)
    zero_o, _ = call(k2)
    assert not torch.equal(zero_o, out[0]) and torch.count_nonzero(torch.nan_to_num(zero_o, nan=1.0)) == 0
    meta2 = dk.get_mla_metadata()[0]
    dk.flash_mla_with_kvcache(q, k, bt, sl, 512, meta2)   # warm the schedule path
    torch.cuda.synchronize()
    meta3 = dk.get_mla_metadata()[0]
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        go, gl_ = dk.flash_mla_with_kvcache(q, k, bt, sl, 512, meta3)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(go, out[0], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(gl_, out[1], rtol=0, atol=0, equal_nan=True)


def test_triton_aligned_is_spec_keys_divisibility_fact():
    """triton_aligned: every tensor 16-B aligned and every int a multiple of 16 -- the divisibility facts spec_key
    records (a stride of 584 bf16 elements has 16-byte rows but is not such a fact)."""
    t = torch.zeros(64, dtype=torch.bfloat16)
    assert _launch.triton_aligned(t, 576, 0, 1024) and _launch.triton_aligned()
    assert not _launch.triton_aligned(t, 584) and not _launch.triton_aligned(t[1:], 576)
    for x in (t, t[1:], 576, 584, 16, 8):
        assert _launch.spec_key(x)[0][1] == _launch.triton_aligned(x)
