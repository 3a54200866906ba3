#!/usr/bin/env bash
# Device step for the experimental Gluon dense prefill (src/deepkernels/mla/_gluon_dense_prefill.py), never run yet:
#   GIT_SHA=<sha> bash benchmarks/device_dense_prefill_gluon.sh
# 1. its GPU tests under a 60 s per-test timeout (mbarrier hang guard); 2. only if they pass: Triton vs Gluon vs SDPA
# at b 2, s 4096 / 8192, h 128, d (192,128) / (128,128), causal and not (benchmarks/mla_prefill.py --only dense --gluon).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/dense_prefill_gluon_out}
mkdir -p "$OUT"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=60"
timeout -k 5 "${T_TESTS:-120}" python3 -m pytest tests/test_dense_prefill_gluon.py -m gpu -q -rf -p no:cacheprovider $TO \
  -x > "$OUT/dense_prefill_gluon_tests.log" 2>&1
rc=$?
echo "gluon dense prefill tests rc=$rc"; grep -E "^FAILED|^ERROR|passed|failed|Timeout" "$OUT/dense_prefill_gluon_tests.log" | tail -10
if [ "$rc" -eq 0 ]; then
  timeout -k 5 "${T_BENCH:-150}" python3 benchmarks/mla_prefill.py --only dense --gluon \
    --out "$OUT/mla_prefill_dense_gluon-h200.json" > "$OUT/dense_prefill_gluon_bench.log" 2>&1
  echo "bench rc=$?"
  sed -n '/=== summary/,$p' "$OUT/dense_prefill_gluon_bench.log" | cut -c1-220
fi
exit 0
