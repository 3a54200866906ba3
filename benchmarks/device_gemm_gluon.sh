#!/usr/bin/env bash
# One device step for the experimental Gluon sm90 FP8 GEMM (src/deepkernels/gemm/_gluon_fp8.py), repo root:
#   GIT_SHA=<sha> bash benchmarks/device_gemm_gluon.sh
# 1. env, 2. Gluon GPU + compile tests (no -x; every failure listed), 3. timing of every Gluon candidate vs the
# current Triton default (dense.fp8_gemm_nt) vs cuBLAS blockwise (torch._scaled_mm) on the 6 M=4096 shapes,
# whole call and CUDA-graph replay, JSON to $OUT/gemm_gluon.json, short table last. Each step has its own cap
# (defaults sum to ~100 s) and none stops the others (a hung mbarrier is killed by its timeout).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gemm_gluon_out}
mkdir -p "$OUT"
T_TESTS=${T_TESTS:-45}
T_BENCH=${T_BENCH:-50}

{
  echo "== env"; date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv 2>&1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" 2>&1
  python3 -c "from deepkernels.gemm import _gluon_fp8 as G; print('gluon available', G.available(), G._IMPORT_ERROR)" 2>&1
  echo "GIT_SHA=${GIT_SHA:-unknown}"
} > "$OUT/gluon_env.log" 2>&1
cat "$OUT/gluon_env.log"

echo "== gluon tests (cap ${T_TESTS}s)"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=30"
timeout -k 5 "$T_TESTS" python3 -m pytest tests/test_gemm_gluon.py -q -rf -p no:cacheprovider $TO \
  > "$OUT/gluon_tests.log" 2>&1
echo "gluon tests rc=$?" | tee -a "$OUT/gluon_tests.log"
grep -E "^FAILED|^ERROR|passed|failed|error" "$OUT/gluon_tests.log" | tail -30

echo "== gluon bench (cap ${T_BENCH}s)"
timeout -k 5 "$T_BENCH" python3 benchmarks/gemm_gluon.py --out "$OUT/gemm_gluon.json" --budget-s $((T_BENCH - 12)) \
  > "$OUT/gluon_bench.log" 2>&1
echo "gluon bench rc=$?" | tee -a "$OUT/gluon_bench.log"
sed -n '/^us (whole call/,$p' "$OUT/gluon_bench.log" | head -70
[ -s "$OUT/gemm_gluon.json" ] || { echo "no gemm_gluon.json; bench log tail:"; tail -20 "$OUT/gluon_bench.log"; }
exit 0
