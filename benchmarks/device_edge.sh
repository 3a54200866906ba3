#!/usr/bin/env bash
# GPU tier of the cross-cutting suites: edge-case rows (tests/test_edge_cases_*.py), user-report repros, the MLA
# layer (tests/test_model_mla.py) and the dense-prefill edge tests. No -x: every failure is listed.
set -u
export PYTHONPATH="${PYTHONPATH:-src}" PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
python3 -m pytest tests/test_edge_cases_*.py tests/test_user_reports.py tests/test_model_mla.py -m gpu -q \
  -p no:cacheprovider -rfE 2>&1 | tee "${OUT:-/tmp}/edge_gpu.log" | tail -40
