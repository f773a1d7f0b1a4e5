"""Spatial cross-attention: BEV queries attend to the camera features that see them."""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple, Union

import torch
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor, nn

from npudet.nn import DeformableAttention
from npudet.ops.msda import LevelPairs, check_impl_name

from .levels import msda_levels


def bev_pillar_points(
    bev_h: int, bev_w: int, num_z: int, pc_range: Sequence[float], device: torch.device
) -> Tensor:
    """Ego-frame points of every BEV cell's pillar: (bev_h * bev_w, num_z, 3).

    Cell ``q = i * bev_w + j`` has its centre at normalised ``(u, v) = ((j + .5) / W,
    (i + .5) / H)``, x from u and y from v over ``pc_range``; heights spread evenly in z.
    """
    x0, y0, z0, x1, y1, z1 = pc_range
    u = (torch.arange(bev_w, device=device, dtype=torch.float32) + 0.5) / bev_w
    v = (torch.arange(bev_h, device=device, dtype=torch.float32) + 0.5) / bev_h
    z = (torch.arange(num_z, device=device, dtype=torch.float32) + 0.5) / num_z
    vv, uu = torch.meshgrid(v, u, indexing="ij")
    xy = torch.stack([x0 + uu * (x1 - x0), y0 + vv * (y1 - y0)], -1).view(-1, 1, 2)
    zz = (z0 + z * (z1 - z0)).view(1, num_z, 1)
    q = bev_h * bev_w
    return torch.cat([xy.expand(q, num_z, 2), zz.expand(q, num_z, 1)], -1)


def project_to_cameras(
    points: Tensor, lidar2img: Tensor, img_shape: Tuple[int, int], eps: float = 1e-5
) -> Tuple[Tensor, Tensor]:
    """Project ego points (Q, Z, 3) with lidar2img (B, N, 4, 4).

    Returns the normalised image positions (B, N, Q, Z, 2) as (x / W, y / H) and the
    visibility mask (B, N, Q, Z): depth > eps and inside the image.
    """
    homo = torch.cat([points, points.new_ones(points.shape[:-1] + (1,))], -1)
    cam = torch.einsum("bnij,qzj->bnqzi", lidar2img.to(points.dtype), homo)
    depth = cam[..., 2:3]
    uv = cam[..., :2] / depth.clamp(min=eps)
    img_h, img_w = img_shape
    # One division per axis: the sizes may be symbolic (an export of dynamic image size).
    uv = torch.stack([uv[..., 0] / img_w, uv[..., 1] / img_h], -1)
    mask = (
        (depth[..., 0] > eps)
        & (uv[..., 0] > 0.0)
        & (uv[..., 0] < 1.0)
        & (uv[..., 1] > 0.0)
        & (uv[..., 1] < 1.0)
    )
    return uv, mask


def rebatch_indices(visible: Tensor) -> Tuple[Tensor, Tensor]:
    """Per-camera packing of the visible queries, without a Python loop.

    ``visible``: (B, N, Q) bool. Returns ``index`` (B * N, L) long, the query index of
    each slot (0 in padding), and ``valid`` (B * N, L) bool, with L the largest count.
    """
    flat = visible.flatten(0, 1)
    rank = flat.long().cumsum(-1) - 1
    max_len = max(int(flat.sum(-1).max()), 1)
    rows, cols = flat.nonzero(as_tuple=True)
    index = flat.new_zeros(flat.shape[0], max_len, dtype=torch.long)
    valid = flat.new_zeros(flat.shape[0], max_len)
    slot = rank[rows, cols]
    index[rows, slot] = cols
    valid[rows, slot] = True
    return index, valid


def every_query_indices(visible: Tensor) -> Tuple[Tensor, Tensor]:
    """:func:`rebatch_indices`' fixed-size form: every query in every camera's slots.

    ``visible``: (B, N, Q) bool. Returns ``index`` (B * N, Q), 0 .. Q - 1 in every row, and
    ``valid`` = ``visible`` as (B * N, Q): no size depends on the data (what an export
    needs), at the cost of sampling the cells a camera does not see (masked out).
    """
    flat = visible.flatten(0, 1)
    index = torch.arange(flat.shape[1], device=flat.device).expand(flat.shape[0], -1)
    return index, flat


