# Small DDQ-DETR-4scale for the built-in shapes set, trained from scratch on CPU: the small
# DINO's backbone, 256-d transformer (mmdet's DDQ decoder is DINO's, its query position
# encoding fixed at 256 channels), 3+3 layers and 20 denoising queries, with mmdet's DDQ
# settings (ddq-detr-4scale_r50_8xb2-12e_coco.py): dense queries 1.5x the 50 matching
# ones, distinct query selection by NMS at IoU 0.8.
_base_ = './dino-4scale_r18-tiny_shapes.py'

model = dict(
    type='DDQDETR',
    dense_topk_ratio=1.5,
    dqs_cfg=dict(type='nms', iou_threshold=0.8),
    bbox_head=dict(type='DDQDETRHead'))
