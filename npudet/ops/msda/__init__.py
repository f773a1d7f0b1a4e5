"""Multi-scale deformable attention: one function, several implementations.

Layers, highest first (a module imports only from its own layer or lower ones):
``bench`` > ``api`` > ``auto`` > ``checks`` > ``backends`` > ``kernels``, with the core
``registry`` > ``call_plan`` > ``inputs`` / ``observe`` > ``levels`` / ``export_node`` below
``backends``.
"""

from . import backends  # noqa: F401  (registers the implementations)
from .api import multi_scale_deformable_attn, prepare
from .auto import auto_order, select_impl
from .inputs import (
    MSDAInputs,
    note_level_layout,
    noted_level_pairs,
    typical_inputs,
    validate_inputs,
)
from .levels import LevelPairs, level_start_index, shapes_tensor
from .registry import (
    MSDAImpl,
    check_impl_name,
    get_impl,
    msda_impls,
    msda_variants,
    register,
    register_variant,
    registered_impls,
)

__all__ = [
    "LevelPairs",
    "MSDAImpl",
    "MSDAInputs",
    "auto_order",
    "check_impl_name",
    "get_impl",
    "level_start_index",
    "msda_impls",
    "msda_variants",
    "multi_scale_deformable_attn",
    "note_level_layout",
    "noted_level_pairs",
    "prepare",
    "register",
    "register_variant",
    "registered_impls",
    "select_impl",
    "shapes_tensor",
    "typical_inputs",
    "validate_inputs",
]
