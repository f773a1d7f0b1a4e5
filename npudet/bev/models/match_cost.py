"""L1 match cost between BEV box codes, for mmdet's ``HungarianAssigner``."""

from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from mmdet.models.task_modules.assigners.match_cost import BaseMatchCost
from mmdet.registry import TASK_UTILS
from mmengine.structures import InstanceData
from torch import Tensor

from .box_coder import CODE_SIZE


@TASK_UTILS.register_module()
class BEVBoxL1Cost(BaseMatchCost):
    """mmdet's ``BBoxL1Cost`` for :class:`BEVBoxCoder` codes.

    The cost of a (prediction, target) pair is the L1 distance of the first
    ``len(code_weights)`` code entries, each scaled by its weight: by default the centre
    (u, v, zn), log sizes and yaw (sin, cos), leaving velocity out. A heavy (u, v) weight
    makes matching geometric (queries take the objects they are near).

    Args:
        code_weights: per-entry weights, 1 to 10 of them (default eight 1s).
        weight: weight of the whole cost.
    """

    def __init__(
        self, code_weights: Sequence[float] = (1.0,) * 8, weight: Union[float, int] = 1.0
    ) -> None:
        super().__init__(weight=weight)
        if not 1 <= len(code_weights) <= CODE_SIZE:
            raise ValueError(
                f"code_weights: expected 1 to {CODE_SIZE} weights (u, v, zn, log w, log l, "
                f"log h, sin, cos, vx, vy), got {len(code_weights)}"
            )
        self.code_weights = tuple(float(w) for w in code_weights)

    def __call__(
        self,
        pred_instances: InstanceData,
        gt_instances: InstanceData,
        img_meta: Optional[dict] = None,
        **kwargs,
    ) -> Tensor:
        """``bboxes`` of predictions (nq, 10) and targets (N, 10), codes -> cost (nq, N)."""
        k = len(self.code_weights)
        w = pred_instances.bboxes.new_tensor(self.code_weights)
        pred = pred_instances.bboxes[:, :k] * w
        gt = gt_instances.bboxes[:, :k] * w
        return torch.cdist(pred, gt, p=1) * self.weight
