"""nuScenes support without the real data set: a generated v1.0-mini fixture, the info converter,
BEVDataset on the converted infos and our centre-distance metric against the devkit's DetectionEval.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any, Dict, List

import cv2
import numpy as np
import pytest

from npudet.datasets.bev_info import lidar2img, load_bev_info
from npudet.datasets.nuscenes_fixture import make_nuscenes_fixture
from npudet.datasets.nuscenes_infos import DETECTION_CLASSES, create_nuscenes_infos
from npudet.evaluation.center_distance import evaluate_center_distance


@pytest.fixture(scope="module")
def nusc_data(tmp_path_factory: pytest.TempPathFactory) -> Dict[str, Any]:
    root = make_nuscenes_fixture(str(tmp_path_factory.mktemp("nuscenes")), seed=0)
    from nuscenes import NuScenes

    nusc = NuScenes(version="v1.0-mini", dataroot=root, verbose=False)
    paths = create_nuscenes_infos(root, "v1.0-mini", nusc=nusc)
    with open(os.path.join(root, "fixture_truth.json")) as fh:
        truth = json.load(fh)
    return dict(root=root, nusc=nusc, paths=paths, truth=truth)


def _annotations(nusc: Any, sample_token: str) -> List[Dict[str, Any]]:
    """The sample's annotations of detection classes, in the order of ``sample['anns']``."""
    from nuscenes.eval.detection.utils import category_to_detection_name

    anns = [nusc.get("sample_annotation", t) for t in nusc.get("sample", sample_token)["anns"]]
    return [a for a in anns if category_to_detection_name(a["category_name"]) is not None]


def _yaw_of(rot: np.ndarray) -> float:
    return math.atan2(rot[1, 0], rot[0, 0])


def _quat_yaw(q: List[float]) -> float:
    w, x, y, z = q
    return math.atan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z))


def test_infos_load_and_link(nusc_data: Dict[str, Any]) -> None:
    nusc = nusc_data["nusc"]
    train = load_bev_info(nusc_data["paths"]["train"])
    val = load_bev_info(nusc_data["paths"]["val"])
    assert val["metainfo"]["source"] == "nuscenes"
    assert tuple(val["metainfo"]["classes"]) == DETECTION_CLASSES
    assert {s["scene"] for s in train["data_list"]} == {"scene-0061"}
    assert {s["scene"] for s in val["data_list"]} == {"scene-0103", "scene-0916"}
    for info in (train, val):
        for s in info["data_list"]:
            sample = nusc.get("sample", s["token"])
            assert s["timestamp"] == pytest.approx(sample["timestamp"] * 1e-6, abs=1e-6)
            if sample["prev"]:
                prev = info["data_list"][s["prev"]]
                assert prev["token"] == sample["prev"] and prev["frame"] == s["frame"] - 1
            else:
                assert s["prev"] == -1 and s["frame"] == 0
            anns = _annotations(nusc, s["token"])
            assert len(anns) > 0 and len(s["gt_boxes"]) == len(anns)  # 'animal' dropped
            names = [val["metainfo"]["classes"][i] for i in s["gt_labels"]]
            assert set(names) <= {"car", "truck", "pedestrian", "barrier", "traffic_cone"}


def test_global_round_trip(nusc_data: Dict[str, Any]) -> None:
    nusc, truth = nusc_data["nusc"], nusc_data["truth"]
    for split in ("train", "val"):
        for s in load_bev_info(nusc_data["paths"][split])["data_list"]:
            e2g = np.asarray(s["ego2global"])
            for box, ann in zip(np.asarray(s["gt_boxes"]), _annotations(nusc, s["token"])):
                centre = e2g @ np.array([*box[:3], 1.0])
                np.testing.assert_allclose(centre[:3], ann["translation"], atol=1e-9)
                np.testing.assert_allclose(box[3:6], ann["size"], atol=1e-12)
                yaw = _yaw_of(e2g[:3, :3] @ cv2.Rodrigues(np.array([0, 0, box[6]]))[0])
                diff = (yaw - _quat_yaw(ann["rotation"]) + math.pi) % (2 * math.pi) - math.pi
                assert abs(diff) < 1e-9
                vel = e2g[:3, :3] @ np.array([box[7], box[8], 0.0])
                np.testing.assert_allclose(
                    vel[:2], truth["velocities"][ann["instance_token"]], atol=1e-6
                )


