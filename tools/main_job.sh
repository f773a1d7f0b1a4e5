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

"$py" tools/dataset_converters/make_shapes_dataset.py --root data/shapes
# Training ends with the evaluation on the val split (COCO table + coco_bbox_val.json).
"$py" tools/train.py "$config" --work-dir "$work_dir" --msda-impl auto "$@"

"$py" - "$work_dir" "$start" <<'PY'
import json, os, sys, time
from npudet.benchmark.harness import machine_info
from npudet.benchmark.provenance import git_commit

work_dir, start = sys.argv[1], int(sys.argv[2])
bbox = json.load(open(os.path.join(work_dir, "coco_bbox_val.json")))["bbox"]
minutes = (time.time() - start) / 60
# The record results/main_job/ stores: the numbers, where and under what load they were made.
record = dict(bbox=bbox, wall_minutes=round(minutes, 2), commit=git_commit(),
              machine=machine_info(), cores=os.cpu_count(), load_avg_end=os.getloadavg())
with open(os.path.join(work_dir, "main_job.json"), "w") as f:
    json.dump(record, f, indent=1)
print(f"[main_job] bbox AP50 = {bbox['AP50']:.3f}, AP = {bbox['AP']:.3f} on the shapes val "
      f"split; wall time {minutes:.1f} min (including setup); results in {work_dir}")
PY
