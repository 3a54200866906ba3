#!/usr/bin/env bash
# Sparse MLA decode device run (~120 s by default), from the repo root on the H200 machine:
#   GIT_SHA=<sha> OUT=<dir> bash benchmarks/device_mla_sparse.sh
# 1. provenance -> $OUT/env.json (GPU, driver, torch/triton/numpy/CUDA versions, GIT_SHA, time);
# 2. the sparse GPU tier (tests/test_mla_sparse_kernels.py + test_mla_sparse_reference.py, -m gpu; xdist workers
#    when pytest-xdist is there, the compiles dominate) -> $OUT/gpu_tests.log, $OUT/gpu_tests.json (counts, failures);
#    meanwhile a background warm-up compiles the host hook's kernels (Triton disk cache);
# 3. the host-timing hook: benchmarks/mla_sparse_decode.py --host (b = 1..128, topk 64: host submit per call,
#    whole call, CUDA-graph replay, the same call without the plan cache, fast launches) -> $OUT/mla_sparse_host.json;
# 4. FULL=1 only (+ ~350 s): the throughput sweep -> $OUT/mla_sparse.json and topk 512 / 16384 ->
#    $OUT/mla_sparse_topk.json.
# No step stops the others; each has its own time cap (seconds, overridable: T_TESTS, T_HOST, T_BENCH, T_TOPK).
set -u
export PYTHONPATH=${PYTHONPATH:-src} PYTHONUNBUFFERED=1
export GIT_SHA="${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
OUT=${OUT:-/tmp/mla_sparse_out}
mkdir -p "$OUT"
T_TESTS=${T_TESTS:-85}
T_HOST=${T_HOST:-30}
T_BENCH=${T_BENCH:-260}
T_TOPK=${T_TOPK:-90}
HOST_ARGS=${HOST_ARGS:---fmt v41,v32 --hq 128 --host-b 1,2,4,8,16,32,64,128 --host-topk 64}
unset TRITON_INTERPRET
T0=$(date +%s)

python3 - "$OUT/env.json" <<'PY' 2>&1 | tee "$OUT/env.log"
import json, os, subprocess, sys, time
import numpy, torch, triton
info = dict(time=time.strftime("%Y-%m-%dT%H:%M:%S%z"), git_sha=os.environ.get("GIT_SHA", "unknown"),
            torch=torch.__version__, triton=triton.__version__, numpy=numpy.__version__, cuda=torch.version.cuda)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    info.update(gpu=p.name, sms=p.multi_processor_count)
try:
    info["driver"] = subprocess.check_output(["nvidia-smi", "--query-gpu=driver_version,clocks.sm,clocks.max.sm",
                                              "--format=csv,noheader"], stderr=subprocess.DEVNULL).decode().strip()
except Exception:
    pass
json.dump(info, open(sys.argv[1], "w"), indent=1)
print(json.dumps(info))
PY

echo "== warm-up compile for the host hook (background)"
timeout -k 5 "$(( T_TESTS + 10 ))" python3 benchmarks/mla_sparse_decode.py --host ${HOST_ARGS} --host-b 1,2,16 \
  --host-warmup > "$OUT/host_warmup.log" 2>&1 &
WARM=$!

echo "== sparse GPU tier (cap ${T_TESTS}s)"
XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n 4"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=60"
timeout -k 5 "$T_TESTS" python3 -m pytest tests/test_mla_sparse_kernels.py tests/test_mla_sparse_reference.py \
  -m gpu -q -p no:cacheprovider -rfE $XD $TO --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$? ($(( $(date +%s) - T0 )) s)" | tee -a "$OUT/gpu_tests.log"
grep -E "passed|failed|error" "$OUT/gpu_tests.log" | tail -3
python3 benchmarks/junit_summary.py "$OUT/gpu_tests.xml" "$OUT/env.json" "$OUT/gpu_tests.json" \
  "sparse decode GPU tier" 2>&1
wait "$WARM" 2>/dev/null; echo "warm-up rc=$? ($(( $(date +%s) - T0 )) s)"

echo "== host timing (cap ${T_HOST}s)"
timeout -k 5 "$T_HOST" python3 benchmarks/mla_sparse_decode.py --host ${HOST_ARGS} \
  --json "$OUT/mla_sparse_host.json" > "$OUT/host.log" 2>&1
echo "host rc=$? ($(( $(date +%s) - T0 )) s)" | tee -a "$OUT/host.log"
grep SUMMARY "$OUT/host.log" | tail -20

if [ "${FULL:-0}" != "0" ]; then
  echo "== benchmark + sweep (cap ${T_BENCH}s)"
  timeout -k 5 "$T_BENCH" python3 benchmarks/mla_sparse_decode.py --sweep --fmt v32,v41+fp4,v41 \
    --json "$OUT/mla_sparse.json" > "$OUT/bench.log" 2>&1
  echo "bench rc=$?" | tee -a "$OUT/bench.log"
  grep SUMMARY "$OUT/bench.log" | tail -20
  echo "== topk 512 / 16384, default config (cap ${T_TOPK}s)"
  timeout -k 5 "$T_TOPK" python3 benchmarks/mla_sparse_decode.py --fmt v32,v41+fp4 --topk 512,16384 --hq 128 \
    --bsq 128x2 --json "$OUT/mla_sparse_topk.json" > "$OUT/bench_topk.log" 2>&1
  echo "topk bench rc=$?" | tee -a "$OUT/bench_topk.log"
  grep SUMMARY "$OUT/bench_topk.log" | tail -10
fi
echo "== done ($(( $(date +%s) - T0 )) s)"; ls -la "$OUT"
exit 0
