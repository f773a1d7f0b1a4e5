"""Box coder between the contract's 9-float boxes and the head's 10-d regression space."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

CODE_SIZE = 10
# what the (sin, cos) code's angle is measured from: the ego x axis (BEVFormer) or the ray
# from the ego to the box centre (the observation angle of monocular 3D detection)
YAW_FRAMES = ("ego", "ray")


class BEVBoxCoder:
    """(x, y, z, w, l, h, yaw, vx, vy) <-> (u, v, zn, log w, log l, log h, sin, cos, vx, vy).

    u, v, zn are x, y, z normalised to [0, 1] over ``pc_range``; sizes are logs.
    ``yaw_frame='ego'`` codes the yaw itself; ``'ray'`` codes ``yaw - atan2(y, x)``, the
    heading relative to the line of sight from the ego. A camera sees the ray-relative
    heading (a car seen nose-on looks the same in front of the ego as behind it), so that
    code is a function of the object's appearance alone, while the ego yaw is that plus
    the bearing, which the head would have to learn to add.
    """

    def __init__(self, pc_range: Sequence[float], yaw_frame: str = "ego") -> None:
        if yaw_frame not in YAW_FRAMES:
            raise ValueError(f"yaw_frame: expected one of {YAW_FRAMES}, got {yaw_frame!r}")
        self.pc_range = tuple(float(x) for x in pc_range)
        self.yaw_frame = yaw_frame

    def _lo_span(self, ref: Tensor) -> tuple:
        x0, y0, z0, x1, y1, z1 = self.pc_range
        return ref.new_tensor([x0, y0, z0]), ref.new_tensor([x1 - x0, y1 - y0, z1 - z0])

    def _bearing(self, centre: Tensor) -> Tensor:
        """Angle (..., 1) the code's yaw is measured from, for metric centres (..., >=2)."""
        if self.yaw_frame == "ego":
            return centre.new_zeros(centre.shape[:-1] + (1,))
        return torch.atan2(centre[..., 1:2], centre[..., 0:1])

    def encode(self, boxes: Tensor) -> Tensor:
        """boxes (..., 9) -> targets (..., 10)."""
        lo, span = self._lo_span(boxes)
        centre = (boxes[..., :3] - lo) / span
        sizes = boxes[..., 3:6].clamp(min=1e-3).log()
        angle = boxes[..., 6:7] - self._bearing(boxes)
        return torch.cat([centre, sizes, angle.sin(), angle.cos(), boxes[..., 7:9]], -1)

    def decode(self, codes: Tensor) -> Tensor:
        """codes (..., 10) -> boxes (..., 9), yaw in (-pi, pi]."""
        lo, span = self._lo_span(codes)
        centre = codes[..., :3] * span + lo
        sizes = codes[..., 3:6].clamp(max=10.0).exp()
        yaw = torch.atan2(codes[..., 6:7], codes[..., 7:8])
        if self.yaw_frame == "ray":
            yaw = yaw + self._bearing(centre)
            yaw = torch.atan2(yaw.sin(), yaw.cos())
        return torch.cat([centre, sizes, yaw, codes[..., 8:10]], -1)
