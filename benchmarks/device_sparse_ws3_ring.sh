#!/usr/bin/env bash
# WS3's index ring (IDX_SMEM, session 19; _gluon_sparse_decode_ws3 module docstring, "Index ring"), first device run:
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_ws3_ring.sh        (repo root, clean export)
# 1. its GPU tests (-k idx_smem in tests/test_mla_sparse_decode_ws3.py and ..._ws3_extra.py: out / lse bit-identical
#    to the build without it at 5 shapes x 2 formats x prefetch on / off, all -1 / junk indices, the extra-cache entry
#    of all three pairs) under a hang guard (cap ${T_TESTS:-90} s; a ring-protocol bug hangs or differs);
# 2. benchmarks/sparse_decode_ws3_rope.py --ring: idx_smem off vs on (+ V3.2 with pf_lines) + an A/A control, paired
#    rotated rounds, SHAPES_IDX (cap ${T_BENCH:-90} s; skipped when step 1 failed);
# 3. benchmarks/sparse_decode_ws3_extra.py --quick --ring: V4.1 + FP4 b 128 s_q 1 (cap ${T_XBENCH:-40} s).
# One tarball $OUT/sparse_ws3_ring.tgz + the summaries on stdout.
DK_OUT_DEFAULT=/tmp/sparse_ws3_ring_out DK_PYTEST_TIMEOUT=40 . "$(dirname "$0")/_device_common.sh"

echo "== 1. idx_smem GPU tests (cap ${T_TESTS:-90}s, $XD)"
timeout -k 5 "${T_TESTS:-90}" python3 -m pytest tests/test_mla_sparse_decode_ws3.py tests/test_mla_sparse_decode_ws3_extra.py \
  -m gpu -k idx_smem -q -rfs -p no:cacheprovider $TO $XD --junitxml="$W/ring_tests.xml" > "$W/ring_tests.log" 2>&1
RC=$?
echo "tests rc=$RC ($(el))"
tail -3 "$W/ring_tests.log"; grep -E "^FAILED|^ERROR" "$W/ring_tests.log" | head -20
junit_json ring_tests "sparse decode ws3 idx_smem"

if [ "$RC" != 0 ]; then
  echo "== 2./3. benches SKIPPED (tests rc $RC)"
else
  echo "== 2. idx_smem off vs on paired bench (cap ${T_BENCH:-90}s)"
  timeout -k 5 "${T_BENCH:-90}" python3 benchmarks/sparse_decode_ws3_rope.py "$W/sparse_decode_ws3_ring.json" --ring \
    --rounds "${ROUNDS:-5}" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "SUMMARY|Error|error" "$W/bench.log" | tail -20
  echo "== 3. extra cache, idx_smem off vs on (cap ${T_XBENCH:-40}s)"
  timeout -k 5 "${T_XBENCH:-40}" python3 benchmarks/sparse_decode_ws3_extra.py "$W/sparse_decode_ws3_ring_extra.json" \
    --quick --ring --rounds "${ROUNDS:-5}" > "$W/xbench.log" 2>&1
  echo "xbench rc=$? ($(el))"
  grep -E "SUMMARY|Error|error" "$W/xbench.log" | tail -6
fi
tar czf "$OUT/sparse_ws3_ring.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
