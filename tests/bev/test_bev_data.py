"""Synthetic BEV data, info files, BEVDataset and the multi-view pipeline."""

from __future__ import annotations

import json
import math
import os
import shutil
from typing import Any, Dict

import cv2
import numpy as np
import pytest

from npudet.bev.infos.box_paint import front_colour
from npudet.bev.infos.schema import VERSION, lidar2img, load_bev_info
from npudet.bev.infos.synthetic import (
    CAMERA_NAMES,
    CLASS_COLOURS,
    CLASS_SIZES,
    CLASSES,
    FRAME_DT,
    HEIGHT,
    RENDER_VERSION,
    WIDTH,
    _render_background,
    camera_rigs,
    make_bev_dataset,
    render_camera,
)

W, H = 160, 96
FRAMES = 4


@pytest.fixture(scope="module")
def bev_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    root = str(tmp_path_factory.mktemp("bev"))
    make_bev_dataset(root, 2, 1, FRAMES, seed=5, width=W, height=H)
    return root


def _load(root: str, split: str = "train") -> Dict[str, Any]:
    return load_bev_info(os.path.join(root, f"infos_{split}.json"))


def _project(l2i: np.ndarray, pts: np.ndarray) -> np.ndarray:
    """Ego points (N, 3) -> (N, 3) of u, v, depth."""
    p = np.concatenate([pts, np.ones((len(pts), 1))], axis=1) @ l2i.T
    return np.concatenate([p[:, :2] / p[:, 2:3], p[:, 2:3]], axis=1)


def test_deterministic_and_cached(bev_root: str, tmp_path) -> None:
    other = str(tmp_path / "again")
    # scenes rendered in two processes: the same files as in one (the fixture)
    paths = make_bev_dataset(other, 2, 1, FRAMES, seed=5, width=W, height=H, workers=2)
    assert paths["written"]
    for split in ("train", "val"):
        with open(os.path.join(bev_root, f"infos_{split}.json"), "rb") as a:
            with open(paths[split], "rb") as b:
                assert a.read() == b.read()
    for rel in ("images/train_0001/CAM_BACK/003.jpg", "images/val_0000/CAM_FRONT/000.jpg"):
        with open(os.path.join(bev_root, rel), "rb") as a:
            with open(os.path.join(other, rel), "rb") as b:
                assert a.read() == b.read(), rel
    # unchanged settings: nothing rewritten; a new seed: rewritten and different
    assert not make_bev_dataset(other, 2, 1, FRAMES, seed=5, width=W, height=H)["written"]
    assert make_bev_dataset(other, 2, 1, FRAMES, seed=6, width=W, height=H)["written"]
    with open(os.path.join(bev_root, "infos_train.json"), "rb") as a:
        with open(paths["train"], "rb") as b:
            assert a.read() != b.read()
    # a set drawn by an earlier renderer (its meta.json names it) is drawn again
    with open(paths["meta"]) as f:
        meta = json.load(f)
    assert meta["render_version"] == RENDER_VERSION
    with open(paths["meta"], "w") as f:
        json.dump({**meta, "render_version": RENDER_VERSION - 1}, f)
    assert make_bev_dataset(other, 2, 1, FRAMES, seed=6, width=W, height=H)["written"]


def test_info_contents(bev_root: str) -> None:
    info = _load(bev_root)
    meta = info["metainfo"]
    assert meta["version"] == VERSION and meta["source"] == "synthetic"
    assert meta["classes"] == list(CLASSES) and meta["cameras"] == list(CAMERA_NAMES)
    samples = info["data_list"]
    assert len(samples) == 2 * FRAMES
    assert sum(len(s["gt_labels"]) for s in samples) > 0
    attrs = set()
    for s in samples:
        boxes = np.asarray(s["gt_boxes"]).reshape(-1, 9)
        assert (np.hypot(boxes[:, 0], boxes[:, 1]) <= 30.0).all()
        np.testing.assert_allclose(s["ego_pose_translation"], np.asarray(s["ego2global"])[:3, 3])
        # attributes from class and speed: vehicles moving / parked, pedestrians moving / standing
        for b, label, attr in zip(boxes, s["gt_labels"], s["gt_attrs"], strict=True):
            moving = math.hypot(b[7], b[8]) > 0.2
            if CLASSES[label] == "pedestrian":
                assert attr == ("pedestrian.moving" if moving else "pedestrian.standing")
            else:
                assert attr == ("vehicle.moving" if moving else "vehicle.parked")
            attrs.add(attr)
        np.testing.assert_allclose(boxes[:, 2], boxes[:, 5] / 2, atol=1e-5)  # on the ground
        assert s["prev"] == (s["sample_idx"] - 1 if s["frame"] > 0 else -1)
        for name in CAMERA_NAMES:
            assert os.path.isfile(os.path.join(bev_root, s["cams"][name]["img_path"]))
            rot = np.asarray(s["cams"][name]["cam2ego"])[:3, :3]
            np.testing.assert_allclose(rot @ rot.T, np.eye(3), atol=1e-5)
            assert abs(np.linalg.det(rot) - 1) < 1e-5
    assert {"vehicle.moving", "vehicle.parked", "pedestrian.moving"} <= attrs


