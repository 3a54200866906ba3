#!/usr/bin/env bash
# Device run for dense MLA decode (one call): GPU tests, then the config sweep over the benchmark shapes with
# the in-run PyTorch anchor. Writes logs + JSON under $OUT (<= 8 files); the summary table prints last.
# Usage (repo root, on the device): bash benchmarks/device_mla_decode.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mla_decode_out}
mkdir -p "$OUT"
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; python3 -c \
  "import torch, triton, numpy; print(torch.__version__, triton.__version__, numpy.__version__)"; git rev-parse HEAD; } \
  > "$OUT/env.txt" 2>&1 || true
cat "$OUT/env.txt"
echo "== GPU tests"
timeout 110 python3 -m pytest tests/test_mla_decode_kernels.py -m gpu -q --maxfail=5 -p no:cacheprovider \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?"
tail -25 "$OUT/gpu_tests.log"
echo "== benchmark sweep"
timeout 165 python3 benchmarks/mla_decode.py --sweep --json "$OUT/mla_decode-h200.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?"
grep -v SUMMARY "$OUT/bench.log" | tail -40
echo "== summary"
grep SUMMARY "$OUT/bench.log" || true
exit 0
