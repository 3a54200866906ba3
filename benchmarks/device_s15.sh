#!/usr/bin/env bash
# Session 15's second device call (repo root, from a clean export):  GIT_SHA=<sha> bash benchmarks/device_s15.sh
# 1. GEMM: the public fp8_gemm_nt dispatch tests (TMA-store-epilogue Gluon config at M >= 4096 any K / M >= 1024
#    K >= 7168) and the other GPU tests of tests/test_gemm_gluon.py + tests/test_gemm.py (cap 120 s);
# 2. GEMM A/B at M = 1024, 2048, 4096 x the six DeepSeek-V3 (N, K): Triton table (public op, Gluon disabled),
#    Gluon register epilogue s4/s6, TMA-store epilogue s4/s6, cuBLAS blockwise (cap 110 s);
# 3. sparse decode WS: the GPU tests of tests/test_mla_sparse_decode_ws.py not run in the first call (cap 120 s),
#    then the timing diagnostics (benchmarks/sparse_decode_ws_profile.py: kernel vs consumers alone vs producer
#    alone; cap 90 s).
# Every step under `timeout`; no step stops the others. Files: everything in one tarball $OUT/s15.tgz (the device
# returns at most 8 files) + the summaries on stdout.
# the shared preamble, benchmarks/_device_common.sh: set -u, PYTHONPATH, GIT_SHA, OUT, W, el, env.json, TO, XD
DK_OUT_DEFAULT=/tmp/s15_out DK_ENV_CAP=30 DK_SHOW_SHA=0 . "$(dirname "$0")/_device_common.sh"
cat "$W/env.json"

echo "== 1. GEMM GPU tests (cap ${T_GEMM_TESTS:-120}s)"
timeout -k 5 "${T_GEMM_TESTS:-120}" python3 -m pytest tests/test_gemm_gluon.py tests/test_gemm.py -m gpu -q -rfs \
  -p no:cacheprovider $TO --junitxml="$W/gemm_tests.xml" > "$W/gemm_tests.log" 2>&1
echo "gemm tests rc=$? ($(el))"
tail -3 "$W/gemm_tests.log"; grep -E "^FAILED|^ERROR" "$W/gemm_tests.log" | head -20
junit_json gemm_tests "gemm"

echo "== 2. GEMM A/B at M 1024/2048/4096 (cap ${T_GEMM_AB:-110}s)"
timeout -k 5 "${T_GEMM_AB:-110}" python3 benchmarks/gemm_gluon.py --ab --epi --all-shapes --rounds 2 \
  --ms 1024,2048,4096 --budget-s $(( ${T_GEMM_AB:-110} - 20 )) --out "$W/gemm_epi_ab.json" > "$W/gemm_ab.log" 2>&1
echo "gemm A/B rc=$? ($(el))"
tail -45 "$W/gemm_ab.log"

echo "== 3a. sparse decode WS GPU tests (cap ${T_SP_TESTS:-120}s)"
timeout -k 5 "${T_SP_TESTS:-120}" python3 -m pytest tests/test_mla_sparse_decode_ws.py -m gpu -q -rfs -x \
  -p no:cacheprovider $TO --junitxml="$W/sparse_tests.xml" > "$W/sparse_tests.log" 2>&1
echo "sparse tests rc=$? ($(el))"
tail -3 "$W/sparse_tests.log"; grep -E "^FAILED|^ERROR" "$W/sparse_tests.log" | head -20
junit_json sparse_tests "sparse decode ws"

echo "== 3b. sparse decode WS timing diagnostics (cap ${T_PROF:-90}s)"
timeout -k 5 "${T_PROF:-90}" python3 benchmarks/sparse_decode_ws_profile.py "$W/sparse_decode_ws_profile.json" \
  > "$W/profile.log" 2>&1
echo "profile rc=$? ($(el))"
tail -12 "$W/profile.log"

tar czf "$OUT/s15.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
