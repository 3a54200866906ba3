"""`deep_gemm.testing`: DeepGEMM's test utilities (``calc_diff``, ``count_bytes``) served by deepkernels.testing.

Upstream's timing helpers (``bench``, ``bench_kineto``, ``suppress_stdout_stderr``, ``empty_suppress``) are not served:
accessing them raises an AttributeError that says so and names the replacement (``triton.testing.do_bench`` /
``do_bench_cudagraph`` for timing, ``torch.profiler`` for kernel-only times)."""
from deepkernels.testing.numerics import calc_diff, count_bytes

__all__ = ["calc_diff", "count_bytes"]

NOT_IMPLEMENTED = {
    "bench": "a CUDA-event timing loop upstream; use triton.testing.do_bench / do_bench_cudagraph",
    "bench_kineto": "kernel-only times from the kineto profiler upstream; use torch.profiler",
    "suppress_stdout_stderr": "an output-silencing context manager used by bench_kineto upstream",
    "empty_suppress": "a no-op context manager used by bench_kineto upstream",
}


def __getattr__(name: str):
    if name in NOT_IMPLEMENTED:
        raise AttributeError(f"deep_gemm.testing.{name} ({NOT_IMPLEMENTED[name]}) is not implemented by deepkernels")
    raise AttributeError(f"module 'deep_gemm.testing' has no attribute {name!r}")


def __dir__():
    return ["calc_diff", "count_bytes"]
