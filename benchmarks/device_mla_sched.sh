#!/usr/bin/env bash
# Device port of FlashMLA's greedy split-KV scheduler (session 21; mla/metadata.py, compute_schedule(algorithm="greedy"),
# opt-in, not dispatched), first device run:
#   cd <clean export> && GIT_SHA=<sha> PYTHONPATH=$PWD/src OUT=$OUT bash benchmarks/device_mla_sched.sh
# 1. tests/test_mla_sched_greedy.py GPU tier (records == reference.mla.flashmla_schedule on random / adversarial counts
#    with poisoned outputs, b 1..70000, parts 1..264, counts near 2^31; no host sync; CUDA-graph replay with new counts;
#    dense and sparse decode through flash_mla_with_kvcache under the greedy schedule vs the reference and vs the
#    linear schedule, FlashMLA tolerances) under a hang guard (cap ${T_TESTS:-60} s);
# 2. benchmarks/mla_sched_sweep.py --rows greedy --sched-timing: the schedule kernels' own time (linear vs greedy,
#    b {1,64,128,1024,8192} x parts {33,66,132}), then the decode rows (6 sparse h_q 128 rows, V4.1+FP4 b 64 s_q 1,
#    3 dense h_q 128 rows) under lin5 (production), lin5b (A/A), fm5 (host greedy) and greedy (device greedy),
#    rotated rounds, CUDA-graph replay (cap ${T_BENCH:-75} s, no new row after ${BUDGET:-50} s; skipped when step 1
#    failed).
# One tarball $OUT/mla_sched.tgz (logs + JSON) + the summaries on stdout. Expected wall: ~130-145 s.
DK_OUT_DEFAULT=/tmp/mla_sched_out DK_ENV_CAP=10 DK_PYTEST_TIMEOUT=50 . "$(dirname "$0")/_device_common.sh"

echo "== 1. greedy scheduler GPU tests (cap ${T_TESTS:-60}s, $XD)"
gpu_tests sched_tests "mla greedy scheduler" "${T_TESTS:-60}" tests/test_mla_sched_greedy.py
RC=$?

if [ "$RC" != 0 ]; then
  echo "== 2. bench SKIPPED (tests rc $RC)"
else
  echo "== 2. schedule kernel timing + decode rows lin5 / lin5b / fm5 / greedy (cap ${T_BENCH:-75}s)"
  timeout -k 5 "${T_BENCH:-75}" python3 benchmarks/mla_sched_sweep.py --rows greedy --sched-timing \
    --variants lin5,lin5b,fm5,greedy --rounds "${ROUNDS:-3}" --budget-s "${BUDGET:-50}" \
    --json "$W/mla_sched.json" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "^sched|decode|err|budget|Error|error" "$W/bench.log" | tail -60
fi
tar czf "$OUT/mla_sched.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
