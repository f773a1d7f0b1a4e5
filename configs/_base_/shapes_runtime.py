# The runtime of the small configs on the shapes set (configs/small/*): npudet's, with the COCO
# evaluation hooks (a progress bar; the COCO table and its JSON, as configs/_base_/npudet_coco.py)
# and the RNG states in each checkpoint (a resumed run draws what the uninterrupted one would);
# the learning rates are set for the shapes loaders' batch of 4 (`--auto-scale-lr` rescales them).
_base_ = './default_runtime.py'
custom_hooks = [
    dict(type='EvalProgressHook'),
    dict(type='CocoSummaryHook'),
    dict(type='RNGStateHook'),
]
auto_scale_lr = dict(base_batch_size=4)
