"""``BatchedHungarianAssigner`` and npudet's ``DeformableDETRHead``: a loss computation's
Hungarian matchings prefetched in one host round trip give mmdet's matching exactly.

The assigner against mmdet's on the same calls (objects and none, several "layers"); a call
that was not prefetched is assigned as mmdet does; the small Deformable DETR (two-stage,
refined boxes) with the switch on has stock's losses and gradients to the bit; on the
simulated npu, one copy to the host where mmdet makes one per call with objects (counted with
the project's dispatch counter).
"""

from __future__ import annotations

import pytest
import torch
from mmdet.models.task_modules import HungarianAssigner
from mmengine.structures import InstanceData
from npu_sim_util import simulated_npu  # noqa: F401  (the fixture)
from plugin_util import build_model, fake_batch, loss_and_grads, small_cfg

from npudet.models.heads import BatchedHungarianAssigner
from npudet.models.heads.deformable_detr_head import assign_inputs
from npudet_dev.ablation.dispatch_count.counter import DispatchCounter

COSTS = [
    dict(type="FocalLossCost", weight=2.0),
    dict(type="BBoxL1Cost", weight=5.0, box_format="xywh"),
    dict(type="IoUCost", iou_mode="giou", weight=2.0),
]
BOXES = torch.tensor([[1.0, 2, 30, 40], [10, 10, 60, 50], [5, 5, 20, 20], [0, 0, 80, 64]])


def assign_calls(layers: int = 3, device: str = "cpu") -> list:
    """(predictions, objects, meta) of ``layers`` x 3 images, one image without objects."""
    g = torch.Generator().manual_seed(0)
    meta = dict(img_shape=(64, 80))
    calls = []
    for _ in range(layers):
        for n in (3, 0, 4):
            gt = InstanceData(
                bboxes=BOXES[:n].to(device),
                labels=torch.randint(0, 4, (n,), generator=g).to(device),
            )
            scores, boxes = torch.randn(20, 4, generator=g), torch.rand(20, 4, generator=g)
            calls.append(assign_inputs(scores.to(device), boxes.to(device), gt, meta))
    return calls


def _same(a, b) -> bool:
    return (
        a.num_gts == b.num_gts
        and torch.equal(a.gt_inds, b.gt_inds)
        and torch.equal(a.labels, b.labels)
    )


def test_prefetched_matchings_are_mmdets():
    calls = assign_calls()
    mmdet, batched = (
        HungarianAssigner(match_costs=COSTS),
        BatchedHungarianAssigner(match_costs=COSTS),
    )
    batched.prefetch(calls)
    for pred, gt, meta in calls:
        assert _same(batched.assign(pred, gt, meta), mmdet.assign(pred, gt, meta))
    assert not batched._prefetched


def test_a_call_not_prefetched_is_assigned_as_mmdet_does():
    calls = assign_calls()
    mmdet, batched = (
        HungarianAssigner(match_costs=COSTS),
        BatchedHungarianAssigner(match_costs=COSTS),
    )
    batched.prefetch(calls[1:])
    for pred, gt, meta in calls:  # the first call is not the one prefetched first
        assert _same(batched.assign(pred, gt, meta), mmdet.assign(pred, gt, meta))


def test_small_detr_with_batched_matching_has_stocks_losses_and_grads(monkeypatch):
    batch = fake_batch()
    solved = []  # calls mmdet's assign served (the batched one: none, every image has objects)
    mmdet_assign = HungarianAssigner.assign
    monkeypatch.setattr(
        HungarianAssigner,
        "assign",
        lambda self, *a, **k: solved.append(1) or mmdet_assign(self, *a, **k),
    )
    results, calls = [], []
    for assigner in ("HungarianAssigner", "BatchedHungarianAssigner"):
        cfg = small_cfg()
        cfg.model.train_cfg.assigner.type = assigner
        model = build_model(cfg)
        assert type(model.bbox_head.assigner).__name__ == assigner
        solved.clear()
        results.append(loss_and_grads(model, batch))
        calls.append(len(solved))
    layers = len(model.bbox_head.cls_branches)  # decoder layers + the two-stage encoder
    assert calls == [layers * len(batch["inputs"]), 0]
    (losses, grads), (b_losses, b_grads) = results
    assert losses.keys() == b_losses.keys() and any(k.startswith("enc_") for k in losses)
    for key in losses:
        assert torch.equal(losses[key], b_losses[key]), key
    for name in grads:
        assert torch.equal(grads[name], b_grads[name]), name


@pytest.mark.usefixtures("simulated_npu")
def test_batched_matching_copies_once_where_mmdet_copies_per_call():
    calls = assign_calls(layers=3, device="npu")  # 6 calls with objects, 3 without
    copies = {}
    for assigner in (
        HungarianAssigner(match_costs=COSTS),
        BatchedHungarianAssigner(match_costs=COSTS),
    ):
        counter = DispatchCounter("npu")
        with counter:
            if isinstance(assigner, BatchedHungarianAssigner):
                assigner.prefetch(calls)
            for pred, gt, meta in calls:
                assigner.assign(pred, gt, meta)
        counts = counter.tally.as_dict()
        copies[type(assigner).__name__] = counts["sync_kinds"].get("copy_to_host", 0)
        assert counts["syncs"] == copies[type(assigner).__name__]
    assert copies == {"HungarianAssigner": 6, "BatchedHungarianAssigner": 1}
