#!/usr/bin/env bash
# WS3 sparse decode "Chunk 1 staged" (C1_SMEM; session 20 second round; mla/_gluon_sparse_decode_ws3.py module
# docstring, "Chunk 1 staged"), first device run, total <= 120 s:
#   GIT_SHA=<sha> PYTHONPATH=$PWD/src OUT=$OUT bash benchmarks/device_sparse_decode_s20b.sh   (repo root, clean export)
# 0. the smoke test alone (one small V4.1 call per build, several requests per CTA) under a ${T_SMOKE:-30} s cap: a
#    hang costs that cap, not the run; nothing else runs when it fails;
# 1. tests/test_mla_sparse_decode_ws3_c1.py -m gpu (bit identity of c1_smem=True against the dispatched V4.1 build:
#    NaN-poisoned outputs, NaN in unreferenced cache tokens, -1 / out-of-range indices, zero lengths, all-invalid
#    rows, several requests per CTA, the bench's specialisation) under a ${T_TESTS:-45} s cap, NPROC ${NPROC:-8};
# 2. benchmarks/sparse_decode_c1.py: base (dispatched) / A/A / c1 paired in ${ROUNDS:-9} rotated rounds, V4.1 at
#    (b, s_q) = (64, 1), (128, 1), (128, 2), h_q 128, topk 2048, under a ${T_BENCH:-30} s cap (JSON rewritten after
#    every row); skipped when step 1 failed.
# One tarball $OUT/sparse_decode_s20b.tgz + the SUMMARY lines on stdout.
NPROC=${NPROC:-8}
DK_OUT_DEFAULT=/tmp/sparse_decode_s20b_out DK_ENV_CAP=8 DK_PYTEST_TIMEOUT=35 . "$(dirname "$0")/_device_common.sh"
F=tests/test_mla_sparse_decode_ws3_c1.py

echo "== 0. smoke (cap ${T_SMOKE:-30}s)"
# shellcheck disable=SC2086
timeout -k 5 "${T_SMOKE:-30}" python3 -m pytest "$F" -m gpu -k smoke -q -rfs -p no:cacheprovider $TO \
  --junitxml="$W/smoke.xml" > "$W/smoke.log" 2>&1
RC=$?
echo "smoke rc=$RC ($(el))"
tail -3 "$W/smoke.log"

if [ "$RC" = 0 ]; then
  echo "== 1. GPU tests (cap ${T_TESTS:-45}s, $XD)"
  gpu_tests s20b_tests "mla sparse decode ws3 c1_smem (s20b)" "${T_TESTS:-45}" "$F" -k "not smoke"
  RC=$?
fi

if [ "$RC" != 0 ]; then
  echo "== 2. bench SKIPPED (rc $RC)"
else
  echo "== 2. paired bench (cap ${T_BENCH:-30}s)"
  timeout -k 5 "${T_BENCH:-30}" python3 benchmarks/sparse_decode_c1.py "$W/sparse_decode_c1.json" \
    --rounds "${ROUNDS:-9}" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "SUMMARY|Error|error" "$W/bench.log" | tail -20
fi
tar czf "$OUT/sparse_decode_s20b.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