def test_box_centres_project_into_cameras(nusc_data: Dict[str, Any]) -> None:
    nusc, root = nusc_data["nusc"], nusc_data["root"]
    infos = {}
    for split in ("train", "val"):
        infos.update({s["token"]: s for s in load_bev_info(nusc_data["paths"][split])["data_list"]})
    projections = nusc_data["truth"]["projections"]
    assert len(projections) >= 20
    seen = set()
    for p in projections:
        s = infos[p["sample_token"]]
        anns = [a["token"] for a in _annotations(nusc, s["token"])]
        if p["ann_token"] not in anns:
            continue  # a dropped (non-detection) category
        box = np.asarray(s["gt_boxes"])[anns.index(p["ann_token"])]
        cam = s["cams"][p["camera"]]
        uvz = lidar2img(cam) @ np.array([*box[:3], 1.0])
        assert uvz[2] == pytest.approx(p["depth"], abs=1e-6)
        np.testing.assert_allclose(uvz[:2] / uvz[2], p["uv"], atol=1e-6)
        img = cv2.imread(os.path.join(root, cam["img_path"]))
        assert img.shape[:2] == (cam["height"], cam["width"])
        b, g, r = img[int(round(p["uv"][1])), int(round(p["uv"][0]))].astype(int)
        assert r > 150 and g < 110 and b < 110, (p, (b, g, r))  # the fixture's red dot
        seen.add(p["camera"])
    assert len(seen) >= 3  # projections through several camera calibrations


def test_bev_dataset_on_converted_infos(nusc_data: Dict[str, Any]) -> None:
    from mmdet.registry import DATASETS
    from mmengine.registry import init_default_scope

    import npudet.datasets.bev  # noqa: F401  (registers BEVDataset and the transforms)

    init_default_scope("mmdet")
    ds = DATASETS.build(
        dict(
            type="BEVDataset",
            data_root=nusc_data["root"],
            ann_file=nusc_data["paths"]["val"],
            queue_length=2,
            pipeline=[dict(type="LoadMultiViewImages"), dict(type="PackBEVInputs")],
        )
    )
    assert len(ds) == 8
    item = ds[1]
    imgs = item["inputs"]["imgs"]
    assert tuple(imgs.shape) == (2, 6, 3, 90, 160)
    meta = item["data_samples"].metainfo
    assert list(meta["prev_exists"]) == [False, True]
    assert meta["lidar2img"].shape == (2, 6, 4, 4)
    raw = load_bev_info(nusc_data["paths"]["val"])["data_list"][1]
    np.testing.assert_allclose(meta["lidar2img"][1, 0], lidar2img(raw["cams"]["CAM_FRONT"]))
    gt = item["data_samples"].gt_instances_3d
    assert gt.bboxes_3d.shape == (len(raw["gt_boxes"]), 9)


def _perturbed_results(nusc: Any, sample_tokens: List[str], rng: np.random.Generator) -> Dict:
    """Detections in the global frame: noisy copies of most GT boxes plus false positives."""
    from nuscenes.eval.detection.utils import category_to_detection_name

    results: Dict[str, List[Dict[str, Any]]] = {}
    for tok in sample_tokens:
        sd = nusc.get("sample_data", nusc.get("sample", tok)["data"]["LIDAR_TOP"])
        ego = np.asarray(nusc.get("ego_pose", sd["ego_pose_token"])["translation"])
        dets = []
        for ann in _annotations(nusc, tok):
            if rng.random() < 0.2:
                continue  # a miss
            t = np.asarray(ann["translation"]) + [*rng.normal(0.0, 0.6, 2), rng.normal(0, 0.2)]
            size = np.asarray(ann["size"]) * rng.uniform(0.7, 1.3, 3)
            yaw = _quat_yaw(ann["rotation"]) + rng.normal(0.0, 0.5)
            vel = np.asarray(nusc.box_velocity(ann["token"])[:2]) + rng.normal(0.0, 0.8, 2)
            dets.append((t, size, yaw, vel, category_to_detection_name(ann["category_name"])))
        for _ in range(int(rng.integers(1, 4))):  # false positives near the ego
            r, a = rng.uniform(3.0, 20.0), rng.uniform(-math.pi, math.pi)
            t = ego + [r * math.cos(a), r * math.sin(a), 0.8]
            name = str(rng.choice(["car", "pedestrian", "barrier", "traffic_cone", "bus"]))
            dets.append(
                (t, rng.uniform(0.5, 3.0, 3), rng.uniform(-3, 3), rng.normal(0, 1, 2), name)
            )
        results[tok] = [
            dict(
                sample_token=tok,
                translation=[float(v) for v in t],
                size=[float(v) for v in size],
                rotation=[math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)],
                velocity=[float(v) for v in vel],
                detection_name=name,
                detection_score=float(rng.uniform(0.05, 0.95)),
                attribute_name="",
            )
            for t, size, yaw, vel, name in dets
        ]
    return results


def _to_ego(det: Dict[str, Any], ego2global: np.ndarray) -> List[float]:
    g2e = np.linalg.inv(ego2global)
    centre = g2e @ np.array([*det["translation"], 1.0])
    yaw = _quat_yaw(det["rotation"]) - _yaw_of(ego2global[:3, :3])
    vel = g2e[:3, :3] @ np.array([*det["velocity"], 0.0])
    return [*centre[:3], *det["size"], yaw, vel[0], vel[1]]


