"""A few iterations of tools/train.py + tools/test.py on a tiny generated shapes set."""

from __future__ import annotations

import json
import os
import pickle
from typing import Dict, List

import pytest
import torch
from plugin_util import SMALL_DETR, data_options, run_tool

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
    proc = run_tool(
        [
            "tools/train.py",
            SMALL_DETR,
            "--work-dir",
            work,
            "--msda-impl",
            impl,
            *extra,
            "--cfg-options",
            *opts,
        ]
    )
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


def _test(work: str, ckpt: str, impl: str, data: str) -> Dict[str, float]:
    """``tools/test.py`` on the val images; their predictions in ``work/preds.pkl``."""
    proc = run_tool(
        [
            "tools/test.py",
            SMALL_DETR,
            ckpt,
            "--work-dir",
            work,
            "--msda-impl",
            impl,
            "--out",
            os.path.join(work, "preds.pkl"),
            "--cfg-options",
            *data_options(data),
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "AP50" in proc.stdout + proc.stderr
    with open(os.path.join(work, "coco_bbox_test.json")) as f:
        return json.load(f)["bbox"]


def _predictions(work: str) -> Dict[int, Dict[str, torch.Tensor]]:
    """image id -> ``pred_instances`` (bboxes (N, 4) xyxy pixels, scores (N,), labels (N,))."""
    with open(os.path.join(work, "preds.pkl"), "rb") as f:
        return {r["img_id"]: r["pred_instances"] for r in pickle.load(f)}


# Between implementations the MSDA outputs differ by float32 round-off. Measured here on
# the 4 val images (scores 0.03-0.07 after 4 iterations): scores within 4e-8, boxes equal,
# same order. The tolerances leave room for other CPUs' round-off (scores 250x, boxes
# 1e-2 px of 256), far below what a wrong sample moves.
SCORE_TOL, BOX_TOL = 1e-5, 1e-2


def _assert_same_detections(got: Dict[str, torch.Tensor], want: Dict[str, torch.Tensor]) -> None:
    """Each wanted detection has one of the same label, score and box in ``got``.

    Scores closer than ``SCORE_TOL`` may trade places (top-k order), so detections are
    matched, not compared by index; at the top-k boundary one of two near-tied candidates
    may be kept by each run, so only detections scored above the boundary must match.
    """
    assert len(got["scores"]) == len(want["scores"]) > 0
    torch.testing.assert_close(
        got["scores"].sort(descending=True).values,
        want["scores"].sort(descending=True).values,
        atol=SCORE_TOL,
        rtol=0,
    )
    boundary = float(want["scores"].min()) + SCORE_TOL
    unused = set(range(len(got["scores"])))
    for box, score, label in zip(want["bboxes"], want["scores"], want["labels"]):
        match = next(
            (
                j
                for j in sorted(unused)
                if got["labels"][j] == label
                and abs(float(got["scores"][j] - score)) <= SCORE_TOL
                and float((got["bboxes"][j] - box).abs().max()) <= BOX_TOL
            ),
            None,
        )
        if match is None:
            assert float(score) <= boundary, (float(score), label, box)
        else:
            unused.discard(match)


@pytest.fixture(scope="module")
def runs(tiny_shapes: str, tmp_path_factory: pytest.TempPathFactory) -> Dict[str, str]:
    """grid_sample for 2 epochs (2 iterations each); cpu for 1; a resume of the first."""
    root = tmp_path_factory.mktemp("runs")
    works = {name: str(root / name) for name in ("grid_sample", "cpu", "resumed")}
    _train(works["grid_sample"], "grid_sample", tiny_shapes, 2)
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


def test_checkpoint_predicts_the_same_with_another_impl(
    runs: Dict[str, str], tiny_shapes: str, tmp_path
) -> None:
    """A checkpoint trained with grid_sample gives the same detections on every val image
    with cpu: boxes, scores and labels within round-off tolerance."""
    ckpt = os.path.join(runs["grid_sample"], "epoch_2.pth")
    works = {impl: str(tmp_path / impl) for impl in ("grid_sample", "cpu")}
    metrics = {impl: _test(work, ckpt, impl, tiny_shapes) for impl, work in works.items()}
    assert list(metrics["grid_sample"]) == EXPECTED_KEYS
    want, got = _predictions(works["grid_sample"]), _predictions(works["cpu"])
    with open(os.path.join(tiny_shapes, "annotations", "instances_val.json")) as f:
        val_ids = sorted(image["id"] for image in json.load(f)["images"])
    assert sorted(want) == sorted(got) == val_ids
    for img_id in val_ids:
        _assert_same_detections(got[img_id], want[img_id])


def test_detection_matching_catches_a_moved_box_or_a_changed_label() -> None:
    want = {
        "bboxes": torch.tensor([[0.0, 0.0, 10.0, 10.0], [5.0, 5.0, 20.0, 20.0], [1, 1, 2, 2.0]]),
        "scores": torch.tensor([0.9, 0.5, 0.2]),
        "labels": torch.tensor([0, 1, 2]),
    }
    order = torch.tensor([1, 0, 2])  # near-tied scores may come in another order
    _assert_same_detections({k: v[order] for k, v in want.items()}, want)
    boundary = {k: v.clone() for k, v in want.items()}  # another candidate at the top-k cut
    boundary["bboxes"][2] += 50.0
    _assert_same_detections(boundary, want)
    for name, change in (("bboxes", 0.5), ("labels", 1)):
        wrong = {k: v.clone() for k, v in want.items()}
        wrong[name][0] += change
        with pytest.raises(AssertionError):
            _assert_same_detections(wrong, want)
