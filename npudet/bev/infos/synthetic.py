"""Built-in multi-camera BEV data: deterministic driving scenes rendered with numpy + cv2.

Six nuScenes-like cameras look out from an ego vehicle that drives forward with slight turns.
Objects (car, truck, pedestrian) stand on the ground, some move; each camera image shows the
boxes' visible faces (shaded, class-coloured with a lighter front, :mod:`.box_paint`, painter's
order) over sky and a textured ground
plane fixed in the global frame, so it moves with ego motion. Writes the ``npudet-bev-v2``
info files described in :mod:`npudet.bev.infos.schema`: boxes (x, y, z, w, l, h, yaw, vx, vy)
in each frame's ego frame, velocity being the object's absolute velocity rotated into the ego
frame (the nuScenes convention, not relative to the ego); boxes beyond 30 m are dropped. Each
box's nuScenes attribute follows from its class and true speed (``attribute_from_velocity``:
vehicle.moving / vehicle.parked for cars and trucks, pedestrian.moving / pedestrian.standing).
"""

from __future__ import annotations

import math
import multiprocessing
import os
import shutil
from typing import Any, Dict, List, Sequence, Tuple

import cv2
import numpy as np

from npudet.utils.json_io import recorded_settings_match, write_json_atomic

from .attributes import attribute_from_velocity
from .box_paint import FRONT_FRACTION, box_faces, front_colour
from .schema import VERSION

CLASSES: Tuple[str, ...] = ("car", "truck", "pedestrian")
# (name, yaw in degrees CCW from ego +x, pitch down in degrees)
CAMERAS: Tuple[Tuple[str, float, float], ...] = (
    ("CAM_FRONT", 0.0, 2.0),
    ("CAM_FRONT_RIGHT", -55.0, 3.0),
    ("CAM_FRONT_LEFT", 55.0, 3.0),
    ("CAM_BACK", 180.0, 2.0),
    ("CAM_BACK_LEFT", 110.0, 3.0),
    ("CAM_BACK_RIGHT", -110.0, 3.0),
)
CAMERA_NAMES: Tuple[str, ...] = tuple(c[0] for c in CAMERAS)
CAM_HEIGHT = 1.6
CAM_OFFSET = 1.0
HFOV_DEG = 70.0
FRAME_DT = 0.5
MAX_RANGE = 30.0
PLACE_RANGE = 25.0
# mean (w, l, h) in metres, nuScenes wlh order
CLASS_SIZES: Dict[str, Tuple[float, float, float]] = {
    "car": (1.9, 4.6, 1.7),
    "truck": (2.5, 7.5, 3.2),
    "pedestrian": (0.7, 0.7, 1.75),
}
CLASS_PROBS = (0.55, 0.2, 0.25)
# (probability of moving, min speed, max speed) in m/s
CLASS_MOTION: Dict[str, Tuple[float, float, float]] = {
    "car": (0.5, 2.0, 8.0),
    "truck": (0.3, 2.0, 6.0),
    "pedestrian": (0.5, 0.5, 1.5),
}
# BGR, saturated so they stand out from the grey/green ground and blue sky
CLASS_COLOURS: Dict[str, Tuple[int, int, int]] = {
    "car": (40, 40, 220),
    "truck": (20, 200, 230),
    "pedestrian": (210, 50, 200),
}
SPLITS: Tuple[str, ...] = ("train", "val")
# the built-in set's defaults (the CLI's too); a camera reads range from where an object meets
# the ground, and at 20 m a pixel row of a 320x192 camera is ~1 m of range (160x96: ~2 m)
NUM_SCENES_TRAIN, NUM_SCENES_VAL, FRAMES_PER_SCENE = 128, 4, 8
WIDTH, HEIGHT = 320, 192
# the look of the rendered images, recorded in meta.json so a set rendered by an older renderer
# is regenerated: 1 one colour per box, 2 the front painted lighter (heading visible)
RENDER_VERSION = 2
_LIGHT = np.array([0.4, 0.6, 1.0]) / np.linalg.norm([0.4, 0.6, 1.0])


