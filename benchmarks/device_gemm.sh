#!/usr/bin/env bash
# One device call for the dense GEMMs (run from the repo root on the H200 machine):
#   GIT_SHA=<sha> bash benchmarks/device_gemm.sh
# 1. environment, 2. GPU tests of tests/test_gemm*.py, 3. candidate-config sweep over the 18 DeepSeek-V3 shapes
# with the in-run anchors (cuBLAS blockwise via torch._scaled_mm, torch.matmul for BF16), JSON + logs under
# $OUT, 4. a short summary table last. No step stops the others; each has its own time cap.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gemm_out}
mkdir -p "$OUT"
T_TESTS=${T_TESTS:-95}
T_SWEEP=${T_SWEEP:-170}

{
  echo "== env"; date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'cuda', torch.version.cuda)"
  echo "GIT_SHA=${GIT_SHA:-unknown}"
} > "$OUT/env.log" 2>&1
cat "$OUT/env.log"

echo "== gpu tests (cap ${T_TESTS}s)"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=60"
timeout -k 5 "$T_TESTS" python3 -m pytest tests/test_gemm.py tests/test_gemm_reference.py tests/test_gemm_compile.py \
  -m gpu -x -v -p no:cacheprovider $TO > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$OUT/gpu_tests.log"
grep -E "passed|failed|error" "$OUT/gpu_tests.log" | tail -3

echo "== sweep (cap ${T_SWEEP}s)"
timeout -k 5 "$T_SWEEP" python3 benchmarks/gemm.py --sweep --bf16 --graph --out "$OUT/gemm-h200.json" > "$OUT/sweep.log" 2>&1
echo "sweep rc=$?" | tee -a "$OUT/sweep.log"

ls -la "$OUT"
echo "== summary"
python3 - "$OUT/gemm-h200.json" <<'EOF' 2>&1 | tee "$OUT/summary.txt"
import json, math, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    sys.exit(f"no JSON: {e}")
sys.path.insert(0, "benchmarks")
from gemm import summary, _geo
rows = r.get("fp8", [])
ratios = [x["ratio_vs_cublas"] for x in rows if x.get("ratio_vs_cublas")]
r["fp8_geomean_vs_cublas"] = _geo(ratios)
summary(r)
for x in r.get("bf16", []):
    print(f"bf16 {x['m']:5d} {x['n']:6d} {x['k']:6d} ours {x.get('tflops', float('nan')):7.1f} TF "
          f"torch {x['flops'] / x['torch_us'] / 1e6:7.1f} TF ratio {x.get('ratio_vs_torch', float('nan')):.2f} "
          f"[{x.get('best_config')}]")
EOF
