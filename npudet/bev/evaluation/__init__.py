"""nuScenes-style BEV detection metrics; importing this registers ``BEVDetMetric`` in mmdet's
METRICS."""

from .center_distance import TP_METRICS, evaluate_center_distance, nd_score
from .metric import BEVDetMetric

__all__ = ["BEVDetMetric", "TP_METRICS", "evaluate_center_distance", "nd_score"]
