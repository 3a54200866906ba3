#!/usr/bin/env bash
# Nsight Compute on the dispatched kernels (first use of ncu in this project; H200.md: Firecracker machines read the
# counters with --clock-control none). Per case of benchmarks/ncu_cases.py: the ncu sections SpeedOfLight,
# MemoryWorkloadAnalysis (+ tables), ComputeWorkloadAnalysis, WarpStateStats, SchedulerStats, Occupancy,
# LaunchStats of the one launch after the warm-up, as text and CSV, each under a cap.
#   GIT_SHA=<sha> [CASES="prefill8k prefill64k ..."] [T_CASE=60] [SOURCE=1] OUT=$OUT bash benchmarks/device_ncu.sh
# (SOURCE=1: also the per-SASS-instruction source page as CSV, <case>.sass.csv)
# Cases naming a launcher (prefill8k_ws2 / prefill8k_ws4 / ..., sparse_v32_ws2 / ...: benchmarks/ncu_cases.py) are not
# in the default list: e.g. CASES="prefill8k_ws2 prefill8k_ws4". --kernel-name per case = ncu_cases.kernel_regex.
set -u
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/ncu_out}
W=$(mktemp -d)
mkdir -p "$OUT"
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
echo "GIT_SHA=${GIT_SHA:-unknown}" | tee "$W/env.txt"
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" | tee -a "$W/env.txt"
SEC="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables \
 --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section Occupancy \
 --section LaunchStats --section SourceCounters"
for c in ${CASES:-prefill8k prefill64k sparse_v32 sparse_v41 dense_decode gemm}; do
  case $c in
    prefill*_ws*) K="regex:sparse_prefill_gluon_${c##*_}_kernel";;   # _sparse_prefill_gluon_ws4_kernel etc.
    prefill*) K="regex:sparse_prefill_gluon";;
    sparse_*) K="regex:sparse_decode_gluon";;
    dense_decode) K="regex:mla_decode_gluon";;
    gemm) K="regex:fp8_gluon";;
  esac
  echo "== $c ($K, cap ${T_CASE:-60} s)"
  timeout -k 5 "${T_CASE:-60}" "$NCU" --clock-control none --kernel-name "$K" --launch-skip 3 --launch-count 1 $SEC \
    -o "$W/$c" -f python3 benchmarks/ncu_cases.py "$c" > "$W/$c.log" 2>&1
  echo "$c rc=$? ($(el))"; tail -3 "$W/$c.log"
  if [ -f "$W/$c.ncu-rep" ]; then
    "$NCU" -i "$W/$c.ncu-rep" --page details > "$W/$c.txt" 2>&1
    "$NCU" -i "$W/$c.ncu-rep" --page details --csv > "$W/$c.csv" 2>&1
    # per-SASS-instruction counters (stall samples, shared wavefronts / excess, global sectors) when SOURCE=1
    if [ "${SOURCE:-0}" = 1 ]; then
      timeout -k 5 60 "$NCU" -i "$W/$c.ncu-rep" --page source --print-source sass --csv > "$W/$c.sass.csv" 2>&1
      echo "source page: $(wc -l < "$W/$c.sass.csv") lines"
    fi
    grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|L2 Hit Rate|L1/TEX Hit|Shared Memory|Issue Slots Busy|No Eligible|Registers Per|Warp Cycles Per Issued|Stall|Tensor|pipe" "$W/$c.txt" | head -40
  fi
done
tar czf "$OUT/ncu.tgz" -C "$W" --exclude='*.ncu-rep' . && cp "$W"/*.ncu-rep "$OUT/" 2>/dev/null
echo "== done ($(el))"
exit 0
