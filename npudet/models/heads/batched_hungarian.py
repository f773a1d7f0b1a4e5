"""``BatchedHungarianAssigner``: mmdet's Hungarian assigner with its device-to-host copies batched.

mmdet's ``HungarianAssigner.assign`` copies each cost matrix to the host for scipy's
``linear_sum_assignment`` and the matches back: a Deformable DETR iteration does it once per
decoder layer and image, plus the two-stage encoder's, and on an accelerator every such copy
waits for the device to drain its queue. A head that knows every assignment it will ask for
hands their inputs to :meth:`BatchedHungarianAssigner.prefetch` first: the costs are computed
as ``assign`` computes them, copied to the host in one transfer, solved one by one with the
same solver, and the matches copied back in one transfer. ``assign`` then answers the same
calls, in the same order, from those matches: the same costs and the same solver, so the same
matching. A call that was not prefetched (another order, another caller) is assigned as mmdet
does.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mmdet.models.task_modules import AssignResult, HungarianAssigner
from mmdet.registry import TASK_UTILS
from mmengine.structures import InstanceData
from scipy.optimize import linear_sum_assignment
from torch import Tensor

# (predictions, ground truth, image meta) of one assign call.
AssignInputs = Tuple[InstanceData, InstanceData, dict]
# What identifies a call: the scores' storage and shape, the number of objects.
_Key = Tuple[int, Tuple[int, ...], int]


def _key(pred_instances: InstanceData, gt_instances: InstanceData) -> _Key:
    scores = pred_instances.scores
    return scores.data_ptr(), tuple(scores.shape), len(gt_instances)


@TASK_UTILS.register_module()
class BatchedHungarianAssigner(HungarianAssigner):
    """mmdet's ``HungarianAssigner`` (same arguments) with :meth:`prefetch` (module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._prefetched: Deque[Tuple[_Key, Optional[Tuple[Tensor, Tensor]]]] = deque()

    def prefetch(self, calls: Sequence[AssignInputs]) -> None:
        """Match every call of ``calls`` now, with one copy of their costs to the host and
        one of the matches back; the next ``assign`` calls, in this order, take them."""
        costs: List[Optional[Tensor]] = []
        for pred, gt, meta in calls:
            if len(gt) == 0 or len(pred) == 0:
                costs.append(None)  # mmdet's empty assignment: no matching, no copy
                continue
            parts = [
                c(pred_instances=pred, gt_instances=gt, img_meta=meta) for c in self.match_costs
            ]
            costs.append(torch.stack(parts).sum(dim=0).detach())
        present = [c for c in costs if c is not None]
        self._prefetched.clear()
        if not present:
            return
        host = torch.cat([c.reshape(-1).float() for c in present]).cpu()  # the one copy out
        pairs, offset = [], 0
        for cost in present:
            block = host[offset : offset + cost.numel()].view(cost.shape)
            offset += cost.numel()
            pairs.append(linear_sum_assignment(block))
        # rows then columns of every match, in one copy back
        flat = np.concatenate([np.concatenate(p) for p in pairs]).astype(np.int64)
        device = present[0].device
        back = torch.from_numpy(flat).to(device).split([2 * len(p[0]) for p in pairs])
        matches = iter([(b[: len(b) // 2], b[len(b) // 2 :]) for b in back])
        for (pred, gt, _), cost in zip(calls, costs):
            self._prefetched.append((_key(pred, gt), None if cost is None else next(matches)))

    def assign(
        self,
        pred_instances: InstanceData,
        gt_instances: InstanceData,
        img_meta: Optional[dict] = None,
        **kwargs,
    ) -> AssignResult:
        """mmdet's assignment, from :meth:`prefetch`'s matches when this is the next call
        prefetched."""
        if self._prefetched:
            key, match = self._prefetched.popleft()
            if key == _key(pred_instances, gt_instances) and match is not None:
                return self._result(len(pred_instances), gt_instances.labels, *match)
            if key != _key(pred_instances, gt_instances):
                self._prefetched.clear()  # not the calls prefetched: mmdet's way from here on
        return super().assign(pred_instances, gt_instances, img_meta, **kwargs)

    @staticmethod
    def _result(num_preds: int, gt_labels: Tensor, rows: Tensor, cols: Tensor) -> AssignResult:
        """mmdet's result of a matching: query ``rows[k]`` gets object ``cols[k]`` (gt_inds
        ``cols[k] + 1``, its label), every other query background (gt_inds 0, label -1)."""
        gt_inds = torch.zeros((num_preds,), dtype=torch.long, device=gt_labels.device)
        labels = torch.full((num_preds,), -1, dtype=torch.long, device=gt_labels.device)
        gt_inds[rows] = cols + 1
        labels[rows] = gt_labels[cols]
        return AssignResult(
            num_gts=len(gt_labels), gt_inds=gt_inds, max_overlaps=None, labels=labels
        )
