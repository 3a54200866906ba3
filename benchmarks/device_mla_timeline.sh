#!/usr/bin/env bash
# In-kernel timeline of the dispatched Gluon dense MLA decode kernel (TIMELINE constexpr, launcher keyword timeline=;
# session 21, benchmarks/notes/mla_decode_timeline.md; not dispatched), first device run:
#   cd <clean export> && GIT_SHA=<sha> PYTHONPATH=$PWD/src OUT=$OUT bash benchmarks/device_mla_timeline.sh
# 1. GPU tests (tests/test_mla_decode_timeline.py -m gpu: the instrumented build's out / lse / accumulators
#    bit-identical to the plain build on NaN-poisoned outputs; per CTA the stamps present and monotone, the piece
#    count / requests / token ranges / split counts of the schedule; PVR s_q 1 / 2, plain h_q 16, ~41 pieces per CTA)
#    under a hang guard (cap ${T_TESTS:-55} s, per-test timeout 60 s when pytest-timeout is importable, -n ${NPROC:-4});
# 2. only if step 1 passed: benchmarks/mla_decode_timeline.py (b 128: h_q 128 s_q 1 s_k 4K / 8K / 32K, s_q 2 4K,
#    h_q 16 s_q 1 4K / 32K; ${REPS:-5} instrumented launches after L2 flushes, analysed; plain vs timeline vs plain
#    again, ${ROUNDS:-5} rotated rounds) (cap ${T_BENCH:-45} s; JSON + raw .npz rewritten after every shape, so a cap
#    hit keeps the shapes done; 128:1:4096 runs first).
# Total caps ~110 s (10 + 55 + 45). One tarball $OUT/mla_timeline.tgz (logs, junit, JSON, npz) + summaries on stdout.
DK_OUT_DEFAULT=/tmp/mla_timeline_out DK_ENV_CAP=10 DK_PYTEST_TIMEOUT=60 NPROC=${NPROC:-4} . "$(dirname "$0")/_device_common.sh"
cat "$W/env.json" 2>/dev/null | tr -d '\n' | cut -c1-400; echo

echo "== 1. timeline GPU tests (cap ${T_TESTS:-55}s, $XD)"
gpu_tests timeline_tests "mla decode timeline" "${T_TESTS:-55}" tests/test_mla_decode_timeline.py
RC=$?
[ "$RC" = 124 ] || [ "$RC" = 137 ] && echo "   (tests hit the cap: see timeline_tests.log for the last test reached)"

if [ "$RC" = 0 ]; then
  echo "== 2. timeline bench, ${REPS:-5} reps + ${ROUNDS:-5} rotated rounds (cap ${T_BENCH:-45}s)"
  # shellcheck disable=SC2086
  timeout -k 5 "${T_BENCH:-45}" python3 benchmarks/mla_decode_timeline.py "$W/mla_decode_timeline.json" \
    --reps "${REPS:-5}" --rounds "${ROUNDS:-5}" --rep-ms "${REP_MS:-10}" ${BENCH_ARGS:-} > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -v SUMMARY "$W/bench.log" | tail -6
  grep SUMMARY "$W/bench.log"
else
  echo "== 2. bench skipped: tests rc=$RC"
fi
tar czf "$OUT/mla_timeline.tgz" -C "$W" .
echo "== done ($(el)); tarball $OUT/mla_timeline.tgz"
exit 0
