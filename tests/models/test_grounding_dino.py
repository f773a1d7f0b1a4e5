"""Grounding DINO on npudet's layers, its text encoder built locally.

mmdet's R50 config shrunk (ResNet-18, 1 encoder and 2 decoder layers, 20 queries), with its
BERT path (``language_model.name``) pointed at a 2-layer BERT and a vocabulary the test
writes: ``HF_HUB_OFFLINE=1``, nothing downloaded. ``loss`` and ``predict`` (mmdet's
Grounding DINO has no ``tensor`` mode: its transformer needs the text features, which only
``loss`` / ``predict`` compute; mmdet's own tests run ``predict``) on a batch of two images
prompted with the class names, per implementation, every MSDA layer
(the image encoder's self-attention, the decoder's image cross-attention) counted on
npudet's op and none on mmcv's; one step of ``cpu`` against ``grid_sample``.
"""

from __future__ import annotations

import os

# before transformers (imported by mmdet's BertModel) reads it
os.environ["HF_HUB_OFFLINE"] = "1"

import pytest  # noqa: E402
import torch  # noqa: E402
from mmdet.structures import DetDataSample  # noqa: E402
from mmdet.testing import demo_mm_inputs  # noqa: E402
from mmengine.config import ConfigDict  # noqa: E402
from msda_models_util import (  # noqa: E402
    IMPLS,
    assert_same_step,
    build,
    layer_impls,
    running_on,
    tiny_dino_cfg,
    write_tiny_bert,
)

from npudet.models.detectors.msda_config import msda_parts_of  # noqa: E402
from npudet.ops import msda_impls  # noqa: E402

pytestmark = pytest.mark.skipif("cpu" not in msda_impls(), reason="cpu kernel did not build")

CONFIG = "grounding_dino/grounding_dino_r50_scratch_8xb2_1x_coco.py"
CLASSES = ("circle", "square", "triangle")
SHAPES = ((3, 96, 128), (3, 80, 112))


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> str:
    return write_tiny_bert(str(tmp_path_factory.mktemp("bert")), CLASSES)


def tiny_model_cfg(bert: str, impl: str) -> ConfigDict:
    cfg = tiny_dino_cfg(CONFIG, len(CLASSES), impl=impl)
    cfg.language_model.name = bert
    cfg.encoder.num_cp = 0
    cfg.encoder.text_layer_cfg.ffn_cfg.feedforward_channels = 256
    cfg.encoder.fusion_layer_cfg.embed_dim = 256
    return cfg


def batch() -> dict:
    """Two images prompted with the class names (mmdet's custom-entities mode)."""
    torch.manual_seed(0)
    packed = demo_mm_inputs(
        batch_size=2, image_shapes=list(SHAPES), num_items=[2, 3], num_classes=len(CLASSES)
    )
    for sample in packed["data_samples"]:
        sample.set_metainfo(dict(text=CLASSES, custom_entities=True))
    return packed


@pytest.mark.parametrize("impl", IMPLS)
def test_loss_predict_on_npudet_layers(bert: str, impl: str) -> None:
    model = build(tiny_model_cfg(bert, impl))
    assert set(layer_impls(model)) == {"encoder.layers.0.self_attn"} | {
        f"decoder.layers.{i}.cross_attn" for i in range(2)
    }
    assert model.msda_impls == {"encoder": impl, "decoder": impl}
    assert msda_parts_of(model) == type(model).msda_parts  # what the preflight reads
    with running_on(model, impl) as record:
        data = model.data_preprocessor(batch(), True)
        losses = model(**data, mode="loss")
        assert losses and all(torch.isfinite(v).all() for v in losses.values()), losses
        model.eval()
        with torch.no_grad():
            data = model.data_preprocessor(batch(), False)
            results = model(**data, mode="predict")
    assert len(results) == 2 and isinstance(results[0], DetDataSample)
    assert set(results[0].pred_instances.labels.tolist()) <= set(range(len(CLASSES)))
    assert all(n == 2 for n in record.layers.values())


def test_cpu_and_grid_sample_same_step(bert: str) -> None:
    assert_same_step(lambda impl: tiny_model_cfg(bert, impl), batch)
