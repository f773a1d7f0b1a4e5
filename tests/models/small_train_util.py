"""The small configs' slow trainings on the built-in shapes set: the untrained model's
metrics, then ``tools/train.py`` and ``tools/test.py`` in fresh processes, as a user runs them."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Sequence, Tuple

from plugin_util import data_options, run_tool


def untrained_metrics(config: str, options: Sequence[str], work_dir: str) -> Dict[str, float]:
    """Test metrics of ``config``'s freshly initialised model (seed 0), with the
    ``--cfg-options`` ``options`` (the data roots among them)."""
    from mmengine.config import Config, DictAction
    from mmengine.runner import Runner

    cfg = Config.fromfile(config)
    # parsed as --cfg-options parses them (a list or number given as text)
    pairs = (opt.split("=", 1) for opt in options)
    cfg.merge_from_dict({key: DictAction._parse_iterable(value) for key, value in pairs})
    cfg.work_dir = work_dir
    runner = Runner.from_cfg(cfg)
    runner.model.init_weights()
    return runner.test()


def before_and_after(
    config: str, work: Path, options: Sequence[str] = (), timeout: int = 6600
) -> Tuple[Dict[str, float], Dict[str, float]]:
    """The ``coco/...`` test metrics of ``config``'s untrained model and of the model trained
    for the config's own schedule with ``--msda-impl cpu``, on a shapes set of the default
    size generated under ``work``; ``options`` are ``--cfg-options`` after the data roots."""
    from npudet.datasets import make_shapes_dataset

    data_root = str(work / "shapes")
    make_shapes_dataset(data_root)
    options = [*data_options(data_root), *options]
    before = untrained_metrics(config, options, str(work / "untrained"))
    return before, train_and_test(config, work, options, timeout)


def train_and_test(
    config: str, work: Path, options: Sequence[str], timeout: int
) -> Dict[str, float]:
    """``tools/train.py`` of ``config`` for its own schedule with ``--msda-impl cpu``, then
    ``tools/test.py`` of its last checkpoint; the ``coco/...`` metrics the test printed."""
    cfg_options = ["--cfg-options", *options]
    proc = run_tool(
        ["tools/train.py", config, "--work-dir", str(work / "train"), "--msda-impl", "cpu",
         *cfg_options],
        timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ckpt = (work / "train" / "last_checkpoint").read_text().strip()
    proc = run_tool(
        ["tools/test.py", config, ckpt, "--work-dir", str(work / "test"), *cfg_options],
        timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    # mmdet's CocoMetric ends with one line of every metric: "coco/bbox_mAP: 0.1230 ..."
    metrics = dict(re.findall(r"(coco/\w+(?:@\d+)?): (\d+\.\d+)", out))
    assert metrics, out[-3000:]
    return {key: float(value) for key, value in metrics.items()}
