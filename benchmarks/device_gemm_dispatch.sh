#!/usr/bin/env bash
# Device step for the session-14 GEMM dispatch changes (repo root on the H200):
#   GIT_SHA=<sha> OUT=<dir> bash benchmarks/device_gemm_dispatch.sh        (~100 s of caps)
# 1. GPU tests of the Gluon GEMM paths through the public ops (masked Gluon dispatch + fast launch + graph replay,
#    dense Gluon plan fast launch, the production contiguous shapes); 2. the masked grouped benchmark, whose "ours"
#    row is now the dispatched Gluon kernel for the DeepGEMM shapes (JSON with provenance in $OUT); 3. host cost per
#    call of the Gluon vs Triton GEMM plans (benchmarks/gemm_host.py).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
OUT=${OUT:-/tmp/gemm_dispatch_out}
mkdir -p "$OUT"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=60"
timeout -k 5 "${T_T:-60}" python3 -m pytest tests/test_grouped_gemm_gpu.py tests/test_gemm_gluon.py -m gpu -q -rf \
  -p no:cacheprovider $TO -k "gluon_masked or fast_launch or production or public_dispatch" > "$OUT/tests.log" 2>&1
echo "gemm dispatch tests rc=$?"; grep -E "^FAILED|^ERROR|passed|failed" "$OUT/tests.log" | tail -12
timeout -k 5 "${T_M:-40}" python3 benchmarks/grouped_gemm.py --only masked --out "$OUT/grouped_gemm-masked.json" \
  > "$OUT/masked.log" 2>&1
echo "masked bench rc=$?"; grep -E "^masked|geomean" "$OUT/masked.log" | cut -c1-200
timeout -k 5 "${T_H:-40}" python3 benchmarks/gemm_host.py --out "$OUT/gemm_host.json" > "$OUT/host.log" 2>&1
echo "gemm host rc=$?"; grep "^HOST" "$OUT/host.log" | cut -c1-220
exit 0
