#!/usr/bin/env bash
# WS3's opt-in extra-cache entry (V4.1 + FP4, V4.1 + V4.1, V3.2 + V3.2; _gluon_sparse_decode_ws3 module docstring,
# "Extra cache"; never dispatched), first device run:
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_ws3_extra.sh        (repo root, clean export)
# 1. smoke GPU test (one small V4.1 + FP4 call at h_q 128) under a hang guard (a ring / tx protocol bug in the extra
#    loop hangs; cap 40 s);
# 2. the GPU tier of tests/test_mla_sparse_decode_ws3_extra.py (cap ${T_TESTS:-90} s, --timeout=40 per test;
#    skipped when the smoke test failed or timed out);
# 3. benchmarks/sparse_decode_ws3_extra.py: WS vs WS3-extra, V4.1 + FP4 h_q 128 b 64 / 128 s_q 1 / 2 topk 2048 +
#    512, rotated rounds (cap ${T_BENCH:-50} s; skipped when step 1 failed).
# Total caps 15 + 40 + 90 + 50 = 195 s. One tarball $OUT/sparse_ws3_extra.tgz + the summaries on stdout.
DK_OUT_DEFAULT=/tmp/sparse_ws3_extra_out DK_PYTEST_TIMEOUT=40 . "$(dirname "$0")/_device_common.sh"

echo "== 1. smoke (cap 40s)"
timeout -k 5 40 python3 -m pytest tests/test_mla_sparse_decode_ws3_extra.py -m gpu -k smoke -q -rfs \
  -p no:cacheprovider > "$W/smoke.log" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE ($(el))"
tail -5 "$W/smoke.log"

if [ "$SMOKE" != 0 ]; then
  echo "== 2. WS3-extra GPU tier SKIPPED (smoke rc $SMOKE)"
else
  echo "== 2. WS3-extra GPU tier (cap ${T_TESTS:-90}s, $XD)"
  timeout -k 5 "${T_TESTS:-90}" python3 -m pytest tests/test_mla_sparse_decode_ws3_extra.py -m gpu -q -rfs \
    -p no:cacheprovider $TO $XD --junitxml="$W/ws3x_tests.xml" > "$W/ws3x_tests.log" 2>&1
  echo "tests rc=$? ($(el))"
  tail -3 "$W/ws3x_tests.log"; grep -E "^FAILED|^ERROR" "$W/ws3x_tests.log" | head -20
  junit_json ws3x_tests "sparse decode ws3 extra cache"
fi

if [ "$SMOKE" != 0 ]; then
  echo "== 3. bench SKIPPED (smoke rc $SMOKE)"
else
  echo "== 3. ws vs ws3-extra paired bench (cap ${T_BENCH:-50}s)"
  timeout -k 5 "${T_BENCH:-50}" python3 benchmarks/sparse_decode_ws3_extra.py "$W/sparse_decode_ws3_extra.json" \
    --rounds "${ROUNDS:-5}" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "SUMMARY|Error|error" "$W/bench.log" | tail -20
fi
tar czf "$OUT/sparse_ws3_extra.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
