#!/usr/bin/env bash
# WS4 sparse prefill (FlashMLA sm90 pair order in Gluon; deepkernels.mla._gluon_sparse_prefill_ws4, opt-in, not
# dispatched), first device run:
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_prefill_ws4.sh        (repo root, clean export)
# 0. provenance (cap 10 s);
# 1. smoke GPU test of the default kernel under a hang guard (an mbarrier protocol bug hangs; cap ${T_P4_SMOKE:-30} s);
#    then (ABLATE=${ABLATE:-1}) the smoke tests of the SYM / WHOLE ablations (cap ${T_P4_SMOKE_ABL:-25} s; if they
#    hang or fail, the ablations leave the bench);
# 2. the GPU tier of tests/test_gluon_sparse_prefill_ws4.py (default kernel + the SYM / WHOLE ablations; cap
#    ${T_P4_TESTS:-60} s, --timeout=40 per test; bit identity to WS2 recorded, counted below); skipped when the
#    default smoke test hung or failed;
# 3. benchmarks/mla_prefill.py --only sparse --gluon --no-triton --rounds ${ROUNDS:-6}: gluon-ws2 (paired base),
#    gluon-ws4 and (ablation smoke passed) the F2 ablations gluon-ws4-sym / gluon-ws4-whole at s_q 4096, h_q 128,
#    topk 2048, s_kv ${S_KV:-8192,65536}, sink ${SINK:-off,on}; rotated rounds, paired ratios t / t_ws2 of the same
#    round (cap ${T_P4_BENCH:-85} s; skipped when the default smoke test hung or failed);
# 4. verdict per shape: paired median ratio vs ws2 (< 1 faster), TFLOPS, bit identity vs ws2, errors; the module
#    docstring's prediction (8K 0.85-0.93, 64K 0.86-0.93) and falsifiers F1 (8K ratio > 0.96), F3 (64K / 8K TFLOPS
#    < 0.84), F2 (sym must be >= 6 % slower than ws4, whole >= 5 % slower at 64K) evaluated.
# Caps total 10 + 30 + 25 + 60 + 85 + 10 = 220 s (+ up to 3 s kill grace per capped step). Nothing is exported or
# dispatched. One tarball $OUT/sparse_prefill_ws4.tgz + summaries on stdout.
DK_OUT_DEFAULT=/tmp/sparse_prefill_ws4_out DK_ENV_CAP=10 DK_PYTEST_TIMEOUT=40 . "$(dirname "$0")/_device_common.sh"
F=tests/test_gluon_sparse_prefill_ws4.py

echo "== 1. smoke (cap ${T_P4_SMOKE:-30}s)"
timeout -k 3 "${T_P4_SMOKE:-30}" python3 -m pytest $F -m gpu -k "smoke and def" -q -rfs -p no:cacheprovider \
  > "$W/smoke.log" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE ($(el))"
tail -5 "$W/smoke.log"
ABL_OK=0
if [ "$SMOKE" = 0 ] && [ "${ABLATE:-1}" = 1 ]; then
  echo "== 1b. ablation smoke (cap ${T_P4_SMOKE_ABL:-25}s)"
  timeout -k 3 "${T_P4_SMOKE_ABL:-25}" python3 -m pytest $F -m gpu -k "smoke and not def" -q -rfs \
    -p no:cacheprovider > "$W/smoke_abl.log" 2>&1
  RC=$?
  echo "ablation smoke rc=$RC ($(el))"
  tail -3 "$W/smoke_abl.log"
  [ "$RC" = 0 ] && ABL_OK=1
fi

if [ "$SMOKE" != 0 ]; then
  echo "== 2. WS4 GPU tier SKIPPED (smoke rc $SMOKE)"
else
  echo "== 2. WS4 GPU tier (cap ${T_P4_TESTS:-60}s, $XD)"
  timeout -k 3 "${T_P4_TESTS:-60}" python3 -m pytest $F -m gpu -k "not smoke" -q -rfs -p no:cacheprovider \
    $TO $XD --junitxml="$W/ws4_tests.xml" > "$W/ws4_tests.log" 2>&1
  echo "tests rc=$? ($(el))"
  tail -3 "$W/ws4_tests.log"; grep -E "^FAILED|^ERROR" "$W/ws4_tests.log" | head -20
  junit_json ws4_tests "sparse prefill ws4"
  grep -o 'name="bit_identical_to_ws2" value="[A-Za-z]*"' "$W"/ws4_tests.xml 2>/dev/null | sort | uniq -c
