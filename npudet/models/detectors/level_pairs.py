"""Deformable DETR's transformer with the level shapes as (H, W) pairs: the traceable path.

mmdet builds a (num_levels, 2) ``spatial_shapes`` tensor from the feature maps and iterates
over it (encoder reference points, two-stage proposals, ``level_start_index``): under
``torch.export`` those values are data, and ``torch.linspace(.., H)`` of a symbolic size is
specialized, so an export would be fixed at one image size. With ``batch_data_samples=None``
(no image metas: every image of the batch fills the tensor, so nothing is masked)
:class:`LevelPairsMixin` keeps the level shapes as the feature maps' sizes, which stay
symbolic while tracing, and builds the grids with ``torch.arange``. The MSDA layers take the
pairs as they are (``npudet.ops.msda.levels``). With data samples it is mmdet's path, number
for number.
"""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from npudet.ops.msda import note_level_layout, noted_level_pairs
from npudet.ops.msda.levels import LevelPairs


def cell_centres(size, device: torch.device) -> Tensor:
    """(size,) float32 centres of ``size`` cells, normalised to (0, 1): (i + 0.5) / size.

    The values of mmdet's ``torch.linspace(0.5, size - 0.5, size) / size`` (the step is 1,
    so both are exact), with ``size`` allowed to be symbolic."""
    return (torch.arange(size, dtype=torch.float32, device=device) + 0.5) / size


def level_grid(pairs: LevelPairs, device: torch.device) -> List[Tensor]:
    """One (H * W, 2) grid of normalised (x, y) cell centres per level, row-major."""
    grids = []
    for h, w in pairs:
        ys, xs = torch.meshgrid(cell_centres(h, device), cell_centres(w, device), indexing="ij")
        grids.append(torch.stack((xs.reshape(-1), ys.reshape(-1)), -1))
    return grids


