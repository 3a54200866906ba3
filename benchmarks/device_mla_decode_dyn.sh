#!/usr/bin/env bash
# DYN_QUEUE option of the Gluon dense MLA decode kernel (session 21; launcher keyword dyn_queue, constexpr DYN_QUEUE,
# off, not dispatched; benchmarks/notes/mla_decode_dyn.md), first run:
#   cd <clean export> && GIT_SHA=<sha> PYTHONPATH=$PWD/src OUT=$OUT bash benchmarks/device_mla_decode_dyn.sh
# 1. GPU tests under a hang guard (cap ${T_TESTS:-62} s, per-test timeout 60 s when pytest-timeout is importable,
#    -n ${NPROC:-6}): tests/test_mla_decode_dyn.py -m gpu (dyn launches bit-identical to the static launch of the
#    same schedule on NaN-poisoned outputs: h_q 16 / 32 / 64 / 128, s_q 1 / 2 causal, split + non-split pieces,
#    zero-length requests, 2-8 parts per SM, few CTAs; counter back at 0; CUDA graph of launch + combine replayed 3x
#    with changed seqlens);
# 2. only if step 1 passed: benchmarks/mla_decode_dyn.py (b 128: h_q 16 / 32 s_q 1 / 2 s_k 4K / 32K / 8K, h_q 128
#    s_q 1 4K / 32K; static (dispatched schedule), static again (A/A), dyn_same / dyn2 / dyn3 / dyn4; launch +
#    combine in CUDA graphs, ${ROUNDS:-5} rotated rounds) (cap ${T_BENCH:-88} s; JSON rewritten after every shape,
#    so a cap hit keeps the shapes done; shapes ordered 4K first, then 32K, h_q 128, 8K).
# Total caps 8 + 62 + 88 = 158 s (+ kill grace + tar: <= 170 s). One tarball $OUT/mla_decode_dyn.tgz (logs, junit,
# JSON) + summaries on stdout.
DK_OUT_DEFAULT=/tmp/mla_decode_dyn_out DK_ENV_CAP=8 DK_PYTEST_TIMEOUT=60 NPROC=${NPROC:-6} . "$(dirname "$0")/_device_common.sh"
cat "$W/env.json" 2>/dev/null | tr -d '\n' | cut -c1-400; echo

echo "== 1. DYN_QUEUE GPU tests (cap ${T_TESTS:-62}s, $XD)"
gpu_tests dyn_tests "mla decode dyn" "${T_TESTS:-62}" tests/test_mla_decode_dyn.py
RC=$?
[ "$RC" = 124 ] || [ "$RC" = 137 ] && echo "   (tests hit the cap: see dyn_tests.log for the last test reached)"

if [ "$RC" = 0 ]; then
  echo "== 2. DYN_QUEUE A/B, ${ROUNDS:-5} rotated rounds, CUDA-graph replay (cap ${T_BENCH:-88}s)"
  # shellcheck disable=SC2086
  timeout -k 3 "${T_BENCH:-88}" python3 benchmarks/mla_decode_dyn.py "$W/mla_decode_dyn.json" \
    --rounds "${ROUNDS:-5}" --rep-ms "${REP_MS:-20}" ${BENCH_ARGS:-} > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -v -E "^SUMMARY" "$W/bench.log" | tail -6
  grep -E "^SUMMARY" "$W/bench.log"
else
  echo "== 2. bench skipped: tests rc=$RC"
fi
tar czf "$OUT/mla_decode_dyn.tgz" -C "$W" .
echo "== done ($(el)); tarball $OUT/mla_decode_dyn.tgz"
exit 0
