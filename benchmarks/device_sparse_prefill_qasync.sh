#!/usr/bin/env bash
# WS2 sparse prefill, session 19's two opt-in epilogue / prologue options (module docstring of
# deepkernels.mla._gluon_sparse_prefill_ws2): Q by one batch of cp.async (Q_ASYNC / q_async, "Q by cp.async") and,
# with OSTAGE=${OSTAGE:-1}, the output staged through shared memory (O_STAGE / o_stage, "Output through shared
# memory"); first device run:
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_prefill_qasync.sh        (repo root, clean export)
# 0. provenance (cap 10 s);
# 1. the options' GPU tests (tests/test_gluon_sparse_prefill_ws2.py -m gpu -k "q_async or o_stage": out / lse /
#    max_logits bit-identical to the build without them at 8 shapes -- d_qk 576 / 512, h_q 64 / 128, sink,
#    topk_length, junk indices, topk 0 --, a q view with head stride 584 taking the plain path, strided out views),
#    -n ${NPROC:-8}, --timeout=40 per test (cap ${T_QA_TESTS:-75} s);
# 2. benchmarks/mla_prefill.py --qasync [--ostage]: gluon-ws2 (both off, paired base), gluon-ws2-aa (the same launch:
#    A/A control), gluon-ws2-qa (q_async), [gluon-ws2-os (o_stage), gluon-ws2-qa-os (both)] in ${ROUNDS:-5 or 6}
#    rotated rounds at s_q 4096, h_q 128, d_qk 576, topk 2048, s_kv ${S_KV:-8192,32768,65536,131072}, sink
#    ${SINK:-off,on} (cap ${T_QA_BENCH:-90} s; rows are written as they finish; skipped when step 1 failed: a
#    result that is not bit-identical is not timed);
# 3. verdict (cap 10 s): per shape the paired medians t / t_off of each option, the A/A's, bit identity; the
#    predictions (q_async 0.955-0.97, falsifier 8K > 0.98; o_stage 0.96-0.975, falsifier 8K > 0.985; both
#    0.92-0.945) evaluated.
# Caps total 10 + 75 + 10 (junit) + 90 + 10 = 195 s (+ up to 3 s kill grace per step). Nothing is exported or
# dispatched. One tarball $OUT/sparse_prefill_qasync.tgz + summaries on stdout.
export NPROC="${NPROC:-8}"
DK_OUT_DEFAULT=/tmp/sparse_prefill_qasync_out DK_ENV_CAP=10 DK_PYTEST_TIMEOUT=40 . "$(dirname "$0")/_device_common.sh"
F=tests/test_gluon_sparse_prefill_ws2.py
K="q_async"; FLAGS="--qasync"; R=6
if [ "${OSTAGE:-1}" = 1 ]; then K="q_async or o_stage"; FLAGS="--qasync --ostage"; R=5; fi

echo "== 1. GPU tests -k \"$K\" (cap ${T_QA_TESTS:-75}s, $XD)"
gpu_tests qa_tests "sparse prefill ws2 q_async / o_stage" "${T_QA_TESTS:-75}" $F -k "$K"
RC=$?

if [ "$RC" != 0 ]; then
  echo "== 2. bench SKIPPED (tests rc $RC)"
else
  echo "== 2. $FLAGS paired bench, ${ROUNDS:-$R} rotated rounds (cap ${T_QA_BENCH:-90}s)"
  timeout -k 3 "${T_QA_BENCH:-90}" python3 benchmarks/mla_prefill.py $FLAGS --rounds "${ROUNDS:-$R}" \
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
# label -> (name, predicted range, 8K falsifier threshold)
PRED = {"gluon-ws2-qa": ("q_async", (0.955, 0.97), 0.98), "gluon-ws2-os": ("o_stage", (0.96, 0.975), 0.985),
        "gluon-ws2-qa-os": ("both", (0.92, 0.945), None), "gluon-ws2-aa": ("A/A", None, None)}
by = {}
for r in rows:
    if isinstance(r, dict) and str(r.get("config", "")).startswith("gluon-ws2"):
        by.setdefault(json.dumps(r["shape"], sort_keys=True), {})[r["config"]] = r
ratios, bits = {}, True
for k, v in sorted(by.items(), key=lambda kv: (json.loads(kv[0])["s_kv"], json.loads(kv[0])["sink"])):
    shape, a = json.loads(k), v.get("gluon-ws2")
    if not a or "tflops" not in a:
        print("verdict row %s: no base row (%s)" % (k, [(c, x.get("error", "")[:200]) for c, x in v.items()]))
        continue
    parts = []
    for lab, (name, rng, fals) in PRED.items():
        b = v.get(lab)
        if not b:
            continue
        if "paired_median" not in b:
            parts.append("%s error %s" % (name, b.get("error", "?")[:120]))
            continue
        pm = b["paired_median"]
        ratios.setdefault(lab, []).append((shape["s_kv"], shape["sink"], pm))
        bit = bool(b.get("bit_identical_to_base")) and not b.get("nan")
        bits = bits and bit
        parts.append("%s %.3f (%.1f TFLOPS%s)" % (name, pm, b["tflops"], "" if bit else ", NOT bit-identical"))
    print("verdict row s_kv %6d sink %-5s: off %.1f TFLOPS | %s" % (shape["s_kv"], shape["sink"], a["tflops"],
                                                                    " | ".join(parts)))
for lab, (name, rng, fals) in PRED.items():
    xs = ratios.get(lab)
    if not xs:
        continue
    ps = [p for _, _, p in xs]
    line = "verdict %s: paired t/t_off %.3f-%.3f over %d shapes" % (name, min(ps), max(ps), len(ps))
    if rng:
        inside = sum(rng[0] <= p <= rng[1] for p in ps)
        line += "; prediction %.3f-%.3f held at %d of %d" % (rng[0], rng[1], inside, len(ps))
    if fals:
        hit = [p for s_kv, _, p in xs if s_kv == 8192 and p > fals]
        line += "; falsifier (8K > %.3f) hit: %s" % (fals, bool(hit))
    print(line)
print("verdict: bit-identical everywhere: %s" % bits)
print("verdict: tests %s" % (t, ))
PY
tar czf "$OUT/sparse_prefill_qasync.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
