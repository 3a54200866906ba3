"""Fast kernel launch: skip Triton's per-call argument binding once a specialisation is known.

``JITFunction.run`` (``kernel[grid](...)``) re-derives, on every call, each argument's specialisation (dtype,
16-byte divisibility, value 1), hashes it into a cache key, looks the compiled kernel up and packs the
arguments: tens of microseconds of host time per launch for a kernel with ~20 arguments. A library op that
already knows the specialisation (because it validated a fixed shape/stride/dtype/alignment *signature*)
can keep one :class:`KernelLauncher` per signature and call the compiled kernel's launcher directly:

    launcher = KernelLauncher(my_kernel, dict(BLOCK=128, num_warps=4))   # constexprs + compile options
    launcher((grid,), x, y, n)                                            # non-constexpr args, in order

The first call goes through ``my_kernel[grid](...)`` (compiling if needed) and binds the returned
``CompiledKernel``; later calls go straight to its launcher (``CompiledKernel.run``). The caller guarantees
that every call to one ``KernelLauncher`` has the same specialisation: same dtypes, same ``x % 16 == 0`` /
``x == 1`` facts for integer arguments, same 16-byte alignment of pointers (:func:`spec_key` computes
exactly those facts, for callers without a signature of their own, host ``TensorDescriptor`` arguments included).
The slow path is taken whenever the fast one could differ from Triton's: under the interpreter, with launch hooks
installed (profilers), when the current CUDA device changed since binding.

Modules keep one bounded dict of launchers per kernel family and get them with :func:`cached_launcher`:

    launcher = cached_launcher(_LAUNCHERS, my_kernel, (constexprs, spec), lambda: dict(BLOCK=128, num_warps=4))

Gluon kernels (``triton.experimental.gluon.jit``) are ``JITFunction`` subclasses with the same ``params`` and the
same ``fn[grid](...)`` (returns the ``CompiledKernel``), so they go through :class:`KernelLauncher` unchanged.

Pure bookkeeping; no device needed to import or to unit-test (tests use a stand-in JIT function).
"""
from __future__ import annotations

import torch

__all__ = ["KernelLauncher", "spec_key", "cached_launcher"]


def _current_device() -> int:
    return torch.cuda.current_device()


def _stream_getter():
    from triton.runtime import driver
    return driver.active.get_current_stream


def spec_key(*args) -> tuple:
    """Triton's specialisation facts for ``args``: tensors -> (dtype, 16-B aligned), ints -> (==1, %16==0, i32 /
    i64 / u64), floats -> their type only (Triton passes every float as fp32, never specialised), host tensor
    descriptors -> :func:`_desc_key`, other values as they are (bools/None). Equal keys => same compiled kernel.
    (Finer than Triton where it is cheaper: a bool's value, an int argument marked ``do_not_specialize``.)"""
    out = []
    for x in args:
        if isinstance(x, torch.Tensor):
            out.append((x.dtype, x.data_ptr() & 15 == 0))
        elif isinstance(x, bool) or x is None:
            out.append(x)
        elif isinstance(x, int):
            out.append((x == 1, x % 16 == 0, 0 if -2 ** 31 <= x < 2 ** 31 else (2 if x >= 2 ** 63 else 1)))
        elif isinstance(x, float):
            out.append(float)
        elif hasattr(x, "block_shape") and hasattr(x, "base"):
            out.append(_desc_key(x))
        else:
            out.append((type(x), x))
    return tuple(out)


def _desc_key(d) -> tuple:
    """What Triton 3.6 specialises a host ``TensorDescriptor`` on: its type string ``tensordesc<dtype[block_shape]>``
    (``triton.tools.tensor_descriptor``) or ``tensordesc<dtype[block_shape],layout>`` (Gluon's
    ``triton.experimental.gluon.nvidia.hopper.TensorDescriptor``) with no value part -- base address, shape, strides
    and padding are not in the key: the launcher turns them into the CUtensorMap and the runtime shape/stride
    arguments on every call (``backends/nvidia/driver.py``: ``wrap_handle_tensordesc`` / ``make_tensordesc_arg``),
    and both descriptor classes assert a 16-byte aligned base and 16-byte strides when built."""
    layout = getattr(d, "layout", None)
    try:
        hash(layout)
    except TypeError:
        layout = repr(layout)
    return (type(d), d.base.dtype, tuple(d.block_shape), layout)


