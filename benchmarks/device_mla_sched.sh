#!/usr/bin/env bash
# Device port of FlashMLA's greedy split-KV scheduler (session 21; mla/metadata.py, compute_schedule(algorithm="greedy"),
# opt-in, not dispatched), first device run:
#   cd <clean export> && GIT_SHA=<sha> PYTHONPATH=$PWD/src OUT=$OUT bash benchmarks/device_mla_sched.sh
# 1a. tests/test_mla_sched_greedy.py GPU tier, scheduler only (-k "not under_greedy"): records == reference.mla.
#     flashmla_schedule on random / adversarial counts with poisoned outputs, b 1..70000, parts 1..264, counts near
#     2^31; no host sync; CUDA-graph replay with new counts; linear default unchanged (cap ${T_TESTS:-35} s). Gates 2.
# 1b. the end-to-end tests (-k under_greedy): dense and sparse decode through flash_mla_with_kvcache under the greedy
#     schedule vs the reference and vs the linear schedule, FlashMLA tolerances (cap ${T_E2E:-45} s, ${NPROC:-8}
#     workers; they compile the decode kernels the bench rows reuse). Reported, does not gate step 2.
# 2. benchmarks/mla_sched_sweep.py --rows greedy --sched-timing: the schedule kernels' own time (linear vs greedy, A/A,
#    b {1,64,128,1024,8192} x parts {33,66,132}), then the decode rows (6 sparse h_q 128 rows, V4.1+FP4 b 64 s_q 1,
#    then 3 dense h_q 128 rows) under lin5 (production), lin5b (A/A), fm5 (host greedy), greedy (device greedy),
#    rotated rounds, CUDA-graph replay (cap ${T_BENCH:-58} s, no new row after ${BUDGET:-42} s; JSON rewritten after
#    every row).
# One tarball $OUT/mla_sched.tgz (logs + JSON) + the summaries on stdout. Expected wall ~110-140 s (caps sum to 148).
NPROC=${NPROC:-8} DK_OUT_DEFAULT=/tmp/mla_sched_out DK_ENV_CAP=10 DK_PYTEST_TIMEOUT=40 . "$(dirname "$0")/_device_common.sh"

echo "== 1a. greedy scheduler GPU tests (cap ${T_TESTS:-35}s, $XD)"
gpu_tests sched_tests "mla greedy scheduler" "${T_TESTS:-35}" tests/test_mla_sched_greedy.py -k "not under_greedy"
RC=$?

echo "== 1b. dense / sparse decode under the greedy schedule (cap ${T_E2E:-45}s, $XD)"
gpu_tests e2e_tests "mla decode under greedy schedule" "${T_E2E:-45}" tests/test_mla_sched_greedy.py -k under_greedy
echo "e2e rc=$?"

if [ "$RC" != 0 ]; then
  echo "== 2. bench SKIPPED (scheduler tests rc $RC)"
else
  echo "== 2. schedule kernel timing + decode rows lin5 / lin5b / fm5 / greedy (cap ${T_BENCH:-58}s)"
  timeout -k 5 "${T_BENCH:-58}" python3 benchmarks/mla_sched_sweep.py --rows greedy --sched-timing \
    --variants lin5,lin5b,fm5,greedy --rounds "${ROUNDS:-3}" --budget-s "${BUDGET:-42}" \
    --json "$W/mla_sched.json" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "^sched|decode|err|budget|Error|error" "$W/bench.log" | tail -60
fi
tar czf "$OUT/mla_sched.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
