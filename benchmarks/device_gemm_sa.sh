#!/usr/bin/env bash
# Gluon FP8 GEMM "scales ahead" (session 19; gemm/_gluon_fp8.py module docstring, "Scales ahead"), first device run:
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_gemm_sa.sh        (repo root, clean export)
# 1. its GPU tests (tests/test_gemm_gluon.py -k "scale_ahead or three_wg": D bit-identical to the S4 EPI build at the
#    6 M = 4096 shapes, partial tiles, 1-5 K blocks, the persistent small grid; since the end of session 19 also the
#    UNVERIFIED three-warpgroup configs GLUON_3WG) under a hang guard (cap ${T_TESTS:-120} s);
# 2. benchmarks/gemm_gluon.py --ab --sa: S4 EPI (+ A/A) vs GLUON_SA + GLUON_3WG + cuBLAS, rotated rounds, the six
#    (N, K) at M 4096 and 2048 (cap ${T_BENCH:-150} s; skipped when step 1 failed).
# One tarball $OUT/gemm_sa.tgz + the summaries on stdout.
DK_OUT_DEFAULT=/tmp/gemm_sa_out DK_PYTEST_TIMEOUT=60 . "$(dirname "$0")/_device_common.sh"

echo "== 1. scale_ahead GPU tests (cap ${T_TESTS:-120}s, $XD)"
gpu_tests sa_tests "gemm gluon scale_ahead" "${T_TESTS:-120}" tests/test_gemm_gluon.py -k "scale_ahead or three_wg"
RC=$?

if [ "$RC" != 0 ]; then
  echo "== 2. bench SKIPPED (tests rc $RC)"
else
  echo "== 2. S4 EPI vs scale_ahead paired bench (cap ${T_BENCH:-150}s)"
  timeout -k 5 "${T_BENCH:-150}" python3 benchmarks/gemm_gluon.py --ab --sa --all-shapes --ms 4096,2048 \
    --rounds "${ROUNDS:-5}" --budget-s "$(( ${T_BENCH:-150} - 20 ))" --out "$W/gemm_sa.json" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "SUMMARY|Error|error" "$W/bench.log" | tail -20
fi
tar czf "$OUT/gemm_sa.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
