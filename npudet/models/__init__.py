"""mmdet side of npudet; importing it registers npudet's models in mmdet's registry.

Configs import it through ``custom_imports=dict(imports=['npudet.plugin'])``: mmdet's
``DeformableDETR``, ``DINO``, ``DDQDETR``, ``GroundingDINO``, ``Mask2Former`` and
``Mask2FormerVideo`` names then build npudet's subclasses (``npudet.models.detectors``), which
accept ``msda=dict(impl=...)``; ``MSDASwitchHook`` (in mmengine's ``HOOKS``) does the same
for any other model from ``custom_hooks``. ``import npudet`` alone stays light (no mmdet
import).
"""

from .detectors import (
    DDQDETR,
    DINO,
    MSDA_MODELS,
    DeformableDETR,
    GroundingDINO,
    Mask2Former,
    Mask2FormerVideo,
    MSDAModel,
    apply_msda_cfg,
    resolve_msda_cfg,
    switch_msda,
)
from .heads import BatchedHungarianAssigner, DeformableDETRHead
from .layers import MultiScaleDeformableAttention, check_impl_name, convert_msda
from .msda_hook import MSDASwitchHook

__all__ = [
    "BatchedHungarianAssigner",
    "DDQDETR",
    "DINO",
    "MSDA_MODELS",
    "DeformableDETR",
    "DeformableDETRHead",
    "GroundingDINO",
    "MSDAModel",
    "MSDASwitchHook",
    "Mask2Former",
    "Mask2FormerVideo",
    "MultiScaleDeformableAttention",
    "apply_msda_cfg",
    "check_impl_name",
    "convert_msda",
    "resolve_msda_cfg",
    "switch_msda",
]
