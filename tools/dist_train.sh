#!/usr/bin/env bash
# Distributed training with torchrun and mmengine's `pytorch` launcher (mmdet's script).
#   bash tools/dist_train.sh CONFIG NUM_PROCS [tools/train.py arguments...]
# Backend: NCCL on CUDA GPUs and HCCL on Ascend NPUs (mmengine picks them); on CPU-only
# machines tools/train.py starts gloo itself. Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT.
set -euo pipefail
CONFIG=$1
NPROCS=$2
shift 2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python
PYTHONPATH="$root:${PYTHONPATH:-}" exec "$py" -m torch.distributed.run \
  --nnodes="${NNODES:-1}" --node_rank="${NODE_RANK:-0}" \
  --master_addr="${MASTER_ADDR:-127.0.0.1}" --master_port="${PORT:-29500}" \
  --nproc_per_node="$NPROCS" \
  "$root/tools/train.py" "$CONFIG" --launcher pytorch "$@"
