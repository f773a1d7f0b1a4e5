"""MMSegmentation's Mask2Former (semantic segmentation, mmseg's ``EncoderDecoder`` around
mmdet's ``MSDeformAttnPixelDecoder``) on npudet's op through ``MSDASwitchHook``.

mmseg's own configs, read from its package (``.mim/configs``), with only ``custom_imports`` and
the hook added (and the backbone's ``init_cfg`` off: no download); mmseg's own head test
(``test_mask2former_head.py``: loss and predict on a 32x32 batch) on mmseg's config's head for
each implementation, its losses equal to stock mmcv's."""

from __future__ import annotations

import copy
import os
from typing import Optional

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import init_default_scope
from mmengine.runner import Runner
from mmengine.structures import PixelData
from msda_models_util import IMPLS, layer_impls, running_on, tiny_mask2former_head
from plugin_util import ROOT

from npudet.models import MSDASwitchHook, convert_msda
from npudet.models.layers import stock_msda_layers
from npudet.ops import msda_impls

pytestmark = pytest.mark.skipif("cpu" not in msda_impls(), reason="cpu kernel did not build")

ADE20K = "mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py"
CITYSCAPES = "mask2former/mask2former_r50_8xb2-90k_cityscapes-512x1024.py"
ENCODER = "decode_head.pixel_decoder.encoder.layers"
BASE, CLASSES = 32, 19  # the head test's width (npudet's Mask2Former tests), mmseg's classes
CHANNELS = tuple(BASE * 2**i for i in range(4))


def mmseg_config(rel: str, **hook: str) -> Config:
    """mmseg's own config at ``rel`` with npudet's plugin and ``MSDASwitchHook(**hook)`` added,
    the backbone's pretrained weights off."""
    import mmseg

    root = os.path.join(os.path.dirname(mmseg.__file__), ".mim", "configs")
    cfg = Config.fromfile(os.path.join(root, rel))
    cfg.custom_imports = dict(imports=["npudet.plugin"], allow_failed_imports=False)
    cfg.custom_hooks = [*cfg.get("custom_hooks", []), dict(type="MSDASwitchHook", **hook)]
    cfg.model.backbone.init_cfg = None
    return cfg


def seg_batch(size: int, num_classes: int, count: int = 1) -> dict:
    """``count`` random images with semantic maps, as mmseg's data loader gives them."""
    from mmseg.structures import SegDataSample

    torch.manual_seed(0)
    samples = []
    for _ in range(count):
        sample = SegDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size)))
        sample.gt_sem_seg = PixelData(data=torch.randint(0, num_classes, (1, size, size)))
        samples.append(sample)
    images = [torch.randint(0, 256, (3, size, size), dtype=torch.uint8) for _ in range(count)]
    return dict(inputs=images, data_samples=samples)


def run_hook(rel: str, tmp_path, **hook: str) -> Runner:
    """The runner of mmseg's config ``rel`` (+ the hook), its hooks' ``before_run`` called
    (what ``train`` / ``val`` / ``test`` call first)."""
    cfg = mmseg_config(rel, **hook)
    cfg.work_dir = str(tmp_path)
    runner = Runner.from_cfg(cfg)
    assert len(stock_msda_layers(runner.model)) == 6
    runner.call_hook("before_run")
    return runner


@pytest.mark.parametrize("rel", [ADE20K, CITYSCAPES], ids=["ade20k", "cityscapes"])
def test_config_builds_every_msda_layer_on_npudet(rel: str, tmp_path) -> None:
    runner = run_hook(rel, tmp_path, impl="gather", encoder="cpu")
    assert stock_msda_layers(runner.model) == []
    assert layer_impls(runner.model) == {f"{ENCODER}.{i}.self_attn": "cpu" for i in range(6)}
    refusal = r"^MSDASwitchHook\.decoder: EncoderDecoder has no .*its MSDA parts: encoder "
    with pytest.raises(ValueError, match=refusal + r"\(decode_head\.pixel_decoder\.encoder\)$"):
        MSDASwitchHook(decoder="cpu").before_run(runner)


