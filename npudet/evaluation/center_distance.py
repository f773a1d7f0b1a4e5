"""nuScenes-style detection evaluation by BEV centre distance (pure numpy).

Re-implements the semantics of the nuScenes devkit detection benchmark
(``nuscenes/eval/detection/algo.py``: ``accumulate``, ``calc_ap``, ``calc_tp``; and
``nuscenes/eval/common/utils.py``) for boxes in the npudet BEV contract format
``(x, y, z, w, l, h, yaw, vx, vy)`` in the ego frame:

* Boxes (GT and predictions) whose BEV distance from the ego origin is not below the class range
  are dropped (devkit ``filter_eval_boxes``: ``ego_dist < class_range``).
* Per class and distance threshold, predictions of all samples are sorted by descending score
  (ties: later prediction first, as the devkit's ``sorted(...)[::-1]``) and greedily matched to
  the nearest not yet matched GT of that class in the same sample; a match needs
  ``distance < threshold`` (strict).
* Precision and confidence are interpolated at 101 recall points (``np.interp``, 0 beyond the
  highest recall reached). AP averages ``max(precision - min_precision, 0) / (1 - min_precision)``
  over recall points strictly above ``min_recall``.
* TP errors use the matches at the 2 m threshold: cumulative mean over descending confidence,
  interpolated at the recall points via the confidences, averaged from the first recall point
  above ``min_recall`` up to the highest recall reached; 1.0 when that range is empty (no TP, or
  the recall never exceeds ``min_recall``).
* As in the devkit, a class without any GT (after range filtering) gets AP 0 and errors 1;
  ``traffic_cone`` has no orientation/velocity error and ``barrier`` no velocity error (NaN,
  left out of the class means); ``barrier`` orientation is compared with period pi.
"""

from __future__ import annotations

from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

DEFAULT_DIST_THRESHOLDS = (0.5, 1.0, 2.0, 4.0)
TP_METRICS = ("trans_err", "scale_err", "orient_err", "vel_err")
TP_SUMMARY_KEYS = {
    "trans_err": "mATE",
    "scale_err": "mASE",
    "orient_err": "mAOE",
    "vel_err": "mAVE",
}
NUM_RECALL_POINTS = 101


def _as_boxes(boxes: Optional[np.ndarray]) -> np.ndarray:
    arr = np.zeros((0, 9)) if boxes is None else np.asarray(boxes, dtype=np.float64)
    arr = arr.reshape(-1, arr.shape[-1]) if arr.size else arr.reshape(0, 9)
    if arr.shape[1] < 9:
        raise ValueError(f"boxes must be (N, 9) (x, y, z, w, l, h, yaw, vx, vy), got {arr.shape}")
    return arr[:, :9]


def _as_1d(values: Optional[np.ndarray], n: int, dtype: type, name: str) -> np.ndarray:
    arr = np.zeros(0, dtype) if values is None else np.asarray(values, dtype=dtype).reshape(-1)
    if len(arr) != n:
        raise ValueError(f"{name} has {len(arr)} entries for {n} boxes")
    return arr


def center_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """BEV (xy) centre distance between boxes ``a`` (..., 9) and ``b`` (..., 9)."""
    return np.linalg.norm(a[..., :2] - b[..., :2], axis=-1)


def scale_iou(gt: np.ndarray, pred: np.ndarray) -> float:
    """IoU of two boxes (9,) after aligning centre and yaw (only w, l, h matter)."""
    gt_size, pred_size = gt[3:6], pred[3:6]
    if not (np.all(gt_size > 0) and np.all(pred_size > 0)):
        raise ValueError(f"box sizes must be > 0, got {gt_size} and {pred_size}")
    inter = float(np.prod(np.minimum(gt_size, pred_size)))
    union = float(np.prod(gt_size)) + float(np.prod(pred_size)) - inter
    return inter / union


