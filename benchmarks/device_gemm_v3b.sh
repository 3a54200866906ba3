#!/usr/bin/env bash
# Next device call for the v3 GEMM work (not run in the session that wrote it; repo root on the H200):
#   GIT_SHA=<sha> bash benchmarks/device_gemm_v3b.sh        (~150 s of caps)
# 1. GPU tests: Gluon masked kernel (new, never run), Gluon contiguous + its default dispatch (production shapes now
#    go through it), fast path; 2. grouped contiguous public op A/B (interleaved rounds: Triton with/without the sfa
#    copy vs the Gluon dispatch); 3. dense K >= 7168 A/B (Triton table vs Gluon s4/s6 +prefetch vs cuBLAS);
# 4. masked benchmark incl. the Gluon masked kernel (direct launcher, only if its tests passed).
# $OUT: v3b.log + 3 JSONs.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
OUT=${OUT:-/tmp/gemm_v3b_out}
mkdir -p "$OUT"
LOG=$OUT/v3b.log
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=40"
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv; echo "GIT_SHA=${GIT_SHA:-unknown}"; } 2>&1 | tee "$LOG"
echo "== gpu tests (cap ${T_T:-45}s)" | tee -a "$LOG"
timeout -k 5 "${T_T:-45}" python3 -m pytest tests/test_grouped_gemm_gpu.py -m gpu -q -rf -p no:cacheprovider $TO \
  -k "gluon or fast_launch or production" > /tmp/v3b_tests.log 2>&1
RC=$?; cat /tmp/v3b_tests.log >> "$LOG"; echo "rc=$RC"; grep -E "^FAILED|^ERROR|passed|failed" /tmp/v3b_tests.log | tail -14
MASKED_OK=1; grep -q "^FAILED.*gluon_masked" /tmp/v3b_tests.log && MASKED_OK=0; [ $RC -gt 1 ] && MASKED_OK=0
echo "== grouped contiguous A/B (cap ${T_A:-50}s)" | tee -a "$LOG"
timeout -k 5 "${T_A:-50}" python3 benchmarks/grouped_gemm.py --ab --out "$OUT/grouped_gemm-v3-ab.json" 2>&1 | tee -a "$LOG"
echo "== dense K>=7168 A/B (cap ${T_B:-45}s)" | tee -a "$LOG"
timeout -k 5 "${T_B:-45}" python3 benchmarks/gemm_gluon.py --ab --out "$OUT/gemm_gluon-v3-ab.json" 2>&1 | tee -a "$LOG"
echo "== masked bench, gluon=$MASKED_OK (cap ${T_M:-35}s)" | tee -a "$LOG"
GROUPED_BENCH_GLUON=$MASKED_OK timeout -k 5 "${T_M:-35}" python3 benchmarks/grouped_gemm.py --only masked \
  --out "$OUT/grouped_gemm-v3b-masked.json" >> "$LOG" 2>&1
python3 benchmarks/grouped_gemm.py --summary "$OUT/grouped_gemm-v3b-masked.json" 2>&1 | grep -v provenance
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv 2>&1
exit 0
