"""mmengine metric: nuScenes detection (mAP, five TP errors, NDS) on BEV predictions."""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

import numpy as np
from mmdet.registry import METRICS
from mmengine.evaluator import BaseMetric
from mmengine.logging import MMLogger

from .center_distance import (
    DEFAULT_DIST_THRESHOLDS,
    TP_METRICS,
    TP_SUMMARY_KEYS,
    evaluate_center_distance,
)


def _get(obj: Any, key: str) -> Any:
    """``obj[key]`` for dicts, ``getattr(obj, key)`` for data elements; None if absent."""
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def _to_numpy(value: Any, dtype: type) -> np.ndarray:
    """Tensor / array / list (or a box object with ``.tensor``) as a numpy array."""
    if value is None:
        return np.zeros(0, dtype)
    if hasattr(value, "tensor"):  # mmdet3d-style box structure
        value = value.tensor
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value, dtype=dtype)


def _boxes(value: Any) -> np.ndarray:
    arr = _to_numpy(value, np.float64)
    return arr.reshape(0, 9) if arr.size == 0 else arr.reshape(-1, arr.shape[-1])


def _eval_frame(ann: Any) -> np.ndarray:
    """(4, 4) box frame -> the devkit's frame (global axes centred at the ego pose); identity
    when ``ann`` has no ``ego2global``. Without ``ego_pose_translation`` the box frame's origin
    is the centre."""
    ego2global = _get(ann, "ego2global")
    if ego2global is None:
        return np.eye(4)
    frame = np.array(ego2global, dtype=np.float64).reshape(4, 4)
    origin = _get(ann, "ego_pose_translation")
    if origin is None:
        frame[:3, 3] = 0.0
    else:
        frame[:3, 3] -= np.asarray(origin, np.float64).reshape(3)
    return frame


