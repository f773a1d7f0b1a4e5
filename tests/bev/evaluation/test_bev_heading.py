"""Per-class heading error distribution (npudet.bev.evaluation.heading)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from npudet.bev.evaluation.heading import concentration, heading_errors, markdown, wrap

YAWS = np.array([0.1, 1.2, -2.0, 3.0, -0.7, 2.2])
GT = np.array([[4.0 * i, 2.0, 0.8, 1.9, 4.6, 1.7, y, 0.0, 0.0] for i, y in enumerate(YAWS)])
LABELS = np.array([0, 0, 0, 1, 1, 1])
NAMES = ("car", "pedestrian")


def _with_yaw(yaw: np.ndarray) -> np.ndarray:
    pred = GT.copy()
    pred[:, 6] = yaw
    return pred


def _errors(pred: np.ndarray) -> dict:
    return heading_errors([(pred, np.ones(len(pred)), LABELS, GT, LABELS)], NAMES)


def test_wrap() -> None:
    assert np.allclose(
        wrap([0.0, math.pi, -math.pi, 3 * math.pi / 2]), [0, math.pi, math.pi, -math.pi / 2]
    )


def test_learned_heading() -> None:
    out = _errors(_with_yaw(YAWS + 0.05))
    for name in NAMES:
        assert out[name]["n"] == 3
        assert math.isclose(out[name]["mean_abs"], 0.05, abs_tol=1e-9)
        assert out[name]["within_45"] == 1.0 and out[name]["flipped"] == 0.0
        assert out[name]["hist"] == [0, 0, 0, 0, 3, 0, 0, 0]


def test_flipped_heading() -> None:
    out = _errors(_with_yaw(YAWS + math.pi - 0.05))
    for name in NAMES:
        assert out[name]["flipped"] == 1.0
        assert out[name]["hist"] == [0, 0, 0, 0, 0, 0, 0, 3]


def test_one_heading_for_everything() -> None:
    """A model that predicts yaw 0 whatever the object: its headings are fully concentrated
    while the true ones are not."""
    out = _errors(_with_yaw(np.zeros(len(YAWS))))
    assert out["car"]["pred_concentration"] == pytest.approx(1.0)
    assert out["car"]["true_concentration"] < 0.5
    assert "| car | 3 |" in markdown(out)


def test_one_view_angle_for_everything() -> None:
    """A head coding the view angle that predicts 0 for it: headings follow the bearings
    (not concentrated), the view angles are all one."""
    bearing = np.arctan2(GT[:, 1], GT[:, 0])
    out = _errors(_with_yaw(bearing))
    assert out["car"]["pred_view_concentration"] == pytest.approx(1.0)
    assert out["car"]["pred_concentration"] < 0.9


def test_unmatched_and_bad_label() -> None:
    far = GT.copy()
    far[:, 1] += 10.0  # every prediction 10 m from every true box
    assert _errors(far)["car"]["n"] == 0
    with pytest.raises(ValueError, match="class_names"):
        heading_errors([(GT, np.ones(6), LABELS + 1, GT, LABELS + 1)], NAMES)
    assert concentration(np.array([0.0, math.pi])) == pytest.approx(0.0, abs=1e-12)
