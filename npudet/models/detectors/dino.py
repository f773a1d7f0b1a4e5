"""mmdet's ``DINO`` with npudet's switchable MSDA."""

from __future__ import annotations

from typing import Any, Dict, Optional

from mmdet.models.detectors import DINO as MMDetDINO
from mmdet.registry import MODELS
from torch import Tensor

from .level_pairs import LevelPairsMixin
from .msda_config import ENCODER_DECODER
from .msda_model import MSDAModel


@MODELS.register_module(force=True)
class DINO(MSDAModel, LevelPairsMixin, MMDetDINO):
    """Stock DINO whose MSDA layers run on ``npudet.ops`` (``msda`` as in DeformableDETR);
    ``forward_transformer(feats, None)`` keeps the level shapes symbolic for export."""

    msda_parts = ENCODER_DECODER

    def forward_decoder(
        self,
        query: Tensor,
        memory: Tensor,
        memory_mask: Optional[Tensor],
        reference_points: Tensor,
        spatial_shapes,
        level_start_index: Optional[Tensor],
        valid_ratios: Tensor,
        dn_mask: Optional[Tensor] = None,
        **kwargs: Any,
    ) -> Dict:
        """mmdet's; with level pairs (the export path), without its ``len(query) ==
        num_queries`` term: it compares the batch size (query is (bs, nq, C)) to the query
        count to add ``label_embedding * 0.0``, a training device that changes no value,
        and tracing the comparison would fix the batch size."""
        if isinstance(spatial_shapes, Tensor):
            return super().forward_decoder(
                query, memory, memory_mask, reference_points, spatial_shapes,
                level_start_index, valid_ratios, dn_mask, **kwargs,
            )  # fmt: skip
        hidden_states, references = self.decoder(
            query=query,
            value=memory,
            key_padding_mask=memory_mask,
            self_attn_mask=dn_mask,
            reference_points=reference_points,
            spatial_shapes=spatial_shapes,
            level_start_index=level_start_index,
            valid_ratios=valid_ratios,
            reg_branches=self.bbox_head.reg_branches,
            **kwargs,
        )
        return dict(hidden_states=hidden_states, references=list(references))
