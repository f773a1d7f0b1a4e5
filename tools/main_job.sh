#!/usr/bin/env bash
# README command 1: set up, generate the built-in shapes set, train the small Deformable
# DETR (+refine, +two-stage) with the MSDA implementation chosen by `auto`; its last epoch
# evaluates on the val split and prints the COCO table. Extra arguments go to tools/train.py, e.g.
#   bash tools/main_job.sh --msda-impl grid_sample
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
start=$(date +%s)
bash tools/setup.sh
py=.venv/bin/python
config=configs/small/deformable-detr-refine-twostage_r18-tiny_shapes.py
work_dir=${NPUDET_WORK_DIR:-work_dirs/main_job}

"$py" tools/make_shapes_dataset.py --root data/shapes
# Training ends with the evaluation on the val split (COCO table + coco_bbox_val.json).
"$py" tools/train.py "$config" --work-dir "$work_dir" --msda-impl auto "$@"

"$py" - "$work_dir/coco_bbox_val.json" "$start" <<'PY'
import json, sys, time
bbox = json.load(open(sys.argv[1]))["bbox"]
minutes = (time.time() - int(sys.argv[2])) / 60
print(f"[main_job] bbox AP50 = {bbox['AP50']:.3f}, AP = {bbox['AP']:.3f} on the shapes val "
      f"split; wall time {minutes:.1f} min (including setup); results in {sys.argv[1]}")
PY
