"""mmdet's DETR heads and their assigner, with the Hungarian matching of a whole loss
computation crossing to the host in one copy (``model.train_cfg.assigner.type =
'BatchedHungarianAssigner'``)."""

from .batched_hungarian import BatchedHungarianAssigner
from .deformable_detr_head import DeformableDETRHead

__all__ = ["BatchedHungarianAssigner", "DeformableDETRHead"]
