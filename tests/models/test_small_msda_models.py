"""The small DDQ-DETR and Grounding DINO on the built-in shapes set: one training step of each
config with ``cpu`` giving ``grid_sample``'s losses and gradients (default), and each trained
for its own schedule, learning boxes an untrained model does not find (slow).

Grounding DINO is prompted with the class names and its text encoder is a 2-layer, 32-wide BERT
with a vocabulary the test writes (``write_tiny_bert``: nothing downloaded), given as
``model.language_model.name`` in place of the config's ``bert-base-uncased``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from mmengine.config import ConfigDict
from msda_models_util import assert_same_step, write_tiny_bert
from plugin_util import ROOT, fake_batch, small_cfg
from small_train_util import before_and_after

from npudet.ops import msda_impls

pytestmark = pytest.mark.skipif("cpu" not in msda_impls(), reason="cpu kernel did not build")

DDQ = os.path.join(ROOT, "configs", "small", "ddq-detr-4scale_r18-tiny_shapes.py")
GROUNDING_DINO = os.path.join(ROOT, "configs", "small", "grounding-dino_r18-tiny_shapes.py")
CLASSES = ("circle", "square", "triangle")


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_tiny_bert(str(tmp_path_factory.mktemp("bert")), CLASSES)


def prompted_batch() -> dict:
    """The fake batch with the class names as each image's prompt (the config's
    ``return_classes``)."""
    batch = fake_batch(len(CLASSES))
    for sample in batch["data_samples"]:
        sample.set_metainfo(dict(text=CLASSES, custom_entities=True))
    return batch


def step_model_cfg(config: str, impl: str, **model: Any) -> ConfigDict:
    """``config``'s model on ``impl`` with 1 encoder and 2 decoder layers (DDQ's least) for a
    quick step; ``model`` sets more keys."""
    cfg = small_cfg(config, impl=impl).model
    cfg.encoder.num_layers, cfg.decoder.num_layers = 1, 2
    cfg.update(model)
    return cfg


def test_small_ddq_detr_same_step() -> None:
    assert_same_step(lambda impl: step_model_cfg(DDQ, impl), fake_batch)


def test_small_grounding_dino_same_step(bert: str) -> None:
    text_encoder = dict(language_model=dict(name=bert))
    assert_same_step(
        lambda impl: step_model_cfg(GROUNDING_DINO, impl, **text_encoder), prompted_batch
    )


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_small_ddq_detr_learns_boxes(tmp_path) -> None:
    """The untrained model (seed 0) scores bbox mAP 0.000 on the 200 val images; trained for
    the config's 4 epochs with ``cpu`` it scored 0.871 (AP50 0.951; 24 min on 2 cores), so the
    bar of 0.5 leaves room for another CPU's round-off and still needs a model that learned."""
    before, after = before_and_after(DDQ, tmp_path)
    assert after["coco/bbox_mAP"] >= max(0.5, 10 * before["coco/bbox_mAP"]), (before, after)


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_small_grounding_dino_learns_boxes(tmp_path, bert: str) -> None:
    """Untrained (seed 0): bbox mAP 0.000; trained for the config's 4 epochs with ``cpu``,
    prompted with the class names: 0.713 (AP50 0.780; 26 min on 2 cores); bar 0.4."""
    options = [f"model.language_model.name={bert}"]
    before, after = before_and_after(GROUNDING_DINO, tmp_path, options)
    assert after["coco/bbox_mAP"] >= max(0.4, 10 * before["coco/bbox_mAP"]), (before, after)


def test_a_module_registered_twice_is_no_unexpected_checkpoint_entry() -> None:
    """DDQ-DETR's decoder takes its head's auxiliary branches in training, so its checkpoints
    hold them twice; ``tools/test.py``'s check still refuses a foreign entry."""
    from npudet.engine.preflight import compare_state_dicts

    weight = torch.rand(4, 2)
    model = {"bbox_head.aux_reg_branches.0.weight": weight}
    ckpt = {
        "bbox_head.aux_reg_branches.0.weight": weight.clone(),
        "decoder.aux_reg_branches.0.weight": weight.clone(),
        "foreign.weight": torch.rand(4, 2),
    }
    assert compare_state_dicts(model, ckpt) == ([], ["foreign.weight"], [])
