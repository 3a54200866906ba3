#!/usr/bin/env bash
# WS3 sparse prefill (WS2 prefill + 2-CTA cluster producer sharing; deepkernels.mla._gluon_sparse_prefill_ws3, not
# dispatched), first device run:
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_prefill_ws3.sh        (repo root, clean export)
# 0. provenance (cap 10 s);
# 1. smoke GPU test under a hang guard (a cluster / mbarrier / tx-count protocol bug hangs; cap ${T_P3_SMOKE:-35} s);
# 2. the GPU tier of tests/test_gluon_sparse_prefill_ws3.py (cap ${T_P3_TESTS:-60} s, --timeout=40 per test; bit
#    identity to WS2 recorded per case, counted below);
# 3. cluster co-residency: cuOccupancyMaxActiveClusters of the compiled WS3 kernel vs the 66 clusters one wave of the
#    132 SMs needs (cap 15 s);
# 4. benchmarks/mla_prefill.py --only sparse --gluon --no-triton --rounds ${ROUNDS:-6}: gluon-ws2 (paired base),
#    gluon-ws3, gluon-ws3-nopf at s_q 4096, h_q 128, topk 2048, s_kv ${S_KV:-8192,65536}, sink ${SINK:-off,on};
#    rotated rounds, paired ratios t / t_ws2 of the same round (cap ${T_P3_BENCH:-70} s; skipped when the smoke test
#    hung or failed);
# 5. verdict per shape: paired median ratio vs ws2 (< 1 faster), TFLOPS, bit identity vs ws2, errors.
# Caps total 10 + 35 + 60 + 15 + 70 + 10 = 200 s (+ up to 3 s kill grace per capped step). Nothing is exported or
# dispatched. One tarball $OUT/sparse_prefill_ws3.tgz + summaries on stdout.
DK_OUT_DEFAULT=/tmp/sparse_prefill_ws3_out DK_ENV_CAP=10 DK_PYTEST_TIMEOUT=40 . "$(dirname "$0")/_device_common.sh"
F=tests/test_gluon_sparse_prefill_ws3.py

echo "== 1. smoke (cap ${T_P3_SMOKE:-35}s)"
timeout -k 3 "${T_P3_SMOKE:-35}" python3 -m pytest $F -m gpu -k smoke -q -rfs -p no:cacheprovider \
  > "$W/smoke.log" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE ($(el))"
tail -5 "$W/smoke.log"

if [ "$SMOKE" != 0 ]; then
  echo "== 2. WS3 GPU tier SKIPPED (smoke rc $SMOKE)"
else
  echo "== 2. WS3 GPU tier (cap ${T_P3_TESTS:-60}s, $XD)"
  timeout -k 3 "${T_P3_TESTS:-60}" python3 -m pytest $F -m gpu -k "not smoke" -q -rfs -p no:cacheprovider \
    $TO $XD --junitxml="$W/ws3_tests.xml" > "$W/ws3_tests.log" 2>&1
  echo "tests rc=$? ($(el))"
  tail -3 "$W/ws3_tests.log"; grep -E "^FAILED|^ERROR" "$W/ws3_tests.log" | head -20
  junit_json ws3_tests "sparse prefill ws3"
  grep -o 'name="bit_identical_to_ws2" value="[A-Za-z]*"' "$W"/ws3_tests.xml 2>/dev/null | sort | uniq -c
fi

if [ "$SMOKE" != 0 ]; then
  echo "== 3. cluster occupancy SKIPPED (smoke rc $SMOKE)"
else
  echo "== 3. cluster occupancy (cap 15s)"
  timeout -k 2 15 python3 - <<'PY' 2>&1 | tee "$W/clusters.txt"
import torch
from triton.runtime import driver
from deepkernels.mla import _gluon_sparse_prefill_ws3 as P3
s_q, h_q, s_kv, topk = 8, 128, 4096, 2048
q = (torch.randn(s_q, h_q, 576, device="cuda") / 10).bfloat16()
kv = (torch.randn(s_kv, 1, 576, device="cuda") / 10).bfloat16()
ind = torch.randint(0, s_kv, (s_q, 1, topk), device="cuda", dtype=torch.int32)
out = torch.empty(s_q, h_q, 512, dtype=torch.bfloat16, device="cuda")
ml, lse = torch.empty(s_q, h_q, device="cuda"), torch.empty(s_q, h_q, device="cuda")
P3.launch_sparse_prefill_gluon_ws3(out, ml, lse, q, kv, ind, 0.5)
torch.cuda.synchronize()
la = next(iter(P3._LAUNCHERS.values()))
sms = torch.cuda.get_device_properties(0).multi_processor_count
n = driver.active.utils.cuOccupancyMaxActiveClusters(la.function, la.packed[2], 2)
print("ws3 shared %d B, offsets %s, max active 2-CTA clusters %d (one wave of %d SMs needs %d)"
      % (la.packed[2], la.offsets, n, sms, sms // 2))
PY
fi

if [ "$SMOKE" != 0 ]; then
  echo "== 4. bench SKIPPED (smoke rc $SMOKE)"
else
  echo "== 4. ws2 / ws3 / ws3-nopf, ${ROUNDS:-6} rotated rounds (cap ${T_P3_BENCH:-70}s)"
  timeout -k 3 "${T_P3_BENCH:-70}" python3 benchmarks/mla_prefill.py --only sparse --gluon --no-triton \
    --gluon-skip gluon,gluon-ws,gluon-ws2-ov --gluon-add gluon-ws3,gluon-ws3-nopf \
    --rounds "${ROUNDS:-6}" --paired-base gluon-ws2 --sink "${SINK:-off,on}" --s-kv "${S_KV:-8192,65536}" \
    --out "$W/sparse_prefill_ws3.json" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "flash_mla_sparse_fwd" "$W/bench.log" | tail -12
fi

timeout -k 1 10 python3 - "$W/ws3_tests.json" "$W/sparse_prefill_ws3.json" <<'PY' 2>&1 | tee "$W/verdict.txt"
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
for label in ("gluon-ws3", "gluon-ws3-nopf"):
    ok, n = True, 0
    for k, v in sorted(by.items()):
        a, b = v.get("gluon-ws2"), v.get(label)
        if not a or not b or "paired_median" not in b:
            if b and "error" in b:
                print("verdict row %s: %s error %s" % (k, label, b["error"][:200]))
            ok = False
            continue
        n += 1
        pm = b["paired_median"]
        err_ok = b.get("max_abs_err_rows", 1) <= max(2 * a.get("max_abs_err_rows", 0), 2e-3) and not b.get("nan")
        print("verdict row %s: ws2 %.1f %s %.1f TFLOPS, paired t/t_ws2 median %.3f (rounds %s) bit-identical %s "
              "err ws2 %s %s %s" % (k, a["tflops"], label, b["tflops"], pm,
                                    ["%.3f" % x for x in b.get("paired_ratios", [])], b.get("bit_identical_to_base"),
                                    a.get("max_abs_err_rows"), label, b.get("max_abs_err_rows")))
        ok = ok and pm < 0.99 and err_ok
    print("verdict %s: %s than ws2 at every shape (%d shapes)" % (label, "faster" if ok and n else "NOT faster", n))
print("verdict: tests %s" % (t, ))
PY
tar czf "$OUT/sparse_prefill_ws3.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
