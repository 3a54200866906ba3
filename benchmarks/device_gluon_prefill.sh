#!/usr/bin/env bash
# Device step for the experimental Gluon sparse prefill kernel (src/deepkernels/mla/_gluon_sparse_prefill.py):
#   GIT_SHA=<sha> bash benchmarks/device_gluon_prefill.sh
# 1. its GPU tests (tests/test_gluon_sparse_prefill.py, FlashMLA tolerances); 2. the sparse prefill benchmark with
# the Triton default and the Gluon kernel timed in the same process (benchmarks/mla_prefill.py --gluon).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gluon_prefill_out}
mkdir -p "$OUT"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=60"   # the WS variant's mbarriers: a hang
timeout -k 5 "${T_TESTS:-100}" python3 -m pytest tests/test_gluon_sparse_prefill.py -m gpu -q -rf -p no:cacheprovider $TO \
  > "$OUT/gluon_prefill_tests.log" 2>&1
echo "gluon prefill tests rc=$?" | tee -a "$OUT/gluon_prefill_tests.log"
grep -E "^FAILED|^ERROR|passed|failed|error" "$OUT/gluon_prefill_tests.log" | tail -15
timeout -k 5 "${T_BENCH:-120}" python3 benchmarks/mla_prefill.py --only sparse --gluon \
  --out "$OUT/mla_prefill_gluon-h200.json" > "$OUT/gluon_prefill_bench.log" 2>&1
echo "gluon prefill bench rc=$?"
sed -n '/=== summary/,$p' "$OUT/gluon_prefill_bench.log" | cut -c1-220
tail -3 "$OUT/gluon_prefill_bench.log" | cut -c1-300
exit 0
