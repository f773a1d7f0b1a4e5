"""The iteration benchmark's Hungarian matching recorder (npudet_dev.ablation.matching): it records
every assignment, breaks exact or near ties the reference run's way and keeps its own
matching where the reference's costs more than round-off."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from mmdet.models.task_modules.assigners import HungarianAssigner
from mmengine.structures import InstanceData

from npudet_dev.ablation.matching import TIE_RTOL, MatchingRecorder, assignment_cost, pairs_of

# Tests of the project's own machinery (dev/).
pytestmark = pytest.mark.dev

META = {"img_shape": (100, 100)}
GT = InstanceData(
    bboxes=torch.tensor([[0.0, 0.0, 10.0, 10.0], [50.0, 50.0, 60.0, 60.0]]),
    labels=torch.tensor([3, 5]),
)
# queries 0 and 1 lie 1 px either side of object 0 (the same cost: an exact tie), query 2 on
# object 1
PRED = InstanceData(
    bboxes=torch.tensor([[1.0, 0.0, 11.0, 10.0], [-1.0, 0.0, 9.0, 10.0], [50, 50, 60, 60.0]])
)


def _assigner() -> HungarianAssigner:
    return HungarianAssigner(match_costs=[dict(type="BBoxL1Cost", weight=1.0)])


def _one_iteration(reference):
    """A recorder over a model holding one assigner: one training iteration, one assign call;
    returns (recorder, assign result, the assigner after training)."""
    assigner = _assigner()
    runner = SimpleNamespace(model=torch.nn.Module())
    runner.model.head = torch.nn.Module()
    runner.model.head.assigner = assigner
    recorder = MatchingRecorder(reference)
    recorder.before_train(runner)
    recorder.before_train_iter(runner, 0)
    result = assigner.assign(PRED, GT, META)
    recorder.after_train(runner)
    return recorder, result, assigner


def test_records_the_assignment_and_restores_the_assigner() -> None:
    recorder, result, assigner = _one_iteration(None)
    (own,) = recorder.pairs[0]
    assert sorted(q for q, _ in own) in ([0, 2], [1, 2]) and [2, 1] in own
    assert pairs_of(result.gt_inds) == own and recorder.ties == []
    assert "assign" not in vars(assigner)  # the class's method again


def test_a_tie_is_broken_the_reference_way() -> None:
    own = _one_iteration(None)[0].pairs[0][0]
    other = [[1 - own[0][0], 0], [2, 1]]  # the other query of the tie
    recorder, result, _ = _one_iteration([[other]])
    assert pairs_of(result.gt_inds) == other
    assert result.labels[other[0][0]] == 3 and result.labels[own[0][0]] == -1
    assert int((result.gt_inds == 0).sum()) == 1 and recorder.pairs[0][0] == own
    (tie,) = recorder.ties
    assert tie["adopted"] and tie["queries"] == 2 and tie["gap"] == pytest.approx(0.0, abs=1e-9)


def test_a_costlier_reference_matching_is_not_taken() -> None:
    worse = [[0, 1], [2, 0]]
    recorder, result, _ = _one_iteration([[worse]])
    assert pairs_of(result.gt_inds) == recorder.pairs[0][0] != worse
    (tie,) = recorder.ties
    assert not tie["adopted"] and tie["rel_gap"] > 1e3 * TIE_RTOL


def test_assignment_cost_sums_the_matched_entries() -> None:
    cost = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    assert assignment_cost(cost, [[0, 1], [2, 0]]) == 7.0 and assignment_cost(cost, []) == 0.0
