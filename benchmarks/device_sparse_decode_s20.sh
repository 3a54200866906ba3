#!/usr/bin/env bash
# WS3 sparse decode "Q ahead" (session 20; mla/_gluon_sparse_decode_ws3.py module docstring, "Q ahead"), first
# device run, total <= 180 s:
#   GIT_SHA=<sha> PYTHONPATH=$PWD/src OUT=$OUT bash benchmarks/device_sparse_decode_s20.sh    (repo root, clean export)
# 0. the smoke test alone (one small V4.1 call per build, several requests per CTA) under a ${T_SMOKE:-40} s cap: a
#    hang costs that cap, not the run; nothing else runs when it fails;
# 1. tests/test_mla_sparse_decode_ws3_s20.py -m gpu (bit identity against the dispatched build for V3.2, V4.1 and the
#    extra-cache pairs: NaN-poisoned outputs, NaN in unreferenced cache tokens, -1 / out-of-range indices, zero
#    lengths, several requests per CTA; the public op with the option on; the bench's d144 / qa variants) under a
#    ${T_TESTS:-65} s cap, NPROC ${NPROC:-8} workers (they also compile the bench's specialisations);
# 2. benchmarks/sparse_decode_s20.py: base (dispatched) / A/A / q_ahead (+ V4.1 q_async and d144) paired in
#    ${ROUNDS:-5} rotated rounds, V4.1, V3.2, V4.1 + FP4 at (b, s_q) = (64, 1), (128, 1), (128, 2), h_q 128, under a
#    ${T_BENCH:-58} s cap (its JSON is rewritten after every row); skipped when step 1 failed.
# One tarball $OUT/sparse_decode_s20.tgz + the SUMMARY lines on stdout.
NPROC=${NPROC:-8}
DK_OUT_DEFAULT=/tmp/sparse_decode_s20_out DK_ENV_CAP=8 DK_PYTEST_TIMEOUT=45 . "$(dirname "$0")/_device_common.sh"
F=tests/test_mla_sparse_decode_ws3_s20.py

echo "== 0. smoke (cap ${T_SMOKE:-40}s)"
# shellcheck disable=SC2086
timeout -k 5 "${T_SMOKE:-40}" python3 -m pytest "$F" -m gpu -k smoke -q -rfs -p no:cacheprovider $TO \
  --junitxml="$W/smoke.xml" > "$W/smoke.log" 2>&1
RC=$?
echo "smoke rc=$RC ($(el))"
tail -3 "$W/smoke.log"

if [ "$RC" = 0 ]; then
  echo "== 1. GPU tests (cap ${T_TESTS:-65}s, $XD)"
  gpu_tests s20_tests "mla sparse decode ws3 q_ahead (s20)" "${T_TESTS:-65}" "$F" -k "not smoke"
  RC=$?
fi

if [ "$RC" != 0 ]; then
  echo "== 2. bench SKIPPED (rc $RC)"
else
  echo "== 2. paired bench (cap ${T_BENCH:-58}s)"
  timeout -k 5 "${T_BENCH:-58}" python3 benchmarks/sparse_decode_s20.py "$W/sparse_decode_s20.json" \
    --rounds "${ROUNDS:-5}" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "SUMMARY|Error|error" "$W/bench.log" | tail -20
fi
tar czf "$OUT/sparse_decode_s20.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
