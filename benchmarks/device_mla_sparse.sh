#!/usr/bin/env bash
# One device run for sparse MLA decode (issue 6), from the repo root on the H200 machine:
#   PYTHONUNBUFFERED=1 PYTHONPATH=src bash benchmarks/device_mla_sparse.sh
# 1. environment, 2. GPU tests of tests/test_mla_sparse*.py (-m gpu -x; never the interpreter tier here),
# 3. the benchmark (V3.2 656 B, V4.1 528 B, V4.1 + FP4 extra; topk 2048; h_q 128/64; (b, s_q) 64x1/128x1/128x2)
# with the candidate-config sweep and the PyTorch reference in the same run -> $OUT/mla_sparse.json,
# 4. a topk 512 / 16384 pass with the default config -> $OUT/mla_sparse_topk.json, 5. a short summary last.
# No step stops the others; each has its own time cap (seconds, overridable).
set -u
export PYTHONPATH=${PYTHONPATH:-src} PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/mla_sparse_out}
mkdir -p "$OUT"
T_TESTS=${T_TESTS:-200}
T_BENCH=${T_BENCH:-260}
T_TOPK=${T_TOPK:-90}
unset TRITON_INTERPRET

{
  echo "== env"; date -u
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,temperature.gpu --format=csv 2>&1 || true
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__, 'cuda', torch.version.cuda)" 2>&1
  echo "GIT_SHA=${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
} > "$OUT/env.log" 2>&1
cat "$OUT/env.log"

echo "== gpu tests (cap ${T_TESTS}s)"
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=120"
timeout -k 5 "$T_TESTS" python3 -m pytest tests/test_mla_sparse_kernels.py tests/test_mla_sparse_reference.py \
  -m gpu -q -x -p no:cacheprovider -rfE $TO > "$OUT/gpu_tests.log" 2>&1
echo "gpu tests rc=$?" | tee -a "$OUT/gpu_tests.log"
grep -E "passed|failed|error" "$OUT/gpu_tests.log" | tail -3

echo "== benchmark + sweep (cap ${T_BENCH}s)"
timeout -k 5 "$T_BENCH" python3 benchmarks/mla_sparse_decode.py --sweep --fmt v32,v41+fp4,v41 \
  --json "$OUT/mla_sparse.json" > "$OUT/bench.log" 2>&1
echo "bench rc=$?" | tee -a "$OUT/bench.log"
grep -E "^(v32|v41)" "$OUT/bench.log" | tail -20

echo "== topk 512 / 16384, default config (cap ${T_TOPK}s)"
timeout -k 5 "$T_TOPK" python3 benchmarks/mla_sparse_decode.py --fmt v32,v41+fp4 --topk 512,16384 --hq 128 \
  --bsq 128x2 --json "$OUT/mla_sparse_topk.json" > "$OUT/bench_topk.log" 2>&1
echo "topk bench rc=$?" | tee -a "$OUT/bench_topk.log"

ls -la "$OUT"
echo "== summary"
python3 - "$OUT/mla_sparse.json" "$OUT/mla_sparse_topk.json" <<'EOF' 2>&1 | tee "$OUT/summary.txt"
import json, sys
print("fmt      topk  h_q   b s_q       us  TFLOPS    GB/s  torchTF  x_torch  /420TF  FlashMLA  config (best of sweep)")
for path in sys.argv[1:]:
    try:
        r = json.load(open(path))
    except Exception as e:
        print(f"{path}: no JSON ({e})")
        continue
    for x in r.get("rows", []):
        tgt = f"{x['tflops'] / 420:6.2f}" if x["h_q"] == 128 else "     -"
        fm = f"{x['flashmla_v32_tflops']:8d}" if x.get("flashmla_v32_tflops") else "       -"
        print(f"{x['fmt']:8s} {x['topk']:5d} {x['h_q']:4d} {x['b']:3d} {x['s_q']:3d} {x['ms'] * 1e3:8.1f} "
              f"{x['tflops']:7.1f} {x['gbps']:7.1f} {x['torch_tflops']:8.1f} {x['speedup_vs_torch']:8.2f} {tgt} {fm}"
              f"  {tuple(x['config'])}")
    sw = r.get("sweep", [])
    if sw:
        by = {}
        for x in sw:
            by.setdefault(tuple(x["config"]), []).append(x["tflops"])
        print("sweep mean TFLOPS per config:", {k: round(sum(v) / len(v), 1) for k, v in by.items()})
EOF
