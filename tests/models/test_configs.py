"""Every npudet config parses; the full-size ones build stock models on npudet's MSDA."""

from __future__ import annotations

import glob
import os

import pytest
from mmcv.ops import MultiScaleDeformableAttention as MMCVMSDA
from mmengine.config import Config
from plugin_util import ROOT, build_model, drop_pretrained

from npudet.models import MSDA_MODELS, MultiScaleDeformableAttention

CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "[!_]*", "*.py")))


@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.basename(p) for p in CONFIGS])
def test_config_parses_with_msda_key(path: str) -> None:
    cfg = Config.fromfile(path)
    if cfg.model.type == "EncoderDecoder":  # mmseg's segmentor: the hook switches it
        assert cfg.custom_hooks[0] == dict(type="MSDASwitchHook", impl="auto")
    else:
        assert cfg.model.type in ("DeformableDETR", "DINO", "BEVFormer", *MSDA_MODELS)
        assert cfg.model.msda.impl == "auto"
    assert cfg.custom_imports.imports == ["npudet.plugin"]
    # the R50 configs start from ImageNet weights as mmdet's and BEVFormer-tiny's do (the
    # tests drop them: plugin_util.drop_pretrained); the small ones train from scratch
    pretrained = dict(type="Pretrained", checkpoint="torchvision://resnet50")
    expected = pretrained if "_r50_" in os.path.basename(path) else None
    assert cfg.model.backbone.init_cfg == expected


def test_full_size_dino_builds_on_npudet_msda() -> None:
    cfg = Config.fromfile(os.path.join(ROOT, "configs/dino/dino-4scale_r50_8xb2-12e_coco.py"))
    cfg.model.msda.decoder = "grid_sample"
    assert drop_pretrained(cfg) == ["model.backbone.init_cfg"]  # no download
    model = build_model(cfg)
    layers = [m for m in model.modules() if isinstance(m, MMCVMSDA)]
    assert len(layers) == 12 and all(isinstance(m, MultiScaleDeformableAttention) for m in layers)
    assert {m.impl for m in model.decoder.modules() if isinstance(m, MMCVMSDA)} == {"grid_sample"}
    assert model.num_queries == 900
