"""Multi-scale deformable attention: one function, several implementations."""

from . import (  # noqa: F401  (register)
    cpu_impl,
    gather_impl,
    grid_sample_impl,
    mmcv_impl,
    npu_impl,
    triton_impl,
)
from .api import multi_scale_deformable_attn, prepare
from .inputs import MSDAInputs, validate_inputs
from .registry import (
    MSDAImpl,
    auto_order,
    get_impl,
    msda_impls,
    msda_variants,
    register,
    register_variant,
    registered_impls,
    select_impl,
)

__all__ = [
    "MSDAImpl",
    "MSDAInputs",
    "auto_order",
    "get_impl",
    "msda_impls",
    "msda_variants",
    "multi_scale_deformable_attn",
    "prepare",
    "register",
    "register_variant",
    "registered_impls",
    "select_impl",
    "validate_inputs",
]
