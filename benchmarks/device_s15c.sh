#!/usr/bin/env bash
# Session 15's fourth device call (clean export):  GIT_SHA=<sha> bash benchmarks/device_s15c.sh
# 1. benchmarks/sparse_decode_ws_profile.py: kernel / consumers alone / producer alone x default / asm / L2 prefetch /
#    both (cap 110 s); 2. the producer options' bit-identity GPU tests (inline-PTX dequant, L2 prefetch; 12 tests,
#    cap 100 s). One tarball $OUT/s15c.tgz + summaries on stdout.
# the shared preamble, benchmarks/_device_common.sh: set -u, PYTHONPATH, GIT_SHA, OUT, W, el, env.json, TO, XD
DK_OUT_DEFAULT=/tmp/s15c_out DK_ENV_CAP=30 DK_SHOW_SHA=0 . "$(dirname "$0")/_device_common.sh"
echo "== 1. profile A/B (cap ${T_PROF:-110}s)"
timeout -k 5 "${T_PROF:-110}" python3 benchmarks/sparse_decode_ws_profile.py "$W/sparse_decode_ws_profile.json" \
  > "$W/profile.log" 2>&1
echo "profile rc=$? ($(el))"
tail -10 "$W/profile.log"
echo "== 2. producer-option bit-identity tests (cap ${T_TESTS:-100}s)"
timeout -k 5 "${T_TESTS:-100}" python3 -m pytest tests/test_mla_sparse_decode_ws.py -m gpu -k deq_asm_bit_identical \
  -q -rfs -p no:cacheprovider $TO --junitxml="$W/tests.xml" > "$W/tests.log" 2>&1
echo "tests rc=$? ($(el))"
tail -3 "$W/tests.log"; grep -E "^FAILED|^ERROR" "$W/tests.log" | head -20
junit_json tests "ws producer options"
tar czf "$OUT/s15c.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
