# mmdet's dino-4scale_r50_8xb2-12e_coco on npudet's MSDA (same model, weights, schedule).
# Data: COCO 2017 under data/coco/ (override the roots with --cfg-options).
_base_ = 'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py'
custom_imports = dict(
    imports=['npudet.models', 'npudet.engine', 'npudet.evaluation'],
    allow_failed_imports=False)
# mmdet starts the backbone from torchvision://resnet50; npudet downloads nothing, so the
# backbone starts from scratch unless you point init_cfg at a local file, e.g.
#   --cfg-options model.backbone.init_cfg.type=Pretrained \
#       model.backbone.init_cfg.checkpoint=PATH/resnet50.pth
# (or load_from=a released mmdet checkpoint, which loads unchanged).
model = dict(
    msda=dict(impl='auto', encoder=None, decoder=None),
    backbone=dict(init_cfg=None))
custom_hooks = [dict(type='EvalProgressHook'), dict(type='CocoSummaryHook')]
# COCO evaluation on faster-coco-eval when installed (same 12 numbers as pycocotools);
# TensorBoard scalars next to the local JSON log, as in npudet's other configs.
val_evaluator = dict(type='FastCocoMetric', backend='auto')
test_evaluator = val_evaluator
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(
    type='DetLocalVisualizer', vis_backends=vis_backends, name='visualizer')
