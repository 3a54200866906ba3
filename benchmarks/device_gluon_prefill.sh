#!/usr/bin/env bash
# Device step for the Gluon sparse prefill kernels (src/deepkernels/mla/_gluon_sparse_prefill.py):
#   GIT_SHA=<sha> OUT=<dir> bash benchmarks/device_gluon_prefill.sh
# 1. GPU tests of the "single" and "ws" variants; 2./3. GPU tests of the experimental "seesaw" and "seesaw-split"
# variants, each in its own pytest run with -x (their mbarrier protocol is new: a hang costs one per-test timeout and
# that run, not the step); 4. the sparse prefill benchmark, Triton default + gluon (dispatched) + gluon-ws +
# gluon-seesaw + gluon-seesaw-split in one process (benchmarks/mla_prefill.py --gluon; a seesaw label whose tests
# failed is left out). Each part is capped: T_TESTS + T_SS + T_SPLIT + T_BENCH = 35 + 25 + 25 + 60 = 145 s.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gluon_prefill_out}
mkdir -p "$OUT"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=60 --timeout-method=thread"   # a hang ends
run_tests() {   # name, time cap, pytest -k expression, extra pytest args
  timeout -k 5 "$2" python3 -m pytest tests/test_gluon_sparse_prefill.py -m gpu -k "$3" -q -rf -p no:cacheprovider \
    $TO $4 > "$OUT/gluon_prefill_tests_$1.log" 2>&1
  local rc=$?
  echo "gluon prefill tests ($1) rc=$rc" | tee -a "$OUT/gluon_prefill_tests_$1.log"
  grep -E "^FAILED|^ERROR|passed|failed|error|Timeout" "$OUT/gluon_prefill_tests_$1.log" | tail -8
  return $rc
}
XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n 4"   # the seesaw runs are compile-bound: 4 workers
[ "${SKIP_SINGLE_WS:-0}" = 1 ] || run_tests single_ws "${T_TESTS:-35}" "not seesaw" ""
SKIP=""
run_tests seesaw "${T_SS:-25}" "seesaw and not split" "-x $XD" || SKIP="gluon-seesaw"
run_tests seesaw_split "${T_SPLIT:-25}" "split" "-x $XD" || SKIP="$SKIP,gluon-seesaw-split"
timeout -k 5 "${T_BENCH:-60}" python3 benchmarks/mla_prefill.py --only sparse --gluon --gluon-skip "$SKIP" \
  --out "$OUT/mla_prefill_gluon-h200.json" > "$OUT/gluon_prefill_bench.log" 2>&1
echo "gluon prefill bench rc=$? (skipped: ${SKIP:-none})"
sed -n '/=== summary/,$p' "$OUT/gluon_prefill_bench.log" | cut -c1-220
python3 - "$OUT/mla_prefill_gluon-h200.json" <<'PY' || true
import json, sys
rows = json.load(open(sys.argv[1]))
shapes = [(s, sk) for s in (8192, 32768, 65536, 131072) for sk in (False, True)]
print("TFLOPS per config, s_kv/sink: " + " ".join(f"{s}/{int(sk)}" for s, sk in shapes))
cfgs = []
for r in rows:
    c = json.dumps(r.get("config"))
    if c not in cfgs:
        cfgs.append(c)
for c in cfgs:
    v = {(r["shape"]["s_kv"], r["shape"]["sink"]): r for r in rows if json.dumps(r.get("config")) == c}
    cell = lambda r: "       -" if r is None else (f"{r['tflops']:8.1f}" if "tflops" in r else "     ERR")  # noqa
    print(f"{c[:20]:20s} " + " ".join(cell(v.get(k)) for k in shapes)
          + "  max_abs_err " + f"{max((r.get('max_abs_err_rows') or 0) for r in v.values()):.2e}")
PY
tail -3 "$OUT/gluon_prefill_bench.log" | cut -c1-300
exit 0