@pytest.mark.slow
def test_config_trains_a_step_on_npudet(tmp_path) -> None:
    """mmseg's ADE20K config, unchanged but for the plugin, the hook and a 64x64 input (not
    the 512x512 crop), takes one training step with every MSDA call on npudet's op (8 s)."""
    runner = run_hook(ADE20K, tmp_path, impl="cpu")
    runner.model.data_preprocessor.size = (64, 64)
    optim = runner.build_optim_wrapper(runner.cfg.optim_wrapper)
    batch = seg_batch(64, runner.cfg.model.decode_head.num_classes)
    with running_on(runner.model, "cpu"):
        logs = runner.model.train_step(batch, optim)
    assert torch.isfinite(logs["loss"]), logs


def mmseg_head(impl: Optional[str]) -> torch.nn.Module:
    """mmseg's ``Mask2FormerHead`` of its ADE20K config at the sizes of mmseg's head test
    (19 classes), shrunk as npudet's Mask2Former tests shrink mmdet's (32 channels, 2
    pixel-decoder and 2 decoder layers, 10 queries, 256 points), converted with
    ``convert_msda`` (None: stock mmcv)."""
    from mmseg.registry import MODELS

    init_default_scope("mmseg")
    head = copy.deepcopy(mmseg_config(ADE20K).model.decode_head)
    tiny_mask2former_head(head, num_classes=CLASSES, base=BASE)
    head.train_cfg.num_points = 256
    torch.manual_seed(0)
    module = MODELS.build(head)
    module.init_weights()
    if impl is not None:
        assert convert_msda(module, impl) == 2
    return module


@pytest.mark.parametrize("impl", IMPLS)
def test_mmseg_head_test_on_npudet(impl: str) -> None:
    """mmseg's ``test_mask2former_head``: loss and predict on backbone features (8x8 to 1x1)
    of a 32x32 batch of two; the losses equal stock mmcv's within 1e-4."""
    torch.manual_seed(1)
    inputs = [torch.rand(2, c, 8 >> i, 8 >> i) for i, c in enumerate(CHANNELS)]
    samples = seg_batch(32, CLASSES, count=2)["data_samples"]
    stock_head, head = mmseg_head(None), mmseg_head(impl)
    torch.manual_seed(2)  # the same points sampled for the mask losses
    stock = stock_head.loss(inputs, samples, None)
    with running_on(head, impl):
        torch.manual_seed(2)
        losses = head.loss(inputs, samples, None)
        with torch.no_grad():
            logits = head.predict(inputs, [s.metainfo for s in samples], None)
    assert logits.shape == (2, CLASSES, 32, 32)
    assert set(losses) == set(stock) and len(losses) == 3 * 3  # 3 losses x (2 layers + 1)
    for name, value in stock.items():
        torch.testing.assert_close(losses[name], value, atol=1e-4, rtol=1e-4, msg=name)


SMALL = os.path.join(ROOT, "configs", "small", "mask2former_r18-tiny_shapes-semantic.py")
# mIoU (%): the recipe reached 40.06 (background 97.8, circle 29.5, square 22.7, triangle
# 10.3) from an untrained 1.82 (docs/user-guide/configs.md); 20 leaves room for noise
BAR = 20.0


def small_runner(work: str, data_root: str, **cfg_options) -> Runner:
    """The runner of the small semantic config on the shapes set at ``data_root``."""
    cfg = Config.fromfile(SMALL)
    for loader in ("train_dataloader", "val_dataloader", "test_dataloader"):
        cfg[loader].dataset.data_root = data_root
    cfg.merge_from_dict(cfg_options)
    cfg.work_dir = work
    return Runner.from_cfg(cfg)


@pytest.mark.slow
@pytest.mark.timeout(7200)
def test_small_semantic_mask2former_learns(tmp_path) -> None:
    """The small semantic config trained for its schedule as mmseg's ``tools/train.py`` runs
    it (``Runner.from_cfg(cfg).train()``), then tested from its last checkpoint as
    ``tools/test.py`` does: mmseg's IoUMetric well above the untrained model's."""
    from npudet.datasets import make_shapes_dataset, write_semantic_maps

    data_root = str(tmp_path / "shapes") + "/"
    make_shapes_dataset(data_root)
    write_semantic_maps(data_root)
    untrained = small_runner(str(tmp_path / "untrained"), data_root)
    untrained.model.init_weights()
    before = untrained.test()
    trained = small_runner(str(tmp_path / "train"), data_root)
    trained.train()
    ckpt = (tmp_path / "train" / "last_checkpoint").read_text().strip()
    after = small_runner(str(tmp_path / "test"), data_root, load_from=ckpt).test()
    assert after["mIoU"] >= max(BAR, 5 * before["mIoU"]), (before, after)
