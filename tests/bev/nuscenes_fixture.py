"""A tiny but complete nuScenes-format database (``v1.0-mini`` tables) for tests.

``make_nuscenes_fixture(root)`` writes what ``NuScenes(version='v1.0-mini', dataroot=root)`` loads:
all 13 tables, a LIDAR_TOP (small ``.pcd.bin``) and 6 camera key frames (small JPEGs) per sample,
a map mask PNG. Scenes: ``scene-0061`` (devkit ``mini_train``), ``scene-0103`` and ``scene-0916``
(``mini_val``), a few samples each 0.5 s apart. The ego drives forward with a slight turn (yaw-only
poses on the ground plane); every camera fires at its own small time offset after the LIDAR, so
each sample_data has its own ego pose. LIDAR_TOP is mounted like nuScenes' (rotated -90 deg about
z); the cameras use :func:`npudet.bev.infos.synthetic.camera_rigs`. Objects move at constant
velocity and stay within 25 m of the ego; all but one appear in every sample of their scene (so
``box_velocity`` is exact), that one only in the last (its velocity is unknown: NaN). One object
per scene has a category outside the 10 detection classes; attributes cover vehicles, cycles and
pedestrians, and one car annotation lacks its attribute (as about 0.4% of nuScenes' do).

Besides the database, ``fixture_truth.json`` records for every annotation the camera pixel of its
box centre, computed from the raw records (``K @ inv(cam calib) @ inv(cam ego pose) @ p``),
and the object's true global velocity.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from typing import Any, Dict, List

import cv2
import numpy as np

from npudet.bev.infos.nuscenes import record_matrix
from npudet.bev.infos.synthetic import CAMERA_NAMES, camera_rigs

VERSION = "v1.0-mini"
SCENES = (("scene-0061", "mini_train"), ("scene-0103", "mini_val"), ("scene-0916", "mini_val"))
SAMPLES_PER_SCENE = 4
SAMPLE_DT_US = 500_000
CAM_OFFSET_US = 8_000  # camera k fires (k + 1) * 8 ms after the LIDAR sweep
WIDTH, HEIGHT = 160, 90
LIDAR_TRANSLATION = (0.94, 0.0, 1.84)
LIDAR_YAW = -math.pi / 2
# (nuScenes category, attribute or '', (w, l, h), speed range m/s, first sample it appears in)
OBJECTS = (
    ("vehicle.car", "vehicle.moving", (1.9, 4.6, 1.7), (3.0, 8.0), 0),
    ("vehicle.car", "vehicle.parked", (1.8, 4.3, 1.6), (0.0, 0.0), 0),
    ("vehicle.car", "", (1.8, 4.4, 1.5), (0.0, 0.0), 0),
    ("vehicle.car", "vehicle.parked", (1.9, 4.5, 1.6), (0.0, 0.0), SAMPLES_PER_SCENE - 1),
    ("vehicle.truck", "vehicle.moving", (2.5, 7.0, 3.0), (2.0, 5.0), 0),
    ("vehicle.bus.rigid", "vehicle.stopped", (2.9, 10.5, 3.4), (0.0, 0.0), 0),
    ("vehicle.bicycle", "cycle.with_rider", (0.6, 1.7, 1.3), (2.0, 4.0), 0),
    ("human.pedestrian.adult", "pedestrian.moving", (0.7, 0.7, 1.75), (0.8, 1.5), 0),
    ("human.pedestrian.adult", "pedestrian.standing", (0.7, 0.7, 1.7), (0.0, 0.0), 0),
    ("movable_object.barrier", "", (2.0, 0.5, 1.0), (0.0, 0.0), 0),
    ("movable_object.trafficcone", "", (0.4, 0.4, 0.8), (0.0, 0.0), 0),
    ("animal", "", (0.5, 1.0, 0.6), (0.0, 1.0), 0),
)
CATEGORIES = sorted({o[0] for o in OBJECTS})
ATTRIBUTES = sorted({o[1] for o in OBJECTS if o[1]})


def _token(*parts: Any) -> str:
    return hashlib.md5("/".join(str(p) for p in parts).encode()).hexdigest()


def _quat_z(yaw: float) -> List[float]:
    """Quaternion [w, x, y, z] of a rotation by ``yaw`` about +z."""
    return [math.cos(yaw / 2.0), 0.0, 0.0, math.sin(yaw / 2.0)]


def _matrix_to_quat(rot: np.ndarray) -> List[float]:
    """Quaternion [w, x, y, z] of a rotation matrix (Shepperd's method)."""
    m = rot
    tr = float(np.trace(m))
    if tr > 0:
        s = math.sqrt(tr + 1.0) * 2
        q = [0.25 * s, (m[2, 1] - m[1, 2]) / s, (m[0, 2] - m[2, 0]) / s, (m[1, 0] - m[0, 1]) / s]
    elif m[0, 0] > m[1, 1] and m[0, 0] > m[2, 2]:
        s = math.sqrt(1.0 + m[0, 0] - m[1, 1] - m[2, 2]) * 2
        q = [(m[2, 1] - m[1, 2]) / s, 0.25 * s, (m[0, 1] + m[1, 0]) / s, (m[0, 2] + m[2, 0]) / s]
    elif m[1, 1] > m[2, 2]:
        s = math.sqrt(1.0 + m[1, 1] - m[0, 0] - m[2, 2]) * 2
        q = [(m[0, 2] - m[2, 0]) / s, (m[0, 1] + m[1, 0]) / s, 0.25 * s, (m[1, 2] + m[2, 1]) / s]
    else:
        s = math.sqrt(1.0 + m[2, 2] - m[0, 0] - m[1, 1]) * 2
        q = [(m[1, 0] - m[0, 1]) / s, (m[0, 2] + m[2, 0]) / s, (m[1, 2] + m[2, 1]) / s, 0.25 * s]
    q = np.asarray(q, np.float64)
    q /= np.linalg.norm(q)
    return [float(v) for v in (q if q[0] >= 0 else -q)]


def _ego_at(
    t_us: int, t0: int, x0: float, y0: float, yaw0: float, speed: float, yaw_rate: float
) -> tuple:
    """Ego (x, y, yaw) at time ``t_us`` on a circular arc (constant speed and yaw rate)."""
    dt = (t_us - t0) * 1e-6
    yaw = yaw0 + yaw_rate * dt
    if abs(yaw_rate) < 1e-9:
        return x0 + speed * dt * math.cos(yaw0), y0 + speed * dt * math.sin(yaw0), yaw
    r = speed / yaw_rate
    return x0 + r * (math.sin(yaw) - math.sin(yaw0)), y0 - r * (math.cos(yaw) - math.cos(yaw0)), yaw


def _write_json(path: str, obj: Any) -> None:
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=1)


