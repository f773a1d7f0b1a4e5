"""Box coder between the contract's 9-float boxes and the head's 10-d regression space."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor

CODE_SIZE = 10


class BEVBoxCoder:
    """(x, y, z, w, l, h, yaw, vx, vy) <-> (u, v, zn, log w, log l, log h, sin, cos, vx, vy).

    u, v, zn are x, y, z normalised to [0, 1] over ``pc_range``; sizes are logs.
    """

    def __init__(self, pc_range: Sequence[float]) -> None:
        self.pc_range = tuple(float(x) for x in pc_range)

    def _lo_span(self, ref: Tensor) -> tuple:
        x0, y0, z0, x1, y1, z1 = self.pc_range
        return ref.new_tensor([x0, y0, z0]), ref.new_tensor([x1 - x0, y1 - y0, z1 - z0])

    def encode(self, boxes: Tensor) -> Tensor:
        """boxes (..., 9) -> targets (..., 10)."""
        lo, span = self._lo_span(boxes)
        centre = (boxes[..., :3] - lo) / span
        sizes = boxes[..., 3:6].clamp(min=1e-3).log()
        yaw = boxes[..., 6:7]
        return torch.cat([centre, sizes, yaw.sin(), yaw.cos(), boxes[..., 7:9]], -1)

    def decode(self, codes: Tensor) -> Tensor:
        """codes (..., 10) -> boxes (..., 9)."""
        lo, span = self._lo_span(codes)
        centre = codes[..., :3] * span + lo
        sizes = codes[..., 3:6].clamp(max=10.0).exp()
        yaw = torch.atan2(codes[..., 6:7], codes[..., 7:8])
        return torch.cat([centre, sizes, yaw, codes[..., 8:10]], -1)
