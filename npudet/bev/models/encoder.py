"""BEVFormer encoder: learned BEV queries refined by TSA -> SCA -> FFN layers."""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Sequence, Tuple, Union

import torch
from mmcv.cnn.bricks.transformer import FFN
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from torch import Tensor, nn

from npudet.ops.msda import LevelPairs

from .spatial_cross_attention import SpatialCrossAttention, flatten_levels
from .temporal_self_attention import (
    TemporalSelfAttention,
    bev_reference_points,
    prev_reference_points,
)


class CameraFeatures(NamedTuple):
    """What spatial cross-attention samples: flattened camera levels and their geometry."""

    feats: Tensor  # (B, N, keys, C)
    spatial_shapes: Union[Tensor, LevelPairs]  # (levels, 2) long, or (h, w) pairs
    level_start_index: Optional[Tensor]  # (levels,) long, or None with pairs
    lidar2img: Tensor  # (B, N, 4, 4)
    img_shape: Tuple[int, int]


class BEVGeometry(NamedTuple):
    """The BEV grid: cell centres (Q, 2), the cells in the previous frame (B, Q, 2), (H, W)."""

    ref: Tensor
    ref_prev: Tensor
    hw: Tuple[int, int]


class BEVFormerEncoderLayer(BaseModule):
    """TSA -> norm -> SCA -> norm -> FFN -> norm on BEV queries (B, Q, C)."""

    def __init__(
        self,
        embed_dims: int,
        num_heads: int,
        num_levels: int,
        sca_points: int,
        tsa_points: int,
        num_z: int,
        pc_range: Sequence[float],
        ffn_dims: int,
        dropout: float,
    ) -> None:
        super().__init__()
        self.tsa = TemporalSelfAttention(embed_dims, num_heads, tsa_points, dropout)
        self.sca = SpatialCrossAttention(
            embed_dims, num_heads, num_levels, sca_points, num_z, pc_range, dropout
        )
        self.ffn = FFN(embed_dims, ffn_dims, ffn_drop=dropout)
        self.norms = nn.ModuleList(nn.LayerNorm(embed_dims) for _ in range(3))

    def forward(
        self,
        query: Tensor,
        query_pos: Tensor,
        bev: BEVGeometry,
        camera: CameraFeatures,
        prev_bev: Optional[Tensor] = None,
        prev_valid: Optional[Tensor] = None,
    ) -> Tensor:
        """query, query_pos (B, Q, C) -> (B, Q, C).

        ``prev_bev`` (B, Q, C) or None; samples whose ``prev_valid`` (B,) is False
        attend to this layer's input queries in its place.
        """
        if prev_bev is not None and prev_valid is not None:
            prev_bev = torch.where(prev_valid.view(-1, 1, 1), prev_bev, query)
        query = self.norms[0](self.tsa(query, bev.ref, bev.ref_prev, bev.hw, prev_bev, query_pos))
        query = self.norms[1](
            self.sca(
                query,
                camera.feats,
                camera.spatial_shapes,
                camera.level_start_index,
                camera.lidar2img,
                camera.img_shape,
                bev.hw,
                query_pos,
            )
        )
        return self.norms[2](self.ffn(query))


