#!/usr/bin/env bash
# Device run for the Gluon dense MLA decode kernel (one call, <= TOTAL_S s): smoke test (hang guard), the GPU tier of
# tests/test_mla_decode_gluon.py, Gluon (every candidate, and the dispatched public path) vs
# the current Triton kernel at b=128, h_kv=1, s_q in {1,2} (causal when 2), h_q in {64,128}, varlen
# s_k in {4096, 8192, 16384, 32768} (FlashMLA counting via benchmarks/mla_decode.py), JSON to $OUT; with FULL=1
# then the dense-decode GPU tier through the public op.
# Usage (repo root, on the device): GIT_SHA=<sha> bash benchmarks/device_mla_decode_gluon.sh
export PYTHONPATH=src PYTHONUNBUFFERED=1
export GIT_SHA="${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
OUT=${OUT:-/tmp/mla_decode_gluon_out}
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv; python3 -c \
  "import torch, triton; print(torch.__version__, triton.__version__)"; echo "GIT_SHA=$GIT_SHA"; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
PT="python3 -m pytest -p no:cacheprovider --tb=short -rf -v"
echo "== smoke (hang guard)"
timeout -k 5 ${SMOKE_S:-70} $PT tests/test_mla_decode_gluon.py -m gpu -k "edge_lengths" > "$OUT/smoke.log" 2>&1
SMOKE=$?
echo "smoke rc=$SMOKE ($(el))"; grep -E "PASS|FAIL|ERROR|Timeout|passed|failed" "$OUT/smoke.log" | tail -8
if [ "$SMOKE" -eq 124 ] || [ "$SMOKE" -eq 137 ]; then echo "HUNG: stop"; tail -30 "$OUT/smoke.log"; exit 0; fi
echo "== gluon GPU tier"
timeout -k 5 ${TESTS_S:-110} $PT tests/test_mla_decode_gluon.py -m gpu > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$? ($(el))"; grep -E "FAILED|ERROR|passed|failed" "$OUT/gpu_tests.log" | tail -15
echo "== benchmark: gluon vs triton"
timeout -k 5 ${BENCH_S:-60} python3 - "$OUT/mla_decode_gluon-h200.json" > "$OUT/bench.log" 2>&1 <<'EOF'
import json, os, sys
import torch
sys.path.insert(0, "benchmarks")
import mla_decode as B                      # make_inputs, provenance, FlashMLA counting
import deepkernels.mla.decode as dec
from deepkernels.mla import _gluon_dense_decode as G
from deepkernels.mla.metadata import compute_schedule
from triton.testing import do_bench

path = sys.argv[1]
prov = B.provenance()
prov["dispatch_gluon_in_decode_py"] = hasattr(dec, "_gluon_ok")
rows_out = []
REP = int(os.environ.get("REP_MS", "25"))
SKS = [int(x) for x in os.environ.get("SKS", "4096,8192,16384,32768").split(",")]
x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
for _ in range(300):                        # clocks up before the first timing
    x @ x
