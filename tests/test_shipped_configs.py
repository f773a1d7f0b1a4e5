"""Every config under ``configs/`` builds and trains one step; the COCO ones are mmdet's.

For each config (found by glob, so a new one is covered; ``_base_`` skipped):

- one with a counterpart of the same path among mmdet's own configs (every ``*_coco.py``
  must have one) resolves to mmdet's config at every key but those of
  :data:`NPUDET_CHANGES`, and differs at each of those. A config that changes anything else
  of mmdet's fails: ``model.backbone.init_cfg=None`` (ResNet-50 silently trained from
  scratch) shows up as a difference at ``model.backbone.init_cfg``; a stale entry of the list
  fails too.
- its model builds with the pretrained weights dropped (``plugin_util.drop_pretrained``; any
  remote checkpoint load fails the test instead of downloading), and one training step on
  generated data gives finite losses and a nonzero gradient at the ``sampling_offsets`` of
  every MSDA layer (a layer cut off from the loss fails; a model without one fails).
"""

from __future__ import annotations

import glob
import os
from typing import Any, Dict, Set

import pytest
import torch
from mmengine.config import Config
from plugin_util import ROOT, build_model, drop_pretrained, loss_and_grads

CONFIGS = sorted(
    p
    for p in glob.glob(os.path.join(ROOT, "configs", "**", "*.py"), recursive=True)
    if "_base_" not in p.split(os.sep)
)

# The keys at which npudet's COCO configs differ from mmdet's config of the same name: why.
# Not here: the model's `type` (npudet re-registers mmdet's DeformableDETR and DINO names),
# the COCO data paths (mmdet's data/coco/), the backbone's init_cfg (mmdet's pretrained one).
NPUDET_CHANGES = {
    "custom_imports": "the plugin: registers npudet's models, hooks and metrics",
    "custom_hooks": "EvalProgressHook, CocoSummaryHook: a progress bar, the COCO table + JSON",
    "model.msda": "the MSDA switch, npudet's point (docs/user-guide/configs.md)",
    "val_evaluator.type": "FastCocoMetric: faster-coco-eval if installed, the same 12 numbers",
    "val_evaluator.backend": "FastCocoMetric's backend choice",
    "test_evaluator.type": "as val_evaluator",
    "test_evaluator.backend": "as val_evaluator",
    "vis_backends": "+ TensorboardVisBackend: scalars next to the JSON log, as npudet's others",
    "visualizer.vis_backends": "as vis_backends",
}

# Generated COCO-style input: 192x256 gives the 4-level memory 1020 tokens (24x32 + 12x16 +
# 6x8 + 3x4), enough for DINO's 900 two-stage proposals (torch.topk over the memory), while
# the R50 stays quick on 2 cores.
IMAGE_SHAPE = (3, 192, 256)


def mmdet_config_path(path: str) -> str:
    """mmdet's own config (shipped in its package, ``.mim/configs``) at ``path``'s place."""
    import mmdet

    rel = os.path.relpath(path, os.path.join(ROOT, "configs"))
    return os.path.join(os.path.dirname(mmdet.__file__), ".mim", "configs", rel)


def flatten(node: Any, prefix: str = "") -> Dict[str, Any]:
    """{dotted key: value} over nested dicts; lists and other values are leaves."""
    if not isinstance(node, dict) or not node:
        return {prefix: node}
    out = {}
    for key, value in node.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def without_mmdet_scope(node: Any) -> Any:
    """``node`` without the ``_scope_='mmdet'`` markers mmengine writes into every dict that
    comes from an ``mmdet::`` base: they say "mmdet's registry", which mmdet's own config
    gets from its ``default_scope='mmdet'``. Any other scope stays, and would differ."""
    if isinstance(node, dict):
        return {
            k: without_mmdet_scope(v)
            for k, v in node.items()
            if not (k == "_scope_" and v == "mmdet")
        }
    if isinstance(node, (list, tuple)):
        return type(node)(without_mmdet_scope(v) for v in node)
    return node


