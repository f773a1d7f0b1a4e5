"""npudet's configs log to TensorBoard: a short training run's event file holds the scalars."""

from __future__ import annotations

import glob
import os
from typing import Dict, List

import pytest
from mmengine.config import Config
from plugin_util import ROOT, SMALL_DETR, data_options, run_tool

CONFIGS = sorted(
    glob.glob(os.path.join(ROOT, "configs", "small", "*.py"))
    + glob.glob(os.path.join(ROOT, "configs", "bev", "*.py"))
)


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_configs_have_the_tensorboard_backend(path: str) -> None:
    backends = [b["type"] for b in Config.fromfile(path).visualizer.vis_backends]
    assert backends == ["LocalVisBackend", "TensorboardVisBackend"]


def _scalars(work_dir: str) -> Dict[str, List[float]]:
    """{tag: [value per step]} from the one TensorBoard event file under ``work_dir``."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = glob.glob(os.path.join(work_dir, "*", "vis_data", "events.out.tfevents.*"))
    assert len(files) == 1, files
    events = EventAccumulator(files[0])
    events.Reload()
    return {tag: [e.value for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_training_writes_losses_lr_msda_profile_and_coco_ap(tiny_shapes: str, tmp_path) -> None:
    # The small config plus the MSDA profiler; 1 epoch = 2 iterations, then one evaluation.
    cfg = Config.fromfile(SMALL_DETR)
    cfg.custom_hooks.append(dict(type="MSDAProfilerHook"))
    config = str(tmp_path / "with_profiler.py")
    cfg.dump(config)
    work = str(tmp_path / "work")
    proc = run_tool(
        [
            "tools/train.py",
            config,
            "--work-dir",
            work,
            "--msda-impl",
            "grid_sample",
            "--cfg-options",
            *data_options(tiny_shapes),
            "default_hooks.logger.interval=1",
            "log_processor.window_size=1",
            "train_cfg.max_epochs=1",
            "train_cfg.val_interval=1",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    scalars = _scalars(work)
    for tag in ("loss", "loss_cls", "loss_bbox", "lr", "msda_fwd_ms", "msda_bwd_ms"):
        assert len(scalars.get(tag, [])) == 2, (tag, sorted(scalars))
    assert all(v > 0 for v in scalars["loss"] + scalars["lr"] + scalars["msda_fwd_ms"])
    assert scalars["msda_calls"] == [6.0, 6.0]  # 3 encoder + 3 decoder layers, one call each
    assert len(scalars["coco/bbox_mAP"]) == 1 and 0 <= scalars["coco/bbox_mAP"][0] <= 1
