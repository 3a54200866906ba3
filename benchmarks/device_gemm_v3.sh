#!/usr/bin/env bash
# One device call for the v3 GEMM work (repo root on the H200):  GIT_SHA=<sha> bash benchmarks/device_gemm_v3.sh
# 1. env; 2. Gluon dense GPU tests (new prefetch / 128x256 candidates); 3. grouped GPU tests (host fast path and
# the Gluon m-grouped contiguous kernel first, then every earlier grouped GPU test); 4. Gluon dense sweep vs the
# Triton table config vs the public default vs cuBLAS (M = 4096 shapes); 5. grouped benchmark (whole call + CUDA
# graph; Gluon contiguous direct + public dispatch only if its tests passed) vs the per-group cuBLAS loop.
# Each step has its own cap (no step stops the others). $OUT: v3_tests.log, v3_bench.log and three JSONs (<= 8 files).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
OUT=${OUT:-/tmp/gemm_v3_out}
mkdir -p "$OUT"
T=$OUT/v3_tests.log
BL=$OUT/v3_bench.log
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=40"
{
  echo "== env"; date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda)"
  echo "GIT_SHA=${GIT_SHA:-unknown}"
} 2>&1 | tee "$T"

step() {  # step NAME CAP LOGFILE cmd...
  local name=$1 cap=$2 log=$3; shift 3
  echo "== $name (cap ${cap}s)" | tee -a "$log"
  timeout -k 5 "$cap" "$@" > /tmp/v3_step.log 2>&1
  local rc=$?
  cat /tmp/v3_step.log >> "$log"; echo "rc=$rc" | tee -a "$log"
  return $rc
}

step "gluon dense gpu tests" "${T_GT:-40}" "$T" python3 -m pytest tests/test_gemm_gluon.py -m gpu -q -rf \
  -p no:cacheprovider $TO
grep -E "^FAILED|^ERROR|passed|failed" /tmp/v3_step.log | tail -12

step "grouped gpu tests, new" "${T_GN:-35}" "$T" python3 -m pytest tests/test_grouped_gemm_gpu.py -m gpu \
  -k "gluon or fast_launch" -q -rf -p no:cacheprovider $TO
RC_NEW=$?
grep -E "^FAILED|^ERROR|passed|failed" /tmp/v3_step.log | tail -14
GLUON_OK=0
if [ $RC_NEW -eq 0 ] || { [ $RC_NEW -eq 1 ] && ! grep -q "^FAILED.*gluon" /tmp/v3_step.log; }; then GLUON_OK=1; fi
echo "gluon contiguous passed its tests: $GLUON_OK" | tee -a "$T"

step "grouped gpu tests, earlier" "${T_GG:-40}" "$T" python3 -m pytest tests/test_grouped_gemm_gpu.py -m gpu \
  -k "not gluon and not fast_launch" -q -rf -p no:cacheprovider $TO --durations=5
grep -E "^FAILED|^ERROR|passed|failed" /tmp/v3_step.log | tail -8

step "gluon dense sweep" "${T_GB:-50}" "$BL" python3 benchmarks/gemm_gluon.py --out "$OUT/gemm_gluon-v3.json" \
  --budget-s $(( ${T_GB:-50} - 10 ))
sed -n '/^us (whole call/,$p' /tmp/v3_step.log | head -60

step "grouped bench: masked" "${T_GM:-30}" "$BL" python3 benchmarks/grouped_gemm.py --only masked \
  --out "$OUT/grouped_gemm-v3-masked.json"
export GROUPED_BENCH_GLUON=$GLUON_OK
step "grouped bench: contiguous + moe (gluon=$GLUON_OK)" "${T_GR:-55}" "$BL" \
  python3 benchmarks/grouped_gemm.py --only contiguous,moe --out "$OUT/grouped_gemm-v3-contig.json"
python3 benchmarks/grouped_gemm.py --summary "$OUT/grouped_gemm-v3-masked.json" 2>&1 | grep -v provenance
python3 benchmarks/grouped_gemm.py --summary "$OUT/grouped_gemm-v3-contig.json" 2>&1 | grep -v provenance
exit 0