def make_nuscenes_fixture(root: str, seed: int = 0) -> str:
    """Write the fixture database under ``root`` (created); returns ``root``."""
    rng = np.random.default_rng(seed)
    table_dir = os.path.join(root, VERSION)
    os.makedirs(table_dir, exist_ok=True)
    rigs = camera_rigs(WIDTH, HEIGHT)

    tables: Dict[str, List[Dict[str, Any]]] = {
        name: []
        for name in (
            "scene",
            "sample",
            "sample_data",
            "sample_annotation",
            "instance",
            "category",
            "attribute",
            "visibility",
            "sensor",
            "calibrated_sensor",
            "ego_pose",
            "log",
            "map",
        )
    }
    for name in CATEGORIES:
        tables["category"].append(dict(token=_token("cat", name), name=name, description=name))
    for name in ATTRIBUTES:
        tables["attribute"].append(dict(token=_token("attr", name), name=name, description=name))
    for level, desc in enumerate(("v0-40", "v40-60", "v60-80", "v80-100"), start=1):
        tables["visibility"].append(dict(token=str(level), level=desc, description=desc))

    channels = ("LIDAR_TOP",) + tuple(CAMERA_NAMES)
    calib: Dict[str, Dict[str, Any]] = {}
    for ch in channels:
        modality = "lidar" if ch == "LIDAR_TOP" else "camera"
        tables["sensor"].append(dict(token=_token("sensor", ch), channel=ch, modality=modality))
        if ch == "LIDAR_TOP":
            rec = dict(
                translation=list(LIDAR_TRANSLATION),
                rotation=_quat_z(LIDAR_YAW),
                camera_intrinsic=[],
            )
        else:
            cam2vehicle = rigs[ch]["cam2ego"]
            rec = dict(
                translation=[float(v) for v in cam2vehicle[:3, 3]],
                rotation=_matrix_to_quat(cam2vehicle[:3, :3]),
                camera_intrinsic=[[float(v) for v in row] for row in rigs[ch]["intrinsic"]],
            )
        rec = dict(token=_token("calib", ch), sensor_token=_token("sensor", ch), **rec)
        tables["calibrated_sensor"].append(rec)
        calib[ch] = rec

    map_token = _token("map")
    log_tokens = []
    truth: Dict[str, Any] = dict(projections=[], velocities={})
    for s, (scene_name, _split) in enumerate(SCENES):
        log_token = _token("log", scene_name)
        log_tokens.append(log_token)
        tables["log"].append(
            dict(
                token=log_token,
                logfile=f"fixture-{scene_name}",
                vehicle="n008",
                date_captured="2018-08-01",
                location="singapore-onenorth",
            )
        )
        scene_token = _token("scene", scene_name)
        t0 = 1_533_000_000_000_000 + s * 100_000_000
        x0, y0 = rng.uniform(300.0, 700.0, 2)
        yaw0 = rng.uniform(-math.pi, math.pi)
        speed, yaw_rate = rng.uniform(3.0, 6.0), rng.uniform(-0.1, 0.1)

        motion = (t0, x0, y0, yaw0, speed, yaw_rate)

        # objects: start 7-16 m from the ego at t0, constant velocity, no two closer than 3 m
        objects: List[Dict[str, Any]] = []
        for o, (cat, attr, size, (v_min, v_max), first) in enumerate(OBJECTS):
            for _attempt in range(100):
                r, a = rng.uniform(7.0, 16.0), rng.uniform(-math.pi, math.pi)
                pos = np.array([x0 + r * math.cos(a), y0 + r * math.sin(a)])
                if all(np.linalg.norm(pos - p["pos"]) > 3.0 + p["radius"] for p in objects):
                    break
            yaw = rng.uniform(-math.pi, math.pi)
            spd = rng.uniform(v_min, v_max)
            vel = np.array([math.cos(yaw), math.sin(yaw)]) * spd
            w, ln, h = (float(v) * rng.uniform(0.95, 1.05) for v in size)
            inst = _token("inst", scene_name, o)
            objects.append(
                dict(
                    cat=cat,
                    attr=attr,
                    size=[w, ln, h],
                    yaw=yaw,
                    vel=vel,
                    pos=pos,
                    radius=0.5 * math.hypot(w, ln),
                    inst=inst,
                    first=first,
                    anns=[],
                )
            )
            single = first == SAMPLES_PER_SCENE - 1  # one annotation: no velocity estimate
            truth["velocities"][inst] = [math.nan] * 2 if single else [float(v) for v in vel]

        sample_tokens = [_token("sample", scene_name, i) for i in range(SAMPLES_PER_SCENE)]
        prev_sd = {ch: "" for ch in channels}
        sd_records: Dict[str, List[Dict[str, Any]]] = {ch: [] for ch in channels}
        for i, tok in enumerate(sample_tokens):
            t_sample = t0 + i * SAMPLE_DT_US
            tables["sample"].append(
                dict(
                    token=tok,
                    timestamp=t_sample,
                    prev=sample_tokens[i - 1] if i > 0 else "",
                    next=sample_tokens[i + 1] if i + 1 < len(sample_tokens) else "",
                    scene_token=scene_token,
                )
            )
            for c, ch in enumerate(channels):
                t = t_sample + c * CAM_OFFSET_US
                ex, ey, eyaw = _ego_at(t, *motion)
                pose_token = _token("pose", tok, ch)
                tables["ego_pose"].append(
                    dict(
                        token=pose_token,
                        timestamp=t,
                        rotation=_quat_z(eyaw),
                        translation=[ex, ey, 0.0],
                    )
                )
                sd_token = _token("sd", tok, ch)
                if ch == "LIDAR_TOP":
                    rel = f"samples/{ch}/{scene_name}__{ch}__{t}.pcd.bin"
                    height = width = 0
                    fileformat = "pcd"
                else:
                    rel = f"samples/{ch}/{scene_name}__{ch}__{t}.jpg"
                    height, width = HEIGHT, WIDTH
                    fileformat = "jpg"
                rec = dict(
                    token=sd_token,
                    sample_token=tok,
                    ego_pose_token=pose_token,
                    calibrated_sensor_token=calib[ch]["token"],
                    timestamp=t,
                    fileformat=fileformat,
                    is_key_frame=True,
                    height=height,
                    width=width,
                    filename=rel,
                    prev=prev_sd[ch],
                    next="",
                )
                if sd_records[ch]:
                    sd_records[ch][-1]["next"] = sd_token
                prev_sd[ch] = sd_token
                sd_records[ch].append(rec)
                tables["sample_data"].append(rec)

            for o, obj in enumerate(objects):
                if i < obj["first"]:
                    continue
                dt = i * SAMPLE_DT_US * 1e-6
                xy = obj["pos"] + obj["vel"] * dt
                ann_token = _token("ann", tok, o)
                obj["anns"].append(ann_token)
                tables["sample_annotation"].append(
                    dict(
                        token=ann_token,
                        sample_token=tok,
                        instance_token=obj["inst"],
                        visibility_token="4",
                        attribute_tokens=[_token("attr", obj["attr"])] if obj["attr"] else [],
                        translation=[float(xy[0]), float(xy[1]), obj["size"][2] / 2.0],
                        size=list(obj["size"]),
                        rotation=_quat_z(obj["yaw"]),
                        prev=obj["anns"][-2] if len(obj["anns"]) > 1 else "",
                        next="",
                        num_lidar_pts=int(rng.integers(5, 200)),
                        num_radar_pts=int(rng.integers(0, 5)),
                    )
                )
        for obj in objects:
            anns = {
                a["token"]: a
                for a in tables["sample_annotation"]
                if a["instance_token"] == obj["inst"]
            }
            for a_tok, b_tok in zip(obj["anns"][:-1], obj["anns"][1:]):
                anns[a_tok]["next"] = b_tok
            tables["instance"].append(
                dict(
                    token=obj["inst"],
                    category_token=_token("cat", obj["cat"]),
                    nbr_annotations=len(obj["anns"]),
                    first_annotation_token=obj["anns"][0],
                    last_annotation_token=obj["anns"][-1],
                )
            )
        tables["scene"].append(
            dict(
                token=scene_token,
                log_token=log_token,
                nbr_samples=len(sample_tokens),
                first_sample_token=sample_tokens[0],
                last_sample_token=sample_tokens[-1],
                name=scene_name,
                description=f"npudet fixture {scene_name}",
            )
        )
    tables["map"].append(
        dict(
            token=map_token,
            log_tokens=log_tokens,
            category="semantic_prior",
            filename=f"maps/{map_token}.png",
        )
    )

    # files: map mask, lidar points, camera images (with a dot at every box centre)
    os.makedirs(os.path.join(root, "maps"), exist_ok=True)
    cv2.imwrite(os.path.join(root, "maps", f"{map_token}.png"), np.zeros((16, 16), np.uint8))
    poses = {p["token"]: p for p in tables["ego_pose"]}
    anns_of: Dict[str, List[Dict[str, Any]]] = {}
    for ann in tables["sample_annotation"]:
        anns_of.setdefault(ann["sample_token"], []).append(ann)
    for sd in tables["sample_data"]:
        path = os.path.join(root, sd["filename"])
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if sd["fileformat"] == "pcd":
            rng.normal(0.0, 5.0, (32, 5)).astype(np.float32).tofile(path)
            continue
        ch = sd["filename"].split("/")[1]
        cs = calib[ch]
        pose = poses[sd["ego_pose_token"]]
        cam2global = record_matrix(pose) @ record_matrix(cs)
        global2cam = np.linalg.inv(cam2global)
        k = np.asarray(cs["camera_intrinsic"], np.float64)
        img = np.full((HEIGHT, WIDTH, 3), 110, np.uint8)
        img += rng.integers(0, 20, img.shape, dtype=np.uint8)
        for ann in anns_of[sd["sample_token"]]:
            p = global2cam @ np.array([*ann["translation"], 1.0])
            if p[2] <= 0.5:
                continue
            uv = (k @ p[:3])[:2] / p[2]
            if 3 <= uv[0] < WIDTH - 4 and 3 <= uv[1] < HEIGHT - 4:
                truth["projections"].append(
                    dict(
                        sample_token=sd["sample_token"],
                        ann_token=ann["token"],
                        camera=ch,
                        uv=[float(uv[0]), float(uv[1])],
                        depth=float(p[2]),
                    )
                )
                cv2.circle(img, (int(round(uv[0])), int(round(uv[1]))), 3, (40, 40, 220), -1)
        cv2.imwrite(path, img, [cv2.IMWRITE_JPEG_QUALITY, 90])

    for name, rows in tables.items():
        _write_json(os.path.join(table_dir, f"{name}.json"), rows)
    _write_json(os.path.join(root, "fixture_truth.json"), truth)
    return root
