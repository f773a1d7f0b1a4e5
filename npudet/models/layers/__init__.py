"""npudet's transformer layers.

``check_impl_name`` is the op library's (``npudet.ops.msda.registry``), the one check of
an MSDA implementation name, re-exported for configs and layers.
"""

from npudet.ops.msda import check_impl_name

from .deformable_attention import DeformableAttention
from .msda import MultiScaleDeformableAttention
from .msda_switch import convert_msda, deformable_layers

__all__ = [
    "DeformableAttention",
    "MultiScaleDeformableAttention",
    "check_impl_name",
    "convert_msda",
    "deformable_layers",
]
