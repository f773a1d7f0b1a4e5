"""nuScenes detection evaluation by BEV centre distance (pure numpy), as the devkit computes it.

Re-implements nuscenes-devkit 1.2.0's ``DetectionEval`` (``nuscenes/eval/detection/algo.py``:
``accumulate``, ``calc_ap``, ``calc_tp``; ``data_classes.py``: ``DetectionMetrics``;
``nuscenes/eval/common/utils.py``; ``loaders.py``: ``filter_eval_boxes``) for boxes in the npudet
BEV contract format ``(x, y, z, w, l, h, yaw, vx, vy)`` with one nuScenes attribute name per box
(``''``: none):

* Each sample's boxes may first be moved into an evaluation frame (``eval_frames``); the devkit's
  is global axes centred at the ego pose, where it measures distances, yaw and velocity.
* Boxes (GT and predictions) whose xy distance from that frame's origin is not below the class
  range are dropped (devkit ``filter_eval_boxes``: ``ego_dist < class_range``).
* Per class and distance threshold, predictions of all samples are sorted by descending score
  (ties: later prediction first, as the devkit's ``sorted(...)[::-1]``) and greedily matched to
  the nearest not yet matched GT of that class in the same sample; a match needs
  ``distance < threshold`` (strict).
* Precision and confidence are interpolated at 101 recall points (``np.interp``, 0 beyond the
  highest recall reached). AP averages ``max(precision - min_precision, 0) / (1 - min_precision)``
  over recall points strictly above ``min_recall``; mAP averages over thresholds and classes.
* The five TP errors use the matches at ``dist_th_tp`` (2 m): translation, 1 - scale IoU, yaw,
  velocity and 1 - attribute accuracy (NaN for a GT without attribute or velocity); NaN-aware
  cumulative mean over descending confidence (all NaN: ones), interpolated at the recall points
  via the confidences, averaged from the first recall point above ``min_recall`` up to the
  highest recall reached; 1.0 when that range is empty (no TP, or the recall never exceeds
  ``min_recall``). A class without GT (after range filtering) gets AP 0 and errors 1.
* ``traffic_cone`` has no orientation, velocity or attribute error and ``barrier`` no velocity or
  attribute error (NaN); ``barrier`` orientation is compared with period pi. The mean errors
  (mATE, mASE, mAOE, mAVE, mAAE) are NaN-ignoring means over classes (NaN if all are NaN), and
  ``NDS = (5 mAP + sum over the five errors of (1 - min(1, err))) / 10``, a NaN error scoring 0.
"""

from __future__ import annotations

import math
from typing import Dict, List, Mapping, Optional, Sequence, Union

import numpy as np

from ..infos.attributes import attribute_from_velocity

DEFAULT_DIST_THRESHOLDS = (0.5, 1.0, 2.0, 4.0)
TP_METRICS = ("trans_err", "scale_err", "orient_err", "vel_err", "attr_err")
TP_SUMMARY_KEYS = {
    "trans_err": "mATE",
    "scale_err": "mASE",
    "orient_err": "mAOE",
    "vel_err": "mAVE",
    "attr_err": "mAAE",
}
MEAN_AP_WEIGHT = 5.0  # detection_cvpr_2019's mean_ap_weight
NUM_RECALL_POINTS = 101
# TP errors the devkit leaves out per class (NaN)
_UNDEFINED_TP = {
    "traffic_cone": ("orient_err", "vel_err", "attr_err"),
    "barrier": ("vel_err", "attr_err"),
}


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


def _as_attrs(values: Optional[Sequence[str]], n: int, name: str) -> np.ndarray:
    """(n,) object array of attribute names; None: '' (no attribute) for every box."""
    if values is None:
        return np.full(n, "", dtype=object)
    arr = np.asarray(list(values), dtype=object)
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


def attr_err(gt_attr: str, pred_attr: str) -> float:
    """1 - attribute accuracy of a match; NaN when the GT has no attribute (devkit ``attr_acc``)."""
    return math.nan if gt_attr == "" else float(gt_attr != pred_attr)


