#!/usr/bin/env bash
# Device run for the warp-specialised Gluon sparse MLA decode kernel: V3.2 and V4.1 main caches WITH AN EXTRA CACHE
# (V4.1 + FP4, V3.2 + V3.2, V4.1 + V4.1; implemented, not dispatched: DISPATCH_EXTRA) and, as a sanity check, without
# (src/deepkernels/mla/_gluon_sparse_decode_ws.py; issue #6), one call, <= ~170 s, from the repo root on the H200:
#   GIT_SHA=<sha> OUT=<dir> bash benchmarks/device_sparse_decode_ws.sh
# 0. background: compile the benchmark's kernels (Triton, Gluon, WS; disk cache) while the tests run;
# 1. smoke / hang guard: the WS exact-dequant GPU tests (V3.2, V4.1; extra: FP4 beside V4.1, V3.2 beside V3.2) under
#    pytest-timeout (an mbarrier hang must not eat the budget);
# 2. GPU tier of tests/test_mla_sparse_decode_ws.py: the extra-cache tests (-k extra; WS vs the PyTorch reference with
#    FlashMLA's tolerances AND bit-identical to the single-partition Gluon kernel), xdist -n 4 if importable; then the
#    no-extra tests (their PTX is byte-identical to the build measured before: a regression check) when at most
#    80 s have passed (NOEXTRA_TESTS=1: always, 0: never);
# 3. bench: Triton launch vs single-partition Gluon vs WS, same schedule (combine included in all three):
#    V4.1 + FP4 (h_q 128/64, b 64/128, s_q 1/2) and V3.2 + V3.2 (h_q 128) with topk 2048 + extra 512 (as
#    `deepkernels bench`), s_k 8192 + 2048 per request, then V4.1 / V3.2 without extra (one row each: no change
#    expected); FlashMLA FLOPs 2 h_q b s_q (topk + extra_topk) (d_qk + 512), do_bench medians; WS checked
#    bit-identical to Gluon per row -> JSON + summary (ROWS="v41+fp4 v32+v32 v41 v32": which rows; WS_FENCE_COL=1:
#    also the WS kernel with the producer-side proxy fence).
# Caps (seconds, overridable): T_SMOKE 45, T_TESTS 70, T_TESTS2 40, T_WARM 60 (parallel with the tests), T_BENCH 50
# (the first WS run of this script: smoke 22 s, 18 GPU tests 27 s on 4 workers, 8 bench rows ~8 s).
# Skips the WS timing when the smoke test hung (rc 124/137).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
export GIT_SHA="${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
OUT=${OUT:-/tmp/sparse_decode_ws_out}
mkdir -p "$OUT"
unset TRITON_INTERPRET
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; python3 -c \
  "import torch, triton; print(torch.__version__, triton.__version__)"; echo "GIT_SHA=$GIT_SHA"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

