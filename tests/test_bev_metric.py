"""BEV centre-distance metric: hand-computed nuScenes-style AP, TP errors, NDS, mmengine path."""

from __future__ import annotations

import math
from typing import List, Sequence

import numpy as np
import pytest

from npudet.evaluation import BEVDetMetric, evaluate_center_distance

THS = (0.5, 1.0, 2.0, 4.0)


def box(x, y, yaw=0.0, v=(0.0, 0.0), w=2.0, l=4.0, h=1.5, z=0.8) -> List[float]:  # noqa: E741
    return [x, y, z, w, l, h, yaw, v[0], v[1]]


def run(gt: Sequence, pred: Sequence, classes=("car",), **kw) -> dict:
    """gt: per sample list of (box, label); pred: per sample list of (box, score, label)."""
    return evaluate_center_distance(
        gt_boxes=[np.array([g[0] for g in s], dtype=float).reshape(-1, 9) for s in gt],
        gt_labels=[np.array([g[1] for g in s], dtype=int) for s in gt],
        pred_boxes=[np.array([p[0] for p in s], dtype=float).reshape(-1, 9) for s in pred],
        pred_scores=[np.array([p[1] for p in s], dtype=float) for s in pred],
        pred_labels=[np.array([p[2] for p in s], dtype=int) for s in pred],
        class_names=list(classes),
        **kw,
    )


def test_perfect_predictions():
    gt = [
        [(box(5, 1, 0.3, (1, 0)), 0), (box(-8, 3, 2.0, (0, 2), w=0.7, l=0.8), 1)],
        [(box(20, -4, -1.0, (3, 1)), 0)],
    ]
    pred = [[(g[0], 0.9 - 0.1 * i, g[1]) for i, g in enumerate(s)] for s in gt]
    r = run(gt, pred, classes=("car", "pedestrian"))
    assert r["mAP"] == pytest.approx(1.0)
    for th in THS:
        assert r[f"AP/car@{th}"] == pytest.approx(1.0)
        assert r[f"AP/pedestrian@{th}"] == pytest.approx(1.0)
    for key in ("mATE", "mASE", "mAOE", "mAVE"):
        assert r[key] == pytest.approx(0.0, abs=1e-12)
    assert r["NDS"] == pytest.approx(1.0)
    assert all(isinstance(v, float) for v in r.values())


def test_hand_computed_ap_and_trans_err():
    # 3 GT over 2 samples; predictions in score order (matched across samples by score):
    #   0.9 TP (s0), 0.8 FP (s0, 10 m from any GT), 0.7 TP (s1), 0.6 TP (s0, 0.3 m off).
    # cum TP 1,1,2,3 / FP 0,1,1,1 -> precision 1, 1/2, 2/3, 3/4 at recall 1/3, 1/3, 2/3, 1.
    # np.interp at r = i/100 (no recall point hits 1/3 or 2/3 exactly):
    #   r < 1/3: 1;  1/3 < r < 2/3: 1/2 + (r - 1/3)/2;  2/3 < r <= 1: 2/3 + (r - 2/3)/4.
    # AP = sum_{i=11..100} max(p_i - 0.1, 0) / 90 / 0.9:
    #   i=11..33 (23 pts): 23 * 0.9                                   = 20.7
    #   i=34..66 (33 pts): 33 * 0.4 + 0.5 * (1650/100 - 33/3)         = 13.2 + 2.75 = 15.95
    #   i=67..100 (34 pts): 34 * (2/3 - 0.1) + 0.25 * (2839/100 - 34*2/3)
    #                     = 19.26667 + 1.43083                         = 20.6975
    #   AP = 57.3475 / 81 = 0.707994
    gt = [[(box(5, 0), 0), (box(10, 0), 0)], [(box(0, 8), 0)]]
    pred = [
        [(box(5, 0), 0.9, 0), (box(20, 0), 0.8, 0), (box(10, 0.3), 0.6, 0)],
        [(box(0, 8), 0.7, 0)],
    ]
    r = run(gt, pred)
    expected = 57.3475 / 81
    for th in THS:
        assert r[f"AP/car@{th}"] == pytest.approx(expected, abs=1e-9)
    assert r["mAP"] == pytest.approx(expected, abs=1e-9)
    # Trans err: cumulative means over the TPs (conf 0.9, 0.7, 0.6) are 0, 0, 0.1. Interpolated
    # confidence is >= 0.7 up to recall 2/3 (error 0), then drops linearly to 0.6 at recall 1
    # where the error rises linearly to 0.1: err(r) = 0.3 * (r - 2/3) for r > 2/3.
    # mean over i=11..100 = 0.3 * (2839/100 - 34*2/3) / 90 = 0.3 * 5.72333 / 90 = 0.0190778.
    assert r["mATE"] == pytest.approx(0.3 * (28.39 - 34 * 2 / 3) / 90, abs=1e-9)
    assert r["mASE"] == pytest.approx(0.0, abs=1e-12)
    # NDS = (4 * mAP + (1 - mATE) + 1 + 1 + 1) / 8
    assert r["NDS"] == pytest.approx((4 * expected + 4 - r["mATE"]) / 8, abs=1e-9)


