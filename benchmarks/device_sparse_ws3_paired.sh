#!/usr/bin/env bash
# The WS3 dispatch decision, rotated rounds: benchmarks/sparse_decode_ws3_paired.py (ws / ws2 / ws3, V3.2 + V4.1,
# h_q 128, 8 (b, s_q, topk) shapes, paired ratios) under a cap of ${T_BENCH:-120} s.
#   GIT_SHA=<sha> OUT=$OUT bash benchmarks/device_sparse_ws3_paired.sh        (repo root, clean export)
# One tarball $OUT/sparse_ws3_paired.tgz + the SUMMARY lines on stdout.
DK_OUT_DEFAULT=/tmp/sparse_ws3_paired_out . "$(dirname "$0")/_device_common.sh"
echo "== ws / ws2 / ws3 paired bench (cap ${T_BENCH:-120}s)"
timeout -k 5 "${T_BENCH:-120}" python3 benchmarks/sparse_decode_ws3_paired.py "$W/sparse_decode_ws3_paired.json" \
  --rounds "${ROUNDS:-5}" > "$W/bench.log" 2>&1
echo "bench rc=$? ($(el))"
grep -E "SUMMARY|Error|error" "$W/bench.log" | tail -20
tar czf "$OUT/sparse_ws3_paired.tgz" -C "$W" .
echo "== done ($(el))"
exit 0
