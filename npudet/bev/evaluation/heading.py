"""Where a BEV detector's heading errors fall, per class: flipped, turned or unlearned.

mAOE is one mean; the distribution of the signed error ``pred_yaw - true_yaw`` (wrapped to
(-pi, pi]) over matched objects tells its causes apart: a peak at 0 is learned, at +-pi the
front and back are swapped, at +-pi/2 the length and width are, and a spread as wide as the
true headings' is unlearned. How concentrated the *predicted* headings are says whether the
model predicts one heading for everything (concentration 1) whatever the true ones are; the
same for the view angle (heading minus the bearing ``atan2(y, x)`` from the ego), one view
angle for everything being the same collapse for a head that codes that angle.
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Sequence

import numpy as np

from .nearest_match import Frame, nearest_matches

HIST_BINS = 8  # 45 degrees each, the first starting at -pi


def wrap(angle: np.ndarray) -> np.ndarray:
    """Angles wrapped to (-pi, pi]."""
    return np.pi - np.mod(np.pi - np.asarray(angle, float), 2 * np.pi)


def concentration(angles: np.ndarray) -> float:
    """Mean resultant length of angles (radians): 1 all equal, ~0 spread evenly; NaN if none."""
    angles = np.asarray(angles, float)
    return float(np.hypot(np.cos(angles).mean(), np.sin(angles).mean())) if len(angles) else np.nan


def heading_errors(
    frames: Iterable[Frame],
    class_names: Sequence[str],
    max_dist: float = 2.0,
    min_score: float = 0.3,
) -> Dict[str, Dict[str, object]]:
    """Per class: matched count ``n``, ``mean_abs`` error (rad), ``hist`` (HIST_BINS counts of
    the signed error from -pi), ``within_45`` and ``flipped`` (|error| > 135 degrees) shares,
    and the concentration of the predicted and of the true headings and view angles.

    Each true box is paired with the nearest prediction of its class (``nearest_matches``);
    the signed error is taken over 2 pi for every class (a class symmetric under a half turn,
    nuScenes' barrier, shows its flips as the +-pi bins).
    """
    pairs: Dict[int, List[tuple]] = {i: [] for i in range(len(class_names))}
    for gt, pred, label in nearest_matches(frames, max_dist, min_score):
        if label >= len(class_names):
            raise ValueError(f"label {label} has no name in class_names {list(class_names)}")
        view = np.arctan2([gt[1], pred[1]], [gt[0], pred[0]])
        pairs[label].append((gt[6], pred[6], gt[6] - view[0], pred[6] - view[1]))
    out: Dict[str, Dict[str, object]] = {}
    edges = np.linspace(-np.pi, np.pi, HIST_BINS + 1)
    for i, name in enumerate(class_names):
        yaws = np.array(pairs[i], float).reshape(-1, 4)
        err = wrap(yaws[:, 1] - yaws[:, 0])
        n = len(err)
        out[name] = dict(
            n=n,
            mean_abs=float(np.abs(err).mean()) if n else float("nan"),
            hist=np.histogram(err, edges)[0].tolist(),
            within_45=float((np.abs(err) <= np.pi / 4).mean()) if n else float("nan"),
            flipped=float((np.abs(err) > 3 * np.pi / 4).mean()) if n else float("nan"),
            pred_concentration=concentration(yaws[:, 1]),
            true_concentration=concentration(yaws[:, 0]),
            pred_view_concentration=concentration(yaws[:, 3]),
            true_view_concentration=concentration(yaws[:, 2]),
        )
    return out


def markdown(errors: Dict[str, Dict[str, object]]) -> str:
    """The per-class table of :func:`heading_errors`."""
    lines = [
        "| class | matched | mean abs error (rad) | within 45 deg | flipped (> 135 deg) | "
        "error histogram, 45 deg bins from -180 | predicted / true heading concentration | "
        "predicted / true view angle concentration |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, e in errors.items():
        lines.append(
            f"| {name} | {e['n']} | {e['mean_abs']:.2f} | {e['within_45']:.2f} | "
            f"{e['flipped']:.2f} | {' '.join(str(c) for c in e['hist'])} | "
            f"{e['pred_concentration']:.2f} / {e['true_concentration']:.2f} | "
            f"{e['pred_view_concentration']:.2f} / {e['true_view_concentration']:.2f} |"
        )
    return "\n".join(lines)
