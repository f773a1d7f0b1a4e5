"""nuScenes box attributes: the devkit's names, and a box's attribute from its class and speed.

A detector without an attribute branch is scored on nuScenes with an attribute chosen from the
predicted class and velocity (mmdet3d's and BEVFormer's ``NuScenesDataset._format_bbox``):
faster than 0.2 m/s, vehicles are ``vehicle.moving`` and bicycles/motorcycles
``cycle.with_rider``; slower, pedestrians are ``pedestrian.standing`` and buses
``vehicle.stopped``; every other case takes the class default (``DEFAULT_ATTRIBUTE``). The
synthetic generator labels its ground truth with the same rule on the true velocity.
"""

from __future__ import annotations

import math
from typing import Dict, Tuple

# nuscenes-devkit 1.2.0, nuscenes/eval/detection/constants.py (order kept)
ATTRIBUTE_NAMES: Tuple[str, ...] = (
    "pedestrian.moving",
    "pedestrian.sitting_lying_down",
    "pedestrian.standing",
    "cycle.with_rider",
    "cycle.without_rider",
    "vehicle.moving",
    "vehicle.parked",
    "vehicle.stopped",
)
# mmdet3d NuScenesDataset.DefaultAttribute; '' = the class has no attribute
DEFAULT_ATTRIBUTE: Dict[str, str] = {
    "car": "vehicle.parked",
    "pedestrian": "pedestrian.moving",
    "trailer": "vehicle.parked",
    "truck": "vehicle.parked",
    "bus": "vehicle.moving",
    "motorcycle": "cycle.without_rider",
    "construction_vehicle": "vehicle.parked",
    "bicycle": "cycle.without_rider",
    "barrier": "",
    "traffic_cone": "",
}
MOVING_SPEED = 0.2  # m/s
_VEHICLES = ("car", "construction_vehicle", "bus", "truck", "trailer")
_CYCLES = ("bicycle", "motorcycle")


def attribute_from_velocity(class_name: str, vx: float, vy: float) -> str:
    """Attribute name ('' for none) of a box of ``class_name`` moving at ``(vx, vy)`` m/s.

    Classes outside nuScenes' ten have no attribute ('').
    """
    if math.hypot(vx, vy) > MOVING_SPEED:
        if class_name in _VEHICLES:
            return "vehicle.moving"
        if class_name in _CYCLES:
            return "cycle.with_rider"
    else:
        if class_name == "pedestrian":
            return "pedestrian.standing"
        if class_name == "bus":
            return "vehicle.stopped"
    return DEFAULT_ATTRIBUTE.get(class_name, "")
