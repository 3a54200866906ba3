#!/usr/bin/env bash
# GPU tier of the MLA layer (deepkernels.model): absorbed path through the real decode kernel at V3 head counts.
set -u
export PYTHONPATH="${PYTHONPATH:-src}" PYTHONUNBUFFERED=1
python3 -m pytest tests/test_model_mla.py -m gpu -q -p no:cacheprovider 2>&1 | tee "${OUT:-/tmp}/model_gpu.log"