@MODELS.register_module()
class BEVFormerEncoder(BaseModule):
    """Builds the BEV map (B, bev_h * bev_w, C) from multi-camera features.

    Learned BEV queries and a learned row/column positional embedding; camera and
    level embeddings are added to the image features before spatial cross-attention.
    """

    def __init__(
        self,
        bev_h: int = 50,
        bev_w: int = 50,
        embed_dims: int = 256,
        num_layers: int = 3,
        num_heads: int = 8,
        num_levels: int = 1,
        num_cams: int = 6,
        sca_points: int = 8,
        tsa_points: int = 4,
        num_z: int = 4,
        pc_range: Sequence[float] = (-51.2, -51.2, -5.0, 51.2, 51.2, 3.0),
        ffn_dims: int = 512,
        dropout: float = 0.1,
        init_cfg=None,
    ) -> None:
        super().__init__(init_cfg)
        self.bev_h, self.bev_w, self.embed_dims = bev_h, bev_w, embed_dims
        self.pc_range = tuple(float(x) for x in pc_range)
        self.bev_embedding = nn.Embedding(bev_h * bev_w, embed_dims)
        self.row_embed = nn.Embedding(bev_h, embed_dims // 2)
        self.col_embed = nn.Embedding(bev_w, embed_dims - embed_dims // 2)
        self.cams_embeds = nn.Parameter(torch.randn(num_cams, embed_dims) * 0.02)
        self.level_embeds = nn.Parameter(torch.randn(num_levels, embed_dims) * 0.02)
        self.layers = nn.ModuleList(
            BEVFormerEncoderLayer(
                embed_dims,
                num_heads,
                num_levels,
                sca_points,
                tsa_points,
                num_z,
                pc_range,
                ffn_dims,
                dropout,
            )
            for _ in range(num_layers)
        )

    def bev_pos(self, device: torch.device) -> Tensor:
        """Positional embedding of the BEV cells, (bev_h * bev_w, C)."""
        rows = self.row_embed(torch.arange(self.bev_h, device=device))
        cols = self.col_embed(torch.arange(self.bev_w, device=device))
        pos = torch.cat(
            [
                rows[:, None].expand(-1, self.bev_w, -1),
                cols[None].expand(self.bev_h, -1, -1),
            ],
            -1,
        )
        return pos.flatten(0, 1)

    def geometry(
        self,
        batch: int,
        device: torch.device,
        cur2prev: Optional[Tensor] = None,
        prev_valid: Optional[Tensor] = None,
    ) -> BEVGeometry:
        """The cells and where temporal self-attention reads the previous BEV.

        ``ref_prev`` (B, Q, 2) holds the current cells moved into the previous ego frame by
        ``cur2prev`` (B, 4, 4) (``ego_motion``: ego motion undone by sampling), and the cells
        themselves without it or where ``prev_valid`` (B,) is False.
        """
        ref = bev_reference_points(self.bev_h, self.bev_w, device)
        still = ref[None].expand(batch, -1, -1)
        if cur2prev is None:
            return BEVGeometry(ref, still, (self.bev_h, self.bev_w))
        ref_prev = prev_reference_points(ref, cur2prev.to(device), self.pc_range, prev_valid)
        return BEVGeometry(ref, ref_prev, (self.bev_h, self.bev_w))

    def forward(
        self,
        mlvl_feats: List[Tensor],
        lidar2img: Tensor,
        img_shape: Tuple[int, int],
        prev_bev: Optional[Tensor] = None,
        cur2prev: Optional[Tensor] = None,
        prev_valid: Optional[Tensor] = None,
    ) -> Tensor:
        """mlvl_feats: list of (B, N, C, h, w); lidar2img (B, N, 4, 4); cur2prev (B, 4, 4) the
        ego motion (``ego_motion``) that aligns ``prev_bev``.

        ``prev_bev`` (B, Q, C) or None; ``prev_valid`` (B,) bool: samples without a
        previous frame use their current queries in its place. Returns (B, Q, C).
        """
        b, n = mlvl_feats[0].shape[:2]
        device = mlvl_feats[0].device
        mlvl = [
            f + (self.cams_embeds[:n, :, None, None] + self.level_embeds[lvl, :, None, None])
            for lvl, f in enumerate(mlvl_feats)
        ]
        feats, shapes, starts = flatten_levels(mlvl)
        query = self.bev_embedding.weight[None].expand(b, -1, -1)
        pos = self.bev_pos(device)[None].expand(b, -1, -1)
        if prev_bev is None:
            bev = self.geometry(b, device)
        elif cur2prev is None:
            raise ValueError("prev_bev: given without cur2prev (the ego motion) to align it")
        else:
            bev = self.geometry(b, device, cur2prev, prev_valid)
        if prev_valid is not None:
            prev_valid = prev_valid.to(device)
        camera = CameraFeatures(feats, shapes, starts, lidar2img, img_shape)
        for layer in self.layers:
            query = layer(query, pos, bev, camera, prev_bev, prev_valid)
        return query
