"""Temporal self-attention: current BEV queries attend to [previous BEV, current BEV]."""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor, nn

from npudet.nn import DeformableAttention
from npudet.ops.msda import check_impl_name

from .levels import msda_levels


def bev_reference_points(bev_h: int, bev_w: int, device: torch.device) -> Tensor:
    """Normalised (u, v) centres of the BEV cells, (bev_h * bev_w, 2); u along x, v along y."""
    u = (torch.arange(bev_w, device=device, dtype=torch.float32) + 0.5) / bev_w
    v = (torch.arange(bev_h, device=device, dtype=torch.float32) + 0.5) / bev_h
    vv, uu = torch.meshgrid(v, u, indexing="ij")
    return torch.stack([uu, vv], -1).view(-1, 2)


def ego_motion(ego2global_cur: Tensor, ego2global_prev: Tensor) -> Tensor:
    """The current ego frame in the previous one, ``inv(ego2global_prev) @ ego2global_cur``:
    (B, 4, 4) float64 from the two poses (B, 4, 4), solved in float64 (global positions are
    large)."""
    return torch.linalg.solve(ego2global_prev.double(), ego2global_cur.double())


def prev_reference_points(
    ref: Tensor,
    cur2prev: Tensor,
    pc_range: Sequence[float],
    prev_valid: Optional[Tensor] = None,
) -> Tensor:
    """Current points (Q, 2) or (B, Q, 2) normalised, moved into the previous ego frame:
    (B, Q, 2).

    ``cur2prev`` (B, 4, 4) (:func:`ego_motion`) moves the points on the ground, in the
    points' dtype; the points of samples whose ``prev_valid`` (B,) is False stay where they
    are.
    """
    x0, y0, _, x1, y1, _ = pc_range
    span = ref.new_tensor([x1 - x0, y1 - y0])
    lo = ref.new_tensor([x0, y0])
    xy = (ref * span + lo).expand(cur2prev.shape[0], *ref.shape[-2:])
    pts = torch.cat([xy, xy.new_zeros(*xy.shape[:2], 1), xy.new_ones(*xy.shape[:2], 1)], -1)
    moved = (torch.einsum("bij,bqj->bqi", cur2prev.to(ref), pts)[..., :2] - lo) / span
    if prev_valid is None:
        return moved
    return torch.where(prev_valid.to(moved.device).view(-1, 1, 1), moved, ref.expand_as(moved))


@MODELS.register_module()
class TemporalSelfAttention(DeformableAttention, BaseModule):
    """BEVFormer's temporal self-attention on ``npudet.ops`` MSDA (1 level).

    Value = [prev BEV, current queries] stacked along the batch; offsets and weights
    come from the current query concatenated with the previous BEV, one softmax group
    per queue entry; the previous entry samples at the ego-motion-aligned reference
    points, the current at the cells; the two outputs are averaged, projected, dropped
    out and added back.
    """

    def __init__(
        self,
        embed_dims: int = 256,
        num_heads: int = 8,
        num_points: int = 4,
        dropout: float = 0.1,
        impl: str = "auto",
        init_cfg=None,
    ) -> None:
        super().__init__(init_cfg)
        self.embed_dims, self.num_heads, self.num_points = embed_dims, num_heads, num_points
        self.num_levels = 1
        self.num_groups = 2  # queue entries: previous BEV, current queries
        self.impl = check_impl_name(impl, "impl")
        self.build_sampling(embed_dims * 2)
        self.value_proj = nn.Linear(embed_dims, embed_dims)
        self.output_proj = nn.Linear(embed_dims, embed_dims)
        self.dropout = nn.Dropout(dropout)
        self.init_weights()

    def forward(
        self,
        query: Tensor,
        ref: Tensor,
        ref_prev: Tensor,
        bev_hw: Tuple[int, int],
        prev_bev: Optional[Tensor] = None,
        query_pos: Optional[Tensor] = None,
    ) -> Tensor:
        """query (B, Q, C); ref (Q, 2) cells; ref_prev (B, Q, 2); prev_bev (B, Q, C) or None.

        Returns (B, Q, C).
        """
        b, q, c = query.shape
        identity = query
        if prev_bev is None:  # no previous frame: the current queries stand in for it
            prev_bev = query
        if query_pos is not None:
            query = query + query_pos
        value = self.project_value(torch.stack([prev_bev, query], 1).flatten(0, 1))
        refs = torch.stack([ref_prev, ref.expand(b, q, 2)], 1).flatten(0, 1)  # (B*T, Q, 2)
        shapes, starts = msda_levels([bev_hw], query.device)
        out = self.deformable_attend(
            torch.cat([prev_bev, query], -1), value, refs[:, :, None], shapes, starts
        )
        out = out.view(b, self.num_groups, q, c).mean(1)
        return self.dropout(self.output_proj(out)) + identity
