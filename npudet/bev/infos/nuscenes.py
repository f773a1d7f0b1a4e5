"""Convert a nuScenes database into ``npudet-bev-v2`` info files (needs nuscenes-devkit).

Conventions (see :mod:`npudet.bev.infos.schema`):

* The ego frame of a sample is its LIDAR_TOP frame (as BEVFormer); ``ego2global`` is that
  frame's ``lidar2global`` = ego pose @ lidar calibration, both of the LIDAR_TOP sample_data.
* Per camera ``cam2ego = inv(lidar2global) @ cam2global``, ``cam2global`` = the camera
  sample_data's own ego pose @ its calibration, so the time offset between the sensors is exact.
* Boxes: ``(x, y, z, w, l, h, yaw, vx, vy)`` in the ego frame: the annotation's centre (the
  gravity centre), ``size`` (w, l, h), yaw of the box x axis about the ego z axis, velocity
  from ``NuScenes.box_velocity`` (global) rotated into the ego frame; NaN where the devkit
  cannot estimate it (kept: the evaluation leaves it out, the dataset trains on 0).
* ``gt_attrs``: the annotation's attribute name ('' without one), as the devkit's ``load_gt``;
  ``ego_pose_translation``: the LIDAR_TOP sample_data's ego pose translation, where the devkit
  measures class ranges from.
* Categories map to the 10 detection classes as the devkit's ``category_to_detection_name``;
  others are dropped, and so are annotations with fewer than ``min_points`` lidar + radar points
  (default 1: the devkit's evaluation drops those GT boxes too).
* Splits from ``nuscenes.utils.splits.create_splits_scenes`` for the version:
  trainval -> train/val, mini -> mini_train/mini_val (written as ``infos_train/val.json``),
  test -> test (``infos_test.json``, no boxes).
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from npudet.utils.json_io import write_json_atomic

from .schema import VERSION

DETECTION_CLASSES = (
    "car",
    "truck",
    "construction_vehicle",
    "bus",
    "trailer",
    "barrier",
    "motorcycle",
    "bicycle",
    "pedestrian",
    "traffic_cone",
)
CAMERAS = (
    "CAM_FRONT",
    "CAM_FRONT_RIGHT",
    "CAM_FRONT_LEFT",
    "CAM_BACK",
    "CAM_BACK_LEFT",
    "CAM_BACK_RIGHT",
)
# version suffix -> ((devkit split, output name), ...)
VERSION_SPLITS = {
    "trainval": (("train", "train"), ("val", "val")),
    "mini": (("mini_train", "train"), ("mini_val", "val")),
    "test": (("test", "test"),),
}
_INSTALL_HINT = (
    "nuscenes-devkit is needed to convert nuScenes (extra 'nuscenes' of npudet): run "
    "`bash tools/setup.sh`, or `pip install --no-deps nuscenes-devkit==1.2.0 pyquaternion "
    "cachetools scikit-learn` (it declares numpy<2; --no-deps keeps numpy 2)"
)


def _import_devkit() -> Any:
    try:
        import nuscenes  # noqa: F401
        from nuscenes import NuScenes
        from nuscenes.eval.detection.utils import category_to_detection_name
        from nuscenes.utils.splits import create_splits_scenes
    except ImportError as exc:
        raise ImportError(f"{_INSTALL_HINT} ({exc})") from exc
    return NuScenes, category_to_detection_name, create_splits_scenes


def _quat_to_matrix(q: Sequence[float]) -> np.ndarray:
    w, x, y, z = (float(v) for v in q)
    n = math.sqrt(w * w + x * x + y * y + z * z)
    w, x, y, z = w / n, x / n, y / n, z / n
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def record_matrix(record: Dict[str, Any]) -> np.ndarray:
    """4x4 transform of a nuScenes record with ``translation`` and ``rotation`` [w, x, y, z]."""
    m = np.eye(4)
    m[:3, :3] = _quat_to_matrix(record["rotation"])
    m[:3, 3] = np.asarray(record["translation"], np.float64)
    return m


def sensor2global(nusc: Any, sd_token: str) -> np.ndarray:
    """Sensor -> global (4, 4) of a sample_data: its ego pose @ its calibration."""
    sd = nusc.get("sample_data", sd_token)
    pose = nusc.get("ego_pose", sd["ego_pose_token"])
    calib = nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])
    return record_matrix(pose) @ record_matrix(calib)


def _mat(m: np.ndarray) -> List[List[float]]:
    return [[float(v) for v in row] for row in np.asarray(m, np.float64)]


def _attribute_name(nusc: Any, ann: Dict[str, Any]) -> str:
    """The annotation's attribute name, '' without one (devkit ``load_gt``: at most one)."""
    tokens = ann["attribute_tokens"]
    if len(tokens) > 1:
        raise ValueError(f"nuScenes annotation {ann['token']} has {len(tokens)} attributes")
    return nusc.get("attribute", tokens[0])["name"] if tokens else ""


