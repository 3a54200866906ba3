#!/usr/bin/env bash
# Issue #3: the TMA-store-epilogue variant of the Gluon WS FP8 GEMM (GLUON_WS_128_S4_EPI / S6_EPI in
# src/deepkernels/gemm/_gluon_fp8.py, NOT dispatched), first run on a GPU. Repo root:
#   GIT_SHA=<sha> bash benchmarks/device_gemm_epi.sh
# 1. env (cap 10 s); 2. the EPI tests of tests/test_gemm_gluon.py (-k epi: GPU correctness at the 6 M = 4096
# shapes, partial tiles incl. the N % 8 != 0 register-epilogue fallback, a strided D, a 3-program persistent grid;
# the compile + host tests again; cap 50 s); 3. A/B timing at M = 4096 x the 6 DeepSeek-V3 (N, K): public op with
# DEEPKERNELS_DISABLE_GLUON=gemm (Triton table config), Gluon WS s4/s6 (register epilogue), the EPI configs, cuBLAS
# blockwise; whole call + CUDA-graph replay; JSON $OUT/gemm_epi_ab.json (cap 70 s, shapes not started after 52 s
# are recorded as skipped; fewest K blocks first). Caps sum to 130 s (+ at most 5 s kill grace each). No step stops
# the others; a hung mbarrier is killed by its step's timeout.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gemm_epi_out}
mkdir -p "$OUT"
GIT_SHA=${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
export GIT_SHA
T_ENV=${T_ENV:-10}
T_TESTS=${T_TESTS:-50}
T_BENCH=${T_BENCH:-70}

echo "== env"
timeout -k 5 "$T_ENV" bash -c '
  date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv 2>&1
  python3 -c "import torch, triton; print(\"torch\", torch.__version__, \"cuda\", torch.version.cuda, \"triton\", triton.__version__)" 2>&1
  python3 -c "from deepkernels.gemm import _gluon_fp8 as G; print(\"gluon available\", G.available(), G._IMPORT_ERROR)" 2>&1
  echo "GIT_SHA=$GIT_SHA"' > "$OUT/epi_env.log" 2>&1
cat "$OUT/epi_env.log"

echo "== EPI tests (cap ${T_TESTS}s)"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=60"
timeout -k 5 "$T_TESTS" python3 -m pytest tests/test_gemm_gluon.py -k epi -q -rfs -p no:cacheprovider $TO \
  > "$OUT/epi_tests.log" 2>&1
echo "epi tests rc=$?" | tee -a "$OUT/epi_tests.log"
grep -E "^FAILED|^ERROR|passed|failed|error" "$OUT/epi_tests.log" | tail -40

echo "== EPI A/B bench (cap ${T_BENCH}s)"
timeout -k 5 "$T_BENCH" python3 benchmarks/gemm_gluon.py --ab --epi --all-shapes --rounds 3 \
  --budget-s $((T_BENCH - 18)) --out "$OUT/gemm_epi_ab.json" > "$OUT/epi_bench.log" 2>&1
echo "epi bench rc=$?" | tee -a "$OUT/epi_bench.log"
cat "$OUT/epi_bench.log" | tail -30
[ -s "$OUT/gemm_epi_ab.json" ] || { echo "no gemm_epi_ab.json"; }
exit 0
