"""Mask2Former (instance and panoptic) and its MSDA pixel decoder on npudet's layers.

What mmdet 3.3.0's ``test_maskformer.py`` (Mask2Former cases) and its pixel-decoder test
check — mmdet's R50 configs shrunk to ResNet-18 at 32 channels, ``loss`` / ``predict`` /
``tensor`` on a batch of two differently sized images — done for each implementation, with
every MSDA layer counted on npudet's op and none on mmcv's; and one step of ``cpu`` against
``grid_sample``. The pixel decoder and the video track head built alone (no detector, so no
``model.msda``) take the one-line ``convert_msda(module, impl)``, as mmdet's tests of both run.
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch
from mmdet.structures import DetDataSample
from mmdet.testing import demo_mm_inputs
from mmengine.config import ConfigDict
from msda_models_util import (
    IMPLS,
    assert_same_step,
    build,
    layer_impls,
    mmdet_config,
    running_on,
    tiny_mask2former_head,
)

from npudet.models import convert_msda
from npudet.models.detectors.msda_config import msda_parts_of
from npudet.ops import msda_impls

pytestmark = pytest.mark.skipif("cpu" not in msda_impls(), reason="cpu kernel did not build")

INSTANCE = "mask2former/mask2former_r50_8xb2-lsj-50e_coco.py"
PANOPTIC = "mask2former/mask2former_r50_8xb2-lsj-50e_coco-panoptic.py"
VIDEO = "mask2former_vis/mask2former_r50_8xb2-8e_youtubevis2021.py"
BASE = 32  # mmdet's test width


def tiny_model_cfg(rel: str, impl: str) -> ConfigDict:
    """mmdet's Mask2Former ``rel`` as mmdet's own test shrinks it (ResNet-18, 32 channels),
    with 2 pixel-decoder encoder layers, 2 decoder layers and 10 queries to stay quick."""
    cfg = mmdet_config(rel).model
    cfg.msda = dict(impl=impl)
    cfg.backbone.update(depth=18, init_cfg=None, base_channels=BASE)
    tiny_mask2former_head(cfg.panoptic_head, base=BASE)
    cfg.train_cfg.num_points = 256
    # mmdet's batch augment pads every image to the 1024x1024 crop; the test batch is small
    cfg.data_preprocessor.batch_augments = None
    return cfg


def batch(rel: str, shapes=((3, 128, 127), (3, 91, 92))) -> dict:
    """mmdet's test batch: two images of different sizes with masks (+ semantic maps for
    panoptic)."""
    torch.manual_seed(0)
    return demo_mm_inputs(
        2,
        image_shapes=list(shapes),
        sem_seg_output_strides=1,
        with_mask=True,
        with_semantic="panoptic" in rel,
    )


@pytest.mark.parametrize("rel", [INSTANCE, PANOPTIC], ids=["instance", "panoptic"])
@pytest.mark.parametrize("impl", IMPLS)
def test_loss_predict_tensor_on_npudet_layers(rel: str, impl: str) -> None:
    model = build(tiny_model_cfg(rel, impl))
    # mmdet's pixel decoder has its MSDA in an encoder: the part model.msda.encoder names
    assert set(layer_impls(model)) == {
        f"panoptic_head.pixel_decoder.encoder.layers.{i}.self_attn" for i in range(2)
    }
    assert model.msda_impls["encoder"] == impl
    assert msda_parts_of(model) == type(model).msda_parts  # what the preflight reads
    with running_on(model, impl) as record:
        data = model.data_preprocessor(batch(rel), True)
        losses = model(**data, mode="loss")
        assert isinstance(losses, dict) and losses
        assert all(torch.isfinite(v).all() for v in losses.values()), losses
        model.eval()
        with torch.no_grad():
            data = model.data_preprocessor(batch(rel), False)
            results = model(**data, mode="predict")
            assert len(results) == 2 and isinstance(results[0], DetDataSample)
            assert "masks" in results[0].pred_instances
            if rel == PANOPTIC:
                assert "pred_panoptic_seg" in results[0]
            data = model.data_preprocessor(batch(rel, ((3, 128, 128), (3, 125, 130))), False)
            out = model(**data, mode="tensor")
            assert isinstance(out, tuple)
    assert all(n == 3 for n in record.layers.values())  # once per mode


def test_decoder_override_names_the_models_parts() -> None:
    cfg = tiny_model_cfg(INSTANCE, "cpu")
    cfg.msda = dict(impl="cpu", decoder="grid_sample")
    with pytest.raises(ValueError, match=r"model\.msda\.decoder: Mask2Former has no .*"
                       r"encoder \(panoptic_head\.pixel_decoder\.encoder\)"):  # fmt: skip
        build(cfg)


def test_paths_in_model_msda() -> None:
    cfg = tiny_model_cfg(INSTANCE, "cpu")
    cfg.msda.paths = {"panoptic_head.pixel_decoder.encoder.layers.1": "grid_sample"}
    layers = "panoptic_head.pixel_decoder.encoder.layers"
    assert layer_impls(build(cfg, init=False)) == {
        f"{layers}.0.self_attn": "cpu",
        f"{layers}.1.self_attn": "grid_sample",
    }


def test_cpu_and_grid_sample_same_step() -> None:
    assert_same_step(lambda impl: tiny_model_cfg(INSTANCE, impl), lambda: batch(INSTANCE))


@pytest.mark.parametrize("impl", IMPLS)
def test_pixel_decoder(impl: str) -> None:
    """mmdet's MSDeformAttnPixelDecoder test: 4 levels in, the finest as the mask feature,
    3 multi-scale outputs at the 3 coarser levels' sizes; its 6 encoder layers converted."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    base = 64
    init_default_scope("mmdet")
    decoder = MODELS.build(
        ConfigDict(
            type="MSDeformAttnPixelDecoder",
            in_channels=[base * 2**i for i in range(4)],
            strides=[4, 8, 16, 32],
            feat_channels=base,
            out_channels=base,
            num_outs=3,
            norm_cfg=dict(type="GN", num_groups=32),
            act_cfg=dict(type="ReLU"),
            encoder=dict(
                num_layers=6,
                layer_cfg=dict(
                    self_attn_cfg=dict(
                        embed_dims=base,
                        num_heads=8,
                        num_levels=3,
                        num_points=4,
                        im2col_step=64,
                        dropout=0.0,
                        batch_first=True,
                        norm_cfg=None,
                        init_cfg=None,
                    ),
                    ffn_cfg=dict(
                        embed_dims=base,
                        feedforward_channels=base * 4,
                        num_fcs=2,
                        ffn_drop=0.0,
                        act_cfg=dict(type="ReLU", inplace=True),
                    ),
                ),
                init_cfg=None,
            ),
            positional_encoding=dict(num_feats=base // 2, normalize=True),
            init_cfg=None,
        )
    )
    decoder.init_weights()
    assert convert_msda(decoder, impl) == 6
    feats = [torch.rand(2, base * 2**i, 4 * 2 ** (3 - i), 5 * 2 ** (3 - i)) for i in range(4)]
    with running_on(decoder, impl):
        mask_feature, multi_scale = decoder(feats)
    assert mask_feature.shape == feats[0].shape
    assert len(multi_scale) == 3
    for out, feat in zip(multi_scale[::-1], feats[1:]):
        assert out.shape[-2:] == feat.shape[-2:]


def tiny_track_head(impl: Optional[str]) -> torch.nn.Module:
    """mmdet's ``Mask2FormerTrackHead`` test head built alone (no detector: no ``model.msda``),
    shrunk to 32 channels, 2 pixel-decoder and 2 decoder layers, then converted with the
    documented one-line call ``convert_msda(head, impl)`` (None: stock mmcv)."""
    from mmdet.models.tracking_heads import Mask2FormerTrackHead
    from mmengine.registry import init_default_scope

    init_default_scope("mmdet")
    head_cfg = mmdet_config(VIDEO).model.track_head
    head_cfg.pop("type")
    tiny_mask2former_head(head_cfg, num_classes=3, base=BASE)
    head_cfg.train_cfg.num_points = 256
    torch.manual_seed(0)
    head = Mask2FormerTrackHead(**head_cfg)
    head.init_weights()
    if impl is not None:
        assert convert_msda(head, impl) == 2
    return head


def frame_feats(frames: int, size: int) -> list:
    """The backbone's 4 levels (strides 8 to 64, as mmdet's test) for ``frames`` frames."""
    return [
        torch.rand(frames, BASE * 2**i, size // s, size // s) for i, s in enumerate([8, 16, 32, 64])
    ]


def track_losses(head: torch.nn.Module, size: int = 64) -> dict:
    """mmdet's track-head loss test: one video of two frames (frame 0 the key frame)."""
    from mmdet.testing import demo_track_inputs

    torch.manual_seed(1)
    feats = frame_feats(2, size)
    inputs = demo_track_inputs(
        batch_size=1,
        num_frames=2,
        key_frames_inds=[0],
        image_shapes=[(3, size, size)],
        num_classes=2,
        with_mask=True,
    )
    return head.loss(feats, [inputs["data_samples"][0]])


@pytest.mark.parametrize("impl", IMPLS)
def test_track_head(impl: str) -> None:
    """mmdet's ``Mask2FormerTrackHead`` tests on npudet's op: the loss (3 losses per decoder
    prediction) equal to stock mmcv's, and ``predict`` over a video of 3 frames."""
    from mmdet.structures import TrackDataSample

    stock = track_losses(tiny_track_head(None))
    head = tiny_track_head(impl)
    with running_on(head, impl):
        losses = track_losses(head)
        assert len(losses) == 3 * 3  # loss_cls, loss_mask, loss_dice x (2 layers + 1)
        head.eval()
        with torch.no_grad():
            size, frames = 64, 3
            feats = frame_feats(frames, size)
            meta = dict(img_shape=(size, size), ori_shape=(size, size), scale_factor=(1, 1))
            meta.update(pad_shape=(size, size), batch_input_shape=(size, size))
            video = TrackDataSample()
            video.video_data_samples = [DetDataSample(metainfo=meta) for _ in range(frames)]
            assert len(head.predict(feats, video)) == frames
    for name, value in stock.items():
        torch.testing.assert_close(losses[name], value, atol=1e-4, rtol=1e-4, msg=name)
