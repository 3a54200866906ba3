#!/usr/bin/env bash
# PVR option of the Gluon dense MLA decode (deepkernels.mla._gluon_dense_decode, launcher keyword pvr, constexpr PVR;
# session 20, module docstring "PVR option"; not dispatched), first device run:
#   cd <clean export> && GIT_SHA=<sha> PYTHONPATH=$PWD/src OUT=$OUT bash benchmarks/device_mla_decode_pvr.sh
# 1. its GPU tests (tests/test_mla_decode_gluon_pvr.py -m gpu: the dispatched build and the PVR build on the same
#    inputs and schedule, each against the reference with FlashMLA's tolerances, PVR vs dispatched within 2 ulp;
#    edge lengths 0 / 1 / 2 / 63 / 64 / 65 / 127 / 128 / 129 with NaN past every end, varlen with empty requests,
#    causal s_q 2, h_q 64 / 128, h_kv 2, bf16 / fp16, split requests (1 / 3 / 264 SMs), stale schedule, padded q
#    pitch, poisoned outputs; plus test_gpu_pvr_bitid_* = exact identity, informational) under a hang guard
#    (cap ${T_TESTS:-90} s, per-test timeout 60 s when pytest-timeout is importable; -n ${NPROC:-8} with xdist);
# 2. only if step 1 passed (failures in the bitid tests alone do not block it): benchmarks/mla_decode_pvr.py, the
#    dispatched build (default) vs pvr + an A/A control (default_again), b 128 varlen, h_q 128 s_q 1 / 2 (causal)
#    s_k 4K / 8K / 32K and h_q 64 s_q 1 8K, ${ROUNDS:-5} rotated rounds, paired per-round ratios (SUMMARY "t/def";
#    prediction in benchmarks/notes/mla_decode_gluon.md "Session 20") (cap ${T_BENCH:-75} s; the JSON is
#    rewritten after every shape, so a cap hit keeps the shapes done).
# Total caps ~180 s (15 + 90 + 75). One tarball $OUT/mla_decode_pvr.tgz (logs, junit, JSON) + summaries on stdout.
DK_OUT_DEFAULT=/tmp/mla_decode_pvr_out DK_PYTEST_TIMEOUT=60 NPROC=${NPROC:-8} . "$(dirname "$0")/_device_common.sh"
cat "$W/env.json" 2>/dev/null | tr -d '\n' | cut -c1-400; echo

echo "== 1. pvr GPU tests (cap ${T_TESTS:-90}s, $XD)"
gpu_tests pvr_tests "mla decode pvr" "${T_TESTS:-90}" tests/test_mla_decode_gluon_pvr.py
RC=$?
# gate: passed, or every failure a bitid test (exact identity is informational)
GATE=1
if [ "$RC" = 0 ]; then GATE=0
elif [ "$RC" = 1 ] && grep -qE "^FAILED" "$W/pvr_tests.log" && ! grep -E "^(FAILED|ERROR)" "$W/pvr_tests.log" | grep -qv bitid
then GATE=0; echo "   (only bitid tests failed: PVR is not bit-identical to the dispatched build; bench runs)"
fi
[ "$RC" = 124 ] || [ "$RC" = 137 ] && echo "   (tests hit the cap: see pvr_tests.log for the last test reached)"

if [ "$GATE" = 0 ]; then
  echo "== 2. dispatched vs pvr paired bench, ${ROUNDS:-5} rotated rounds (cap ${T_BENCH:-75}s)"
  # shellcheck disable=SC2086
  timeout -k 5 "${T_BENCH:-75}" python3 benchmarks/mla_decode_pvr.py "$W/mla_decode_pvr.json" \
    --rounds "${ROUNDS:-5}" ${BENCH_ARGS:-} > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -v SUMMARY "$W/bench.log" | tail -6
  grep SUMMARY "$W/bench.log"
else
  echo "== 2. bench skipped: tests rc=$RC"
fi
tar czf "$OUT/mla_decode_pvr.tgz" -C "$W" .
echo "== done ($(el)); tarball $OUT/mla_decode_pvr.tgz"
exit 0
