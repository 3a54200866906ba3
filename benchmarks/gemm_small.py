"""Small-M Gluon FP8 GEMM (``deepkernels.gemm._gluon_fp8_small``, session 20, not dispatched) vs the dispatched
``dk.fp8_gemm_nt`` (Triton table at M <= 128) vs cuBLAS blockwise (``torch._scaled_mm``, 1x128 MN-major sfa x 128x128
sfb, as benchmarks/gemm_gluon.py calls it; refuses N % 128 != 0), at the issue-#3 shapes M in {64, 128} x the six
DeepSeek-V3 (N, K).

Variants per shape (each checked once before timing: NaN-poisoned D, calc_diff < 1e-3 against the dequantised FP32
product, no NaN left; a variant failing its check is recorded and not timed):
  dispatched, dispatched_aa   the public op twice (A/A control: its paired ratio is the noise floor)
  small_auto                  launch_fp8_gemm_small with pick_config (fixup split-K)
  small_auto_reduce           the same split with the separate reduce kernel (only when the pick splits K)
  small_sa1                   small_auto with the scales-ahead K loop (``--no-sa`` drops it: at BLOCK_N 64 one
                              warpgroup's serial chain per K block -- scale loads, wgmma, promotion -- is close to
                              the ~500 cycles in which an 8 KB B stage arrives, so the early scale loads may count)
  small_twin                  the dispatched table config's BLOCK_N and split (when it differs from the pick)
  small_alt                   the other BLOCK_N at its best modelled split (when it differs)
  small_fill                  the best wave fill over BLOCK_N x splits <= 8 of >= 4 K blocks (when it differs)
  small_split2x               the pick with twice the splits (when the K blocks allow it)
  cublas                      torch._scaled_mm blockwise (N % 128 == 0 only; writes a fresh tensor)
Timing: R rotated rounds (``--rounds``, default 5; round r starts at variant r mod n); per round and variant one
CUDA-graph replay time (primary: a graph holding one call, replayed under ``triton.testing.do_bench`` with its L2
flush, as ``deepkernels bench`` times graphs) and one whole-call time (do_bench of the Python call). Per variant:
median over rounds, GB/s (bytes = A + B + D + scales, as ``deepkernels bench`` counts them), and the median over
rounds of the PAIRED ratio t_variant / t_dispatched of the same round (graph and call; < 1 faster). SUMMARY line per
shape. JSON (rewritten after every shape) with provenance (GPU, torch / triton versions, GIT_SHA).

Kernel-only time (``kernel_us``, since the dispatch of session 20; ``--kernel-calls N``, 0 turns it off): DeepGEMM's
published GB/s are kernel durations from a profiler (launch gaps excluded), while a graph replay timed with events
includes a few us of launch latency -- most of a 15 MB call. Per shape one torch.profiler (kineto, CUDA activity)
session runs N iterations; each iteration calls every variant once in rotated order, each call preceded by an L2
flush (256 MB ``zero_``, as do_bench). The trace's kernels are split into calls at the flush kernels (the first kernel
of the session is a flush; a call's kernels are those up to the next flush, e.g. GEMM + split-K reduce), summed per
call; per variant the median over the N calls (``kernel_us``, ``kernel_gbps``) and the median of the per-iteration
paired ratios vs the reference (``kernel_paired_vs_*``), plus the kernel names of one call. A trace that does not
split into exactly one segment per call is reported (``kernel_error``), not guessed at.

``--public``: the public ``dk.fp8_gemm_nt`` with the session-20 small-M dispatch (``public``) vs the same call with
the small kernel switched off (``triton``: ``DEEPKERNELS_DISABLE_GLUON=gemm_small`` when its plan was made) and its
A/A twin (``triton_aa``), at the 12 shapes; reference = triton. The env switch is read when a call signature's plan
is made, and both paths have the same signature, so both plans are made up front and each timed callable first puts
its own plan into dense.py's plan cache (one dict store, in every variant alike) and then makes the ordinary public
call: whole call (host path included), graph replay and kernel-only, paired rotated rounds; bit identity of public vs
triton recorded. Non-dispatched shapes run the Triton plan in all three variants (a second A/A).

Usage: PYTHONPATH=src python benchmarks/gemm_small.py [--out PATH] [--rounds 5] [--rep-ms 20] [--ms 64,128]
       [--budget-s 90] [--variants small_auto,dispatched,...] [--no-sa] [--kernel-calls 30] [--public];
       ``--dry-run``: print the plan (variants / configs per shape from the picker and the table; with ``--public``
       which shapes dispatch to the small kernel) without a GPU.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

NK = [(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (4096, 7168), (7168, 2048)]


def nbytes(m, n, k):
    kb = (k + 127) // 128
    return m * k + n * k + 2 * m * n + 4 * (m * kb + ((n + 127) // 128) * kb)


def configs(m, n, k, num_sms, with_sa=False):
    """{variant: SmallConfig} of the small-M kernel at this shape (module docstring); ``with_sa``: + small_sa1."""
    from deepkernels.gemm import _gluon_fp8_small as S
    from deepkernels.gemm._configs import select_fp8_config
    auto = S.pick_config(m, n, k, num_sms)
    num_kb = (k + 127) // 128
    out = {"small_auto": auto}
    if auto.split > 1:
        out["small_auto_reduce"] = S.SmallConfig(auto.block_m, auto.block_n, split=auto.split, mode="reduce")
    if with_sa:
        out["small_sa1"] = S.SmallConfig(auto.block_m, auto.block_n, split=auto.split, scale_ahead=1)
    t = select_fp8_config(m, n, k, num_sms)
    twin = S.SmallConfig(auto.block_m, t.block_n, split=t.split_k)
    if (twin.block_n, twin.split) != (auto.block_n, auto.split) and t.block_n in (64, 128):
        out["small_twin"] = twin
    other = 64 if auto.block_n == 128 else 128
    best = min(((S.model_us(m, n, k, other, s, num_sms), s) for s in range(1, 17)
                if S.split_plan(num_kb, s)[0] == s and s * m * n < 2 ** 31))
    alt = S.SmallConfig(auto.block_m, other, split=best[1])
    if all((alt.block_n, alt.split) != (c.block_n, c.split) for c in out.values()):
        out["small_alt"] = alt
    # best wave fill (items / (waves x SMs)) over BLOCK_N and splits <= 8 of >= 4 K blocks, fewest splits on ties:
    # the pick ignoring the modelled workspace cost (e.g. 128x7168x16384: 7 splits = 392 items, 99 % vs the pick's 2 = 112, 85 %)
    fills = []
    for bn in (128, 64):
        for sp in range(1, 9):
            se, _ = S.split_plan(num_kb, sp)
            if se == sp and se * m * n < 2 ** 31 and num_kb // se >= 4:
                items = -(-n // bn) * se
                fills.append((-items / (-(-items // num_sms) * num_sms), se, -bn))
    _, se, nbn = min(fills)
    fill = S.SmallConfig(auto.block_m, -nbn, split=se)
    if all((fill.block_n, fill.split) != (c.block_n, c.split) for c in out.values()):
        out["small_fill"] = fill
    s2, _ = S.split_plan(num_kb, 2 * auto.split)
    if s2 > auto.split and s2 * m * n < 2 ** 31:
        out["small_split2x"] = S.SmallConfig(auto.block_m, auto.block_n, split=s2)
    return out


def _inputs(m, n, k):
    from deepkernels.quant import per_block_cast_to_fp8, per_token_cast_to_fp8
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    return per_token_cast_to_fp8(a, use_ue8m0=False), per_block_cast_to_fp8(b, use_ue8m0=False)


def _graph(fn):
    """A CUDA graph holding one call of ``fn``, warmed up on a side stream and captured on that same stream (the
    small-M kernel's fixup counters of that stream are then allocated and zeroed eagerly, as in a serving loop that
    warms up before capturing; ``torch.cuda.graph``'s default capture stream would add a memset node instead)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=side):
        fn()
    torch.cuda.synchronize()
    return g


def dequant_ref(A, B, k):
    """The FP32 product of the dequantised operands: ``benchmarks/gemm.py``'s ``dequant_ref`` (one definition)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gemm import dequant_ref as ref
    return ref(A, B, k)


def check_then_graph(fns: dict, outs: dict, ref, row: dict, graph=None, ident_to=None, skip_ident=(), get=None):
    """Each callable of ``fns`` once into its NaN-poisoned output (``outs[name]``; ``get(name)`` reads an output
    that is not preallocated, e.g. cuBLAS's): calc_diff < 1e-3 against ``ref`` and no NaN, else recorded in
    ``row["impls"][name]["error"]`` and not timed; ``bit_identical_to_<ident_to>`` for the others (but
    ``skip_ident``); then a CUDA graph of the call (``graph``, default :func:`_graph`). Returns (names that passed,
    {name: graph})."""
    from deepkernels.testing import calc_diff
    graph = graph or _graph
    ok, graphs = [], {}
    for name, fn in fns.items():
        e = row["impls"].setdefault(name, {})
        try:
            if name in outs:
                outs[name].fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            got = get(name) if get is not None else outs[name]
            e["nan"] = bool(torch.isnan(got).any())
            e["diff"] = float(calc_diff(torch.nan_to_num(got.float(), nan=1e4), ref))
            if e["diff"] >= 1e-3 or e["nan"]:
                e["error"] = "failed its check: not timed"
                continue
            if ident_to is not None and name != ident_to and name not in skip_ident and ident_to in outs:
                e[f"bit_identical_to_{ident_to}"] = bool(torch.equal(got, outs[ident_to]))
            graphs[name] = graph(fn)
            ok.append(name)
        except Exception as ex:  # noqa: BLE001
            e["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
    return ok, graphs


FLUSH_BYTES = 256 * 1024 * 1024


def kernel_times(fns: dict, n_calls: int, flush) -> dict:
    """Kernel-only time per call (module docstring): ``{name: {"us": [per call], "kernels": [names of one call]}}``
    or ``{"error": why}``. ``fns`` are zero-argument callables already run once (compiled, plans made); ``flush`` a
    CUDA buffer whose ``zero_()`` evicts L2. A session whose trace does not split into one segment per call is
    repeated once (the first profiler session of a process also initialises CUPTI)."""
    out = _kernel_times_once(fns, n_calls, flush)
    if "error" in out:
        out = _kernel_times_once(fns, n_calls, flush)
        if "error" not in out:
            out["_retried"] = True
    return out


def _kernel_times_once(fns: dict, n_calls: int, flush) -> dict:
    import json as _json
    import tempfile

    from deepkernels.bench.paired import rotation
    from torch.profiler import ProfilerActivity, profile

    names = list(fns)
    order = []
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for i in range(n_calls):
            for nm in rotation(names, i):
                flush.zero_()
                fns[nm]()
                order.append(nm)
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as td:
        path = os.path.join(td, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            trace = _json.load(f)
    return split_calls(trace["traceEvents"] if isinstance(trace, dict) else trace, order, names)


def split_calls(evs: list, order: list, names: list) -> dict:
    """:func:`kernel_times`' attribution from chrome-trace events: device work (``cat`` kernel, or gpu_memset should
    the flush be a memset) sorted by start; the first one is a flush, and every event named like it starts the next
    call's segment; ``order`` names the variant of each call."""
    kern = sorted((float(e["ts"]), float(e.get("dur", 0.0)), str(e.get("name", ""))) for e in evs
                  if isinstance(e, dict) and e.get("ph") == "X"
                  and str(e.get("cat", "")).lower() in ("kernel", "gpu_memset"))
    if not kern:
        return {"error": "no kernel events in the trace"}
    flush_name = kern[0][2]
    segs = []
    for ts, dur, name in kern:
        if name == flush_name:
            segs.append([])
        elif segs:
            segs[-1].append((dur, name))
    if len(segs) != len(order) or any(not sg for sg in segs):
        return {"error": f"{len(segs)} flush-delimited segments ({sum(not sg for sg in segs)} empty) for "
                         f"{len(order)} calls; flush kernel {flush_name[:80]!r}"}
    out = {nm: {"us": [], "kernels": None} for nm in names}
    for nm, sg in zip(order, segs):
        out[nm]["us"].append(sum(d for d, _ in sg))
        if out[nm]["kernels"] is None:
            out[nm]["kernels"] = [k[:100] for _, k in sg]
    return out


def time_row(row: dict, impls: dict, graphs: dict, ok: list, ref: str, args, flush) -> None:
    """Rotated rounds of graph-replay and whole-call do_bench for the variants ``ok`` (+ kernel-only times), into
    ``row["impls"][name]``: medians, GB/s, paired ratios vs ``ref`` (``graph_paired_vs_<ref>`` ...; the session-20
    first run's keys ``graph_paired_vs_dispatched`` / ``call_paired_vs_dispatched`` when ref is "dispatched")."""
    import triton.testing
    from deepkernels.bench.paired import round_stats, rotation
    g_ms = {nm: [] for nm in ok}
    c_ms = {nm: [] for nm in ok}
    for r in range(args.rounds):
        for name in rotation(ok, r):
            g_ms[name].append(triton.testing.do_bench(graphs[name].replay, warmup=3, rep=args.rep_ms,
                                                      return_mode="median"))
            c_ms[name].append(triton.testing.do_bench(impls[name], warmup=3, rep=args.rep_ms,
                                                      return_mode="median"))
    ref = ref if ref in ok else None
    gst = round_stats(g_ms, ref)
    cst = round_stats(c_ms, ref)
    for name in ok:
        e = row["impls"][name]
        e["graph_us_rounds"] = [x * 1e3 for x in g_ms[name]]
        e["us_rounds"] = [x * 1e3 for x in c_ms[name]]
        e["graph_us"] = gst[name]["ms"] * 1e3
        e["us"] = cst[name]["ms"] * 1e3
        e["graph_gbps"] = row["bytes"] / e["graph_us"] / 1e3
        e["gbps"] = row["bytes"] / e["us"] / 1e3
        e["graph_tflops"] = row["flops"] / e["graph_us"] / 1e6
        if "paired_time_ratio_median" in gst[name]:
            e[f"graph_paired_vs_{ref}"] = gst[name]["paired_time_ratio_median"]
            e["graph_paired_ratios"] = gst[name]["paired_time_ratios"]
        if "paired_time_ratio_median" in cst[name]:
            e[f"call_paired_vs_{ref}"] = cst[name]["paired_time_ratio_median"]
            e["call_paired_ratios"] = cst[name]["paired_time_ratios"]
    if args.kernel_calls <= 0:
        return
    try:
        kt = kernel_times({nm: impls[nm] for nm in ok}, args.kernel_calls, flush)
    except Exception as ex:  # noqa: BLE001
        kt = {"error": f"{type(ex).__name__}: {str(ex)[:300]}"}
    if "error" in kt:
        row["kernel_error"] = kt["error"]
        return
    if kt.pop("_retried", False):
        row["kernel_retried"] = True
    kst = round_stats({nm: kt[nm]["us"] for nm in ok}, ref)
    for name in ok:
        e = row["impls"][name]
        e["kernel_us"] = kst[name]["ms"]          # round_stats' "ms" key: here microseconds
        e["kernel_us_min"] = kst[name]["ms_min"]
        e["kernel_gbps"] = row["bytes"] / e["kernel_us"] / 1e3
        e["kernels"] = kt[name]["kernels"]
        if "paired_time_ratio_median" in kst[name]:
            e[f"kernel_paired_vs_{ref}"] = kst[name]["paired_time_ratio_median"]


def summary(row: dict, ref: str) -> str:
    """One SUMMARY line: per variant graph us / GB/s, kernel-only us / GB/s, paired graph|call|kernel vs ref."""
    m, n, k = row["shape"]
    ims = row["impls"]
    base = ims.get(ref, {})
    nan = float("nan")

    def cell(nm, e):
        return (f"{nm.replace('small_', '')} {e['graph_us']:.1f}us {e['graph_gbps']:.0f}GB/s "
                f"k{e.get('kernel_us', nan):.1f}us {e.get('kernel_gbps', nan):.0f}GB/s "
                f"{e.get(f'graph_paired_vs_{ref}', nan):.3f}|{e.get(f'call_paired_vs_{ref}', nan):.3f}|"
                f"{e.get(f'kernel_paired_vs_{ref}', nan):.3f}")
    cells = "  ".join(cell(nm, e) for nm, e in ims.items() if "graph_us" in e and nm != ref)
    errs = "  ".join(f"{nm}: {e['error'][:80]}" for nm, e in ims.items() if "error" in e)
    if "kernel_error" in row:
        errs += f"  kernel-only: {row['kernel_error'][:120]}"
    return (f"SUMMARY {m}x{n}x{k} {ref} {base.get('graph_us', nan):.1f}us {base.get('graph_gbps', nan):.0f}GB/s "
            f"call {base.get('us', nan):.1f}us kernel {base.get('kernel_us', nan):.1f}us "
            f"{base.get('kernel_gbps', nan):.0f}GB/s | graph us, GB/s, kernel us, GB/s, paired t/t_{ref} "
            f"graph|call|kernel: {cells}" + (f"  ERRORS {errs}" if errs else ""))


def _result(args, timing: str) -> dict:
    import triton
    from deepkernels.bench.runner import provenance
    return dict(provenance=provenance(), git_sha_env=os.environ.get("GIT_SHA", ""), rounds=args.rounds,
                rep_ms=args.rep_ms, kernel_calls=args.kernel_calls, triton=triton.__version__, timing=timing, rows=[])


def _save(res: dict, path: str) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(res, f, indent=1)


TIMING = ("graph_us: do_bench (L2 flushed) of a CUDA graph replaying one call; us: do_bench of the whole call; per "
          "variant median over rotated rounds; paired = median over rounds of t / t_ref; kernel_us: torch.profiler "
          "kernel durations summed per call (L2 flushed before each call), median over kernel_calls calls, paired "
          "per rotated iteration")


def public_impls(m, n, k, A, B, device="cuda"):
    """The --public variants at one shape: ``({name: callable}, {name: D}, {name: plan type})`` (module docstring).
    Raises KeyError when a call made no plan (e.g. a reference fallback)."""
    import deepkernels as dk
    from deepkernels.gemm import dense
    plans = dense._FP8_PLANS
    d0 = torch.empty(m, n, device=device, dtype=torch.bfloat16)
    sig = dense._fp8_sig(A, B, d0, None, None, None, None, "nk", None)
    prev = os.environ.pop("DEEPKERNELS_DISABLE_GLUON", None)
    try:
        plans.clear()
        dk.fp8_gemm_nt(A, B, d0)
        new = plans[sig]
        os.environ["DEEPKERNELS_DISABLE_GLUON"] = "gemm_small"
        plans.clear()
        dk.fp8_gemm_nt(A, B, d0)
        old = plans[sig]
    finally:
        os.environ.pop("DEEPKERNELS_DISABLE_GLUON", None)
        if prev is not None:
            os.environ["DEEPKERNELS_DISABLE_GLUON"] = prev
        plans.clear()
    fns, outs, kinds = {}, {}, {}
    for name, plan in (("triton", old), ("triton_aa", old), ("public", new)):
        d = outs[name] = torch.empty(m, n, device=device, dtype=torch.bfloat16)

        def f(plan=plan, d=d):
            plans[sig] = plan
            dk.fp8_gemm_nt(A, B, d)
        fns[name] = f
        kinds[name] = type(plan).__name__
    return fns, outs, kinds


def run_public(args):
    t0 = time.time()
    res = _result(args, TIMING + "; --public: ref = triton (DEEPKERNELS_DISABLE_GLUON=gemm_small), public = the "
                              "dispatch, triton_aa = A/A")
    res["mode"] = "public"
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    for m, n, k in [(m, n, k) for m in args.ms for n, k in NK]:
        if time.time() - t0 > args.budget_s:
            res["rows"].append({"shape": [m, n, k], "skipped": "time budget"})
            print(f"{m}x{n}x{k}: skipped (time budget)", flush=True)
            continue
        row = {"shape": [m, n, k], "bytes": nbytes(m, n, k), "flops": 2 * m * n * k, "impls": {}}
        A, B = _inputs(m, n, k)
        ref = dequant_ref(A, B, k)
        try:
            impls, outs, kinds = public_impls(m, n, k, A, B)
        except Exception as ex:  # noqa: BLE001
            row["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
            res["rows"].append(row)
            print(f"SUMMARY {m}x{n}x{k} ERROR {row['error']}", flush=True)
            continue
        row["dispatch"] = kinds["public"]
        for name in impls:
            row["impls"][name] = {"plan": kinds[name]}
        ok, graphs = check_then_graph(impls, outs, ref, row)
        if "public" in ok and "triton" in ok:
            row["impls"]["public"]["bit_identical_to_triton"] = bool(torch.equal(outs["public"], outs["triton"]))
        time_row(row, impls, graphs, ok, "triton", args, flush)
        res["rows"].append(row)
        print(summary(row, "triton") + f"  [public plan: {kinds['public']}]", flush=True)
        _save(res, args.out)
        del ref, outs, graphs, impls
        from deepkernels.gemm import dense
        dense._FP8_PLANS.clear()
        torch.cuda.empty_cache()
    print("\npublic (small-M dispatch) vs triton per shape, paired graph | call | kernel (A/A graph):")
    for row in res["rows"]:
        e, aa = row.get("impls", {}).get("public", {}), row.get("impls", {}).get("triton_aa", {})
        if "graph_us" in e:
            print(f"  {'x'.join(map(str, row['shape']))} [{row.get('dispatch')}]: "
                  f"{e.get('graph_paired_vs_triton', float('nan')):.3f} | {e.get('call_paired_vs_triton', float('nan')):.3f}"
                  f" | {e.get('kernel_paired_vs_triton', float('nan')):.3f}  (A/A {aa.get('graph_paired_vs_triton', float('nan')):.3f})"
                  f"  public {e['graph_us']:.1f}/{e['us']:.1f}/{e.get('kernel_us', float('nan')):.1f} us "
                  f"graph/call/kernel, {e.get('kernel_gbps', float('nan')):.0f} GB/s kernel-only", flush=True)
    return 0


def run(args):
    import deepkernels as dk
    from deepkernels.gemm import _gluon_fp8_small as S

    t0 = time.time()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = _result(args, TIMING)
    flush = torch.empty(FLUSH_BYTES, dtype=torch.int8, device="cuda")
    want = set(args.variants.split(",")) if args.variants else None
    shapes = [(m, n, k) for m in args.ms for n, k in NK]
    for m, n, k in shapes:
        if time.time() - t0 > args.budget_s:
            res["rows"].append({"shape": [m, n, k], "skipped": "time budget"})
            print(f"{m}x{n}x{k}: skipped (time budget)", flush=True)
            continue
        row = {"shape": [m, n, k], "bytes": nbytes(m, n, k), "flops": 2 * m * n * k, "impls": {}}
        A, B = _inputs(m, n, k)
        ref = dequant_ref(A, B, k)
        cfgs = configs(m, n, k, num_sms, args.sa)
        impls, outs = {}, {}
        for name in ("dispatched", "dispatched_aa"):
            d = outs[name] = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            impls[name] = (lambda d=d, A=A, B=B: dk.fp8_gemm_nt(A, B, d))
        for name, cfg in cfgs.items():
            d = outs[name] = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            impls[name] = (lambda d=d, c=cfg, A=A, B=B: S.launch_fp8_gemm_small(A[0], A[1], B[0], B[1], d, c))
            row["impls"][name] = {"config": cfg.name()}
        cub = {}
        if n % 128 == 0:
            sfa_c, sfb_c = A[1].T.contiguous().T, B[1].contiguous().T
            impls["cublas"] = lambda A=A, B=B, sfa_c=sfa_c, sfb_c=sfb_c, cub=cub: cub.__setitem__("d", torch._scaled_mm(
                A[0], B[0].T, scale_a=sfa_c, scale_b=sfb_c, out_dtype=torch.bfloat16))
        if want:
            impls = {nm: f for nm, f in impls.items() if nm in want or nm == "dispatched"}
        ok, graphs = check_then_graph(impls, outs, ref, row, ident_to="dispatched", skip_ident=("cublas",),
                                      get=lambda nm, o=outs, c=cub: c["d"] if nm == "cublas" else o[nm])
        time_row(row, impls, graphs, ok, "dispatched", args, flush)
        res["rows"].append(row)
        print(summary(row, "dispatched"), flush=True)
        _save(res, args.out)
        del ref, outs, graphs, impls
        torch.cuda.empty_cache()
    # per-shape best small-M variant (graph) for the notes
    print("\nbest small-M variant per shape (graph replay):")
    for row in res["rows"]:
        sm = {nm: e for nm, e in row.get("impls", {}).items() if nm.startswith("small") and "graph_us" in e}
        if sm:
            nm, e = min(sm.items(), key=lambda kv: kv[1]["graph_us"])
            print(f"  {'x'.join(map(str, row['shape']))}: {nm} ({e['config']}) {e['graph_gbps']:.0f} GB/s, "
                  f"t/t_disp {e.get('graph_paired_vs_dispatched', float('nan')):.3f}", flush=True)
    return 0


def dry_run(args):
    from deepkernels.gemm import _gluon_fp8_small as S
    from deepkernels.gemm._configs import select_fp8_config
    if args.public:
        for m in args.ms:
            for n, k in NK:
                cfg = S.SMALL_FP8_TABLE.get((64 if m <= 64 else 128, n, k))
                print(f"{m}x{n}x{k} triton {select_fp8_config(m, n, k, 132).name()}  public "
                      f"{cfg.name() if cfg else '(Triton table)'}")
        return 0
    for m in args.ms:
        for n, k in NK:
            cf = configs(m, n, k, 132, args.sa)
            print(f"{m}x{n}x{k} table {select_fp8_config(m, n, k, 132).name()}  " + "  ".join(
                f"{nm}={c.name()}({S.model_us(m, n, k, c.block_n, c.split, 132):.1f}us model)" for nm, c in cf.items()))
    return 0


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gemm_small.json"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rep-ms", type=int, default=20)
    ap.add_argument("--ms", default="64,128", help="comma-separated M values")
    ap.add_argument("--budget-s", type=float, default=90.0, help="shapes not started by then are skipped")
    ap.add_argument("--variants", default="", help="comma-separated subset of the variant names (+ dispatched)")
    ap.add_argument("--no-sa", dest="sa", action="store_false", help="do not time small_sa1 (scales-ahead loop)")
    ap.add_argument("--kernel-calls", type=int, default=30,
                    help="calls per variant in the kernel-only profiler pass (0: no kernel-only times)")
    ap.add_argument("--public", action="store_true",
                    help="time the public fp8_gemm_nt (small-M dispatch) vs DEEPKERNELS_DISABLE_GLUON=gemm_small")
    ap.add_argument("--dry-run", action="store_true", help="print the variants' configs per shape; no GPU")
    args = ap.parse_args(argv)
    args.ms = [int(x) for x in args.ms.split(",") if x]
    if args.dry_run:
        return dry_run(args)
    if not torch.cuda.is_available():
        print("gemm_small.py: no CUDA device (use --dry-run on a CPU)")
        return 0
    return run_public(args) if args.public else run(args)


if __name__ == "__main__":
    sys.exit(main())