@MODELS.register_module()
class SpatialCrossAttention(DeformableAttention, BaseModule):
    """BEVFormer's spatial cross-attention on ``npudet.ops`` MSDA.

    Each BEV cell's pillar (``num_z`` heights) is projected into every camera; the
    cells a camera sees are packed per camera, run MSDA over that camera's feature
    levels (``num_points`` split across the Z anchors), scattered back and averaged
    over the cameras that see them; then output projection, dropout and residual.

    ``packed`` (default True): only the visible cells are gathered per camera
    (:func:`rebatch_indices`, sizes depend on the data); False: every cell in every camera,
    the unseen ones masked (:func:`every_query_indices`), the same numbers at fixed sizes,
    as an export needs (``npudet.deploy.bev_graph`` sets it).
    """

    packed: bool = True

    def __init__(
        self,
        embed_dims: int = 256,
        num_heads: int = 8,
        num_levels: int = 1,
        num_points: int = 8,
        num_z: int = 4,
        pc_range: Sequence[float] = (-51.2, -51.2, -5.0, 51.2, 51.2, 3.0),
        dropout: float = 0.1,
        impl: str = "auto",
        init_cfg=None,
    ) -> None:
        super().__init__(init_cfg)
        if num_points % num_z:
            raise ValueError(f"num_points ({num_points}) must be a multiple of num_z ({num_z})")
        self.embed_dims, self.num_heads = embed_dims, num_heads
        self.num_levels, self.num_points, self.num_z = num_levels, num_points, num_z
        self.pc_range = tuple(float(x) for x in pc_range)
        self.impl = check_impl_name(impl, "impl")
        self.build_sampling(embed_dims)
        self.value_proj = nn.Linear(embed_dims, embed_dims)
        self.output_proj = nn.Linear(embed_dims, embed_dims)
        self.dropout = nn.Dropout(dropout)
        self.init_weights()

    def point_scales(self) -> Tensor:
        """Each Z anchor's points start 1, 2, .. cells from its projection."""
        per_z = self.num_points // self.num_z
        return torch.arange(per_z, dtype=torch.float32).repeat(self.num_z) + 1

    def attend(
        self,
        query: Tensor,
        ref: Tensor,
        zmask: Tensor,
        value: Tensor,
        spatial_shapes: Union[Tensor, LevelPairs],
        level_start_index: Optional[Tensor],
    ) -> Tensor:
        """MSDA of packed queries (M, L, C) at refs (M, L, Z, 2) with Z-anchor mask (M, L, Z).

        ``value``: (M, keys, heads, C / heads), already projected. Point ``p`` belongs
        to Z anchor ``p // (num_points / num_z)``. Returns (M, L, C).
        """
        per_z = self.num_points // self.num_z
        ref = ref.repeat_interleave(per_z, 2)[:, :, None]  # (M, L, 1 level, P, 2)
        mask = zmask.repeat_interleave(per_z, 2)[:, :, None, None]  # (M, L, 1, 1, P)
        return self.deformable_attend(
            query, value, ref, spatial_shapes, level_start_index, weight_mask=mask
        )

    def project_cameras(self, feats: Tensor) -> Tensor:
        """Camera features (B, N, keys, C) -> MSDA value (B * N, keys, heads, C / heads)."""
        return self.project_value(feats.flatten(0, 1))

    def forward(
        self,
        query: Tensor,
        feats: Tensor,
        spatial_shapes: Union[Tensor, LevelPairs],
        level_start_index: Optional[Tensor],
        lidar2img: Tensor,
        img_shape: Tuple[int, int],
        bev_hw: Tuple[int, int],
        query_pos: Tensor | None = None,
    ) -> Tensor:
        """query (B, Q, C); feats (B, N, keys, C) flattened camera levels; lidar2img (B, N, 4, 4).

        Returns (B, Q, C).
        """
        b, q, c = query.shape
        n = feats.shape[1]
        identity = query
        if query_pos is not None:
            query = query + query_pos
        pts = bev_pillar_points(bev_hw[0], bev_hw[1], self.num_z, self.pc_range, query.device)
        uv, mask = project_to_cameras(pts, lidar2img, img_shape)
        uv = uv.to(query.dtype)
        visible = mask.any(-1)
        index, valid = (rebatch_indices if self.packed else every_query_indices)(visible)
        batch_of = torch.arange(b, device=query.device).repeat_interleave(n)[:, None]
        cam_of = torch.arange(n, device=query.device).repeat(b)[:, None]
        q_sel = query[batch_of, index]
        ref_sel = uv[batch_of, cam_of, index]
        zmask = (mask[batch_of, cam_of, index] & valid[..., None]).to(query.dtype)
        out = self.attend(
            q_sel, ref_sel, zmask, self.project_cameras(feats), spatial_shapes, level_start_index
        )
        out = out * valid[..., None].to(out.dtype)
        slots = query.new_zeros(b, q, c)
        slots.index_put_((batch_of.expand_as(index), index), out, accumulate=True)
        count = visible.sum(1).clamp(min=1).to(out.dtype)
        slots = slots / count[..., None]
        return self.dropout(self.output_proj(slots)) + identity


def flatten_levels(
    mlvl_feats: List[Tensor],
) -> Tuple[Tensor, Union[Tensor, LevelPairs], Optional[Tensor]]:
    """List of (B, N, C, h, w) -> feats (B, N, sum h*w, C), spatial_shapes, level_start_index
    (:func:`~npudet.bev.models.levels.msda_levels` of the maps' sizes: tensors, or while
    exporting the (h, w) pairs, so the image size stays dynamic)."""
    feats = torch.cat([f.flatten(3).transpose(2, 3) for f in mlvl_feats], 2)
    pairs = [(f.shape[-2], f.shape[-1]) for f in mlvl_feats]
    return (feats, *msda_levels(pairs, feats.device))
