#!/usr/bin/env bash
# WS2 sparse decode (dense-decode consumer structure; deepkernels.mla._gluon_sparse_decode_ws2), first device run:
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_ws2.sh        (repo root, clean export)
# 0. provenance (cap 15 s);
# 1. smoke GPU test under a hang guard (an mbarrier protocol bug hangs; cap 60 s);
# 2. the GPU tier of tests/test_mla_sparse_decode_ws2.py (cap 145 s, --timeout=60 per test if pytest_timeout);
# 3. benchmarks/sparse_decode_ws2.py: ws vs ws2 (+ ws2 consumers alone), V3.2 + V4.1, 4 shapes (cap 60 s; skipped
#    when the smoke test timed out).
# Total caps 280 s. One tarball $OUT/sparse_ws2.tgz + summaries on stdout; no step stops the others (except 1 -> 3).
# the shared preamble, benchmarks/_device_common.sh: set -u, PYTHONPATH, GIT_SHA, OUT, W, el, env.json, TO, XD
DK_OUT_DEFAULT=/tmp/sparse_ws2_out . "$(dirname "$0")/_device_common.sh"

echo "== 1. smoke (cap 60s)"
timeout -k 5 60 python3 -m pytest tests/test_mla_sparse_decode_ws2.py -m gpu -k smoke -q -rfs -p no:cacheprovider \
  > "$W/smoke.log" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE ($(el))"
tail -5 "$W/smoke.log"

if [ "$SMOKE" = 124 ] || [ "$SMOKE" = 137 ]; then
  echo "== 2. WS2 GPU tier SKIPPED (smoke test timed out: rc $SMOKE)"
else
  echo "== 2. WS2 GPU tier (cap ${T_WS2_TESTS:-145}s, $XD)"
  timeout -k 5 "${T_WS2_TESTS:-145}" python3 -m pytest tests/test_mla_sparse_decode_ws2.py -m gpu -q -rfs \
    -p no:cacheprovider $TO $XD --junitxml="$W/ws2_tests.xml" > "$W/ws2_tests.log" 2>&1
  echo "tests rc=$? ($(el))"
fi
tail -3 "$W/ws2_tests.log"; grep -E "^FAILED|^ERROR" "$W/ws2_tests.log" | head -20
junit_json ws2_tests "sparse decode ws2"

if [ "$SMOKE" = 124 ] || [ "$SMOKE" = 137 ]; then
  echo "== 3. bench SKIPPED (smoke test timed out: rc $SMOKE)"
else
  echo "== 3. ws vs ws2 bench (cap 60s)"
  timeout -k 5 60 python3 benchmarks/sparse_decode_ws2.py "$W/sparse_decode_ws2.json" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  tail -10 "$W/bench.log"
fi

# 4. verdict: GPU tier clean (no failure, >= 20 passed) and WS2 faster than WS with finite output at every bench
#    row -> $OUT/export_env switches the public op to WS2 for the rest of a device_final.sh run (PRE step)
timeout -k 2 20 python3 - "$W/ws2_tests.json" "$W/sparse_decode_ws2.json" "$OUT/export_env" <<'PY' 2>&1 | tee "$W/verdict.txt"
import json, sys
try:
    t = json.load(open(sys.argv[1]))["counts"]
    rows = json.load(open(sys.argv[2]))["rows"]
except Exception as e:
    print("verdict: no (missing results: %s)" % e); sys.exit(0)
ok_tests = t["failed"] == 0 and t["error"] == 0 and t["passed"] >= 20
ok_rows = bool(rows) and all(r.get("speedup", 0) > 1.0 and not r.get("ws2_nan", True) for r in rows)
print("verdict: tests %s, rows %s (speedups %s)" % (t, ok_rows, [round(r.get("speedup", 0), 3) for r in rows]))
if ok_tests and ok_rows:
    open(sys.argv[3], "w").write("DEEPKERNELS_SPARSE_WS2=1\n")
    print("verdict: DEEPKERNELS_SPARSE_WS2=1 exported")
PY
tar czf "$OUT/sparse_ws2.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
