#!/usr/bin/env bash
# The TMA-store epilogue of the Gluon m-grouped FP8 kernels (GLUON_WS_128_S6_EPI contiguous, GLUON_WS_128_S4_EPI
# masked; src/deepkernels/gemm/_gluon_fp8.py; NOT dispatched by default, DEEPKERNELS_GROUPED_EPI=1 switches the
# public ops), first run on a GPU. Repo root:
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_grouped_epi.sh
# 1. provenance (cap 15 s);
# 2. the GPU tests of tests/test_grouped_gluon_epi.py (-m gpu: EPI bit-identical to the register epilogue, padding
#    zeros, rows >= masked_m never written, clipped N tiles, fallbacks, public switch, CUDA graph; the compile and host
#    tiers run on the CPU; cap 75 s);
# 3. A/B timing on DeepGEMM's grouped shapes (4 contiguous, 6 masked): public op, cuBLAS per-group loop, Gluon
#    register epilogue vs EPI through the direct launchers in 3 alternating rounds, the public ops with
#    DEEPKERNELS_GROUPED_EPI=1 (benchmarks/grouped_gemm.py with GROUPED_BENCH_EPI_AB=1; cap 95 s).
# Caps (with the 10 s junit summary) sum to 195 s, plus at most 5 s kill grace per step; expected ~100-150 s. Every
# step under `timeout`; no step stops the others. Files: one tarball $OUT/grouped_epi.tgz (the device returns at most
# 8 files) + a short summary on stdout.
unset DEEPKERNELS_GROUPED_EPI DEEPKERNELS_GROUPED_GLUON DEEPKERNELS_DISABLE_GLUON
# the shared preamble, benchmarks/_device_common.sh: set -u, PYTHONPATH, GIT_SHA, OUT, W, el, env.json, TO, XD
DK_OUT_DEFAULT=/tmp/grouped_epi_out DK_ENV_CAP=${T_ENV:-15} DK_PYTEST_TIMEOUT=50 DK_SHOW_SHA=0 \
  . "$(dirname "$0")/_device_common.sh"
cat "$W/env.json"; echo

echo "== 1. grouped EPI GPU tests (cap ${T_TESTS:-75}s)"
timeout -k 5 "${T_TESTS:-75}" python3 -m pytest tests/test_grouped_gluon_epi.py -m gpu -q -rfs -p no:cacheprovider $TO \
  --junitxml="$W/epi_tests.xml" > "$W/epi_tests.log" 2>&1
echo "epi tests rc=$? ($(el))"
tail -3 "$W/epi_tests.log"; grep -E "^FAILED|^ERROR" "$W/epi_tests.log" | head -20
junit_json epi_tests "grouped epi"

echo "== 2. grouped register-epilogue vs EPI A/B (cap ${T_BENCH:-95}s)"
GROUPED_BENCH_EPI_AB=1 GROUPED_BENCH_ROUNDS=3 timeout -k 5 "${T_BENCH:-95}" python3 benchmarks/grouped_gemm.py \
  --only contiguous,masked --out "$W/grouped_epi_ab.json" > "$W/bench.log" 2>&1
echo "bench rc=$? ($(el))"
grep -E "^(contiguous|masked) |gluon_ws|public_|ERROR|Error" "$W/bench.log" | awk '!seen[$0]++' | head -60

tar czf "$OUT/grouped_epi.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
