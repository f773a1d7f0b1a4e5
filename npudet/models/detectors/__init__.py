"""Stock mmdet detectors, re-registered so their MSDA layers use ``npudet.ops``."""

from .deformable_detr import DeformableDETR
from .dino import DINO
from .msda_config import apply_msda_cfg, resolve_msda_cfg

__all__ = ["DINO", "DeformableDETR", "apply_msda_cfg", "resolve_msda_cfg"]