def test_offset_counts_only_above_threshold():
    gt = [[(box(10, 5), 0)]]
    pred = [[(box(10.7, 5), 0.8, 0)]]  # 0.7 m off
    r = run(gt, pred)
    assert r["AP/car@0.5"] == 0.0
    for th in (1.0, 2.0, 4.0):
        # one TP, npos 1: precision 1 at every recall point -> AP (1 - 0.1) / 0.9 = 1
        assert r[f"AP/car@{th}"] == pytest.approx(1.0)
    assert r["AP/car"] == pytest.approx(0.75)
    assert r["mAP"] == pytest.approx(0.75)
    assert r["mATE"] == pytest.approx(0.7)
    assert r["NDS"] == pytest.approx((4 * 0.75 + 0.3 + 3) / 8)


def test_match_threshold_is_strict():
    r = run([[(box(0, 1), 0)]], [[(box(0, 3), 0.5, 0)]])  # exactly 2 m off
    assert r["AP/car@2.0"] == 0.0
    assert r["AP/car@4.0"] == pytest.approx(1.0)
    assert r["mATE"] == 1.0  # no TP at the 2 m threshold


def test_greedy_matching_by_score():
    # The higher-scored prediction takes the only GT even though the other one is closer.
    gt = [[(box(10, 0), 0)]]
    pred = [[(box(10.4, 0), 0.9, 0), (box(10.05, 0), 0.5, 0)]]
    r = run(gt, pred)
    # TP then FP: recall 1, 1 / precision 1, 1/2. np.interp (as in the devkit) takes the last
    # duplicate at r = 1, so p = 1 at i=11..99 and 1/2 at i=100:
    # AP = (89 * 0.9 + 0.4) / 90 / 0.9 = 80.5 / 81
    assert r["AP/car@0.5"] == pytest.approx(80.5 / 81)
    assert r["mATE"] == pytest.approx(0.4)


def test_scale_error():
    # w doubled: intersection 2*4*1.5 = 12, union 12 + 24 - 12 = 24 -> IoU 0.5
    r = run([[(box(3, 3), 0)]], [[(box(3, 3, w=4.0), 0.5, 0)]])
    assert r["mASE"] == pytest.approx(0.5)
    assert r["mAP"] == pytest.approx(1.0)


def test_orientation_error_and_barrier_period():
    r = run([[(box(3, 3, yaw=0.2), 0)]], [[(box(3, 3, yaw=0.2 + math.pi / 2), 0.5, 0)]])
    assert r["mAOE"] == pytest.approx(math.pi / 2)
    # wrap-around: pi - 0.25 vs -pi + 0.25 are 0.5 apart
    r = run([[(box(3, 3, yaw=math.pi - 0.25), 0)]], [[(box(3, 3, yaw=-math.pi + 0.25), 0.5, 0)]])
    assert r["mAOE"] == pytest.approx(0.5)
    # a yaw off by pi is the worst case for a car, no error for a barrier (period pi)
    r = run([[(box(3, 3, yaw=0.1), 0)]], [[(box(3, 3, yaw=0.1 + math.pi), 0.5, 0)]])
    assert r["mAOE"] == pytest.approx(math.pi)
    r = run(
        [[(box(3, 3, yaw=0.1), 0)]], [[(box(3, 3, yaw=0.1 + math.pi), 0.5, 0)]], classes=["barrier"]
    )
    assert r["mAOE"] == pytest.approx(0.0, abs=1e-12)
    r = run(
        [[(box(3, 3, yaw=0.1), 0)]], [[(box(3, 3, yaw=0.4 + math.pi), 0.5, 0)]], classes=["barrier"]
    )
    assert r["mAOE"] == pytest.approx(0.3)


def test_velocity_error_and_devkit_exclusions():
    r = run([[(box(3, 3, v=(1, 2)), 0)]], [[(box(3, 3, v=(4, 6)), 0.5, 0)]])
    assert r["mAVE"] == pytest.approx(5.0)
    assert r["NDS"] == pytest.approx((4 + 3 + 0) / 8)  # vel term 1 - min(1, 5) = 0
    # barrier has no velocity error, traffic_cone neither velocity nor orientation: class means
    # leave them out.
    gt = [[(box(3, 3, v=(1, 0)), 0), (box(-3, 3, v=(0, 0)), 1), (box(3, -3, yaw=0.0), 2)]]
    pred = [
        [
            (box(3, 3, v=(1, 1)), 0.9, 0),
            (box(-3, 3, v=(9, 9)), 0.8, 1),
            (box(3, -3, yaw=2.0, v=(9, 9)), 0.7, 2),
        ]
    ]
    r = run(gt, pred, classes=("car", "barrier", "traffic_cone"))
    assert r["mAVE"] == pytest.approx(1.0)  # car only
    assert r["mAOE"] == pytest.approx(0.0, abs=1e-12)  # car and barrier


