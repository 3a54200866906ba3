#!/usr/bin/env bash
# Device run for dense MLA decode (one call, ~150 s): candidate kernels are compiled in 8 background processes
# (fills Triton's disk cache) while the GPU tests run; then the config sweep over the benchmark shapes with the
# in-run PyTorch anchor, host-overhead / CUDA-graph replay timings, JSON to $OUT; the summary table prints last.
# Usage (repo root, on the device): GIT_SHA=<sha> bash benchmarks/device_mla_decode.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
export GIT_SHA="${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"   # recorded in the JSON provenance
OUT=${OUT:-/tmp/mla_decode_out}
mkdir -p "$OUT"
T0=$(date +%s)
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; python3 -c \
  "import torch, triton, numpy; print(torch.__version__, triton.__version__, numpy.__version__)"; echo "GIT_SHA=$GIT_SHA"; } \
  > "$OUT/env.txt" 2>&1 || true
cat "$OUT/env.txt"
echo "== compile candidates (background, 8 shards)"
PIDS=""
for i in 0 1 2 3 4 5 6 7; do
  timeout 80 python3 benchmarks/mla_decode.py --sweep --compile-only --shard $i/8 >> "$OUT/compile.log" 2>&1 &
  PIDS="$PIDS $!"
done
echo "== GPU tests"
timeout 85 python3 -m pytest tests/test_mla_decode_kernels.py -m gpu -q -p no:cacheprovider \
  > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$? ($(( $(date +%s) - T0 )) s)"
tail -25 "$OUT/gpu_tests.log"
for p in $PIDS; do wait "$p" 2>/dev/null; done
echo "compile: $(grep -c '^compiled' "$OUT/compile.log") ok, $(grep -c '^compile failed' "$OUT/compile.log") failed ($(( $(date +%s) - T0 )) s)"
grep '^compile failed' "$OUT/compile.log" | head -10
echo "== benchmark sweep"
LEFT=$(( 145 - ($(date +%s) - T0) )); [ "$LEFT" -lt 40 ] && LEFT=40
timeout "$LEFT" python3 benchmarks/mla_decode.py --sweep --overhead --sk 4096,32768 --rep 20 \
  --json "$OUT/mla_decode-h200.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$? ($(( $(date +%s) - T0 )) s)"
grep -v SUMMARY "$OUT/bench.log" | grep -v '^    ' | tail -30
echo "== summary"
grep SUMMARY "$OUT/bench.log" || true
exit 0
