#!/usr/bin/env bash
# Session 15's third device call (repo root, clean export):  GIT_SHA=<sha> bash benchmarks/device_s15b.sh
# 1. grouped GEMM TMA-store epilogue: benchmarks/device_grouped_epi.sh (its GPU tests + register-vs-EPI A/B; ~150 s);
# 2. the whole GPU tier of tests/test_mla_sparse_decode_ws.py (incl. the inline-PTX dequant bit-identity tests; the
#    first call's no-extra step hit its 40 s cap while compiling; cap 200 s);
# 3. benchmarks/sparse_decode_ws_profile.py: kernel vs consumers alone vs producer alone, default vs inline-PTX
#    dequant (cap 120 s).
# One tarball $OUT/s15b.tgz + summaries on stdout.
# the shared preamble, benchmarks/_device_common.sh: set -u, PYTHONPATH, GIT_SHA, OUT, W, el, env.json, TO, XD
DK_OUT_DEFAULT=/tmp/s15b_out DK_ENV_CAP=30 DK_PYTEST_TIMEOUT=90 DK_SHOW_SHA=0 . "$(dirname "$0")/_device_common.sh"
mkdir -p "$W/grouped"

echo "== 1. grouped EPI (cap ${T_GROUPED:-200}s)"
OUT="$W/grouped" timeout -k 5 "${T_GROUPED:-200}" bash benchmarks/device_grouped_epi.sh > "$W/grouped.log" 2>&1
echo "grouped rc=$? ($(el))"
tail -40 "$W/grouped.log"

echo "== 2. sparse decode WS GPU tier (cap ${T_SP_TESTS:-200}s)"
timeout -k 5 "${T_SP_TESTS:-200}" python3 -m pytest tests/test_mla_sparse_decode_ws.py -m gpu -q -rfs \
  -p no:cacheprovider $TO --junitxml="$W/sparse_tests.xml" > "$W/sparse_tests.log" 2>&1
echo "sparse tests rc=$? ($(el))"
tail -3 "$W/sparse_tests.log"; grep -E "^FAILED|^ERROR" "$W/sparse_tests.log" | head -20
junit_json sparse_tests "sparse decode ws"

echo "== 3. sparse decode WS profile + inline-PTX dequant A/B (cap ${T_PROF:-120}s)"
timeout -k 5 "${T_PROF:-120}" python3 benchmarks/sparse_decode_ws_profile.py "$W/sparse_decode_ws_profile.json" \
  > "$W/profile.log" 2>&1
echo "profile rc=$? ($(el))"
tail -12 "$W/profile.log"

tar czf "$OUT/s15b.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
