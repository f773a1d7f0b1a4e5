"""Every config under ``configs/`` builds and trains one step; the COCO ones are mmdet's.

For each config (found by glob, so a new one is covered; ``_base_`` skipped):

- one with a counterpart of the same path among mmdet's own configs (every ``*_coco.py``
  or ``*_coco-panoptic.py`` must have one) resolves to mmdet's config at every key but those
  of :data:`NPUDET_CHANGES`, and differs at each of :data:`EVERY_CONFIG_CHANGES`. A config
  that changes anything else of mmdet's fails: ``model.backbone.init_cfg=None`` (ResNet-50
  silently trained from scratch) shows up as a difference at ``model.backbone.init_cfg``; an
  entry of the list no config differs at fails too.
- its model builds with the pretrained weights dropped (``plugin_util.drop_pretrained``; any
  remote checkpoint load fails the test instead of downloading; Grounding DINO's BERT is a
  local one the test writes), and one training step on generated data (boxes; masks for
  Mask2Former, + semantic maps for panoptic; the class names as the prompt for Grounding
  DINO; a semantic map for mmseg's segmentor, converted as ``MSDASwitchHook`` does) gives
  finite losses and a nonzero gradient at the ``sampling_offsets`` of every MSDA layer (a
  layer cut off from the loss fails; a model without one fails).
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
    "optim_wrapper.constructor": "MergedGroupsOptimWrapperConstructor: mmdet's param groups "
    "and training, the optimizer's ops once per setting, not per parameter",
    "val_evaluator.type": "FastCocoMetric: faster-coco-eval if installed, the same 12 numbers",
    "val_evaluator.backend": "FastCocoMetric's backend choice",
    "test_evaluator.type": "as val_evaluator",
    "test_evaluator.backend": "as val_evaluator",
    "vis_backends": "+ TensorboardVisBackend: scalars next to the JSON log, as npudet's others",
    "visualizer.vis_backends": "as vis_backends",
}
# ... of which every config has these (Mask2Former panoptic keeps mmdet's evaluator list:
# CocoPanopticMetric + CocoMetric)
EVERY_CONFIG_CHANGES = set(NPUDET_CHANGES) - {
    "val_evaluator.type",
    "val_evaluator.backend",
    "test_evaluator.type",
    "test_evaluator.backend",
}

# Generated COCO-style input: 192x256 gives the 4-level memory 1020 tokens (24x32 + 12x16 +
# 6x8 + 3x4), enough for DINO's 900 two-stage proposals (torch.topk over the memory), while
# the R50 stays quick on 2 cores.
IMAGE_SHAPE = (3, 192, 256)

# What a step here changes of a config beyond the pretrained weights, to keep it short or to
# run without optional packages (model type: {dotted key: value}):
STEP_OVERRIDES = {
    # 100 of DDQ's 900 queries: it ranks num_queries * (1 + dense_topk_ratio) proposals from the
    # memory (IMAGE_SHAPE has 1020 tokens), and with 900 (2250 dense queries, at 320x480) the
    # step took several minutes on 2 loaded cores
    "DDQDETR": {"num_queries": 100},
    # mmdet's large-scale-jitter pad of every batch to 1024x1024 is a data step, not the
    # model's; 12544 points per mask are for 1024x1024 images
    "Mask2Former": {"data_preprocessor.batch_augments": None, "train_cfg.num_points": 3136},
    # activation checkpointing of the encoder layers (num_cp=6) needs fairscale, which npudet
    # does not install; the layers are the same without it
    "GroundingDINO": {"encoder.num_cp": 0},
}


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


def mmdet_differences(path: str) -> Set[str]:
    """The dotted keys at which the config at ``path`` differs from mmdet's counterpart."""
    mmdet_path = mmdet_config_path(path)
    assert os.path.exists(mmdet_path), f"no mmdet config at {mmdet_path}"
    return config_differences(Config.fromfile(path), Config.fromfile(mmdet_path))


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_config_keeps_the_rng_states(path: str) -> None:
    """Every shipped config (the COCO ones through configs/_base_/npudet_coco.py) builds
    ``RNGStateHook`` from its ``custom_hooks`` as the runner does: a resumed run draws what
    the uninterrupted one would."""
    from mmengine.registry import HOOKS, DefaultScope
    from mmengine.utils import import_modules_from_strings

    cfg = Config.fromfile(path)
    import_modules_from_strings(**cfg.custom_imports)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):  # the runner's scope
        hooks = [HOOKS.build(dict(hook)) for hook in cfg.get("custom_hooks", [])]
    assert "RNGStateHook" in [type(hook).__name__ for hook in hooks]


@pytest.mark.parametrize("path", MMDET_DERIVED, ids=os.path.basename)
def test_coco_config_is_mmdets(path: str) -> None:
    differences = mmdet_differences(path)
    undocumented = sorted(k for k in differences if not covering_entry(k))
    assert not undocumented, f"differs from mmdet's config at undocumented keys: {undocumented}"
    missing = sorted(EVERY_CONFIG_CHANGES - {covering_entry(k) for k in differences})
    assert not missing, f"the config is mmdet's at keys every config changes: {missing}"


