"""A small BEVFormer, camera rigs and random multi-camera batches for the BEV model tests."""

from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch
from mmdet.structures import DetDataSample
from mmengine.structures import InstanceData

from npudet.bev.models import BEVFormer, BEVFormerEncoder

PC_RANGE = (-10.0, -10.0, -2.0, 10.0, 10.0, 2.0)
IMG_HW = (32, 48)
# What the BEV tests' encoders share: one layer over two cameras, no dropout.
ENCODER = dict(
    num_layers=1,
    num_heads=2,
    num_cams=2,
    sca_points=4,
    tsa_points=2,
    num_z=2,
    pc_range=PC_RANGE,
    dropout=0.0,
)


def encoder_settings(bev_hw=(4, 5), embed_dims: int = 16, **overrides) -> dict:
    """:data:`ENCODER` over a ``bev_hw`` grid, the FFN twice ``embed_dims`` wide; ``overrides``
    replace any of those settings."""
    grid = dict(bev_h=bev_hw[0], bev_w=bev_hw[1], embed_dims=embed_dims)
    return {**ENCODER, **grid, "ffn_dims": 2 * embed_dims, **overrides}


def tiny_encoder(bev_hw=(4, 5), embed_dims: int = 16, **overrides) -> BEVFormerEncoder:
    """A BEVFormerEncoder of :func:`encoder_settings`."""
    return BEVFormerEncoder(**encoder_settings(bev_hw, embed_dims, **overrides))


def tiny_bev_set(root: str) -> None:
    """A 1 + 1 scene, 4-frame built-in set under ``root``; 160x96 images keep the tools' tests
    quick (the model does not depend on the resolution)."""
    from npudet.bev.infos.synthetic import make_bev_dataset

    make_bev_dataset(
        root, num_scenes_train=1, num_scenes_val=1, frames_per_scene=4, width=160, height=96
    )


def ring_lidar2img(num_cams: int, img_hw=IMG_HW, focal: float = 20.0) -> torch.Tensor:
    """(num_cams, 4, 4) lidar2img of OpenCV cameras 1.5 m up, evenly spaced in yaw."""
    h, w = img_hw
    k4 = torch.eye(4, dtype=torch.float64)
    k4[:3, :3] = torch.tensor([[focal, 0, w / 2], [0, focal, h / 2], [0, 0, 1]])
    mats = []
    for i in range(num_cams):
        a = 2 * math.pi * i / num_cams
        cam2ego = torch.eye(4, dtype=torch.float64)
        fwd = torch.tensor([math.cos(a), math.sin(a), 0.0])
        right = torch.tensor([math.sin(a), -math.cos(a), 0.0])
        down = torch.tensor([0.0, 0.0, -1.0])
        cam2ego[:3, :3] = torch.stack([right, down, fwd], 1)
        cam2ego[:3, 3] = torch.tensor([0.0, 0.0, 1.5])
        mats.append(k4 @ torch.linalg.inv(cam2ego))
    return torch.stack(mats).float()


def small_model(
    impl: str = "cpu",
    num_cams: int = 2,
    two_stage: bool = False,
    history_velocity: Optional[dict] = None,
) -> BEVFormer:
    c = 32
    bev_h = bev_w = 8
    return BEVFormer(
        backbone=dict(
            type="ResNet",
            depth=18,
            base_channels=16,
            num_stages=4,
            out_indices=(3,),
            norm_cfg=dict(type="BN", requires_grad=True),
            norm_eval=False,
            style="pytorch",
        ),
        neck=dict(type="FPN", in_channels=[128], out_channels=c, num_outs=1),
        encoder=dict(
            type="BEVFormerEncoder",
            **encoder_settings((bev_h, bev_w), c, num_heads=4, num_levels=1, num_cams=num_cams),
        ),
        bbox_head=dict(
            type="BEVDetrHead",
            num_classes=3,
            embed_dims=c,
            num_queries=10,
            num_layers=2,
            num_heads=4,
            num_points=2,
            ffn_dims=64,
            dropout=0.0,
            bev_h=bev_h,
            bev_w=bev_w,
            pc_range=PC_RANGE,
            two_stage=two_stage,
            history_velocity=history_velocity,
        ),
        test_cfg=dict(max_per_img=7),
        msda=dict(impl=impl),
    )


def random_batch(b: int = 2, t: int = 2, n: int = 2):
    torch.manual_seed(1)
    l2i = ring_lidar2img(n).double().numpy()
    samples = []
    for i in range(b):
        ego = np.tile(np.eye(4), (t, 1, 1))
        ego[:, 0, 3] = np.arange(t) * 1.5
        s = DetDataSample(
            metainfo=dict(
                img_shape=IMG_HW,
                lidar2img=np.tile(l2i, (t, 1, 1, 1)),
                ego2global=ego,
                prev_exists=np.array([False] + [i == 0] * (t - 1)),
            )
        )
        boxes = torch.tensor(
            [
                [3.0, 1.0, 0.5, 1.8, 4.0, 1.5, 0.3, 1.0, 0.0],
                [-4.0, 2.0, 0.2, 0.6, 0.7, 1.7, -1.0, 0.0, 0.5],
            ]
        )[: i + 1]
        s.gt_instances_3d = InstanceData(bboxes_3d=boxes, labels_3d=torch.arange(i + 1))
        samples.append(s)
    imgs = torch.randint(0, 255, (b, t, n, 3) + IMG_HW, dtype=torch.uint8)
    return dict(inputs=[dict(imgs=x) for x in imgs], data_samples=samples)
