"""BEVFormer-style multi-camera 3D detection on npudet's MSDA (registers in mmdet MODELS)."""

from .box_coder import BEVBoxCoder
from .detector import BEVDataPreprocessor, BEVFormer
from .encoder import BEVFormerEncoder
from .head import BEVDetrHead
from .history_velocity import HistoryVelocity
from .match_cost import BEVBoxL1Cost
from .spatial_cross_attention import SpatialCrossAttention
from .temporal_self_attention import TemporalSelfAttention

__all__ = [
    "BEVBoxCoder",
    "BEVBoxL1Cost",
    "BEVDataPreprocessor",
    "BEVDetrHead",
    "BEVFormer",
    "BEVFormerEncoder",
    "HistoryVelocity",
    "SpatialCrossAttention",
    "TemporalSelfAttention",
]