def test_no_stale_change_entry() -> None:
    used = {covering_entry(k) for path in MMDET_DERIVED for k in mmdet_differences(path)}
    stale = sorted(set(NPUDET_CHANGES) - used)
    assert not stale, f"NPUDET_CHANGES lists keys at which every config is mmdet's: {stale}"


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A local BERT for Grounding DINO's text encoder (the configs keep mmdet's hub name)."""
    os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported
    from msda_models_util import write_tiny_bert

    return write_tiny_bert(str(tmp_path_factory.mktemp("bert")), ["person", "car"])


def generated_batch(cfg: Config) -> Dict:
    """One image of :data:`IMAGE_SHAPE` with what the model's loss reads: boxes; masks for
    Mask2Former, + semantic maps when panoptic; the prompt for Grounding DINO."""
    from mmdet.testing import demo_mm_inputs

    model = cfg.model
    if model.type == "EncoderDecoder":  # mmseg's: an image and its semantic map
        from mmengine.structures import PixelData
        from mmseg.structures import SegDataSample

        torch.manual_seed(0)
        shape = IMAGE_SHAPE[1:]
        sample = SegDataSample(metainfo=dict(img_shape=shape, ori_shape=shape))
        num_classes = model.decode_head.num_classes
        sample.gt_sem_seg = PixelData(data=torch.randint(0, num_classes, (1, *shape)))
        image = torch.randint(0, 256, IMAGE_SHAPE, dtype=torch.uint8)
        return dict(inputs=[image], data_samples=[sample])
    if model.type == "Mask2Former":
        head = model.panoptic_head
        num_classes = head.num_things_classes + head.num_stuff_classes
        extra = dict(
            with_mask=True, with_semantic=head.num_stuff_classes > 0, sem_seg_output_strides=1
        )
    else:
        num_classes, extra = model.bbox_head.num_classes, {}
    torch.manual_seed(0)
    batch = demo_mm_inputs(
        batch_size=1,
        image_shapes=[IMAGE_SHAPE],
        num_items=[2],
        num_classes=num_classes,
        **extra,
    )
    if model.type == "GroundingDINO":
        for sample in batch["data_samples"]:
            sample.set_metainfo(dict(text=("person", "car"), custom_entities=True))
            sample.gt_instances.labels %= 2
    return batch


@pytest.mark.parametrize("path", CONFIGS, ids=os.path.basename)
def test_config_trains_one_step(path: str, request: pytest.FixtureRequest) -> None:
    from mmengine.optim import build_optim_wrapper
    from mmengine.utils import import_modules_from_strings

    cfg = Config.fromfile(path)
    import_modules_from_strings(**cfg.custom_imports)  # as the runner does
    drop_pretrained(cfg)
    # grid_sample: the reference implementation, nothing to compile; `auto` and the others
    # are tested on their own (test_msda_switch.py, test_msda_parity.py, test_msda_models.py)
    segmentor = cfg.model.type == "EncoderDecoder"  # mmseg's: switched by MSDASwitchHook
    if not segmentor:
        cfg.model.msda = dict(impl="grid_sample")
    if cfg.model.type == "GroundingDINO":
        cfg.model.language_model.name = request.getfixturevalue("tiny_bert")
    cfg.merge_from_dict(
        {f"model.{k}": v for k, v in STEP_OVERRIDES.get(cfg.model.type, {}).items()}
    )
    model = build_model(cfg)
    if segmentor:
        from npudet.models import apply_msda_cfg

        apply_msda_cfg(model, dict(impl="grid_sample"))  # the hook's conversion
    # built before the forward, as the runner does (DDQ-DETR's first forward ties its aux
    # branches into the decoder: mmengine's constructor would then see those parameters twice)
    wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    if cfg.model.type == "BEVFormer":
        from bev_util import random_batch

        # 32x48 images, two frames: the previous one feeds temporal self-attention
        batch = random_batch(b=1, t=2, n=cfg.model.encoder.num_cams)
    else:
        batch = generated_batch(cfg)
    losses, grads = loss_and_grads(model, batch)
    assert losses and all(torch.isfinite(v).all() for v in losses.values()), losses

    from npudet.models.layers import deformable_layers

    layers = [name for name, _ in deformable_layers(model)]
    assert layers, "no MSDA layer in the model"
    # the weight starts at zero (mmcv's init), so a gradient is the only way it moves
    zero = torch.zeros(())
    cut_off = [n for n in layers if not grads.get(f"{n}.sampling_offsets.weight", zero).any()]
    assert not cut_off, f"no gradient at sampling_offsets of {cut_off}"

    # the config's optim wrapper steps those gradients: in the COCO configs
    # MergedGroupsOptimWrapperConstructor's merged step over the model's real param groups
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    wrapper.step()
    assert any(not torch.equal(p, before[n]) for n, p in model.named_parameters() if n in before)
