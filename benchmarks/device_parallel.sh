#!/usr/bin/env bash
# TP MLA + EP MoE on the nvidia-h200-x2 machine (run from the repo root):
#   GIT_SHA=<sha> bash benchmarks/device_parallel.sh [extra parallel_decode.py args]
#   (CPU=1 bash benchmarks/device_parallel.sh: the same on the CPU with gloo at small sizes, as a dry run)
# 1. environment (2 GPUs?), 2. benchmarks/parallel_decode.py under torchrun, 2 processes, NCCL: the
# "2 ranks == 1 rank" checks (V3 attention dims, 128 -> 64 heads per rank; MoE 16 experts top-4) and the
# decode-step timing per rank vs one GPU (b = 64 and 128, s_k = 4096), JSON under $OUT, table printed last.
# NVLink multicast stays off in every process (exported here; the Python side sets them again).
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src" PYTHONUNBUFFERED=1
export GIT_SHA="${GIT_SHA:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
OUT=${OUT:-/tmp/parallel_out}
mkdir -p "$OUT"
T_RUN=${T_RUN:-220}

{
  echo "== env"; date -u
  nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.max.sm --format=csv
  nvidia-smi topo -m 2>/dev/null | head -8
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'cuda', torch.version.cuda, 'nccl', torch.cuda.nccl.version(), 'gpus', torch.cuda.device_count())"
  echo "GIT_SHA=$GIT_SHA NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE TORCH_SYMM_MEM_DISABLE_MULTICAST=$TORCH_SYMM_MEM_DISABLE_MULTICAST NVSHMEM_DISABLE_NVLS=$NVSHMEM_DISABLE_NVLS"
} > "$OUT/env.log" 2>&1
cat "$OUT/env.log"

CPU_FLAG=""
if [ "${CPU:-0}" = 1 ]; then
  CPU_FLAG="--cpu"   # dry run of this script on a machine without GPUs (gloo, small sizes)
else
  NGPU=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  if [ "$NGPU" -lt 2 ]; then
    echo "need 2 GPUs, found $NGPU: running the 1-rank parts only is pointless; stopping"; exit 1
  fi
fi

echo "== torchrun --nproc_per_node=2 benchmarks/parallel_decode.py (cap ${T_RUN}s)"
timeout -k 10 "$T_RUN" python3 -m torch.distributed.run --standalone --nproc_per_node=2 \
  benchmarks/parallel_decode.py --out "$OUT" --budget-s $(( T_RUN - 50 )) $CPU_FLAG "$@" > "$OUT/run.log" 2>&1
rc=$?
echo "parallel_decode rc=$rc (124 = ran past ${T_RUN}s)"
grep -E "^\[rank[01]\]:.*(Error|error)" "$OUT/run.log" | head -5
# the table is the last thing the script prints
sed -n '/^== checks/,$p' "$OUT/run.log"
[ -s "$OUT/parallel_decode.json" ] || { echo "no JSON written; log tail:"; tail -40 "$OUT/run.log"; }
