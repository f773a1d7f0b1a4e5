"""``FastCocoMetric``: mmdet's CocoMetric on a chosen backend (faster-coco-eval or pycocotools).

mmdet 3.3's CocoMetric calls pycocotools through the module-level names ``COCO`` and
``COCOeval`` of ``mmdet.evaluation.metrics.coco_metric`` (``use_mp_eval`` only spreads
pycocotools over processes; mmdet 3.3 has no faster-coco-eval path). This subclass points
those two names at the chosen backend while its own ``__init__`` and ``compute_metrics`` run,
so the whole of mmdet's evaluation logic (parameters, the 12 numbers, classwise tables) is
reused unchanged.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Dict, Iterator

import mmdet.evaluation.metrics.coco_metric as mmdet_coco_metric
from mmdet.evaluation.metrics import CocoMetric
from mmdet.registry import METRICS
from mmengine.logging import MMLogger

from .coco_backend import coco_backend


@METRICS.register_module()
class FastCocoMetric(CocoMetric):
    """mmdet's ``CocoMetric`` with ``backend='auto' | 'faster_coco_eval' | 'pycocotools'``.

    ``auto`` takes faster-coco-eval when installed, pycocotools otherwise. mmdet's
    ``use_mp_eval=True`` (its multi-process pycocotools evaluation) needs pycocotools: with
    ``auto`` it selects pycocotools, with ``faster_coco_eval`` it is refused. Every other
    argument is CocoMetric's.
    """

    def __init__(self, *args: Any, backend: str = "auto", **kwargs: Any) -> None:
        if kwargs.get("use_mp_eval"):
            if backend == "faster_coco_eval":
                raise ValueError(
                    "backend='faster_coco_eval' cannot run with use_mp_eval=True "
                    "(mmdet's multi-process evaluation is pycocotools only)"
                )
            backend = "pycocotools"
        self.backend = coco_backend(backend)
        with self._backend_classes():
            super().__init__(*args, **kwargs)

    @contextmanager
    def _backend_classes(self) -> Iterator[None]:
        # Swap the two names mmdet's CocoMetric looks up at call time, and always restore
        # them, so plain CocoMetric instances keep pycocotools.
        saved = mmdet_coco_metric.COCO, mmdet_coco_metric.COCOeval
        mmdet_coco_metric.COCO = self.backend.coco
        mmdet_coco_metric.COCOeval = self.backend.cocoeval
        try:
            yield
        finally:
            mmdet_coco_metric.COCO, mmdet_coco_metric.COCOeval = saved

    def compute_metrics(self, results: list) -> Dict[str, float]:
        """mmdet's ``CocoMetric.compute_metrics`` run on this metric's backend."""
        MMLogger.get_current_instance().info(f"COCO evaluation backend: {self.backend.name}")
        with self._backend_classes():
            return super().compute_metrics(results)