fi

if [ "$SMOKE" != 0 ]; then
  echo "== 3. bench SKIPPED (smoke rc $SMOKE)"
else
  ADD=gluon-ws4
  [ "$ABL_OK" = 1 ] && ADD=gluon-ws4,gluon-ws4-sym,gluon-ws4-whole
  echo "== 3. ws2 / $ADD, ${ROUNDS:-6} rotated rounds (cap ${T_P4_BENCH:-85}s)"
  timeout -k 3 "${T_P4_BENCH:-85}" python3 benchmarks/mla_prefill.py --only sparse --gluon --no-triton \
    --gluon-skip gluon,gluon-ws --gluon-add "$ADD" \
    --rounds "${ROUNDS:-6}" --paired-base gluon-ws2 --sink "${SINK:-off,on}" --s-kv "${S_KV:-8192,65536}" \
    --out "$W/sparse_prefill_ws4.json" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "flash_mla_sparse_fwd" "$W/bench.log" | tail -12
fi

timeout -k 1 10 python3 - "$W/ws4_tests.json" "$W/sparse_prefill_ws4.json" <<'PY' 2>&1 | tee "$W/verdict.txt"
import json, sys
try:
    t = json.load(open(sys.argv[1]))["counts"]
except Exception as e:
    t = {"missing": repr(e)}
try:
    rows = json.load(open(sys.argv[2]))
except Exception as e:
    print("verdict: no bench rows (%s)" % e)
    rows = []
by = {}
for r in rows:
    if isinstance(r, dict) and str(r.get("config", "")).startswith("gluon-ws"):
        by.setdefault(json.dumps(r["shape"], sort_keys=True), {})[r["config"]] = r
label = "gluon-ws4"
ok, n, tf = True, 0, {}
for k, v in sorted(by.items()):
    a, b = v.get("gluon-ws2"), v.get(label)
    if not a or not b or "paired_median" not in b:
        if b and "error" in b:
            print("verdict row %s: %s error %s" % (k, label, b["error"][:200]))
        ok = False
        continue
    n += 1
    pm = b["paired_median"]
    shape = json.loads(k)
    tf[(shape.get("s_kv"), shape.get("sink"))] = (b["tflops"], pm)
    err_ok = b.get("max_abs_err_rows", 1) <= max(2 * a.get("max_abs_err_rows", 0), 2e-3) and not b.get("nan")
    print("verdict row %s: ws2 %.1f %s %.1f TFLOPS, paired t/t_ws2 median %.3f (rounds %s) bit-identical %s "
          "err ws2 %s %s %s" % (k, a["tflops"], label, b["tflops"], pm,
                                ["%.3f" % x for x in b.get("paired_ratios", [])], b.get("bit_identical_to_base"),
                                a.get("max_abs_err_rows"), label, b.get("max_abs_err_rows")))
    ok = ok and pm < 0.99 and err_ok
print("verdict %s: %s than ws2 at every shape (%d shapes)" % (label, "faster" if ok and n else "NOT faster", n))
for sink in (False, True):
    r8, r64 = tf.get((8192, sink)), tf.get((65536, sink))
    if r8:
        print("prediction sink=%s 8K: paired %.3f (predicted 0.85-0.93; falsifier F1 hit, ratio > 0.96: %s)"
              % (sink, r8[1], r8[1] > 0.96))
    if r64:
        print("prediction sink=%s 64K: paired %.3f (predicted 0.86-0.93)" % (sink, r64[1]))
    if r8 and r64:
        print("F3 sink=%s: 64K / 8K TFLOPS %.3f (falsifier F3 hit, < 0.84: %s)" % (sink, r64[0] / r8[0],
                                                                            r64[0] / r8[0] < 0.84))
for k, v in sorted(by.items()):
    b = v.get(label)
    for abl, need in (("gluon-ws4-sym", 1.06), ("gluon-ws4-whole", 1.05)):
        x = v.get(abl)
        if b and x and "paired_median" in b and "paired_median" in x:
            r = x["paired_median"] / b["paired_median"]
            print("F2 %s %s: t / t_ws4 %.3f (the credited mechanism matters if >= %.2f: %s)"
                  % (abl, k, r, need, r >= need))
print("verdict: tests %s" % (t, ))
PY
tar czf "$OUT/sparse_prefill_ws4.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
