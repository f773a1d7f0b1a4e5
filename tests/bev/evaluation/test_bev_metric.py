"""BEV nuScenes metric: hand-computed AP, the five TP errors, NDS, attributes, mmengine path."""

from __future__ import annotations

import math
from typing import List, Sequence

import numpy as np
import pytest

from npudet.bev.evaluation import TP_METRICS, BEVDetMetric, evaluate_center_distance, nd_score
from npudet.bev.infos.attributes import attribute_from_velocity

THS = (0.5, 1.0, 2.0, 4.0)
TP_KEYS = ("mATE", "mASE", "mAOE", "mAVE", "mAAE")


def box(x, y, yaw=0.0, v=(0.0, 0.0), w=2.0, l=4.0, h=1.5, z=0.8) -> List[float]:  # noqa: E741
    return [x, y, z, w, l, h, yaw, v[0], v[1]]


def run(gt: Sequence, pred: Sequence, classes=("car",), **kw) -> dict:
    """gt: per sample list of (box, label[, attribute]); pred: per sample list of
    (box, score, label). GT without an attribute has ''."""
    return evaluate_center_distance(
        gt_boxes=[np.array([g[0] for g in s], dtype=float).reshape(-1, 9) for s in gt],
        gt_labels=[np.array([g[1] for g in s], dtype=int) for s in gt],
        pred_boxes=[np.array([p[0] for p in s], dtype=float).reshape(-1, 9) for s in pred],
        pred_scores=[np.array([p[1] for p in s], dtype=float) for s in pred],
        pred_labels=[np.array([p[2] for p in s], dtype=int) for s in pred],
        class_names=list(classes),
        gt_attrs=[[g[2] if len(g) > 2 else "" for g in s] for s in gt],
        **kw,
    )


def nds4(mean_ap: float, ate=0.0, ase=0.0, aoe=0.0, ave=0.0) -> float:
    """NDS when the GT has no attributes: mAAE is 1 (devkit: all-NaN accuracies count as 1)."""
    return (5 * mean_ap + 4 - ate - ase - aoe - ave) / 10


def test_perfect_predictions():
    gt = [
        [
            (box(5, 1, 0.3, (1, 0)), 0, "vehicle.moving"),
            (box(-8, 3, 2.0, (0, 2), w=0.7, l=0.8), 1, "pedestrian.moving"),
        ],
        [(box(20, -4, -1.0, (0, 0)), 0, "vehicle.parked")],
    ]
    pred = [[(g[0], 0.9 - 0.1 * i, g[1]) for i, g in enumerate(s)] for s in gt]
    r = run(gt, pred, classes=("car", "pedestrian"))
    assert r["mAP"] == pytest.approx(1.0)
    for th in THS:
        assert r[f"AP/car@{th}"] == pytest.approx(1.0)
        assert r[f"AP/pedestrian@{th}"] == pytest.approx(1.0)
    for key in TP_KEYS:
        assert r[key] == pytest.approx(0.0, abs=1e-12)
    for name in ("car", "pedestrian"):
        for metric in TP_METRICS:
            assert r[f"{metric}/{name}"] == pytest.approx(0.0, abs=1e-12)
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
    # NDS = (5 * mAP + (1 - mATE) + 1 + 1 + 1 + 0) / 10 (no GT attributes: mAAE 1)
    assert r["mAAE"] == 1.0
    assert r["NDS"] == pytest.approx((5 * expected + 4 - r["mATE"]) / 10, abs=1e-9)


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
    assert r["NDS"] == pytest.approx(nds4(0.75, ate=0.7))


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
    assert r["NDS"] == pytest.approx(nds4(1.0, ave=1.0))  # vel term 1 - min(1, 5) = 0
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
    assert np.isnan(r["vel_err/barrier"]) and np.isnan(r["vel_err/traffic_cone"])
    assert np.isnan(r["orient_err/traffic_cone"]) and r["orient_err/barrier"] == 0.0
    assert np.isnan(r["attr_err/barrier"]) and np.isnan(r["attr_err/traffic_cone"])


def test_velocity_unknown_in_gt_is_left_out():
    # nuScenes GT without a velocity estimate (NaN) adds nothing to the velocity error
    gt = [[(box(3, 3, v=(1, 0)), 0), (box(-5, 3, v=(math.nan, math.nan)), 0)]]
    pred = [[(box(3, 3, v=(1, 0.5)), 0.9, 0), (box(-5, 3, v=(7, 7)), 0.8, 0)]]
    r = run(gt, pred)
    assert r["mAP"] == pytest.approx(1.0)
    assert r["mAVE"] == pytest.approx(0.5)


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
    for key in TP_KEYS:
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


