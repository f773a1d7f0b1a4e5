"""npudet's deformable-attention layers with torch alone (no OpenMMLab import).

:class:`DeformableAttention` is the sampling every npudet layer shares (the mmcv subclass
in ``npudet.models.layers``, the BEV attentions); :class:`MSDeformAttn` is mmcv's MSDA
module on it, for machines and models without mmcv.
"""

from .deformable_attention import DeformableAttention
from .ms_deform_attn import MSDeformAttn

__all__ = ["DeformableAttention", "MSDeformAttn"]
