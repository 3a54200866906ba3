#!/usr/bin/env bash
# WS2 sparse prefill (split consumer: softmax warpgroup + PV warpgroup + the WS producer;
# deepkernels.mla._gluon_sparse_prefill_ws2), first device run:
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_prefill_ws2.sh        (repo root, clean export)
# 1. smoke GPU test under a hang guard (an mbarrier protocol bug hangs; cap 60 s);
# 2. the GPU tier of tests/test_gluon_sparse_prefill_ws2.py (cap ${T_WS2_TESTS:-120} s, --timeout=60 per test);
# 3. benchmarks/mla_prefill.py --only sparse --gluon: Triton default, gluon-ws, gluon-ws2 at s_q 4096, h_q 128,
#    topk 2048, s_kv ${S_KV:-8192,65536}, sink off/on (cap ${T_WS2_BENCH:-90} s; skipped when the smoke test hung);
# 4. verdict: tests clean (0 failed, >= 30 passed) and gluon-ws2 faster than gluon-ws at every bench shape with
#    errors within 2x of gluon-ws's -> $OUT/export_env gets DEEPKERNELS_SPARSE_PREFILL_WS2=1 (device_final.sh PRE).
# One tarball $OUT/sparse_prefill_ws2.tgz + summaries on stdout.
# the shared preamble, benchmarks/_device_common.sh: set -u, PYTHONPATH, GIT_SHA, OUT, W, el, env.json, TO, XD
DK_OUT_DEFAULT=/tmp/sparse_prefill_ws2_out . "$(dirname "$0")/_device_common.sh"
F=tests/test_gluon_sparse_prefill_ws2.py

echo "== 1. smoke (cap 60s)"
timeout -k 5 60 python3 -m pytest $F -m gpu -k smoke -q -rfs -p no:cacheprovider > "$W/smoke.log" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE ($(el))"
tail -5 "$W/smoke.log"
HUNG=0; { [ "$SMOKE" = 124 ] || [ "$SMOKE" = 137 ]; } && HUNG=1

if [ "$HUNG" = 1 ]; then
  echo "== 2. GPU tier SKIPPED (smoke test timed out: rc $SMOKE)"
else
  echo "== 2. WS2 prefill GPU tier (cap ${T_WS2_TESTS:-120}s, $XD)"
  timeout -k 5 "${T_WS2_TESTS:-120}" python3 -m pytest $F -m gpu -q -rfs -p no:cacheprovider $TO $XD \
    --junitxml="$W/ws2_tests.xml" > "$W/ws2_tests.log" 2>&1
  echo "tests rc=$? ($(el))"
  tail -3 "$W/ws2_tests.log"; grep -E "^FAILED|^ERROR" "$W/ws2_tests.log" | head -20
fi
junit_json ws2_tests "sparse prefill ws2"

if [ "$HUNG" = 1 ]; then
  echo "== 3. bench SKIPPED (smoke test timed out)"
else
  echo "== 3. Triton / gluon-ws / gluon-ws2 bench (cap ${T_WS2_BENCH:-90}s)"
  timeout -k 5 "${T_WS2_BENCH:-90}" python3 benchmarks/mla_prefill.py --only sparse --gluon --gluon-skip gluon \
    --s-kv "${S_KV:-8192,65536}" --out "$W/sparse_prefill_ws2.json" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "flash_mla_sparse_fwd" "$W/bench.log" | tail -12
fi

timeout -k 2 20 python3 - "$W/ws2_tests.json" "$W/sparse_prefill_ws2.json" "$OUT/export_env" <<'PY' 2>&1 | tee "$W/verdict.txt"
import json, sys
try:
    t = json.load(open(sys.argv[1]))["counts"]
    rows = json.load(open(sys.argv[2]))
except Exception as e:
    print("verdict: no (missing results: %s)" % e); sys.exit(0)
ok_tests = t["failed"] == 0 and t["error"] == 0 and t["passed"] >= 30
by = {}
for r in rows:
    if isinstance(r, dict) and r.get("config") in ("gluon-ws", "gluon-ws2"):
        by.setdefault(json.dumps(r["shape"], sort_keys=True), {})[r["config"]] = r
pairs = [(k, v["gluon-ws"], v["gluon-ws2"]) for k, v in by.items() if len(v) == 2]
ok = bool(pairs)
for k, a, b in pairs:
    sp = b.get("tflops", 0) / a["tflops"] if a.get("tflops") else 0
    err_ok = "max_abs_err_rows" in b and b["max_abs_err_rows"] <= max(2 * a.get("max_abs_err_rows", 0), 2e-3)
    print("verdict row %s: ws %.1f ws2 %.1f TFLOPS (x%.3f) err ws %s ws2 %s" % (
        k, a.get("tflops", 0), b.get("tflops", 0), sp, a.get("max_abs_err_rows"), b.get("max_abs_err_rows")))
    ok = ok and sp > 1.0 and err_ok
print("verdict: tests %s, rows %s" % (t, ok))
if ok_tests and ok:
    open(sys.argv[3], "w").write("DEEPKERNELS_SPARSE_PREFILL_WS2=1\n")
    print("verdict: DEEPKERNELS_SPARSE_PREFILL_WS2=1 exported")
PY
tar czf "$OUT/sparse_prefill_ws2.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
