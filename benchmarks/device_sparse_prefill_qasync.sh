#!/usr/bin/env bash
# WS2 sparse prefill, Q by one batch of cp.async (Q_ASYNC / q_async, session 19, opt-in; module docstring of
# deepkernels.mla._gluon_sparse_prefill_ws2, "Q by cp.async"), first device run:
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_prefill_qasync.sh        (repo root, clean export)
# 0. provenance (cap 10 s);
# 1. the option's GPU tests (tests/test_gluon_sparse_prefill_ws2.py -m gpu -k q_async: out / lse / max_logits
#    bit-identical to the build without it at 8 shapes -- d_qk 576 / 512, h_q 64 / 128, sink, topk_length, junk
#    indices, topk 0 -- and a q view with head stride 584 taking the plain path), -n ${NPROC:-8}, --timeout=40 per
#    test (cap ${T_QA_TESTS:-75} s);
# 2. benchmarks/mla_prefill.py --qasync: gluon-ws2 (q_async off, paired base), gluon-ws2-aa (the same launch: A/A
#    control), gluon-ws2-qa (q_async on) in ${ROUNDS:-6} rotated rounds at s_q 4096, h_q 128, d_qk 576, topk 2048,
#    s_kv ${S_KV:-8192,32768,65536,131072}, sink ${SINK:-off,on} (cap ${T_QA_BENCH:-90} s; skipped when step 1
#    failed: a result that is not bit-identical is not timed);
# 3. verdict (cap 10 s): per shape the paired median t_qa / t_off, the A/A's, bit identity; the prediction
#    (0.955-0.97 of the time, central 0.96) and its falsifier (s_kv 8K ratio > 0.98) evaluated.
# Caps total 10 + 75 + 10 (junit) + 90 + 10 = 195 s (+ up to 3 s kill grace per step). Nothing is exported or
# dispatched. One tarball $OUT/sparse_prefill_qasync.tgz + summaries on stdout.
export NPROC="${NPROC:-8}"
DK_OUT_DEFAULT=/tmp/sparse_prefill_qasync_out DK_ENV_CAP=10 DK_PYTEST_TIMEOUT=40 . "$(dirname "$0")/_device_common.sh"
F=tests/test_gluon_sparse_prefill_ws2.py

echo "== 1. q_async GPU tests (cap ${T_QA_TESTS:-75}s, $XD)"
timeout -k 3 "${T_QA_TESTS:-75}" python3 -m pytest $F -m gpu -k q_async -q -rfs -p no:cacheprovider $TO $XD \
  --junitxml="$W/qa_tests.xml" > "$W/qa_tests.log" 2>&1
RC=$?
echo "tests rc=$RC ($(el))"
tail -3 "$W/qa_tests.log"; grep -E "^FAILED|^ERROR" "$W/qa_tests.log" | head -20
junit_json qa_tests "sparse prefill ws2 q_async"

if [ "$RC" != 0 ]; then
  echo "== 2. bench SKIPPED (tests rc $RC)"
else
  echo "== 2. q_async off / A/A / on, ${ROUNDS:-6} rotated rounds (cap ${T_QA_BENCH:-90}s)"
  timeout -k 3 "${T_QA_BENCH:-90}" python3 benchmarks/mla_prefill.py --qasync --rounds "${ROUNDS:-6}" \
    --s-kv "${S_KV:-8192,32768,65536,131072}" --sink "${SINK:-off,on}" --out "$W/sparse_prefill_qasync.json" \
    > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  grep -E "Error|error" "$W/bench.log" | tail -5
fi

timeout -k 1 10 python3 - "$W/qa_tests.json" "$W/sparse_prefill_qasync.json" <<'PY' 2>&1 | tee "$W/verdict.txt"
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
    if isinstance(r, dict) and str(r.get("config", "")).startswith("gluon-ws2"):
        by.setdefault(json.dumps(r["shape"], sort_keys=True), {})[r["config"]] = r
qa_all, aa_all, bits, n = [], [], True, 0
for k, v in sorted(by.items(), key=lambda kv: (json.loads(kv[0])["s_kv"], json.loads(kv[0])["sink"])):
    a, aa, b = v.get("gluon-ws2"), v.get("gluon-ws2-aa"), v.get("gluon-ws2-qa")
    if not a or not b or "paired_median" not in b:
        print("verdict row %s: incomplete (%s)" % (k, [(c, x.get("error", "")[:200]) for c, x in v.items()]))
        continue
    n += 1
    shape = json.loads(k)
    pm, pa = b["paired_median"], (aa or {}).get("paired_median")
    qa_all.append(pm)
    if pa is not None:
        aa_all.append(pa)
    bit = b.get("bit_identical_to_base") and (aa or {}).get("bit_identical_to_base", True)
    bits = bits and bool(bit) and not b.get("nan")
    print("verdict row s_kv %6d sink %-5s: off %.1f on %.1f TFLOPS, paired t_on/t_off %.3f (rounds %s), A/A %s, "
          "bit-identical %s, err off %.2e on %.2e" % (
              shape["s_kv"], shape["sink"], a["tflops"], b["tflops"], pm,
              ["%.3f" % x for x in b.get("paired_ratios", []) if x is not None],
              "%.3f" % pa if pa is not None else "-", bit, a.get("max_abs_err_rows", -1),
              b.get("max_abs_err_rows", -1)))
    if shape["s_kv"] == 8192:
        print("  prediction 0.955-0.97 (central 0.96): %s; falsifier (8K ratio > 0.98) hit: %s"
              % ("inside" if 0.955 <= pm <= 0.97 else ("faster" if pm < 0.955 else "slower"), pm > 0.98))
if qa_all:
    print("verdict: q_async paired t_on/t_off %.3f-%.3f over %d shapes (A/A %s), bit-identical at all: %s" % (
        min(qa_all), max(qa_all), n, "%.3f-%.3f" % (min(aa_all), max(aa_all)) if aa_all else "-", bits))
    print("verdict: prediction 0.955-0.97 %s" % (
        "held at every shape" if all(0.955 <= x <= 0.97 for x in qa_all) else
        "missed at %d of %d shapes" % (sum(not 0.955 <= x <= 0.97 for x in qa_all), n)))
print("verdict: tests %s" % (t, ))
PY
tar czf "$OUT/sparse_prefill_qasync.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
