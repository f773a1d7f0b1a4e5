"""Where a 3D box's lines fall: in a camera image (projected, clipped) and on the BEV plane.

Boxes are the BEV detector's 9 floats (x, y, z gravity centre, w, l, h, yaw, vx, vy) in the ego
frame (x forward, y left, z up); local +x of a box (its length) is its heading. Cameras are the
dataset's ``lidar2img = K @ inv(cam2ego)`` (4, 4) matrices.
"""

from __future__ import annotations

from typing import Tuple

import numpy as np

from npudet.bev.infos.synthetic import box_corners

# corner indices of box_corners(): bottom 0-3, top 4-7; 0, 3, 4, 7 are the front face
BOX_EDGES = ((0, 1), (1, 2), (2, 3), (3, 0), (4, 5), (5, 6), (6, 7), (7, 4)) + tuple(
    (i, i + 4) for i in range(4)
)
# the front face's diagonals: a cross that shows the heading in a camera image
FRONT_CROSS = ((0, 7), (3, 4))
NEAR = 0.1  # metres in front of the camera below which a line is cut


def corners(boxes: np.ndarray) -> np.ndarray:
    """boxes (N, >=7) -> corners (N, 8, 3): bottom 0-3 then top 4-7, front-left first."""
    return np.stack([box_corners(b) for b in np.asarray(boxes, np.float64)])


def box_segments(boxes: np.ndarray) -> np.ndarray:
    """The 12 edges and the front cross of every box: (N * 14, 2, 3) end points (ego frame)."""
    c = corners(boxes) if len(boxes) else np.zeros((0, 8, 3))
    pairs = np.array(BOX_EDGES + FRONT_CROSS)
    return c[:, pairs].reshape(-1, 2, 3)


def project_segments(
    segments: np.ndarray, lidar2img: np.ndarray, img_hw: Tuple[int, int]
) -> Tuple[np.ndarray, np.ndarray]:
    """Segments (M, 2, 3) in the ego frame -> their visible parts in one camera, (K, 2, 2) (u, v),
    and the index (K,) of each one's segment.

    Each segment is cut to the part in front of the camera (depth >= NEAR) and inside the
    image. Both are half-spaces linear in the homogeneous image point ``lidar2img @ (p, 1) =
    (u d, v d, d, 1)``, which is itself linear along the segment, so cutting at the
    interpolation parameter where each becomes negative is exact (Liang-Barsky).
    """
    h, w = img_hw
    ends = np.concatenate([segments, np.ones(segments.shape[:2] + (1,))], axis=-1)
    q = ends @ np.asarray(lidar2img, np.float64).T  # (M, 2, 4)
    # a . q >= 0 for: d >= NEAR, u >= 0, u <= w, v >= 0, v <= h
    planes = np.array(
        [[0, 0, 1, -NEAR], [1, 0, 0, 0], [-1, 0, w, 0], [0, 1, 0, 0], [0, -1, h, 0]], np.float64
    )
    fa, fb = q[:, 0] @ planes.T, q[:, 1] @ planes.T  # (M, 5)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = fa / (fa - fb)
    t0 = np.where((fa < 0) & (fb >= 0), t, 0.0).max(axis=1)
    t1 = np.where((fa >= 0) & (fb < 0), t, 1.0).min(axis=1)
    keep = ~((fa < 0) & (fb < 0)).any(axis=1) & (t0 < t1)
    a, b, t0, t1 = q[keep, 0], q[keep, 1], t0[keep, None], t1[keep, None]
    cut = np.stack([a + t0 * (b - a), a + t1 * (b - a)], axis=1)
    return cut[..., :2] / cut[..., 2:3], np.flatnonzero(keep)


def bev_pixels(xy: np.ndarray, half_range: float, size: int) -> np.ndarray:
    """Ego-frame (..., 2) x, y in metres -> (..., 2) (column, row) on a ``size`` pixel BEV image
    centred on the ego, ``half_range`` metres from the centre to each edge, x (forward) up and
    y (left) to the left."""
    xy = np.asarray(xy, np.float64)
    scale = size / (2.0 * half_range)
    return np.stack([size / 2.0 - xy[..., 1] * scale, size / 2.0 - xy[..., 0] * scale], axis=-1)
