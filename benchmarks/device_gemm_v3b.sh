#!/usr/bin/env bash
# Second v3 device call: drift-robust interleaved A/B timings (repo root):  GIT_SHA=<sha> bash benchmarks/device_gemm_v3b.sh
# 1. grouped contiguous public op: Triton vs Gluon dispatch, with/without the per-call MN-major sfa copy (6 shapes);
# 2. dense K >= 7168: Triton table vs Gluon s4/s6 (+prefetch) vs cuBLAS. 3 rounds each, every variant checked first.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
OUT=${OUT:-/tmp/gemm_v3b_out}
mkdir -p "$OUT"
{ date -u; nvidia-smi --query-gpu=name,clocks.sm,temperature.gpu,power.draw --format=csv; echo "GIT_SHA=${GIT_SHA:-unknown}"; } 2>&1
echo "== grouped contiguous A/B (cap ${T_A:-60}s)"
timeout -k 5 "${T_A:-60}" python3 benchmarks/grouped_gemm.py --ab --out "$OUT/grouped_gemm-v3-ab.json" 2>&1 | tee "$OUT/v3b.log"
echo "rc=${PIPESTATUS[0]}"
echo "== dense K>=7168 A/B (cap ${T_B:-45}s)"
timeout -k 5 "${T_B:-45}" python3 benchmarks/gemm_gluon.py --ab --out "$OUT/gemm_gluon-v3-ab.json" 2>&1 | tee -a "$OUT/v3b.log"
echo "rc=${PIPESTATUS[0]}"
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv 2>&1
exit 0