def config_differences(ours: Config, theirs: Config) -> Set[str]:
    """Dotted keys whose values differ (or that only one config has)."""
    a = flatten(without_mmdet_scope(ours.to_dict()))
    b = flatten(without_mmdet_scope(theirs.to_dict()))
    missing = object()
    return {k for k in a.keys() | b.keys() if a.get(k, missing) != b.get(k, missing)}


def covering_entry(key: str) -> str:
    """The :data:`NPUDET_CHANGES` entry that ``key`` falls under, or ''."""
    for entry in NPUDET_CHANGES:
        if key == entry or key.startswith(entry + "."):
            return entry
    return ""


@pytest.fixture(autouse=True)
def no_downloads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any checkpoint load from a URL-like source (torchvision://, http(s)://, open-mmlab://,
    ...) fails the test: a pretrained init_cfg that drop_pretrained missed would download."""
    from mmengine.runner.checkpoint import CheckpointLoader

    def refuse(filename: str, *args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a test tried to load {filename!r}")

    # '' is the local-file loader: the only one kept
    schemes = {k: (v if k == "" else refuse) for k, v in CheckpointLoader._schemes.items()}
    monkeypatch.setattr(CheckpointLoader, "_schemes", schemes)


def test_configs_found() -> None:
    names = {os.path.relpath(p, os.path.join(ROOT, "configs")) for p in CONFIGS}
    assert "dino/dino-4scale_r50_8xb2-12e_coco.py" in names
    assert "bev/bevformer-tiny_r50_nuscenes.py" in names
    assert not any("_base_" in n for n in names)


# the configs held to mmdet's: those with a counterpart, and every COCO one (a COCO config
# without a counterpart, e.g. misnamed, fails rather than being skipped)
MMDET_DERIVED = [
    p for p in CONFIGS if os.path.exists(mmdet_config_path(p)) or "_coco" in os.path.basename(p)
]


@pytest.mark.parametrize("path", MMDET_DERIVED, ids=os.path.basename)
def test_coco_config_is_mmdets(path: str) -> None:
    mmdet_path = mmdet_config_path(path)
    assert os.path.exists(mmdet_path), f"no mmdet config at {mmdet_path}"
    differences = config_differences(Config.fromfile(path), Config.fromfile(mmdet_path))
    undocumented = sorted(k for k in differences if not covering_entry(k))
    assert not undocumented, f"differs from mmdet's config at undocumented keys: {undocumented}"
    stale = sorted(set(NPUDET_CHANGES) - {covering_entry(k) for k in differences})
    assert not stale, f"NPUDET_CHANGES lists keys at which the config is mmdet's: {stale}"


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_config_trains_one_step(path: str) -> None:
    from mmengine.utils import import_modules_from_strings

    cfg = Config.fromfile(path)
    import_modules_from_strings(**cfg.custom_imports)  # as the runner does
    drop_pretrained(cfg)
    # grid_sample: the reference implementation, nothing to compile; `auto` and the others
    # are tested on their own (test_msda_switch.py, test_msda_parity.py)
    cfg.model.msda = dict(impl="grid_sample", encoder=None, decoder=None)
    model = build_model(cfg)
    if cfg.model.type == "BEVFormer":
        from bev_util import random_batch

        # 32x48 images, two frames: the previous one feeds temporal self-attention
        batch = random_batch(b=1, t=2, n=cfg.model.encoder.num_cams)
    else:
        from mmdet.testing import demo_mm_inputs

        torch.manual_seed(0)
        batch = demo_mm_inputs(
            batch_size=1,
            image_shapes=[IMAGE_SHAPE],
            num_items=[2],
            num_classes=cfg.model.bbox_head.num_classes,
        )
    losses, grads = loss_and_grads(model, batch)
    assert losses and all(torch.isfinite(v).all() for v in losses.values()), losses

    from npudet.models.layers import deformable_layers

    layers = [name for name, _ in deformable_layers(model)]
    assert layers, "no MSDA layer in the model"
    # the weight starts at zero (mmcv's init), so a gradient is the only way it moves
    zero = torch.zeros(())
    cut_off = [n for n in layers if not grads.get(f"{n}.sampling_offsets.weight", zero).any()]
    assert not cut_off, f"no gradient at sampling_offsets of {cut_off}"
