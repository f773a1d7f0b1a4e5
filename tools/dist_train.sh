#!/usr/bin/env bash
# Distributed training with torchrun and mmengine's `pytorch` launcher (mmdet's script).
#   bash tools/dist_train.sh CONFIG NUM_PROCS [tools/train.py arguments...]
# Backend: NCCL on CUDA GPUs and HCCL on Ascend NPUs (mmengine picks them); on CPU-only
# machines tools/train.py starts gloo itself. Multi-node: NNODES, NODE_RANK, MASTER_ADDR, PORT.
# Elastic mode: MAX_RESTARTS=N restarts the whole worker group up to N times when a rank dies
# (torchrun --max-restarts with a c10d rendezvous at MASTER_ADDR:PORT, id RDZV_ID, default
# "npudet"; every node must pass the same); a restarted tools/train.py resumes from the work
# dir's last checkpoint by itself (TORCHELASTIC_RESTART_COUNT > 0 acts as --resume), so a lost
# rank costs the iterations since that checkpoint.
set -euo pipefail
CONFIG=$1
NPROCS=$2
shift 2
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python
addr="${MASTER_ADDR:-127.0.0.1}"
port="${PORT:-29500}"
if [ -n "${MAX_RESTARTS:-}" ]; then
  case "$MAX_RESTARTS" in
    '' | *[!0-9]*) echo "error: MAX_RESTARTS=$MAX_RESTARTS: expected a whole number >= 0" >&2; exit 2 ;;
  esac
  # Workers keep no process-group keys in the rendezvous store (torchrun shares it across
  # restarts by default, and a restarted rank read a dead peer's address from it: a wasted
  # restart, seen with gloo): rank 0 hosts a fresh store each time.
  export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
  launch=(--max-restarts="$MAX_RESTARTS" --rdzv-backend=c10d --rdzv-endpoint="$addr:$port"
    --rdzv-id="${RDZV_ID:-npudet}")
else
  launch=(--node_rank="${NODE_RANK:-0}" --master_addr="$addr" --master_port="$port")
fi
PYTHONPATH="$root:${PYTHONPATH:-}" exec "$py" -m torch.distributed.run \
  --nnodes="${NNODES:-1}" "${launch[@]}" \
  --nproc_per_node="$NPROCS" \
  "$root/tools/train.py" "$CONFIG" --launcher pytorch "$@"
