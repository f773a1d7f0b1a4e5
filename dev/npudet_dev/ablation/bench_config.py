"""The configs of the iteration benchmark: npudet's as shipped, and ``stock`` (mmdet's own).

``stock`` is mmdet + mmcv with no npudet layer: mmdet's config of the same name when mmdet
ships one (``mmdet/.mim/configs``; tests/models/test_shipped_configs.py holds npudet's COCO configs
to it), otherwise the config with npudet's keys taken out (``custom_imports``, ``model.msda``,
``custom_hooks``), loaded without importing the plugin.
"""

from __future__ import annotations

import os
from typing import Optional

from mmengine.config import Config

from npudet.ablation.worker import short_training
from npudet.utils.pretrained import drop_pretrained


def mmdet_counterpart(path: str) -> Optional[str]:
    """mmdet's own config with the same path below ``configs/`` as ``path``, if mmdet has one."""
    import mmdet

    parts = os.path.abspath(path).split(os.sep)
    if "configs" not in parts:
        return None
    below = parts[len(parts) - parts[::-1].index("configs") :]
    candidate = os.path.join(os.path.dirname(mmdet.__file__), ".mim", "configs", *below)
    return candidate if os.path.isfile(candidate) else None


def load_config(path: str, stock: bool) -> Config:
    """``path`` as npudet ships it, or its stock counterpart (see the module docstring)."""
    if not stock:
        return Config.fromfile(path)  # imports custom_imports: the plugin
    counterpart = mmdet_counterpart(path)
    if counterpart is not None:
        return Config.fromfile(counterpart)
    cfg = Config.fromfile(path, import_custom_modules=False)
    cfg.pop("custom_imports", None)
    cfg.model.pop("msda", None)
    cfg.custom_hooks = []
    return cfg


def prepare_for_bench(cfg: Config, work_dir: str, iters: int, seed: int) -> None:
    """:func:`short_training`, plus pretrained weights off (the benchmark loads its own
    initial weights) and no visualizer backend but the local one."""
    drop_pretrained(cfg)
    short_training(cfg, work_dir, iters, seed)
    cfg.load_from = None
    cfg.visualizer = dict(
        type=cfg.visualizer.type, vis_backends=[dict(type="LocalVisBackend")], name="visualizer"
    )
