# Small Deformable DETR (+box refine, +two-stage) for the built-in shapes set, trained
# from scratch on CPU: ResNet-18 at half width, 128-d transformer, 3+3 layers, 50 queries.
# The model mirrors mmdet's deformable-detr-refine-twostage_r50_16xb2-50e_coco.py.
_base_ = [
    '../_base_/datasets/shapes_detection.py', '../_base_/shapes_runtime.py'
]

embed_dims = 128
ffn_dims = 512
model = dict(
    type='DeformableDETR',
    msda=dict(impl='auto', encoder=None, decoder=None),
    num_queries=50,
    num_feature_levels=4,
    with_box_refine=True,
    as_two_stage=True,
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=1),
    backbone=dict(
        type='ResNet',
        depth=18,
        base_channels=32,
        num_stages=4,
        out_indices=(1, 2, 3),
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        style='pytorch',
        init_cfg=None),
    neck=dict(
        type='ChannelMapper',
        in_channels=[64, 128, 256],
        kernel_size=1,
        out_channels=embed_dims,
        act_cfg=None,
        norm_cfg=dict(type='GN', num_groups=32),
        num_outs=4),
    encoder=dict(
        num_layers=3,
        layer_cfg=dict(
            self_attn_cfg=dict(
                embed_dims=embed_dims, dropout=0.0, batch_first=True),
            ffn_cfg=dict(
                embed_dims=embed_dims,
                feedforward_channels=ffn_dims,
                ffn_drop=0.0))),
    decoder=dict(
        num_layers=3,
        return_intermediate=True,
        layer_cfg=dict(
            self_attn_cfg=dict(
                embed_dims=embed_dims,
                num_heads=8,
                dropout=0.0,
                batch_first=True),
            cross_attn_cfg=dict(
                embed_dims=embed_dims, dropout=0.0, batch_first=True),
            ffn_cfg=dict(
                embed_dims=embed_dims,
                feedforward_channels=ffn_dims,
                ffn_drop=0.0)),
        post_norm_cfg=None),
    positional_encoding=dict(
        num_feats=embed_dims // 2, normalize=True, offset=-0.5),
    bbox_head=dict(
        type='DeformableDETRHead',
        num_classes=3,
        embed_dims=embed_dims,
        sync_cls_avg_factor=True,
        loss_cls=dict(
            type='FocalLoss',
            use_sigmoid=True,
            gamma=2.0,
            alpha=0.25,
            loss_weight=2.0),
        loss_bbox=dict(type='L1Loss', loss_weight=5.0),
        loss_iou=dict(type='GIoULoss', loss_weight=2.0)),
    train_cfg=dict(
        assigner=dict(
            type='HungarianAssigner',
            match_costs=[
                dict(type='FocalLossCost', weight=2.0),
                dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
                dict(type='IoUCost', iou_mode='giou', weight=2.0)
            ])),
    test_cfg=dict(max_per_img=50))

optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(type='AdamW', lr=4e-4, weight_decay=0.0001),
    clip_grad=dict(max_norm=1.0, norm_type=2),
    paramwise_cfg=dict(
        custom_keys={
            'sampling_offsets': dict(lr_mult=0.1),
            'reference_points': dict(lr_mult=0.1)
        }))

# 4 x 250 iterations of batch 4 on the 1000 train images: ~11 min on 2 idle cores.
max_epochs = 4
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=100),
    dict(
        type='MultiStepLR',
        begin=0,
        end=max_epochs,
        by_epoch=True,
        milestones=[max_epochs - 1],
        gamma=0.1)
]
