"""Small-M FP8 GEMM rule sweep (session 20, second round): the small-M Gluon kernel
(``deepkernels.gemm._gluon_fp8_small``) vs the Triton path of ``dk.fp8_gemm_nt`` at (N, K) outside the dispatch table
(DeepSeek-V3 / V2-Lite / Qwen3 / Llama projections, TP-sharded N / K), M in {16, 64, 128} (+ 1 and 96 at a few
(N, K)), to turn ``SMALL_FP8_TABLE`` into a rule (``_gluon_fp8_small.rule_config``, opt-in through
``DEEPKERNELS_GEMM_SMALL_RULE=1``; OFF by default).

Variants per shape (each checked once before timing: NaN-poisoned D, calc_diff < 1e-3 vs the dequantised FP32
product, no NaN left; bit identity vs ``triton`` recorded; a variant failing its check is not timed):
  triton, triton_aa  the public op with ``DEEPKERNELS_DISABLE_GLUON=gemm_small`` (plan made under it), twice: the
                     reference and its A/A control
  rule               the public op with ``DEEPKERNELS_GEMM_SMALL_RULE=1`` (its plan: ``rule_config``), only where the
                     rule picks the small kernel (``rule_config`` not None)
  twin               small kernel, the Triton config's BLOCK_N (256 -> 128) and K split; reduce mode when split,
                     scales-ahead at BLOCK_M 128 without split (the rule's family)
  twin_bn            the twin with the other BLOCK_N
  auto               ``pick_config`` (fixup split-K)
  auto_reduce        the pick's split with the separate reduce kernel (only when the pick splits K)
Small variants equal (as SmallConfig) to the rule's config or to an earlier variant are not timed twice.
Timing: ``--rounds`` rotated rounds (default 3); per round and variant one CUDA-graph replay time (a graph holding one
call, replayed under ``triton.testing.do_bench`` with its L2 flush; gemm_small.py's ``_graph``); per variant the
median over rounds and the median of the paired per-round ratios t / t_triton. JSON (rewritten after every shape)
with provenance; SUMMARY line per shape; at the end a per-bucket fit (M class x Triton split x N tiles vs SMs x K)
of the best small variant's and the rule's ratios.

Usage: PYTHONPATH=src python benchmarks/gemm_small_sweep.py [--out PATH] [--rounds 3] [--rep-ms 4]
       [--budget-s 70] [--ms 16,64,128] [--extra-ms 1,96] [--max-shapes N] [--dry-run]
``--dry-run`` (no GPU): the shape list with the Triton config, the rule's config and the small variants per shape.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import statistics
import sys
import time

import torch

# (N, K, source) in sweep order: diverse first (a time budget cuts the tail). None of them is a table row.
NK = [
    (1536, 7168, "V3 q_a"),
    (7168, 4096, "grid"),
    (4096, 4096, "Qwen3-8B / Llama-8B o"),
    (24576, 4096, "Qwen3-8B gate_up"),
    (3072, 1536, "V3 q_b TP8"),
    (7168, 2304, "V3 dense down TP8"),
    (4608, 7168, "V3 dense gate_up TP8"),
    (6144, 4096, "Qwen3-8B / Llama-8B qkv"),
    (2048, 2048, "V2-Lite o"),
    (12288, 2048, "grid"),
    (4096, 14336, "Llama-8B down"),
    (10240, 5120, "Qwen3-32B qkv"),
    (5120, 8192, "Qwen3-32B o"),
    (8192, 1024, "Llama-70B o TP8"),
    (3072, 2048, "V2-Lite q"),
    (14336, 4096, "Llama-8B gate_up TP2"),
    (2048, 10944, "V2-Lite down (K tail)"),
    (1280, 8192, "Llama-70B qkv TP8"),
    (7168, 8192, "Llama-70B gate_up TP8"),
    (8192, 3584, "Llama-70B down TP8"),
    (12800, 5120, "Qwen3-32B gate_up TP4"),
    (5120, 6400, "Qwen3-32B down TP4"),
    (5120, 2048, "Qwen3-30B-A3B qkv"),
    (9216, 7168, "V3 dense gate_up TP4"),
    (18432, 2048, "grid"),
    (8192, 5120, "grid"),
    (2048, 7168, "V3 shared gate_up TP2"),
    (16384, 7168, "grid"),
    (4096, 12288, "Qwen3-8B down"),
    (6144, 5120, "grid"),
]
EXTRA_NK = {(4096, 4096), (7168, 4096), (1536, 7168), (24576, 4096), (7168, 2304), (5120, 8192)}  # + M 1 / 96
_DIR = os.path.dirname(os.path.abspath(__file__))


def _gemm_small():
    """benchmarks/gemm_small.py as a module (its helpers: _inputs, _graph, nbytes, public_impls, FLUSH_BYTES)."""
    spec = importlib.util.spec_from_file_location("gemm_small_bench", os.path.join(_DIR, "gemm_small.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def shape_list(ms, extra_ms, max_shapes=0) -> list:
    """[(m, n, k, source)]: per (N, K) of NK in order, M in ``ms`` descending, then ``extra_ms`` at EXTRA_NK."""
    out = []
    for n, k, src in NK:
        mm = sorted(set(ms) | (set(extra_ms) if (n, k) in EXTRA_NK else set()), reverse=True)
        out += [(m, n, k, src) for m in mm]
    return out[:max_shapes] if max_shapes else out


def twin_config(m, n, k, num_sms):
    """The rule's family at any shape: the Triton config's BLOCK_N (256 -> 128) and K split, reduce mode when
    split, scales-ahead at BLOCK_M 128 without split."""
    from deepkernels.gemm import _gluon_fp8_small as S
    from deepkernels.gemm._configs import select_fp8_config
    t = select_fp8_config(m, n, k, num_sms)
    bm = 64 if m <= 64 else 128
    split, _ = S.split_plan((k + 127) // 128, t.split_k)
    bn = t.block_n if t.block_n in (64, 128) else 128
    if split > 1:
        return S.SmallConfig(bm, bn, split=split, mode="reduce")
    return S.SmallConfig(bm, bn, split=1, scale_ahead=1 if bm == 128 else 0)


def small_variants(m, n, k, num_sms) -> dict:
    """{name: SmallConfig} of the small variants (module docstring), deduplicated against each other and the rule."""
    from deepkernels.gemm import _gluon_fp8_small as S
    twin = twin_config(m, n, k, num_sms)
    cands = {"twin": twin,
             "twin_bn": S.SmallConfig(twin.block_m, 64 if twin.block_n == 128 else 128, split=twin.split,
                                      mode=twin.mode, scale_ahead=twin.scale_ahead)}
    auto = S.pick_config(m, n, k, num_sms)
    cands["auto"] = auto
    if auto.split > 1:
        cands["auto_reduce"] = S.SmallConfig(auto.block_m, auto.block_n, split=auto.split, mode="reduce")
    rule = S.rule_config(m, n, k, num_sms)
    seen = [rule] if rule is not None else []
    out = {}
    for name, c in cands.items():
        if c in seen:
            continue
        seen.append(c)
        out[name] = c
    return out


def features(m, n, k, num_sms) -> dict:
    """What a rule may key on: M class, Triton config / split, 64- and 128-wide N tiles vs SMs, K blocks."""
    from deepkernels.gemm._configs import select_fp8_config
    t = select_fp8_config(m, n, k, num_sms)
    return dict(m_class=64 if m <= 64 else 128, triton_config=t.name(), triton_split=t.split_k,
                triton_block_n=t.block_n, tiles64=-(-n // 64), tiles128=-(-n // 128), num_kb=(k + 127) // 128,
                one_wave64=-(-n // 64) <= num_sms, b_mb=n * k / 1e6)


def bucket(f: dict) -> str:
    return (f"M{'<=64' if f['m_class'] == 64 else '>64'} split{'1' if f['triton_split'] == 1 else '>1'} "
            f"tiles64{'<=' if f['one_wave64'] else '>'}SMs K{'<=2304' if f['num_kb'] <= 18 else '>2304'}")


def _time_rounds(graphs: dict, names: list, rounds: int, rep_ms: int) -> dict:
    import triton.testing
    from deepkernels.bench.paired import rotation
    ms = {nm: [] for nm in names}
    for r in range(rounds):
        for nm in rotation(names, r):
            ms[nm].append(triton.testing.do_bench(graphs[nm].replay, warmup=1, rep=rep_ms, return_mode="median"))
    return ms


def _set_env(key, val):
    prev = os.environ.pop(key, None)
    if val is not None:
        os.environ[key] = val
    return prev


def public_pair(gs, m, n, k, A, B):
    """(triton plan callables + rule callable or None, outs): gemm_small.public_impls with the rule env on while the
    'public' plan is made (its 'public' = the rule's plan; 'triton' / 'triton_aa' = gemm_small disabled)."""
    prev = _set_env("DEEPKERNELS_GEMM_SMALL_RULE", "1")
    try:
        fns, outs, kinds = gs.public_impls(m, n, k, A, B)
    finally:
        _set_env("DEEPKERNELS_GEMM_SMALL_RULE", prev)
    fns["rule"], outs["rule"] = fns.pop("public"), outs.pop("public")
    kinds["rule"] = kinds.pop("public")
    return fns, outs, kinds


def run(args) -> int:
    from deepkernels.gemm import _gluon_fp8_small as S
    from deepkernels.gemm import dense
    from deepkernels.bench.paired import round_stats
    gs = _gemm_small()
    t0 = time.time()
    num_sms = torch.cuda.get_device_properties(0).multi_processor_count
    res = gs._result(argparse.Namespace(rounds=args.rounds, rep_ms=args.rep_ms, kernel_calls=0),
                     "graph_us: do_bench (L2 flushed) of a CUDA graph replaying one call, median over rotated rounds;"
                     " paired = median over rounds of t / t_triton")
    res.update(mode="sweep", num_sms=num_sms, budget_s=args.budget_s, rule_min_k=S.RULE_MIN_K)
    for m, n, k, src in shape_list(args.ms, args.extra_ms, args.max_shapes):
        if time.time() - t0 > args.budget_s:
            res["rows"].append({"shape": [m, n, k], "source": src, "skipped": "time budget"})
            print(f"{m}x{n}x{k}: skipped (time budget)", flush=True)
            continue
        ts = time.time()
        f = features(m, n, k, num_sms)
        rule = S.rule_config(m, n, k, num_sms)
        row = {"shape": [m, n, k], "source": src, "bytes": gs.nbytes(m, n, k), "features": f, "bucket": bucket(f),
               "rule_config": rule.name() if rule else None, "impls": {}}
        try:
            A, B = gs._inputs(m, n, k)
            ref = gs.dequant_ref(A, B, k)
            fns, outs, kinds = public_pair(gs, m, n, k, A, B)
            if rule is None:
                del fns["rule"], outs["rule"]
            else:
                row["rule_plan"] = kinds["rule"]
            for name, cfg in small_variants(m, n, k, num_sms).items():
                d = outs[name] = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
                plan = S.SmallPlan.checked(A[0], A[1], B[0], B[1], d, cfg)
                fns[name] = (lambda p=plan, d=d, A=A, B=B: p(A[0], A[1], B[0], B[1], d))
                row["impls"][name] = {"config": cfg.name()}
        except Exception as ex:  # noqa: BLE001
            row["error"] = f"{type(ex).__name__}: {str(ex)[:300]}"
            res["rows"].append(row)
            gs._save(res, args.out)
            print(f"SUMMARY {m}x{n}x{k} ERROR {row['error']}", flush=True)
            continue
        if "rule" in fns:
            row["impls"].setdefault("rule", {})["config"] = rule.name()
        ok, graphs = gs.check_then_graph(fns, outs, ref, row, graph=gs._graph, ident_to="triton",
                                         skip_ident=("triton_aa",))
        if "triton" in ok:
            ms = _time_rounds(graphs, ok, args.rounds, args.rep_ms)
            st = round_stats(ms, "triton")
            for name in ok:
                e = row["impls"][name]
                e["graph_us_rounds"] = [x * 1e3 for x in ms[name]]
                e["graph_us"] = st[name]["ms"] * 1e3
                e["graph_gbps"] = row["bytes"] / e["graph_us"] / 1e3
                if "paired_time_ratio_median" in st[name]:
                    e["graph_paired_vs_triton"] = st[name]["paired_time_ratio_median"]
                    e["graph_paired_ratios"] = st[name]["paired_time_ratios"]
        else:
            row["error"] = "triton reference failed: nothing timed"
        row["wall_s"] = time.time() - ts
        res["rows"].append(row)
        gs._save(res, args.out)
        print(summary_line(row), flush=True)
        del ref, outs, graphs, fns
        dense._FP8_PLANS.clear()
        torch.cuda.empty_cache()
    res["fit"] = fit(res["rows"])
    res["elapsed_s"] = time.time() - t0
    gs._save(res, args.out)
    print_fit(res["fit"])
    return 0


def best_small(row: dict):
    """(name, ratio) of the lowest paired graph ratio among the small variants (rule included), or None."""
    c = [(e["graph_paired_vs_triton"], nm) for nm, e in row.get("impls", {}).items()
         if nm not in ("triton", "triton_aa") and "graph_paired_vs_triton" in e]
    return (min(c)[1], min(c)[0]) if c else None


def summary_line(row: dict) -> str:
    m, n, k = row["shape"]
    ims = row["impls"]
    nan = float("nan")
    base = ims.get("triton", {})
    cells = "  ".join(f"{nm} {e.get('config', '')} {e['graph_us']:.1f}us {e.get('graph_paired_vs_triton', nan):.3f}"
                      + ("" if e.get("bit_identical_to_triton", True) else " (not bit-id)")
                      for nm, e in ims.items() if "graph_us" in e and nm != "triton")
    errs = "  ".join(f"{nm}: {e['error'][:80]}" for nm, e in ims.items() if "error" in e)
    b = best_small(row)
    return (f"SUMMARY {m}x{n}x{k} [{row['bucket']}] triton {row['features']['triton_config']} "
            f"{base.get('graph_us', nan):.1f}us {base.get('graph_gbps', nan):.0f}GB/s | {cells} | best "
            f"{b[0] if b else '-'} {b[1] if b else nan:.3f} rule {row.get('rule_config')}"
            + (f"  ERRORS {errs}" if errs else "") + f"  ({row.get('wall_s', 0):.1f}s)")


def fit(rows: list) -> dict:
    """Per bucket: shapes, median / min / max best-small ratio, wins (<= 0.97), the rule's ratios and the A/A spread."""
    out = {}
    for row in rows:
        if "impls" not in row or "bucket" not in row:
            continue
        b = best_small(row)
        if b is None:
            continue
        g = out.setdefault(row["bucket"], {"shapes": [], "best": [], "best_variant": [], "rule": [], "aa": []})
        g["shapes"].append("x".join(map(str, row["shape"])))
        g["best"].append(b[1])
        g["best_variant"].append(b[0])
        r = row["impls"].get("rule", {}).get("graph_paired_vs_triton")
        g["rule"].append(r)
        g["aa"].append(row["impls"].get("triton_aa", {}).get("graph_paired_vs_triton"))
    for g in out.values():
        g["best_median"] = statistics.median(g["best"])
        g["best_wins"] = sum(x <= 0.97 for x in g["best"])
        rr = [x for x in g["rule"] if x is not None]
        g["rule_n"] = len(rr)
        if rr:
            g["rule_median"], g["rule_max"] = statistics.median(rr), max(rr)
            g["rule_wins"], g["rule_losses"] = sum(x <= 0.97 for x in rr), sum(x > 1.0 for x in rr)
        aa = [x for x in g["aa"] if x is not None]
        if aa:
            g["aa_min"], g["aa_max"] = min(aa), max(aa)
    return out


def print_fit(fitd: dict) -> None:
    print("\nFIT per bucket (best small variant | rule; paired graph t/t_triton; wins <= 0.97):", flush=True)
    for name, g in sorted(fitd.items()):
        vc = {}
        for v in g["best_variant"]:
            vc[v] = vc.get(v, 0) + 1
        print(f"  {name}: {len(g['shapes'])} shapes, best median {g['best_median']:.3f} "
              f"({g['best_wins']} wins; {vc}) | rule {g['rule_n']} shapes"
              + (f", median {g['rule_median']:.3f} max {g['rule_max']:.3f}, {g['rule_wins']} wins / "
                 f"{g['rule_losses']} > 1.0" if g["rule_n"] else "")
              + (f" | A/A {g['aa_min']:.3f}-{g['aa_max']:.3f}" if "aa_min" in g else ""), flush=True)


def dry_run(args, num_sms=132) -> int:
    from deepkernels.gemm import _gluon_fp8_small as S
    shapes = shape_list(args.ms, args.extra_ms, args.max_shapes)
    for m, n, k, src in shapes:
        f = features(m, n, k, num_sms)
        rule = S.rule_config(m, n, k, num_sms)
        vs = small_variants(m, n, k, num_sms)
        print(f"{m}x{n}x{k} ({src}) [{bucket(f)}] triton {f['triton_config']} rule "
              f"{rule.name() if rule else '-'}  " + "  ".join(f"{nm}={c.name()}" for nm, c in vs.items()))
    print(f"{len(shapes)} shapes, {sum(len(small_variants(m, n, k, num_sms)) + 2 + (S.rule_config(m, n, k, num_sms) is not None) for m, n, k, _ in shapes)} timed variants")
    return 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gemm_small_sweep.json"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep-ms", type=int, default=4)
    ap.add_argument("--budget-s", type=float, default=70.0, help="shapes not started by then are skipped")
    ap.add_argument("--ms", default="16,64,128", help="comma-separated M values at every (N, K)")
    ap.add_argument("--extra-ms", default="1,96", help="comma-separated M values at the EXTRA_NK pairs only")
    ap.add_argument("--max-shapes", type=int, default=0, help="first N shapes only (0: all)")
    ap.add_argument("--dry-run", action="store_true", help="print shapes, Triton config, rule and variants; no GPU")
    args = ap.parse_args(argv)
    args.ms = [int(x) for x in args.ms.split(",") if x]
    args.extra_ms = [int(x) for x in args.extra_ms.split(",") if x]
    if any(not 1 <= m <= 128 for m in args.ms + args.extra_ms):
        ap.error("M must be in 1..128")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        return dry_run(args)
    if not torch.cuda.is_available():
        print("gemm_small_sweep.py: no CUDA device (use --dry-run on a CPU)")
        return 0
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
