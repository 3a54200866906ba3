"""Host cost of the public GEMM calls that go through the Gluon kernels vs the Triton ones (same shapes, same process).

For each case: ``submit`` = host µs per call of N back-to-back calls with no synchronisation (the CPU time to validate
through the plan cache and launch; when it exceeds the kernel time the GPU waits on the host; best of two loops),
``whole`` = the median whole call (``triton.testing.do_bench``: what an eager caller sees), ``graph`` = the median
replay of the call captured in a CUDA graph (GPU time alone) -- the same definitions as ``host_overhead.py`` and
``deepkernels bench``, plus the plan's fast/slow launch counters. The Gluon plans' TMA
descriptors go through the launcher's descriptor cache (``deepkernels._launch``): ``--desc-cache both`` (default)
times every Gluon case with it on and off (rows carry ``desc_cache`` and the hits/misses per call), ``on``/``off``
only that setting.

    python benchmarks/gemm_host.py [--out FILE.json] [--desc-cache both|on|off]
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton.testing

sys.path.insert(0, os.path.dirname(__file__))
from grouped_gemm import fp8_weights, provenance  # noqa: E402
from host_overhead import _submit_us  # noqa: E402

from deepkernels.bench.runner import _time_graph_us  # noqa: E402

N_CALLS = 200


def _counters(plans):
    fast = slow = hits = misses = 0
    states = set()
    for p in plans:
        for obj in (p, getattr(p, "plan", None)):
            ln = getattr(obj, "launcher", None) if obj is not None else None
            if ln is not None and hasattr(ln, "fast_calls"):
                fast += ln.fast_calls
                slow += ln.slow_calls
                hits += getattr(ln, "desc_hits", 0)
                misses += getattr(ln, "desc_misses", 0)
                if getattr(ln, "cache_descriptors", False):
                    states.add(ln.desc_state)
    return fast, slow, hits, misses, sorted(states)


def measure(name, fn, plans_dict, env, desc_cache=True):
    from deepkernels import _launch
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    prev = _launch.set_descriptor_cache(desc_cache)
    try:
        plans_dict.clear()
        fn()
        fn()
        torch.cuda.synchronize()
        _, _, h0, m0, _ = _counters(plans_dict.values())
        submit = min(_submit_us(fn, N_CALLS), _submit_us(fn, N_CALLS))
        _, _, h1, m1, states = _counters(plans_dict.values())
        whole = float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median")) * 1e3
        graph = _time_graph_us(fn)
        fast, slow, _, _, _ = _counters(plans_dict.values())
        kind = type(next(iter(plans_dict.values()), None)).__name__
        row = dict(case=name, env=env, plan=kind, desc_cache="on" if desc_cache else "off", desc_states=states,
                   desc_hits_per_call=(h1 - h0) / (2 * N_CALLS), desc_misses_per_call=(m1 - m0) / (2 * N_CALLS),
                   submit_us=submit, whole_us=whole,
                   graph_us=graph, fast_calls=fast, slow_calls=slow)
    finally:
        _launch.set_descriptor_cache(prev)
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    print(f"HOST {name:44s} {str(env):40s} plan {kind:14s} desc {row['desc_cache']:3s} submit "
          f"{row['submit_us']:7.1f} us  whole {row['whole_us']:7.1f} us  graph {float('nan') if graph is None else graph:7.1f} us  fast/slow "
          f"{fast}/{slow}  desc hits/misses per call {row['desc_hits_per_call']:.1f}/{row['desc_misses_per_call']:.2f} "
          f"{states}", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--desc-cache", choices=["both", "on", "off"], default="both",
                    help="descriptor cache setting(s) for the Gluon cases (Triton cases: timed once)")
    args = ap.parse_args()
    settings = {"both": (True, False), "on": (True,), "off": (False,)}[args.desc_cache]
    import deepkernels as dk
    from deepkernels.gemm import dense, grouped
    from deepkernels.quant import per_token_cast_to_fp8
    rows = []
    for g, m, n, k in [(1, 1024, 7168, 2048), (4, 256, 7168, 2048), (1, 1024, 4096, 7168)]:
        a = torch.randn(g, m, k, device="cuda", dtype=torch.bfloat16)
        q = [per_token_cast_to_fp8(a[i]) for i in range(g)]
        A = (torch.stack([x[0] for x in q]), torch.stack([x[1] for x in q]))
        B = fp8_weights(g, n, k, "cuda")
        mm = torch.full((g,), m, dtype=torch.int32, device="cuda")
        d = torch.empty(g, m, n, dtype=torch.bfloat16, device="cuda")
        fn = lambda: dk.m_grouped_fp8_gemm_nt_masked(A, B, d, mm, m)  # noqa: E731
        for env, descs in (({"DEEPKERNELS_GROUPED_GLUON": "1"}, settings),
                           ({"DEEPKERNELS_GROUPED_GLUON": "0"}, (True,))):
            for desc in descs:
                rows.append(measure(f"masked G={g} m={m} n={n} k={k}", fn, grouped._PLANS, env, desc))
    for m, n, k in [(4096, 2112, 7168), (1024, 7168, 16384)]:
        a = per_token_cast_to_fp8(torch.randn(m, k, device="cuda", dtype=torch.bfloat16))
        b = fp8_weights(1, n, k, "cuda")
        b = (b[0][0], b[1][0])
        d = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
        fn = lambda: dk.fp8_gemm_nt(a, b, d)  # noqa: E731
        for env, descs in (({"DEEPKERNELS_DISABLE_GLUON": "0"}, settings),
                           ({"DEEPKERNELS_DISABLE_GLUON": "gemm"}, (True,))):
            for desc in descs:
                rows.append(measure(f"fp8_gemm_nt M={m} N={n} K={k}", fn, dense._FP8_PLANS, env, desc))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"provenance": provenance(), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
