"""BEV 3D detection evaluation (importing this registers ``BEVDetMetric`` in mmdet METRICS)."""

from .bev_metric import BEVDetMetric
from .center_distance import evaluate_center_distance

__all__ = ["BEVDetMetric", "evaluate_center_distance"]
