"""Print the 12 COCO box numbers as a table and save them as JSON in the work dir."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from mmdet.registry import HOOKS
from mmengine.dist import master_only
from mmengine.hooks import Hook

# mmdet's CocoMetric item names (recall at 100 / 300 / 1000 detections) and our labels.
COCO_ITEMS = (
    ("mAP", "AP"),
    ("mAP_50", "AP50"),
    ("mAP_75", "AP75"),
    ("mAP_s", "APs"),
    ("mAP_m", "APm"),
    ("mAP_l", "APl"),
    ("AR@100", "AR@100"),
    ("AR@300", "AR@300"),
    ("AR@1000", "AR@1000"),
    ("AR_s@1000", "ARs@1000"),
    ("AR_m@1000", "ARm@1000"),
    ("AR_l@1000", "ARl@1000"),
)


def coco_table(metrics: Dict[str, float], prefix: str = "coco/bbox_") -> Optional[str]:
    """The COCO numbers found in ``metrics`` as a two-row text table (None if none)."""
    cells = [(label, metrics[prefix + key]) for key, label in COCO_ITEMS if prefix + key in metrics]
    if not cells:
        return None
    widths = [max(len(label), 6) for label, _ in cells]
    head = " | ".join(label.rjust(w) for (label, _), w in zip(cells, widths))
    row = " | ".join(f"{value:.3f}".rjust(w) for (_, value), w in zip(cells, widths))
    return f"{head}\n{row}"


@HOOKS.register_module()
class CocoSummaryHook(Hook):
    """After each val / test epoch: log the COCO table, write ``coco_bbox_<mode>.json``."""

    priority = "LOW"

    def after_val_epoch(self, runner: Any, metrics: Optional[Dict[str, float]] = None) -> None:
        self._report(runner, "val", metrics)

    def after_test_epoch(self, runner: Any, metrics: Optional[Dict[str, float]] = None) -> None:
        self._report(runner, "test", metrics)

    @master_only
    def _report(self, runner: Any, mode: str, metrics: Optional[Dict[str, float]]) -> None:
        table = coco_table(metrics or {})
        if table is None:
            return
        runner.logger.info(
            f"COCO bbox ({mode}, epoch {runner.epoch}, iter {runner.iter}):\n{table}"
        )
        record = dict(
            mode=mode,
            epoch=runner.epoch,
            iter=runner.iter,
            bbox={
                label: metrics["coco/bbox_" + key]
                for key, label in COCO_ITEMS
                if "coco/bbox_" + key in metrics
            },
        )
        path = os.path.join(runner.work_dir, f"coco_bbox_{mode}.json")
        with open(path, "w") as f:
            json.dump(record, f, indent=1)
