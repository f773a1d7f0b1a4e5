"""BEV box coder: round trip, and a heading code a camera can read from appearance alone."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from npudet.bev.infos.box_paint import front_colour
from npudet.bev.infos.synthetic import (
    CAMERAS,
    CLASS_COLOURS,
    CLASS_SIZES,
    CLASSES,
    camera_rigs,
    render_camera,
)
from npudet.bev.models.box_coder import YAW_FRAMES, BEVBoxCoder

PC_RANGE = (-25.0, -25.0, -2.0, 25.0, 25.0, 4.0)
W, H = 320, 192


def _boxes(n: int, seed: int = 0) -> torch.Tensor:
    """Random boxes (n, 9) within PC_RANGE, every heading and bearing."""
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(n, 2, generator=g) * 44.0 - 22.0
    z = torch.rand(n, 1, generator=g) * 4.0 - 1.0
    wlh = torch.rand(n, 3, generator=g) * 4.0 + 0.5
    yaw = torch.rand(n, 1, generator=g) * 2 * math.pi - math.pi
    vel = torch.randn(n, 2, generator=g)
    return torch.cat([xy, z, wlh, yaw, vel], 1)


@pytest.mark.parametrize("frame", YAW_FRAMES)
def test_round_trip(frame: str) -> None:
    coder = BEVBoxCoder(PC_RANGE, frame)
    boxes = _boxes(200)
    back = coder.decode(coder.encode(boxes))
    dyaw = torch.atan2((back[:, 6] - boxes[:, 6]).sin(), (back[:, 6] - boxes[:, 6]).cos())
    assert dyaw.abs().max() < 1e-5
    assert (back[:, 6].abs() <= math.pi + 1e-6).all()
    keep = [0, 1, 2, 3, 4, 5, 7, 8]
    assert torch.allclose(back[:, keep], boxes[:, keep], atol=1e-4)


def test_bad_yaw_frame() -> None:
    with pytest.raises(ValueError, match="yaw_frame"):
        BEVBoxCoder(PC_RANGE, "lidar")


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


@pytest.mark.parametrize("name", CLASSES)
def test_ray_code_is_what_each_camera_sees(name: str) -> None:
    """One object 12 m out along each camera's axis, nose towards the ego.

    Every camera shows its painted front (the renderer's front is the box's local +x, the
    yaw direction), the same view in all six: the ray-relative code is the same, (0, -1),
    for all of them, so the head can read it off the image. The ego-frame code of the same
    views spans the circle: the head would have to add each camera's bearing.
    """
    rigs = camera_rigs(W, H)
    coder_ray, coder_ego = BEVBoxCoder(PC_RANGE, "ray"), BEVBoxCoder(PC_RANGE, "ego")
    w, ln, h = CLASS_SIZES[name]
    body = np.asarray(CLASS_COLOURS[name], np.float64)
    ray_codes, ego_codes = [], []
    for cam, yaw_deg, _ in CAMERAS:
        bearing = math.radians(yaw_deg)
        x, y = 12.0 * math.cos(bearing), 12.0 * math.sin(bearing)
        box = [x, y, h / 2, w, ln, h, bearing + math.pi, 0.0, 0.0]
        img = render_camera(
            rigs[cam], np.eye(4), np.array([box]), [CLASSES.index(name)], [1.0], W, H
        )
        k, ego2cam = rigs[cam]["intrinsic"], np.linalg.inv(rigs[cam]["cam2ego"])
        p = k @ (ego2cam[:3, :3] @ np.array([x, y, h / 2]) + ego2cam[:3, 3])
        u, v = int(p[0] / p[2]), int(p[1] / p[2])
        pixel = img[v - 1 : v + 2, u - 1 : u + 2].reshape(-1, 3).astype(np.float64).mean(0)
        assert _cosine(pixel, front_colour(body)) > _cosine(pixel, body), (cam, pixel)
        code = torch.tensor([box], dtype=torch.float32)
        ray_codes.append(coder_ray.encode(code)[0, 6:8])
        ego_codes.append(coder_ego.encode(code)[0, 6:8])
    ray, ego = torch.stack(ray_codes), torch.stack(ego_codes)
    assert torch.allclose(ray, torch.tensor([0.0, -1.0]).expand_as(ray), atol=1e-5)
    assert (ego - ego[:1]).norm(dim=1).max() > 1.5
