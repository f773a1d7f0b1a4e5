"""Every npudet config parses; the full-size ones build stock models on npudet's MSDA."""

from __future__ import annotations

import glob
import os

import pytest
from mmcv.ops import MultiScaleDeformableAttention as MMCVMSDA
from mmengine.config import Config
from plugin_util import ROOT, build_model

from npudet.models import MultiScaleDeformableAttention

CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "[!_]*", "*.py")))


@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.basename(p) for p in CONFIGS])
def test_config_parses_with_msda_key(path: str) -> None:
    cfg = Config.fromfile(path)
    assert cfg.model.type in ("DeformableDETR", "DINO", "BEVFormer")
    assert cfg.model.msda.impl == "auto"
    assert cfg.custom_imports.imports == ["npudet.plugin"]
    assert cfg.model.backbone.init_cfg is None  # nothing is downloaded


def test_full_size_dino_builds_on_npudet_msda() -> None:
    cfg = Config.fromfile(os.path.join(ROOT, "configs/dino/dino-4scale_r50_8xb2-12e_coco.py"))
    cfg.model.msda.decoder = "grid_sample"
    model = build_model(cfg)
    layers = [m for m in model.modules() if isinstance(m, MMCVMSDA)]
    assert len(layers) == 12 and all(type(m) is MultiScaleDeformableAttention for m in layers)
    assert {m.impl for m in model.decoder.modules() if isinstance(m, MMCVMSDA)} == {"grid_sample"}
    assert model.num_queries == 900
