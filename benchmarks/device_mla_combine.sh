#!/usr/bin/env bash
# MLA decode fast combine + PDL (session 21; src/deepkernels/mla/combine.py module docstring "Fast combine",
# benchmarks/notes/mla_combine.md), first device run:
#   GIT_SHA=<sha> PYTHONPATH=$PWD/src OUT=$OUT bash benchmarks/device_mla_combine.sh     (repo root, clean export)
# 1a. tests/test_mla_combine_fast.py GPU tier without PDL (-k "not pdl": fast vs current combine bit for bit on random
#     partials, 6 configs; the public dense / sparse calls with the fast combine forced on vs off, poisoned outputs;
#     the public dense call captured in a CUDA graph) under a cap of ${T_TESTS:-50} s; gates step 2;
# 1b. the PDL tests (-k pdl: the same with launch_pdl, PDL right after a producer, CUDA-graph capture) under a cap of
#     ${T_PDL:-40} s; when they fail, step 2 runs without the fast_pdl variants (--no-pdl);
# 2.  benchmarks/mla_combine_ab.py: (a) the combine alone on the bench cases' real partials, current (+ A/A) vs fast
#     configs vs fast + PDL; (b) the whole public call, current (+ A/A) vs fast vs fast + PDL; rotated rounds,
#     CUDA-graph replay (cap: what is left of ${T_TOTAL:-145} s, at least 30 s; starts no case after cap - 12 s;
#     skipped when step 1a failed).
#     VARIANTS=fast,fast_r2,... picks the combine variants (mla_combine_ab.py --variants); ROUNDS (default 5).
# One tarball $OUT/mla_combine.tgz + the summaries on stdout. Total <= ~150 s: provenance <= 15 + tests <= 50 + 40
# leave >= 40 s of the 145 s for the bench (+ kill slack and the tarball).
DK_OUT_DEFAULT=/tmp/mla_combine_out DK_PYTEST_TIMEOUT=45 . "$(dirname "$0")/_device_common.sh"

echo "== 1a. fast combine GPU tests, no PDL (cap ${T_TESTS:-50}s, $XD)"
gpu_tests combine_tests "mla combine fast" "${T_TESTS:-50}" tests/test_mla_combine_fast.py -k "not pdl"
RC=$?
echo "== 1b. fast combine GPU tests, PDL (cap ${T_PDL:-40}s, $XD)"
gpu_tests combine_pdl_tests "mla combine fast pdl" "${T_PDL:-40}" tests/test_mla_combine_fast.py -k pdl
RCP=$?
NOPDL=""
[ "$RCP" != 0 ] && NOPDL="--no-pdl" && echo "(PDL tests rc $RCP: bench without the fast_pdl variants)"

TB=$(( ${T_TOTAL:-145} - $(date +%s) + T0 ))
[ "$TB" -lt 30 ] && TB=30
if [ "$RC" != 0 ]; then
  echo "== 2. bench SKIPPED (tests rc $RC)"
else
  echo "== 2. current vs fast vs fast+PDL paired bench (cap ${TB}s) $NOPDL"
  # shellcheck disable=SC2086
  timeout -k 3 "$TB" python3 benchmarks/mla_combine_ab.py --rounds "${ROUNDS:-5}" $NOPDL ${VARIANTS:+--variants "$VARIANTS"} \
    --budget-s "$(( TB - 12 ))" --out "$W/mla_combine.json" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "^(dense|sparse)|combine us|call    us|SUMMARY|Error|error|DIFF" "$W/bench.log" | cut -c1-240 | tail -60
fi
tar czf "$OUT/mla_combine.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