BENCH=$(cat <<'PY'
import json, os, sys
import torch
sys.path.insert(0, "benchmarks"); sys.path.insert(0, "tests")
import mla_sparse_decode as B                       # make_cache, make_indices, provenance, FLASHMLA_V32
import deepkernels.mla.sparse_decode as sd
from deepkernels.mla import _gluon_sparse_decode as G
from deepkernels.mla import _gluon_sparse_decode_ws as W
from deepkernels.mla.metadata import compute_schedule
from triton.testing import do_bench

warm = sys.argv[1] == "--warm"
path = None if warm else sys.argv[1]
skip_ws = os.environ.get("SKIP_WS") == "1"
fence_col = os.environ.get("WS_FENCE_COL", "0") == "1"
prov = B.provenance()
prov["note"] = ("triton = sparse_decode._launch_sparse_decode (table config), gluon = "
                "_gluon_sparse_decode.launch_sparse_decode_gluon (single-partition kernel), ws = "
                "_gluon_sparse_decode_ws.launch_sparse_decode_gluon_ws (maxnreg %d, producer regs per row); same "
                "schedule, combine and allocations included in all; FLOPs 2*h_q*b*s_q*(topk+extra_topk)*(d_qk+512), "
                "d_qk 576 (v32) / 512 (v41); extra cache: its own cache and indices, extra_topk of xs_k tokens per "
                "request" % W.WS_MAXNREG)
rows = []
S_K = int(os.environ.get("S_K", "8192"))
XS_K = int(os.environ.get("XS_K", "2048"))
TOPK = 2048
XTOPK = int(os.environ.get("XTOPK", "512"))
SPECS = os.environ.get("ROWS", "v41+fp4 v32+v32 v41 v32").split()
prov["ws_producer_regs"] = {s: W._producer_regs(*(s.split("+") + [None])[:2]) for s in SPECS}
prov["ws_dispatch_fmts"] = sorted(W.DISPATCH_FMTS)
prov["ws_dispatch_extra"] = W.DISPATCH_EXTRA
def grid(spec):
    if spec == "v41+fp4":
        return [(b, s_q, h_q) for b in (64, 128) for h_q in (128, 64) for s_q in (1, 2)]
    if "+" in spec:
        return [(b, s_q, 128) for b in (64, 128) for s_q in (1, 2)]
    return [(128, 1, 128)]
shapes = [(spec, b, s_q, h_q) for spec in SPECS for b, s_q, h_q in grid(spec)]
if warm:
    shapes = [(spec, 2, s_q, h_q) for spec in SPECS for s_q in (1, 2) for h_q in (128, 64)]
else:
    x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    for _ in range(300):
        x @ x
    del x
caches = {}
for spec, b, s_q, h_q in shapes:
    try:
        fmt, _, xfmt = spec.partition("+")
        xfmt = xfmt or None
        xtopk = XTOPK if xfmt else 0
        d_qk = 576 if fmt == "v32" else 512
        s_k, xs_k = (S_K, XS_K) if not warm else (2048, 1024)
        if (spec, b) not in caches:
            caches.clear(); torch.cuda.empty_cache()
            caches[(spec, b)] = (B.make_cache(fmt, b * s_k, "cuda"), B.make_cache(xfmt, b * xs_k, "cuda") if xfmt else None)
        cache, xcache = caches[(spec, b)]
        q = torch.randn(b, s_q, h_q, d_qk, device="cuda").clamp_(-1, 1).bfloat16()
        ind = B.make_indices(b, s_q, TOPK, s_k, "cuda")
        xind = B.make_indices(b, s_q, xtopk, xs_k, "cuda") if xfmt else None
        scale = d_qk ** -0.5
        cfg = sd.sparse_decode_config(h_q, fmt)
        parts = sd._num_sm_parts(q.device, s_q, h_q, cfg)
        sched, ns = compute_schedule(sd._token_counts(b, TOPK, None, xtopk, None, xfmt is not None, q.device), parts)
        outs = {k: (torch.empty(b, s_q, h_q, 512, dtype=torch.bfloat16, device="cuda"),
                    torch.empty(b, s_q, h_q, device="cuda")) for k in ("triton", "gluon", "ws")}
        assert G.supported(q, cache, fmt, xcache) and W.supported_ws(q, cache, fmt, xcache)
        xa = (None, xcache, xind, xfmt)          # attn_sink, extra_k_cache, extra_indices, xfmt
        fns = {"triton": lambda: sd._launch_sparse_decode(*outs["triton"], q, cache, ind, sched, ns, scale, fmt, *xa,
                                                          config=cfg),
               "gluon": lambda: G.launch_sparse_decode_gluon(*outs["gluon"], q, cache, ind, sched, ns, scale, fmt, *xa),
               "ws": lambda: W.launch_sparse_decode_gluon_ws(*outs["ws"], q, cache, ind, sched, ns, scale, fmt, *xa)}
        if fence_col:     # the same kernel with the producer-side proxy fence too (a correctness knob): its cost
            outs["ws_fence"] = tuple(torch.empty_like(t) for t in outs["ws"])
            fns["ws_fence"] = lambda: W.launch_sparse_decode_gluon_ws(*outs["ws_fence"], q, cache, ind, sched, ns,
                                                                      scale, fmt, *xa, producer_fence=True)
        if skip_ws:
            fns.pop("ws"); fns.pop("ws_fence", None)
        for f in fns.values():
            f()
        torch.cuda.synchronize()
        if warm:
            print("warm", spec, s_q, h_q, flush=True); continue
        flop = 2 * h_q * b * s_q * (TOPK + xtopk) * (d_qk + 512)
        row = dict(fmt=fmt, xfmt=xfmt, spec=spec, b=b, s_q=s_q, h_q=h_q, topk=TOPK, extra_topk=xtopk, s_k=S_K,
                   xs_k=XS_K if xfmt else None, page=B.PAGE, parts=parts, num_splits=int(ns[-1]), flop=flop,
                   ws_producer_regs=W._producer_regs(fmt, xfmt),
                   flashmla_v32_tflops=B.FLASHMLA_V32.get((h_q, b, s_q)) if spec == "v32" else None)
        if "ws" in fns:
            row["ws_bit_identical_to_gluon"] = bool(torch.equal(outs["ws"][0], outs["gluon"][0]) and
                                                    torch.equal(outs["ws"][1], outs["gluon"][1]))
            row["ws_max_abs_diff_vs_triton"] = float((outs["ws"][0].float() - outs["triton"][0].float()).abs().max())
            row["ws_nan"] = bool(outs["ws"][0].isnan().any())
        if "ws_fence" in fns:
            row["ws_fence_bit_identical_to_gluon"] = bool(torch.equal(outs["ws_fence"][0], outs["gluon"][0]) and
                                                          torch.equal(outs["ws_fence"][1], outs["gluon"][1]))
        for k, f in fns.items():
            ms = do_bench(f, warmup=5, rep=30)
            row[k + "_ms"] = ms
            row[k + "_tflops"] = flop / ms / 1e9
        if "ws" in fns:
            ms2 = do_bench(fns["ws"], warmup=2, rep=30)               # again: run-to-run noise
            row["ws_ms_repeat"], row["ws_tflops_repeat"] = ms2, flop / ms2 / 1e9
            row["ws_vs_gluon"] = row["gluon_ms"] / row["ws_ms"]
            row["ws_vs_triton"] = row["triton_ms"] / row["ws_ms"]
        rows.append(row)
        print(json.dumps({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
    except Exception as e:  # noqa: BLE001
        print(f"FAILED {spec} b={b} s_q={s_q} h_q={h_q}: {type(e).__name__}: {str(e)[:300]}", flush=True)
    if path:
        json.dump(dict(provenance=prov, rows=rows), open(path, "w"), indent=1)
if path:
    print("=== summary (TFLOPS, FlashMLA counting)")
    for r in rows:
        print("%-8s h_q=%3d b=%3d s_q=%d  triton %6.1f  gluon %6.1f  ws %s  ws/gluon %s  bit-identical %s  "
              "ws+fence %s (bit-identical %s)  (FlashMLA %s)" % (
                  r["spec"], r["h_q"], r["b"], r["s_q"], r["triton_tflops"], r["gluon_tflops"],
                  "%6.1f" % r["ws_tflops"] if "ws_tflops" in r else "   n/a",
                  "%.3f" % r["ws_vs_gluon"] if "ws_vs_gluon" in r else "n/a", r.get("ws_bit_identical_to_gluon"),
                  "%6.1f" % r["ws_fence_tflops"] if "ws_fence_tflops" in r else "   n/a",
                  r.get("ws_fence_bit_identical_to_gluon"), r["flashmla_v32_tflops"]))
PY
)

TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=60"   # mbarrier ring: a hang must fail fast
PT="python3 -m pytest -p no:cacheprovider --tb=short -rfE -q $TO"

echo "== smoke (hang guard): WS exact dequant + bit-identical to Gluon (V3.2, V4.1; extra FP4, extra V3.2)"
timeout -k 5 ${T_SMOKE:-45} $PT tests/test_mla_sparse_decode_ws.py -m gpu -k "dequant_exact" > "$OUT/smoke.log" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE ($(el))"; tail -25 "$OUT/smoke.log" | cut -c1-400
HUNG=0
if [ "$SMOKE" -eq 124 ] || [ "$SMOKE" -eq 137 ] || grep -q "Timeout" "$OUT/smoke.log"; then
  HUNG=1; echo "WS SMOKE TIMED OUT (hang or compile): skipping the WS GPU tier and the WS timing"
fi

echo "== background warm-up compile of the bench kernels"
if [ "$HUNG" -eq 1 ]; then export SKIP_WS=1; fi
timeout -k 5 ${T_WARM:-60} python3 -c "$BENCH" --warm > "$OUT/warm.log" 2>&1 &
WARM=$!

if [ "$HUNG" -eq 0 ]; then
  echo "== WS GPU tier: extra caches"
  XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n 4"
  timeout -k 5 ${T_TESTS:-70} $PT tests/test_mla_sparse_decode_ws.py -m gpu -k "extra and not dequant_exact" $XD \
    > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests rc=$? ($(el))"; grep -E "FAILED|ERROR|passed|failed|Timeout" "$OUT/gpu_tests.log" | tail -25 | cut -c1-400
  NE=${NOEXTRA_TESTS:-auto}
  if [ "$NE" = "1" ] || { [ "$NE" = "auto" ] && [ $(( $(date +%s) - T0 )) -le 80 ]; }; then
    echo "== WS GPU tier: no extra cache"
    timeout -k 5 ${T_TESTS2:-40} $PT tests/test_mla_sparse_decode_ws.py -m gpu -k "not extra and not dequant_exact" $XD \
      > "$OUT/gpu_tests_noextra.log" 2>&1
    echo "gpu tests (no extra) rc=$? ($(el))"; grep -E "FAILED|ERROR|passed|failed|Timeout" "$OUT/gpu_tests_noextra.log" | tail -15 | cut -c1-400
  fi
fi
wait $WARM 2>/dev/null; echo "warm rc=$? ($(el))"; tail -3 "$OUT/warm.log" | cut -c1-300

echo "== bench: Triton vs Gluon vs WS (V4.1 + FP4, V3.2 + V3.2: topk 2048 + extra 512; V4.1, V3.2: topk 2048)"
timeout -k 5 ${T_BENCH:-50} python3 -c "$BENCH" "$OUT/sparse_decode_ws-h200.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$? ($(el))"
grep -v "^{" "$OUT/bench.log" | cut -c1-300
echo "total $(el)"
exit 0
