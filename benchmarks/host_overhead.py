"""Host overhead of the dense decode public call (``flash_mla_with_kvcache`` over a bf16 cache; the Gluon split-KV
kernel on sm90, the Triton one elsewhere), the counterpart of ``mla_sparse_decode.py --host``.

For b = 1..128 at h_q 128, s_q 1, s_k 4096 (every request at full length, page 64, h_kv 1): the host submit time
per call (perf_counter over back-to-back calls, no sync), the whole call (do_bench median: host + GPU), the
CUDA-graph replay of the same call (kernels only; median, L2 flushed), the number of fast (direct
``CompiledKernel``) launches per call, and the submit time with every ``KernelLauncher`` forced onto Triton's own
launcher (``fn[grid](...)``, what a launch hook does): the before/after of the launcher path in one run. The Gluon
kernel's two TMA descriptors go through the launcher's descriptor cache (``deepkernels._launch``); ``--desc-cache``
sets it for the main timing and every row also times the other setting (``desc_cache_other_host_submit_us``), with
the cache hits / misses per call. JSON rows ``op = "mla_dense_decode_host"`` with provenance (GPU, torch/triton
versions, $GIT_SHA).

Usage:
    python benchmarks/host_overhead.py [--b 1,2,4,8,16,32,64,128] [--hq 128] [--sk 4096] [--json out.json]
        [--desc-cache on|off]   # descriptor cache for the main timing (default on; the other setting is timed too)
        [--warmup]   # compile only (two calls per case), no timing
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import deepkernels as dk  # noqa: E402
from deepkernels import _launch  # noqa: E402
from deepkernels.bench.runner import _time_graph_us, provenance  # noqa: E402
from deepkernels.mla import _gluon_dense_decode as _gdd  # noqa: E402
from deepkernels.mla import combine as _comb  # noqa: E402
from deepkernels.mla import decode as _dec  # noqa: E402
from deepkernels.mla import metadata as _md  # noqa: E402

PAGE, D_QK, D_V = 64, 576, 512


def _caches():
    return _dec._LAUNCHERS, _gdd._LAUNCHERS, _comb._LAUNCHERS, _md._LAUNCHERS


def _fast() -> int:
    return sum(x.fast_calls for c in _caches() for x in c.values())


def _desc_counts():
    ls = [x for c in _caches() for x in c.values()]
    return sum(x.desc_hits for x in ls), sum(x.desc_misses for x in ls), sorted({x.desc_state for x in ls
                                                                                 if x.cache_descriptors})


def _submit_us(call, n: int) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return (t1 - t0) / n * 1e6


def dense_host(b: int, h_q: int, s_k: int, do_bench, n: int = 200, warmup_only: bool = False):
    """One JSON row (None with ``warmup_only``)."""
    dev = "cuda"
    pages = -(-s_k // PAGE)
    nb = b * pages
    q = (torch.randn(b, 1, h_q, D_QK, device=dev) / 10).clamp_(-1, 1).bfloat16()
    k_cache = (torch.randn(nb, PAGE, 1, D_QK, device=dev) / 10).clamp_(-1, 1).bfloat16()
    bt = torch.randperm(nb, device=dev).int().view(b, pages)
    seqlens = torch.full((b,), s_k, dtype=torch.int32, device=dev)
    meta = dk.get_mla_metadata()[0]
    call = lambda: dk.flash_mla_with_kvcache(q, k_cache, bt, seqlens, D_V, meta)  # noqa: E731
    call()                      # plans the schedule (meta filled), compiles, binds the launchers
    call()
    torch.cuda.synchronize()
    if warmup_only:
        print(f"WARM dense h_q={h_q} b={b}", flush=True)
        return None
    kernel = "gluon" if _dec._gluon_ok(q, k_cache, h_q) else "triton"
    fast0 = _fast()
    dh0, dm0, _ = _desc_counts()
    host_us = _submit_us(call, n)
    fast = (_fast() - fast0) / n
    dh1, dm1, desc_states = _desc_counts()
    on = _launch.descriptor_cache_enabled()
    _launch.set_descriptor_cache(not on)
    try:
        call()
        other_us = _submit_us(call, n)
    finally:
        _launch.set_descriptor_cache(on)
    hooked = _launch._hooked
    _launch._hooked = lambda hook: True         # every KernelLauncher takes Triton's own launcher
    try:
        call()
        fast1 = _fast()
        slow_us = _submit_us(call, n // 2)
        assert _fast() == fast1, "forced slow path still launched directly"
    finally:
        _launch._hooked = hooked
    whole_ms = do_bench(call, warmup=10, rep=50, return_mode="median")
    g_us = _time_graph_us(call)
    row = dict(op="mla_dense_decode_host", kernel=kernel, b=b, s_q=1, h_q=h_q, h_kv=1, s_k=s_k, page=PAGE,
               dtype="bf16", parts=int(meta.tile_scheduler_metadata.shape[0]), host_submit_us=host_us,
               slow_launch_host_submit_us=slow_us, whole_call_us=whole_ms * 1e3, graph_replay_us=g_us,
               fast_launches_per_call=fast, desc_cache="on" if on else "off", desc_states=desc_states,
               desc_hits_per_call=(dh1 - dh0) / n, desc_misses_per_call=(dm1 - dm0) / n,
               desc_cache_other_host_submit_us=other_us)
    print(f"HOST dense {kernel:6s} h_q={h_q:3d} b={b:3d} s_k={s_k}: submit {host_us:6.1f} us/call (Triton's launcher: "
          f"{slow_us:6.1f}; desc cache {'off' if on else 'on'}: {other_us:6.1f}), desc hits/misses per call "
          f"{(dh1 - dh0) / n:.1f}/{(dm1 - dm0) / n:.2f} {desc_states}, whole call {whole_ms * 1e3:6.1f} us, "
          f"graph replay "
          f"{'-' if g_us is None else f'{g_us:6.1f}'} us, fast launches/call {fast:.1f}", flush=True)
    del q, k_cache, bt, seqlens
    return row


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    ap.add_argument("--b", type=ints, default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--hq", type=ints, default=[128])
    ap.add_argument("--sk", type=int, default=4096)
    ap.add_argument("--n", type=int, default=200, help="calls per submit timing")
    ap.add_argument("--json", default=None)
    ap.add_argument("--warmup", action="store_true", help="compile only (two calls per case)")
    ap.add_argument("--desc-cache", choices=["on", "off"], default="on",
                    help="TMA descriptor cache of the fast launch path for the main timing")
    args = ap.parse_args(argv)
    _launch.set_descriptor_cache(args.desc_cache == "on")
    if not torch.cuda.is_available():
        print("host_overhead needs a CUDA device")
        return 0
    from triton.testing import do_bench
    prov = provenance()
    print(json.dumps(prov), flush=True)
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(1000 if not args.warmup else 0):     # ~0.2 s of GEMMs: clocks up before the first timing
        x @ x
    del x
    rows = []

    def dump():
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"provenance": prov, "rows": rows}, fh, indent=1)

    for h_q in args.hq:
        for b in args.b:
            try:
                row = dense_host(b, h_q, args.sk, do_bench, n=args.n, warmup_only=args.warmup)
            except Exception as e:  # noqa: BLE001 - one failing shape must not stop the others
                print(f"HOST dense h_q={h_q} b={b}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                torch.cuda.empty_cache()
                continue
            if row is not None:
                rows.append(row)
                dump()
            torch.cuda.empty_cache()
    dump()
    for r in rows:
        print(f"SUMMARY host dense {r['kernel']:6s} h_q={r['h_q']:3d} b={r['b']:3d}: "
              f"submit {r['host_submit_us']:.1f} us (desc cache {r['desc_cache']}; "
              f"other {r['desc_cache_other_host_submit_us']:.1f}) "
              f"(Triton's launcher {r['slow_launch_host_submit_us']:.1f}), whole {r['whole_call_us']:.1f} us, graph "
              f"{r['graph_replay_us'] if r['graph_replay_us'] is None else round(r['graph_replay_us'], 1)} us, "
              f"fast/call {r['fast_launches_per_call']:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
