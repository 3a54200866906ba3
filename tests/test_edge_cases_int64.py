"""Kind 6 of shared/cases/edge-cases.md (B51 generalised; also B21's 64-bit row offsets): every Triton kernel
computes its row offsets in 64-bit. Run in the interpreter tier, in a subprocess (an int32 offset makes the
interpreter dereference a wrapped address and crash): the rows each kernel reads or writes sit more than 2^31
elements apart in a lazily allocated buffer (a few pages touched). The cases live in tests/_edge_int64_cases.py.
"""
import os
import subprocess
import sys

import pytest

CASES = ["gemm_fp8", "gemm_bf16", "dense_decode", "sparse_prefill", "dense_prefill", "sparse_decode"]
_WORKER = os.path.join(os.path.dirname(__file__), "_edge_int64_cases.py")


@pytest.fixture(scope="module")
def results():
    """Run every case in one subprocess; after a crash, restart with the cases it did not reach."""
    out, todo = {}, list(CASES)
    env = dict(os.environ, TRITON_INTERPRET="1")
    while todo:
        try:
            p = subprocess.run([sys.executable, _WORKER, *todo], capture_output=True, text=True, timeout=240, env=env)
            lines, rc, err = p.stdout.splitlines(), p.returncode, p.stderr[-2000:]
        except subprocess.TimeoutExpired as e:
            lines, rc, err = (e.stdout or b"").decode().splitlines(), "timeout", ""
        for line in lines:
            word, name, *why = line.split(" ", 2)
            if name in todo:
                out[name] = (word, " ".join(why))
        todo = [c for c in todo if c not in out]
        if todo:   # the first unreported case crashed (or hung) the worker
            out[todo[0]] = ("crash", f"worker exit {rc}: {err}")
            todo = todo[1:]
    return out


@pytest.mark.interpret
@pytest.mark.parametrize("case", CASES)
def test_B51_kind_int64_row_offsets(case, results):
    word, why = results[case]
    assert word == "ok", f"{case}: {word} {why}"