def yaw_diff(gt_yaw: float, pred_yaw: float, period: float = 2 * np.pi) -> float:
    """Smallest absolute yaw difference in [0, pi] for the given periodicity (radians)."""
    diff = (gt_yaw - pred_yaw + period / 2) % period - period / 2
    if diff > np.pi:
        diff = diff - 2 * np.pi
    return float(abs(diff))


def _cummean(x: np.ndarray) -> np.ndarray:
    """NaN-aware cumulative mean; all-NaN input gives ones (as the devkit)."""
    if np.all(np.isnan(x)):
        return np.ones(len(x))
    sums = np.nancumsum(x.astype(np.float64))
    counts = np.cumsum(~np.isnan(x))
    return np.divide(sums, counts, out=np.zeros_like(sums), where=counts != 0)


def _no_predictions() -> Dict[str, np.ndarray]:
    """Metric data of a class with no GT or no match (devkit ``no_predictions``)."""
    data = {
        "recall": np.linspace(0, 1, NUM_RECALL_POINTS),
        "precision": np.zeros(NUM_RECALL_POINTS),
        "confidence": np.zeros(NUM_RECALL_POINTS),
    }
    for key in TP_METRICS:
        data[key] = np.ones(NUM_RECALL_POINTS)
    return data


def accumulate(
    gts: Sequence[np.ndarray],
    preds: Sequence[np.ndarray],
    scores: Sequence[np.ndarray],
    dist_th: float,
    class_name: str = "",
) -> Dict[str, np.ndarray]:
    """Match one class's predictions to GT at ``dist_th`` and build the 101-point curves.

    Args:
        gts: per sample, GT boxes (N_i, 9) of this class.
        preds: per sample, predicted boxes (K_i, 9) of this class.
        scores: per sample, prediction scores (K_i,).
        dist_th: BEV centre distance threshold in metres (match if distance < dist_th).
        class_name: used for the orientation period ('barrier': pi).

    Returns:
        dict of (101,) arrays: recall, precision, confidence and the four TP errors.
    """
    npos = sum(len(g) for g in gts)
    if npos == 0:
        return _no_predictions()
    sample_of = np.concatenate([np.full(len(p), i, dtype=np.int64) for i, p in enumerate(preds)])
    all_preds = np.concatenate([p.reshape(-1, 9) for p in preds], axis=0)
    all_scores = np.concatenate([np.reshape(s, -1) for s in scores]).astype(np.float64)
    # Descending score, ties broken by descending index (devkit: sorted((v, i))[::-1]).
    order = np.lexsort((np.arange(len(all_scores)), all_scores))[::-1]

    period = np.pi if class_name == "barrier" else 2 * np.pi
    taken = [np.zeros(len(g), dtype=bool) for g in gts]
    is_tp = np.zeros(len(order), dtype=np.float64)
    conf = all_scores[order]
    match_conf: List[float] = []
    errors: Dict[str, List[float]] = {key: [] for key in TP_METRICS}
    for rank, k in enumerate(order):
        s = sample_of[k]
        gt = gts[s]
        if len(gt) == 0:
            continue
        dist = center_distance(gt, all_preds[k])
        dist[taken[s]] = np.inf
        j = int(np.argmin(dist))  # first of equal minima, like the devkit's strict '<' scan
        if not dist[j] < dist_th:
            continue
        taken[s][j] = True
        is_tp[rank] = 1.0
        g, p = gt[j], all_preds[k]
        match_conf.append(float(all_scores[k]))
        errors["trans_err"].append(float(center_distance(g, p)))
        errors["vel_err"].append(float(np.linalg.norm(p[7:9] - g[7:9])))
        errors["scale_err"].append(1.0 - scale_iou(g, p))
        errors["orient_err"].append(yaw_diff(g[6], p[6], period))

    if not match_conf:
        return _no_predictions()

    tp = np.cumsum(is_tp)
    fp = np.cumsum(1.0 - is_tp)
    prec = tp / (tp + fp)
    rec = tp / float(npos)
    rec_interp = np.linspace(0, 1, NUM_RECALL_POINTS)
    data = {
        "recall": rec_interp,
        "precision": np.interp(rec_interp, rec, prec, right=0),
        "confidence": np.interp(rec_interp, rec, conf, right=0),
    }
    mconf = np.asarray(match_conf)
    for key in TP_METRICS:
        tmp = _cummean(np.asarray(errors[key], dtype=np.float64))
        # np.interp needs increasing x: reverse the (descending) confidences and back.
        data[key] = np.interp(data["confidence"][::-1], mconf[::-1], tmp[::-1])[::-1]
    return data


