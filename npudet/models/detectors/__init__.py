"""mmdet detectors on MSDA, re-registered under their names so their layers use ``npudet.ops``.

Each is mmdet's class behind :class:`MSDAModel`, registered in mmdet's ``MODELS`` under
mmdet's name (``force=True``) when this package is imported: ``DeformableDETR`` and ``DINO``
(with their export path) and, needing nothing but the switch, the :data:`MSDA_MODELS`
(``DDQDETR``, ``GroundingDINO``, ``Mask2Former``, ``Mask2FormerVideo``, in ``switched.py``).
:func:`switch_msda` does the same for a model npudet does not list.
"""

from .deformable_detr import DeformableDETR
from .dino import DINO
from .msda_config import apply_msda_cfg, resolve_msda_cfg
from .msda_model import MSDAModel, switch_msda
from .switched import DDQDETR, MSDA_MODELS, GroundingDINO, Mask2Former, Mask2FormerVideo

__all__ = [
    "DDQDETR",
    "DINO",
    "MSDA_MODELS",
    "DeformableDETR",
    "GroundingDINO",
    "MSDAModel",
    "Mask2Former",
    "Mask2FormerVideo",
    "apply_msda_cfg",
    "resolve_msda_cfg",
    "switch_msda",
]
