#!/usr/bin/env bash
# Device step for the Gluon sparse prefill kernels (src/deepkernels/mla/_gluon_sparse_prefill.py):
#   GIT_SHA=<sha> OUT=<dir> bash benchmarks/device_gluon_prefill.sh
# 1. GPU tests of the "single" and "ws" variants (SKIP_SINGLE_WS=1 leaves them out); 2. the sparse prefill
# benchmark, Triton default + gluon (dispatched) + gluon-ws in one process (benchmarks/mla_prefill.py --gluon).
# Each part is capped: T_TESTS + T_BENCH = 35 + 60 = 95 s.
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gluon_prefill_out}
mkdir -p "$OUT"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=60 --timeout-method=thread"   # a hang ends
if [ "${SKIP_SINGLE_WS:-0}" != 1 ]; then
  timeout -k 5 "${T_TESTS:-35}" python3 -m pytest tests/test_gluon_sparse_prefill.py -m gpu -q -rf -p no:cacheprovider \
    $TO > "$OUT/gluon_prefill_tests.log" 2>&1
  echo "gluon prefill tests rc=$?" | tee -a "$OUT/gluon_prefill_tests.log"
  grep -E "^FAILED|^ERROR|passed|failed|error|Timeout" "$OUT/gluon_prefill_tests.log" | tail -8
fi
timeout -k 5 "${T_BENCH:-60}" python3 benchmarks/mla_prefill.py --only sparse --gluon \
  --out "$OUT/mla_prefill_gluon-h200.json" > "$OUT/gluon_prefill_bench.log" 2>&1
echo "gluon prefill bench rc=$?"
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
