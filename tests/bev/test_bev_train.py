"""The small BEV config trained end to end on the built-in set (slow: 8 epochs of training)."""

from __future__ import annotations

import glob
import json
import os

import pytest
from plugin_util import ROOT, run_tool

CONFIG = os.path.join(ROOT, "configs", "bev", "bev-small_r18_synthetic.py")
LOADERS = ("train_dataloader", "val_dataloader", "test_dataloader")
# issue 35's bars: with a learned heading, mAP and NDS no lower than the small BEV row's
# figures when it was filed
BARS = {"mAP": 0.537, "NDS": 0.534}


def untrained_metrics(data_root: str, work_dir: str) -> dict:
    """Validation metrics of the freshly initialised model (seed 0)."""
    from mmengine.config import Config
    from mmengine.runner import Runner

    cfg = Config.fromfile(CONFIG)
    cfg.work_dir = work_dir
    for key in LOADERS:
        cfg[key].dataset.data_root = data_root
    runner = Runner.from_cfg(cfg)
    runner.model.init_weights()
    return runner.test()


@pytest.mark.slow
@pytest.mark.timeout(5400)
def test_small_bev_beats_untrained(tmp_path) -> None:
    from npudet.bev.infos.synthetic import make_bev_dataset

    data_root = str(tmp_path / "bev_synth") + "/"
    make_bev_dataset(data_root)
    before = untrained_metrics(data_root, str(tmp_path / "untrained"))
    work = tmp_path / "train"
    roots = [f"{key}.dataset.data_root={data_root}" for key in LOADERS]
    proc = run_tool(
        ["tools/train.py", CONFIG, "--work-dir", str(work), "--cfg-options", *roots], timeout=4800
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (log,) = glob.glob(str(work / "*" / "vis_data" / "scalars.json"))
    with open(log) as f:
        final = [json.loads(line) for line in f if "bev/mAP" in line][-1]
    # The recipe reached mAP 0.62 (class APs 0.53-0.69); 0.2 leaves room for noise.
    assert final["bev/mAP"] >= max(0.2, 10 * before["bev/mAP"]), (before, final)
    for name in ("car", "truck", "pedestrian"):
        assert final[f"bev/AP/{name}"] > 0, (name, final)
    assert final["bev/NDS"] > before["bev/NDS"] + 0.05, (before, final)
    # the history's velocity readout perceives motion: it reached mAVE 0.365 m/s, where
    # models that predict ~0 for every object (no history, or temporal self-attention alone)
    # stayed at 0.53-0.62 m/s
    assert final["bev/mAVE"] < 0.45, final
    # heading is learned from the painted fronts: random is ~1.57 rad, one colour per box
    # left the model at 1.30 (ambiguous by pi), the ego-frame yaw code at 1.34 (one heading
    # per class); the config reached 0.18
    assert final["bev/mAOE"] <= 0.5, final
    for key, bar in BARS.items():
        assert final[f"bev/{key}"] >= bar, (key, final)