def _rot_z(yaw: float) -> np.ndarray:
    c, s = math.cos(yaw), math.sin(yaw)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def camera_rigs(width: int, height: int) -> Dict[str, Dict[str, np.ndarray]]:
    """Per camera ``cam2ego`` (4, 4) and ``intrinsic`` (3, 3), OpenCV camera axes."""
    fx = (width / 2.0) / math.tan(math.radians(HFOV_DEG) / 2.0)
    k = np.array([[fx, 0.0, width / 2.0], [0.0, fx, height / 2.0], [0.0, 0.0, 1.0]])
    rigs = {}
    for name, yaw_deg, pitch_deg in CAMERAS:
        yaw, pitch = math.radians(yaw_deg), math.radians(pitch_deg)
        fwd = np.array(
            [math.cos(yaw) * math.cos(pitch), math.sin(yaw) * math.cos(pitch), -math.sin(pitch)]
        )
        right = np.array([math.sin(yaw), -math.cos(yaw), 0.0])
        down = np.cross(fwd, right)
        cam2ego = np.eye(4)
        cam2ego[:3, :3] = np.stack([right, down, fwd], axis=1)
        cam2ego[:3, 3] = [CAM_OFFSET * math.cos(yaw), CAM_OFFSET * math.sin(yaw), CAM_HEIGHT]
        rigs[name] = dict(cam2ego=cam2ego, intrinsic=k.copy())
    return rigs


def box_corners(box: Sequence[float]) -> np.ndarray:
    """Corners (8, 3) of a box (x, y, z, w, l, h, yaw, ...): bottom 0-3 then top 4-7, CCW."""
    x, y, z, w, ln, h, yaw = (float(v) for v in box[:7])
    dx = np.array([1, -1, -1, 1]) * ln / 2.0
    dy = np.array([1, 1, -1, -1]) * w / 2.0
    base = np.stack([dx, dy], axis=1) @ _rot_z(yaw)[:2, :2].T + [x, y]
    bottom = np.concatenate([base, np.full((4, 1), z - h / 2.0)], axis=1)
    top = np.concatenate([base, np.full((4, 1), z + h / 2.0)], axis=1)
    return np.concatenate([bottom, top], axis=0)


def _clip_near(poly: np.ndarray, near: float = 0.1) -> np.ndarray:
    """Clip a polygon (M, 3) in camera coordinates to z > near (Sutherland-Hodgman)."""
    out = []
    for i in range(len(poly)):
        a, b = poly[i], poly[(i + 1) % len(poly)]
        a_in, b_in = a[2] > near, b[2] > near
        if a_in:
            out.append(a)
        if a_in != b_in:
            t = (near - a[2]) / (b[2] - a[2])
            out.append(a + t * (b - a))
    return np.array(out).reshape(-1, 3)


def _render_background(
    rig: Dict[str, np.ndarray], ego2global: np.ndarray, width: int, height: int, texture_seed: int
) -> np.ndarray:
    """Sky + ground plane textured in global coordinates, (H, W, 3) float32 BGR."""
    u, v = np.meshgrid(np.arange(width) + 0.5, np.arange(height) + 0.5)
    pix = np.stack([u, v, np.ones_like(u)], axis=-1).reshape(-1, 3)
    rays_cam = pix @ np.linalg.inv(rig["intrinsic"]).T
    rays_ego = rays_cam @ rig["cam2ego"][:3, :3].T
    origin = rig["cam2ego"][:3, 3]
    dz = rays_ego[:, 2]
    with np.errstate(divide="ignore", invalid="ignore"):
        t = np.where(dz < -1e-6, -origin[2] / dz, np.inf)
    dist = t * np.linalg.norm(rays_ego[:, :2], axis=1)
    ground = np.isfinite(t) & (dist < 120.0)
    img = np.empty((pix.shape[0], 3), np.float32)
    # sky: light blue gradient towards the horizon
    elev = np.clip(dz / np.linalg.norm(rays_ego, axis=1), -0.2, 1.0)
    sky_top, sky_hor = np.array([230, 170, 110.0]), np.array([235, 215, 200.0])
    mix = np.clip(elev * 3.0, 0.0, 1.0)[:, None]
    img[:] = sky_hor * (1 - mix) + sky_top * mix
    if ground.any():
        pts = origin + t[ground, None] * rays_ego[ground]
        g = pts @ ego2global[:3, :3].T + ego2global[:3, 3]
        gx, gy = g[:, 0], g[:, 1]
        # 2 m checker + per-4 m cell tone from a hash, plus 0.15 m grid lines every 4 m
        checker = (np.floor(gx / 2.0) + np.floor(gy / 2.0)) % 2
        cx, cy = np.floor(gx / 4.0), np.floor(gy / 4.0)
        h = np.sin(cx * 12.9898 + cy * 78.233 + texture_seed * 0.618) * 43758.5453
        tone = (h - np.floor(h)) - 0.5
        line = (np.abs(gx / 4.0 - np.round(gx / 4.0)) < 0.04) | (
            np.abs(gy / 4.0 - np.round(gy / 4.0)) < 0.04
        )
        base = np.array([95, 125, 105.0])
        col = base + (checker * 22.0 + tone * 30.0)[:, None] + line[:, None] * 55.0
        # distance haze fades the texture into the horizon colour (limits aliasing)
        fade = np.clip((dist[ground] - 20.0) / 80.0, 0.0, 1.0)[:, None]
        haze = np.array([170, 175, 170.0])
        img[ground] = col * (1 - fade) + haze * fade
    return img.reshape(height, width, 3)


