#!/usr/bin/env bash
# A session's closing device call: the whole GPU tier (every test file, `-m gpu`, pytest-xdist workers sharing the
# GPU, a per-test timeout), then `deepkernels bench` (all suites, JSON + roofline PNG), then optional extra steps.
#   usage (repo root, on the device): GIT_SHA=<sha> [T_TESTS=300] [T_BENCH=150] [NPROC=4] \
#          (T_TESTS=0 / T_BENCH=0 skip the GPU tier / the bench; a PRE step may write DEEPKERNELS_*=v lines to its
#          $OUT/export_env to switch them on for the rest of the run) \
#          [PRE="benchmarks/device_x.sh:150 ..."] [EXTRA="benchmarks/device_y.sh:90 ..."] [GPU_TESTS="tests/a.py ..."] \
#          bash benchmarks/device_final.sh
# Results: $OUT/results.tar.gz (every log, junit XML, JSON), $OUT/bench.json, $OUT/roofline.png.
set -u
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
export GIT_SHA="${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
FINAL="${OUT:?OUT must be set}"
W=$(mktemp -d /tmp/dkfinal.XXXX)
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
  python3 -c "import torch, triton, numpy; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)"
  echo "GIT_SHA=$GIT_SHA"; } > "$W/env.txt" 2>&1
cat "$W/env.txt"

run_step() {   # "script:cap": run one area script with its own $OUT under a cap, print its log tail
  local script="${1%%:*}" cap="${1##*:}" name
  name=$(basename "$script" .sh)
  mkdir -p "$W/$name"
  echo "== $script (cap $cap s)"
  OUT="$W/$name" timeout -k 5 "$cap" bash "$script" > "$W/$name/log.txt" 2>&1
  echo "$name rc=$? ($(el))"
  tail -n "${TAIL:-25}" "$W/$name/log.txt"
}

# PRE steps run first; one that writes kernel names to its $OUT/disable_gluon (it found its Gluon kernel wrong) turns
# that kernel off for everything after it (DEEPKERNELS_DISABLE_GLUON comma list)
for step in ${PRE:-}; do
  run_step "$step"
  flag="$W/$(basename "${step%%:*}" .sh)/disable_gluon"
  if [ -s "$flag" ]; then
    off=$(sort -u "$flag" | paste -sd, -)
    export DEEPKERNELS_DISABLE_GLUON="${DEEPKERNELS_DISABLE_GLUON:+$DEEPKERNELS_DISABLE_GLUON,}$off"
    echo "DEEPKERNELS_DISABLE_GLUON=$DEEPKERNELS_DISABLE_GLUON from here on" | tee -a "$W/env.txt"
  fi
  # a step that writes DEEPKERNELS_*=value lines to its $OUT/export_env (e.g. its kernel passed and won) switches
  # them on for everything after it
  exp="$W/$(basename "${step%%:*}" .sh)/export_env"
  if [ -s "$exp" ]; then
    while IFS= read -r kv; do
      case "$kv" in DEEPKERNELS_[A-Z0-9_]*=[A-Za-z0-9_,]*) export "$kv"; echo "$kv from here on" | tee -a "$W/env.txt";; esac
    done < "$exp"
  fi
done

if [ "${T_TESTS:-300}" != 0 ]; then
  echo "== GPU tier (all test files, -n ${NPROC:-4}, cap ${T_TESTS:-300} s)"
  TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=150"
  IGN=""; for f in ${GPU_IGNORE:-}; do IGN="$IGN --ignore=$f"; done     # files a PRE step already ran
  timeout -k 10 "${T_TESTS:-300}" python3 -m pytest ${GPU_TESTS:-tests} $IGN -m gpu -n "${NPROC:-4}" $TO -q -rfE \
    -p no:cacheprovider --junitxml="$W/gpu_tests.xml" > "$W/gpu_tests.log" 2>&1
  echo "gpu tier rc=$? ($(el))"
  grep -E "^(FAILED|ERROR)|passed|failed|skipped|Timeout" "$W/gpu_tests.log" | tail -25
fi

if [ "${T_BENCH:-150}" != 0 ]; then
  echo "== deepkernels bench (cap ${T_BENCH:-150} s)"
  timeout -k 10 "${T_BENCH:-150}" python3 -m deepkernels.bench.cli bench --json "$W/bench.json" \
    --plot "$W/roofline.png" > "$W/bench.log" 2>&1
  echo "bench rc=$? ($(el))"
  tail -n 3 "$W/bench.log"
  grep -c "FAIL" "$W/bench.log" | sed 's/^/lines with FAIL: /'
fi

for step in ${EXTRA:-}; do
  run_step "$step"
done

tar czf "$FINAL/results.tar.gz" -C "$W" .
cp "$W/bench.json" "$W/roofline.png" "$FINAL/" 2>/dev/null || true
echo "== total $(el)"
