#!/usr/bin/env bash
# Device step for the Gluon sparse prefill kernels (src/deepkernels/mla/_gluon_sparse_prefill.py):
#   GIT_SHA=<sha> OUT=<dir> bash benchmarks/device_gluon_prefill.sh
# 1. GPU tests of the "single" and "ws" variants; 2. GPU tests of the experimental "seesaw" variant, separately and
# with -x (its mbarrier protocol is new: a hang costs one per-test timeout, not the step); 3. the sparse prefill
# benchmark, Triton default + gluon + gluon-ws + gluon-seesaw in one process (benchmarks/mla_prefill.py --gluon;
# gluon-seesaw is left out when its tests failed). Each part is capped (T_TESTS + T_SS + T_BENCH = 145 s).
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gluon_prefill_out}
mkdir -p "$OUT"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=60 --timeout-method=thread"   # a hang ends
timeout -k 5 "${T_TESTS:-45}" python3 -m pytest tests/test_gluon_sparse_prefill.py -m gpu -k "not seesaw" -q -rf \
  -p no:cacheprovider $TO > "$OUT/gluon_prefill_tests.log" 2>&1
echo "gluon prefill tests (single, ws) rc=$?" | tee -a "$OUT/gluon_prefill_tests.log"
grep -E "^FAILED|^ERROR|passed|failed|error|Timeout" "$OUT/gluon_prefill_tests.log" | tail -15
timeout -k 5 "${T_SS:-40}" python3 -m pytest tests/test_gluon_sparse_prefill.py -m gpu -k seesaw -x -q -rf \
  -p no:cacheprovider $TO > "$OUT/gluon_prefill_seesaw_tests.log" 2>&1
SS_RC=$?
echo "gluon prefill tests (seesaw) rc=$SS_RC" | tee -a "$OUT/gluon_prefill_seesaw_tests.log"
grep -E "^FAILED|^ERROR|passed|failed|error|Timeout" "$OUT/gluon_prefill_seesaw_tests.log" | tail -15
SKIP=""; [ "$SS_RC" -ne 0 ] && SKIP="gluon-seesaw"
timeout -k 5 "${T_BENCH:-60}" python3 benchmarks/mla_prefill.py --only sparse --gluon --gluon-skip "$SKIP" \
  --out "$OUT/mla_prefill_gluon-h200.json" > "$OUT/gluon_prefill_bench.log" 2>&1
echo "gluon prefill bench rc=$? (skipped: ${SKIP:-none})"
sed -n '/=== summary/,$p' "$OUT/gluon_prefill_bench.log" | cut -c1-220
python3 - "$OUT/mla_prefill_gluon-h200.json" <<'PY' || true
import json, sys
rows = json.load(open(sys.argv[1]))
print("config          " + " ".join(f"{s_kv:>6d}/{int(sk)}" for s_kv in (8192, 32768, 65536, 131072) for sk in (0, 1)))
cfgs = []
for r in rows:
    c = json.dumps(r.get("config"))
    if c not in cfgs:
        cfgs.append(c)
for c in cfgs:
    v = {(r["shape"]["s_kv"], r["shape"]["sink"]): r.get("tflops") for r in rows if json.dumps(r.get("config")) == c}
    print(f"{c[:15]:15s} " + " ".join(f"{v[(s, sk)]:8.1f}" if v.get((s, sk)) else "       -"
                                      for s in (8192, 32768, 65536, 131072) for sk in (False, True)))
PY
tail -3 "$OUT/gluon_prefill_bench.log" | cut -c1-300
exit 0
