"""The Hungarian matchings of an iteration-benchmark run, and ties broken the reference's way.

DETR-style losses match queries to objects with mmdet's ``HungarianAssigner`` (an exact
minimum-cost assignment). Two runs that compute the same model with float32 round-off
differences get cost matrices ~1e-6 apart; where two assignments cost the same to that
precision (a near tie), either run may pick either, and a flip moves that decoder layer's
loss by far more than round-off (one query's box target changes). That is not a difference
in what the MSDA implementations compute, so the benchmark breaks such ties the reference's
way: :class:`MatchingRecorder` wraps every assigner of the model, records each assignment as
(query, object) pairs per iteration and call, and where this run's optimum differs from the
reference run's assignment for the same call while the reference's costs at most
``TIE_RTOL`` more (relative to the optimum's total cost) under this run's cost matrix, it
returns the reference's assignment and records the tie. A real difference in the op moves
the predictions by percent and the cost gap with them: no tie, the run keeps its own
matching and its losses part.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

import torch
from mmengine.hooks import Hook

# Float32 cost entries of two implementations differ by ~1e-6 relative (the predictions do);
# summed over the matched pairs the optimum's and the reference's assignment then differ by
# up to that much of the total. 1e-5 leaves a margin and is far below what a changed
# prediction costs (percent).
TIE_RTOL = 1e-5

Pairs = List[List[int]]  # [[query, object], ...] of one assignment, by query


def pairs_of(gt_inds: torch.Tensor) -> Pairs:
    """mmdet's ``gt_inds`` (nq,) (0: background, k: object k-1) -> [[query, object], ...]."""
    queries = (gt_inds > 0).nonzero(as_tuple=True)[0]
    return [[int(q), int(gt_inds[q]) - 1] for q in queries]


def assignment_cost(cost: torch.Tensor, pairs: Pairs) -> float:
    """Total cost (nq, n_obj) of an assignment, in float64."""
    if not pairs:
        return 0.0
    index = torch.tensor(pairs, dtype=torch.long)
    return float(cost.double()[index[:, 0], index[:, 1]].sum())


def match_cost(
    assigner: Any, pred_instances: Any, gt_instances: Any, img_meta: Any
) -> torch.Tensor:
    """The assigner's cost matrix (nq, n_obj), as ``HungarianAssigner.assign`` sums it."""
    costs = [
        c(pred_instances=pred_instances, gt_instances=gt_instances, img_meta=img_meta)
        for c in assigner.match_costs
    ]
    return torch.stack(costs).sum(0).detach().cpu()


def _queries_moved(own: Pairs, ref: Pairs) -> int:
    """How many queries the two assignments match to different objects (or only one)."""
    a, b = dict(map(tuple, own)), dict(map(tuple, ref))
    return sum(a.get(q) != b.get(q) for q in a.keys() | b.keys())


class MatchingRecorder(Hook):
    """Records every Hungarian assignment of training (``pairs[iteration][call]``) and breaks
    near ties towards ``reference`` (another run's ``pairs``); ``ties`` lists each call where
    this run's optimum differed from the reference's assignment: iteration, call, the number
    of queries matched differently, the reference's extra cost (``gap``, and ``rel_gap`` of the
    optimum's total) and whether it was adopted."""

    priority = "VERY_HIGH"

    def __init__(self, reference: Optional[List[List[Pairs]]] = None) -> None:
        self.reference = reference
        self.pairs: List[List[Pairs]] = []
        self.ties: List[Dict[str, Any]] = []
        self._undo: List[Callable[[], None]] = []

    def before_train(self, runner: Any) -> None:
        model = runner.model.module if hasattr(runner.model, "module") else runner.model
        for module in model.modules():
            assigner = getattr(module, "assigner", None)
            if assigner is not None and hasattr(assigner, "match_costs"):
                self._wrap(assigner)

    def after_train(self, runner: Any) -> None:
        for undo in self._undo:
            undo()
        self._undo.clear()

    def before_train_iter(self, runner: Any, batch_idx: int, data_batch: Any = None) -> None:
        self.pairs.append([])

    def _reference_pairs(self) -> Optional[Pairs]:
        iteration, call = len(self.pairs) - 1, len(self.pairs[-1])
        if self.reference is None or iteration >= len(self.reference):
            return None
        calls = self.reference[iteration]
        return calls[call] if call < len(calls) else None

    def _wrap(self, assigner: Any) -> None:
        original = assigner.assign

        def assign(pred_instances, gt_instances, img_meta=None, **kwargs):  # noqa: ANN001, ANN202
            result = original(pred_instances, gt_instances, img_meta, **kwargs)
            if not self.pairs:  # outside a training iteration
                return result
            own = pairs_of(result.gt_inds)
            ref = self._reference_pairs()
            if ref is not None and ref != own:
                result = self._tie(
                    assigner, result, own, ref, pred_instances, gt_instances, img_meta
                )
            self.pairs[-1].append(own)
            return result

        own_attribute = "assign" in vars(assigner)
        assigner.assign = assign
        self._undo.append(
            (lambda: setattr(assigner, "assign", original))
            if own_attribute
            else (lambda: delattr(assigner, "assign"))
        )

    def _tie(
        self,
        assigner: Any,
        result: Any,
        own: Pairs,
        ref: Pairs,
        pred_instances: Any,
        gt_instances: Any,
        img_meta: Any,
    ) -> Any:
        """The reference's assignment where it ties this run's optimum, else ``result``."""
        cost = match_cost(assigner, pred_instances, gt_instances, img_meta)
        best = assignment_cost(cost, own)
        gap = assignment_cost(cost, ref) - best
        rel_gap = gap / max(abs(best), 1e-12)
        valid = len(ref) == len(own) and all(
            q < cost.shape[0] and o < cost.shape[1] for q, o in ref
        )
        adopted = valid and rel_gap <= TIE_RTOL
        self.ties.append(
            {
                "iteration": len(self.pairs) - 1,
                "call": len(self.pairs[-1]),
                "queries": _queries_moved(own, ref),
                "gap": gap,
                "rel_gap": rel_gap,
                "adopted": adopted,
            }
        )
        if not adopted:
            return result
        gt_inds = torch.zeros_like(result.gt_inds)
        labels = torch.full_like(result.labels, -1) if result.labels is not None else None
        index = torch.tensor(ref, dtype=torch.long, device=gt_inds.device)
        gt_inds[index[:, 0]] = index[:, 1] + 1
        if labels is not None:
            labels[index[:, 0]] = gt_instances.labels[index[:, 1]]
        return type(result)(result.num_gts, gt_inds, result.max_overlaps, labels=labels)
