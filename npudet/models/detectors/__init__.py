"""mmdet detectors on MSDA, re-registered under their names so their layers use ``npudet.ops``.

DeformableDETR and DINO are written out (their export path); every other model in
:data:`MSDA_MODELS` (DDQ-DETR, Grounding DINO, Mask2Former and its video variant) is mmdet's
class behind :class:`MSDAModel`, made by :func:`switch_msda` when this package is imported.
"""

from .deformable_detr import DeformableDETR
from .dino import DINO
from .msda_config import apply_msda_cfg, resolve_msda_cfg
from .msda_model import MSDA_MODELS, MSDAModel, switch_msda

__all__ = [
    "DINO",
    "MSDA_MODELS",
    "DeformableDETR",
    "MSDAModel",
    "apply_msda_cfg",
    "resolve_msda_cfg",
    "switch_msda",
]
