#!/usr/bin/env bash
# Half-tile ring + Q-by-TMA variant of the Gluon dense MLA decode (deepkernels.mla._gluon_dense_decode, launcher
# keywords half_tiles / q_tma; not dispatched), first device run:
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_mla_decode_ring.sh        (repo root, clean export)
# 0. provenance (cap 15 s);
# 1. smoke GPU test under a hang guard (an mbarrier protocol bug hangs; cap ${T_SMOKE:-45} s): the page /
#    half-page boundary lengths for the three variant combinations;
# 2. the GPU tier of tests/test_mla_decode_gluon_ring.py (cap ${T_TESTS:-80} s; --timeout=60 per test when
#    pytest_timeout is importable; -n NPROC when xdist is);
# 3. benchmarks/mla_decode_ring.py: default vs ring (+ half only, qtma only), b 128, h_q 128/64, s_q 1/2, s_k
#    4096/8192/32768, + default_again (A/A control); drift-robust: per shape ${ROUNDS:-5} rounds in rotated order,
#    paired per-round ratios to the default (SUMMARY "t/def" = their median); BENCH_ARGS passes more options,
#    e.g. BENCH_ARGS='--only-shapes 128:1:8192,128:1:32768' (cap ${T_BENCH:-65} s; skipped when the smoke test hung;
#    the JSON is rewritten after every shape, so a cap hit keeps the shapes done).
# Total caps ~215 s (15 + 45 + 80 + 10 + 65). One tarball $OUT/mla_decode_ring.tgz (logs, junit, JSON) +
# summaries on stdout; no step stops the others except a hung smoke test (-> no tests, no bench).
# the shared preamble, benchmarks/_device_common.sh: set -u, PYTHONPATH, GIT_SHA, OUT, W, el, env.json, TO, XD
DK_OUT_DEFAULT=/tmp/mla_decode_ring_out . "$(dirname "$0")/_device_common.sh"
cat "$W/env.json" 2>/dev/null | tr -d '\n' | cut -c1-400; echo
PT="python3 -m pytest -p no:cacheprovider -q -rfs --tb=short"

echo "== 1. smoke (hang guard, cap ${T_SMOKE:-45}s)"
timeout -k 5 "${T_SMOKE:-45}" $PT $TO tests/test_mla_decode_gluon_ring.py -m gpu -k smoke > "$W/smoke.log" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE ($(el))"
tail -5 "$W/smoke.log"
HUNG=0; { [ "$SMOKE" = 124 ] || [ "$SMOKE" = 137 ]; } && HUNG=1

if [ "$HUNG" = 1 ]; then
  echo "== 2. GPU tier SKIPPED (smoke test timed out: rc $SMOKE -> protocol hang?)"
else
  echo "== 2. GPU tier (cap ${T_TESTS:-80}s, $XD)"
  timeout -k 5 "${T_TESTS:-80}" $PT $TO $XD tests/test_mla_decode_gluon_ring.py -m gpu \
    --junitxml="$W/ring_tests.xml" > "$W/ring_tests.log" 2>&1
  echo "tests rc=$? ($(el))"
  tail -3 "$W/ring_tests.log"; grep -E "^FAILED|^ERROR" "$W/ring_tests.log" | head -20
  junit_json ring_tests "mla decode ring" 2>&1 | tail -2
fi

if [ "$HUNG" = 1 ]; then
  echo "== 3. bench SKIPPED (smoke test timed out)"
else
  echo "== 3. default vs ring bench, ${ROUNDS:-5} rotated rounds (cap ${T_BENCH:-65}s)"
  # shellcheck disable=SC2086
  timeout -k 5 "${T_BENCH:-65}" python3 benchmarks/mla_decode_ring.py "$W/mla_decode_ring.json" \
    --rounds "${ROUNDS:-5}" ${BENCH_ARGS:-} > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -v SUMMARY "$W/bench.log" | tail -6
  grep SUMMARY "$W/bench.log"
fi
tar czf "$OUT/mla_decode_ring.tgz" -C "$W" .
echo "== done ($(el)); tarball $OUT/mla_decode_ring.tgz"
exit 0
