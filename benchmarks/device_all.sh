#!/usr/bin/env bash
# One consolidated device run: each area's own device script (benchmarks/device_<area>.sh) under a time limit,
# then optionally `deepkernels bench`. Everything lands in $OUT/results.tar.gz (the device tool returns at most
# 8 files), with each area's log tail printed.
#   usage: T_<area>=<seconds> BENCH="--quick" bash benchmarks/device_all.sh gemm grouped_gemm mla_sparse ... [bench]
set -u
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
export GIT_SHA="${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
FINAL="${OUT:?OUT must be set}"
WORK=$(mktemp -d /tmp/dk.XXXX)
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader | tee "$WORK/gpu.txt"
start=$(date +%s)
for area in "$@"; do
  mkdir -p "$WORK/$area"
  t0=$(date +%s)
  if [ "$area" = bench ]; then
    lim="${T_bench:-240}"
    timeout -k 10 "$lim" python3 -m deepkernels.bench.cli bench ${BENCH:-} --json "$WORK/bench/bench.json" \
      --plot "$WORK/bench/roofline.png" > "$WORK/bench/log.txt" 2>&1
  else
    var="T_$area"; lim="${!var:-150}"
    OUT="$WORK/$area" timeout -k 10 "$lim" bash "benchmarks/device_$area.sh" > "$WORK/$area/log.txt" 2>&1
  fi
  rc=$?
  echo "=== $area: rc=$rc, $(( $(date +%s) - t0 )) s (limit $lim) ==="
  tail -n "${TAIL:-30}" "$WORK/$area/log.txt"
done
tar czf "$FINAL/results.tar.gz" -C "$WORK" .
cp "$WORK/bench/roofline.png" "$FINAL/" 2>/dev/null || true
cp "$WORK/bench/bench.json" "$FINAL/" 2>/dev/null || true
echo "=== total $(( $(date +%s) - start )) s ==="
