"""Evaluation: COCO boxes on a chosen backend.

Importing this registers ``FastCocoMetric`` in mmdet's METRICS (the BEV metric lives in
:mod:`npudet.bev.evaluation`).
"""

from .coco_backend import BACKENDS, CocoBackend, coco_backend, faster_coco_eval_available
from .coco_metric import FastCocoMetric

__all__ = [
    "BACKENDS",
    "CocoBackend",
    "FastCocoMetric",
    "coco_backend",
    "faster_coco_eval_available",
]
