"""DDQ-DETR on npudet's layers: what mmdet 3.3.0's ``test_ddq_detr.py`` checks, per impl.

mmdet's 4-scale R50 config shrunk (ResNet-18, 1 encoder and 2 decoder layers — DDQ needs 2
— 20 queries, small images): with no ground truth the classification losses are positive
and the box, IoU, denoising and auxiliary ones zero; with ground truth every loss is
positive; ``tensor`` and ``predict`` run; a batch of two differently sized images; every
MSDA layer counted on npudet's op, none on mmcv's. And one step of ``cpu`` against
``grid_sample``.
"""

from __future__ import annotations

import pytest
import torch
from mmdet.structures import DetDataSample
from mmdet.testing import demo_mm_inputs
from mmengine.config import ConfigDict
from msda_models_util import IMPLS, assert_same_step, build, layer_impls, running_on, tiny_dino_cfg

from npudet.models.detectors.msda_config import msda_parts_of
from npudet.ops import msda_impls

pytestmark = pytest.mark.skipif("cpu" not in msda_impls(), reason="cpu kernel did not build")

CONFIG = "ddq/ddq-detr-4scale_r50_8xb2-12e_coco.py"
SHAPES = ((3, 96, 128), (3, 80, 112))


def tiny_model_cfg(impl: str, **parts: str) -> ConfigDict:
    return tiny_dino_cfg(CONFIG, 3, impl=impl, **parts)


def batch(num_items=(2, 3)) -> dict:
    torch.manual_seed(0)
    return demo_mm_inputs(
        batch_size=len(num_items),
        image_shapes=list(SHAPES[: len(num_items)]),
        num_items=list(num_items),
        num_classes=3,
    )


def scalars(losses: dict) -> dict:
    """{key: float}; DDQ's auxiliary losses are lists of per-layer terms (summed)."""
    return {k: float(sum(v) if isinstance(v, list) else v.detach()) for k, v in losses.items()}


@pytest.mark.parametrize("impl", IMPLS)
def test_loss_predict_tensor_on_npudet_layers(impl: str) -> None:
    model = build(tiny_model_cfg(impl))
    names = set(layer_impls(model))
    assert names == {"encoder.layers.0.self_attn"} | {
        f"decoder.layers.{i}.cross_attn" for i in range(2)
    }
    with running_on(model, impl) as record:
        data = model.data_preprocessor(batch((0,)), True)
        empty = scalars(model(**data, mode="loss"))
        for key, loss in empty.items():
            if any(word in key for word in ("bbox", "iou", "dn", "aux")):
                assert loss == 0, f"{key} with no ground truth: {loss}"
            elif "cls" in key:
                assert loss > 0, f"{key} with no ground truth: {loss}"
        data = model.data_preprocessor(batch(), True)
        losses = scalars(model(**data, mode="loss"))
        assert all(loss > 0 for loss in losses.values()), losses
        model.eval()
        with torch.no_grad():
            data = model.data_preprocessor(batch(), False)
            out = model(**data, mode="tensor")
            assert isinstance(out, tuple)
            results = model(**data, mode="predict")
    assert len(results) == 2 and isinstance(results[0], DetDataSample)
    assert results[0].pred_instances.bboxes.shape[-1] == 4
    assert all(n == 4 for n in record.layers.values())  # once per forward


def test_per_part_override() -> None:
    model = build(tiny_model_cfg("grid_sample", decoder="cpu"))
    impls = layer_impls(model)
    assert impls["encoder.layers.0.self_attn"] == "grid_sample"
    assert {impls[f"decoder.layers.{i}.cross_attn"] for i in range(2)} == {"cpu"}
    assert msda_parts_of(model) == type(model).msda_parts  # what the preflight reads


def test_cpu_and_grid_sample_same_step() -> None:
    assert_same_step(tiny_model_cfg, batch)
