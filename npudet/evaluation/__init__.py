"""Evaluation: BEV 3D detection and COCO boxes on a chosen backend.

Importing this registers ``BEVDetMetric`` and ``FastCocoMetric`` in mmdet's METRICS.
"""

from .bev_metric import BEVDetMetric
from .center_distance import TP_METRICS, evaluate_center_distance, nd_score
from .coco_backend import BACKENDS, CocoBackend, coco_backend, faster_coco_eval_available
from .coco_metric import FastCocoMetric

__all__ = [
    "BACKENDS",
    "BEVDetMetric",
    "TP_METRICS",
    "CocoBackend",
    "FastCocoMetric",
    "coco_backend",
    "evaluate_center_distance",
    "faster_coco_eval_available",
    "nd_score",
]
