#!/usr/bin/env bash
# Device run for issue 7 (MLA prefill): GPU tests, then the benchmark sweep with in-run anchors.
# Usage (repo root, on the H200 box): GIT_SHA=<sha> bash benchmarks/device_mla_prefill.sh
# Writes at most 4 files under $OUT (env.txt, gpu_tests.log, bench.log, mla_prefill-h200.json); one failing
# step never stops the next; prints a short summary last.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mla_prefill_out}
mkdir -p "$OUT"
TEST_TIMEOUT=${TEST_TIMEOUT:-120}
BENCH_TIMEOUT=${BENCH_TIMEOUT:-165}

{
  echo "git_sha=${GIT_SHA:-unknown}"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,memory.total --format=csv 2>&1 | head -3
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'numpy', numpy.__version__)" 2>&1
} > "$OUT/env.txt" 2>&1

echo "== gpu tests (timeout ${TEST_TIMEOUT}s)"
timeout "$TEST_TIMEOUT" python3 -m pytest tests/test_mla_prefill*.py tests/test_dense_prefill*.py -m gpu -q -x \
  -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" >> "$OUT/gpu_tests.log"

echo "== benchmark sweep (timeout ${BENCH_TIMEOUT}s)"
timeout "$BENCH_TIMEOUT" python3 benchmarks/mla_prefill.py --sweep --out "$OUT/mla_prefill-h200.json" \
  > "$OUT/bench.log" 2>&1
echo "bench rc=$?" >> "$OUT/bench.log"

echo "================ SUMMARY ================"
cat "$OUT/env.txt"
echo "-- gpu tests:"
grep -E "passed|failed|error|rc=" "$OUT/gpu_tests.log" | tail -6
grep -E "^(FAILED|ERROR)" "$OUT/gpu_tests.log" | head -5
echo "-- benchmark:"
sed -n '/=== summary/,$p' "$OUT/bench.log" | cut -c1-200
grep -c '"error"' "$OUT/mla_prefill-h200.json" 2>/dev/null | sed 's/^/rows with error: /'
tail -3 "$OUT/bench.log" | cut -c1-300
