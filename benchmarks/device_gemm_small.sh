#!/usr/bin/env bash
# Small-M (M <= 128) Gluon FP8 GEMM (session 20; gemm/_gluon_fp8_small.py, not dispatched), first device run:
#   cd <clean export> && GIT_SHA=<sha> PYTHONPATH=$PWD/src OUT=$OUT bash benchmarks/device_gemm_small.sh
# 1. GPU tests of tests/test_gemm_gluon_small.py except the bit-identity ones (12 issue-#3 shapes + M 1/7/33/100 vs
#    the float64 product and the dispatched fp8_gemm_nt, both reduction modes, partial tiles, K tails, strided D,
#    small persistent grid, repeat + CUDA-graph replay with the counters left zeroed), cap ${T_TESTS:-75} s: gates 3.
# 2. the bit-identity tests vs the dispatched Triton path (twin configs), cap ${T_BIT:-30} s: reported, not gating.
# 3. benchmarks/gemm_small.py: rotated paired rounds, small-M variants vs dispatched (+ A/A) vs cuBLAS, graph replay
#    primary + whole call, the 12 shapes (cap ${T_BENCH:-60} s; shapes not started after $((${T_BENCH:-60} - 15)) s
#    are skipped). Caps 15 + 75 + 30 + 60 s: <= 180 s; expected ~120-170 s.
# One tarball $OUT/gemm_small.tgz (logs, junit JSON, gemm_small.json, env.json) + the summaries on stdout.
DK_OUT_DEFAULT=/tmp/gemm_small_out DK_PYTEST_TIMEOUT=60 NPROC=${NPROC:-8} . "$(dirname "$0")/_device_common.sh"

echo "== 1. small-M GPU tests (cap ${T_TESTS:-75}s, $XD)"
gpu_tests small_tests "gemm small-M gluon" "${T_TESTS:-75}" tests/test_gemm_gluon_small.py -k "not bitident"
RC=$?

echo "== 2. bit identity vs the dispatched path (cap ${T_BIT:-30}s, not gating)"
gpu_tests small_bitident "gemm small-M bit identity" "${T_BIT:-30}" tests/test_gemm_gluon_small.py -k bitident

if [ "$RC" != 0 ]; then
  echo "== 3. bench SKIPPED (tests rc $RC)"
else
  echo "== 3. small-M paired bench (cap ${T_BENCH:-60}s)"
  timeout -k 5 "${T_BENCH:-60}" python3 benchmarks/gemm_small.py --rounds "${ROUNDS:-5}" --rep-ms "${REP_MS:-15}" \
    --budget-s "$(( ${T_BENCH:-60} - 15 ))" --out "$W/gemm_small.json" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "SUMMARY|Error|error|^  [0-9]" "$W/bench.log" | tail -30
fi
tar czf "$OUT/gemm_small.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