def test_camera_orientation() -> None:
    """Independent of rendering: points in each camera's nominal direction hit its centre column."""
    rigs = camera_rigs(W, H)
    yaws = dict(
        CAM_FRONT=0, CAM_FRONT_LEFT=55, CAM_FRONT_RIGHT=-55, CAM_BACK=180,
        CAM_BACK_LEFT=110, CAM_BACK_RIGHT=-110,
    )  # fmt: skip
    for name, yaw in yaws.items():
        a = math.radians(yaw)
        pt = np.array([[20 * math.cos(a), 20 * math.sin(a), 3.0]])  # above camera height
        u, v, z = _project(lidar2img(rigs[name]), pt)[0]
        assert z > 0 and abs(u - W / 2) < 3, (name, u)
        assert v < H / 2, (name, v)  # higher point -> smaller row (y down)
        # a point to the camera's left lands left of centre
        b = a + math.radians(20)
        u2 = _project(lidar2img(rigs[name]), np.array([[20 * math.cos(b), 20 * math.sin(b), 1.6]]))
        assert u2[0, 0] < W / 2 - 10, name


def _class_of(pixel: np.ndarray) -> int:
    """Class whose body or front colour direction best explains a BGR pixel (shading scales
    colours)."""
    errs = []
    for name in CLASSES:
        err = np.inf
        for c in (np.asarray(CLASS_COLOURS[name], np.float64), front_colour(CLASS_COLOURS[name])):
            alpha = float(pixel @ c / (c @ c))
            err = min(err, np.linalg.norm(pixel - alpha * c) / (np.linalg.norm(pixel) + 1e-6))
        errs.append(err)
    return int(np.argmin(errs))


def test_projection_matches_rendering(bev_root: str) -> None:
    info = _load(bev_root)
    checked = hits = 0
    for s in info["data_list"]:
        boxes = np.asarray(s["gt_boxes"]).reshape(-1, 9)
        if not len(boxes):
            continue
        for name in CAMERA_NAMES:
            cam = s["cams"][name]
            cam_pos = np.asarray(cam["cam2ego"])[:3, 3]
            near = int(np.argmin(np.linalg.norm(boxes[:, :3] - cam_pos, axis=1)))  # drawn last
            u, v, z = _project(lidar2img(cam), boxes[near : near + 1, :3])[0]
            if not (1.0 < z < 15.0 and 2 <= u < W - 2 and 2 <= v < H - 2):
                continue
            img = cv2.imread(os.path.join(bev_root, cam["img_path"])).astype(np.float64)
            pixel = img[int(v) - 1 : int(v) + 2, int(u) - 1 : int(u) + 2].reshape(-1, 3).mean(0)
            rig = dict(cam2ego=np.asarray(cam["cam2ego"]), intrinsic=np.asarray(cam["intrinsic"]))
            bg = _render_background(rig, np.asarray(s["ego2global"]), W, H, 0)[int(v), int(u)]
            checked += 1
            hits += int(np.abs(pixel - bg).sum() > 60 and _class_of(pixel) == s["gt_labels"][near])
    assert checked >= 5
    assert hits >= 0.9 * checked, (hits, checked)


def _render_one(name: str, x: float, y: float, yaw: float) -> np.ndarray:
    """CAM_FRONT (H, W, 3) at the set's resolution: one noise-free ``name`` box of mean size."""
    w, ln, h = CLASS_SIZES[name]
    box = np.array([[x, y, h / 2, w, ln, h, yaw, 0.0, 0.0]])
    rig = camera_rigs(WIDTH, HEIGHT)["CAM_FRONT"]
    img = render_camera(rig, np.eye(4), box, [CLASSES.index(name)], [1.0], WIDTH, HEIGHT)
    return img.astype(np.float64)


