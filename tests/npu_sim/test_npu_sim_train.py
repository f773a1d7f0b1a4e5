"""The three detector families trained and tested with tools/train.py / tools/test.py on the
simulated NPU (``NPUDET_SIMULATED_NPU=1``), with mmengine's NPU branches in force.

Each run is a child process that sees only the variable, as a user's would. What they prove:
the device glue (model, data, optimizer state and checkpoints on ``npu``; mmengine's
``get_device`` / ``BaseModel.to`` / AMP branches; ``NPUSetupHook``; ``auto`` on ``npu``), not
NPU speed or numerics: the device computes with the CPU's kernels, so from the same weights its
losses match a CPU run's to round-off. The weights must come from one place: an npu run
initialises its model on the device, from the npu generator (as on a real NPU), not the CPU's.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Dict, List

import pytest
import torch
from npu_sim_util import npu_env
from plugin_util import (
    ROOT,
    SMALL_DETR,
    SMALL_DINO,
    build_model,
    data_options,
    run_tool,
    small_cfg,
)

BEV = os.path.join(ROOT, "configs/bev/bev-small_r18_synthetic.py")
FAST = ["default_hooks.logger.interval=1", "log_processor.window_size=1"]
# One iteration of two images and no validation (tools/test.py evaluates, on two images): the
# glue, not learning, is under test.
ONE_STEP = [
    "train_cfg.max_epochs=1",
    "train_cfg.val_interval=2",
    "train_dataloader.batch_size=2",
    "train_dataloader.dataset.indices=2",
]
TWO_IMAGES = "test_dataloader.dataset.indices=2"


def _losses(work: Path) -> Dict[int, float]:
    losses = {}
    for path in sorted(work.glob("*/vis_data/scalars.json")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "loss" in record:
                losses[record["iter"]] = record["loss"]
    return losses


def _log(work: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(work.glob("*/*.log")))


def _train(config: str, work: Path, options: List[str], *args: str, npu: bool = True):
    proc = run_tool(
        ["tools/train.py", config, "--work-dir", str(work), *args, "--cfg-options", *options],
        env=npu_env() if npu else None,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def _test(config: str, checkpoint: Path, work: Path, options: List[str], npu: bool = True):
    proc = run_tool(
        [
            "tools/test.py",
            config,
            str(checkpoint),
            "--work-dir",
            str(work),
            "--cfg-options",
            *options,
        ],
        env=npu_env() if npu else None,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.fixture(scope="module")
def detr_runs(tiny_shapes: str, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Path]:
    """The small Deformable DETR for one iteration from the same initial weights: ``auto`` on
    the simulated NPU, and the ``grid_sample`` reference on the CPU (what npu_vendor's double
    computes with)."""
    root = tmp_path_factory.mktemp("npu_detr")
    weights = root / "initial.pth"  # both runs start from these (load_from)
    torch.save({"state_dict": build_model(small_cfg()).state_dict()}, weights)
    options = [*data_options(tiny_shapes), *FAST, *ONE_STEP, f"load_from={weights}"]
    works = {"npu": root / "npu", "cpu": root / "cpu"}
    _train(SMALL_DETR, works["npu"], options, "--msda-impl", "auto")
    _train(SMALL_DETR, works["cpu"], options, "--msda-impl", "grid_sample", npu=False)
    return works


def test_detr_trains_on_npu_with_auto(detr_runs):
    log = _log(detr_runs["npu"])
    assert "npudet MSDA auto on npu float32: using 'npu_vendor'" in log, log[-3000:]
    assert "NPUSetupHook: set torch_npu.npu.set_compile_mode(jit_compile=...) = False" in log
    assert "NPUSetupHook: set torch_npu.npu.config.allow_internal_format = False" in log
    assert "NPUSetupHook: set optim_wrapper.clip_grad_kwargs['foreach'] = False" in log
    npu_losses, cpu_losses = _losses(detr_runs["npu"]), _losses(detr_runs["cpu"])
    assert npu_losses and npu_losses.keys() == cpu_losses.keys()
    for step, loss in npu_losses.items():
        assert loss == pytest.approx(cpu_losses[step], rel=1e-4), (step, npu_losses, cpu_losses)


def test_npu_checkpoint_tests_on_cpu(detr_runs, tiny_shapes, tmp_path):
    """A checkpoint saved on npu evaluates with tools/test.py on a CPU-only process (the way
    back, a CPU checkpoint on npu: test_npu_sim_modes.py)."""
    checkpoint = detr_runs["npu"] / "epoch_1.pth"
    proc = _test(
        SMALL_DETR, checkpoint, tmp_path, [*data_options(tiny_shapes), TWO_IMAGES], npu=False
    )
    assert re.search(r"coco/bbox_mAP: \d", proc.stdout + proc.stderr), proc.stderr[-3000:]
    assert "npudet MSDA auto on cpu" in proc.stdout + proc.stderr


# DINO is slow (~40 s): the DETR runs above cover the detector path on npu in the default run.
@pytest.mark.parametrize(
    "config", [pytest.param(SMALL_DINO, marks=pytest.mark.slow), BEV], ids=["dino", "bev"]
)
def test_family_trains_and_tests_on_npu(config, tiny_shapes, tmp_path):
    if config == BEV:
        from bev_util import tiny_bev_set

        data_root = f"{tmp_path}/bev/"
        tiny_bev_set(data_root)
        data = [
            f"{part}.dataset.data_root={data_root}"
            for part in ("train_dataloader", "val_dataloader", "test_dataloader")
        ]
    else:
        data = data_options(tiny_shapes)
    options = [*data, *FAST, *ONE_STEP]
    work = tmp_path / "train"
    _train(config, work, options, "--msda-impl", "auto")
    log = _log(work)
    assert "npudet MSDA auto on npu float32: using 'npu_vendor'" in log, log[-3000:]
    assert "NPUSetupHook: set" in log, log[-3000:]
    losses = _losses(work)
    assert losses and all(v == v and abs(v) < 1e4 for v in losses.values()), losses
    proc = _test(config, work / "epoch_1.pth", tmp_path / "test", [*data, TWO_IMAGES])
    output = proc.stdout + proc.stderr
    assert "npudet MSDA auto on npu float32: using 'npu_vendor'" in output, output[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("npu", [True, False], ids=["npu", "cpu"])
def test_deterministic_trainings_give_identical_losses(npu, tiny_shapes, tmp_path):
    """``randomness.deterministic=True`` with ``--msda-impl auto``: two trainings of three
    iterations on one device give the same losses to the last bit (npu against npu: an npu run
    draws its initial weights from the npu generator). On npu ``auto`` takes ``gather_det``,
    the one whose backward is deterministic there."""
    steps = ["train_dataloader.dataset.indices=6", "randomness.deterministic=True"]
    options = [*data_options(tiny_shapes), *FAST, *ONE_STEP[:-1], *steps]
    runs = []
    for name in ("first", "second"):
        _train(SMALL_DETR, tmp_path / name, options, "--msda-impl", "auto", npu=npu)
        runs.append(_losses(tmp_path / name))
    if npu:
        log = _log(tmp_path / "first")
        assert "npudet MSDA auto on npu float32: using 'gather_det'" in log, log[-3000:]
    assert len(runs[0]) == 3 and len(set(runs[0].values())) == 3, runs  # it trained
    assert runs[0] == runs[1]
