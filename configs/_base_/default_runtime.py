# mmdet's default runtime, with TensorBoard next to the local JSON log: losses, learning rate,
# the MSDA profiler's scalars (MSDAProfilerHook) and the COCO / BEV metrics of each evaluation go
# to <work_dir>/<timestamp>/vis_data/ (scalars.json and events.out.tfevents.*);
# view them with `tensorboard --logdir <work_dir>`. Needs the tensorboard package (a dependency).
_base_ = 'mmdet::_base_/default_runtime.py'

vis_backends = [dict(type='LocalVisBackend'), dict(type='TensorboardVisBackend')]
visualizer = dict(
    type='DetLocalVisualizer', vis_backends=vis_backends, name='visualizer')
