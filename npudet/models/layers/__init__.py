"""npudet's transformer layers for mmdet: mmcv's MSDA module on npudet's op, and the
``model.msda`` switch. The torch-only base they share is ``npudet.nn``.

``check_impl_name`` is the op library's (``npudet.ops.msda.registry``), the one check of
an MSDA implementation name, re-exported for configs and layers.
"""

from npudet.nn import DeformableAttention
from npudet.ops.msda import check_impl_name

from .msda import MultiScaleDeformableAttention
from .msda_switch import convert_msda, deformable_layers, stock_msda_layers

__all__ = [
    "DeformableAttention",
    "MultiScaleDeformableAttention",
    "check_impl_name",
    "convert_msda",
    "deformable_layers",
    "stock_msda_layers",
]
