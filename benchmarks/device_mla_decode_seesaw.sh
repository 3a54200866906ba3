#!/usr/bin/env bash
# Device run for the seesaw Gluon dense MLA decode (issue #5; src/deepkernels/mla/_gluon_dense_decode_seesaw.py),
# one call, < 150 s (caps: env ~10, smoke 35, GPU tests 65, bench 38; each step under `timeout`):
# (1) smoke: one page-boundary test (0/1/2 tiles, odd/even tile counts, ORDER 2 = default) as a hang guard (pytest
#     --timeout=60 too when pytest_timeout is importable); stop if it fails or hangs;
# (2) the GPU tier of tests/test_mla_decode_seesaw.py with -x (reference + agreement with today's Gluon kernel,
#     all ORDERs on the edge cases); timing only if it passes (or was cut by its cap with no failure so far;
#     BENCH_ANYWAY=1 forces);
# (3) today's Gluon forward vs the seesaw forward (ORDER 2, 0 and 1) on the same schedule (the one the dispatched path
#     plans), b=128, h_kv=1, h_q 128/64, s_q 1/2 (causal when 2), varlen s_k 4096..32768 (benchmarks/mla_decode.py
#     make_inputs, FlashMLA FLOP counting), JSON with provenance to $OUT, one SUMMARY line per shape.
# Usage (repo root, on the device): GIT_SHA=<sha> bash benchmarks/device_mla_decode_seesaw.sh
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
export GIT_SHA="${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
OUT=${OUT:-/tmp/mla_decode_seesaw_out}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
{ timeout -k 2 15 nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; timeout -k 2 30 \
  python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"; echo "GIT_SHA=$GIT_SHA"; } \
  > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
PT="python3 -m pytest -p no:cacheprovider --tb=short -rf -v"
if timeout -k 2 20 python3 -c "import pytest_timeout" 2>/dev/null; then PTO="--timeout=60"; else PTO=""; fi

echo "== smoke (hang guard, 1 test)"
timeout -k 5 ${SMOKE_S:-35} $PT $PTO tests/test_mla_decode_seesaw.py -m gpu -k "edge_lengths and order2" > "$OUT/smoke.log" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE ($(el))"; grep -E "PASS|FAIL|ERROR|Timeout|passed|failed" "$OUT/smoke.log" | tail -8
if [ "$SMOKE" -ne 0 ]; then
  [ "$SMOKE" -eq 124 ] || [ "$SMOKE" -eq 137 ] && echo "HUNG (smoke timed out): stop"
  tail -40 "$OUT/smoke.log"; exit 0
fi

echo "== seesaw GPU tier (-x)"
timeout -k 5 ${TESTS_S:-65} $PT $PTO -x tests/test_mla_decode_seesaw.py -m gpu > "$OUT/gpu_tests.log" 2>&1
TESTS=$?
echo "gpu tests rc=$TESTS ($(el))"; grep -E "FAILED|ERROR|passed|failed" "$OUT/gpu_tests.log" | tail -15
echo "tests passed so far: $(grep -c ' PASSED' "$OUT/gpu_tests.log")"
if [ "$TESTS" -ne 0 ]; then
  if { [ "$TESTS" -eq 124 ] || [ "$TESTS" -eq 137 ]; } && ! grep -qE "FAILED|ERROR|Timeout" "$OUT/gpu_tests.log"; then
    echo "GPU tier cut by its time cap with no failure so far: timing runs (the tier is incomplete)"
  elif [ "${BENCH_ANYWAY:-0}" != "1" ]; then
    echo "GPU tests did not pass (rc=$TESTS): no timing"; tail -40 "$OUT/gpu_tests.log"; exit 0
  fi
fi

echo "== benchmark: today's Gluon vs seesaw (same schedule)"
timeout -k 5 ${BENCH_S:-38} python3 - "$OUT/mla_decode_seesaw-h200.json" > "$OUT/bench.log" 2>&1 <<'PYEOF'
import json, os, sys
import torch
sys.path.insert(0, "benchmarks")
import mla_decode as B                      # make_inputs, provenance, FlashMLA counting
import deepkernels.mla.decode as dec
from deepkernels.mla import _gluon_dense_decode as G
from deepkernels.mla import _gluon_dense_decode_seesaw as SW
from deepkernels.mla.metadata import compute_schedule
from triton.testing import do_bench

path = sys.argv[1]
prov = B.provenance()
prov["seesaw_configs"] = [list(c) for c in SW.SEESAW_CANDIDATES]
prov["gluon_config"] = list(G.GLUON_DEFAULT)
rows_out = []
REP = int(os.environ.get("REP_MS", "15"))
SKS = [int(x) for x in os.environ.get("SKS", "4096,8192,16384,32768").split(",")]
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
for _ in range(200):                        # clocks up before the first timing
    x @ x
del x
for h_q in (128, 64):
    for s_q in (1, 2):
        for s_k in SKS:
            causal = s_q > 1
            q, k, bt, sl = B.make_inputs(128, s_q, h_q, 1, s_k)
            tot = int(sl.sum())
            flop = 2 * s_q * tot * h_q * (B.D_QK + B.D_V)
            scale = B.D_QK ** -0.5
            rows = s_q * h_q
            sched, ns = compute_schedule(sl, dec._num_sm_parts(q.device, rows, 1))
            runs = {"gluon": lambda: G.gluon_dense_forward(q, k, bt, sl, sched, ns, scale, causal)}
            for cfg in SW.SEESAW_CANDIDATES:
                runs[f"seesaw_o{cfg[3]}"] = (lambda c: lambda: SW.gluon_dense_forward_seesaw(
                    q, k, bt, sl, sched, ns, scale, causal, c))(cfg)
            rec = dict(b=128, s_q=s_q, h_q=h_q, h_kv=1, s_k=s_k, causal=causal, total_tokens=tot, flop=flop,
                       parts=int(sched.shape[0]))
            o_g, l_g = runs["gluon"]()
            for name, fn in runs.items():
                try:
                    o, l = fn()
                    err = float((o.float() - o_g.float()).abs().max())
                    lerr = float((l - l_g).abs().max())
                    bad = bool(torch.isnan(o).any() or torch.isnan(l).any()) or not (err <= 4e-3)
                    ms = do_bench(fn, warmup=3, rep=REP, return_mode="median")
                    rec[name] = dict(us=ms * 1e3, tflops=flop / ms / 1e9, max_abs_err_vs_gluon=err,
                                     lse_err_vs_gluon=lerr, wrong=bad)
                except Exception as e:  # noqa: BLE001
                    rec[name] = dict(failed=f"{type(e).__name__}: {str(e)[:300]}")
            for n in runs:
                if n != "gluon" and "us" in rec.get("gluon", {}) and "us" in rec[n]:
                    rec[n]["speedup_vs_gluon"] = rec["gluon"]["us"] / rec[n]["us"]
            rows_out.append(rec)
            with open(path, "w") as f:
                json.dump({"provenance": prov, "rows": rows_out}, f, indent=1)
            print(f"SUMMARY h_q={h_q:3d} s_q={s_q} s_k={s_k:5d} parts {rec['parts']:4d}  " + "  ".join(
                f"{n} {v['tflops']:6.1f} TF ({v['us']:7.1f} us)"
                + (f" x{v['speedup_vs_gluon']:.3f}" if "speedup_vs_gluon" in v else "")
                + (" WRONG" if v["wrong"] else "") if "us" in v
                else f"{n} FAILED {v.get('failed', '')[:80]}" for n, v in ((n, rec[n]) for n in runs)), flush=True)
            del q, k, bt, sl, o_g, l_g
            torch.cuda.empty_cache()
PYEOF
echo "bench rc=$? ($(el))"
grep -v SUMMARY "$OUT/bench.log" | tail -8
echo "== summary"
grep SUMMARY "$OUT/bench.log" || true
exit 0