def test_nd_score_formula():
    errors = dict(trans_err=0.3, scale_err=0.2, orient_err=1.7, vel_err=math.nan, attr_err=0.1)
    # orient 1.7 is clamped to 1 (term 0), a NaN error scores 0
    assert nd_score(0.4, errors) == pytest.approx((5 * 0.4 + 0.7 + 0.8 + 0 + 0 + 0.9) / 10)
    assert nd_score(1.0, {key: 0.0 for key in TP_METRICS}) == 1.0
    assert nd_score(0.0, {key: 5.0 for key in TP_METRICS}) == 0.0
    with pytest.raises(ValueError, match="tp_errors must have the keys"):
        nd_score(0.5, dict(trans_err=0.1, scale_err=0.1, orient_err=0.1, vel_err=0.1))


def test_class_without_any_defined_error_has_nan_means():
    # traffic cones: no orientation, velocity or attribute error -> those means are NaN and their
    # NDS terms 0; translation 0.5 m and scale err 0.5 still count
    r = run(
        [[(box(3, 3, w=0.4, l=0.4), 0)]], [[(box(3.5, 3, w=0.8, l=0.4), 0.5, 0)]], ["traffic_cone"]
    )
    assert r["mAP"] == pytest.approx(0.75)  # missed at 0.5 m only
    assert r["mATE"] == pytest.approx(0.5) and r["mASE"] == pytest.approx(0.5)
    assert np.isnan(r["mAOE"]) and np.isnan(r["mAVE"]) and np.isnan(r["mAAE"])
    assert r["NDS"] == pytest.approx((5 * 0.75 + 0.5 + 0.5) / 10)


def test_attribute_error_hand_computed():
    # 3 GT cars found exactly in score order 0.9, 0.8, 0.7 with attribute errors 0, 1, NaN (the
    # third GT has no attribute). NaN-aware cumulative means: 0, 0.5, 0.5 at recall 1/3, 2/3, 1.
    # Interpolated over recall via the confidences: 0 up to 1/3, 1.5 (r - 1/3) up to 2/3, then
    # 0.5. Mean over i = 11..100: (1.5 * (1650 / 100 - 33 / 3) + 0.5 * 34) / 90 = 25.25 / 90.
    gt = [
        [
            (box(5, 0, v=(3, 0)), 0, "vehicle.moving"),
            (box(-5, 0), 0, "vehicle.parked"),
            (box(0, 9), 0, ""),
        ]
    ]
    pred = [[(box(5, 0, v=(3, 0)), 0.9, 0), (box(-5, 0, v=(3, 0)), 0.8, 0), (box(0, 9), 0.7, 0)]]
    r = run(gt, pred)
    assert r["mAP"] == pytest.approx(1.0)
    assert r["mAAE"] == pytest.approx(25.25 / 90)
    # explicit predicted attributes replace the ones from class and velocity
    r = evaluate_center_distance(
        [np.array([g[0] for g in gt[0]])],
        [np.zeros(3, int)],
        [np.array([p[0] for p in pred[0]])],
        [np.array([0.9, 0.8, 0.7])],
        [np.zeros(3, int)],
        ["car"],
        gt_attrs=[[g[2] for g in gt[0]]],
        pred_attrs=[["vehicle.moving", "vehicle.parked", "vehicle.stopped"]],
    )
    assert r["mAAE"] == pytest.approx(0.0, abs=1e-12)


def test_attribute_from_velocity():
    """mmdet3d's rule for a detector without attribute head: speed > 0.2 m/s is moving."""
    cases = [
        ("car", (0.15, 0.15), "vehicle.moving"),  # 0.21 m/s
        ("car", (0.1, 0.1), "vehicle.parked"),
        ("truck", (0.0, 0.0), "vehicle.parked"),
        ("bus", (0.0, 0.1), "vehicle.stopped"),
        ("bus", (3.0, 0.0), "vehicle.moving"),
        ("trailer", (2.0, 0.0), "vehicle.moving"),
        ("bicycle", (2.0, 0.0), "cycle.with_rider"),
        ("motorcycle", (0.0, 0.0), "cycle.without_rider"),
        ("pedestrian", (1.0, 0.0), "pedestrian.moving"),
        ("pedestrian", (0.1, 0.0), "pedestrian.standing"),
        ("barrier", (1.0, 0.0), ""),
        ("traffic_cone", (0.0, 0.0), ""),
        ("shape", (1.0, 0.0), ""),  # not a nuScenes class
    ]
    for name, (vx, vy), expected in cases:
        assert attribute_from_velocity(name, vx, vy) == expected, (name, vx, vy)


