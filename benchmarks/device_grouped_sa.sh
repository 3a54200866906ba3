#!/usr/bin/env bash
# Gluon m-grouped kernels with scale_ahead (session 19; gemm/_gluon_fp8.py module docstring, "Scales ahead"):
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_grouped_sa.sh        (repo root, clean export)
# 1. its GPU tests (tests/test_grouped_gluon_epi.py -k scale_ahead: contiguous / masked D bit-identical to the
#    dispatched TMA-store configs) under a hang guard (cap ${T_TESTS:-120} s);
# 2. benchmarks/grouped_sa_ab.py: base vs scale_ahead 1 (+ A/A), rotated rounds, DeepGEMM's published shapes (cap
#    ${T_BENCH:-120} s; skipped when step 1 failed).
# One tarball $OUT/grouped_sa.tgz + the summaries on stdout.
DK_OUT_DEFAULT=/tmp/grouped_sa_out DK_PYTEST_TIMEOUT=60 . "$(dirname "$0")/_device_common.sh"

echo "== 1. grouped scale_ahead GPU tests (cap ${T_TESTS:-120}s, $XD)"
gpu_tests gsa_tests "grouped gluon scale_ahead" "${T_TESTS:-120}" tests/test_grouped_gluon_epi.py -k scale_ahead
RC=$?

if [ "$RC" != 0 ]; then
  echo "== 2. bench SKIPPED (tests rc $RC)"
else
  echo "== 2. grouped base vs scale_ahead paired bench (cap ${T_BENCH:-120}s)"
  timeout -k 5 "${T_BENCH:-120}" python3 benchmarks/grouped_sa_ab.py "$W/grouped_sa_ab.json" --rounds "${ROUNDS:-5}" \
    > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "SUMMARY|Error|error" "$W/bench.log" | tail -20
fi
tar czf "$OUT/grouped_sa.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