@pytest.mark.parametrize("name", CLASSES)
def test_front_differs_from_back(name: str) -> None:
    """Heading is visible: turned by pi, the same box at the same place looks different.

    Head-on (yaw 0 shows the back, pi the front) the silhouettes are the same and only the
    paint tells them apart; side-on (+-pi/2) the light end swaps sides. At 20 m, the far end
    of the range the model is scored on, and the set's resolution. A box painted one colour
    on every face fails both (the face turned to the camera gets the same light either way).
    All three built-in classes have a front; none is symmetric like nuScenes' barrier.
    """
    empty = _render_one(name, 1000.0, 0.0, 0.0)  # the box far behind the horizon haze
    for yaw in (0.0, math.pi / 2):
        a, b = _render_one(name, 20.0, 0.0, yaw), _render_one(name, 20.0, 0.0, yaw + math.pi)
        on_box = (np.abs(a - empty).sum(-1) > 40) & (np.abs(b - empty).sum(-1) > 40)
        assert on_box.sum() >= 60, (yaw, on_box.sum())  # pixels the object covers in both
        differ = np.abs(a - b).sum(-1)[on_box] > 60
        assert differ.mean() > 0.25, (yaw, differ.mean())


def test_ego_motion_consistency(bev_root: str) -> None:
    """Objects keep their global pose (static) or move by v * dt (moving) between frames."""
    samples = _load(bev_root)["data_list"]
    matched = 0
    for a, b in zip(samples[:-1], samples[1:]):
        if b["prev"] != a["sample_idx"]:
            continue
        ea, eb = np.asarray(a["ego2global"]), np.asarray(b["ego2global"])
        assert abs(b["timestamp"] - a["timestamp"] - FRAME_DT) < 1e-6
        boxes_b = np.asarray(b["gt_boxes"]).reshape(-1, 9)
        glob_b = boxes_b[:, :3] @ eb[:3, :3].T + eb[:3, 3]
        for box, label in zip(np.asarray(a["gt_boxes"]).reshape(-1, 9), a["gt_labels"]):
            g = ea[:3, :3] @ box[:3] + ea[:3, 3]
            vel_g = ea[:3, :3] @ np.array([box[7], box[8], 0.0])
            expect = g + vel_g * FRAME_DT
            in_b = np.linalg.inv(eb) @ np.append(expect, 1.0)
            if np.hypot(in_b[0], in_b[1]) > 29.9:
                continue
            d = np.linalg.norm(glob_b - expect, axis=1)
            j = int(np.argmin(d))
            assert d[j] < 1e-3, (a["token"], box)
            assert b["gt_labels"][j] == label
            yaw_a = box[6] + math.atan2(ea[1, 0], ea[0, 0])
            yaw_b = boxes_b[j, 6] + math.atan2(eb[1, 0], eb[0, 0])
            assert abs((yaw_a - yaw_b + math.pi) % (2 * math.pi) - math.pi) < 1e-4
            vel_gb = eb[:3, :3] @ np.array([boxes_b[j, 7], boxes_b[j, 8], 0.0])
            np.testing.assert_allclose(vel_gb, vel_g, atol=1e-4)
            matched += 1
    assert matched > 10


def _dataset(root: str, queue_length: int = 3, scale=None, **kw):
    from mmdet.registry import DATASETS
    from mmengine.registry import init_default_scope

    import npudet.bev.datasets  # noqa: F401  (registers)

    init_default_scope("mmdet")  # as configs do with default_scope = 'mmdet'

    pipeline = [dict(type="LoadMultiViewImages")]
    if scale is not None:
        pipeline.append(dict(type="ResizeMultiViewImages", scale=scale))
    pipeline.append(dict(type="PackBEVInputs"))
    cfg = dict(
        type="BEVDataset",
        data_root=root,
        ann_file="infos_train.json",
        pipeline=pipeline,
        queue_length=queue_length,
        **kw,
    )
    return DATASETS.build(cfg)


