#!/usr/bin/env bash
# WS3 sparse decode (WS2 + 2-CTA cluster producer sharing; deepkernels.mla._gluon_sparse_decode_ws3), first run:
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_ws3.sh        (repo root, clean export)
# 0. provenance (cap 15 s);
# 1. smoke GPU test under a hang guard (a cluster / mbarrier protocol bug hangs; cap 50 s);
# 2. the GPU tier of tests/test_mla_sparse_decode_ws3.py (cap ${T_WS3_TESTS:-110} s, --timeout=40 per test);
# 3. benchmarks/sparse_decode_ws3.py: ws vs ws2 vs ws3, V3.2 + V4.1, 3 shapes (cap 55 s; skipped when the smoke
#    test timed out or failed).
# Total caps 230 s. One tarball $OUT/sparse_ws3.tgz + summaries on stdout. Never dispatches anything.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
export GIT_SHA="${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
OUT=${OUT:-/tmp/sparse_ws3_out}
W=$(mktemp -d)
mkdir -p "$OUT"
unset TRITON_INTERPRET
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
echo "GIT_SHA=$GIT_SHA"
timeout -k 2 15 python3 -c 'import json, sys; from deepkernels.bench.runner import provenance
json.dump(provenance(), open(sys.argv[1], "w"), indent=1)' "$W/env.json" 2>&1
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=40"

echo "== 1. smoke (cap 50s)"
timeout -k 5 50 python3 -m pytest tests/test_mla_sparse_decode_ws3.py -m gpu -k smoke -q -rfs -p no:cacheprovider \
  > "$W/smoke.log" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE ($(el))"
tail -5 "$W/smoke.log"

XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n ${NPROC:-4}"
if [ "$SMOKE" != 0 ]; then
  echo "== 2. WS3 GPU tier SKIPPED (smoke rc $SMOKE)"
else
  echo "== 2. WS3 GPU tier (cap ${T_WS3_TESTS:-110}s, $XD)"
  timeout -k 5 "${T_WS3_TESTS:-110}" python3 -m pytest tests/test_mla_sparse_decode_ws3.py -m gpu -q -rfs \
    -p no:cacheprovider $TO $XD --junitxml="$W/ws3_tests.xml" > "$W/ws3_tests.log" 2>&1
  echo "tests rc=$? ($(el))"
  tail -3 "$W/ws3_tests.log"; grep -E "^FAILED|^ERROR" "$W/ws3_tests.log" | head -20
  timeout -k 2 10 python3 benchmarks/junit_summary.py "$W/ws3_tests.xml" "$W/env.json" \
    "$W/ws3_tests.json" "sparse decode ws3"
fi

if [ "$SMOKE" != 0 ]; then
  echo "== 3. bench SKIPPED (smoke rc $SMOKE)"
else
  echo "== 3. ws vs ws2 vs ws3 bench (cap 55s)"
  timeout -k 5 55 python3 benchmarks/sparse_decode_ws3.py "$W/sparse_decode_ws3.json" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  tail -8 "$W/bench.log"
fi
tar czf "$OUT/sparse_ws3.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
