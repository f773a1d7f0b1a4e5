# BEVFormer-tiny-like detector on nuScenes (infos converted to npudet's BEV format under
# data/nuscenes): 50x50 BEV over +-51.2 m, 3 encoder + 6 decoder layers, ResNet-50
# stage 4 + 1-level FPN, 256 dims, 900 queries, 10 classes, 6 cameras, queue of 3, 800x450
# images, AdamW 2e-4 (backbone x0.1), 24 epochs, as BEVFormer's bevformer_tiny.py.
# The backbone starts, as BEVFormer-tiny's (pretrained=dict(img='torchvision://resnet50')),
# from ImageNet-pretrained torchvision://resnet50, downloaded on first use through
# torchvision (offline: --cfg-options model.backbone.init_cfg.checkpoint=PATH/resnet50.pth;
# from scratch: model.backbone.init_cfg=None). Where npudet differs from BEVFormer-tiny, and why:
# - npudet's own encoder and head (npudet.bev), not BEVFormer's mmdet3d 0.x code: temporal
#   self-attention samples the previous BEV at cells moved by the ego poses (ego2global) in
#   place of BEVFormer's CAN-bus input, rotate_prev_bev and use_shift (npudet's infos carry
#   poses, no CAN-bus signals); no GIoU loss (BEVFormer's weight is 0); the velocity read
#   from the previous BEV (history_velocity), the box-code weights and the heading coded
#   along the line of sight (yaw_frame='ray') are the small config's, so tuning those there
#   changes this model's losses too.
# - no GridMask and no photometric distortion (npudet's pipeline has neither), and images
#   are not padded to a multiple of 32 (800x450 instead of BEVFormer's 800x480).
_base_ = ['./bev-small_r18_synthetic.py']

classes = ('car', 'truck', 'construction_vehicle', 'bus', 'trailer', 'barrier',
           'motorcycle', 'bicycle', 'pedestrian', 'traffic_cone')
pc_range = [-51.2, -51.2, -5.0, 51.2, 51.2, 3.0]
embed_dims = 256
ffn_dims = 512
bev_h = bev_w = 50

model = dict(
    backbone=dict(
        _delete_=True,
        type='ResNet',
        depth=50,
        num_stages=4,
        out_indices=(3, ),
        frozen_stages=1,
        norm_cfg=dict(type='BN', requires_grad=False),
        norm_eval=True,
        style='pytorch',
        init_cfg=dict(type='Pretrained', checkpoint='torchvision://resnet50')),
    neck=dict(
        type='FPN',
        in_channels=[2048],
        out_channels=embed_dims,
        start_level=0,
        add_extra_convs='on_output',
        num_outs=1,
        relu_before_extra_convs=True),
    encoder=dict(
        bev_h=bev_h,
        bev_w=bev_w,
        embed_dims=embed_dims,
        num_layers=3,
        num_heads=8,
        num_levels=1,
        num_cams=6,
        sca_points=8,
        tsa_points=4,
        num_z=4,
        pc_range=pc_range,
        ffn_dims=ffn_dims),
    bbox_head=dict(
        num_classes=len(classes),
        embed_dims=embed_dims,
        num_queries=900,
        num_layers=6,
        num_heads=8,
        ffn_dims=ffn_dims,
        bev_h=bev_h,
        bev_w=bev_w,
        pc_range=pc_range,
        two_stage=False),
    train_cfg=dict(
        assigner=dict(
            type='HungarianAssigner',
            match_costs=[
                dict(type='FocalLossCost', weight=2.0),
                dict(type='BEVBoxL1Cost', weight=0.25)
            ])),
    test_cfg=dict(max_per_img=300))

data_root = 'data/nuscenes/'
metainfo = dict(classes=classes)
pipeline = [
    dict(type='LoadMultiViewImages'),
    dict(type='ResizeMultiViewImages', scale=(800, 450)),
    dict(type='PackBEVInputs')
]
train_dataloader = dict(
    batch_size=1,
    num_workers=4,
    dataset=dict(
        data_root=data_root,
        ann_file='infos_train.json',
        metainfo=metainfo,
        queue_length=3,
        pipeline=pipeline))
val_dataloader = dict(
    batch_size=1,
    num_workers=4,
    dataset=dict(
        data_root=data_root,
        ann_file='infos_val.json',
        metainfo=metainfo,
        queue_length=3,
        pipeline=pipeline))
test_dataloader = val_dataloader
# nuscenes-devkit's detection_cvpr_2019 class ranges (m), as its DetectionEval filters
# (_delete_: the base config's class_range is one float for all classes).
val_evaluator = dict(
    type='BEVDetMetric',
    classes=classes,
    class_range=dict(
        _delete_=True, car=50, truck=50, bus=50, trailer=50, construction_vehicle=50,
        pedestrian=40, motorcycle=40, bicycle=40, traffic_cone=30, barrier=30))
test_evaluator = val_evaluator

optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=2e-4, weight_decay=0.01),
    paramwise_cfg=dict(custom_keys={'backbone.': dict(lr_mult=0.1)}))
max_epochs = 24
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=1.0 / 3, by_epoch=False, begin=0, end=500),
    dict(
        type='CosineAnnealingLR',
        T_max=max_epochs,
        eta_min_ratio=1e-3,
        by_epoch=True,
        begin=0,
        end=max_epochs)
]
# --show-dir pictures (the base config's BEVVisualizationHook) over this config's +-51.2 m
visualizer = dict(bev_range=pc_range[3], grid_step=10.0)
