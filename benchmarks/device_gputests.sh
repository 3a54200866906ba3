#!/usr/bin/env bash
# GPU tier of the kernel suites (no -x: every failure listed): dense GEMM, grouped GEMM, dense decode.
set -u
export PYTHONPATH="${PYTHONPATH:-src}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
python3 -m pytest tests/test_mla_decode_kernels.py tests/test_gemm.py tests/test_grouped_gemm_gpu.py tests/test_ops.py \
  -m gpu -q -p no:cacheprovider -rfE 2>&1 | tee "${OUT:-/tmp}/gputests.log" | tail -30