def test_metric_matches_devkit(nusc_data: Dict[str, Any], tmp_path: Any) -> None:
    from nuscenes.eval.detection.config import config_factory
    from nuscenes.eval.detection.evaluate import DetectionEval

    nusc = nusc_data["nusc"]
    val = load_bev_info(nusc_data["paths"]["val"])
    classes = val["metainfo"]["classes"]
    tokens = [s["token"] for s in val["data_list"]]
    results = _perturbed_results(nusc, tokens, np.random.default_rng(1))
    meta = dict(
        use_camera=True, use_lidar=False, use_radar=False, use_map=False, use_external=False
    )
    result_path = str(tmp_path / "results.json")
    with open(result_path, "w") as fh:
        json.dump(dict(meta=meta, results=results), fh)

    cfg = config_factory("detection_cvpr_2019")
    gts, gls, pbs, pss, pls = [], [], [], [], []
    for s in val["data_list"]:
        e2g = np.asarray(s["ego2global"])
        dets = results[s["token"]]
        boxes = np.asarray(s["gt_boxes"]).reshape(-1, 9)
        preds = np.asarray([_to_ego(d, e2g) for d in dets]).reshape(-1, 9)
        labels = [classes.index(d["detection_name"]) for d in dets]
        # everything well inside the class ranges from both the ego pose and the lidar origin
        for b, lab in [*zip(boxes, s["gt_labels"]), *zip(preds, labels)]:
            assert math.hypot(b[0], b[1]) < cfg.class_range[classes[lab]] - 3.0
        gts.append(boxes)
        gls.append(np.asarray(s["gt_labels"]))
        pbs.append(preds)
        pss.append(np.asarray([d["detection_score"] for d in dets]))
        pls.append(np.asarray(labels))
    assert sum(len(g) for g in gts) >= 30 and sum(len(p) for p in pbs) >= 30

    nusc_eval = DetectionEval(
        nusc,
        cfg,
        result_path,
        eval_set="mini_val",
        output_dir=str(tmp_path / "eval"),
        verbose=False,
    )
    ref = nusc_eval.evaluate()[0].serialize()

    kwargs = dict(
        class_range=cfg.class_range,
        dist_thresholds=cfg.dist_ths,
        dist_th_tp=cfg.dist_th_tp,
        min_recall=cfg.min_recall,
        min_precision=cfg.min_precision,
    )
    ours = evaluate_center_distance(gts, gls, pbs, pss, pls, classes, **kwargs)
    assert 0.05 < ref["mean_ap"] < 0.95  # a non-trivial case
    assert ours["mAP"] == pytest.approx(ref["mean_ap"], abs=1e-6)
    for name in classes:
        for th in cfg.dist_ths:
            assert th in ref["label_aps"][name]  # a defaultdict: a wrong key would read 0
            assert ours[f"AP/{name}@{float(th)}"] == pytest.approx(
                ref["label_aps"][name][th], abs=1e-6
            ), (name, th)
    for metric, key in (
        ("trans_err", "mATE"),
        ("scale_err", "mASE"),
        ("orient_err", "mAOE"),
        ("vel_err", "mAVE"),
    ):
        assert ours[key] == pytest.approx(ref["tp_errors"][metric], abs=1e-6), metric
    # per-class TP errors: evaluate one class at a time (its errors are then the means)
    for c, name in enumerate(classes):
        one = evaluate_center_distance(
            gts,
            [np.where(g == c, 0, -1) for g in gls],
            pbs,
            pss,
            [np.where(p == c, 0, -1) for p in pls],
            [name],
            **kwargs,
        )
        for metric, key in (
            ("trans_err", "mATE"),
            ("scale_err", "mASE"),
            ("orient_err", "mAOE"),
            ("vel_err", "mAVE"),
        ):
            expected = ref["label_tp_errors"][name][metric]
            if not np.isnan(expected):
                assert one[key] == pytest.approx(expected, abs=1e-6), (name, metric)


def test_cli_and_missing_devkit(nusc_data: Dict[str, Any], tmp_path: Any, monkeypatch) -> None:
    import importlib.util

    tool = os.path.join(
        os.path.dirname(os.path.dirname(__file__)), "tools", "create_nuscenes_infos.py"
    )
    spec = importlib.util.spec_from_file_location("create_nuscenes_infos", tool)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = str(tmp_path / "out")
    args = ["--dataroot", nusc_data["root"], "--version", "v1.0-mini", "--out-dir", out]
    assert module.main(args) == 0
    with open(os.path.join(out, "infos_val.json")) as a, open(nusc_data["paths"]["val"]) as b:
        assert json.load(a) == json.load(b)

    monkeypatch.setitem(sys.modules, "nuscenes", None)  # as if nuscenes-devkit were missing
    with pytest.raises(ImportError, match=r"nuscenes-devkit .*extra 'nuscenes'.*setup\.sh"):
        create_nuscenes_infos(nusc_data["root"], "v1.0-mini", out_dir=out)
    assert module.main(args) == 2