def test_dataset_pipeline(bev_root: str) -> None:
    ds = _dataset(bev_root)
    assert len(ds) == 2 * FRAMES
    assert ds.metainfo["classes"] == CLASSES and ds.metainfo["cameras"] == CAMERA_NAMES
    info = _load(bev_root)["data_list"]
    expected_flags = {0: [0, 0, 0], 1: [0, 0, 1], 2: [0, 1, 1], 3: [1, 1, 1]}
    for i in range(FRAMES + 1):  # scene 0 and the first frame of scene 1
        out = ds[i]
        imgs = out["inputs"]["imgs"]
        sample = out["data_samples"]
        assert tuple(imgs.shape) == (3, 6, 3, H, W) and str(imgs.dtype) == "torch.uint8"
        m = sample.metainfo
        assert m["sample_idx"] == i and m["token"] == info[i]["token"]
        assert m["img_shape"] == (H, W) and m["cameras"] == list(CAMERA_NAMES)
        assert m["lidar2img"].shape == (3, 6, 4, 4) and m["lidar2img"].dtype == np.float64
        assert m["ego2global"].shape == (3, 4, 4) and m["prev_exists"].dtype == bool
        assert m["prev_exists"].tolist() == [bool(x) for x in expected_flags[info[i]["frame"]]]
        np.testing.assert_allclose(m["ego2global"][-1], info[i]["ego2global"])
        np.testing.assert_allclose(
            m["lidar2img"][-1, 1], lidar2img(info[i]["cams"][CAMERA_NAMES[1]])
        )
        n = len(info[i]["gt_labels"])
        gt = sample.gt_instances_3d
        assert tuple(gt.bboxes_3d.shape) == (n, 9) and str(gt.bboxes_3d.dtype) == "torch.float32"
        assert tuple(gt.labels_3d.shape) == (n,) and str(gt.labels_3d.dtype) == "torch.int64"
        assert sample.eval_ann_info["gt_boxes"].shape == (n, 9)
        assert sample.eval_ann_info["token"] == info[i]["token"]
        assert sample.eval_ann_info["gt_attrs"] == info[i]["gt_attrs"]
        np.testing.assert_allclose(sample.eval_ann_info["ego2global"], info[i]["ego2global"])
        np.testing.assert_allclose(
            sample.eval_ann_info["ego_pose_translation"], info[i]["ego_pose_translation"]
        )
    # frame 1 of scene 0: oldest queue entry repeats frame 0
    m = ds[1]["data_samples"].metainfo
    np.testing.assert_array_equal(m["ego2global"][0], m["ego2global"][1])
    q = ds[2]["inputs"]["imgs"]
    np.testing.assert_array_equal(q[-2].numpy(), ds[1]["inputs"]["imgs"][-1].numpy())


def test_resize_updates_lidar2img(bev_root: str) -> None:
    full = _dataset(bev_root, queue_length=1)[5]
    half = _dataset(bev_root, queue_length=1, scale=(80, 48))[5]
    assert tuple(half["inputs"]["imgs"].shape) == (1, 6, 3, 48, 80)
    assert half["data_samples"].metainfo["img_shape"] == (48, 80)
    pts = np.array([[10.0, 2.0, 1.0], [-8.0, -3.0, 0.5], [3.0, 9.0, 2.0]])
    for c in range(6):
        a = _project(full["data_samples"].metainfo["lidar2img"][0, c], pts)
        b = _project(half["data_samples"].metainfo["lidar2img"][0, c], pts)
        np.testing.assert_allclose(b[:, :2], a[:, :2] * 0.5, atol=1e-6)
        np.testing.assert_allclose(b[:, 2], a[:, 2], atol=1e-9)


def _copy_info(root: str, dst: str) -> Dict[str, Any]:
    shutil.copytree(root, dst)
    with open(os.path.join(dst, "infos_train.json")) as f:
        return json.load(f)


def _write(dst: str, data: Dict[str, Any]) -> str:
    path = os.path.join(dst, "infos_train.json")
    with open(path, "w") as f:
        json.dump(data, f)
    return path


def test_missing_image(bev_root: str, tmp_path) -> None:
    dst = str(tmp_path / "d")
    data = _copy_info(bev_root, dst)
    rel = data["data_list"][2]["cams"]["CAM_BACK_LEFT"]["img_path"]
    os.remove(os.path.join(dst, rel))
    ds = _dataset(dst, queue_length=1)
    with pytest.raises(FileNotFoundError, match=r"sample_idx 2.*CAM_BACK_LEFT.*") as err:
        ds[2]
    assert rel in str(err.value)


