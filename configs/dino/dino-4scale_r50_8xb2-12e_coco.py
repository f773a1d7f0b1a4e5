# mmdet's dino-4scale_r50_8xb2-12e_coco on npudet's MSDA (same model, weights, schedule).
# Data: COCO 2017 under data/coco/ (override the roots with --cfg-options);
# configs/_base_/npudet_coco.py says what npudet changes.
_base_ = [
    'mmdet::dino/dino-4scale_r50_8xb2-12e_coco.py',
    '../_base_/npudet_coco.py'
]
model = dict(msda=dict(impl='auto', encoder=None, decoder=None))
# mmdet's optimizer and param groups, stepped one launch per setting, not per parameter
# (docs/user-guide/configs.md, 'Merged param groups')
optim_wrapper = dict(constructor='MergedGroupsOptimWrapperConstructor')
val_evaluator = dict(type='FastCocoMetric', backend='auto')
test_evaluator = val_evaluator
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(
    type='DetLocalVisualizer', vis_backends=vis_backends, name='visualizer')