class LevelPairsMixin:
    """Put before mmdet's ``DeformableDETR`` / ``DINO``: ``pre_transformer(feats, None)``
    returns the level shapes as (H, W) pairs of the maps' sizes, no masks, all valid ratios 1;
    ``forward_encoder`` and ``gen_encoder_output_proposals`` then take the pairs. So
    ``forward_transformer(feats, None)`` traces with dynamic batch and image size."""

    def pre_transformer(
        self, mlvl_feats: Tuple[Tensor, ...], batch_data_samples: Optional[Sequence] = None
    ) -> Tuple[Dict, Dict]:
        """mmdet's, or without ``batch_data_samples``: feats (bs, C, H_l, W_l) per level ->
        feat / feat_pos (bs, sum H_l*W_l, C), spatial_shapes [(H_l, W_l)], valid_ratios
        (bs, levels, 2) of ones, no mask, level_start_index None (the layers derive it)."""
        if batch_data_samples is not None:
            encoder_inputs, decoder_inputs = super().pre_transformer(  # type: ignore[misc]
                mlvl_feats, batch_data_samples
            )
            # mmdet built the level tensors on the device from these sizes: the op need not
            # read them back (a device-to-host sync per forward on an accelerator).
            note_level_layout(
                encoder_inputs["spatial_shapes"],
                encoder_inputs["level_start_index"],
                [tuple(feat.shape[-2:]) for feat in mlvl_feats],
            )
            return encoder_inputs, decoder_inputs
        feats, poses, pairs = [], [], []
        for lvl, feat in enumerate(mlvl_feats):
            # mmdet's unmasked case: the encoding of a map with no padding.
            pos = self.positional_encoding(None, input=feat)  # type: ignore[attr-defined]
            feats.append(feat.flatten(2).transpose(1, 2))
            level_embed = self.level_embed[lvl].view(1, 1, -1)  # type: ignore[attr-defined]
            poses.append(pos.flatten(2).transpose(1, 2) + level_embed)
            pairs.append((feat.shape[2], feat.shape[3]))
        valid_ratios = mlvl_feats[0].new_ones(mlvl_feats[0].shape[0], len(mlvl_feats), 2)
        levels = dict(spatial_shapes=pairs, level_start_index=None, valid_ratios=valid_ratios)
        encoder_inputs = dict(
            feat=torch.cat(feats, 1), feat_mask=None, feat_pos=torch.cat(poses, 1), **levels
        )
        return encoder_inputs, dict(memory_mask=None, **levels)

    def forward_encoder(
        self,
        feat: Tensor,
        feat_mask: Optional[Tensor],
        feat_pos: Tensor,
        spatial_shapes,
        level_start_index: Optional[Tensor],
        valid_ratios: Tensor,
    ) -> Dict:
        """mmdet's; with pairs, the encoder's layers on reference points from
        :func:`level_grid` (mmdet's ``get_encoder_reference_points`` at valid ratios 1); with
        the level tensor of :meth:`pre_transformer`, mmdet's reference points from the sizes
        it noted (the same numbers, without reading the tensor back)."""
        if isinstance(spatial_shapes, Tensor):
            pairs = noted_level_pairs(spatial_shapes)
            if pairs is None:
                return super().forward_encoder(  # type: ignore[misc]
                    feat, feat_mask, feat_pos, spatial_shapes, level_start_index, valid_ratios
                )
            reference_points = self.encoder.get_encoder_reference_points(  # type: ignore[attr-defined]
                pairs, valid_ratios, device=feat.device
            )
        else:
            _require_unmasked(feat_mask)
            grid = torch.cat(level_grid(spatial_shapes, feat.device), 0)  # (keys, 2)
            # (bs, keys, levels, 2): every level samples at the key's own normalised position.
            reference_points = grid[None, :, None].expand(feat.shape[0], -1, len(spatial_shapes), 2)
        memory = feat
        for layer in self.encoder.layers:  # type: ignore[attr-defined]
            memory = layer(
                query=memory,
                query_pos=feat_pos,
                key_padding_mask=feat_mask,
                spatial_shapes=spatial_shapes,
                level_start_index=level_start_index,
                valid_ratios=valid_ratios,
                reference_points=reference_points,
            )
        return dict(memory=memory, memory_mask=feat_mask, spatial_shapes=spatial_shapes)

    def gen_encoder_output_proposals(
        self, memory: Tensor, memory_mask: Optional[Tensor], spatial_shapes
    ) -> Tuple[Tensor, Tensor]:
        """mmdet's two-stage proposals; with pairs, unmasked: memory (bs, keys, C) ->
        (output memory (bs, keys, C), proposals (bs, keys, 4) as inverse-sigmoid cxcywh,
        inf where a proposal leaves (0.01, 0.99))."""
        if isinstance(spatial_shapes, Tensor):
            # the sizes noted by pre_transformer: mmdet's numbers, the tensor not read back
            pairs = noted_level_pairs(spatial_shapes)
            return super().gen_encoder_output_proposals(  # type: ignore[misc]
                memory, memory_mask, spatial_shapes if pairs is None else pairs
            )
        _require_unmasked(memory_mask)
        proposals = []
        for lvl, grid in enumerate(level_grid(spatial_shapes, memory.device)):
            # mmdet's proposal: the cell centre and a box of 0.05 * 2**level.
            proposals.append(torch.cat((grid, torch.full_like(grid, 0.05 * (2.0**lvl))), -1))
        proposals = torch.cat(proposals, 0)[None].expand(memory.shape[0], -1, -1)
        valid = ((proposals > 0.01) & (proposals < 0.99)).all(-1, keepdim=True)
        proposals = torch.log(proposals / (1 - proposals)).masked_fill(~valid, float("inf"))
        output_memory = memory.masked_fill(~valid, 0.0)
        output_memory = self.memory_trans_norm(  # type: ignore[attr-defined]
            self.memory_trans_fc(output_memory)  # type: ignore[attr-defined]
        )
        return output_memory, proposals


def _require_unmasked(mask: Optional[Tensor]) -> None:
    if mask is not None:
        raise ValueError("spatial_shapes: (H, W) pairs are for unmasked batches; got a mask")
