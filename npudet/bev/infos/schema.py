"""BEV info files (``npudet-bev-v2``): loading, validation and camera projection helpers.

Per sample: ``gt_boxes`` (N, 9) ``(x, y, z, w, l, h, yaw, vx, vy)`` in the sample's ego frame
(a NaN velocity means unknown, as nuScenes' ``box_velocity``), ``gt_labels`` (N,), ``gt_attrs``
(N,) nuScenes attribute names ('' for none), ``ego2global`` (4, 4) and ``ego_pose_translation``
(3,), the global position the nuScenes evaluation measures class ranges from (the LIDAR_TOP
ego pose; the ego frame's origin for synthetic data). v2 added the last two and ``gt_attrs``.

Pure python/numpy so the generators and converters can use it without mmdet.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Mapping

import numpy as np

from .attributes import ATTRIBUTE_NAMES

VERSION = "npudet-bev-v2"

_SAMPLE_FIELDS = (
    "sample_idx",
    "token",
    "scene",
    "frame",
    "timestamp",
    "prev",
    "ego2global",
    "cams",
    "ego_pose_translation",
    "gt_boxes",
    "gt_labels",
    "gt_attrs",
)
_CAM_FIELDS = ("img_path", "cam2ego", "intrinsic", "width", "height")


def _shape_of(value: Any) -> str:
    try:
        return str(np.asarray(value, dtype=np.float64).shape)
    except (ValueError, TypeError):
        return "ragged/non-numeric"


def _check_matrix(value: Any, shape: tuple, where: str) -> None:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (ValueError, TypeError):
        arr = None
    if arr is None or arr.shape != shape or not np.all(np.isfinite(arr)):
        kind = "x".join(str(d) for d in shape) + (" matrix" if len(shape) == 2 else "-vector")
        raise ValueError(f"{where} must be a finite {kind}, got shape {_shape_of(value)}")


def _validate_sample(sample: Mapping[str, Any], pos: int, cameras: list, num_classes: int) -> None:
    idx = sample.get("sample_idx", f"#{pos}")
    for field in _SAMPLE_FIELDS:
        if field not in sample:
            raise ValueError(f"sample_idx {idx}: missing field '{field}'")
    _check_matrix(sample["ego2global"], (4, 4), f"sample_idx {idx}: field 'ego2global'")
    cams = sample["cams"]
    if not isinstance(cams, dict):
        raise ValueError(f"sample_idx {idx}: field 'cams' must be a dict of camera name -> info")
    for cam in cameras:
        if cam not in cams:
            raise ValueError(f"sample_idx {idx}: field 'cams' is missing camera '{cam}'")
        info = cams[cam]
        for field in _CAM_FIELDS:
            if field not in info:
                raise ValueError(f"sample_idx {idx}: cams.{cam} is missing field '{field}'")
        _check_matrix(info["cam2ego"], (4, 4), f"sample_idx {idx}: field 'cams.{cam}.cam2ego'")
        _check_matrix(info["intrinsic"], (3, 3), f"sample_idx {idx}: field 'cams.{cam}.intrinsic'")
    boxes = sample["gt_boxes"]
    try:
        arr = np.asarray(boxes, dtype=np.float64)
    except (ValueError, TypeError):
        arr = None
    if arr is None or not (arr.ndim == 2 and arr.shape[1] == 9 or arr.size == 0):
        raise ValueError(
            f"sample_idx {idx}: field 'gt_boxes' must be Nx9, got shape {_shape_of(boxes)}"
        )
    arr = arr.reshape(-1, 9)
    if not (np.all(np.isfinite(arr[:, :7])) and not np.any(np.isinf(arr[:, 7:]))):
        raise ValueError(
            f"sample_idx {idx}: field 'gt_boxes' must be finite (velocity: finite or NaN)"
        )
    _check_matrix(
        sample["ego_pose_translation"], (3,), f"sample_idx {idx}: field 'ego_pose_translation'"
    )
    labels = np.asarray(sample["gt_labels"])
    n = arr.shape[0]
    if labels.ndim != 1 or labels.shape[0] != n:
        raise ValueError(
            f"sample_idx {idx}: field 'gt_labels' must have {n} entries (one per box), "
            f"got shape {labels.shape}"
        )
    if n and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(
            f"sample_idx {idx}: field 'gt_labels' has values outside [0, {num_classes})"
        )
    attrs = sample["gt_attrs"]
    if not isinstance(attrs, list) or len(attrs) != n:
        raise ValueError(f"sample_idx {idx}: field 'gt_attrs' must be a list of {n} names")
    unknown = sorted({a for a in attrs if a != "" and a not in ATTRIBUTE_NAMES}, key=str)
    if unknown:
        raise ValueError(
            f"sample_idx {idx}: field 'gt_attrs' has {unknown}, not nuScenes attribute names "
            f"{ATTRIBUTE_NAMES} or ''"
        )


def load_bev_info(path: str) -> Dict[str, Any]:
    """Load and validate a BEV info file; returns ``{"metainfo": ..., "data_list": [...]}``.

    Raises ValueError naming the sample_idx and field for any malformed entry.
    """
    with open(path) as f:
        data = json.load(f)
    if not isinstance(data, dict) or "metainfo" not in data or "data_list" not in data:
        raise ValueError(f"info file {path} must be a dict with 'metainfo' and 'data_list'")
    meta = data["metainfo"]
    version = meta.get("version")
    if version != VERSION:
        raise ValueError(
            f"info file {path} has version {version}, expected {VERSION}: write it again "
            "(tools/dataset_converters/make_bev_dataset.py or "
            "tools/dataset_converters/create_nuscenes_infos.py)"
        )
    for field in ("classes", "cameras"):
        if not isinstance(meta.get(field), list) or not meta[field]:
            raise ValueError(f"info file {path}: metainfo field '{field}' must be a non-empty list")
    cameras = list(meta["cameras"])
    for pos, sample in enumerate(data["data_list"]):
        _validate_sample(sample, pos, cameras, len(meta["classes"]))
    return data


def lidar2img(cam: Mapping[str, Any]) -> np.ndarray:
    """Ego (lidar) -> image projection (4, 4) float64: ``K4 @ inv(cam2ego)``.

    ``[u*z, v*z, z, 1] = lidar2img @ [x, y, z, 1]`` for a point in the ego frame.
    """
    k4 = np.eye(4)
    k4[:3, :3] = np.asarray(cam["intrinsic"], dtype=np.float64)
    return k4 @ np.linalg.inv(np.asarray(cam["cam2ego"], dtype=np.float64))
