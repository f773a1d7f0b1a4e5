"""COCO box evaluation on faster-coco-eval and on pycocotools gives the same 12 numbers."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
from typing import Dict, List

import mmdet.evaluation.metrics.coco_metric as mmdet_coco_metric
import numpy as np
import pytest
import torch
from mmengine.config import Config
from plugin_util import SMALL_DETR

from npudet.evaluation import FastCocoMetric, coco_backend, faster_coco_eval_available
from npudet.evaluation.coco_synthetic import synthetic_coco_gt, synthetic_detections

ITEMS = [
    "mAP",
    "mAP_50",
    "mAP_75",
    "mAP_s",
    "mAP_m",
    "mAP_l",
    "AR@100",
    "AR@300",
    "AR@1000",
    "AR_s@1000",
    "AR_m@1000",
    "AR_l@1000",
]


@pytest.fixture(autouse=True)
def _needs_faster_coco_eval() -> None:
    # tools/setup.sh installs it: a missing package is a broken environment, not a skip.
    assert faster_coco_eval_available(), "faster-coco-eval is missing: run bash tools/setup.sh"


def _val_gt(root: str) -> str:
    return os.path.join(root, "annotations", "instances_val.json")


def _stats(name: str, ann_file: str, dets: List[Dict]) -> np.ndarray:
    """The 12 numbers of COCOeval on backend ``name`` with mmdet's CocoMetric settings."""
    backend = coco_backend(name)
    with contextlib.redirect_stdout(io.StringIO()):
        gt = backend.coco(ann_file)
        evaluator = backend.cocoeval(gt, gt.loadRes(json.loads(json.dumps(dets))), "bbox")
        evaluator.params.maxDets = [100, 300, 1000]
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return np.asarray(evaluator.stats[:12], dtype=np.float64)


def _assert_same(ann_file: str, dets: List[Dict]) -> np.ndarray:
    ref = _stats("pycocotools", ann_file, dets)
    fast = _stats("faster_coco_eval", ann_file, dets)
    # Both count the same matches in float64 and average the same precision table; a
    # difference would be a different matching or interpolation, not round-off.
    np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-6)
    assert 0 < ref[0] < 1 and 0 < ref[1] < 1 and 0 < ref[6] < 1, ref
    return ref


def test_same_12_numbers_on_the_shapes_val_split(tiny_shapes: str) -> None:
    ann_file = _val_gt(tiny_shapes)
    with open(ann_file) as f:
        gt = json.load(f)
    for seed in range(3):
        dets = synthetic_detections(gt, seed=seed, false_positives=4, jitter=0.15)
        _assert_same(ann_file, dets)


def test_same_12_numbers_on_a_generated_coco_like_set(tmp_path) -> None:
    """80 classes, small/medium/large boxes, crowd regions, 30 false positives per image."""
    gt = synthetic_coco_gt(150, seed=5, crowd_fraction=0.05)
    ann_file = str(tmp_path / "gt.json")
    with open(ann_file, "w") as f:
        json.dump(gt, f)
    stats = _assert_same(ann_file, synthetic_detections(gt, seed=6, false_positives=30))
    assert all(0 < value < 1 for value in stats), stats  # every area range is populated


def _metric_results(backend: str, ann_file: str, dets: List[Dict]) -> Dict[str, float]:
    metric = FastCocoMetric(ann_file=ann_file, metric="bbox", metric_items=ITEMS, backend=backend)
    metric.dataset_meta = dict(classes=("circle", "square", "triangle"))
    with open(ann_file) as f:
        images = json.load(f)["images"]
    for image in images:
        mine = [d for d in dets if d["image_id"] == image["id"]]
        boxes = torch.tensor([d["bbox"] for d in mine]).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]  # xywh -> xyxy, as a detector outputs them
        sample = dict(
            img_id=image["id"],
            ori_shape=(image["height"], image["width"]),
            pred_instances=dict(
                bboxes=boxes,
                scores=torch.tensor([d["score"] for d in mine]),
                labels=torch.tensor([d["category_id"] - 1 for d in mine]),
            ),
        )
        metric.process({}, [sample])
    with contextlib.redirect_stdout(io.StringIO()):
        return metric.evaluate(len(images))


def test_fast_coco_metric_gives_mmdets_numbers_on_both_backends(tiny_shapes: str) -> None:
    ann_file = _val_gt(tiny_shapes)
    with open(ann_file) as f:
        dets = synthetic_detections(json.load(f), seed=1, false_positives=4, jitter=0.15)
    saved = mmdet_coco_metric.COCO, mmdet_coco_metric.COCOeval
    ref = _metric_results("pycocotools", ann_file, dets)
    fast = _metric_results("faster_coco_eval", ann_file, dets)
    assert list(ref) == [f"coco/bbox_{item}" for item in ITEMS]
    assert fast == ref and 0 < ref["coco/bbox_mAP"] < 1
    # The swap is undone: mmdet's own CocoMetric still sees pycocotools.
    assert (mmdet_coco_metric.COCO, mmdet_coco_metric.COCOeval) == saved


def test_auto_prefers_faster_coco_eval_and_falls_back(monkeypatch) -> None:
    assert coco_backend("auto").name == "faster_coco_eval"
    assert FastCocoMetric(backend="auto").backend.name == "faster_coco_eval"
    # The package's ``coco_backend`` attribute is the function; patch the module itself.
    module = importlib.import_module("npudet.evaluation.coco_backend")
    monkeypatch.setattr(module, "faster_coco_eval_available", lambda: False)
    assert coco_backend("auto").name == "pycocotools"
    with pytest.raises(ImportError, match="faster-coco-eval"):
        coco_backend("faster_coco_eval")


def test_bad_backend_arguments() -> None:
    with pytest.raises(ValueError, match="backend"):
        coco_backend("cocoapi")
    with pytest.raises(ValueError, match="use_mp_eval"):
        FastCocoMetric(backend="faster_coco_eval", use_mp_eval=True)
    assert FastCocoMetric(backend="auto", use_mp_eval=True).backend.name == "pycocotools"


def test_small_configs_evaluate_with_the_auto_backend() -> None:
    cfg = Config.fromfile(SMALL_DETR)
    for evaluator in (cfg.val_evaluator, cfg.test_evaluator):
        assert evaluator.type == "FastCocoMetric" and evaluator.backend == "auto"
    assert cfg.custom_imports.imports == ["npudet.plugin"]