def sample_info(
    nusc: Any,
    sample: Dict[str, Any],
    sample_idx: int,
    scene_name: str,
    frame: int,
    prev: int,
    to_detection: Any,
    classes: Sequence[str] = DETECTION_CLASSES,
    cameras: Sequence[str] = CAMERAS,
    min_points: int = 1,
    with_boxes: bool = True,
) -> Dict[str, Any]:
    """One ``npudet-bev-v2`` data_list entry for a nuScenes sample record."""
    lidar_sd = nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
    lidar2global = sensor2global(nusc, lidar_sd["token"])
    global2lidar = np.linalg.inv(lidar2global)
    cams = {}
    for cam in cameras:
        if cam not in sample["data"]:
            raise ValueError(f"nuScenes sample {sample['token']} has no {cam} sample_data")
        sd_token = sample["data"][cam]
        sd = nusc.get("sample_data", sd_token)
        calib = nusc.get("calibrated_sensor", sd["calibrated_sensor_token"])
        cams[cam] = dict(
            img_path=sd["filename"],
            cam2ego=_mat(global2lidar @ sensor2global(nusc, sd_token)),
            intrinsic=_mat(calib["camera_intrinsic"]),
            width=int(sd["width"]),
            height=int(sd["height"]),
        )
    rot = global2lidar[:3, :3]
    boxes: List[List[float]] = []
    labels: List[int] = []
    attrs: List[str] = []
    for ann_token in sample["anns"] if with_boxes else []:
        ann = nusc.get("sample_annotation", ann_token)
        name = to_detection(ann["category_name"])
        if name is None or name not in classes:
            continue
        if ann.get("num_lidar_pts", 0) + ann.get("num_radar_pts", 0) < min_points:
            continue
        centre = global2lidar @ np.array([*ann["translation"], 1.0])
        box_rot = rot @ _quat_to_matrix(ann["rotation"])
        yaw = math.atan2(box_rot[1, 0], box_rot[0, 0])
        vel = rot @ np.asarray(nusc.box_velocity(ann_token), np.float64)
        w, ln, h = (float(v) for v in ann["size"])
        boxes.append([*(float(v) for v in centre[:3]), w, ln, h, yaw, float(vel[0]), float(vel[1])])
        labels.append(list(classes).index(name))
        attrs.append(_attribute_name(nusc, ann))
    return dict(
        sample_idx=sample_idx,
        token=sample["token"],
        scene=scene_name,
        frame=frame,
        timestamp=sample["timestamp"] * 1e-6,
        prev=prev,
        ego2global=_mat(lidar2global),
        ego_pose_translation=[
            float(v) for v in nusc.get("ego_pose", lidar_sd["ego_pose_token"])["translation"]
        ],
        cams=cams,
        gt_boxes=boxes,
        gt_labels=labels,
        gt_attrs=attrs,
    )


def _check_dataroot(dataroot: str, version: str) -> None:
    """Raise one line, before the devkit is loaded, where ``dataroot`` cannot be nuScenes'
    (the devkit's own check is an ``AssertionError`` traceback)."""
    if not os.path.isdir(dataroot):
        raise FileNotFoundError(f"dataroot {dataroot}: no such folder (nuScenes' root)")
    if not os.path.isdir(os.path.join(dataroot, version)):
        raise FileNotFoundError(
            f"dataroot {dataroot}: no {version}/ folder in it (nuScenes' tables, "
            f"{version}/*.json; the version is --version)"
        )


def create_nuscenes_infos(
    dataroot: str,
    version: str = "v1.0-trainval",
    out_dir: Optional[str] = None,
    nusc: Any = None,
    min_points: int = 1,
    verbose: bool = False,
) -> Dict[str, str]:
    """Write ``infos_{split}.json`` for the splits of ``version``; returns split -> path.

    ``out_dir`` defaults to ``dataroot`` (``img_path`` is relative to ``dataroot``, so the
    dataset's ``data_root`` is the nuScenes dataroot). ``nusc``: an already loaded NuScenes.
    ``FileNotFoundError`` naming the folder when ``dataroot`` holds no ``version/`` tables.
    """
    suffix = version.split("-")[-1]
    if suffix not in VERSION_SPLITS:
        raise ValueError(f"unknown nuScenes version {version!r}: expected v1.0-trainval/mini/test")
    if nusc is None:
        _check_dataroot(dataroot, version)
    NuScenes, to_detection, create_splits_scenes = _import_devkit()
    if nusc is None:
        nusc = NuScenes(version=version, dataroot=dataroot, verbose=verbose)
    out_dir = dataroot if out_dir is None else out_dir
    os.makedirs(out_dir, exist_ok=True)
    splits = create_splits_scenes()
    scenes_by_name = {s["name"]: s for s in nusc.scene}
    written = {}
    for devkit_split, out_name in VERSION_SPLITS[suffix]:
        data_list: List[Dict[str, Any]] = []
        for scene in nusc.scene:
            if scene["name"] not in splits[devkit_split]:
                continue
            token, frame, prev = scene["first_sample_token"], 0, -1
            while token:
                sample = nusc.get("sample", token)
                idx = len(data_list)
                data_list.append(
                    sample_info(
                        nusc,
                        sample,
                        idx,
                        scene["name"],
                        frame,
                        prev,
                        to_detection,
                        min_points=min_points,
                        with_boxes=out_name != "test",
                    )
                )
                token, frame, prev = sample["next"], frame + 1, idx
        if verbose:
            present = sum(name in scenes_by_name for name in splits[devkit_split])
            print(f"[nuscenes] {out_name}: {present} scenes, {len(data_list)} samples")
        metainfo = dict(
            version=VERSION,
            classes=list(DETECTION_CLASSES),
            cameras=list(CAMERAS),
            source="nuscenes",
            nuscenes_version=version,
        )
        path = os.path.join(out_dir, f"infos_{out_name}.json")
        written[out_name] = write_json_atomic(path, dict(metainfo=metainfo, data_list=data_list))
    return written
