# mmdet's mask2former_r50_8xb2-lsj-50e_coco (instance segmentation) on npudet's MSDA: the
# pixel decoder's 6 MSDA encoder layers (model.msda.encoder); same model, weights, schedule.
# Data: COCO 2017 under data/coco/; configs/_base_/npudet_coco.py says what npudet changes.
_base_ = [
    'mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco.py',
    '../_base_/npudet_coco.py'
]
model = dict(msda=dict(impl='auto', encoder=None))
# mmdet's optimizer and param groups, stepped one launch per setting, not per parameter
# (docs/user-guide/configs.md, 'Merged param groups')
optim_wrapper = dict(constructor='MergedGroupsOptimWrapperConstructor')
val_evaluator = dict(type='FastCocoMetric', backend='auto')
test_evaluator = val_evaluator
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(
    type='DetLocalVisualizer', vis_backends=vis_backends, name='visualizer')
