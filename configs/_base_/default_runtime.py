# The runtime of npudet's own configs (configs/small/*, configs/bev/*): mmdet's, with the
# plugin (npudet's models, hooks and metrics) and settings for a run on a few CPU cores: a log
# line every 20 iterations, a checkpoint per epoch (the latest kept), seed 0, gloo for
# distributed runs; epoch-based loops (each config sets max_epochs and val_interval).
# TensorBoard next to the local JSON log: losses, learning rate, the MSDA profiler's scalars
# (MSDAProfilerHook) and the COCO / BEV metrics of each evaluation go to
# <work_dir>/<timestamp>/vis_data/ (scalars.json and events.out.tfevents.*);
# view them with `tensorboard --logdir <work_dir>`. Needs the tensorboard package (a dependency).
_base_ = 'mmdet::_base_/default_runtime.py'
custom_imports = dict(imports=['npudet.plugin'], allow_failed_imports=False)

default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(type='CheckpointHook', interval=1, max_keep_ckpts=1))
vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(
    type='DetLocalVisualizer', vis_backends=vis_backends, name='visualizer')
log_processor = dict(window_size=20)
randomness = dict(seed=0)
env_cfg = dict(dist_cfg=dict(backend='gloo'))

train_cfg = dict(type='EpochBasedTrainLoop')
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
