"""The iteration benchmark's generated data and time split for instance segmentation
(Mask2Former): the COCO set carries each object's visible mask, the pipeline loads masks
where the config's own does, and the time split hooks a detector without a neck."""

from __future__ import annotations

import json
import os
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from mmengine.config import Config
from mmengine.optim import OptimWrapper
from plugin_util import ROOT, SMALL_DETR, build_model
from pycocotools import mask as mask_utils

from npudet_dev.ablation.bench_data import use_coco_images, write_coco_images
from npudet_dev.ablation.time_split import TimeSplitHook

# Tests of the project's own machinery (dev/).
pytestmark = pytest.mark.dev

M2F = os.path.join(ROOT, "configs", "mask2former", "mask2former_r50_8xb2-lsj-50e_coco.py")
SMALL_M2F = os.path.join(ROOT, "configs", "small", "mask2former_r18-tiny_shapes.py")


def test_generated_set_has_masks_inside_their_boxes(tmp_path) -> None:
    """Stretched to 96x64, every object's mask is non-empty and lies in its box (1 px of
    rounding), and covers most of a rectangle's box."""
    path = write_coco_images(str(tmp_path), 96, 64, 3, ["a", "b", "c"], seed=1)
    with open(path) as f:
        coco = json.load(f)
    assert coco["annotations"]
    for ann in coco["annotations"]:
        mask = mask_utils.decode(ann["segmentation"])
        assert mask.shape == (64, 96) and mask.sum() > 0
        ys, xs = np.nonzero(mask)
        x, y, w, h = ann["bbox"]
        assert xs.min() >= x - 1 and xs.max() <= x + w + 1
        assert ys.min() >= y - 1 and ys.max() <= y + h + 1


def test_pipeline_loads_masks_where_the_config_does(tmp_path) -> None:
    """Mask2Former's config loads masks, so the benchmark's pipeline does and a sample
    carries them at the generated size; Deformable DETR's loads boxes only."""
    from mmdet.registry import DATASETS
    from mmengine.registry import init_default_scope

    write_coco_images(str(tmp_path), 96, 64, 2, ["person", "bicycle", "car"])
    m2f = Config.fromfile(M2F)
    use_coco_images(m2f, str(tmp_path), 96, 64)
    (load,) = [s for s in m2f.train_dataloader.dataset.pipeline if s.type == "LoadAnnotations"]
    assert load.with_mask
    detr = Config.fromfile(SMALL_DETR)
    use_coco_images(detr, str(tmp_path), 96, 64)
    (load,) = [s for s in detr.train_dataloader.dataset.pipeline if s.type == "LoadAnnotations"]
    assert not load.with_mask
    init_default_scope("mmdet")
    sample = DATASETS.build(m2f.train_dataloader.dataset)[0]["data_samples"]
    assert sample.gt_instances.masks.masks.shape[1:] == (64, 96)
    assert len(sample.gt_instances.masks) == len(sample.gt_instances.bboxes) > 0


def test_time_split_hooks_a_detector_without_a_neck() -> None:
    """Mask2Former has no neck (its pixel decoder, the MSDA encoder, is in the head): the
    image-feature span is the backbone's and the loss span the panoptic head's."""
    model = build_model(Config.fromfile(SMALL_M2F))
    assert not hasattr(model, "neck") and hasattr(model, "panoptic_head")
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.0))
    hook = TimeSplitHook()
    hook.before_train(SimpleNamespace(model=model, optim_wrapper=wrapper))
    assert model.backbone._forward_hooks and model.backbone._forward_pre_hooks
    assert "loss_by_feat" in vars(model.panoptic_head)  # timed on the instance
