# mmdet's grounding_dino_r50_scratch_8xb2_1x_coco on npudet's MSDA: the image encoder's and
# the decoder's MSDA layers (its text and fusion layers are not MSDA); same model, schedule
# and text encoder (lang_model_name: BERT from the Hugging Face hub, fetched by transformers).
# Data: COCO 2017 under data/coco/; configs/_base_/npudet_coco.py says what npudet changes.
_base_ = [
    'mmdet::grounding_dino/grounding_dino_r50_scratch_8xb2_1x_coco.py',
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