def test_bad_info_fields(bev_root: str, tmp_path) -> None:
    dst = str(tmp_path / "d")
    data = _copy_info(bev_root, dst)
    bad = json.loads(json.dumps(data))
    bad["data_list"][3]["cams"]["CAM_FRONT"]["cam2ego"] = np.eye(3).tolist()
    path = _write(dst, bad)
    with pytest.raises(ValueError, match=r"sample_idx 3.*cams\.CAM_FRONT\.cam2ego.*4x4"):
        load_bev_info(path)
    with pytest.raises(ValueError, match=r"sample_idx 3.*cam2ego"):
        _dataset(dst)
    bad = json.loads(json.dumps(data))
    bad["data_list"][1]["gt_boxes"] = [[1.0, 2.0, 3.0]]
    with pytest.raises(ValueError, match=r"sample_idx 1.*gt_boxes.*Nx9"):
        load_bev_info(_write(dst, bad))
    bad = json.loads(json.dumps(data))
    del bad["data_list"][4]["cams"]["CAM_BACK"]
    with pytest.raises(ValueError, match=r"sample_idx 4.*missing camera 'CAM_BACK'"):
        load_bev_info(_write(dst, bad))
    bad = json.loads(json.dumps(data))
    bad["metainfo"]["version"] = "npudet-bev-v1"
    path = _write(dst, bad)
    with pytest.raises(ValueError, match=r"has version npudet-bev-v1, expected npudet-bev-v2.*"):
        load_bev_info(path)
    with_boxes = next(i for i, s in enumerate(data["data_list"]) if s["gt_boxes"])
    bad = json.loads(json.dumps(data))
    bad["data_list"][with_boxes]["gt_attrs"] = ["vehicle.flying"] * len(
        bad["data_list"][with_boxes]["gt_boxes"]
    )
    with pytest.raises(ValueError, match=rf"sample_idx {with_boxes}.*gt_attrs.*vehicle\.flying"):
        load_bev_info(_write(dst, bad))
    bad["data_list"][with_boxes]["gt_attrs"] = []
    with pytest.raises(ValueError, match=rf"sample_idx {with_boxes}.*'gt_attrs' must be a list"):
        load_bev_info(_write(dst, bad))
    bad = json.loads(json.dumps(data))
    del bad["data_list"][2]["ego_pose_translation"]
    with pytest.raises(ValueError, match=r"sample_idx 2: missing field 'ego_pose_translation'"):
        load_bev_info(_write(dst, bad))
    bad["data_list"][2]["ego_pose_translation"] = [1.0, 2.0]
    with pytest.raises(ValueError, match=r"sample_idx 2.*ego_pose_translation.*finite 3-vector"):
        load_bev_info(_write(dst, bad))
    # an unknown velocity (NaN, as nuScenes' box_velocity) is allowed; an infinite one is not
    bad = json.loads(json.dumps(data))
    bad["data_list"][with_boxes]["gt_boxes"][0][7] = math.nan
    load_bev_info(_write(dst, bad))
    bad["data_list"][with_boxes]["gt_boxes"][0][7] = math.inf
    with pytest.raises(ValueError, match=rf"sample_idx {with_boxes}.*gt_boxes.*finite"):
        load_bev_info(_write(dst, bad))


def test_unserialized_dataset_matches(bev_root: str) -> None:
    a = _dataset(bev_root)
    b = _dataset(bev_root, serialize_data=False)
    for i in (0, 3, 6):
        ma, mb = a[i]["data_samples"].metainfo, b[i]["data_samples"].metainfo
        assert ma["token"] == mb["token"]
        np.testing.assert_array_equal(ma["prev_exists"], mb["prev_exists"])
        np.testing.assert_array_equal(ma["lidar2img"], mb["lidar2img"])
    info = b.get_data_info(3)
    assert [q["frame"] for q in info["queue"]] == [1, 2, 3]
    assert info["queue"][-1]["sample_idx"] == info["sample_idx"] == 3


def test_preflight_names_sample_and_camera(bev_root: str, tmp_path) -> None:
    """tools/train.py's preflight reads BEV info files (not COCO) and finds bad ones."""
    from mmengine.config import Config

    from npudet.engine.preflight import PreflightError, check_data

    dst = str(tmp_path / "d")
    data = _copy_info(bev_root, dst)
    cfg = Config(
        dict(
            train_dataloader=dict(
                dataset=dict(type="BEVDataset", data_root=dst, ann_file="infos_train.json")
            ),
            train_evaluator=dict(type="BEVDetMetric", ann_file="unused.json"),
        )
    )
    check_data(cfg, ["train"])  # a good set passes
    rel = data["data_list"][1]["cams"]["CAM_FRONT_RIGHT"]["img_path"]
    os.remove(os.path.join(dst, rel))
    with pytest.raises(PreflightError, match=r"sample_idx 1 camera CAM_FRONT_RIGHT.*not found"):
        check_data(cfg, ["train"])
    data["metainfo"]["version"] = "other"
    _write(dst, data)
    with pytest.raises(PreflightError, match=r"ann_file: info file .* has version other"):
        check_data(cfg, ["train"])
