"""Multi-view transforms for BEVDataset samples (each acts on every frame of ``queue``)."""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import cv2
import numpy as np
import torch
from mmcv.transforms import BaseTransform
from mmdet.registry import TRANSFORMS
from mmdet.structures import DetDataSample
from mmengine.structures import InstanceData


def _queue(results: Dict[str, Any]) -> List[Dict[str, Any]]:
    queue = results.get("queue")
    if queue is None:  # a bare sample: treat it as a queue of one frame
        queue = [results]
        results["queue"] = queue
    return queue


def _cameras(results: Dict[str, Any], frame: Dict[str, Any]) -> List[str]:
    cams = results.get("cameras")
    return list(cams) if cams is not None else list(frame["cams"])


@TRANSFORMS.register_module()
class LoadMultiViewImages(BaseTransform):
    """Read every camera image of every queue frame.

    Adds to each frame: ``imgs`` list of Ncam (H, W, 3) uint8 (BGR unless ``to_rgb``),
    ``intrinsics`` (Ncam, 3, 3) float64, ``cam2egos`` (Ncam, 4, 4) float64, ``img_shape`` (H, W).
    Raises FileNotFoundError naming the sample, camera and path of a missing image, and
    ValueError if a frame's images differ in size.
    """

    def __init__(self, to_rgb: bool = False) -> None:
        self.to_rgb = to_rgb

    def transform(self, results: Dict[str, Any]) -> Dict[str, Any]:
        for frame in _queue(results):
            imgs, intrinsics, cam2egos = [], [], []
            for name in _cameras(results, frame):
                cam = frame["cams"][name]
                path = cam["img_path"]
                img = cv2.imread(path, cv2.IMREAD_COLOR) if os.path.isfile(path) else None
                if img is None:
                    raise FileNotFoundError(
                        f"sample_idx {frame.get('sample_idx')} (token {frame.get('token')}): "
                        f"image of camera {name} is missing or unreadable: {path}"
                    )
                if self.to_rgb:
                    img = cv2.cvtColor(img, cv2.COLOR_BGR2RGB)
                imgs.append(img)
                intrinsics.append(np.asarray(cam["intrinsic"], np.float64))
                cam2egos.append(np.asarray(cam["cam2ego"], np.float64))
            shapes = {im.shape[:2] for im in imgs}
            if len(shapes) != 1:
                raise ValueError(
                    f"sample_idx {frame.get('sample_idx')}: camera images differ in size {shapes}; "
                    "add ResizeMultiViewImages"
                )
            frame["imgs"] = imgs
            frame["intrinsics"] = np.stack(intrinsics)
            frame["cam2egos"] = np.stack(cam2egos)
            frame["img_shape"] = imgs[0].shape[:2]
        results["img_shape"] = results["queue"][-1]["img_shape"]
        return results

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(to_rgb={self.to_rgb})"


@TRANSFORMS.register_module()
class ResizeMultiViewImages(BaseTransform):
    """Resize every image to ``scale = (W, H)`` and scale the intrinsics to match."""

    def __init__(self, scale: Sequence[int], interpolation: str = "bilinear") -> None:
        if len(scale) != 2 or min(scale) <= 0:
            raise ValueError(f"scale must be (W, H) with positive sizes, got {scale}")
        self.scale: Tuple[int, int] = (int(scale[0]), int(scale[1]))
        modes = dict(bilinear=cv2.INTER_LINEAR, nearest=cv2.INTER_NEAREST, area=cv2.INTER_AREA)
        if interpolation not in modes:
            raise ValueError(f"interpolation must be one of {sorted(modes)}, got {interpolation}")
        self.interpolation = interpolation
        self._mode = modes[interpolation]

    def transform(self, results: Dict[str, Any]) -> Dict[str, Any]:
        w, h = self.scale
        for frame in _queue(results):
            if "imgs" not in frame:
                raise KeyError("ResizeMultiViewImages needs LoadMultiViewImages before it")
            imgs, intrinsics = [], []
            for img, k in zip(frame["imgs"], frame["intrinsics"]):
                sy, sx = h / img.shape[0], w / img.shape[1]
                if img.shape[:2] != (h, w):
                    img = cv2.resize(img, (w, h), interpolation=self._mode)
                imgs.append(img)
                intrinsics.append(np.diag([sx, sy, 1.0]) @ k)
            frame["imgs"] = imgs
            frame["intrinsics"] = np.stack(intrinsics)
            frame["img_shape"] = (h, w)
        results["img_shape"] = (h, w)
        return results

    def __repr__(self) -> str:
        return (
            f"{self.__class__.__name__}(scale={self.scale}, interpolation={self.interpolation!r})"
        )


