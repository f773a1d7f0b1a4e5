"""BEVFormer-tiny at its real size (6 cameras resized to 800x450, 50x50 BEV, 900 queries)
trains and evaluates on nuScenes-format data, along a nuScenes user's path (slow).

The path: a nuScenes ``v1.0-mini`` database (tests/bev/nuscenes_fixture.py: every table, camera
JPEGs, devkit-loadable) -> ``tools/dataset_converters/create_nuscenes_infos.py`` ->
``tools/train.py`` with the shipped config, only the data roots, the pretrained backbone (no
downloads), the schedule and the worker count overridden. One training iteration (one sample of the
train scene), then the config's evaluation (two val samples): the loss must be finite and the
evaluation must return nuScenes' metrics (mAP, NDS and the five true-positive errors).
"""

from __future__ import annotations

import glob
import json
import math
import os

import pytest
from nuscenes_fixture import make_nuscenes_fixture
from plugin_util import ROOT, run_tool

CONFIG = os.path.join(ROOT, "configs", "bev", "bevformer-tiny_r50_nuscenes.py")
NUSCENES_METRICS = ("mAP", "NDS", "mATE", "mASE", "mAOE", "mAVE", "mAAE")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_bevformer_tiny_trains_and_evaluates_on_nuscenes_infos(tmp_path) -> None:
    root = make_nuscenes_fixture(str(tmp_path / "nuscenes"), seed=0)
    proc = run_tool(
        [
            "tools/dataset_converters/create_nuscenes_infos.py",
            "--dataroot",
            root,
            "--version",
            "v1.0-mini",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    data_root = root.rstrip("/") + "/"
    options = [
        *(
            f"{loader}.dataset.data_root={data_root}"
            for loader in ("train_dataloader", "val_dataloader", "test_dataloader")
        ),
        *(f"{loader}.num_workers=0" for loader in ("train_dataloader", "val_dataloader")),
        # one training sample: one iteration at the real size, then the epoch's evaluation
        # over two val samples (each encodes its queue of three frames: 36 camera images)
        "train_dataloader.dataset.indices=1",
        "val_dataloader.dataset.indices=2",
        "train_cfg.max_epochs=1",
        "train_cfg.val_interval=1",
        "model.backbone.init_cfg=None",
        "default_hooks.logger.interval=1",
    ]
    work = tmp_path / "work"
    proc = run_tool(
        ["tools/train.py", CONFIG, "--work-dir", str(work), "--cfg-options", *options],
        timeout=1700,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (log,) = glob.glob(str(work / "*" / "vis_data" / "scalars.json"))
    with open(log) as f:
        records = [json.loads(line) for line in f]
    losses = [r["loss"] for r in records if "loss" in r]
    assert len(losses) == 1 and math.isfinite(losses[0]), records
    (metrics,) = [r for r in records if "bev/NDS" in r]
    for name in NUSCENES_METRICS:
        assert math.isfinite(metrics[f"bev/{name}"]), (name, metrics)
    assert 0.0 <= metrics["bev/mAP"] <= 1.0 and 0.0 <= metrics["bev/NDS"] <= 1.0, metrics
