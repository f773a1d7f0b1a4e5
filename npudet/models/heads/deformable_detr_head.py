"""mmdet's ``DeformableDETRHead``, prefetching its matchings when its assigner is batched."""

from __future__ import annotations

from typing import List, Optional

import torch
from mmdet.models.dense_heads import DeformableDETRHead as MMDetDeformableDETRHead
from mmdet.registry import MODELS
from mmdet.structures.bbox import bbox_cxcywh_to_xyxy
from mmengine.structures import InstanceData
from torch import Tensor

from .batched_hungarian import AssignInputs, BatchedHungarianAssigner


def assign_inputs(
    cls_score: Tensor, bbox_pred: Tensor, gt_instances: InstanceData, img_meta: dict
) -> AssignInputs:
    """What mmdet's ``DETRHead._get_targets_single`` hands its assigner for one image:
    cls_score (nq, classes), bbox_pred (nq, 4) normalised cx, cy, w, h -> pixel x1, y1, x2, y2."""
    img_h, img_w = img_meta["img_shape"]
    factor = bbox_pred.new_tensor([img_w, img_h, img_w, img_h]).unsqueeze(0)
    pred = InstanceData(scores=cls_score, bboxes=bbox_cxcywh_to_xyxy(bbox_pred) * factor)
    return pred, gt_instances, img_meta


@MODELS.register_module(force=True)
class DeformableDETRHead(MMDetDeformableDETRHead):
    """mmdet's head. With ``train_cfg.assigner.type='BatchedHungarianAssigner'`` the matchings
    of every decoder layer, image and the two-stage encoder output are prefetched in one host
    round trip before mmdet computes the losses (the same matching, the same losses)."""

    def loss_by_feat(
        self,
        all_layers_cls_scores: Tensor,
        all_layers_bbox_preds: Tensor,
        enc_cls_scores: Optional[Tensor],
        enc_bbox_preds: Optional[Tensor],
        batch_gt_instances: List[InstanceData],
        batch_img_metas: List[dict],
        batch_gt_instances_ignore: Optional[List[InstanceData]] = None,
    ) -> dict:
        """mmdet's losses; scores (layers, bs, nq, classes), boxes (layers, bs, nq, 4)."""
        if isinstance(self.assigner, BatchedHungarianAssigner):
            # the calls in mmdet's order: every decoder layer's images, then the encoder's
            stages = list(zip(all_layers_cls_scores, all_layers_bbox_preds))
            gts = [batch_gt_instances] * len(stages)
            if enc_cls_scores is not None:
                stages.append((enc_cls_scores, enc_bbox_preds))
                # mmdet's class-agnostic proposals: every object labelled 0
                gts.append([_zero_labels(gt) for gt in batch_gt_instances])
            self.assigner.prefetch(
                [
                    assign_inputs(scores[i], boxes[i], stage_gts[i], batch_img_metas[i])
                    for (scores, boxes), stage_gts in zip(stages, gts)
                    for i in range(len(batch_img_metas))
                ]
            )
        return super().loss_by_feat(
            all_layers_cls_scores,
            all_layers_bbox_preds,
            enc_cls_scores,
            enc_bbox_preds,
            batch_gt_instances,
            batch_img_metas,
            batch_gt_instances_ignore,
        )


def _zero_labels(gt: InstanceData) -> InstanceData:
    zeroed = gt.clone()
    zeroed.labels = torch.zeros_like(gt.labels)
    return zeroed
