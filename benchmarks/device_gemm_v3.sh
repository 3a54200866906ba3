#!/usr/bin/env bash
# One device call for the v3 GEMM work (repo root on the H200):  GIT_SHA=<sha> bash benchmarks/device_gemm_v3.sh
# 1. env; 2. Gluon dense GPU tests (new prefetch / 128x256 candidates); 3. grouped GPU tests (host fast path,
# Gluon m-grouped contiguous kernel, all earlier grouped GPU tests); 4. Gluon dense sweep vs Triton default vs cuBLAS
# (M = 4096 shapes); 5. grouped benchmark (whole call + CUDA graph, Gluon contiguous direct + public dispatch) vs
# the per-group cuBLAS loop. Each step has its own cap (no step stops the others); JSON + logs to $OUT.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
OUT=${OUT:-/tmp/gemm_v3_out}
mkdir -p "$OUT"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=40"
{
  echo "== env"; date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "GIT_SHA=${GIT_SHA:-unknown}"
} > "$OUT/v3_env.log" 2>&1
cat "$OUT/v3_env.log"

echo "== gluon dense gpu tests (cap ${T_GT:-45}s)"
timeout -k 5 "${T_GT:-45}" python3 -m pytest tests/test_gemm_gluon.py -m gpu -q -rf -p no:cacheprovider $TO \
  > "$OUT/v3_gluon_tests.log" 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/v3_gluon_tests.log" | tail -12

echo "== grouped gpu tests (cap ${T_GG:-70}s)"
timeout -k 5 "${T_GG:-70}" python3 -m pytest tests/test_grouped_gemm_gpu.py -m gpu -q -rf -p no:cacheprovider $TO \
  --durations=5 > "$OUT/v3_grouped_tests.log" 2>&1
echo "rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/v3_grouped_tests.log" | tail -12

echo "== gluon dense sweep (cap ${T_GB:-50}s)"
timeout -k 5 "${T_GB:-50}" python3 benchmarks/gemm_gluon.py --out "$OUT/gemm_gluon-v3.json" --budget-s $(( ${T_GB:-50} - 10 )) \
  > "$OUT/v3_gluon_bench.log" 2>&1
echo "rc=$?"; sed -n '/^us (whole call/,$p' "$OUT/v3_gluon_bench.log" | head -40

echo "== grouped bench (cap ${T_GR:-90}s)"
timeout -k 5 "${T_GR:-90}" python3 benchmarks/grouped_gemm.py --out "$OUT/grouped_gemm-v3.json" \
  > "$OUT/v3_grouped_bench.log" 2>&1
echo "rc=$?"
python3 benchmarks/grouped_gemm.py --summary "$OUT/grouped_gemm-v3.json" 2>&1 | tail -40
exit 0
