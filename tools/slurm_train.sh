#!/usr/bin/env bash
# Training on a Slurm cluster with srun and mmengine's `slurm` launcher (mmdet's script).
#   [GPUS=16] [GPUS_PER_NODE=8] bash tools/slurm_train.sh PARTITION JOB_NAME CONFIG WORK_DIR \
#       [tools/train.py arguments...]
# One task per device: GPUS tasks in all, GPUS_PER_NODE per node, CPUS_PER_TASK cores each;
# GRES (default gpu:GPUS_PER_NODE; e.g. npu:8 where the cluster names Ascend NPUs so) and
# SRUN_ARGS (more srun options) pass through. Slurm restarts nothing: after a lost node, run
# it again with --resume (the work dir's last checkpoint). Written to mmdet's pattern; not run
# here (no Slurm cluster has been available), unlike tools/dist_train.sh.
set -euo pipefail
PARTITION=$1
JOB_NAME=$2
CONFIG=$3
WORK_DIR=$4
shift 4
GPUS=${GPUS:-8}
GPUS_PER_NODE=${GPUS_PER_NODE:-8}
CPUS_PER_TASK=${CPUS_PER_TASK:-5}
GRES=${GRES:-gpu:${GPUS_PER_NODE}}
read -r -a srun_args <<<"${SRUN_ARGS:-}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
py="$root/.venv/bin/python"
[ -x "$py" ] || py=python
PYTHONPATH="$root:${PYTHONPATH:-}" exec srun -p "$PARTITION" \
  --job-name="$JOB_NAME" \
  --gres="$GRES" \
  --ntasks="$GPUS" \
  --ntasks-per-node="$GPUS_PER_NODE" \
  --cpus-per-task="$CPUS_PER_TASK" \
  --kill-on-bad-exit=1 \
  "${srun_args[@]}" \
  "$py" -u "$root/tools/train.py" "$CONFIG" --work-dir="$WORK_DIR" --launcher=slurm "$@"