del x
for s_q in (1, 2):
    for h_q in (64, 128):
        for s_k in SKS:
            causal = s_q > 1
            q, k, bt, sl = B.make_inputs(128, s_q, h_q, 1, s_k)
            tot = int(sl.sum())
            flop = 2 * s_q * tot * h_q * (B.D_QK + B.D_V)
            byts = (tot * B.D_QK + 128 * s_q * h_q * (B.D_QK + B.D_V)) * 2
            scale = B.D_QK ** -0.5
            rows = s_q * h_q
            cfg = dec._pick_config(rows)
            sched, ns = compute_schedule(sl, dec._num_sm_parts(q.device, rows, 1, cfg))
            tri = lambda: dec._dense_launch(q, k, bt, sl, sched, ns, scale, causal, cfg)  # noqa: E731
            o_t, l_t = tri()
            ms_t = do_bench(tri, warmup=3, rep=REP, return_mode="median")
            rec = dict(b=128, s_q=s_q, h_q=h_q, h_kv=1, s_k=s_k, causal=causal, total_tokens=tot,
                       triton_config=list(cfg), triton_ms=ms_t, triton_tflops=flop / ms_t / 1e9,
                       triton_gbps=byts / ms_t / 1e6, gluon={})
            for gcfg in G.GLUON_CANDIDATES:
                name = "s{}_r{}_{}".format(*gcfg)
                fn = lambda: G.gluon_dense_forward(q, k, bt, sl, sched, ns, scale, causal, gcfg)  # noqa: E731
                try:
                    o_g, l_g = fn()
                    err = float((o_g.float() - o_t.float()).abs().max())
                    lerr = float((l_g - l_t).abs().max())
                    bad = bool(torch.isnan(o_g).any() or torch.isnan(l_g).any()) or not (err <= 4e-3)
                    ms = do_bench(fn, warmup=3, rep=REP, return_mode="median")
                except Exception as e:  # noqa: BLE001
                    rec["gluon"][name] = dict(failed=f"{type(e).__name__}: {str(e)[:300]}")
                    print(f"  {name} failed: {e}", flush=True)
                    continue
                rec["gluon"][name] = dict(ms=ms, tflops=flop / ms / 1e9, gbps=byts / ms / 1e6,
                                          max_abs_err_vs_triton=err, lse_err_vs_triton=lerr, wrong=bad,
                                          speedup_vs_triton=ms_t / ms)
            rec["triton_ms_again"] = do_bench(tri, warmup=3, rep=REP, return_mode="median")
            if hasattr(dec, "_gluon_ok"):   # the public path (dispatch) as shipped
                pub = lambda: dec._dense_launch(q, k, bt, sl, sched, ns, scale, causal)  # noqa: E731
                rec["dispatch_ms"] = do_bench(pub, warmup=3, rep=REP, return_mode="median")
            rows_out.append(rec)
            with open(path, "w") as f:
                json.dump({"provenance": prov, "rows": rows_out}, f, indent=1)
            g = "  ".join(f"{n} {v['tflops']:6.1f} TF x{v['speedup_vs_triton']:.2f} err {v['max_abs_err_vs_triton']:.1e}"
                          f"{' WRONG' if v['wrong'] else ''}" for n, v in rec["gluon"].items() if "ms" in v)
            print(f"SUMMARY s_q={s_q} h_q={h_q:3d} s_k={s_k:5d} triton {rec['triton_tflops']:6.1f} TF "
                  f"({ms_t*1e3:7.1f} us, again {rec['triton_ms_again']*1e3:7.1f})  {g}"
                  + (f"  dispatch {flop / rec['dispatch_ms'] / 1e9:6.1f} TF" if "dispatch_ms" in rec else ""),
                  flush=True)
            del q, k, bt, sl, o_t, l_t
            torch.cuda.empty_cache()
EOF
echo "bench rc=$? ($(el))"
grep -v SUMMARY "$OUT/bench.log" | tail -8
if [ "${FULL:-0}" = "1" ]; then
  # the public op's GPU tier (Gluon dispatch for rows >= 64; the per-candidate Triton sweep test is left out: it
  # compiles ~30 Triton configs)
  LEFT=$(( ${TOTAL_S:-200} - ($(date +%s) - T0) )); [ "$LEFT" -lt 20 ] && LEFT=20
  echo "== dense decode GPU tier through the public op (${LEFT} s)"
  timeout -k 5 "$LEFT" $PT tests/test_mla_decode_kernels.py -m gpu -k "not every_sweep_candidate" \
    > "$OUT/dense_tests.log" 2>&1
  echo "dense tests rc=$? ($(el))"; grep -E "FAILED|ERROR|passed|failed" "$OUT/dense_tests.log" | tail -15
fi
echo "== summary"
grep SUMMARY "$OUT/bench.log" || true
exit 0
