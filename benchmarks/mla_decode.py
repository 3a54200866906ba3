"""Benchmark: dense paged MLA decode (deepkernels vs the PyTorch MQA reference, same run).

Shapes (FlashMLA's dense-decode perf grid): b=128, s_q in {1, 2} (causal), h_kv=1, d_qk=576, d_v=512,
page_block_size=64, h_q in {16, 32, 64, 128}, varlen seqlens ~ max(N(s_k, s_k/2), s_q) for s_k in
{4096, 8192, 16384, 32768}. FLOPs = 2*s_q*sum(seqlen)*h_q*(d_qk+d_v); bytes = (sum(seqlen)*h_kv*d_qk +
b*s_q*h_q*(d_qk+d_v))*2 (FlashMLA bench_flash_mla.py counting, spec/mla.md §6.2). Timer: triton.testing.do_bench
(median ms); the scheduler is computed once per shape outside the timed region, as FlashMLA's benchmark does.

Usage:
    python benchmarks/mla_decode.py [--sweep] [--json out.json] [--hq 16,32] [--sq 1,2] [--sk 4096,32768]
``--sweep`` times every candidate config of the query-row bucket and reports the best (JSON keeps all).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

import deepkernels.mla.decode as dec  # noqa: E402
from deepkernels.mla.metadata import compute_schedule  # noqa: E402

# Candidate configs per query-row bucket (deepkernels.mla.decode._rows_bucket: 16 / 32 / 64 / 128 rows per kv
# head): (BLOCK_M, BLOCK_N, num_warps, num_stages, parts_per_sm[, flags]); flags "p" one block-table load per
# tile, "v" output columns split over 2 programs, "l" lazy rescale (see decode._CONFIGS). The first entry of each
# list is the previous production config (baseline). All compile for sm90 within 227 KB smem without spills.
CANDIDATES = {
    16: [(16, 64, 4, 3, 2, "p"), (16, 32, 4, 3, 2, "p"), (16, 64, 4, 4, 2, "p"), (16, 32, 4, 3, 4, "p"),
         (16, 64, 4, 3, 3, "p")],
    32: [(32, 32, 4, 3, 2, "p"), (32, 64, 4, 3, 2, "p"), (32, 32, 4, 3, 2)],
    64: [(64, 64, 8, 2, 1, "p"), (64, 64, 8, 2, 1), (32, 32, 4, 3, 2, "p")],
    128: [(64, 64, 8, 2, 1, "p"), (64, 64, 8, 2, 1), (128, 32, 8, 2, 1, "pv"), (128, 32, 8, 2, 1, "pvl")],
}
# v2 sweep (benchmarks/results/mla_decode-h200-v2-2026-11-29.json) dropped from the list: every candidate at
# >= 25 % behind its bucket's best at both s_k — (16,16,..) 3/4-6 CTAs, (16,32,4,3,3,p), (32,16,4,4,4,p),
# (32,32,4,3,3,p), all 4-warp "pv" (2x MMA work at 4 warps), "pl" (the block-uniform branch costs more than the
# skipped rescale). The first entry of each list is the production config (decode._CONFIGS).
ERR_LIMIT = 4e-3   # max |out - torch bf16 MQA reference|; larger marks a candidate wrong (never picked as best)
D_QK, D_V, PAGE = 576, 512, 64


def bucket(rows):
    return dec._rows_bucket(rows)


def make_inputs(b, s_q, h_q, h_kv, s_k, seed=0, device="cuda", dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    seqlens = torch.clamp(torch.normal(float(s_k), s_k / 2, (b,), generator=g), min=s_q).int()
    max_len = int(seqlens.max())
    max_pages = -(-max_len // PAGE)
    nb = b * max_pages
    bt = torch.randperm(nb, generator=g).reshape(b, max_pages).int()
    k_cache = (torch.randn(nb, PAGE, h_kv, D_QK, device=device, dtype=dtype) / 10).clamp_(-1, 1)
    q = (torch.randn(b, s_q, h_q, D_QK, device=device, dtype=dtype) / 10).clamp_(-1, 1)
    return q, k_cache, bt.to(device), seqlens.to(device)


def torch_reference_mqa(q, k_pad, mask, scale):
    """MQA form (h_kv=1): q [b, s_q*h_q, d] @ K^T [b, d, L] -> masked softmax -> @ V; BF16 bmm, fp32 softmax."""
    b, s_q, h_q, d = q.shape
    qq = q.reshape(b, s_q * h_q, d)
    s = torch.bmm(qq, k_pad.transpose(1, 2)).float() * scale
    s.masked_fill_(~mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    p = torch.softmax(s, -1).to(q.dtype)
    o = torch.bmm(p, k_pad[..., :D_V])
    return o.reshape(b, s_q, h_q, D_V), lse


def pad_kv(k_cache, bt, seqlens, s_q, h_q, causal):
    b = bt.shape[0]
    L = int(seqlens.max())
    pages = -(-L // PAGE)
    k_pad = k_cache[bt[:, :pages].long()].reshape(b, pages * PAGE, -1)[:, :L].contiguous()   # h_kv == 1
    pos = torch.arange(L, device=k_cache.device)
    sidx = torch.arange(s_q, device=k_cache.device).repeat_interleave(h_q)
    lim = seqlens[:, None] - ((s_q - 1 - sidx)[None, :] if causal else 0)
    return k_pad, pos[None, None, :] < lim[:, :, None]


def provenance():
    sha = os.environ.get("GIT_SHA") or "unknown"   # the device copy of the tree has no .git: the script passes it
    try:
        if sha == "unknown":
            sha = subprocess.check_output(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(__file__) or ".",
                                          stderr=subprocess.DEVNULL).decode().strip()
    except Exception:
        pass
    import triton
    info = {"torch": torch.__version__, "triton": triton.__version__, "git_sha": sha, "python": platform.python_version(),
            "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info.update(gpu=p.name, sms=p.multi_processor_count, cuda=torch.version.cuda)
        try:
            info["driver"] = subprocess.check_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                                     stderr=subprocess.DEVNULL).decode().strip()
        except Exception:
            pass
    return info


def run(args, prov=None):
    from triton.testing import do_bench
    rows_out, sweep_out = [], []

    def dump():
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"provenance": prov, "rows": rows_out, "sweep": sweep_out}, f, indent=1)

    for s_q in args.sq:
        for h_q in args.hq:
            for s_k in args.sk:
                causal = s_q > 1
                q, k_cache, bt, seqlens = make_inputs(args.b, s_q, h_q, 1, s_k)
                tot = int(seqlens.sum())
                flop = 2 * s_q * tot * h_q * (D_QK + D_V)
                byts = (tot * D_QK + args.b * s_q * h_q * (D_QK + D_V)) * 2
                scale = D_QK ** -0.5
                rows = s_q * h_q
                cands = CANDIDATES[bucket(rows)] if args.sweep else [dec._pick_config(rows)]
                # reference (also the correctness anchor for every candidate)
                ref_ms, o_ref = float("nan"), None
                try:
                    k_pad, mask = pad_kv(k_cache, bt, seqlens, s_q, h_q, causal)
                    o_ref, _ = torch_reference_mqa(q, k_pad, mask, scale)
                    ref_ms = do_bench(lambda: torch_reference_mqa(q, k_pad, mask, scale), warmup=5, rep=30)
                    del k_pad, mask
                except Exception as e:  # noqa: BLE001 - an OOM in the anchor must not stop the sweep
                    print(f"  reference failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
                best, base_ms = None, float("nan")
                for cfg in cands:
                    parts = dec._num_sm_parts(q.device, rows, 1, cfg)
                    sched, ns = compute_schedule(seqlens, parts)
                    fn = lambda: dec._dense_launch(q, k_cache, bt, seqlens, sched, ns, scale, causal, cfg)  # noqa: E731
                    try:
                        o, lse_o = fn()
                        err = float("nan") if o_ref is None else float((o.float() - o_ref.float()).abs().max())
                        bad = bool(torch.isnan(o).any() or torch.isnan(lse_o).any()) or not (err <= ERR_LIMIT)
                        ms = do_bench(fn, warmup=3, rep=args.rep)
                    except Exception as e:  # noqa: BLE001
                        print(f"  config {cfg} failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
                        sweep_out.append(dict(s_q=s_q, h_q=h_q, s_k=s_k, config=list(cfg), failed=True,
                                              error=f"{type(e).__name__}: {str(e)[:300]}"))
                        continue
                    rec = dict(op="mla_decode_dense", b=args.b, s_q=s_q, h_q=h_q, h_kv=1, s_k=s_k, causal=causal,
                               config=list(cfg), parts=parts, ms=ms, tflops=flop / ms / 1e9, gbps=byts / ms / 1e6,
                               max_abs_err_vs_torch=err, wrong=bad)
                    sweep_out.append(rec)
                    if cfg == cands[0]:
                        base_ms = ms
                    print(f"    {str(tuple(cfg)):28s} parts {parts:4d} {ms*1e3:8.1f} us {rec['tflops']:6.1f} TF "
                          f"{rec['gbps']:7.1f} GB/s err {err:.1e}{'  WRONG' if bad else ''}", flush=True)
                    if not bad and (best is None or ms < best["ms"]):
                        best = rec
                if best is None:
                    continue
                sched_ms = do_bench(lambda: compute_schedule(seqlens, best["parts"]), warmup=5, rep=20)
                row = dict(best, provider="deepkernels", torch_ms=ref_ms, torch_tflops=flop / ref_ms / 1e9,
                           speedup_vs_torch=ref_ms / best["ms"], scheduler_ms=sched_ms,
                           baseline_config=list(cands[0]), baseline_ms=base_ms, speedup_vs_baseline=base_ms / best["ms"])
                rows_out.append(row)
                dump()
                print(f"s_q={s_q} h_q={h_q:3d} s_k={s_k:5d}: {best['ms']*1e3:8.1f} us  {best['tflops']:6.1f} TFLOPS "
                      f"{best['gbps']:7.1f} GB/s  cfg={tuple(best['config'])}  torch {ref_ms*1e3:8.1f} us "
                      f"({row['speedup_vs_torch']:.2f}x)  err {best['max_abs_err_vs_torch']:.1e}  "
                      f"sched {sched_ms*1e3:.1f} us  x{row['speedup_vs_baseline']:.2f} vs {tuple(cands[0])}", flush=True)
                del q, k_cache, bt, seqlens, o_ref
                torch.cuda.empty_cache()
    return rows_out, sweep_out


def overhead(args):
    """Host cost of one decode step on a tiny shape (GPU time negligible): whole public call (do_bench median),
    CUDA-graph replay of the same call, host-side submit time per call (perf_counter over back-to-back calls), and
    the scheduler alone (device time, median; host submit). The GPU is warmed up first and the (h_q) list is run
    twice; the second round is reported (the v2 run measured h_q=128 first, on a cold GPU/CPU: 41 us scheduler
    vs 9 us for the same kernel in every later measurement)."""
    import deepkernels as dk
    from deepkernels.mla import decode as _dec
    from triton.testing import do_bench
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(1000):               # ~0.2 s of GEMMs: clocks up before the first timing
        x @ x
    torch.cuda.synchronize()
    out = []
    for rnd in (0, 1):
        for h_q, s_q in ((128, 1), (16, 1)):
            q, k_cache, bt, seqlens = make_inputs(1, s_q, h_q, 1, 256)
            meta, _ = dk.get_mla_metadata()
            call = lambda: dk.flash_mla_with_kvcache(q, k_cache, bt, seqlens, D_V, meta)  # noqa: E731
            call()
            torch.cuda.synchronize()
            n = 200
            t0 = time.perf_counter()
            for _ in range(n):
                call()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            host_us = (t1 - t0) / n * 1e6
            whole_ms = do_bench(call, warmup=10, rep=50, return_mode="median")
            meta_cold, _ = dk.get_mla_metadata()
            cold = lambda: dk.flash_mla_with_kvcache(q, k_cache, bt, seqlens, D_V, meta_cold)  # noqa: E731
            cold()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                call()
            g.replay()
            graph_ms = do_bench(g.replay, warmup=10, rep=50, return_mode="median")
            parts = dec._num_sm_parts(q.device, s_q * h_q, 1)
            sched = lambda: compute_schedule(seqlens, parts)  # noqa: E731
            sched_ms = do_bench(sched, warmup=5, rep=30, return_mode="median")
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(n):
                sched()
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            sched_host_us = (t1 - t0) / n * 1e6
            from deepkernels.mla import _gluon_dense_decode as _gdd     # the Gluon split-KV kernel's launchers
            fast = sum(l.fast_calls for c in (_dec._LAUNCHERS, _gdd._LAUNCHERS) for l in c.values())
            rec = dict(op="mla_decode_overhead", round=rnd, b=1, s_q=s_q, h_q=h_q, s_k=256, parts=parts,
                       host_submit_us=host_us, whole_call_us=whole_ms * 1e3, graph_replay_us=graph_ms * 1e3,
                       scheduler_us=sched_ms * 1e3, scheduler_host_us=sched_host_us, fast_launches=fast)
            print(f"OVERHEAD round {rnd} h_q={h_q} s_q={s_q}: host submit {host_us:.1f} us/call, whole call "
                  f"{whole_ms*1e3:.1f} us, graph replay {graph_ms*1e3:.1f} us, scheduler {sched_ms*1e3:.1f} us "
                  f"(host {sched_host_us:.1f} us, parts {parts}), fast launches so far {fast}", flush=True)
            if rnd == 1:
                out.append(rec)
    return out


def compile_only(args):
    """Compile (by launching once on a tiny input of the same specialisation) every candidate of this shard;
    fills Triton's disk cache so the timed sweep does not pay compile time. Shard ``i/n`` of the (s_q, h_q, cfg)
    list."""
    i, n = (int(x) for x in args.shard.split("/"))
    jobs = []
    for s_q in args.sq:
        for h_q in args.hq:
            rows = s_q * h_q
            for cfg in (CANDIDATES[bucket(rows)] if args.sweep else [dec._pick_config(rows)]):
                key = (s_q > 1, tuple(cfg[:4]), cfg[5] if len(cfg) > 5 else "")
                if key not in [j[0] for j in jobs]:
                    jobs.append((key, s_q, h_q, cfg))
    for idx, (_, s_q, h_q, cfg) in enumerate(jobs):
        if idx % n != i:
            continue
        t0 = time.time()
        try:
            q, k_cache, bt, seqlens = make_inputs(4, s_q, h_q, 1, 300)
            sched, ns = compute_schedule(seqlens, dec._num_sm_parts(q.device, s_q * h_q, 1, cfg))
            dec._dense_launch(q, k_cache, bt, seqlens, sched, ns, D_QK ** -0.5, s_q > 1, cfg)
            torch.cuda.synchronize()
            print(f"compiled s_q={s_q} h_q={h_q} {cfg} in {time.time() - t0:.1f} s", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"compile failed s_q={s_q} h_q={h_q} {cfg}: {type(e).__name__}: {str(e)[:200]}", flush=True)
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--b", type=int, default=128)
    ap.add_argument("--hq", type=lambda s: [int(x) for x in s.split(",")], default=[128, 16, 32, 64])
    ap.add_argument("--sq", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    ap.add_argument("--sk", type=lambda s: [int(x) for x in s.split(",")], default=[4096, 8192, 16384, 32768])
    ap.add_argument("--json", default=None)
    ap.add_argument("--rep", type=int, default=30, help="do_bench rep (ms) per candidate")
    ap.add_argument("--compile-only", action="store_true", help="only compile the candidates (see --shard)")
    ap.add_argument("--shard", default="0/1", help="i/n: this process compiles every n-th candidate from i")
    ap.add_argument("--overhead", action="store_true", help="also time host overhead / CUDA-graph replay")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("mla_decode benchmark needs a CUDA device")
        return 0
    if args.compile_only:
        return compile_only(args)
    prov = provenance()
    print(json.dumps(prov), flush=True)
    over = []
    if args.overhead:
        try:
            over = overhead(args)
        except Exception as e:  # noqa: BLE001
            print(f"overhead timing failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
        prov = dict(prov, overhead=over)
    rows, sweep = run(args, prov)
    for r in over:
        print(f"SUMMARY  overhead h_q={r['h_q']} s_q={r['s_q']}: host {r['host_submit_us']:.1f} us, whole "
              f"{r['whole_call_us']:.1f} us, graph {r['graph_replay_us']:.1f} us, sched {r['scheduler_us']:.1f} us "
              f"(host {r['scheduler_host_us']:.1f} us), fast launches {r['fast_launches']}")
    print("\nSUMMARY  s_q h_q  s_k    us      TFLOPS  GB/s    torchTF  x_torch  x_base  config")
    for r in rows:
        print(f"SUMMARY  {r['s_q']:3d} {r['h_q']:3d} {r['s_k']:5d} {r['ms']*1e3:8.1f} {r['tflops']:7.1f} "
              f"{r['gbps']:7.1f} {r['torch_tflops']:7.1f} {r['speedup_vs_torch']:6.2f} "
              f"{r.get('speedup_vs_baseline', float('nan')):6.2f}  {tuple(r['config'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
