#!/usr/bin/env bash
# In-kernel timeline of the dispatched sparse MLA decode kernel at h_q 128 (the 2-CTA cluster kernel's TIMELINE entry,
# launcher keyword timeline=; session 21, benchmarks/notes/sparse_decode_timeline.md; never dispatched), first run:
#   cd <clean export> && GIT_SHA=<sha> PYTHONPATH=$PWD/src OUT=$OUT bash benchmarks/device_sparse_decode_timeline.sh
# 1. GPU tests (tests/test_sparse_decode_timeline.py -m gpu: V3.2 / V4.1 x 3 cases -- the b 64 bench row on the greedy
#    schedule, b 24 s_q 2 with lengths / sink / out-of-range indices, a 3-part schedule with zero-length requests;
#    instrumented out / lse bit-identical to the plain launch on NaN-poisoned outputs, stamps monotone per CTA, the
#    schedule's piece counts / requests / split counts, cluster ranks) under a hang guard (cap ${T_TESTS:-60} s,
#    per-test timeout 55 s when pytest-timeout is importable, -n ${NPROC:-6}: one worker per test, each compiles
#    its plain + TIMELINE builds once);
# 2. only if step 1 passed: benchmarks/sparse_decode_timeline.py (V3.2 / V4.1 x (b, s_q) = (64, 1), (128, 1),
#    (128, 2), h_q 128 topk 2048, the public op's inputs and schedule; ${REPS:-5} instrumented launches after L2
#    flushes, analysed; plain / timeline / plain again in ${ROUNDS:-5} rotated rounds) (cap ${T_BENCH:-70} s; JSON +
#    raw .npz rewritten after every row, so a cap hit keeps the rows done).
# Caps 8 + 60 + 70 s (+ kill grace): <= 150 s; expected 70-120 s. One tarball $OUT/sparse_decode_timeline.tgz (logs,
# junit, JSON, npz) + the SUMMARY lines on stdout.
DK_OUT_DEFAULT=/tmp/sparse_decode_timeline_out DK_ENV_CAP=8 DK_PYTEST_TIMEOUT=55 NPROC=${NPROC:-6} \
  . "$(dirname "$0")/_device_common.sh"
cat "$W/env.json" 2>/dev/null | tr -d '\n' | cut -c1-400; echo

echo "== 1. sparse decode timeline GPU tests (cap ${T_TESTS:-60}s, $XD)"
gpu_tests timeline_tests "sparse decode timeline" "${T_TESTS:-60}" tests/test_sparse_decode_timeline.py
RC=$?
[ "$RC" = 124 ] || [ "$RC" = 137 ] && echo "   (tests hit the cap: see timeline_tests.log for the last test reached)"

if [ "$RC" = 0 ]; then
  echo "== 2. timeline bench, ${REPS:-5} reps + ${ROUNDS:-5} rotated rounds (cap ${T_BENCH:-70}s)"
  # shellcheck disable=SC2086
  timeout -k 5 "${T_BENCH:-70}" python3 benchmarks/sparse_decode_timeline.py "$W/sparse_decode_timeline.json" \
    --reps "${REPS:-5}" --rounds "${ROUNDS:-5}" --rep-ms "${REP_MS:-10}" ${BENCH_ARGS:-} > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -v SUMMARY "$W/bench.log" | tail -6
  grep SUMMARY "$W/bench.log"
else
  echo "== 2. bench skipped: tests rc=$RC"
fi
tar czf "$OUT/sparse_decode_timeline.tgz" -C "$W" .
echo "== done ($(el)); tarball $OUT/sparse_decode_timeline.tgz"
exit 0
