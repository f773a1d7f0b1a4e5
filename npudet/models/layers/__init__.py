"""npudet's transformer layers."""

from .impl_names import check_impl_name
from .msda import MultiScaleDeformableAttention, convert_msda

__all__ = ["MultiScaleDeformableAttention", "check_impl_name", "convert_msda"]
