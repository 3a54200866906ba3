"""Test tiers (docs/DESIGN.md): reference, interpret, compile, gpu.

- ``interpret`` tests run only with TRITON_INTERPRET=1 (the kernels must be decorated in interpreter mode,
  so that tier is a separate pytest process; see README's test command).
- ``compile`` tests need real @triton.jit functions, so they are skipped under the interpreter.
- ``gpu`` tests need CUDA.
"""
import os

import pytest
import torch
from hypothesis import HealthCheck, settings

settings.register_profile("ci", deadline=None, max_examples=40,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci")

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
HAS_CUDA = torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    skip_interp = pytest.mark.skip(reason="interpreter tier: run with TRITON_INTERPRET=1")
    skip_compile = pytest.mark.skip(reason="compile tier needs real @triton.jit functions (unset TRITON_INTERPRET)")
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "interpret" in item.keywords and not INTERPRET:
            item.add_marker(skip_interp)
        if "compile" in item.keywords and INTERPRET:
            item.add_marker(skip_compile)
        if "gpu" in item.keywords and (not HAS_CUDA or INTERPRET):
            item.add_marker(skip_gpu)


@pytest.fixture(autouse=True)
def _seed():
    # fresh random inputs every run, but reproducible within one test when it fails: print the seed
    seed = int.from_bytes(os.urandom(4), "little")
    torch.manual_seed(seed)
    yield seed


@pytest.fixture
def descriptor_cache_on():
    """The TMA descriptor cache of the fast launch path (``deepkernels._launch``) switched on for the test, restored
    after (it is on by default; the fixture keeps the modules that test it independent of DEEPKERNELS_DESC_CACHE)."""
    from deepkernels import _launch
    prev = _launch.set_descriptor_cache(True)
    yield
    _launch.set_descriptor_cache(prev)


@pytest.fixture
def device():
    """The device kernels run on in this tier: cuda on a GPU, cpu under the interpreter."""
    return "cuda" if HAS_CUDA and not INTERPRET else "cpu"


@pytest.fixture
def one_torch_thread():
    """Run torch on one intra-op thread for the test (restored after): for tests issuing hundreds of tiny ops,
    where threads only add overhead on the shared 2-core CI machine."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
