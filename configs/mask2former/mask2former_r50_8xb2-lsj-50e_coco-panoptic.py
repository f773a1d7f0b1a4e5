# mmdet's mask2former_r50_8xb2-lsj-50e_coco-panoptic on npudet's MSDA: the pixel decoder's 6
# MSDA encoder layers (model.msda.encoder); same model, weights, schedule. Data: COCO 2017
# panoptic under data/coco/. The evaluators stay mmdet's (CocoPanopticMetric + CocoMetric);
# configs/_base_/npudet_coco.py says what else npudet changes.
_base_ = [
    'mmdet::mask2former/mask2former_r50_8xb2-lsj-50e_coco-panoptic.py',
    '../_base_/npudet_coco.py'
]
model = dict(msda=dict(impl='auto', encoder=None))
# mmdet's optimizer and param groups, stepped one launch per setting, not per parameter
# (docs/user-guide/configs.md, 'Merged param groups')
optim_wrapper = dict(constructor='MergedGroupsOptimWrapperConstructor')
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(
    type='DetLocalVisualizer', vis_backends=vis_backends, name='visualizer')
