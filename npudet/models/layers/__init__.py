"""npudet's transformer layers for mmdet: mmcv's MSDA module on npudet's op, the
``model.msda`` switch, and the training-grade pieces of ``model.msda.layers`` (mmcv's FFN
and MSDA layer with fused dropout / projections). The torch-only base they share is ``npudet.nn``.

``check_impl_name`` is the op library's (``npudet.ops.msda.registry``), the one check of
an MSDA implementation name, re-exported for configs and layers.
"""

from npudet.nn import DeformableAttention
from npudet.ops.msda import check_impl_name

from .ffn import FFN
from .layer_switch import PIECES, active_pieces, convert_layers, resolve_layers
from .msda import MultiScaleDeformableAttention
from .msda_fused import FusedMultiScaleDeformableAttention
from .msda_switch import convert_msda, deformable_layers, stock_msda_layers

__all__ = [
    "FFN",
    "PIECES",
    "DeformableAttention",
    "FusedMultiScaleDeformableAttention",
    "MultiScaleDeformableAttention",
    "active_pieces",
    "check_impl_name",
    "convert_layers",
    "convert_msda",
    "deformable_layers",
    "resolve_layers",
    "stock_msda_layers",
]