def render_camera(
    rig: Dict[str, np.ndarray],
    ego2global: np.ndarray,
    boxes_ego: np.ndarray,
    classes: Sequence[int],
    shades: Sequence[float],
    width: int,
    height: int,
    rng: np.random.Generator | None = None,
    texture_seed: int = 0,
) -> np.ndarray:
    """Render one camera view (H, W, 3) uint8 BGR; ``boxes_ego`` (N, >=7) in the ego frame."""
    img = np.clip(_render_background(rig, ego2global, width, height, texture_seed), 0, 255)
    img = img.astype(np.uint8)
    ego2cam = np.linalg.inv(rig["cam2ego"])
    cam_pos = rig["cam2ego"][:3, 3]
    k = rig["intrinsic"]
    order = np.argsort(
        [-np.linalg.norm(np.asarray(b[:3]) - cam_pos) for b in boxes_ego], kind="stable"
    )
    for i in order:
        name = CLASSES[classes[i]]
        corners = box_corners(boxes_ego[i]) @ ego2cam[:3, :3].T + ego2cam[:3, 3]
        if (corners[:, 2] <= 0.1).all():
            continue  # wholly behind the camera
        body = np.array(CLASS_COLOURS[name], np.float64) * shades[i]
        front = front_colour(CLASS_COLOURS[name]) * shades[i]
        for face in box_faces(boxes_ego[i], FRONT_FRACTION[name]):
            if np.dot(face.normal, face.corners.mean(axis=0) - cam_pos) >= 0:
                continue  # back face
            poly = _clip_near(face.corners @ ego2cam[:3, :3].T + ego2cam[:3, 3])
            if len(poly) < 3:
                continue
            uv = poly @ k.T
            uv = np.clip(uv[:, :2] / uv[:, 2:3], -1e5, 1e5)
            light = 0.5 + 0.5 * max(0.0, float(np.dot(face.normal, _LIGHT)))
            colour = (front if face.front else body) * light
            fill = tuple(int(c) for c in np.clip(colour, 0, 255))
            cv2.fillPoly(img, [np.round(uv * 16).astype(np.int32)], fill, cv2.LINE_AA, shift=4)
    if rng is not None:
        noisy = img.astype(np.float32) + rng.normal(0.0, 3.0, img.shape).astype(np.float32)
        img = np.clip(noisy, 0, 255).astype(np.uint8)
    return img


def _ego_trajectory(rng: np.random.Generator, frames: int) -> np.ndarray:
    """Ego poses (frames, 3): global x, y, yaw; forward at 2-6 m/s with a gentle yaw rate."""
    x, y = rng.uniform(-200.0, 200.0, 2)
    yaw = rng.uniform(-math.pi, math.pi)
    speed = rng.uniform(2.0, 6.0)
    yaw_rate = rng.uniform(-0.08, 0.08)
    poses = []
    for _ in range(frames):
        poses.append((x, y, yaw))
        yaw += yaw_rate * FRAME_DT
        x += speed * FRAME_DT * math.cos(yaw)
        y += speed * FRAME_DT * math.sin(yaw)
        yaw_rate = float(np.clip(yaw_rate + rng.normal(0.0, 0.02), -0.12, 0.12))
    return np.array(poses)


