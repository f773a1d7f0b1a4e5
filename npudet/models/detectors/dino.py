"""mmdet's ``DINO`` with npudet's switchable MSDA."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from mmdet.models.detectors import DINO as MMDetDINO
from mmdet.registry import MODELS

from .msda_config import apply_msda_cfg


@MODELS.register_module(force=True)
class DINO(MMDetDINO):
    """Stock DINO whose MSDA layers run on ``npudet.ops`` (``msda`` as in DeformableDETR)."""

    def __init__(self, *args: Any, msda: Optional[Mapping] = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.msda_impls = apply_msda_cfg(self, msda)
