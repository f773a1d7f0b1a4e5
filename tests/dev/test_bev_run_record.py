"""npudet_dev.bev_run_record: a BEV training run's stored record, from a work dir's logs."""

from __future__ import annotations

import json
import os

import pytest

from npudet.bev.evaluation.center_distance import TP_METRICS
from npudet_dev.bev_run_record import read_run, store_run

# Tests of the project's own machinery (dev/).
pytestmark = pytest.mark.dev

CLASSES = ("car", "pedestrian")


def _val(step: int, map_: float, aoe: float) -> dict:
    row = {"bev/mAP": map_, "bev/NDS": map_ + 0.01, "step": step}
    for key in ("mATE", "mASE", "mAVE", "mAAE"):
        row[f"bev/{key}"] = 0.3
    row["bev/mAOE"] = aoe
    for name in CLASSES:
        row[f"bev/AP/{name}"] = map_
        row[f"bev/AP/{name}@0.5"] = map_ / 2
        for key in TP_METRICS:
            row[f"bev/{key}/{name}"] = aoe if key == "orient_err" else 0.3
    return row


def _work_dir(root: str) -> str:
    """A tools/train.py-like work dir: 2 epochs of 40 iterations, a validation after each."""
    run = os.path.join(root, "20261206_060000")
    os.makedirs(os.path.join(run, "vis_data"))
    rows = [
        {"loss": 3.0, "time": 0.5, "iter": 20, "epoch": 1, "step": 20},
        {"loss": 2.0, "time": 0.7, "iter": 40, "epoch": 1, "step": 40},
        _val(1, 0.2, 1.2),
        {"loss": 1.0, "time": 0.6, "iter": 60, "epoch": 2, "step": 60},
        {"loss": 0.9, "time": 0.4, "iter": 80, "epoch": 2, "step": 80},
        _val(2, 0.5, 0.4),
    ]
    with open(os.path.join(run, "vis_data", "scalars.json"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    lines = [
        "2026/12/06 06:00:00 - mmengine - INFO - Config:",
        "2026/12/06 06:01:00 - mmengine - INFO - Epoch(train) [1][20/40]  loss: 3.0",
        "2026/12/06 06:31:00 - mmengine - INFO - Epoch(train) [2][40/40]  loss: 0.9",
        "2026/12/06 06:33:30 - mmengine - INFO - Epoch(val) [2][16/16]  bev/mAP: 0.5",
    ]
    with open(os.path.join(run, "20261206_060000.log"), "w") as f:
        f.write("\n".join(lines) + "\n")
    return root


def test_read_run(tmp_path) -> None:
    rec = read_run(_work_dir(str(tmp_path)))
    assert rec["metrics"]["mAP"] == 0.5 and rec["metrics"]["orient_err/car"] == 0.4  # the last
    assert [h["step"] for h in rec["history"]] == [1, 2]
    assert [h["mAOE"] for h in rec["history"]] == [1.2, 0.4]
    assert rec["iters"] == 80 and rec["sec_per_iter"] == pytest.approx(0.55)
    assert rec["train_min"] == pytest.approx(31.0) and rec["total_min"] == pytest.approx(33.5)


def test_store_run(tmp_path) -> None:
    out = str(tmp_path / "stored")
    store_run(_work_dir(str(tmp_path / "w")), out, "demo", "abc1234", "some CPU", ["cmd a"])
    with open(os.path.join(out, "metrics.json")) as f:
        stored = json.load(f)
    assert stored["commit"] == "abc1234" and stored["commands"] == ["cmd a"]
    assert stored["metrics"]["NDS"] == pytest.approx(0.51)
    with open(os.path.join(out, "summary.md")) as f:
        text = f.read()
    assert "| car | 0.5000 | 0.3000 | 0.3000 | 0.4000 |" in text  # AP, ATE, ASE, AOE
    assert "| 1 | 0.2000 | 0.2100 |" in text  # the first epoch's row
    assert "commit abc1234; some CPU" in text and "cmd a" in text


def test_no_validation(tmp_path) -> None:
    root = _work_dir(str(tmp_path))
    scalars = os.path.join(root, "20261206_060000", "vis_data", "scalars.json")
    with open(scalars) as f:
        rows = [line for line in f if "bev/mAP" not in line]
    with open(scalars, "w") as f:
        f.writelines(rows)
    with pytest.raises(ValueError, match="no validation"):
        read_run(root)
