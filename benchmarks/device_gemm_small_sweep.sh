#!/usr/bin/env bash
# Small-M FP8 GEMM rule sweep (session 20, second round; _gluon_fp8_small.rule_config behind
# DEEPKERNELS_GEMM_SMALL_RULE=1, OFF by default), first device run:
#   cd <clean export> && GIT_SHA=<sha> PYTHONPATH=$PWD/src OUT=$OUT bash benchmarks/device_gemm_small_sweep.sh
# 1. GPU tests of tests/test_gemm_small_sweep.py -k "not bitident" (the public op with the rule flag on at one shape
#    per build family of the rule, NaN-poisoned D vs float64 and vs the gemm_small-disabled path; flag off -> Triton
#    plan), xdist: also compiles the rule's builds into the Triton cache. Cap ${T_TESTS:-35} s; gates step 2.
# 2. benchmarks/gemm_small_sweep.py: ~30 (N, K) x M {128, 64, 16} (+ 1 / 96 at 6 pairs), per shape triton + A/A,
#    the rule through the public op, twin / twin_bn / auto / auto_reduce small variants; CUDA-graph replay (L2
#    flushed), ${ROUNDS:-3} rotated rounds, paired t/t_triton; cap ${T_BENCH:-68} s (shapes not started after
#    $(( ${T_BENCH:-68} - 12 )) s are skipped; JSON written after every shape).
# 3. only when >= 8 s are left of ${T_TOTAL:-117} s: the bit-identity tests (rule vs Triton path), not gating (the sweep
#    records bit_identical_to_triton per variant anyway).
# Caps 10 (env) + 35 + 68 = 113 s, step 3 fills up to ${T_TOTAL:-117} s <= 120 s; expected ~90-117 s.
# One tarball $OUT/gemm_small_sweep.tgz (logs, junit JSON, gemm_small_sweep.json, env.json) + summaries on stdout.
DK_OUT_DEFAULT=/tmp/gemm_small_sweep_out DK_ENV_CAP=10 DK_PYTEST_TIMEOUT=25 NPROC=${NPROC:-5} \
  . "$(dirname "$0")/_device_common.sh"

echo "== 1. rule GPU tests (cap ${T_TESTS:-35}s, $XD)"
gpu_tests sweep_tests "gemm small-M rule" "${T_TESTS:-35}" tests/test_gemm_small_sweep.py -k "not bitident"
RC=$?

if [ "$RC" != 0 ]; then
  echo "== 2. sweep SKIPPED (tests rc $RC)"
else
  echo "== 2. small-M rule sweep (cap ${T_BENCH:-68}s)"
  timeout -k 5 "${T_BENCH:-68}" python3 benchmarks/gemm_small_sweep.py --rounds "${ROUNDS:-3}" \
    --rep-ms "${REP_MS:-4}" --budget-s "$(( ${T_BENCH:-68} - 12 ))" --out "$W/gemm_small_sweep.json" \
    > "$W/sweep.log" 2>&1
  echo "sweep rc=$? ($(el))"
  grep -cE "^SUMMARY" "$W/sweep.log" | sed 's/^/shapes measured: /'
  grep -E "FIT|^  M|Error|error|Traceback" "$W/sweep.log" | head -24
  grep -E "^SUMMARY" "$W/sweep.log" | cut -c1-400 | head -120
fi

LEFT=$(( ${T_TOTAL:-117} - $(date +%s) + T0 ))
if [ "$LEFT" -ge 8 ]; then
  echo "== 3. rule bit identity vs the Triton path (cap ${LEFT}s, one process, not gating)"
  XD="" gpu_tests sweep_bitident "gemm small-M rule bit identity" "$LEFT" tests/test_gemm_small_sweep.py -k bitident
else
  echo "== 3. bit identity SKIPPED (${LEFT}s left)"
fi
tar czf "$OUT/gemm_small_sweep.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
