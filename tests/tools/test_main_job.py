"""The full main job (README command 1): slow."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from plugin_util import ROOT


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_main_job_reaches_ap50(tmp_path) -> None:
    work = tmp_path / "main_job"
    env = dict(os.environ, NPUDET_WORK_DIR=str(work))
    proc = subprocess.run(
        ["bash", "tools/main_job.sh"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "[main_job] bbox AP50 =" in proc.stdout
    with open(work / "coco_bbox_val.json") as f:
        assert json.load(f)["bbox"]["AP50"] >= 0.5
