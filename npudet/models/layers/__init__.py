"""npudet's transformer layers."""

from .deformable_attention import DeformableAttention
from .impl_names import check_impl_name
from .msda import MultiScaleDeformableAttention
from .msda_switch import convert_msda, deformable_layers

__all__ = [
    "DeformableAttention",
    "MultiScaleDeformableAttention",
    "check_impl_name",
    "convert_msda",
    "deformable_layers",
]