def test_range_filtering():
    gt = [[(box(10, 0), 0), (box(60, 0), 0)]]
    pred = [[(box(10, 0), 0.9, 0), (box(0, 70), 0.5, 0)]]
    assert run(gt, pred, class_range={"car": 50.0})["mAP"] == pytest.approx(1.0)
    assert run(gt, pred, class_range=50.0)["mAP"] == pytest.approx(1.0)
    # Without a range the far GT is missed (recall 1/2) and the far prediction is an FP.
    assert run(gt, pred, class_range=None)["mAP"] < 0.5
    # The range is a strict bound on hypot(x, y): a GT at (30, 40) is 50 m away.
    r = run([[(box(30, 40), 0)]], [[(box(30, 40), 0.9, 0)]], class_range=50.0)
    assert r["mAP"] == 0.0  # no GT left: AP 0 as the devkit does


def test_empty_predictions():
    gt = [[(box(10, 0), 0), (box(0, 5), 1)], []]
    pred = [[], []]
    r = run(gt, pred, classes=("car", "pedestrian"))
    assert r["mAP"] == 0.0
    assert r["NDS"] == 0.0
    for key in ("mATE", "mASE", "mAOE", "mAVE"):
        assert r[key] == 1.0
    for th in THS:
        assert r[f"AP/car@{th}"] == 0.0


def test_wrong_label_is_not_a_match():
    r = run([[(box(10, 0), 0)]], [[(box(10, 0), 0.9, 1)]], classes=("car", "truck"))
    assert r["AP/car"] == 0.0
    assert r["AP/truck"] == 0.0


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="boxes must be"):
        evaluate_center_distance([np.zeros((1, 7))], [[0]], [np.zeros((0, 9))], [[]], [[]], ["car"])
    with pytest.raises(ValueError, match="pred_scores"):
        evaluate_center_distance(
            [np.zeros((0, 9))], [[]], [np.zeros((2, 9))], [[1.0]], [[0, 0]], ["a"]
        )


def test_metric_process_and_compute():
    import torch
    from mmdet.registry import METRICS
    from mmdet.structures import DetDataSample
    from mmengine.evaluator import Evaluator
    from mmengine.structures import InstanceData

    gt0 = np.array([box(10, 0), box(60, 0)])  # second GT beyond the default 50 m range
    gt1 = np.array([box(0, 5, w=0.6, l=0.6, h=1.7)])
    preds = [
        (torch.tensor([box(10.7, 0)]), torch.tensor([0.9]), torch.tensor([0])),
        (torch.tensor([box(0, 5, w=0.6, l=0.6, h=1.7)]), torch.tensor([0.8]), torch.tensor([1])),
    ]
    samples = []
    for i, (gt, labels, pred) in enumerate(zip([gt0, gt1], [[0, 0], [1]], preds)):
        ds = DetDataSample(metainfo=dict(sample_idx=i))
        ds.eval_ann_info = dict(gt_boxes=gt, gt_labels=np.array(labels), sample_idx=i)
        ds.pred_instances_3d = InstanceData(bboxes_3d=pred[0], scores_3d=pred[1], labels_3d=pred[2])
        samples.append(ds)

    metric = METRICS.build(dict(type="BEVDetMetric"))
    assert isinstance(metric, BEVDetMetric)
    evaluator = Evaluator([metric])
    evaluator.dataset_meta = dict(classes=("car", "pedestrian"))
    evaluator.process(samples[:1])  # DetDataSample -> dict, as during a val loop
    evaluator.process(samples[1:])
    out = evaluator.evaluate(2)
    assert out["bev/AP/car@0.5"] == 0.0
    assert out["bev/AP/car@1.0"] == pytest.approx(1.0)
    assert out["bev/AP/car"] == pytest.approx(0.75)
    assert out["bev/AP/pedestrian"] == pytest.approx(1.0)
    assert out["bev/mAP"] == pytest.approx(0.875)
    assert out["bev/mATE"] == pytest.approx(0.35)
    assert out["bev/NDS"] == pytest.approx((4 * 0.875 + 0.65 + 3) / 8)

    # Direct process() with plain dicts, explicit classes and a custom prefix.
    metric = BEVDetMetric(classes=["car"], dist_thresholds=[1.0], class_range=None, prefix="x")
    metric.process(
        {},
        [
            dict(
                eval_ann_info=dict(gt_boxes=gt0, gt_labels=np.array([0, 0]), sample_idx=0),
                pred_instances_3d=dict(
                    bboxes_3d=torch.tensor([box(10, 0), box(60, 0)]),
                    scores_3d=torch.tensor([0.5, 0.6]),
                    labels_3d=torch.tensor([0, 0]),
                ),
            )
        ],
    )
    out = metric.evaluate(1)
    assert set(out) >= {"x/mAP", "x/NDS", "x/AP/car", "x/AP/car@1.0"}
    assert out["x/mAP"] == pytest.approx(1.0)
