# mmdet's deformable-detr-refine_r50_16xb2-50e_coco on npudet's MSDA
# (same model, weights and schedule), built as mmdet builds it: the plain config plus
# iterative box refinement.
_base_ = './deformable-detr_r50_16xb2-50e_coco.py'
model = dict(with_box_refine=True)
