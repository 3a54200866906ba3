"""Benchmark: sparse MLA prefill (flash_mla_sparse_fwd) and dense MHA-mode prefill (flash_attn_varlen_func).

Sparse: s_q=4096, h_q=128, d_qk=576, topk=2048, s_kv in {8K, 32K, 64K, 128K}, with and without sink.
FLOPs as FlashMLA counts them (``tests/lib.py count_flop_and_mem_vol``): 2*s_q*topk*h_q*(d_qk+d_v).
Anchor: FlashMLA measured on our H200 (ANCHORS.md; no sink): 588 / 510 / 521 / 494 TFLOPS; target 640.
Dense: b=2, s in {4096, 8192}, h=128, (d_qk, d_v) in {(192,128), (128,128)}, causal and not, against
torch SDPA (its own backend choice) timed in the same run; FLOPs 2*b*h*s*s*(d_qk+d_v), halved when causal.

Usage: python benchmarks/mla_prefill.py [--sweep] [--out FILE.json] [--only sparse|dense]
Timing: triton.testing.do_bench median (CUDA events, whole call). Writes JSON rows with provenance after
every row, so a killed run keeps what it measured.
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

from deepkernels.mla.dense_prefill import (DENSE_CANDIDATES, DENSE_CONFIGS, _launch_dense_prefill,  # noqa: E402
                                           flash_attn_varlen_func)
from deepkernels.mla.prefill import (SPARSE_CANDIDATES, SPARSE_CONFIGS, _launch_sparse_prefill,  # noqa: E402
                                     flash_mla_sparse_fwd)
from deepkernels.mla import _gluon_dense_prefill as _gdp  # noqa: E402
from deepkernels.bench.paired import round_stats, time_rotated  # noqa: E402
from deepkernels.mla import _gluon_sparse_prefill as _gsp  # noqa: E402
from deepkernels.mla import _gluon_sparse_prefill_ws2 as _gsp2  # noqa: E402
from deepkernels.mla import _gluon_sparse_prefill_ws3 as _gsp3  # noqa: E402
from deepkernels.mla import _gluon_sparse_prefill_ws4 as _gsp4  # noqa: E402
from deepkernels.reference.mla_prefill import sparse_prefill_ref  # noqa: E402

FLASHMLA_H200 = {8192: 588.0, 32768: 510.0, 65536: 521.0, 131072: 494.0}
SDPA_TARGET = 1.0
SPARSE_TARGET = 640.0


def provenance():
    sha = os.environ.get("GIT_SHA")
    if not sha:
        try:
            sha = subprocess.check_output(["git", "rev-parse", "HEAD"], stderr=subprocess.DEVNULL).decode().strip()
        except Exception:
            sha = "unknown"
    import triton
    p = {"torch": torch.__version__, "triton": triton.__version__, "cuda": torch.version.cuda, "git_sha": sha,
         "host": platform.node(), "time": time.strftime("%Y-%m-%dT%H:%M:%S")}
    if torch.cuda.is_available():
        p["gpu"] = torch.cuda.get_device_name()
        p["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
        try:
            p["driver"] = subprocess.check_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                                  stderr=subprocess.DEVNULL).decode().strip().splitlines()[0]
        except Exception:
            p["driver"] = "unknown"
    return p


DEV = "cuda"


def _sync():
    if DEV == "cuda":
        torch.cuda.synchronize()


def bench(fn):
    if DEV != "cuda":   # --cpu-smoke: one call, wall clock (checks the script, not speed)
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton.testing
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")   # ms


class Rows:
    def __init__(self, path, prov):
        self.path, self.prov, self.rows = path, prov, []

    def add(self, **row):
        row.update(self.prov)
        self.rows.append(row)
        print(json.dumps({k: row[k] for k in row if k not in self.prov}), flush=True)
        if self.path:
            with open(self.path, "w") as f:
                json.dump(self.rows, f, indent=1)


def sparse_inputs(s_q, s_kv, topk, h_q, d_qk, sink):
    dev = DEV
    q = (torch.randn(s_q, h_q, d_qk, device=dev) / 10).bfloat16()
    kv = (torch.randn(s_kv, 1, d_qk, device=dev) / 10).bfloat16()
    ind = torch.empty(s_q, 1, topk, dtype=torch.int32, device=dev)
    step = max(1, (1 << 27) // s_kv)
    for i in range(0, s_q, step):     # unique random indices per row (as FlashMLA's generator)
        j = min(s_q, i + step)
        ind[i:j, 0] = torch.rand(j - i, s_kv, device=dev).argsort(dim=-1)[:, :topk].to(torch.int32)
    sk = torch.randn(h_q, device=dev) if sink else None
    return q, kv, ind, sk


# Gluon sparse config label -> variant of launch_sparse_prefill_gluon (None: the dispatched one; "ws2": the
# split-consumer kernel of mla/_gluon_sparse_prefill_ws2.py, launched directly). The WS2 OVERLAP / HALF labels
# (gluon-ws2-ov, -ov2, -half, -half-ov, -half-ov2) went with those options in session 18 (measured slower; git
# cb51b03); --gluon-skip / --gluon-add ignore labels that are not here, so older device scripts still run.
GLUON_SPARSE = {"gluon": None, "gluon-ws": "ws", "gluon-ws2": "ws2", "gluon-ws3": "ws3", "gluon-ws3-nopf": "ws3-nopf",
                "gluon-ws4": "ws4", "gluon-ws4-sym": "ws4-sym", "gluon-ws4-whole": "ws4-whole",
                "gluon-ws4-r4": "ws4-r4", "gluon-ws2-r4": "ws2-r4", "gluon-ws2-r1": "ws2-r1",
                "gluon-ws2-aa": "ws2-aa", "gluon-ws2-qa": "ws2-qa", "gluon-ws2-os": "ws2-os",
                "gluon-ws2-qa-os": "ws2-qa-os"}
# labels timed only when named in --gluon-add (keeps the other device scripts' --gluon runs at their length)
GLUON_OPT_IN = ("gluon-ws3", "gluon-ws3-nopf", "gluon-ws4", "gluon-ws4-sym", "gluon-ws4-whole", "gluon-ws4-r4",
                "gluon-ws2-r4", "gluon-ws2-r1", "gluon-ws2-aa", "gluon-ws2-qa", "gluon-ws2-os", "gluon-ws2-qa-os")
# WS2 launcher keywords per label: "gluon-ws2-aa" = the default WS2 launch again (the A/A control of a paired run),
# "gluon-ws2-qa" = Q by one cp.async batch (q_async, session 19), "gluon-ws2-os" = the output staged through shared
# memory (o_stage, session 19), "gluon-ws2-qa-os" = both
_WS2_KW = {"gluon-ws2-aa": {}, "gluon-ws2-qa": {"q_async": True}, "gluon-ws2-os": {"o_stage": True},
           "gluon-ws2-qa-os": {"q_async": True, "o_stage": True}}
# --qasync / --ostage: the paired A/B of q_async / o_stage (WS2 default launch = base, its A/A, the option; both
# flags: also both options together), benchmarks/device_sparse_prefill_qasync.sh


def _ab_labels(qasync, ostage):
    """The labels of a --qasync / --ostage run, in timing order."""
    labels = ["gluon-ws2", "gluon-ws2-aa"] + (["gluon-ws2-qa"] if qasync else []) + (["gluon-ws2-os"] if ostage
                                                                                      else [])
    return tuple(labels + (["gluon-ws2-qa-os"] if qasync and ostage else []))


# "ws4" / "ws4-sym" / "ws4-whole": mla/_gluon_sparse_prefill_ws4.py (FlashMLA sm90 pair order; opt-in, not
# dispatched) and its F2 ablations sym_max / whole_slot
_WS4_ABL = {"ws4": {}, "ws4-sym": {"sym_max": True}, "ws4-whole": {"whole_slot": True},
            "ws4-r4": {"gather_rows4": True}}
# "ws3" / "ws3-nopf": mla/_gluon_sparse_prefill_ws3.py (2-CTA cluster producer sharing), pf_idx on / off
_WS3_PF = {"ws3": True, "ws3-nopf": False}


def _launch_cfg(cfg):
    """The launcher for one candidate: a Triton config tuple or a Gluon label of :data:`GLUON_SPARSE`
    (mla/_gluon_sparse_prefill.py: "gluon" = the dispatched variant, "gluon-ws"; "gluon-ws2" =
    mla/_gluon_sparse_prefill_ws2.py's launcher; "gluon-ws3" / "gluon-ws3-nopf" = mla/_gluon_sparse_prefill_ws3.py
    with pf_idx on / off; "gluon-ws4" / "gluon-ws4-sym" / "gluon-ws4-whole" = mla/_gluon_sparse_prefill_ws4.py,
    default / sym_max / whole_slot)."""
    if isinstance(cfg, str) and GLUON_SPARSE.get(cfg) in _WS4_ABL:
        kw4 = _WS4_ABL[GLUON_SPARSE[cfg]]
        return lambda out, ml, lse, q, kv, ind, scale, sk, tl: _gsp4.launch_sparse_prefill_gluon_ws4(
            out, ml, lse, q, kv, ind, scale, sk, tl, **kw4)
    if isinstance(cfg, str) and GLUON_SPARSE.get(cfg) in _WS3_PF:
        pf = _WS3_PF[GLUON_SPARSE[cfg]]
        return lambda out, ml, lse, q, kv, ind, scale, sk, tl: _gsp3.launch_sparse_prefill_gluon_ws3(
            out, ml, lse, q, kv, ind, scale, sk, tl, pf_idx=pf)
    if cfg == "gluon-ws2":      # the split-consumer module's launcher (not a variant of launch_sparse_prefill_gluon)
        return _gsp2.launch_sparse_prefill_gluon_ws2
    if cfg in _WS2_KW:
        kw2 = _WS2_KW[cfg]
        return lambda out, ml, lse, q, kv, ind, scale, sk, tl: _gsp2.launch_sparse_prefill_gluon_ws2(
            out, ml, lse, q, kv, ind, scale, sk, tl, **kw2)
    if cfg in ("gluon-ws2-r4", "gluon-ws2-r1"):   # WS2 with the 4-rows / the 1-row NoPE gather (session 18)
        r4 = cfg == "gluon-ws2-r4"
        return lambda out, ml, lse, q, kv, ind, scale, sk, tl: _gsp2.launch_sparse_prefill_gluon_ws2(
            out, ml, lse, q, kv, ind, scale, sk, tl, gather_rows4=r4)
    if isinstance(cfg, str) and cfg in GLUON_SPARSE:
        variant = GLUON_SPARSE[cfg]
        return lambda out, ml, lse, q, kv, ind, scale, sk, tl: _gsp.launch_sparse_prefill_gluon(
            out, ml, lse, q, kv, ind, scale, sk, tl, variant=variant)
    return lambda out, ml, lse, q, kv, ind, scale, sk, tl: _launch_sparse_prefill(
        out, ml, lse, q, kv, ind, scale, sk, tl, config=cfg)


def run_sparse(rows, sweep, s_kvs, s_q=4096, topk=2048, gluon=False, gluon_skip=(), gluon_add=(), rounds=0,
               paired_base="gluon-ws2", sinks=(False, True), skip_triton=False):
    h_q, d_qk = 128, 576
    configs = [] if skip_triton else (SPARSE_CANDIDATES if sweep else [SPARSE_CONFIGS[h_q]])
    if gluon:
        configs = configs + [c for c in GLUON_SPARSE
                             if c not in gluon_skip and (c not in GLUON_OPT_IN or c in gluon_add)]
    for s_kv in s_kvs:
        for sink in sinks:
            try:
                q, kv, ind, sk = sparse_inputs(s_q, s_kv, topk, h_q, d_qk, sink)
            except Exception as e:  # noqa: BLE001
                print(f"sparse s_kv={s_kv}: input generation failed: {e!r}", flush=True)
                continue
            flops = 2 * s_q * topk * h_q * (d_qk + 512)
            nbytes = s_q * topk * d_qk * 2 + s_q * h_q * (d_qk + 512) * 2
            out = torch.empty(s_q, h_q, 512, dtype=torch.bfloat16, device=DEV)
            ml = torch.empty(s_q, h_q, device=DEV)
            lse = torch.empty(s_q, h_q, device=DEV)
            rows_chk = torch.tensor([0, 1, s_q // 2, s_q - 1], device=DEV)
            ro, _, rlse = sparse_prefill_ref(q[rows_chk], kv, ind[rows_chk], 0.5, 512, sk)
            if rounds:
                _paired_rounds(rows, configs, rounds, paired_base, out, ml, lse, q, kv, ind, sk, rows_chk, ro, rlse,
                               dict(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, sink=sink), flops, nbytes)
                del q, kv, ind
                torch.cuda.empty_cache()
                continue
            for cfg in configs:
                shape = dict(s_q=s_q, s_kv=s_kv, h_q=h_q, d_qk=d_qk, topk=topk, sink=sink)
                try:
                    launch = _launch_cfg(cfg)
                    fn = lambda: launch(out, ml, lse, q, kv, ind, 0.5, sk, None)  # noqa: E731
                    fn()
                    _sync()
                    err = (out[rows_chk].float() - ro).abs().max().item()
                    lerr = (lse[rows_chk] - rlse).abs().max().item()
                    ms = bench(fn)
                    tf = flops / ms / 1e9
                    rows.add(op="flash_mla_sparse_fwd", provider="deepkernels",
                             config=cfg if isinstance(cfg, str) else list(cfg), shape=shape, median_us=ms * 1e3, tflops=tf, gbps=nbytes / ms / 1e6, max_abs_err_rows=err,
                             lse_err_rows=lse_err_fmt(lerr), anchor="FlashMLA H200 (ANCHORS.md, no sink)",
                             anchor_tflops=FLASHMLA_H200.get(s_kv),
                             ratio_to_anchor=tf / FLASHMLA_H200[s_kv] if s_kv in FLASHMLA_H200 else None,
                             target_tflops=SPARSE_TARGET, default=cfg == SPARSE_CONFIGS[h_q])
                except Exception as e:  # noqa: BLE001
                    rows.add(op="flash_mla_sparse_fwd", provider="deepkernels",
                             config=cfg if isinstance(cfg, str) else list(cfg), shape=shape, error=repr(e)[:300])
            del q, kv, ind
            torch.cuda.empty_cache()


def _paired_rounds(rows, configs, rounds, base, out, ml, lse, q, kv, ind, sk, rows_chk, ro, rlse, shape, flops,
                   nbytes):
    """Rotated rounds (benchmarks/sparse_decode_rowlanes.py's method; the H200's clock drifts +-10 % over a run): each
    config checked once (NaN-poisoned outputs, error on 4 rows, bit identity of out / lse / max_logits against
    ``base``), then ``rounds`` rounds each timing every config (do_bench median, warmup 10, rep 60 ms) in an order
    rotated by one per round; per config the median over rounds, and the median of the PAIRED ratios t / t_base of
    the same round (< 1: faster than ``base``). One row per config."""
    fns, err, res = {}, {}, {}
    for cfg in configs:
        try:
            launch = _launch_cfg(cfg)
            fn = (lambda f=launch: f(out, ml, lse, q, kv, ind, 0.5, sk, None))
            for t in (out, ml, lse):
                t.fill_(float("nan"))
            fn()
            _sync()
            res[cfg] = (out.clone(), ml.clone(), lse.clone())
            err[cfg] = ((out[rows_chk].float() - ro).abs().max().item(), (lse[rows_chk] - rlse).abs().max().item(),
                        bool(torch.isnan(out).any() or torch.isnan(lse).any()))
            fns[cfg] = fn
        except Exception as e:  # noqa: BLE001
            rows.add(op="flash_mla_sparse_fwd", provider="deepkernels",
                     config=cfg if isinstance(cfg, str) else list(cfg), shape=shape, error=repr(e)[:300])
    if DEV == "cuda":
        import triton.testing
        timer = lambda f: triton.testing.do_bench(f, warmup=10, rep=60, return_mode="median")  # noqa: E731
    else:
        timer = bench
    times = time_rotated(fns, rounds, timer)
    stats = round_stats(times, base)
    for n in times:
        ms = stats[n]["ms"]
        row = dict(op="flash_mla_sparse_fwd", provider="deepkernels", config=n if isinstance(n, str) else list(n),
                   shape=shape, median_us=ms * 1e3, tflops=flops / ms / 1e9, gbps=nbytes / ms / 1e6,
                   max_abs_err_rows=err[n][0], lse_err_rows=lse_err_fmt(err[n][1]), nan=err[n][2], rounds=rounds,
                   ms_rounds=times[n], anchor="FlashMLA H200 (ANCHORS.md, no sink)",
                   anchor_tflops=FLASHMLA_H200.get(shape["s_kv"]),
                   ratio_to_anchor=(flops / ms / 1e9) / FLASHMLA_H200[shape["s_kv"]] if shape["s_kv"] in FLASHMLA_H200
                   else None, target_tflops=SPARSE_TARGET)
        if base in times and n != base:
            row.update(paired_base=base, paired_ratios=stats[n]["paired_time_ratios"],
                       paired_median=stats[n]["paired_time_ratio_median"],
                       bit_identical_to_base=all(torch.equal(x, y) for x, y in zip(res[n], res[base])))
        rows.add(**row)


def lse_err_fmt(x):
    return float(x)


def run_dense(rows, sweep, seqs, h=128, gluon=False):
    import torch.nn.functional as F
    b = 2
    for s in seqs:
        for d_qk, d_v in ((192, 128), (128, 128)):
            q = torch.randn(b * s, h, d_qk, device=DEV).bfloat16()
            k = torch.randn(b * s, h, d_qk, device=DEV).bfloat16()
            v = torch.randn(b * s, h, d_v, device=DEV).bfloat16()
            cu = torch.arange(0, b + 1, device=DEV, dtype=torch.int32) * s
            qs, ks, vs = (t.view(b, s, h, -1).transpose(1, 2) for t in (q, k, v))   # SDPA [b, h, s, d] views
            configs = DENSE_CANDIDATES[d_qk] if sweep else [DENSE_CONFIGS[d_qk]]
            if gluon:   # the Gluon kernel (mla/_gluon_dense_prefill.py; results before its removal of the first
                # Gluon kernel and of "pingpong" label it "gluon-v2-overlap", and "gluon" is the first kernel there)
                configs = configs + ["gluon"]
            for causal in (False, True):
                flops = 2 * b * h * s * s * (d_qk + d_v) * (0.5 if causal else 1.0)
                shape = dict(b=b, s=s, h=h, d_qk=d_qk, d_v=d_v, causal=causal)
                sd_ms = None
                try:
                    sd = lambda: F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)  # noqa: E731
                    ref = sd()
                    sd_ms = bench(sd)
                    rows.add(op="dense_prefill", provider="torch_sdpa", shape=shape, median_us=sd_ms * 1e3,
                             tflops=flops / sd_ms / 1e9)
                except Exception as e:  # noqa: BLE001
                    ref = None
                    rows.add(op="dense_prefill", provider="torch_sdpa", shape=shape, error=repr(e)[:300])
                out = torch.empty(b * s, h, d_v, dtype=torch.bfloat16, device=DEV)
                lse = torch.empty(h, b * s, device=DEV)
                for cfg in configs:
                    try:
                        if cfg == "gluon":      # the Gluon kernel dispatched on sm90 (mla/_gluon_dense_prefill.py)
                            fn = lambda: _gdp.launch_dense_prefill_gluon(out, lse, q, k, v, cu, cu, s,  # noqa: E731
                                                                         d_qk ** -0.5, causal)
                        else:
                            fn = lambda: _launch_dense_prefill(out, lse, q, k, v, cu, cu, s, d_qk ** -0.5,  # noqa
                                                               causal, config=cfg)
                        out.fill_(float("nan"))     # a kernel that writes nothing must not pass on the last output
                        fn()
                        _sync()
                        diff = None
                        if ref is not None:
                            r = ref.transpose(1, 2).reshape(b * s, h, d_v).float()
                            o = out.float()
                            diff = (1 - 2 * (o * r).sum() / (o * o + r * r).sum()).item()
                        ms = bench(fn)
                        tf = flops / ms / 1e9
                        rows.add(op="dense_prefill", provider="deepkernels",
                                 config=cfg if isinstance(cfg, str) else list(cfg), shape=shape,
                                 median_us=ms * 1e3, tflops=tf, calc_diff_vs_sdpa=diff,
                                 ratio_to_anchor=(sd_ms / ms) if sd_ms else None, anchor="torch_sdpa (same run)",
                                 target_ratio=SDPA_TARGET, default=cfg == DENSE_CONFIGS[d_qk])
                    except Exception as e:  # noqa: BLE001
                        rows.add(op="dense_prefill", provider="deepkernels",
                                 config=cfg if isinstance(cfg, str) else list(cfg), shape=shape, error=repr(e)[:300])
            del q, k, v
            torch.cuda.empty_cache()


def summary(rows):
    print("\n=== summary (best config per shape) ===")
    best = {}
    for r in rows:
        if "tflops" not in r:
            continue
        key = (r["op"], r["provider"], json.dumps(r["shape"], sort_keys=True))
        if key not in best or r["tflops"] > best[key]["tflops"]:
            best[key] = r
    for (op, prov, shp), r in sorted(best.items()):
        extra = ""
        if r.get("ratio_to_anchor") is not None:
            extra = f" x{r['ratio_to_anchor']:.2f} vs {r.get('anchor', '')}"
        print(f"{op:22s} {prov:12s} {shp:90s} {r['tflops']:7.1f} TFLOPS {r['median_us']:9.1f} us "
              f"cfg={r.get('config')}{extra}")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sweep", action="store_true", help="time every candidate config, not only the default")
    ap.add_argument("--out", default=None, help="JSON output path")
    ap.add_argument("--only", choices=["sparse", "dense"], default=None)
    ap.add_argument("--quick", action="store_true", help="smallest shapes only")
    ap.add_argument("--gluon", action="store_true", help="also time the Gluon kernels (sm90 only)")
    ap.add_argument("--gluon-skip", default="", help="comma-separated Gluon sparse labels not to time "
                    "(e.g. gluon-ws; labels that do not exist, such as the removed gluon-ws2-ov, are ignored)")
    ap.add_argument("--gluon-add", default="", help="comma-separated opt-in Gluon sparse labels to time as well "
                    f"(of {', '.join(GLUON_OPT_IN)})")
    ap.add_argument("--s-kv", default="", help="comma-separated sparse s_kv values (default: 8K/32K/64K/128K)")
    ap.add_argument("--rounds", type=int, default=0, help="sparse: time the configs in this many rotated rounds with "
                    "paired ratios against --paired-base (0: one do_bench per config, the old mode)")
    ap.add_argument("--paired-base", default="gluon-ws2", help="config label the paired ratios divide by")
    ap.add_argument("--sink", default="off,on", help="sparse: comma-separated sink settings (off, on)")
    ap.add_argument("--no-triton", action="store_true", help="sparse: skip the Triton config (Gluon labels only)")
    ap.add_argument("--qasync", action="store_true",
                    help="sparse only: the paired A/B of WS2's q_async -- gluon-ws2 (base), gluon-ws2-aa (A/A), "
                    "gluon-ws2-qa in --rounds (default: 6, or 5 with --ostage) rotated rounds, no Triton config, "
                    "s_kv default 8K-128K")
    ap.add_argument("--ostage", action="store_true",
                    help="as --qasync for WS2's o_stage (gluon-ws2-os); both flags: also gluon-ws2-qa-os")
    ap.add_argument("--cpu-smoke", action="store_true",
                    help="tiny shapes on the CPU (run with TRITON_INTERPRET=1) to check the script itself")
    args = ap.parse_args(argv)
    if args.qasync or args.ostage:     # only these labels, paired against the default WS2 launch
        labels = _ab_labels(args.qasync, args.ostage)
        args.only, args.gluon, args.no_triton, args.paired_base = "sparse", True, True, "gluon-ws2"
        args.gluon_skip = ",".join(c for c in GLUON_SPARSE if c not in labels)
        args.gluon_add = ",".join(labels)
        args.rounds = args.rounds or (6 if len(labels) == 3 else 5)   # a multiple of the variant count
    global DEV
    if args.cpu_smoke:
        DEV = "cpu"
        rows = Rows(args.out, provenance())
        run_sparse(rows, args.sweep, [96], s_q=2, topk=64, rounds=args.rounds)
        run_dense(rows, args.sweep, [32], h=2)
        summary(rows.rows)
        return 0
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to time (the CPU path is the PyTorch reference)")
        return 0
    rows = Rows(args.out, provenance())
    print(json.dumps(rows.prov), flush=True)
    if args.only in (None, "sparse"):
        s_kvs = [int(x) for x in args.s_kv.split(",")] if args.s_kv else (
            [8192] if args.quick else [8192, 32768, 65536, 131072])
        skip = tuple(c for c in args.gluon_skip.split(",") if c)
        add = tuple(c for c in args.gluon_add.split(",") if c)
        unknown = sorted(set(skip + add) - set(GLUON_SPARSE))
        if unknown:     # e.g. gluon-ws2-ov in an older device script's --gluon-skip (label removed in session 18)
            print(f"note: ignoring unknown Gluon sparse labels {unknown}", flush=True)
        run_sparse(rows, args.sweep, s_kvs, gluon=args.gluon, gluon_skip=skip, gluon_add=add, rounds=args.rounds,
                   paired_base=args.paired_base, sinks=tuple(x == "on" for x in args.sink.split(",") if x),
                   skip_triton=args.no_triton)
    if args.only in (None, "dense"):
        run_dense(rows, args.sweep, [4096] if args.quick else [4096, 8192], gluon=args.gluon)
    summary(rows.rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
