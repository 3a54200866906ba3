#!/usr/bin/env bash
# L2PF option of the Gluon dense MLA decode (deepkernels.mla._gluon_dense_decode, launcher keyword l2pf, constexpr
# L2PF, with PVR only; session 20b, module docstring "L2PF option"; not dispatched), first device run:
#   cd <clean export> && GIT_SHA=<sha> PYTHONPATH=$PWD/src OUT=$OUT bash benchmarks/device_mla_decode_s20b.sh
# 1. its GPU tests (tests/test_mla_decode_gluon_l2pf.py -m gpu: PVR vs PVR + L2PF on the same inputs and schedule,
#    each against the reference with FlashMLA's tolerances, no NaN left in poisoned outputs, exact identity of the
#    two (the prefetch changes no arithmetic); edge lengths 0 / 1 / 2 / 63 / 64 / 65 / 127 / 128 / 129 / 700 / 3001
#    with NaN past every end, varlen with empty requests, causal s_q 2, h_q 64 / 128, bf16 / fp16, split requests
#    (1 / 3 / 264 SMs), stale schedule, padded q pitch, huge / negative block-table ids past the ends) under a hang
#    guard (cap ${T_TESTS:-50} s, per-test timeout 30 s when pytest-timeout is importable; -n ${NPROC:-8} with xdist);
# 2. only if step 1 passed: benchmarks/mla_decode_l2pf.py, the dispatched build (default: PVR + TRIM + Q by TMA at
#    h_q 128) vs l2pf + an A/A control (default_again), b 128 varlen, h_q 128 s_q 1 s_k 8K / 32K / 4K and s_q 2 8K,
#    ${ROUNDS:-5} rotated rounds, paired per-round ratios (SUMMARY "t/def"; prediction in
#    benchmarks/notes/mla_decode_gluon.md "Session 20b") (cap ${T_BENCH:-50} s; the JSON is rewritten after every
#    shape, so a cap hit keeps the shapes done).
# Total caps <= 120 s (env 8 + tests 50 + junit 10 + bench 50 + tar). One tarball $OUT/mla_decode_s20b.tgz.
DK_OUT_DEFAULT=/tmp/mla_decode_s20b_out DK_ENV_CAP=8 DK_PYTEST_TIMEOUT=30 NPROC=${NPROC:-8} \
  . "$(dirname "$0")/_device_common.sh"
cat "$W/env.json" 2>/dev/null | tr -d '\n' | cut -c1-300; echo

echo "== 1. l2pf GPU tests (cap ${T_TESTS:-50}s, $XD)"
gpu_tests l2pf_tests "mla decode l2pf" "${T_TESTS:-50}" tests/test_mla_decode_gluon_l2pf.py
RC=$?
[ "$RC" = 124 ] || [ "$RC" = 137 ] && echo "   (tests hit the cap: see l2pf_tests.log for the last test reached)"

if [ "$RC" = 0 ]; then
  echo "== 2. dispatched vs l2pf paired bench, ${ROUNDS:-5} rotated rounds (cap ${T_BENCH:-50}s)"
  # shellcheck disable=SC2086
  timeout -k 3 "${T_BENCH:-50}" python3 benchmarks/mla_decode_l2pf.py "$W/mla_decode_l2pf.json" \
    --rounds "${ROUNDS:-5}" --rep-ms "${REP_MS:-12}" ${BENCH_ARGS:-} > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -v SUMMARY "$W/bench.log" | tail -6
  grep SUMMARY "$W/bench.log"
else
  echo "== 2. bench skipped: tests rc=$RC"
fi
tar czf "$OUT/mla_decode_s20b.tgz" -C "$W" .
echo "== done ($(el)); tarball $OUT/mla_decode_s20b.tgz"
exit 0