def transform_boxes(boxes: np.ndarray, frame: np.ndarray) -> np.ndarray:
    """Boxes (N, 9) moved by the (4, 4) transform ``frame``: centre, yaw of the rotated box x axis
    projected on xy, and velocity ``(vx, vy, 0)`` rotated (its xy part kept)."""
    rot, shift = frame[:3, :3], frame[:3, 3]
    out = boxes.copy()
    out[:, :3] = boxes[:, :3] @ rot.T + shift
    axis = np.stack([np.cos(boxes[:, 6]), np.sin(boxes[:, 6]), np.zeros(len(boxes))], 1) @ rot.T
    out[:, 6] = np.arctan2(axis[:, 1], axis[:, 0])
    vel = np.concatenate([boxes[:, 7:9], np.zeros((len(boxes), 1))], 1) @ rot.T
    out[:, 7:9] = vel[:, :2]
    return out


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
    gt_attrs: Optional[Sequence[Sequence[str]]] = None,
    pred_attrs: Optional[Sequence[Sequence[str]]] = None,
) -> Dict[str, np.ndarray]:
    """Match one class's predictions to GT at ``dist_th`` and build the 101-point curves.

    Args:
        gts: per sample, GT boxes (N_i, 9) of this class.
        preds: per sample, predicted boxes (K_i, 9) of this class.
        scores: per sample, prediction scores (K_i,).
        dist_th: BEV centre distance threshold in metres (match if distance < dist_th).
        class_name: used for the orientation period ('barrier': pi).
        gt_attrs, pred_attrs: per sample, (N_i,) / (K_i,) attribute names; None: no attributes
            ('' everywhere, so every attribute error is NaN).

    Returns:
        dict of (101,) arrays: recall, precision, confidence and the five TP errors.
    """
    npos = sum(len(g) for g in gts)
    if npos == 0:
        return _no_predictions()
    gt_attrs = gt_attrs if gt_attrs is not None else [[""] * len(g) for g in gts]
    pred_attrs = pred_attrs if pred_attrs is not None else [[""] * len(p) for p in preds]
    sample_of = np.concatenate([np.full(len(p), i, dtype=np.int64) for i, p in enumerate(preds)])
    index_in = np.concatenate([np.arange(len(p)) for p in preds])
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
        errors["attr_err"].append(attr_err(gt_attrs[s][j], pred_attrs[s][index_in[k]]))

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


def nd_score(
    mean_ap: float, tp_errors: Mapping[str, float], mean_ap_weight: float = MEAN_AP_WEIGHT
) -> float:
    """nuScenes detection score ``(w mAP + sum_k (1 - min(1, err_k))) / (w + 5)``, w = 5.

    ``tp_errors`` maps each of ``TP_METRICS`` to its class-mean error; a NaN error (every class
    undefined) scores 0, as the devkit's ``max(0, 1 - nan)``.
    """
    if set(tp_errors) != set(TP_METRICS):
        raise ValueError(f"tp_errors must have the keys {TP_METRICS}, got {sorted(tp_errors)}")
    scores = [0.0 if math.isnan(err) else 1.0 - min(1.0, err) for err in tp_errors.values()]
    return float((mean_ap_weight * mean_ap + sum(scores)) / (mean_ap_weight + len(scores)))


def _range_of(class_range: Union[None, float, Mapping[str, float]], name: str) -> float:
    if class_range is None:
        return np.inf
    if isinstance(class_range, Mapping):
        return float(class_range.get(name, np.inf))
    return float(class_range)


def _select(boxes: np.ndarray, labels: np.ndarray, label: int, max_dist: float) -> np.ndarray:
    """Mask (N,) of boxes of class ``label`` whose BEV distance from the origin is < max_dist."""
    return (labels == label) & (np.hypot(boxes[:, 0], boxes[:, 1]) < max_dist)