@METRICS.register_module()
class BEVDetMetric(BaseMetric):
    """nuScenes detection metric: mAP by BEV centre distance, five TP errors, NDS.

    Computes what nuscenes-devkit's ``DetectionEval`` does (see ``evaluate_center_distance``).
    Predictions carry no attribute: each box gets the one its class and velocity give
    (``attribute_from_velocity``, as mmdet3d formats a detector without attribute head).

    Args:
        classes: class names; None: ``dataset_meta['classes']``.
        dist_thresholds: AP matching thresholds in metres.
        class_range: max BEV distance from the ego (m), a float for all classes or a dict per
            class name (nuScenes: ``detection_cvpr_2019``'s ``class_range``); boxes at or beyond
            it are dropped from GT and predictions.
        collect_device, prefix, collect_dir: as ``mmengine.evaluator.BaseMetric``.

    ``process`` reads ``data_sample['eval_ann_info']`` (``gt_boxes`` (N, 9), ``gt_labels`` (N,),
    ``gt_attrs`` (N,) attribute names or '', ``sample_idx``; optional ``ego2global`` (4, 4) and
    ``ego_pose_translation`` (3,): boxes are then compared in global axes centred at the ego
    pose, as the devkit) and ``data_sample['pred_instances_3d']`` (``bboxes_3d`` (K, 9),
    ``scores_3d`` (K,), ``labels_3d`` (K,)).
    """

    default_prefix: Optional[str] = "bev"

    def __init__(
        self,
        classes: Optional[Sequence[str]] = None,
        dist_thresholds: Sequence[float] = DEFAULT_DIST_THRESHOLDS,
        class_range: Union[float, Mapping[str, float], None] = 50.0,
        collect_device: str = "cpu",
        prefix: Optional[str] = None,
        collect_dir: Optional[str] = None,
    ) -> None:
        super().__init__(collect_device=collect_device, prefix=prefix, collect_dir=collect_dir)
        self.classes = list(classes) if classes is not None else None
        self.dist_thresholds = tuple(float(t) for t in dist_thresholds)
        self.class_range = dict(class_range) if isinstance(class_range, Mapping) else class_range

    def process(self, data_batch: Any, data_samples: Sequence[Any]) -> None:
        """Keep GT and predictions of each sample as numpy arrays."""
        for sample in data_samples:
            ann = _get(sample, "eval_ann_info")
            pred = _get(sample, "pred_instances_3d")
            if ann is None:
                raise KeyError("BEVDetMetric needs data_sample['eval_ann_info'] (gt_boxes, ...)")
            if pred is None:
                raise KeyError("BEVDetMetric needs data_sample['pred_instances_3d']")
            gt_attrs = _get(ann, "gt_attrs")
            if gt_attrs is None:
                raise KeyError(
                    "BEVDetMetric needs data_sample['eval_ann_info']['gt_attrs'] (one nuScenes "
                    "attribute name or '' per GT box)"
                )
            pred_boxes = _boxes(_get(pred, "bboxes_3d"))
            self.results.append(
                dict(
                    sample_idx=_get(ann, "sample_idx"),
                    gt_boxes=_boxes(_get(ann, "gt_boxes")),
                    gt_labels=_to_numpy(_get(ann, "gt_labels"), np.int64).reshape(-1),
                    gt_attrs=[str(a) for a in gt_attrs],
                    eval_frame=_eval_frame(ann),
                    pred_boxes=pred_boxes,
                    pred_scores=_to_numpy(_get(pred, "scores_3d"), np.float64).reshape(-1),
                    pred_labels=_to_numpy(_get(pred, "labels_3d"), np.int64).reshape(-1),
                )
            )

    def _class_names(self) -> List[str]:
        if self.classes is not None:
            return self.classes
        meta = self.dataset_meta or {}
        if "classes" not in meta:
            raise ValueError("BEVDetMetric: pass classes= or set dataset_meta['classes']")
        return list(meta["classes"])

    def compute_metrics(self, results: List[dict]) -> Dict[str, float]:
        """Evaluate all collected samples; logs a per-class table and returns the metric dict."""
        classes = self._class_names()
        metrics = evaluate_center_distance(
            gt_boxes=[r["gt_boxes"] for r in results],
            gt_labels=[r["gt_labels"] for r in results],
            pred_boxes=[r["pred_boxes"] for r in results],
            pred_scores=[r["pred_scores"] for r in results],
            pred_labels=[r["pred_labels"] for r in results],
            class_names=classes,
            class_range=self.class_range,
            dist_thresholds=self.dist_thresholds,
            gt_attrs=[r["gt_attrs"] for r in results],
            eval_frames=[r["eval_frame"] for r in results],
        )
        MMLogger.get_current_instance().info(
            f"BEV detection on {len(results)} samples\n"
            + format_table(metrics, classes, self.dist_thresholds)
        )
        return metrics


def format_table(
    metrics: Mapping[str, float], classes: Sequence[str], dist_thresholds: Sequence[float]
) -> str:
    """Per-class AP at each threshold and TP errors, plus the summary line, as fixed-width text."""
    ths = [float(t) for t in dist_thresholds]
    width = max([5] + [len(c) for c in classes])
    tp_heads = [TP_SUMMARY_KEYS[key][1:] for key in TP_METRICS]  # ATE, ASE, ...
    head = ["class".ljust(width)] + [f"AP@{t:g}".rjust(7) for t in ths] + ["AP".rjust(7)]
    lines = [" ".join(head + [h.rjust(7) for h in tp_heads])]
    for name in classes:
        cells = [name.ljust(width)]
        cells += [f"{metrics[f'AP/{name}@{t}']:.4f}".rjust(7) for t in ths]
        cells.append(f"{metrics[f'AP/{name}']:.4f}".rjust(7))
        cells += [f"{metrics[f'{key}/{name}']:.4f}".rjust(7) for key in TP_METRICS]
        lines.append(" ".join(cells))
    summary = ("mAP", "NDS", *(TP_SUMMARY_KEYS[key] for key in TP_METRICS))
    lines.append("  ".join(f"{key} {metrics[key]:.4f}" for key in summary))
    return "\n".join(lines)
