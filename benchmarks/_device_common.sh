# Shared preamble of the benchmarks/device_*.sh scripts. Sourced, not run: a script sets its settings, then
#
#   DK_OUT_DEFAULT=/tmp/foo_out DK_ENV_CAP=15 DK_PYTEST_TIMEOUT=60 . "$(dirname "$0")/_device_common.sh"
#
# Settings (read while this file is sourced; given as prefix assignments, as above, they are gone afterwards):
#   DK_OUT_DEFAULT     $OUT when the caller left OUT unset or empty (required)
#   DK_ENV_CAP         cap in seconds of the provenance step (default 15; killed 2 s after the cap)
#   DK_PYTEST_TIMEOUT  per-test --timeout for pytest when pytest_timeout is importable (default 60)
#   DK_SHOW_SHA        1 (default): print "GIT_SHA=<sha>" before the provenance step; 0: print nothing
#
# What it does, in order (the block every such script started with):
#   set -u; export PYTHONPATH=src PYTHONUNBUFFERED=1; export GIT_SHA (default: git rev-parse HEAD, else "unknown");
#   OUT=${OUT:-$DK_OUT_DEFAULT}; W=$(mktemp -d) (the work folder the script tars into $OUT at its end);
#   mkdir -p "$OUT"; unset TRITON_INTERPRET; T0=$(date +%s) and el (prints the seconds since T0, "N s");
#   the provenance JSON (deepkernels.bench.runner.provenance) -> $W/env.json, capped at DK_ENV_CAP s;
#   TO = "--timeout=$DK_PYTEST_TIMEOUT" when pytest_timeout is importable, else "";
#   XD = "-n ${NPROC:-4}" when xdist is importable, else "".
# Functions for the steps:
#   el                                  seconds since T0 ("N s")
#   junit_json NAME "suite" [CAP] [K]   benchmarks/junit_summary.py on $W/NAME.xml with $W/env.json ->
#                                       $W/NAME.json (prints the counts); capped at CAP s (10), killed K s (2) later
#   gpu_tests NAME "suite" CAP ARGS...  pytest ARGS -m gpu (-q, $TO, $XD) under a CAP s cap -> $W/NAME.log / .xml;
#                                       prints its rc, last lines and failures, then junit_json NAME; returns the rc
set -u
export PYTHONPATH=src PYTHONUNBUFFERED=1
export GIT_SHA="${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
OUT=${OUT:-$DK_OUT_DEFAULT}
W=$(mktemp -d)
mkdir -p "$OUT"
unset TRITON_INTERPRET
T0=$(date +%s)
el() { echo "$(( $(date +%s) - T0 )) s"; }
junit_json() {
  timeout -k "${4:-2}" "${3:-10}" python3 benchmarks/junit_summary.py "$W/$1.xml" "$W/env.json" "$W/$1.json" "$2"
}
gpu_tests() {
  local name=$1 suite=$2 cap=$3 rc
  shift 3
  # shellcheck disable=SC2086
  timeout -k 5 "$cap" python3 -m pytest "$@" -m gpu -q -rfs -p no:cacheprovider $TO $XD --junitxml="$W/$name.xml" \
    > "$W/$name.log" 2>&1
  rc=$?
  echo "tests rc=$rc ($(el))"
  tail -3 "$W/$name.log"; grep -E "^FAILED|^ERROR" "$W/$name.log" | head -20
  junit_json "$name" "$suite"
  return $rc
}
[ "${DK_SHOW_SHA:-1}" = 1 ] && echo "GIT_SHA=$GIT_SHA"
timeout -k 2 "${DK_ENV_CAP:-15}" python3 -c 'import json, sys; from deepkernels.bench.runner import provenance
json.dump(provenance(), open(sys.argv[1], "w"), indent=1)' "$W/env.json" 2>&1
TO=""; python3 -c "import pytest_timeout" 2>/dev/null && TO="--timeout=${DK_PYTEST_TIMEOUT:-60}"
XD=""; python3 -c "import xdist" 2>/dev/null && XD="-n ${NPROC:-4}"
