"""Benchmark: sparse top-k MLA decode over FP8/FP4 KV caches (deepkernels vs the PyTorch reference, same run).

Shapes (FlashMLA's sparse-decode perf grid, spec/mla.md §5.4 / ANCHORS.md): topk=2048 (``--topk``), h_q in
{64, 128}, (b, s_q) in {(64,1), (128,1), (128,2)}, s_k=32768 tokens per request, page_block_size=64; formats
``v32`` (656 B/token, d_qk 576), ``v41`` (528 B/token, d_qk 512), ``v41+fp4`` (528 B main + a 288 B FP4 extra cache
with ``--extra-topk`` = 512 tokens), ``model1`` (584 B, optional). Indices are unique random positions per
(request, query) through a random block table.

Counting (FlashMLA ``lib.count_flop_and_mem_vol_for_decode``, spec §6.2): FLOPs = 2*h_q*N_att*(d_qk + d_v) with
N_att = b*s_q*(topk + extra_topk); bytes = 2*b*s_q*h_q*d_qk + U*token_bytes + 2*b*s_q*h_q*d_v with U the number of
unique valid (cache, index) pairs and token_bytes the format's bytes per token (656 / 584 / 528 / 288; FlashMLA
counts 576 for MODEL1). Timer: triton.testing.do_bench (median ms) of the split-KV kernel + combine (the schedule is
computed once per shape outside the timed region, as FlashMLA's benchmark does); the public op (validation +
allocation + launch) is timed too.

Anchor: the PyTorch reference in the same run -- gather the token records, dequantise in torch (fp8 * scale ->
bf16), bmm QK^T, fp32 softmax, bmm PV (bf16).

``--host``: host cost of the public call instead (``host_overhead``): for b = 1..128 at a small topk (GPU time
small), the host submit time per call (perf_counter over back-to-back calls, no sync), the whole call (do_bench
median), the CUDA-graph replay of the same call (kernels only; median, L2 flushed), the submit time with every
KernelLauncher forced onto Triton's own launcher (``fn[grid](...)``), the same call with the plan
cache emptied before every call (full validation + Triton's own launcher: what every call cost before the cached
host path), and the number of fast (direct CompiledKernel) launches; JSON rows ``op = "mla_sparse_decode_host"``.

Usage:
    python benchmarks/mla_sparse_decode.py [--sweep] [--json out.json] [--fmt v32,v41+fp4] [--hq 64,128]
        [--bsq 64x1,128x1,128x2] [--topk 2048] [--extra-topk 512] [--check]
    python benchmarks/mla_sparse_decode.py --host [--fmt v41,v32] [--hq 128,64] [--host-b 1,2,4,8,16,32,64,128]
        [--host-topk 64] [--json host.json]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import deepkernels as dk  # noqa: E402
import deepkernels.mla.sparse_decode as sd  # noqa: E402
from deepkernels.mla.metadata import compute_schedule  # noqa: E402
from deepkernels.quant.kvcache import KV_FORMATS, dequantize_kv_cache, quantize_kv_cache  # noqa: E402

# Candidate configs (BLOCK_H, BLOCK_N, num_warps, num_stages, parts_per_sm) for h_q in {64, 128}; every one compiles
# for sm90 with no spills inside the token loop (tests/test_mla_sparse_kernels.py::test_compile_sweep_candidates).
CANDIDATES = sd.SPARSE_DECODE_CANDIDATES
PAGE = 64
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TARGET_TFLOPS = 420.0
FLASHMLA_V32 = {(128, 64, 1): 368, (128, 128, 1): 387, (128, 128, 2): 399,
                (64, 64, 1): 227, (64, 128, 1): 304, (64, 128, 2): 319}        # ANCHORS.md, same H200


def provenance():
    sha = os.environ.get("GIT_SHA", "unknown")
    if sha == "unknown":
        try:
            sha = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(__file__) or ".",
                                          stderr=subprocess.DEVNULL).decode().strip()
        except Exception:
            pass
    import triton
    info = {"torch": torch.__version__, "triton": triton.__version__, "git_sha": sha,
            "python": platform.python_version(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sms=p.multi_processor_count, cuda=torch.version.cuda)
        try:
            info["driver"] = subprocess.check_output(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                stderr=subprocess.DEVNULL).decode().strip()
        except Exception:
            pass
    return info


def make_cache(fmt, num_tokens, device, chunk=1 << 19):
    """Quantised cache [num_tokens/PAGE, PAGE, 1, bpt] (the format's default block stride) built in chunks of raw
    page blocks (bounded fp32 temporaries; MODEL1's per-block split layout is copied byte for byte)."""
    f = KV_FORMATS[fmt]
    nb = num_tokens // PAGE
    stride0 = f.default_block_stride(PAGE)
    buf = torch.empty(nb * stride0, dtype=torch.uint8, device=device)
    step = max(chunk // PAGE, 1)
    for b0 in range(0, nb, step):
        b1 = min(nb, b0 + step)
        kv = (torch.randn(b1 - b0, PAGE, 1, f.d_qk, device=device) / 10).clamp_(-1, 1).bfloat16()
        qc = quantize_kv_cache(kv, fmt).view(torch.uint8)
        buf[b0 * stride0:b1 * stride0] = torch.as_strided(qc, ((b1 - b0) * stride0,), (1,), 0)
    return buf.view(torch.float8_e4m3fn).as_strided((nb, PAGE, 1, f.bytes_per_token),
                                                    (stride0, f.bytes_per_token, f.bytes_per_token, 1))


def make_indices(b, s_q, topk, s_k, device):
    """Unique random positions < s_k per (request, query), mapped through a random block table."""
    pages = s_k // PAGE
    bt = torch.randperm(b * pages, device=device).view(b, pages)
    pos = torch.rand(b * s_q, s_k, device=device).argsort(dim=1)[:, :topk].view(b, s_q, topk)
    phys = torch.gather(bt[:, None, :].expand(b, s_q, pages), 2, pos // PAGE) * PAGE + pos % PAGE
    return phys.int().contiguous()


def kernel_case(fmt, b, s_q, h_q, topk=2048, s_k=8192, device="cuda"):
    """Inputs and schedule of one no-extra-cache sparse decode case for the kernel-level A/B scripts
    (``sparse_decode_ws_profile.py``, ``sparse_decode_ws2.py``): the public op's config, SM parts and schedule, plus
    the FLOP count (FlashMLA counting), the CTA count and the (CTA, 64-token block) work items."""
    from types import SimpleNamespace
    d_qk = 576 if fmt == "v32" else 512
    cache = make_cache(fmt, b * s_k, device)
    q = torch.randn(b, s_q, h_q, d_qk, device=device).clamp_(-1, 1).bfloat16()
    ind = make_indices(b, s_q, topk, s_k, device)
    parts = sd._num_sm_parts(q.device, s_q, h_q, sd.sparse_decode_config(h_q, fmt))
    sched, ns = compute_schedule(sd._token_counts(b, topk, None, 0, None, False, q.device), parts)
    return SimpleNamespace(fmt=fmt, b=b, s_q=s_q, h_q=h_q, topk=topk, s_k=s_k, d_qk=d_qk, cache=cache, q=q, ind=ind,
                           sched=sched, ns=ns, parts=parts, scale=d_qk ** -0.5,
                           flop=2 * h_q * b * s_q * topk * (d_qk + 512), ctas=parts * s_q * (h_q // 64),
                           blocks=b * s_q * (h_q // 64) * (topk // 64))


def warm_clocks(n=200):
    """A few hundred bf16 matmuls so the GPU clocks are up before the first timing."""
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(n):
        x @ x
    del x


def torch_reference(q, caches, scale):
    """Gather + dequant (torch) + bmm. caches: list of (cache, fmt, indices, full) where ``full`` is a pre-dequantised
    bf16 copy used only for MODEL1 (its per-block split layout cannot be gathered per token). Returns
    out [b, s_q, h_q, 512]."""
    b, s_q, h_q, d = q.shape
    ks = []
    for cache, fmt, ind, full in caches:
        if full is not None:
            k = full[ind.reshape(-1).long()]
        else:
            flat = cache.view(cache.shape[0] * PAGE, 1, 1, cache.shape[-1])
            k = dequantize_kv_cache(flat[ind.reshape(-1).long()], fmt)
        ks.append(k.view(b * s_q, ind.shape[-1], -1))
    k = torch.cat(ks, dim=1)
    qq = q.reshape(b * s_q, h_q, d)
    s = torch.bmm(qq, k.transpose(1, 2)).float() * scale
    p = torch.softmax(s, -1).to(q.dtype)
    return torch.bmm(p, k[..., :512]).view(b, s_q, h_q, 512)


def bench_case(fmt_spec, h_q, b, s_q, topk, xtopk, s_k, sweep, check, do_bench):
    fmt, _, xfmt = fmt_spec.partition("+")
    xfmt = xfmt or None
    dev = DEVICE
    f = KV_FORMATS[fmt]
    d = f.d_qk
    q = (torch.randn(b, s_q, h_q, d, device=dev)).clamp_(-1, 1).bfloat16()
    cache = make_cache(fmt, b * s_k, dev)
    ind = make_indices(b, s_q, topk, s_k, dev)
    full = lambda c, fm: (dequantize_kv_cache(c, fm).view(-1, KV_FORMATS[fm].d_qk)  # noqa: E731
                          if fm == "model1" else None)
    caches = [(cache, fmt, ind, full(cache, fmt))]
    xcache = xind = None
    if xfmt:
        xs_k = max(4 * xtopk, 4096)
        xcache = make_cache(xfmt, b * xs_k, dev)
        xind = make_indices(b, s_q, xtopk, xs_k, dev)
        caches.append((xcache, xfmt, xind, full(xcache, xfmt)))
    scale = d ** -0.5
    n_att = b * s_q * (topk + (xtopk if xfmt else 0))
    flop = 2 * h_q * n_att * (d + 512)
    uniq = sum(int(torch.unique(i).numel()) * (576 if fm == "model1" else KV_FORMATS[fm].bytes_per_token)
               for _, fm, i, _ in caches)
    byts = 2 * b * s_q * h_q * d + uniq + 2 * b * s_q * h_q * 512
    ref_ms, o_ref = float("nan"), None
    try:
        o_ref = torch_reference(q, caches, scale)
        ref_ms = do_bench(lambda: torch_reference(q, caches, scale), warmup=3, rep=20)
    except Exception as e:  # noqa: BLE001 - an OOM in the anchor must not stop the run
        print(f"  reference failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
    cands = CANDIDATES if sweep else [sd.sparse_decode_config(h_q, fmt)]
    results = []
    for cfg in cands:
        cfg = (cfg[0], sd._block_n(cfg[1], fmt)) + tuple(cfg[2:])
        try:
            parts = sd._num_sm_parts(q.device, s_q, h_q, cfg)
            counts = sd._token_counts(b, topk, None, xtopk, None, xfmt is not None, q.device)
            sched, ns = compute_schedule(counts, parts)
            out = torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16, device=dev)
            lse = torch.empty(b, s_q, h_q, dtype=torch.float32, device=dev)
            fn = lambda: sd._launch_sparse_decode(out, lse, q, cache, ind, sched, ns, scale, fmt,  # noqa: E731
                                                  None, xcache, xind, xfmt, None, None, cfg)
            fn()
            _sync()
            err = float("nan") if o_ref is None else float((out.float() - o_ref.float()).abs().max())
            ms = do_bench(fn, warmup=5, rep=30)
        except Exception as e:  # noqa: BLE001
            print(f"  config {cfg} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        results.append(dict(config=list(cfg), parts=parts, ms=ms, tflops=flop / ms / 1e9, gbps=byts / ms / 1e6,
                            max_abs_err_vs_torch=err, num_splits=int(ns[-1])))
    if not results:
        return None, []
    best = min(results, key=lambda r: r["ms"])
    meta = dk.get_mla_metadata()[0]
    op = lambda: dk.flash_mla_with_kvcache(q, cache, None, None, 512, meta, softmax_scale=scale,  # noqa: E731
                                           is_fp8_kvcache=True, indices=ind, extra_k_cache=xcache,
                                           extra_indices_in_kvcache=xind)
    op_ms = float("nan")
    try:
        op()
        op_ms = do_bench(op, warmup=3, rep=20)
    except Exception as e:  # noqa: BLE001
        print(f"  public op failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
    sd.set_sparse_decode_batch_invariant(True)
    try:
        bi_ms = do_bench(op, warmup=3, rep=20)
    except Exception:  # noqa: BLE001
        bi_ms = float("nan")
    finally:
        sd.set_sparse_decode_batch_invariant(False)
    row = dict(op="mla_sparse_decode", fmt=fmt_spec, b=b, s_q=s_q, h_q=h_q, topk=topk,
               extra_topk=xtopk if xfmt else 0, s_k=s_k, page_block_size=PAGE, provider="deepkernels", flop=flop,
               bytes=byts, **best, op_ms=op_ms, batch_invariant_ms=bi_ms,
               batch_invariant_tflops=flop / bi_ms / 1e9 if bi_ms == bi_ms else None,
               torch_ms=ref_ms, torch_tflops=flop / ref_ms / 1e9, speedup_vs_torch=ref_ms / best["ms"],
               target_tflops=TARGET_TFLOPS if h_q == 128 else None,
               flashmla_v32_tflops=FLASHMLA_V32.get((h_q, b, s_q)) if fmt == "v32" and topk == 2048 else None)
    if check and o_ref is not None:
        row["check_max_abs_err"] = best["max_abs_err_vs_torch"]
    del q, cache, ind, xcache, xind, o_ref
    _empty_cache()
    return row, results


def _launcher_caches():
    """The sparse decode path's KernelLauncher caches: Triton split-KV kernel, Gluon split-KV kernels (single-partition
    and warp-specialised, V3.2), combine."""
    from deepkernels.mla import _gluon_sparse_decode as _gsd
    from deepkernels.mla import _gluon_sparse_decode_ws as _gsdw
    from deepkernels.mla import combine as _comb
    return sd._LAUNCHERS, _gsd._LAUNCHERS, _gsdw._LAUNCHERS, _comb._LAUNCHERS


def _fast_launches():
    return sum(x.fast_calls for d in _launcher_caches() for x in d.values())


def host_overhead(fmt_spec, h_q, b, topk, xtopk, do_bench, graph=True, n=200, warmup_only=False):
    """Host cost of one sparse decode call at a small topk (see the module docstring). Returns a JSON row
    (``warmup_only``: two calls, no timing, None: fills Triton's disk cache for a later timed run)."""
    fmt, _, xfmt = fmt_spec.partition("+")
    xfmt = xfmt or None
    dev = DEVICE
    d = KV_FORMATS[fmt].d_qk
    s_k = max(4 * topk, 256)
    q = torch.randn(b, 1, h_q, d, device=dev).clamp_(-1, 1).bfloat16()
    cache = make_cache(fmt, b * s_k, dev)
    ind = make_indices(b, 1, topk, s_k, dev)
    tl_ = torch.full((b,), topk, dtype=torch.int32, device=dev)
    xcache = xind = None
    if xfmt:
        xcache = make_cache(xfmt, b * max(4 * xtopk, 256), dev)
        xind = make_indices(b, 1, xtopk, max(4 * xtopk, 256), dev)
    meta = dk.get_mla_metadata()[0]
    call = lambda: dk.flash_mla_with_kvcache(q, cache, None, None, 512, meta, is_fp8_kvcache=True,  # noqa: E731
                                             indices=ind, topk_length=tl_, extra_k_cache=xcache,
                                             extra_indices_in_kvcache=xind)
    call()                      # plans the schedule (meta filled), compiles, binds the launchers
    call()
    _sync()
    if warmup_only:
        print(f"WARM {fmt_spec} h_q={h_q} b={b}", flush=True)
        return None
    fast0 = _fast_launches()
    t0 = time.perf_counter()
    for _ in range(n):
        call()
    t1 = time.perf_counter()
    _sync()
    host_us = (t1 - t0) / n * 1e6
    fast = _fast_launches() - fast0
    from deepkernels import _launch
    hooked = _launch._hooked
    _launch._hooked = lambda hook: True     # every KernelLauncher on Triton's own launcher (as with a launch hook)
    try:
        call()
        _sync()
        t0 = time.perf_counter()
        for _ in range(n // 4):
            call()
        t1 = time.perf_counter()
        _sync()
    finally:
        _launch._hooked = hooked
    slow_host_us = (t1 - t0) / (n // 4) * 1e6

    def nocache():
        sd._PLANS.clear()
        return call()
    nocache()
    _sync()
    t0 = time.perf_counter()
    for _ in range(n // 4):
        nocache()
    t1 = time.perf_counter()
    _sync()
    nocache_host_us = (t1 - t0) / (n // 4) * 1e6
    for d in _launcher_caches()[:2]:
        d.clear()               # one split-KV KernelLauncher per emptied plan: drop them
    whole_ms = do_bench(call, warmup=10, rep=50)
    graph_ms = None
    if graph and torch.cuda.is_available():
        from deepkernels.bench.runner import _time_graph_us     # median replay, L2 flushed; None if not capturable
        g_us = _time_graph_us(call)
        graph_ms = None if g_us is None else g_us / 1e3
    row = dict(op="mla_sparse_decode_host", fmt=fmt_spec, b=b, s_q=1, h_q=h_q, topk=topk,
               extra_topk=xtopk if xfmt else 0, num_splits=int(meta.num_splits[-1]),
               parts=int(meta.tile_scheduler_metadata.shape[0]), host_submit_us=host_us,
               nocache_host_submit_us=nocache_host_us, slow_launch_host_submit_us=slow_host_us,
               whole_call_us=whole_ms * 1e3,
               graph_replay_us=None if graph_ms is None else graph_ms * 1e3,
               fast_launches_per_call=fast / n, plans=len(sd._PLANS))
    print(f"HOST {fmt_spec:8s} h_q={h_q:3d} b={b:3d} topk={topk}: submit {host_us:6.1f} us/call (Triton's launcher: "
          f"{slow_host_us:6.1f}; plan cache emptied every call: {nocache_host_us:6.1f}), whole call "
          f"{whole_ms*1e3:6.1f} us, graph replay "
          f"{'-' if graph_ms is None else f'{graph_ms*1e3:6.1f}'} us, fast launches/call {fast / n:.1f}", flush=True)
    del q, cache, ind, xcache, xind
    return row


def _warm_gpu():
    if torch.cuda.is_available():
        x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        for _ in range(1000):           # ~0.2 s of GEMMs: clocks up before the first timing
            x @ x
        _sync()


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _empty_cache():
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _cpu_bench(fn, warmup=1, rep=1):
    """Stand-in for do_bench in --smoke runs (CPU, TRITON_INTERPRET=1): wall time of one call, in ms."""
    fn()
    t = time.perf_counter()
    fn()
    return (time.perf_counter() - t) * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--check", action="store_true", help="record the max abs error against the torch reference")
    ap.add_argument("--fmt", default="v32,v41+fp4,v41")
    ap.add_argument("--hq", type=lambda s: [int(x) for x in s.split(",")], default=[128, 64])
    ap.add_argument("--bsq", default="64x1,128x1,128x2")
    ap.add_argument("--topk", type=lambda s: [int(x) for x in s.split(",")], default=[2048])
    ap.add_argument("--extra-topk", type=int, default=512)
    ap.add_argument("--s-k", type=int, default=32768)
    ap.add_argument("--json", default=None)
    ap.add_argument("--smoke", action="store_true",
                    help="CPU check of the script itself (needs TRITON_INTERPRET=1): tiny shapes, wall-clock timer")
    ap.add_argument("--host", action="store_true", help="host cost per call vs CUDA-graph replay (small topk)")
    ap.add_argument("--host-b", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2, 4, 8, 16, 32, 64, 128])
    ap.add_argument("--host-topk", type=int, default=64)
    ap.add_argument("--host-warmup", action="store_true", help="with --host: compile only (two calls per case)")
    args = ap.parse_args(argv)
    if args.smoke:
        args.hq, args.bsq, args.topk, args.extra_topk, args.s_k = [64], "2x1", [128], 64, 256
        args.host_b = [1, 2]
        do_bench = _cpu_bench
    elif not torch.cuda.is_available():
        print("mla_sparse_decode benchmark needs a CUDA device (or --smoke with TRITON_INTERPRET=1)")
        return 0
    else:
        from triton.testing import do_bench
    prov = provenance()
    print(json.dumps(prov), flush=True)
    rows, sweep = [], []

    def dump():
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"provenance": prov, "rows": rows, "sweep": sweep}, fh, indent=1)

    if args.host:
        _warm_gpu()
        if not args.smoke:             # medians, like the graph replay (deepkernels.bench.runner._time_graph_us)
            tdb = do_bench
            do_bench = lambda fn, warmup, rep: tdb(fn, warmup=warmup, rep=rep, return_mode="median")  # noqa: E731
        for fmt in args.fmt.split(","):
            for h_q in args.hq:
                for b in args.host_b:
                    try:
                        row = host_overhead(fmt, h_q, b, args.host_topk, min(args.extra_topk, args.host_topk),
                                            do_bench, n=4 if args.smoke else 200, warmup_only=args.host_warmup)
                    except Exception as e:  # noqa: BLE001 - one failing shape must not stop the others
                        print(f"HOST {fmt} h_q={h_q} b={b}: FAILED {type(e).__name__}: {str(e)[:200]}", flush=True)
                        _empty_cache()
                        continue
                    if row is not None:
                        rows.append(row)
                        dump()
        dump()
        for r in rows:
            print(f"SUMMARY host {r['fmt']:8s} h_q={r['h_q']:3d} b={r['b']:3d}: submit {r['host_submit_us']:.1f} us "
                  f"(Triton's launcher {r['slow_launch_host_submit_us']:.1f}, no plan cache "
                  f"{r['nocache_host_submit_us']:.1f}), fast/call {r['fast_launches_per_call']:.1f}, "
                  f"whole {r['whole_call_us']:.1f} us, graph "
                  f"{r['graph_replay_us'] if r['graph_replay_us'] is None else round(r['graph_replay_us'], 1)} us")
        return 0
    for fmt in args.fmt.split(","):
        for topk in args.topk:
            for h_q in args.hq:
                for bs in args.bsq.split(","):
                    b, s_q = (int(x) for x in bs.split("x"))
                    t0 = time.time()
                    try:
                        row, res = bench_case(fmt, h_q, b, s_q, topk, args.extra_topk, args.s_k, args.sweep,
                                              args.check, do_bench)
                    except Exception as e:  # noqa: BLE001 - one failing shape must not stop the others
                        print(f"{fmt} h_q={h_q} b={b} s_q={s_q}: FAILED {type(e).__name__}: {str(e)[:200]}",
                              flush=True)
                        _empty_cache()
                        continue
                    for r in res:
                        sweep.append(dict(fmt=fmt, h_q=h_q, b=b, s_q=s_q, topk=topk, **r))
                    if row is None:
                        continue
                    rows.append(row)
                    dump()
                    print(f"{fmt:8s} topk={topk:5d} h_q={h_q:3d} b={b:3d} s_q={s_q}: {row['ms']*1e3:8.1f} us "
                          f"{row['tflops']:6.1f} TFLOPS {row['gbps']:7.1f} GB/s cfg={tuple(row['config'])} "
                          f"splits={row['num_splits']} | op {row['op_ms']*1e3:8.1f} us | batch-inv "
                          f"{row['batch_invariant_ms']*1e3:8.1f} us | torch {row['torch_ms']*1e3:8.1f} us "
                          f"({row['speedup_vs_torch']:.2f}x) err {row['max_abs_err_vs_torch']:.1e} "
                          f"[{time.time() - t0:.0f}s]", flush=True)
    dump()
    print("\nSUMMARY fmt      topk  h_q   b s_q      us  TFLOPS    GB/s  torchTF x_torch  vsTarget FlashMLA  config")
    for r in rows:
        tgt = f"{r['tflops'] / TARGET_TFLOPS:7.2f}x" if r["h_q"] == 128 else "      - "
        fm = f"{r['flashmla_v32_tflops']:8d}" if r.get("flashmla_v32_tflops") else "       -"
        print(f"SUMMARY {r['fmt']:8s} {r['topk']:5d} {r['h_q']:4d} {r['b']:3d} {r['s_q']:3d} {r['ms']*1e3:8.1f} "
              f"{r['tflops']:7.1f} {r['gbps']:7.1f} {r['torch_tflops']:8.1f} {r['speedup_vs_torch']:7.2f} {tgt} {fm}"
              f"  {tuple(r['config'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
