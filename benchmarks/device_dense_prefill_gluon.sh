#!/usr/bin/env bash
# Device step for the Gluon dense prefill kernel (src/deepkernels/mla/_gluon_dense_prefill.py, dispatched on sm90 by
# mla/dense_prefill.py; measured 2026-11-29: 0.86-1.10x SDPA):
#   GIT_SHA=<sha> OUT=<dir> bash benchmarks/device_dense_prefill_gluon.sh
# 1. GPU tests under a 60 s per-test timeout when pytest-timeout is importable (mbarrier hang guard), -x (TESTS_K=<expr>
#    selects with -k); 2. only if they pass: Triton vs Gluon vs SDPA at b 2, s 4096 / 8192, h 128, d (192,128) /
#    (128,128), causal and not (benchmarks/mla_prefill.py --only dense --gluon). Budget: T_TESTS 65 s + T_BENCH 80 s
#    < 150 s (compiles take ~3 s per kernel: 8 in the tests (GROUP 8 and GROUP 1 specialisations, d_qk x causal) and
#    4 again in the bench, whose GQA-free shapes specialise GROUP == 1 (a warm cache shares them); the bench writes its
#    JSON (with provenance) after every row, so a cut-off run keeps what it measured).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/dense_prefill_gluon_out}
mkdir -p "$OUT"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=60"
K=${TESTS_K-}
KARG=(); [ -n "$K" ] && KARG=(-k "$K")
timeout -k 5 "${T_TESTS:-65}" python3 -m pytest tests/test_dense_prefill_gluon.py -m gpu -q -rf -p no:cacheprovider $TO \
  -x "${KARG[@]}" > "$OUT/dense_prefill_gluon_tests.log" 2>&1
rc=$?
echo "gluon dense prefill tests rc=$rc"; grep -E "^FAILED|^ERROR|passed|failed|Timeout" "$OUT/dense_prefill_gluon_tests.log" | tail -10
if [ "$rc" -eq 0 ]; then
  timeout -k 5 "${T_BENCH:-80}" python3 benchmarks/mla_prefill.py --only dense --gluon \
    --out "$OUT/mla_prefill_dense_gluon-h200.json" > "$OUT/dense_prefill_gluon_bench.log" 2>&1
  echo "bench rc=$?"
  sed -n '/=== summary/,$p' "$OUT/dense_prefill_gluon_bench.log" | cut -c1-220
  grep -h '"gluon' "$OUT/dense_prefill_gluon_bench.log" | cut -c1-260 | tail -40
fi
exit 0
