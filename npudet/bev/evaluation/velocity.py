"""Whether a BEV detector's velocity tells moving objects from static ones.

mAVE averages the velocity error over all true positives, so on a set where most objects
stand still a model that predicts zero for everything scores well, and mAVE alone cannot say
whether a model perceives motion. This splits the matched objects by their true speed: each
ground-truth box is matched to the nearest prediction of its class (score >= ``min_score``)
whose centre lies within ``max_dist`` metres (nuScenes' true-positive threshold, 2 m), and the
matched predictions' speed and velocity error are averaged separately over moving objects
(faster than ``MOVING_SPEED``, the attribute rule's 0.2 m/s) and static ones. A model that
carries motion predicts clearly higher speeds for the moving ones, and a velocity component
along their true direction of travel close to their speed.
"""

from __future__ import annotations

from typing import Dict, Iterable

import numpy as np

from ..infos.attributes import MOVING_SPEED
from .nearest_match import Frame, nearest_matches


def velocity_by_motion(
    frames: Iterable[Frame], max_dist: float = 2.0, min_score: float = 0.3
) -> Dict[str, float]:
    """Matched counts, true and predicted speeds (m/s), the predicted velocity's component
    along the true direction, and the velocity error, for moving and for static objects.

    Boxes are (x, y, z, w, l, h, yaw, vx, vy) in one frame per pair (e.g. the ego frame);
    a true box with an unknown (NaN) velocity is skipped. Keys: ``{moving,static}_{n,
    true_speed, pred_speed, pred_along, vel_err}``; means are NaN where nothing matched.
    """
    rows = []  # (moving, true speed, predicted speed, component along truth, error)
    for box, pred, _ in nearest_matches(frames, max_dist, min_score):
        if not np.isfinite(box[7:9]).all():
            continue
        vel, true = pred[7:9], box[7:9]
        speed = float(np.hypot(*true))
        along = float(vel @ true / speed) if speed > 0 else 0.0
        err = float(np.hypot(*(vel - true)))
        rows.append((speed > MOVING_SPEED, speed, float(np.hypot(*vel)), along, err))
    table = np.array(rows, dtype=float).reshape(-1, 5)
    out: Dict[str, float] = {}
    for name, mask in (("moving", table[:, 0] == 1), ("static", table[:, 0] == 0)):
        part = table[mask]
        out[f"{name}_n"] = int(len(part))
        for i, key in enumerate(("true_speed", "pred_speed", "pred_along", "vel_err"), start=1):
            out[f"{name}_{key}"] = float(part[:, i].mean()) if len(part) else float("nan")
    return out