def _place_objects(
    rng: np.random.Generator, ego: np.ndarray, attempts: int
) -> List[Dict[str, Any]]:
    """Objects in the global frame, non-overlapping in BEV (and with the ego) in every frame."""
    frames = len(ego)
    steps = np.arange(frames) * FRAME_DT
    objects: List[Dict[str, Any]] = []
    for _ in range(attempts):
        cls = int(rng.choice(len(CLASSES), p=CLASS_PROBS))
        name = CLASSES[cls]
        w, ln, h = (s * rng.uniform(0.9, 1.1) for s in CLASS_SIZES[name])
        anchor = ego[int(rng.integers(frames))]
        r = math.sqrt(rng.uniform(0.0, 1.0)) * PLACE_RANGE
        a = rng.uniform(-math.pi, math.pi)
        x0, y0 = anchor[0] + r * math.cos(a), anchor[1] + r * math.sin(a)
        # vehicles mostly aligned with the ego heading (same or opposite lane direction)
        if name == "pedestrian":
            yaw = rng.uniform(-math.pi, math.pi)
        else:
            yaw = anchor[2] + (0.0 if rng.random() < 0.6 else math.pi) + rng.normal(0.0, 0.3)
        p_move, s_min, s_max = CLASS_MOTION[name]
        speed = rng.uniform(s_min, s_max) if rng.random() < p_move else 0.0
        vel = np.array([math.cos(yaw), math.sin(yaw)]) * speed
        track = np.array([x0, y0]) + steps[:, None] * vel  # (frames, 2)
        radius = 0.5 * math.hypot(w, ln)
        if np.min(np.linalg.norm(track - ego[:, :2], axis=1)) < radius + 3.0:
            continue
        if any(
            np.min(np.linalg.norm(track - o["track"], axis=1)) < radius + o["radius"] + 0.3
            for o in objects
        ):
            continue
        objects.append(
            dict(
                cls=cls,
                size=(w, ln, h),
                yaw=yaw,
                vel=vel,
                track=track,
                radius=radius,
                shade=float(rng.uniform(0.85, 1.0)),
            )
        )
    return objects


def _pose_matrix(x: float, y: float, yaw: float) -> np.ndarray:
    m = np.eye(4)
    m[:3, :3] = _rot_z(yaw)
    m[:2, 3] = [x, y]
    return m


def _wrap(angle: float) -> float:
    return (angle + math.pi) % (2 * math.pi) - math.pi


def _r(values: Any) -> Any:
    return np.round(np.asarray(values, np.float64), 6).tolist()


def _write_scene(
    root: str, split: str, s: int, frames_per_scene: int, seed: int, width: int, height: int
) -> List[Dict[str, Any]]:
    """Render scene ``s`` of one split (its own RNG); returns its data_list entries."""
    rigs = camera_rigs(width, height)
    split_id = SPLITS.index(split)
    data_list: List[Dict[str, Any]] = []
    rng = np.random.default_rng([seed, split_id, s])
    scene = f"{split}_{s:04d}"
    ego = _ego_trajectory(rng, frames_per_scene)
    objects = _place_objects(rng, ego, attempts=int(rng.integers(8, 20)))
    texture_seed = int(rng.integers(1000))
    for f in range(frames_per_scene):
        ego2global = _pose_matrix(*ego[f])
        global2ego = np.linalg.inv(ego2global)
        ego_yaw = ego[f, 2]
        boxes, labels, attrs, shades = [], [], [], []
        for o in objects:
            gx, gy = o["track"][f]
            p = global2ego @ np.array([gx, gy, 0.0, 1.0])
            if math.hypot(p[0], p[1]) > MAX_RANGE:
                continue
            v = _rot_z(-ego_yaw)[:2, :2] @ o["vel"]
            w, ln, h = o["size"]
            boxes.append([p[0], p[1], h / 2.0, w, ln, h, _wrap(o["yaw"] - ego_yaw), v[0], v[1]])
            labels.append(o["cls"])
            attrs.append(attribute_from_velocity(CLASSES[o["cls"]], *o["vel"]))
            shades.append(o["shade"])
        boxes_arr = np.array(boxes, np.float64).reshape(-1, 9)
        cams = {}
        for name in CAMERA_NAMES:
            rel = f"images/{scene}/{name}/{f:03d}.jpg"
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            img = render_camera(
                rigs[name],
                ego2global,
                boxes_arr,
                labels,
                shades,
                width,
                height,
                rng,
                texture_seed,
            )
            cv2.imwrite(path, img, [cv2.IMWRITE_JPEG_QUALITY, 92])
            cams[name] = dict(
                img_path=rel,
                cam2ego=_r(rigs[name]["cam2ego"]),
                intrinsic=_r(rigs[name]["intrinsic"]),
                width=width,
                height=height,
            )
        idx = s * frames_per_scene + f  # scenes are joined in order, each whole
        data_list.append(
            dict(
                sample_idx=idx,
                token=f"{scene}_{f:03d}",
                scene=scene,
                frame=f,
                timestamp=round(s * 1000.0 + f * FRAME_DT, 6),
                prev=idx - 1 if f > 0 else -1,
                ego2global=_r(ego2global),
                ego_pose_translation=_r(ego2global[:3, 3]),
                cams=cams,
                gt_boxes=_r(boxes_arr),
                gt_labels=[int(c) for c in labels],
                gt_attrs=attrs,
            )
        )
    return data_list