def test_eval_frames_move_boxes_before_range_and_errors():
    # The frame puts the range origin 1 m behind the box frame's origin and turns the axes by 90
    # degrees: the GT 49.5 m ahead is 50.5 m from it (dropped at range 50), the prediction 48.9 m
    # ahead is 49.9 m from it (kept, now a false positive); errors are as in the box frame.
    frame = np.eye(4)
    frame[:3, :3] = [[0, -1, 0], [1, 0, 0], [0, 0, 1]]
    frame[:3, 3] = [0, 1, 0]  # (x, y) -> (-y, x + 1)
    gt = [[(box(49.5, 0), 0), (box(10, 0, yaw=0.2, v=(1, 0)), 0)]]
    pred = [[(box(48.9, 0), 0.9, 0), (box(10.3, 0, yaw=0.5, v=(1, 1)), 0.8, 0)]]
    plain = run(gt, pred, class_range=50.0)
    assert plain["AP/car@1.0"] == pytest.approx(1.0)  # two TPs 0.6 m and 0.3 m off
    moved = run(gt, pred, class_range=50.0, eval_frames=[frame])
    # FP then TP: precision 0 at recall 0 and 1/2 at recall 1, interpolated 0.005 i at recall
    # i / 100: AP = sum_{i=21..100} (0.005 i - 0.1) / 90 / 0.9 = 16.2 / 81 = 0.2
    for th in THS:
        assert moved[f"AP/car@{th}"] == pytest.approx(0.2)
    one = run([gt[0][1:]], [pred[0][1:]])
    for key in TP_KEYS:
        assert moved[key] == pytest.approx(one[key]), key
    assert moved["mATE"] == pytest.approx(0.3) and moved["mAOE"] == pytest.approx(0.3)
    assert moved["mAVE"] == pytest.approx(1.0)
    with pytest.raises(ValueError, match=r"eval_frames\[0\] must be a \(4, 4\)"):
        run(gt, pred, eval_frames=[np.eye(3)])


def test_metric_process_and_compute():
    import torch
    from mmdet.registry import METRICS
    from mmdet.structures import DetDataSample
    from mmengine.evaluator import Evaluator
    from mmengine.structures import InstanceData

    gt0 = np.array([box(10, 0), box(60, 0)])  # second GT beyond the default 50 m range
    gt1 = np.array([box(0, 5, w=0.6, l=0.6, h=1.7)])
    attrs = [["vehicle.parked", "vehicle.parked"], ["pedestrian.moving"]]
    preds = [
        (torch.tensor([box(10.7, 0)]), torch.tensor([0.9]), torch.tensor([0])),
        (torch.tensor([box(0, 5, w=0.6, l=0.6, h=1.7)]), torch.tensor([0.8]), torch.tensor([1])),
    ]
    samples = []
    for i, (gt, labels, pred) in enumerate(zip([gt0, gt1], [[0, 0], [1]], preds)):
        ds = DetDataSample(metainfo=dict(sample_idx=i))
        ds.eval_ann_info = dict(
            gt_boxes=gt, gt_labels=np.array(labels), gt_attrs=attrs[i], sample_idx=i
        )
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
    # static car -> vehicle.parked (right); static pedestrian -> pedestrian.standing (wrong)
    assert out["bev/attr_err/car"] == 0.0 and out["bev/attr_err/pedestrian"] == 1.0
    assert out["bev/mAAE"] == pytest.approx(0.5)
    assert out["bev/NDS"] == pytest.approx((5 * 0.875 + 0.65 + 3 + 0.5) / 10)

    # Direct process() with plain dicts, explicit classes, a custom prefix and the ego pose:
    # ego2global turns by 90 degrees and the ego pose is 1 m behind the box frame's origin, so
    # the GT 49.5 m ahead is 50.5 m from the ego (dropped) and the prediction 48.9 m ahead
    # 49.9 m (kept, a false positive).
    ego2global = np.eye(4)
    ego2global[:3, :3] = [[0, -1, 0], [1, 0, 0], [0, 0, 1]]
    ego2global[:3, 3] = [100.0, 200.0, 0.0]
    ann = dict(
        gt_boxes=np.array([box(10, 0), box(49.5, 0)]),
        gt_labels=np.array([0, 0]),
        gt_attrs=["vehicle.parked", "vehicle.parked"],
        sample_idx=0,
    )
    pred = dict(
        bboxes_3d=torch.tensor([box(10, 0), box(48.9, 0)]),
        scores_3d=torch.tensor([0.5, 0.6]),
        labels_3d=torch.tensor([0, 0]),
    )
    metric = BEVDetMetric(classes=["car"], dist_thresholds=[1.0], class_range=50.0, prefix="x")
    metric.process({}, [dict(eval_ann_info=ann, pred_instances_3d=pred)])
    out = metric.evaluate(1)
    assert set(out) >= {"x/mAP", "x/NDS", "x/AP/car", "x/AP/car@1.0", "x/trans_err/car"}
    assert out["x/mAP"] == pytest.approx(1.0)
    metric.process(
        {},
        [
            dict(
                eval_ann_info=dict(
                    ann, ego2global=ego2global, ego_pose_translation=[100.0, 199.0, 0.0]
                ),
                pred_instances_3d=pred,
            )
        ],
    )
    # an FP (score 0.6, its GT dropped) above the TP (0.5): AP 0.2 as in the eval_frames test
    assert metric.evaluate(1)["x/mAP"] == pytest.approx(0.2)

    del ann["gt_attrs"]
    with pytest.raises(KeyError, match=r"eval_ann_info'\]\['gt_attrs'\]"):
        metric.process({}, [dict(eval_ann_info=ann, pred_instances_3d=pred)])