def calc_ap(md: Mapping[str, np.ndarray], min_recall: float, min_precision: float) -> float:
    """AP from 101-point metric data (devkit ``calc_ap``)."""
    if not (0 <= min_precision < 1 and 0 <= min_recall <= 1):
        raise ValueError(f"bad min_recall {min_recall} / min_precision {min_precision}")
    prec = np.array(md["precision"], dtype=np.float64)[round(100 * min_recall) + 1 :]
    prec = np.clip(prec - min_precision, 0, None)
    return float(np.mean(prec)) / (1.0 - min_precision)


def _max_recall_ind(md: Mapping[str, np.ndarray]) -> int:
    nonzero = np.nonzero(md["confidence"])[0]
    return int(nonzero[-1]) if len(nonzero) else 0


def calc_tp(md: Mapping[str, np.ndarray], min_recall: float, metric_name: str) -> float:
    """Mean TP error over recall points above ``min_recall`` (devkit ``calc_tp``)."""
    first = round(100 * min_recall) + 1
    last = _max_recall_ind(md)
    if last < first:
        return 1.0
    return float(np.mean(md[metric_name][first : last + 1]))


def _range_of(class_range: Union[None, float, Mapping[str, float]], name: str) -> float:
    if class_range is None:
        return np.inf
    if isinstance(class_range, Mapping):
        return float(class_range.get(name, np.inf))
    return float(class_range)


def _select(boxes: np.ndarray, labels: np.ndarray, label: int, max_dist: float) -> np.ndarray:
    """Mask (N,) of boxes of class ``label`` whose BEV distance from the origin is < max_dist."""
    return (labels == label) & (np.hypot(boxes[:, 0], boxes[:, 1]) < max_dist)


def _skip_tp(class_name: str, metric: str) -> bool:
    """Devkit: traffic cones have no orientation/velocity error, barriers no velocity error."""
    if class_name == "traffic_cone":
        return metric in ("orient_err", "vel_err")
    if class_name == "barrier":
        return metric == "vel_err"
    return False


