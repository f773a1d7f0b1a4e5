"""The moving / static split of a BEV detector's velocity (npudet.bev.evaluation.velocity)."""

from __future__ import annotations

import math

import numpy as np

from npudet.bev.evaluation.velocity import velocity_by_motion


def _box(x: float, y: float, vx: float, vy: float) -> list:
    return [x, y, 0.8, 1.9, 4.6, 1.7, 0.0, vx, vy]


GT = np.array([_box(5, 0, 3.0, 4.0), _box(-8, 2, 0.0, 0.0), _box(0, 12, 0.1, 0.0)])
LABELS = np.array([0, 0, 1])


def test_perfect_predictions_split_by_true_speed() -> None:
    out = velocity_by_motion([(GT, np.ones(3), LABELS, GT, LABELS)])
    assert out["moving_n"] == 1 and out["static_n"] == 2  # 0.1 m/s is below 0.2: static
    assert out["moving_true_speed"] == out["moving_pred_speed"] == out["moving_pred_along"] == 5.0
    assert out["moving_vel_err"] == 0.0
    assert math.isclose(out["static_pred_speed"], 0.05)


def test_a_zero_predictor_shows_no_motion() -> None:
    still = GT.copy()
    still[:, 7:9] = 0.0
    still[:, 0] += 1.5  # within 2 m
    out = velocity_by_motion([(still, np.ones(3), LABELS, GT, LABELS)])
    assert out["moving_pred_speed"] == out["moving_pred_along"] == 0.0
    assert out["moving_vel_err"] == 5.0 and out["static_pred_speed"] == 0.0


def test_matching_needs_class_score_and_distance() -> None:
    pred = np.array([_box(5, 0, 3.0, 4.0), _box(-8, 2.5, 1.0, 0.0), _box(0, 15, 0.0, 0.0)])
    scores = np.array([0.9, 0.2, 0.9])  # the second is below min_score
    labels = np.array([1, 0, 1])  # the first has the wrong class; the third is 3 m off
    out = velocity_by_motion([(pred, scores, labels, GT, LABELS)])
    assert out["moving_n"] == out["static_n"] == 0
    assert math.isnan(out["moving_pred_speed"]) and math.isnan(out["static_vel_err"])


def test_a_reversed_velocity_counts_against_the_truth() -> None:
    reversed_ = GT.copy()
    reversed_[:, 7:9] *= -1  # right speed, wrong direction (a yaw flipped by pi)
    out = velocity_by_motion([(reversed_, np.ones(3), LABELS, GT, LABELS)])
    assert out["moving_pred_speed"] == 5.0 and out["moving_pred_along"] == -5.0
    assert out["moving_vel_err"] == 10.0


def test_unknown_true_velocity_is_skipped() -> None:
    gt = GT.copy()
    gt[0, 7:9] = np.nan
    out = velocity_by_motion([(GT, np.ones(3), LABELS, gt, LABELS)])
    assert out["moving_n"] == 0 and out["static_n"] == 2
