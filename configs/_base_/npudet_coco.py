# What npudet's COCO configs add to mmdet's, besides what each config sets itself: the plugin
# (npudet's models, hooks and metrics), the evaluation hooks and the RNG states in each
# checkpoint (mmengine re-seeds on resume: without them a resumed run draws other dropout masks
# and augmentations than the uninterrupted one). Each config lists it after its mmdet base;
# mmengine forbids a key in two bases, so the keys mmdet's base has stay in the config:
# model.msda; optim_wrapper.constructor (mmdet's param groups and training, the optimizer's ops
# once per setting instead of per parameter: docs/user-guide/configs.md); COCO evaluation on
# faster-coco-eval when installed (same 12 numbers as pycocotools); TensorBoard scalars next to
# the local JSON log, as in npudet's other configs.
# Everything else is mmdet's, the backbone's init_cfg included: ImageNet-pretrained
# torchvision://resnet50, downloaded on first use, which needs torchvision (offline: a local
# file, --cfg-options model.backbone.init_cfg.checkpoint=PATH/resnet50.pth; from scratch:
# --cfg-options model.backbone.init_cfg=None). tests/models/test_shipped_configs.py holds the
# differences from mmdet's configs to this list.
custom_imports = dict(imports=['npudet.plugin'], allow_failed_imports=False)
custom_hooks = [
    dict(type='EvalProgressHook'), dict(type='CocoSummaryHook'), dict(type='RNGStateHook')]
