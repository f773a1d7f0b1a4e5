"""The painted surface of a generated box: body faces plus a lighter front, so heading is visible.

A box painted one colour on every face looks the same from the front and from the back, which
leaves its heading ambiguous by pi (the small BEV detector stayed at mAOE ~1.27 rad). Here the
front face (local +x, the heading direction) and the front part of the side and top faces are
painted in the class colour blended towards white: from ahead the whole visible face is light,
from behind none of it is, and from the side the light end says which way the object faces.
The blend keeps the class hue, and the change is in saturation, which the per-face lighting (a
brightness scale) does not mimic.
"""

from __future__ import annotations

import math
from typing import Dict, List, NamedTuple, Sequence, Tuple

import numpy as np

# share of the length painted as "front" on the side and top faces: a vehicle's bonnet and
# windshield, a pedestrian's front half (0.35 m, ~4 px at 20 m on a 320-wide camera)
FRONT_FRACTION: Dict[str, float] = {"car": 0.25, "truck": 0.25, "pedestrian": 0.5}
# how far the front colour is blended towards white
FRONT_LIGHTEN = 0.6


class Face(NamedTuple):
    """One planar quad of a box's surface in the box's frame's parent (ego) coordinates."""

    corners: np.ndarray  # (4, 3), cyclic order
    normal: np.ndarray  # (3,), outward unit normal
    front: bool  # painted in the front colour


def front_colour(colour: Sequence[float]) -> np.ndarray:
    """The front's BGR colour (3,) for a body colour: the same hue, lighter and less saturated."""
    c = np.asarray(colour, np.float64)
    return c * (1.0 - FRONT_LIGHTEN) + 255.0 * FRONT_LIGHTEN


def _quad(axis: int, value: float, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    """Local corners (4, 3) of the axis-aligned rectangle at ``axis = value`` spanning lo..hi."""
    b, c = [a for a in range(3) if a != axis]
    pts = np.zeros((4, 3))
    pts[:, axis] = value
    pts[:, b] = [lo[b], hi[b], hi[b], lo[b]]
    pts[:, c] = [lo[c], lo[c], hi[c], hi[c]]
    return pts


def box_faces(box: Sequence[float], front_fraction: float) -> List[Face]:
    """The faces of a box (x, y, z, w, l, h, yaw, ...), the front marked; 9 quads.

    The side (+-y) and top (+z) faces are split at ``front_fraction`` of the length from the
    front, so every quad is planar and those of one box never overlap on screen once back
    faces are culled (the box is convex), whatever order they are drawn in.
    """
    x, y, z, w, ln, h, yaw = (float(v) for v in box[:7])
    half = np.array([ln / 2.0, w / 2.0, h / 2.0])
    split = half[0] - front_fraction * ln  # local x where the front part starts
    c, s = math.cos(yaw), math.sin(yaw)
    rot = np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])
    centre = np.array([x, y, z])
    local: List[Tuple[np.ndarray, np.ndarray, bool]] = []
    for axis, sign in ((0, 1.0), (0, -1.0), (2, -1.0)):  # front, back, bottom: whole faces
        normal = np.eye(3)[axis] * sign
        local.append((_quad(axis, sign * half[axis], -half, half), normal, axis == 0 and sign > 0))
    rear_hi = np.array([split, half[1], half[2]])
    front_lo = np.array([split, -half[1], -half[2]])
    for axis, sign in ((1, 1.0), (1, -1.0), (2, 1.0)):  # sides and top: rear part + front part
        normal = np.eye(3)[axis] * sign
        local.append((_quad(axis, sign * half[axis], -half, rear_hi), normal, False))
        local.append((_quad(axis, sign * half[axis], front_lo, half), normal, True))
    return [Face(q @ rot.T + centre, n @ rot.T, f) for q, n, f in local]