def _nan_mean(values: Sequence[float]) -> float:
    """Mean ignoring NaN; NaN when every value is NaN (devkit ``np.nanmean``, without warning)."""
    arr = np.asarray(values, dtype=np.float64)
    return float(np.mean(arr[~np.isnan(arr)])) if np.any(~np.isnan(arr)) else math.nan


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
    gt_attrs: Optional[Sequence[Sequence[str]]] = None,
    pred_attrs: Optional[Sequence[Sequence[str]]] = None,
    eval_frames: Optional[Sequence[np.ndarray]] = None,
) -> Dict[str, float]:
    """nuScenes mAP / five TP errors / NDS over a set of samples (one list entry per sample).

    Args:
        gt_boxes: per sample, GT boxes (N_i, 9) ``(x, y, z, w, l, h, yaw, vx, vy)``; a NaN
            velocity (unknown, as nuScenes' ``box_velocity``) gives a NaN velocity error.
        gt_labels: per sample, (N_i,) class indices into ``class_names`` (others are ignored).
        pred_boxes: per sample, predicted boxes (K_i, 9).
        pred_scores: per sample, (K_i,) confidences.
        pred_labels: per sample, (K_i,) class indices.
        class_names: class names; 'barrier' and 'traffic_cone' get the devkit special cases.
        class_range: max BEV distance from the evaluation frame's origin (m), one float for all
            classes or a dict per class name (missing: unlimited); None: no range filter. Boxes
            with ``hypot(x, y) >= range`` are dropped from GT and predictions.
        dist_thresholds: matching thresholds (m) for AP.
        dist_th_tp: threshold whose matches give the TP errors.
        min_recall, min_precision: AP / TP clipping as in the devkit (0.1, 0.1).
        gt_attrs: per sample, (N_i,) nuScenes attribute names ('' for none); None: none.
        pred_attrs: per sample, (K_i,) attribute names; None: from each box's class and
            velocity in the evaluation frame (``attribute_from_velocity``).
        eval_frames: per sample, a (4, 4) transform of its GT and predicted boxes into the frame
            where they are compared and range-filtered (nuScenes: global axes centred at the ego
            pose); None: the boxes' own frame.

    Returns:
        dict of floats: 'mAP' (mean AP over classes and thresholds), 'NDS', 'mATE', 'mASE',
        'mAOE', 'mAVE', 'mAAE' (NaN-ignoring means of the per-class errors; NaN if every class
        is NaN), 'AP/{cls}' (mean over thresholds), 'AP/{cls}@{th}' (th as ``float``, e.g.
        '@1.0') and '{tp_metric}/{cls}' (e.g. 'trans_err/car', NaN where undefined).
    """
    n = len(gt_boxes)
    optional = [a for a in (gt_attrs, pred_attrs, eval_frames) if a is not None]
    if any(len(a) != n for a in (gt_labels, pred_boxes, pred_scores, pred_labels, *optional)):
        raise ValueError(
            "gt_boxes, gt_labels, pred_boxes, pred_scores, pred_labels (and gt_attrs, "
            "pred_attrs, eval_frames when given) differ in length"
        )
    gts, gls, gas, pbs, pss, pls, pas = [], [], [], [], [], [], []
    for i in range(n):
        gb = _as_boxes(gt_boxes[i])
        pb = _as_boxes(pred_boxes[i])
        if eval_frames is not None:
            frame = np.asarray(eval_frames[i], dtype=np.float64)
            if frame.shape != (4, 4):
                raise ValueError(f"eval_frames[{i}] must be a (4, 4) transform, got {frame.shape}")
            gb, pb = transform_boxes(gb, frame), transform_boxes(pb, frame)
        labels = _as_1d(pred_labels[i], len(pb), np.int64, f"pred_labels[{i}]")
        if pred_attrs is None:
            names = [class_names[c] if 0 <= c < len(class_names) else "" for c in labels]
            attrs = [attribute_from_velocity(c, b[7], b[8]) for c, b in zip(names, pb)]
        else:
            attrs = pred_attrs[i]
        gts.append(gb)
        gls.append(_as_1d(gt_labels[i], len(gb), np.int64, f"gt_labels[{i}]"))
        gas.append(_as_attrs(None if gt_attrs is None else gt_attrs[i], len(gb), f"gt_attrs[{i}]"))
        pbs.append(pb)
        pss.append(_as_1d(pred_scores[i], len(pb), np.float64, f"pred_scores[{i}]"))
        pls.append(labels)
        pas.append(_as_attrs(attrs, len(pb), f"pred_attrs[{i}]"))

    thresholds = [float(t) for t in dist_thresholds]
    ths = thresholds if dist_th_tp in thresholds else [*thresholds, float(dist_th_tp)]
    results: Dict[str, float] = {}
    class_aps: List[float] = []
    class_tp: Dict[str, List[float]] = {key: [] for key in TP_METRICS}
    for c, name in enumerate(class_names):
        max_dist = _range_of(class_range, name)
        g_keep = [_select(gb, gl, c, max_dist) for gb, gl in zip(gts, gls)]
        p_keep = [_select(pb, pl, c, max_dist) for pb, pl in zip(pbs, pls)]
        g_c = [gb[k] for gb, k in zip(gts, g_keep)]
        a_c = [ga[k] for ga, k in zip(gas, g_keep)]
        p_c = [pb[k] for pb, k in zip(pbs, p_keep)]
        s_c = [ps[k] for ps, k in zip(pss, p_keep)]
        pa_c = [pa[k] for pa, k in zip(pas, p_keep)]

        data = {th: accumulate(g_c, p_c, s_c, th, name, a_c, pa_c) for th in ths}
        aps = []
        for th in thresholds:
            ap = calc_ap(data[th], min_recall, min_precision)
            results[f"AP/{name}@{th}"] = ap
            aps.append(ap)
        results[f"AP/{name}"] = float(np.mean(aps)) if aps else 0.0
        class_aps.append(results[f"AP/{name}"])
        for key in TP_METRICS:
            undefined = key in _UNDEFINED_TP.get(name, ())
            err = math.nan if undefined else calc_tp(data[dist_th_tp], min_recall, key)
            results[f"{key}/{name}"] = err
            class_tp[key].append(err)

    results["mAP"] = float(np.mean(class_aps)) if class_aps else 0.0
    for key in TP_METRICS:
        results[TP_SUMMARY_KEYS[key]] = _nan_mean(class_tp[key])
    tp_errors = {key: results[TP_SUMMARY_KEYS[key]] for key in TP_METRICS}
    results["NDS"] = nd_score(results["mAP"], tp_errors)
    return results
