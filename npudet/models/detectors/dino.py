"""mmdet's ``DINO`` with npudet's switchable MSDA."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from mmdet.models.detectors import DINO as MMDetDINO
from mmdet.registry import MODELS

from .level_pairs import LevelPairsMixin
from .msda_config import apply_msda_cfg


@MODELS.register_module(force=True)
class DINO(LevelPairsMixin, MMDetDINO):
    """Stock DINO whose MSDA layers run on ``npudet.ops`` (``msda`` as in DeformableDETR);
    ``forward_transformer(feats, None)`` keeps the level shapes symbolic for export."""

    def __init__(self, *args: Any, msda: Optional[Mapping] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.msda_impls = apply_msda_cfg(self, msda)
