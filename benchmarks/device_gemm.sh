#!/usr/bin/env bash
# One device call for the dense GEMMs (run from the repo root on the H200 machine):
#   GIT_SHA=<sha> bash benchmarks/device_gemm.sh
# 1. environment, 2. parallel precompile of every candidate (shared Triton disk cache), 3. GPU tests of
# tests/test_gemm*.py (no -x: every failure is listed), 4. host-overhead probe + candidate sweep over the 18
# DeepSeek-V3 shapes, whole-call AND CUDA-graph-replay times for ours and cuBLAS / torch.matmul, JSON + logs
# under $OUT, 5. a short summary table last. No step stops the others; each has its own time cap
# (defaults sum to ~150 s).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gemm_out}
mkdir -p "$OUT"
T_PRE=${T_PRE:-45}
T_TESTS=${T_TESTS:-55}
T_SWEEP=${T_SWEEP:-130}
WORKERS=${WORKERS:-14}

{
  echo "== env"; date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'cuda', torch.version.cuda)"
  echo "GIT_SHA=${GIT_SHA:-unknown} nproc=$(nproc)"
} > "$OUT/env.log" 2>&1
cat "$OUT/env.log"

echo "== precompile (cap ${T_PRE}s, ${WORKERS} workers)"
timeout -k 5 "$T_PRE" python3 benchmarks/gemm.py --precompile "$WORKERS" --bf16 > "$OUT/precompile.log" 2>&1
echo "precompile rc=$?" | tee -a "$OUT/precompile.log"; tail -2 "$OUT/precompile.log"

echo "== gpu tests (cap ${T_TESTS}s)"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=40"
timeout -k 5 "$T_TESTS" python3 -m pytest tests/test_gemm.py tests/test_gemm_launch.py tests/test_gemm_reference.py \
  tests/test_gemm_compile.py -m gpu -q -rf -p no:cacheprovider $TO > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$OUT/gpu_tests.log"
grep -E "^FAILED|^ERROR|passed|failed|error" "$OUT/gpu_tests.log" | tail -25

echo "== host probe + sweep (cap ${T_SWEEP}s)"
timeout -k 5 "$T_SWEEP" python3 benchmarks/gemm.py --sweep --bf16 --graph --host --out "$OUT/gemm-h200.json" \
  > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?" | tee -a "$OUT/sweep.log"

ls -la "$OUT"
echo "== summary"
python3 - "$OUT/gemm-h200.json" <<'PYEOF' 2>&1 | tee "$OUT/summary.txt"
import json, math, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"no JSON: {e}")
sys.path.insert(0, "benchmarks")
from gemm import summary, _geo
rows = r.get("fp8", [])
r["fp8_geomean_vs_cublas"] = _geo([x["ratio_vs_cublas"] for x in rows if x.get("ratio_vs_cublas")])
r["fp8_graph_geomean_vs_cublas"] = _geo([x["graph_ratio_vs_cublas"] for x in rows if x.get("graph_ratio_vs_cublas")])
summary(r)
for x in r.get("bf16", []):
    print(f"bf16 {x['m']:5d} {x['n']:6d} {x['k']:6d} ours {x.get('tflops', float('nan')):7.1f} TF "
          f"torch {x['flops'] / x['torch_us'] / 1e6:7.1f} TF ratio {x.get('ratio_vs_torch', float('nan')):.2f} "
          f"[{x.get('best_config')}] torch graph {x.get('torch_graph_us') or float('nan'):.1f} us")
# per-variant view: best whole-call us of each kind of candidate per shape (ws / flatten / plain)
print("\nFP8 per-variant best whole-call us (graph us):")
for x in rows:
    best = {}
    for e in x.get("sweep", []):
        if not e.get("us"):
            continue
        c = e["cfg"]
        kind = "ws" if c.get("warp_spec") else ("fl" if c.get("flatten") else "plain")
        if kind not in best or e["us"] < best[kind][0]:
            best[kind] = (e["us"], e.get("graph_us"), e["config"])
    print(f"{x['m']:5d} {x['n']:6d} {x['k']:6d} " + "  ".join(
        f"{k}: {v[0]:.1f} ({(v[1] or float('nan')):.1f}) {v[2]}" for k, v in sorted(best.items())))
PYEOF
