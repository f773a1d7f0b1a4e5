"""Pairs each ground-truth box with the nearest prediction of its class, for diagnostics.

Unlike the metric's greedy matching by score, a prediction may serve several true boxes; this
reads what the detector says about each object it found (its velocity, its heading), not
whether it found it.
"""

from __future__ import annotations

from typing import Iterable, Iterator, Tuple

import numpy as np

from .center_distance import center_distance

# one frame: predicted boxes (P, 9), scores (P,), labels (P,), true boxes (N, 9), labels (N,)
Frame = Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]


def nearest_matches(
    frames: Iterable[Frame], max_dist: float = 2.0, min_score: float = 0.3
) -> Iterator[Tuple[np.ndarray, np.ndarray, int]]:
    """(true box (9,), predicted box (9,), label) for every true box whose class has a
    prediction (score >= ``min_score``) with its centre within ``max_dist`` metres
    (nuScenes' true-positive threshold, 2 m); the nearest such prediction."""
    for pred, scores, pred_labels, gt, gt_labels in frames:
        pred, gt = np.asarray(pred, float).reshape(-1, 9), np.asarray(gt, float).reshape(-1, 9)
        keep = np.asarray(scores) >= min_score
        pred, pred_labels = pred[keep], np.asarray(pred_labels)[keep]
        for box, label in zip(gt, np.asarray(gt_labels)):
            same = pred[pred_labels == label]
            if not len(same):
                continue
            dist = center_distance(same, box)
            if dist.min() <= max_dist:
                yield box, same[dist.argmin()], int(label)