def cached_launcher(cache: dict, fn, key, meta, limit: int = 1024) -> "KernelLauncher":
    """The :class:`KernelLauncher` of ``fn`` for ``key`` in ``cache`` (a plain dict owned by the calling module),
    created on a miss with ``meta`` (the constexprs and compile options; a dict, or a zero-argument callable returning
    one so that a hit builds nothing). ``key`` must determine ``meta`` and every specialisation fact of the launch
    arguments (:func:`spec_key`, or a validated call plan standing for them); the kernel object is part of the stored
    key, so a test's stand-in kernel (monkeypatched module attribute) gets launchers of its own. The cache is
    emptied when it holds ``limit`` launchers (bounded memory; the compiled kernels stay in Triton's cache)."""
    k = (fn, key)
    launcher = cache.get(k)
    if launcher is None:
        if len(cache) >= limit:
            cache.clear()
        launcher = cache[k] = KernelLauncher(fn, meta() if callable(meta) else meta)
    return launcher


class KernelLauncher:
    """One specialisation of a ``@triton.jit`` kernel with fixed constexprs/options (``meta``)."""

    __slots__ = ("fn", "meta", "_run", "_function", "_packed", "_tail", "_device", "_stream", "_runtime",
                 "fast_calls", "slow_calls")

    def __init__(self, fn, meta: dict):
        self.fn = fn
        self.meta = dict(meta)
        self._run = None
        self._tail = ()
        self._device = None
        self._stream = None
        self._runtime = None
        self.fast_calls = 0
        self.slow_calls = 0

    def _bind(self, kernel, nargs: int) -> None:
        """Remember the compiled kernel's launcher and the constexpr tail of its argument list."""
        from triton import knobs

        params = getattr(self.fn, "params", None)
        if params is None or kernel is None or not hasattr(kernel, "packed_metadata"):
            return
        # JITFunction.run passes bound_args.values(): every parameter in order, constexprs included (the
        # generated launcher drops them). Positional args cover the first nargs parameters; the rest are
        # constexprs/defaults given in meta.
        tail = []
        for p in params[nargs:]:
            if p.name in self.meta:
                tail.append(self.meta[p.name])
            elif p.has_default:
                tail.append(p.default)
            else:  # pragma: no cover - a missing argument would have failed in fn[grid] already
                return
        self._tail = tuple(tail)
        self._function = kernel.function
        self._packed = kernel.packed_metadata
        self._device = _current_device()
        self._stream = _stream_getter()
        self._runtime = knobs.runtime
        self._run = kernel.run

    def __call__(self, grid, *args) -> None:
        run = self._run
        if run is not None:
            rt = self._runtime
            if not _hooked(rt.launch_enter_hook) and not _hooked(rt.launch_exit_hook) and not rt.interpret \
                    and _current_device() == self._device:
                self.fast_calls += 1
                g1 = grid[1] if len(grid) > 1 else 1
                g2 = grid[2] if len(grid) > 2 else 1
                run(grid[0], g1, g2, self._stream(self._device), self._function, self._packed, None, None, None,
                    *args, *self._tail)
                return
        self.slow_calls += 1
        kernel = self.fn[grid](*args, **self.meta)
        if run is None and _bindable(args):
            self._bind(kernel, len(args))


def _hooked(hook) -> bool:
    """A launch hook is installed: Triton 3.6 keeps an always-present ``HookChain`` (empty ``calls``)."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else True


def _bindable(args) -> bool:
    """Bind only for real CUDA launches (never under the interpreter or for CPU tensors)."""
    try:
        from triton import knobs
        if knobs.runtime.interpret:
            return False
    except Exception:  # pragma: no cover
        return False
    return any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
