# What npudet's COCO configs add to mmdet's, besides what each config sets itself: the plugin
# (npudet's models, hooks and metrics) and the evaluation hooks. Each config lists it after its
# mmdet base; mmengine forbids a key in two bases, so the keys mmdet's base has stay in the
# config: model.msda; backbone.init_cfg=None (mmdet starts the backbone from
# torchvision://resnet50; npudet downloads nothing, so the backbone starts from scratch unless
# you point init_cfg at a local file, e.g.
#   --cfg-options model.backbone.init_cfg.type=Pretrained \
#       model.backbone.init_cfg.checkpoint=PATH/resnet50.pth
# or load_from=a released mmdet checkpoint, which loads unchanged); COCO evaluation on
# faster-coco-eval when installed (same 12 numbers as pycocotools); TensorBoard scalars next to
# the local JSON log, as in npudet's other configs.
custom_imports = dict(imports=['npudet.plugin'], allow_failed_imports=False)
custom_hooks = [dict(type='EvalProgressHook'), dict(type='CocoSummaryHook')]
