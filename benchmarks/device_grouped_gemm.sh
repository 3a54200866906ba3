#!/usr/bin/env bash
# One device call for the MoE grouped GEMMs (run from the repo root on the H200 machine):
#   PYTHONUNBUFFERED=1 PYTHONPATH=src bash benchmarks/device_grouped_gemm.sh
# 1. environment, 2. GPU tier of tests/test_grouped_gemm*.py (never the interpreter tier), 3. benchmark of
# DeepGEMM's published grouped configs + a DeepSeek-V3 MoE layer vs a per-group cuBLAS blockwise loop, JSON to
# $OUT/grouped_gemm.json, 4. a short summary table last. No step stops the others; each has its own time cap.
set -u
export PYTHONPATH=${PYTHONPATH:-src} PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
OUT=${OUT:-/tmp/grouped_gemm_out}
mkdir -p "$OUT"
T_TESTS=${T_TESTS:-300}
T_BENCH=${T_BENCH:-360}

{
  echo "== env"; date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'cuda', torch.version.cuda)"
  echo "GIT_SHA=${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
} > "$OUT/grouped_env.log" 2>&1
cat "$OUT/grouped_env.log"

echo "== grouped gemm gpu tests (cap ${T_TESTS}s)"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=120"
timeout -k 10 "$T_TESTS" python3 -m pytest tests/test_grouped_gemm*.py \
  -m gpu -q -x -p no:cacheprovider -rfE --durations=10 $TO > "$OUT/grouped_gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$OUT/grouped_gpu_tests.log"
grep -E "^(FAILED|ERROR)|passed|failed|error" "$OUT/grouped_gpu_tests.log" | tail -8

echo "== grouped gemm benchmark (cap ${T_BENCH}s)"
timeout -k 10 "$T_BENCH" python3 benchmarks/grouped_gemm.py --out "$OUT/grouped_gemm.json" > "$OUT/grouped_bench.log" 2>&1
echo "benchmark rc=$?" | tee -a "$OUT/grouped_bench.log"
tail -4 "$OUT/grouped_bench.log"

echo "== grouped gemm summary"
python3 benchmarks/grouped_gemm.py --summary "$OUT/grouped_gemm.json" 2>&1 | tee "$OUT/grouped_summary.txt" \
  || echo "no benchmark JSON (see $OUT/grouped_bench.log)"
grep -E "passed|failed" "$OUT/grouped_gpu_tests.log" | tail -1
