"""mmdet's ``DeformableDETR`` with npudet's switchable MSDA."""

from __future__ import annotations

from typing import Optional

from mmdet.models.detectors import DeformableDETR as MMDetDeformableDETR
from mmdet.registry import MODELS
from torch import Tensor

from .level_pairs import LevelPairsMixin
from .msda_config import ENCODER_DECODER
from .msda_model import MSDAModel


@MODELS.register_module(force=True)
class DeformableDETR(MSDAModel, LevelPairsMixin, MMDetDeformableDETR):
    """Stock Deformable DETR whose MSDA layers run on ``npudet.ops``.

    Registered under mmdet's own name, so an unchanged mmdet config picks it up once
    ``npudet.models`` is imported. ``msda``: ``dict(impl='auto', encoder=None,
    decoder=None)``, see :func:`resolve_msda_cfg`. ``forward_transformer(feats, None)``
    keeps the level shapes symbolic for export (:class:`LevelPairsMixin`).
    """

    msda_parts = ENCODER_DECODER

    def get_proposal_pos_embed(  # type: ignore[override]
        self, proposals: Tensor, num_pos_feats: Optional[int] = None, temperature: int = 10000
    ) -> Tensor:
        """mmdet's two-stage proposal embedding, sized to ``embed_dims`` (mmdet fixes 256)."""
        if num_pos_feats is None:
            num_pos_feats = self.embed_dims // 2
        return MMDetDeformableDETR.get_proposal_pos_embed(proposals, num_pos_feats, temperature)
