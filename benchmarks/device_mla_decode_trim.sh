#!/usr/bin/env bash
# TRIM option of the Gluon dense MLA decode (deepkernels.mla._gluon_dense_decode, launcher keyword trim, constexpr
# TRIM; session 19, module docstring "TRIM"; not dispatched), first device run:
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_mla_decode_trim.sh        (repo root, clean export)
# 1. its GPU tests (tests/test_mla_decode_gluon_trim.py -m gpu -k trim: trim off vs on on the same inputs and
#    schedule, each against the reference with FlashMLA's tolerances, |out_on - out_off| <= 2 ulp, lse 1e-5 relative;
#    edge lengths 0 / 1 / 2 / 63 / 64 / 65 / 127 / 129, varlen, causal s_q 2, h_q 16 / 64 / 128, bf16 / fp16, NaN in
#    unused KV slots, poisoned outputs, every half_tiles / q_tma combination, split requests, stale schedule) under
#    a hang guard (cap ${T_TESTS:-85} s; -n ${NPROC:-8} when xdist is importable; ~24 kernel builds of ~3.5 s each
#    spread over the workers);
# 2. benchmarks/mla_decode_ring.py --trim: the dispatched kernel with trim off (default) vs on (trim) + an A/A
#    control (default_again), b 128, h_q 128 / 64, s_q 1 / 2 (causal), s_k 4096 / 8192 / 32768, ${ROUNDS:-5}
#    rotated rounds, paired per-round ratios (SUMMARY "t/def" = their median; prediction 0.95, 0.94-0.965 at h_q 128
#    s_q 1; falsified at >= 0.975) (cap ${T_BENCH:-100} s; runs whatever step 1 gave -- it checks NaN-poisoned
#    outputs and max |out - default| itself, and a step-1 cap hit may be slow compiles rather than a hang; the JSON
#    is rewritten after every shape, so a cap hit keeps the shapes done). BENCH_ARGS passes more options, e.g.
#    BENCH_ARGS='--variants default,trim,default_again,plain,plain_trim'.
# Total caps ~200 s (15 + 85 + 100). One tarball $OUT/mla_decode_trim.tgz (logs, junit, JSON) + summaries on stdout.
DK_OUT_DEFAULT=/tmp/mla_decode_trim_out DK_PYTEST_TIMEOUT=60 NPROC=${NPROC:-8} . "$(dirname "$0")/_device_common.sh"
cat "$W/env.json" 2>/dev/null | tr -d '\n' | cut -c1-400; echo

echo "== 1. trim GPU tests (cap ${T_TESTS:-85}s, $XD)"
timeout -k 5 "${T_TESTS:-85}" python3 -m pytest -p no:cacheprovider -v -rfs --tb=short $TO $XD \
  tests/test_mla_decode_gluon_trim.py -m gpu -k trim --junitxml="$W/trim_tests.xml" > "$W/trim_tests.log" 2>&1
RC=$?
echo "tests rc=$RC ($(el))"
tail -3 "$W/trim_tests.log"; grep -E "^FAILED|^ERROR" "$W/trim_tests.log" | head -20
junit_json trim_tests "mla decode trim" 2>&1 | tail -2

[ "$RC" = 124 ] || [ "$RC" = 137 ] && echo "   (tests hit the cap: see trim_tests.log for the last test reached)"
echo "== 2. trim off vs on paired bench, ${ROUNDS:-5} rotated rounds (cap ${T_BENCH:-100}s)"
# shellcheck disable=SC2086
timeout -k 5 "${T_BENCH:-100}" python3 benchmarks/mla_decode_ring.py "$W/mla_decode_trim.json" --trim \
  --rounds "${ROUNDS:-5}" ${BENCH_ARGS:-} > "$W/bench.log" 2>&1
echo "bench rc=$? ($(el))"
grep -v SUMMARY "$W/bench.log" | tail -6
grep SUMMARY "$W/bench.log"
tar czf "$OUT/mla_decode_trim.tgz" -C "$W" .
echo "== done ($(el)); tarball $OUT/mla_decode_trim.tgz"
exit 0
