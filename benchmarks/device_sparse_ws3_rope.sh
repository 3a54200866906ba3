#!/usr/bin/env bash
# WS3's opt-in producer options ROPE_ROWS (V3.2 RoPE gather 4 tokens x 8 lanes per cp.async) and ROW_LANES (producer
# lanes over token rows first: conflict-free NoPE stores); _gluon_sparse_decode_ws3 module docstring, "RoPE rows" /
# "Row lanes". First device run:
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_ws3_rope.sh        (repo root, clean export)
# 1. the options' GPU tests (tests/test_mla_sparse_decode_ws3.py -m gpu -k "rope_rows or row_lanes": rope_rows,
#    row_lanes, both and V4.1 row_lanes bit-identical to the default WS3 at 5 shapes incl. all-invalid / -1 / junk
#    indices, NaN-poisoned outputs; the public op with the options on), under a hang guard (cap ${T_TESTS:-75} s);
# 2. benchmarks/sparse_decode_ws3_rope.py: default vs ws3_rope / ws3_rl / ws3_rl_rope (+ an A/A control), rotated
#    rounds, 5 V3.2 shapes + V4.1 (cap ${T_BENCH:-80} s; skipped when step 1 failed or timed out).
# Total caps 15 + 75 + 80 = 170 s. One tarball $OUT/sparse_ws3_rope.tgz + the summaries on stdout.
DK_OUT_DEFAULT=/tmp/sparse_ws3_rope_out DK_PYTEST_TIMEOUT=40 . "$(dirname "$0")/_device_common.sh"

echo "== 1. rope_rows / row_lanes GPU tests (cap ${T_TESTS:-75}s)"
timeout -k 5 "${T_TESTS:-75}" python3 -m pytest tests/test_mla_sparse_decode_ws3.py -m gpu \
  -k "rope_rows or row_lanes" -q -rfs -p no:cacheprovider $TO --junitxml="$W/rope_tests.xml" > "$W/rope_tests.log" 2>&1
RC=$?
echo "tests rc=$RC ($(el))"
tail -3 "$W/rope_tests.log"; grep -E "^FAILED|^ERROR" "$W/rope_tests.log" | head -20
junit_json rope_tests "sparse decode ws3 rope_rows / row_lanes"

if [ "$RC" != 0 ]; then
  echo "== 2. bench SKIPPED (tests rc $RC)"
else
  echo "== 2. default vs rope_rows / row_lanes / both paired bench (cap ${T_BENCH:-80}s)"
  timeout -k 5 "${T_BENCH:-80}" python3 benchmarks/sparse_decode_ws3_rope.py "$W/sparse_decode_ws3_rope.json" \
    --rounds "${ROUNDS:-5}" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "SUMMARY|Error|error" "$W/bench.log" | tail -20
fi
tar czf "$OUT/sparse_ws3_rope.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