def write_split(
    root: str,
    split: str,
    num_scenes: int,
    frames_per_scene: int,
    seed: int,
    width: int,
    height: int,
    workers: int = 1,
) -> str:
    """Render ``num_scenes`` scenes of one split; returns the path of ``infos_<split>.json``.

    ``workers`` > 1 renders scenes in that many processes; every scene has its own RNG, so
    the files are the same as with one.
    """
    args = [(root, split, s, frames_per_scene, seed, width, height) for s in range(num_scenes)]
    if workers > 1:
        with multiprocessing.get_context("fork").Pool(workers) as pool:
            scenes = pool.starmap(_write_scene, args, chunksize=1)
    else:
        scenes = [_write_scene(*a) for a in args]
    data_list = [entry for scene in scenes for entry in scene]
    metainfo = dict(
        version=VERSION, classes=list(CLASSES), cameras=list(CAMERA_NAMES), source="synthetic"
    )
    info_file = os.path.join(root, f"infos_{split}.json")
    return write_json_atomic(info_file, dict(metainfo=metainfo, data_list=data_list))


def make_bev_dataset(
    root: str,
    num_scenes_train: int = NUM_SCENES_TRAIN,
    num_scenes_val: int = NUM_SCENES_VAL,
    frames_per_scene: int = FRAMES_PER_SCENE,
    seed: int = 0,
    width: int = WIDTH,
    height: int = HEIGHT,
    force: bool = False,
    workers: int = 1,
) -> Dict[str, Any]:
    """Generate the synthetic BEV set under ``root`` unless present with the same settings.

    Returns ``dict(root, train, val, meta, written)`` (paths; ``written`` is True if
    files were rendered). ``meta.json`` records the settings and is written last, so an
    interrupted run is redone; a set generated with other settings (its ``images/``) is
    replaced.
    """
    settings = dict(
        version=VERSION,
        render_version=RENDER_VERSION,
        num_scenes_train=num_scenes_train,
        num_scenes_val=num_scenes_val,
        frames_per_scene=frames_per_scene,
        seed=seed,
        width=width,
        height=height,
        classes=list(CLASSES),
    )
    meta_file = os.path.join(root, "meta.json")
    paths: Dict[str, Any] = dict(
        root=root,
        train=os.path.join(root, "infos_train.json"),
        val=os.path.join(root, "infos_val.json"),
        meta=meta_file,
        written=False,
    )
    done = all(os.path.isfile(paths[s]) for s in SPLITS)
    if not force and done and recorded_settings_match(meta_file, settings):
        return paths
    os.makedirs(root, exist_ok=True)
    if os.path.isfile(meta_file):
        # our own set with other settings: drop it so no stale scenes are left behind
        os.remove(meta_file)
        shutil.rmtree(os.path.join(root, "images"), ignore_errors=True)
    for split, count in zip(SPLITS, (num_scenes_train, num_scenes_val)):
        write_split(root, split, count, frames_per_scene, seed, width, height, workers)
    write_json_atomic(meta_file, settings)
    paths["written"] = True
    return paths