def evaluate_center_distance(
    gt_boxes: Sequence[np.ndarray],
    gt_labels: Sequence[np.ndarray],
    pred_boxes: Sequence[np.ndarray],
    pred_scores: Sequence[np.ndarray],
    pred_labels: Sequence[np.ndarray],
    class_names: Sequence[str],
    class_range: Union[None, float, Mapping[str, float]] = None,
    dist_thresholds: Sequence[float] = DEFAULT_DIST_THRESHOLDS,
    dist_th_tp: float = 2.0,
    min_recall: float = 0.1,
    min_precision: float = 0.1,
) -> Dict[str, float]:
    """nuScenes-style mAP / TP errors / NDS over a set of samples (one list entry per sample).

    Args:
        gt_boxes: per sample, GT boxes (N_i, 9) ``(x, y, z, w, l, h, yaw, vx, vy)``, ego frame.
        gt_labels: per sample, (N_i,) class indices into ``class_names`` (others are ignored).
        pred_boxes: per sample, predicted boxes (K_i, 9).
        pred_scores: per sample, (K_i,) confidences.
        pred_labels: per sample, (K_i,) class indices.
        class_names: class names; 'barrier' and 'traffic_cone' get the devkit special cases.
        class_range: max BEV distance from the ego origin (m), one float for all classes or a
            dict per class name (missing: unlimited); None: no range filter. Boxes with
            ``hypot(x, y) >= range`` are dropped from GT and predictions.
        dist_thresholds: matching thresholds (m) for AP.
        dist_th_tp: threshold whose matches give the TP errors.
        min_recall, min_precision: AP / TP clipping as in the devkit (0.1, 0.1).

    Returns:
        dict of floats: 'mAP' (mean AP over classes and thresholds), 'NDS', 'mATE', 'mASE',
        'mAOE', 'mAVE' (NaN-aware means of the per-class errors; 1.0 if every class is NaN),
        'AP/{cls}' (mean over thresholds) and 'AP/{cls}@{th}' (th as ``float``, e.g. '@1.0').

        Without an attribute error there are 4 TP errors instead of the devkit's 5, and NDS is
        ``(4 * mAP + sum over the 4 errors of (1 - min(1, err))) / 8`` (the devkit's
        ``(5 * mAP + sum of 5 terms) / 10`` with the mAP weight equal to the number of terms).
    """
    n = len(gt_boxes)
    if not (len(gt_labels) == len(pred_boxes) == len(pred_scores) == len(pred_labels) == n):
        raise ValueError(
            "gt_boxes, gt_labels, pred_boxes, pred_scores, pred_labels differ in length"
        )
    gts, gls, pbs, pss, pls = [], [], [], [], []
    for i in range(n):
        gb = _as_boxes(gt_boxes[i])
        pb = _as_boxes(pred_boxes[i])
        gts.append(gb)
        gls.append(_as_1d(gt_labels[i], len(gb), np.int64, f"gt_labels[{i}]"))
        pbs.append(pb)
        pss.append(_as_1d(pred_scores[i], len(pb), np.float64, f"pred_scores[{i}]"))
        pls.append(_as_1d(pred_labels[i], len(pb), np.int64, f"pred_labels[{i}]"))

    thresholds = [float(t) for t in dist_thresholds]
    results: Dict[str, float] = {}
    class_aps: List[float] = []
    class_tp: Dict[str, List[float]] = {key: [] for key in TP_METRICS}
    for c, name in enumerate(class_names):
        max_dist = _range_of(class_range, name)

        g_c = [gb[_select(gb, gl, c, max_dist)] for gb, gl in zip(gts, gls)]
        keeps = [_select(pb, pl, c, max_dist) for pb, pl in zip(pbs, pls)]
        p_c = [pb[k] for pb, k in zip(pbs, keeps)]
        s_c = [ps[k] for ps, k in zip(pss, keeps)]

        data = {th: accumulate(g_c, p_c, s_c, th, name) for th in thresholds}
        if dist_th_tp not in data:
            data[dist_th_tp] = accumulate(g_c, p_c, s_c, dist_th_tp, name)
        aps = []
        for th in thresholds:
            ap = calc_ap(data[th], min_recall, min_precision)
            results[f"AP/{name}@{th}"] = ap
            aps.append(ap)
        results[f"AP/{name}"] = float(np.mean(aps)) if aps else 0.0
        class_aps.append(results[f"AP/{name}"])
        for key in TP_METRICS:
            err = np.nan if _skip_tp(name, key) else calc_tp(data[dist_th_tp], min_recall, key)
            class_tp[key].append(err)

    mean_ap = float(np.mean(class_aps)) if class_aps else 0.0
    results["mAP"] = mean_ap
    tp_scores = []
    for key in TP_METRICS:
        errs = np.asarray(class_tp[key], dtype=np.float64)
        err = float(np.nanmean(errs)) if np.any(~np.isnan(errs)) else 1.0
        results[TP_SUMMARY_KEYS[key]] = err
        tp_scores.append(1.0 - min(1.0, err))
    num_tp = len(TP_METRICS)
    results["NDS"] = float((num_tp * mean_ap + sum(tp_scores)) / (2 * num_tp))
    return results
