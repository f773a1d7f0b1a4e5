"""A few iterations of tools/train.py + tools/test.py on a tiny generated shapes set."""

from __future__ import annotations

import json
import os
from typing import Dict, List

import checkpoint_compare as compare
import pytest
from msda_perturbed import NAME as NEGATIVE
from plugin_util import SMALL_DETR, data_options, run_tool, train_args

from npudet.ops import msda_impls

pytestmark = pytest.mark.skipif("cpu" not in msda_impls(), reason="cpu kernel did not build")

FAST = ["default_hooks.logger.interval=1", "log_processor.window_size=1"]


def _train(work: str, impl: str, data: str, epochs: int, *extra: str) -> None:
    opts = [
        *data_options(data),
        *FAST,
        f"train_cfg.max_epochs={epochs}",
        f"train_cfg.val_interval={epochs}",
        "default_hooks.checkpoint.max_keep_ckpts=-1",
    ]
    proc = run_tool(train_args(SMALL_DETR, work, "--msda-impl", impl, *extra, options=opts))
    assert proc.returncode == 0, proc.stderr[-3000:]


def _losses(work: str) -> Dict[int, float]:
    losses = {}
    for run in sorted(os.listdir(work)):
        path = os.path.join(work, run, "vis_data", "scalars.json")
        if os.path.isfile(path):
            for line in open(path):
                record = json.loads(line)
                if "loss" in record:
                    losses[record["iter"]] = record["loss"]
    return losses


@pytest.fixture(scope="module")
def grid_sample_run(tiny_shapes: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """grid_sample for 2 epochs (2 iterations each): the checkpoint the other runs use."""
    work = str(tmp_path_factory.mktemp("runs") / "grid_sample")
    _train(work, "grid_sample", tiny_shapes, 2)
    return work


@pytest.fixture(scope="module")
def runs(grid_sample_run: str, tiny_shapes: str, tmp_path_factory) -> Dict[str, str]:
    """grid_sample for 2 epochs (2 iterations each); cpu for 1; a resume of the first."""
    root = tmp_path_factory.mktemp("more_runs")
    works = {"grid_sample": grid_sample_run}
    works |= {name: str(root / name) for name in ("cpu", "resumed")}
    _train(works["cpu"], "cpu", tiny_shapes, 1)
    _train(
        works["resumed"],
        "grid_sample",
        tiny_shapes,
        2,
        "--resume",
        os.path.join(works["grid_sample"], "epoch_1.pth"),
    )
    return works


EXPECTED_KEYS: List[str] = [
    "AP",
    "AP50",
    "AP75",
    "APs",
    "APm",
    "APl",
    "AR@100",
    "AR@300",
    "AR@1000",
    "ARs@1000",
    "ARm@1000",
    "ARl@1000",
]


@pytest.mark.parametrize("impl", ["grid_sample", "cpu"])
def test_train_writes_checkpoint_and_coco_json(runs: Dict[str, str], impl: str) -> None:
    work, epochs = runs[impl], 2 if impl == "grid_sample" else 1
    assert os.path.isfile(os.path.join(work, f"epoch_{epochs}.pth"))
    with open(os.path.join(work, "coco_bbox_val.json")) as f:
        record = json.load(f)
    assert record["mode"] == "val" and list(record["bbox"]) == EXPECTED_KEYS
    assert all(0.0 <= v <= 1.0 for v in record["bbox"].values())
    assert sorted(_losses(work)) == list(range(1, 2 * epochs + 1))


def test_impls_train_the_same(runs: Dict[str, str]) -> None:
    ref, fused = _losses(runs["grid_sample"]), _losses(runs["cpu"])
    assert fused[1] == pytest.approx(ref[1], rel=1e-5)
    assert fused[2] == pytest.approx(ref[2], rel=1e-3)


def test_resume_continues_with_the_same_losses(runs: Dict[str, str]) -> None:
    full, resumed = _losses(runs["grid_sample"]), _losses(runs["resumed"])
    assert sorted(resumed) == [3, 4]
    for it in (3, 4):
        assert resumed[it] == pytest.approx(full[it], rel=1e-6), it


@pytest.fixture(scope="module")
def checkpoint_runs(grid_sample_run: str, tiny_shapes: str, tmp_path_factory) -> dict:
    """The grid_sample checkpoint (4 iterations: scores 0.03-0.07) evaluated with grid_sample,
    cpu and the negative control ``shifted_for_test``: impl -> (metrics, predictions).
    ``test_checkpoint_trained.py`` (slow) repeats this on a confident model."""
    ckpt = os.path.join(grid_sample_run, "epoch_2.pth")
    root = str(tmp_path_factory.mktemp("checkpoint"))
    return compare.evaluate_with_each(ckpt, tiny_shapes, root, ["grid_sample", "cpu", NEGATIVE])


def test_checkpoint_predicts_the_same_with_another_impl(
    checkpoint_runs: dict, tiny_shapes: str
) -> None:
    """A checkpoint trained with grid_sample gives the same detections on every val image
    with cpu: boxes, scores and labels within round-off tolerance."""
    assert list(checkpoint_runs["grid_sample"][0]) == EXPECTED_KEYS
    compare.assert_impls_agree(checkpoint_runs, tiny_shapes)


def test_a_perturbed_msda_fails_the_same_comparison(checkpoint_runs: dict) -> None:
    """Negative control: grid_sample sampling a tenth of a pixel off (``msda_perturbed``)
    must fail the comparison that cpu passes, by a wide margin over its tolerance (so the
    4-iteration model's low scores still make it a test of the MSDA)."""
    compare.assert_perturbed_differs(checkpoint_runs)
