# mmdet's deformable-detr-refine-twostage_r50_16xb2-50e_coco on npudet's MSDA
# (same model, weights and schedule), built as mmdet builds it: the refine config plus
# two-stage proposals.
_base_ = './deformable-detr-refine_r50_16xb2-50e_coco.py'
model = dict(as_two_stage=True)
