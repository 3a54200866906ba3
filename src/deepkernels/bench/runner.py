"""Runs benchmark cases: check first, then time ours and the in-run anchors (GPU only)."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
import traceback

import torch

from .cases import Case
from .roofline import H200, roofline_time_us

__all__ = ["run_case", "provenance", "analytical_rows", "capture_graph"]


def _time_us(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3


def capture_graph(fn, n: int = 1):
    """``(graph, result)``: ``fn`` run once on a side stream (warm-up, as CUDA-graph capture requires), then ``n``
    calls captured into one ``torch.cuda.CUDAGraph``; ``result`` is the last captured call's return value (its
    tensors live in the graph's pool: each replay rewrites them). Whatever ``fn`` reads (inputs, metadata) must
    outlive the graph."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    g = torch.cuda.CUDAGraph()
    res = None
    with torch.cuda.graph(g):
        for _ in range(n):
            res = fn()
    return g, res


def _time_graph_us(fn) -> float | None:
    """Median time of one call replayed from a CUDA graph (no host launch overhead; L2 flushed by do_bench
    before every replay, so it is not a warm-cache number). None when the call cannot be captured."""
    import triton.testing

    try:
        g, _ = capture_graph(fn)
        return float(triton.testing.do_bench(g.replay, warmup=25, rep=100, return_mode="median")) * 1e3
    except Exception:
        torch.cuda.synchronize()
        return None


def _row(case: Case, provider: str, kind: str, status: str, metric: str = "", us: float | None = None,
         graph_us: float | None = None) -> dict:
    """``us``: whole call (host launch included, as ANCHORS.md measures); ``graph_us``: CUDA-graph replay.
    TFLOPS, GB/s and % of roofline use the graph time when there is one (the kernels' own speed)."""
    row = dict(suite=case.suite, name=case.name, provider=provider, provider_kind=kind, status=status,
               metric=metric, flops=case.flops, bytes=case.nbytes, target=case.target, us=us, graph_us=graph_us)
    t = graph_us or us
    if t:
        row["tflops"] = case.flops / (t * 1e-6) / 1e12
        row["gbps"] = case.nbytes / (t * 1e-6) / 1e9
        row["pct_roofline"] = 100.0 * roofline_time_us(case.flops, case.nbytes, case.mma) / t
    return row


def run_case(case: Case, timed: bool) -> list[dict]:
    """One row for ours (PASS/FAIL with the check's metric, and µs when timed) and one per anchor when timed."""
    try:
        t = case.setup()
        out = case.ours(t)
        if timed:
            torch.cuda.synchronize()
        ok, metric = case.check(t, out)
    except Exception as e:  # a crash of ours is a FAIL row, not an abort of the whole bench
        return [_row(case, "deepkernels", "ours", "FAIL", f"{type(e).__name__}: {e}".splitlines()[0][:160])]
    if not ok or not timed:
        return [_row(case, "deepkernels", "ours", "PASS" if ok else "FAIL", metric)]
    ours_fn = lambda: case.ours(t)  # noqa: E731
    rows = [_row(case, "deepkernels", "ours", "PASS", metric, _time_us(ours_fn), _time_graph_us(ours_fn))]
    for name, fn in case.anchors.items():
        try:
            fn(t)
            call = lambda fn=fn: fn(t)  # noqa: E731
            rows.append(_row(case, name, "anchor", "ok", "", _time_us(call), _time_graph_us(call)))
        except Exception as e:
            torch.cuda.synchronize()
            rows.append(_row(case, name, "anchor", "refused", f"{type(e).__name__}: {e}".splitlines()[0][:120]))
    ours = rows[0]
    for r in rows[1:]:
        if r.get("us"):  # ratio > 1: ours faster. Same clock for both: graph replay when both have it.
            both_graph = r.get("graph_us") and ours.get("graph_us")
            ratio = r["graph_us"] / ours["graph_us"] if both_graph else r["us"] / ours["us"]
            ours.setdefault("ratio_vs", {})[r["provider"]] = ratio
    return rows


def analytical_rows(cases: list[Case]) -> list[dict]:
    """H200 roofline lower bounds for production shapes from the datasheet peaks (989 / 1979 TFLOPS, 4.8 TB/s):
    analytical, never measured. ``measured_ceiling_us`` is the same bound on the ceilings measured on our H200."""
    out = []
    for c in cases:
        us = roofline_time_us(c.flops, c.nbytes, c.mma, datasheet=True)
        t_c = c.flops / (H200.peak_tflops(c.mma, datasheet=True) * 1e12)
        bound = "compute" if t_c > c.nbytes / (H200.bandwidth_gbps(datasheet=True) * 1e9) else "memory"
        out.append(dict(suite=c.suite, name=c.name, roofline_us=us, bound=bound, flops=c.flops, bytes=c.nbytes,
                        measured_ceiling_us=roofline_time_us(c.flops, c.nbytes, c.mma), target=c.target,
                        kind="analytical"))
    return out


def _git_sha() -> str:
    if os.environ.get("GIT_SHA"):  # set by the device scripts: the device copy of the tree has no .git
        return os.environ["GIT_SHA"]
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=5).stdout.strip() or "unknown"
    except Exception:
        return "unknown"


def provenance() -> dict:
    import triton

    import deepkernels

    p = dict(date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             deepkernels=deepkernels.__version__, git_sha=_git_sha(), torch=torch.__version__,
             triton=triton.__version__, python=platform.python_version(), host=platform.node())
    if torch.cuda.is_available():
        p["gpu"] = torch.cuda.get_device_name()
        p["sm_count"] = torch.cuda.get_device_properties(0).multi_processor_count
        p["cuda"] = torch.version.cuda
        try:
            p["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                         capture_output=True, text=True, timeout=10).stdout.strip()
        except Exception:
            p["driver"] = "unknown"
    else:
        p["gpu"] = None
    return p


def format_exc() -> str:
    return traceback.format_exc()
