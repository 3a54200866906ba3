#!/usr/bin/env bash
# Host overhead of the MLA decode public calls on the device (~115 s at most, ~60-90 s typically), from the repo root on the H200:
#   GIT_SHA=<sha> OUT=<dir> bash benchmarks/device_host_overhead.sh
# 1. provenance -> $OUT/env.json (GPU, driver, torch/triton/CUDA versions, GIT_SHA, time);
# 2. GPU tests of the launcher path (tests/test_launch_cache.py -m gpu: each Gluon path -- V3.2 sparse decode,
#    bf16 dense decode, sparse prefill -- called twice through its public op, second call a direct CompiledKernel
#    launch, outputs bit-identical to Triton's own launcher; plus the two Gluon decode CUDA-graph capture tests)
#    -> $OUT/gpu_tests.log, $OUT/gpu_tests.json; meanwhile a background warm-up compiles the timed kernels;
# 3. sparse decode host timing (benchmarks/mla_sparse_decode.py --host: V4.1 Triton and V3.2 Gluon, h_q 128,
#    topk 64, b 1..128) -> $OUT/mla_sparse_host.json;
# 4. dense decode host timing (benchmarks/host_overhead.py: bf16 cache, h_q 128, s_k 4096, b 1..128)
#    -> $OUT/mla_dense_host.json.
# Every row: host submit us/call, the same with Triton's own launcher, whole call, CUDA-graph replay, fast
# launches per call. No step stops the others; each has its own cap (seconds: T_TESTS, T_SPARSE, T_DENSE).
set -u
export PYTHONPATH=${PYTHONPATH:-src} PYTHONUNBUFFERED=1
export GIT_SHA="${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
OUT=${OUT:-/tmp/host_overhead_out}
mkdir -p "$OUT"
T_TESTS=${T_TESTS:-45}
T_SPARSE=${T_SPARSE:-28}
T_DENSE=${T_DENSE:-22}
SPARSE_ARGS=${SPARSE_ARGS:---fmt v41,v32 --hq 128 --host-b 1,2,4,8,16,32,64,128 --host-topk 64}
DENSE_ARGS=${DENSE_ARGS:---hq 128 --sk 4096 --b 1,2,4,8,16,32,64,128}
unset TRITON_INTERPRET
T0=$(date +%s)

timeout -k 2 30 python3 -c 'import json, sys; from deepkernels.bench.runner import provenance
p = provenance(); json.dump(p, open(sys.argv[1], "w"), indent=1); print(json.dumps(p))' "$OUT/env.json" 2>&1 | tee "$OUT/env.log"

echo "== warm-up compile of the timed kernels (background; the ints that vary with b are not specialised)"
timeout -k 2 "$T_TESTS" python3 benchmarks/mla_sparse_decode.py --host ${SPARSE_ARGS} --host-b 1,2,16 \
  --host-warmup > "$OUT/warmup_sparse.log" 2>&1 &
WARM1=$!
timeout -k 2 "$T_TESTS" python3 benchmarks/host_overhead.py ${DENSE_ARGS} --b 1,2 --warmup \
  > "$OUT/warmup_dense.log" 2>&1 &
WARM2=$!

echo "== launcher-path GPU tests (cap ${T_TESTS}s)"
XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n 4"
timeout -k 5 "$T_TESTS" python3 -m pytest tests/test_launch_cache.py \
  "tests/test_mla_decode_gluon.py::test_gpu_gluon_cuda_graph_capture" \
  "tests/test_mla_sparse_gluon.py::test_gpu_cuda_graph_capture" \
  -m gpu -q -p no:cacheprovider -rfEs $XD --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$? ($(( $(date +%s) - T0 )) s)" | tee -a "$OUT/gpu_tests.log"
grep -E "passed|failed|error" "$OUT/gpu_tests.log" | tail -3
timeout -k 2 10 python3 benchmarks/junit_summary.py "$OUT/gpu_tests.xml" "$OUT/env.json" "$OUT/gpu_tests.json" \
  "launcher path GPU tests" 2>&1
wait "$WARM1" 2>/dev/null; R1=$?; wait "$WARM2" 2>/dev/null; R2=$?
echo "warm-up rc=$R1/$R2 ($(( $(date +%s) - T0 )) s)"

echo "== sparse decode host timing (cap ${T_SPARSE}s)"
timeout -k 2 "$T_SPARSE" python3 benchmarks/mla_sparse_decode.py --host ${SPARSE_ARGS} \
  --json "$OUT/mla_sparse_host.json" > "$OUT/sparse_host.log" 2>&1
echo "sparse host rc=$? ($(( $(date +%s) - T0 )) s)" | tee -a "$OUT/sparse_host.log"
grep -E "SUMMARY|FAILED" "$OUT/sparse_host.log" | tail -20

echo "== dense decode host timing (cap ${T_DENSE}s)"
timeout -k 2 "$T_DENSE" python3 benchmarks/host_overhead.py ${DENSE_ARGS} \
  --json "$OUT/mla_dense_host.json" > "$OUT/dense_host.log" 2>&1
echo "dense host rc=$? ($(( $(date +%s) - T0 )) s)" | tee -a "$OUT/dense_host.log"
grep -E "SUMMARY|FAILED" "$OUT/dense_host.log" | tail -10

echo "== done ($(( $(date +%s) - T0 )) s)"; ls -la "$OUT"
exit 0
