"""nuScenes support without the real data set: a generated v1.0-mini fixture, the info converter,
BEVDataset on the converted infos and our metric (mAP, five TP errors, NDS) against the devkit's
DetectionEval.
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
from nuscenes_fixture import make_nuscenes_fixture
from plugin_util import ROOT

from npudet.bev.evaluation import TP_METRICS, BEVDetMetric
from npudet.bev.evaluation.center_distance import evaluate_center_distance
from npudet.bev.infos.attributes import ATTRIBUTE_NAMES, attribute_from_velocity
from npudet.bev.infos.nuscenes import DETECTION_CLASSES, create_nuscenes_infos
from npudet.bev.infos.schema import lidar2img, load_bev_info


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
            assert set(names) <= {"car", "truck", "bus", "bicycle", "pedestrian", "barrier"} | {
                "traffic_cone"
            }
            attrs = [
                nusc.get("attribute", a["attribute_tokens"][0])["name"]
                if a["attribute_tokens"]
                else ""
                for a in anns
            ]
            assert s["gt_attrs"] == attrs
            lidar_sd = nusc.get("sample_data", sample["data"]["LIDAR_TOP"])
            pose = nusc.get("ego_pose", lidar_sd["ego_pose_token"])
            assert s["ego_pose_translation"] == pose["translation"]
    val_attrs = {a for s in val["data_list"] for a in s["gt_attrs"]}
    assert {"", "vehicle.stopped", "cycle.with_rider", "pedestrian.standing"} <= val_attrs


def test_global_round_trip(nusc_data: Dict[str, Any]) -> None:
    nusc, truth = nusc_data["nusc"], nusc_data["truth"]
    nan_vel = 0
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
                # NaN for the single-annotation object (assert_allclose: NaN equals NaN)
                np.testing.assert_allclose(
                    vel[:2], truth["velocities"][ann["instance_token"]], atol=1e-6
                )
                nan_vel += int(np.isnan(box[7]))
    assert nan_vel == 3  # one object per scene


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


def _val_dataset(nusc_data: Dict[str, Any], queue_length: int) -> Any:
    """BEVDataset on the converted val infos, images loaded and packed."""
    from mmdet.registry import DATASETS
    from mmengine.registry import init_default_scope

    import npudet.bev.datasets  # noqa: F401  (registers BEVDataset and the transforms)

    init_default_scope("mmdet")
    return DATASETS.build(
        dict(
            type="BEVDataset",
            data_root=nusc_data["root"],
            ann_file=nusc_data["paths"]["val"],
            queue_length=queue_length,
            pipeline=[dict(type="LoadMultiViewImages"), dict(type="PackBEVInputs")],
        )
    )


def test_bev_dataset_on_converted_infos(nusc_data: Dict[str, Any]) -> None:
    ds = _val_dataset(nusc_data, queue_length=2)
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
    # the last sample of a scene holds the object seen once: its velocity is unknown (NaN) for
    # the evaluation and 0 as a training target
    last = ds[3]["data_samples"]
    unknown = np.isnan(last.eval_ann_info["gt_boxes"][:, 7])
    assert unknown.sum() == 1
    assert last.gt_instances_3d.bboxes_3d[unknown, 7:].abs().sum() == 0
    assert (
        last.eval_ann_info["gt_attrs"]
        == load_bev_info(nusc_data["paths"]["val"])["data_list"][3]["gt_attrs"]
    )


def _random_box(rng: np.random.Generator, centre: np.ndarray, name: str) -> tuple:
    """A false positive at ``centre``: (centre, size, yaw, velocity, name), random otherwise."""
    return (centre, rng.uniform(0.5, 3.0, 3), rng.uniform(-3, 3), rng.normal(0, 1, 2), name)


def _perturbed_results(
    nusc: Any,
    sample_tokens: List[str],
    class_range: Dict[str, float],
    rng: np.random.Generator,
    random_attrs: bool,
) -> Dict[str, List[Dict[str, Any]]]:
    """Detections in the global frame: noisy copies of most GT boxes, false positives near the ego
    and just inside / outside the class ranges where the distance from the lidar (0.94 m ahead of
    the ego pose) says the opposite. Attributes: from class and velocity (as BEVDetMetric gives
    them) or, with ``random_attrs``, drawn from the devkit's names and ''."""
    from nuscenes.eval.detection.utils import category_to_detection_name

    results: Dict[str, List[Dict[str, Any]]] = {}
    for tok in sample_tokens:
        sd = nusc.get("sample_data", nusc.get("sample", tok)["data"]["LIDAR_TOP"])
        pose = nusc.get("ego_pose", sd["ego_pose_token"])
        ego, ego_yaw = np.asarray(pose["translation"]), _quat_yaw(pose["rotation"])
        dets = []
        for ann in _annotations(nusc, tok):
            if rng.random() < 0.2:
                continue  # a miss
            t = np.asarray(ann["translation"]) + [*rng.normal(0.0, 0.6, 2), rng.normal(0, 0.2)]
            size = np.asarray(ann["size"]) * rng.uniform(0.7, 1.3, 3)
            yaw = _quat_yaw(ann["rotation"]) + rng.normal(0.0, 0.5)
            vel = np.nan_to_num(nusc.box_velocity(ann["token"])[:2]) + rng.normal(0.0, 0.8, 2)
            dets.append((t, size, yaw, vel, category_to_detection_name(ann["category_name"])))
        for _ in range(int(rng.integers(1, 4))):  # false positives near the ego
            r, a = rng.uniform(3.0, 20.0), rng.uniform(-math.pi, math.pi)
            t = ego + [r * math.cos(a), r * math.sin(a), 0.8]
            name = str(rng.choice(["car", "pedestrian", "barrier", "traffic_cone", "bus"]))
            dets.append(_random_box(rng, t, name))
        for name in ("car", "pedestrian", "bicycle", "barrier", "traffic_cone"):
            # 0.3 m inside the range behind the ego (1.24 m outside from the lidar) or 0.3 m
            # outside ahead of it (0.64 m inside from the lidar)
            inside = rng.random() < 0.5
            r = class_range[name] + (-0.3 if inside else 0.3)
            a = ego_yaw + (math.pi if inside else 0.0) + rng.normal(0.0, 0.05)
            t = ego + [r * math.cos(a), r * math.sin(a), 0.8]
            dets.append(_random_box(rng, t, name))
        names = ["", *ATTRIBUTE_NAMES]
        results[tok] = [
            dict(
                sample_token=tok,
                translation=[float(v) for v in t],
                size=[float(v) for v in size],
                rotation=[math.cos(yaw / 2), 0.0, 0.0, math.sin(yaw / 2)],
                velocity=[float(v) for v in vel],
                detection_name=name,
                detection_score=float(rng.uniform(0.05, 0.95)),
                attribute_name=str(rng.choice(names))
                if random_attrs
                else attribute_from_velocity(name, *vel),
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


def _devkit_metrics(nusc: Any, results: Dict[str, Any], out_dir: str) -> Dict[str, Any]:
    """nuscenes-devkit DetectionEval (detection_cvpr_2019, mini_val) on ``results``."""
    from nuscenes.eval.detection.config import config_factory
    from nuscenes.eval.detection.evaluate import DetectionEval

    meta = dict(
        use_camera=True, use_lidar=False, use_radar=False, use_map=False, use_external=False
    )
    os.makedirs(out_dir)
    result_path = os.path.join(out_dir, "results.json")
    with open(result_path, "w") as fh:
        json.dump(dict(meta=meta, results=results), fh)
    cfg = config_factory("detection_cvpr_2019")
    nusc_eval = DetectionEval(
        nusc, cfg, result_path, eval_set="mini_val", output_dir=out_dir, verbose=False
    )
    return nusc_eval.evaluate()[0].serialize()


def _assert_agree(ours: Dict[str, float], ref: Dict[str, Any], classes: List[str]) -> None:
    """mAP, every AP, the five TP errors per class and as class means, and NDS, to 1e-6."""
    tol = 1e-6
    keys = dict(trans_err="mATE", scale_err="mASE", orient_err="mAOE", vel_err="mAVE")
    keys["attr_err"] = "mAAE"
    figures = [("mAP", ours["mAP"], ref["mean_ap"]), ("NDS", ours["NDS"], ref["nd_score"])]
    figures += [(keys[m], ours[keys[m]], ref["tp_errors"][m]) for m in TP_METRICS]
    print("  ".join(f"{k} npudet {a:.6f} devkit {b:.6f}" for k, a, b in figures))
    for _key, a, b in figures:
        assert a == pytest.approx(b, abs=tol), figures
    for name in classes:
        for th in ref["cfg"]["dist_ths"]:
            assert th in ref["label_aps"][name]  # a defaultdict: a wrong key would read 0
            got = ours[f"AP/{name}@{float(th)}"]
            assert got == pytest.approx(ref["label_aps"][name][th], abs=tol), (name, th)
        for metric in TP_METRICS:
            got, expected = ours[f"{metric}/{name}"], ref["label_tp_errors"][name][metric]
            if np.isnan(expected):
                assert np.isnan(got), (name, metric, got)
            else:
                assert got == pytest.approx(expected, abs=tol), (name, metric)


def test_metric_matches_devkit(nusc_data: Dict[str, Any], tmp_path: Any) -> None:
    """BEVDetMetric on the BEVDataset's eval_ann_info, attributes from class and velocity."""
    import torch
    from mmengine.structures import InstanceData

    nusc = nusc_data["nusc"]
    ds = _val_dataset(nusc_data, queue_length=1)
    classes = list(ds.metainfo["classes"])
    ref_cfg = _devkit_config()
    tokens = [ds.get_data_info(i)["token"] for i in range(len(ds))]
    results = _perturbed_results(
        nusc, tokens, ref_cfg["class_range"], np.random.default_rng(1), random_attrs=False
    )
    ref = _devkit_metrics(nusc, results, str(tmp_path / "devkit"))

    samples = []
    for i in range(len(ds)):
        sample = ds[i]["data_samples"]
        dets = results[sample.eval_ann_info["token"]]
        sample.pred_instances_3d = InstanceData(
            bboxes_3d=torch.tensor(
                [_to_ego(d, sample.eval_ann_info["ego2global"]) for d in dets], dtype=torch.float64
            ),
            scores_3d=torch.tensor([d["detection_score"] for d in dets], dtype=torch.float64),
            labels_3d=torch.tensor([classes.index(d["detection_name"]) for d in dets]),
        )
        samples.append(sample)
    metric = BEVDetMetric(
        classes=classes, class_range=ref_cfg["class_range"], dist_thresholds=ref_cfg["dist_ths"]
    )
    metric.process({}, samples)
    ours = metric.compute_metrics(metric.results)
    assert 0.05 < ref["mean_ap"] < 0.95 and 0.05 < ref["tp_errors"]["attr_err"] < 0.95
    _assert_agree(ours, ref, classes)


def _devkit_config() -> Dict[str, Any]:
    from nuscenes.eval.detection.config import config_factory

    return config_factory("detection_cvpr_2019").serialize()


def test_center_distance_with_given_attributes_matches_devkit(
    nusc_data: Dict[str, Any], tmp_path: Any
) -> None:
    """evaluate_center_distance straight from the info files, with random predicted attributes."""
    nusc = nusc_data["nusc"]
    val = load_bev_info(nusc_data["paths"]["val"])
    classes = val["metainfo"]["classes"]
    cfg = _devkit_config()
    tokens = [s["token"] for s in val["data_list"]]
    results = _perturbed_results(
        nusc, tokens, cfg["class_range"], np.random.default_rng(2), random_attrs=True
    )
    ref = _devkit_metrics(nusc, results, str(tmp_path / "devkit"))

    gts, gls, gas, pbs, pss, pls, pas, frames = [], [], [], [], [], [], [], []
    for s in val["data_list"]:
        e2g = np.asarray(s["ego2global"])
        dets = results[s["token"]]
        gts.append(np.asarray(s["gt_boxes"]).reshape(-1, 9))
        gls.append(np.asarray(s["gt_labels"]))
        gas.append(s["gt_attrs"])
        pbs.append(np.asarray([_to_ego(d, e2g) for d in dets]).reshape(-1, 9))
        pss.append(np.asarray([d["detection_score"] for d in dets]))
        pls.append(np.asarray([classes.index(d["detection_name"]) for d in dets]))
        pas.append([d["attribute_name"] for d in dets])
        frame = e2g.copy()
        frame[:3, 3] -= np.asarray(s["ego_pose_translation"])  # centred at the ego pose
        frames.append(frame)
    ours = evaluate_center_distance(
        gts,
        gls,
        pbs,
        pss,
        pls,
        classes,
        class_range=cfg["class_range"],
        dist_thresholds=cfg["dist_ths"],
        dist_th_tp=cfg["dist_th_tp"],
        min_recall=cfg["min_recall"],
        min_precision=cfg["min_precision"],
        gt_attrs=gas,
        pred_attrs=pas,
        eval_frames=frames,
    )
    assert 0.05 < ref["mean_ap"] < 0.95 and 0.05 < ref["tp_errors"]["attr_err"] < 0.95
    _assert_agree(ours, ref, classes)


def test_cli_and_missing_devkit(nusc_data: Dict[str, Any], tmp_path: Any, monkeypatch) -> None:
    import importlib.util

    tool = os.path.join(ROOT, "tools", "dataset_converters", "create_nuscenes_infos.py")
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