@TRANSFORMS.register_module()
class PackBEVInputs(BaseTransform):
    """Pack a loaded queue into ``dict(inputs=dict(imgs=...), data_samples=DetDataSample)``.

    ``imgs``: uint8 tensor (T, Ncam, 3, H, W). Metainfo: sample_idx, token, scene, timestamp,
    img_shape (H, W), lidar2img (T, Ncam, 4, 4) float64, ego2global (T, 4, 4) float64,
    prev_exists (T,) bool, cameras. ``gt_instances_3d``: bboxes_3d float32 (N, 9) (an unknown
    velocity as 0, the training target mmdet3d uses), labels_3d int64 (N,). ``eval_ann_info``:
    gt_boxes (N, 9) float64 (an unknown velocity NaN: the devkit leaves it out of the velocity
    error), gt_labels (N,), gt_attrs (N attribute names), ego2global (4, 4),
    ego_pose_translation (3,), sample_idx, token.
    """

    def __init__(self, meta_keys: Optional[Sequence[str]] = None) -> None:
        self.meta_keys = tuple(meta_keys) if meta_keys is not None else ()

    def transform(self, results: Dict[str, Any]) -> Dict[str, Any]:
        queue = _queue(results)
        shapes = {tuple(f["img_shape"]) for f in queue}
        if len(shapes) != 1:
            raise ValueError(f"sample_idx {results.get('sample_idx')}: queue frames differ in size")
        imgs = np.stack([np.stack(f["imgs"]) for f in queue])  # (T, Ncam, H, W, 3)
        imgs_t = torch.from_numpy(np.ascontiguousarray(imgs.transpose(0, 1, 4, 2, 3)))
        l2i = []
        for f in queue:
            k4 = np.tile(np.eye(4), (len(f["intrinsics"]), 1, 1))
            k4[:, :3, :3] = f["intrinsics"]
            l2i.append(k4 @ np.linalg.inv(f["cam2egos"]))
        meta = dict(
            sample_idx=results["sample_idx"],
            token=results["token"],
            scene=results["scene"],
            timestamp=results["timestamp"],
            img_shape=tuple(int(v) for v in queue[-1]["img_shape"]),
            lidar2img=np.stack(l2i).astype(np.float64),
            ego2global=np.stack([np.asarray(f["ego2global"], np.float64) for f in queue]),
            prev_exists=np.array([bool(f["prev_exists"]) for f in queue], dtype=bool),
            cameras=list(_cameras(results, queue[-1])),
        )
        for key in self.meta_keys:
            if key in results:
                meta[key] = results[key]
        sample = DetDataSample(metainfo=meta)
        boxes = np.asarray(results["gt_boxes"], np.float64).reshape(-1, 9)
        labels = np.asarray(results["gt_labels"], np.int64).reshape(-1)
        sample.gt_instances_3d = InstanceData(
            bboxes_3d=torch.from_numpy(np.nan_to_num(boxes, nan=0.0).astype(np.float32)),
            labels_3d=torch.from_numpy(labels.copy()),
        )
        sample.eval_ann_info = dict(
            gt_boxes=boxes.copy(),
            gt_labels=labels.copy(),
            gt_attrs=list(results["gt_attrs"]),
            ego2global=np.asarray(results["ego2global"], np.float64),
            ego_pose_translation=np.asarray(results["ego_pose_translation"], np.float64),
            sample_idx=results["sample_idx"],
            token=results["token"],
        )
        return dict(inputs=dict(imgs=imgs_t), data_samples=sample)

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(meta_keys={self.meta_keys})"
