#!/usr/bin/env bash
# Device step for the TMA descriptor cache of the fast launch path (deepkernels._launch: KernelLauncher(...,
# cache_descriptors=True) -> _DescriptorLaunch; used by the Gluon GEMM plans and the Gluon dense MLA decode), from
# the repo root on the H200 (~110 s at most):
#   GIT_SHA=<sha> OUT=<dir> bash benchmarks/device_descriptor_cache.sh
# 1. provenance -> $OUT/env.json (GPU, driver, torch/triton/CUDA versions, GIT_SHA, time);
# 2. GPU tests (-k descriptor_cache): public fp8_gemm_nt Gluon path (M 1024, N 2112, K 7168), masked grouped Gluon
#    path (G 3, M_max 384, N 4096, K 2048, expected_m 256), dense MLA decode (bf16, h_q 128): cache hits counted,
#    outputs bit-identical to the uncached launch (set_descriptor_cache(False)), copies at new addresses re-encode
#    and stay correct, CUDA-graph capture + replay -> $OUT/gpu_tests.log, $OUT/gpu_tests.json;
# 3. benchmarks/gemm_host.py --desc-cache both: Gluon GEMM plans with the cache on and off, Triton plans once
#    -> $OUT/gemm_host.json;
# 4. benchmarks/host_overhead.py (dense decode, h_q 128, s_k 4096, b 1..128): submit us/call with the cache on, and
#    off in the same row (desc_cache_other_host_submit_us) -> $OUT/mla_dense_host.json.
# Every step has its own cap (seconds: T_TESTS, T_GEMM, T_DENSE); no step stops the others (the benchmarks run even
# if a test failed: the JSON says so through gpu_tests.json).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
export GIT_SHA="${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
OUT=${OUT:-/tmp/descriptor_cache_out}
mkdir -p "$OUT"
T_TESTS=${T_TESTS:-38}
T_GEMM=${T_GEMM:-40}
T_DENSE=${T_DENSE:-28}
DENSE_ARGS=${DENSE_ARGS:---hq 128 --sk 4096 --b 1,2,4,8,16,32,64,128}
unset TRITON_INTERPRET DEEPKERNELS_DESC_CACHE DEEPKERNELS_DISABLE_GLUON DEEPKERNELS_GROUPED_GLUON
T0=$(date +%s)

timeout -k 2 30 python3 -c 'import json, sys; from deepkernels.bench.runner import provenance
p = provenance(); json.dump(p, open(sys.argv[1], "w"), indent=1); print(json.dumps(p))' "$OUT/env.json" 2>&1 | tee "$OUT/env.log"

echo "== descriptor-cache GPU tests (cap ${T_TESTS}s)"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=60"
timeout -k 5 "$T_TESTS" python3 -m pytest tests/test_gemm_launch.py tests/test_launch_cache.py -m gpu \
  -k descriptor_cache -q -p no:cacheprovider -rfEs $TO --junitxml="$OUT/gpu_tests.xml" > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$? ($(( $(date +%s) - T0 )) s)" | tee -a "$OUT/gpu_tests.log"
grep -E "^FAILED|^ERROR|passed|failed|error|Timeout" "$OUT/gpu_tests.log" | tail -8
timeout -k 2 10 python3 benchmarks/junit_summary.py "$OUT/gpu_tests.xml" "$OUT/env.json" "$OUT/gpu_tests.json" \
  "descriptor cache GPU tests" 2>&1

echo "== gemm_host.py --desc-cache both (cap ${T_GEMM}s)"
timeout -k 5 "$T_GEMM" python3 benchmarks/gemm_host.py --desc-cache both --out "$OUT/gemm_host.json" \
  > "$OUT/gemm_host.log" 2>&1
echo "gemm_host rc=$? ($(( $(date +%s) - T0 )) s)"
grep -E "^HOST|Error|error" "$OUT/gemm_host.log" | cut -c1-230 | tail -20

echo "== host_overhead.py dense decode, cache on (+ off in each row) (cap ${T_DENSE}s)"
timeout -k 5 "$T_DENSE" python3 benchmarks/host_overhead.py ${DENSE_ARGS} --desc-cache on \
  --json "$OUT/mla_dense_host.json" > "$OUT/mla_dense_host.log" 2>&1
echo "host_overhead rc=$? ($(( $(date +%s) - T0 )) s)"
grep -E "^SUMMARY|FAILED|Error" "$OUT/mla_dense_host.log" | cut -c1-230 | tail -12
echo "== done ($(( $(date +%s) - T0 )) s)"
exit 0
