#!/usr/bin/env bash
# Device step: the Gluon dense decode kernel at rows < 64 (h_q 16 / 32): its GPU grid, then the bandwidth bench
# against the Triton kernel. Usage (repo root, on the device): GIT_SHA=<sha> bash benchmarks/device_mla_decode_small_rows.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/small_rows_out}
mkdir -p "$OUT"
timeout -k 5 "${T_TESTS:-90}" python3 -m pytest tests/test_mla_decode_gluon.py -m gpu -k small_rows -q -rf \
  -p no:cacheprovider > "$OUT/small_rows_tests.log" 2>&1
echo "small-rows tests rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/small_rows_tests.log" | tail -12
timeout -k 5 "${T_BENCH:-90}" python3 benchmarks/mla_decode_small_rows.py "$OUT/mla_decode_small_rows-h200.json" \
  2>&1 | tail -20
exit 0
