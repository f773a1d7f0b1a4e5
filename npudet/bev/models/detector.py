"""BEVFormer-style multi-camera 3D detector and its data preprocessor."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch
from mmdet.models.detectors import BaseDetector
from mmdet.registry import MODELS
from mmengine.model import BaseDataPreprocessor
from torch import Tensor

from npudet.models.detectors.msda_config import apply_msda_cfg

from .temporal_self_attention import ego_motion


@MODELS.register_module()
class BEVDataPreprocessor(BaseDataPreprocessor):
    """Stacks ``inputs['imgs']`` uint8 (T, Ncam, 3, H, W) per sample to float (B, T, Ncam, 3, H, W),
    normalised by ``mean`` / ``std`` (RGB order, optionally flipped from BGR)."""

    def __init__(
        self,
        mean: Sequence[float] = (123.675, 116.28, 103.53),
        std: Sequence[float] = (58.395, 57.12, 57.375),
        bgr_to_rgb: bool = False,
    ) -> None:
        super().__init__()
        self.register_buffer("mean", torch.tensor(mean).view(3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(std).view(3, 1, 1), persistent=False)
        self.bgr_to_rgb = bgr_to_rgb

    def forward(self, data: dict, training: bool = False) -> Dict[str, Any]:
        """``data['inputs']``: list of dict(imgs=...), dict(imgs=list) or dict(imgs=stacked)."""
        inputs = data["inputs"]
        if isinstance(inputs, (list, tuple)):
            imgs = torch.stack([torch.as_tensor(x["imgs"]) for x in inputs])
        elif isinstance(inputs["imgs"], (list, tuple)):  # pseudo_collate of dicts
            imgs = torch.stack([torch.as_tensor(x) for x in inputs["imgs"]])
        else:
            imgs = torch.as_tensor(inputs["imgs"])
        imgs = imgs.to(self.device, non_blocking=True).float()
        if self.bgr_to_rgb:
            imgs = imgs.flip(-3)
        imgs = (imgs - self.mean) / self.std
        samples = data.get("data_samples")
        if samples is not None:
            samples = [s.to(self.device) if hasattr(s, "to") else s for s in samples]
        return dict(inputs=imgs, data_samples=samples)


def _meta_tensor(samples: List[Any], key: str, device: torch.device, dtype=torch.float32) -> Tensor:
    return torch.stack(
        [torch.as_tensor(np.asarray(s.metainfo[key]), dtype=dtype) for s in samples]
    ).to(device)


@MODELS.register_module()
class BEVFormer(BaseDetector):
    """Multi-camera detector: image backbone + neck -> BEV encoder (temporal) -> DETR head.

    Previous frames of the queue are encoded without gradient, in eval mode, each one
    seeding the next; the current frame runs with gradient. ``use_temporal=False`` keeps
    no history: only the last frame of the queue is encoded and temporal self-attention
    attends to the current BEV queries alone (BEVFormer-S). ``msda``: dict(impl='auto',
    encoder=None, decoder=None) (see :func:`apply_msda_cfg`); encoder = TSA + SCA,
    decoder = the head's cross-attention. ``train_cfg`` (the assigner) and ``test_cfg``
    (``max_per_img``) go to the head, as in mmdet's DETR detectors.
    """

    # what the preflight checks model.msda's part overrides against (MSDAModel.msda_parts)
    msda_parts = {"encoder": "encoder", "decoder": "bbox_head.decoder"}

    def __init__(
        self,
        backbone: dict,
        neck: dict,
        encoder: dict,
        bbox_head: dict,
        data_preprocessor: Optional[dict] = None,
        msda: Optional[Mapping] = None,
        use_temporal: bool = True,
        train_cfg: Optional[dict] = None,
        test_cfg: Optional[dict] = None,
        init_cfg: Optional[dict] = None,
    ) -> None:
        if data_preprocessor is None:
            data_preprocessor = dict(type="BEVDataPreprocessor")
        if isinstance(data_preprocessor, dict):  # mmengine's root registry lacks it
            data_preprocessor = MODELS.build(data_preprocessor)
        super().__init__(data_preprocessor=data_preprocessor, init_cfg=init_cfg)
        if not isinstance(use_temporal, bool):
            raise TypeError(f"use_temporal: expected True or False, got {use_temporal!r}")
        self.use_temporal = use_temporal
        self.backbone = MODELS.build(backbone)
        self.neck = MODELS.build(neck)
        self.encoder = MODELS.build(encoder)
        head_cfgs = dict(train_cfg=train_cfg, test_cfg=test_cfg)
        bbox_head = {**bbox_head, **{k: v for k, v in head_cfgs.items() if v is not None}}
        self.bbox_head = MODELS.build(bbox_head)
        self.msda_impls = apply_msda_cfg(self, msda)

    def extract_feat(self, imgs: Tensor) -> List[Tensor]:
        """imgs (B, Ncam, 3, H, W) -> list of (B, Ncam, C, h, w)."""
        b, n = imgs.shape[:2]
        feats = self.neck(self.backbone(imgs.flatten(0, 1)))
        return [f.view(b, n, *f.shape[1:]) for f in feats]

    def _geometry(self, samples: List[Any], device: torch.device) -> Dict[str, Any]:
        return dict(
            lidar2img=_meta_tensor(samples, "lidar2img", device),
            ego2global=_meta_tensor(samples, "ego2global", device, torch.float64),
            prev_exists=_meta_tensor(samples, "prev_exists", device, torch.bool),
            img_shape=tuple(int(x) for x in samples[0].metainfo["img_shape"][:2]),
        )

    @staticmethod
    def _history(geo: Dict[str, Any], t: int, prev_bev: Optional[Tensor]) -> Dict[str, Tensor]:
        """Frame ``t``'s previous BEV and poses as the encoder and head take them, or {}."""
        if prev_bev is None:
            return {}
        return dict(
            prev_bev=prev_bev,
            cur2prev=ego_motion(geo["ego2global"][:, t], geo["ego2global"][:, t - 1]),
            prev_valid=geo["prev_exists"][:, t],
        )

    def _encode(self, imgs: Tensor, geo: Dict[str, Any], t: int, prev_bev: Optional[Tensor]):
        """BEV of frame ``t`` (B, Q, C), attending to ``prev_bev`` (frame t - 1) if given."""
        feats = self.extract_feat(imgs[:, t])
        return self.encoder(
            feats, geo["lidar2img"][:, t], geo["img_shape"], **self._history(geo, t, prev_bev)
        )

    def obtain_bev(self, imgs: Tensor, samples: List[Any]) -> Tuple[Tensor, Dict[str, Tensor]]:
        """imgs (B, T, Ncam, 3, H, W) -> current BEV (B, bev_h * bev_w, C) and its history:
        dict(prev_bev, cur2prev, prev_valid), {} without one."""
        geo = self._geometry(samples, imgs.device)
        last = imgs.shape[1] - 1
        prev_bev = None
        if self.use_temporal and last > 0:
            was_training = self.training
            self.eval()
            with torch.no_grad():
                for t in range(last):
                    prev_bev = self._encode(imgs, geo, t, prev_bev)
            self.train(was_training)
        return self._encode(imgs, geo, last, prev_bev), self._history(geo, last, prev_bev)

    def loss(self, batch_inputs: Tensor, batch_data_samples: List[Any]) -> Dict[str, Tensor]:
        """Losses of every decoder layer (``loss_cls``, ``loss_bbox``, ``d{i}.*``)."""
        bev, history = self.obtain_bev(batch_inputs, batch_data_samples)
        gt = [s.gt_instances_3d for s in batch_data_samples]
        return self.bbox_head.loss(bev, gt, **history)

    def predict(self, batch_inputs: Tensor, batch_data_samples: List[Any]) -> List[Any]:
        """Sets ``pred_instances_3d`` (bboxes_3d (K, 9), scores_3d, labels_3d) on each sample."""
        bev, history = self.obtain_bev(batch_inputs, batch_data_samples)
        for sample, result in zip(batch_data_samples, self.bbox_head.predict(bev, **history)):
            sample.pred_instances_3d = result
        return batch_data_samples

    def _forward(
        self, batch_inputs: Tensor, batch_data_samples: Union[List[Any], None] = None
    ) -> Any:
        """Raw head outputs (per-layer logits and codes)."""
        bev, history = self.obtain_bev(batch_inputs, batch_data_samples or [])
        return self.bbox_head(bev, **history)
