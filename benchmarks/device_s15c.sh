#!/usr/bin/env bash
# Session 15's fourth device call (clean export):  GIT_SHA=<sha> bash benchmarks/device_s15c.sh
# 1. benchmarks/sparse_decode_ws_profile.py: kernel / consumers alone / producer alone x default / asm / L2 prefetch /
#    both (cap 110 s); 2. the producer options' bit-identity GPU tests (inline-PTX dequant, L2 prefetch; 12 tests,
#    cap 100 s). One tarball $OUT/s15c.tgz + summaries on stdout.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
export GIT_SHA="${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
OUT=${OUT:-/tmp/s15c_out}
W=$(mktemp -d)
mkdir -p "$OUT"
unset TRITON_INTERPRET
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
timeout -k 2 30 python3 -c 'import json, sys; from deepkernels.bench.runner import provenance
json.dump(provenance(), open(sys.argv[1], "w"), indent=1)' "$W/env.json" 2>&1
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=60"
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
timeout -k 2 10 python3 benchmarks/junit_summary.py "$W/tests.xml" "$W/env.json" "$W/tests.json" "ws producer options"
tar czf "$OUT/s15c.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
