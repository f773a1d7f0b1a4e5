"""Box velocity read from the ego-motion-aligned previous BEV around each box."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmdet.models.layers import MLP
from mmengine.model import BaseModule
from torch import Tensor, nn

from .temporal_self_attention import prev_reference_points


class HistoryVelocity(BaseModule):
    """(vx, vy) in m/s of each box from its query and the previous BEV around it.

    The previous BEV, projected to ``dims`` channels, is sampled on a ``window`` x ``window``
    grid of points ``step`` metres apart centred on the box, moved into the previous ego
    frame; an MLP of the query and the samples, in grid order, gives the velocity. An object
    that moved d metres shows up d away from the window's centre, so the readout is
    position-specific, like a convolution over the history, where a weighted mean of
    sampled values (attention) cannot tell where its samples came from.
    """

    def __init__(
        self,
        embed_dims: int,
        pc_range: Sequence[float],
        window: int = 9,
        step: float = 1.0,
        dims: int = 32,
        hidden: int = 128,
        init_cfg=None,
    ) -> None:
        super().__init__(init_cfg)
        if window < 1 or window % 2 == 0:
            raise ValueError(f"window: expected an odd number of points >= 1, got {window}")
        if step <= 0:
            raise ValueError(f"step: expected a spacing in metres > 0, got {step}")
        self.pc_range = tuple(float(x) for x in pc_range)
        x0, y0, _, x1, y1, _ = self.pc_range
        half = (window - 1) / 2 * step
        grid = torch.linspace(-half, half, window)
        dy, dx = torch.meshgrid(grid, grid, indexing="ij")
        # window offsets in normalised (u, v) units, (window * window, 2)
        offsets = torch.stack([dx / (x1 - x0), dy / (y1 - y0)], -1).view(-1, 2)
        self.register_buffer("offsets", offsets, persistent=False)
        self.proj = nn.Linear(embed_dims, dims)
        self.mlp = MLP(embed_dims + window * window * dims, hidden, 2, 2)

    def project(
        self,
        bev: Tensor,
        bev_hw: Tuple[int, int],
        prev_bev: Optional[Tensor] = None,
        prev_valid: Optional[Tensor] = None,
    ) -> Tensor:
        """The map the readout samples, (B, dims, H, W): ``prev_bev`` (B, H * W, C) projected,
        the current ``bev`` (B, H * W, C) standing in without one or where ``prev_valid``
        (B,) is False."""
        history = bev if prev_bev is None else prev_bev
        if prev_bev is not None and prev_valid is not None:
            history = torch.where(prev_valid.view(-1, 1, 1), prev_bev, bev)
        return self.proj(history).transpose(1, 2).reshape(bev.shape[0], -1, *bev_hw)

    def window(
        self,
        centres: Tensor,
        history: Tensor,
        cur2prev: Optional[Tensor] = None,
        prev_valid: Optional[Tensor] = None,
    ) -> Tensor:
        """``history`` (B, dims, H, W) from :meth:`project` on each centre's window: centres
        (B, M, 2) normalised (u, v) in the current frame, ``cur2prev`` (B, 4, 4) the ego motion
        (``ego_motion``); without it (or where ``prev_valid`` (B,) is False) it is read at the
        current positions.
        Returns (B, M, window * window, dims), points in row-major (y, x) order."""
        b, m, _ = centres.shape
        k = self.offsets.shape[0]
        pts = (centres.detach()[:, :, None] + self.offsets.to(centres)).view(b, m * k, 2)
        if cur2prev is not None:
            pts = prev_reference_points(pts, cur2prev, self.pc_range, prev_valid)
        samples = F.grid_sample(history, pts[:, :, None] * 2 - 1, align_corners=False)
        return samples.view(b, -1, m, k).permute(0, 2, 3, 1)

    def forward(
        self, query: Tensor, centres: Tensor, history: Tensor, *motion: Optional[Tensor]
    ) -> Tensor:
        """query (B, M, C) and the arguments of :meth:`window` (``motion``: cur2prev,
        prev_valid) -> velocity (B, M, 2)."""
        samples = self.window(centres, history, *motion)
        return self.mlp(torch.cat([query, samples.flatten(2)], -1))
