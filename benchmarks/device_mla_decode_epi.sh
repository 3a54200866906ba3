#!/usr/bin/env bash
# EPI options of the dispatched Gluon dense MLA decode kernel (session 21; launcher keywords epi_nsp (a) / epi_early
# (b) / epi_sis, constexprs EPI_*, off, not dispatched; benchmarks/notes/mla_decode_timeline.md "EPI"), first run:
#   cd <clean export> && GIT_SHA=<sha> PYTHONPATH=$PWD/src OUT=$OUT bash benchmarks/device_mla_decode_epi.sh
# 1. GPU tests under a hang guard (cap ${T_TESTS:-70} s, per-test timeout 60 s when pytest-timeout is importable,
#    -n ${NPROC:-6}): tests/test_mla_decode_epi.py -m gpu (each knob's out / lse / accumulators bit-identical to the
#    dispatched build on NaN-poisoned outputs: h_q 128 s_q 1, s_q 2 causal, h_q 16, split + non-split pieces, a
#    zero-length request; the instrumented all-knobs build's finer stamps in order) and
#    tests/test_mla_decode_timeline.py -m gpu (the TIMELINE layout with the finer epilogue stamps);
# 2. only if step 1 passed: benchmarks/mla_decode_epi.py (b 128: h_q 128 s_q 1 4K / 32K / 8K, s_q 2 4K, h_q 16 4K /
#    32K; dispatched, dispatched again (A/A), a, b, ab, sis, abs (sis / abs: PVR builds only); CUDA-graph replay,
#    ${ROUNDS:-7} rotated rounds; after the 4K A/B, ${TL_REPS:-3} TIMELINE launches of every variant) (cap
#    ${T_BENCH:-80} s; JSON rewritten after every shape, so a cap hit keeps the shapes done).
# Total caps 8 + 70 + 80 = 158 s (+ up to 12 s of kill grace + tar: <= 170 s). One tarball $OUT/mla_decode_epi.tgz (logs, junit, JSON) + summaries on stdout.
DK_OUT_DEFAULT=/tmp/mla_decode_epi_out DK_ENV_CAP=8 DK_PYTEST_TIMEOUT=60 NPROC=${NPROC:-6} . "$(dirname "$0")/_device_common.sh"
cat "$W/env.json" 2>/dev/null | tr -d '\n' | cut -c1-400; echo

echo "== 1. EPI + timeline GPU tests (cap ${T_TESTS:-70}s, $XD)"
gpu_tests epi_tests "mla decode epi" "${T_TESTS:-70}" tests/test_mla_decode_epi.py tests/test_mla_decode_timeline.py
RC=$?
[ "$RC" = 124 ] || [ "$RC" = 137 ] && echo "   (tests hit the cap: see epi_tests.log for the last test reached)"

if [ "$RC" = 0 ]; then
  echo "== 2. EPI A/B, ${ROUNDS:-7} rotated rounds, CUDA-graph replay + timelines at 4K (cap ${T_BENCH:-80}s)"
  # shellcheck disable=SC2086
  timeout -k 5 "${T_BENCH:-80}" python3 benchmarks/mla_decode_epi.py "$W/mla_decode_epi.json" \
    --rounds "${ROUNDS:-7}" --rep-ms "${REP_MS:-20}" --tl-reps "${TL_REPS:-3}" ${BENCH_ARGS:-} > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -v -E "^(SUMMARY|TIMELINE)" "$W/bench.log" | tail -6
  grep -E "^(SUMMARY|TIMELINE)" "$W/bench.log"
else
  echo "== 2. bench skipped: tests rc=$RC"
fi
tar czf "$OUT/mla_decode_epi.tgz" -C "$W" .
echo "== done ($(el)); tarball $OUT/mla_decode_epi.tgz"
exit 0
