# Small Mask2Former (instance segmentation) for the built-in shapes set with its masks,
# trained from scratch on CPU: the small Deformable DETR's backbone (ResNet-18 at half
# width), a 128-d pixel decoder with 3 MSDA encoder layers over 3 levels, 3 masked-attention
# decoder layers, 20 queries; the 256x256 images at 128x128 (a Mask2Former step costs
# several DETR steps: its stride-4 mask features). Predicted masks are scaled back to
# 256x256 for the COCO evaluation. The model mirrors mmdet's
# mask2former_r50_8xb2-lsj-50e_coco.py.
_base_ = [
    '../_base_/datasets/shapes_instance.py', '../_base_/shapes_runtime.py'
]

image_size = 128
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='FilterAnnotations', min_gt_bbox_wh=(1e-5, 1e-5), by_mask=True),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

num_classes = 3
embed_dims = 128
model = dict(
    type='Mask2Former',
    msda=dict(impl='auto', encoder=None),
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=32,
        pad_mask=True,
        mask_pad_value=0,
        pad_seg=False),
    backbone=dict(
        type='ResNet',
        depth=18,
        base_channels=32,
        num_stages=4,
        out_indices=(0, 1, 2, 3),
        frozen_stages=-1,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        style='pytorch',
        init_cfg=None),
    panoptic_head=dict(
        type='Mask2FormerHead',
        in_channels=[32, 64, 128, 256],
        strides=[4, 8, 16, 32],
        feat_channels=embed_dims,
        out_channels=embed_dims,
        num_things_classes=num_classes,
        num_stuff_classes=0,
        num_queries=20,
        num_transformer_feat_level=3,
        pixel_decoder=dict(
            type='MSDeformAttnPixelDecoder',
            num_outs=3,
            norm_cfg=dict(type='GN', num_groups=32),
            act_cfg=dict(type='ReLU'),
            encoder=dict(
                num_layers=3,
                layer_cfg=dict(
                    self_attn_cfg=dict(
                        embed_dims=embed_dims,
                        num_heads=8,
                        num_levels=3,
                        num_points=4,
                        dropout=0.0,
                        batch_first=True),
                    ffn_cfg=dict(
                        embed_dims=embed_dims,
                        feedforward_channels=embed_dims * 4,
                        num_fcs=2,
                        ffn_drop=0.0,
                        act_cfg=dict(type='ReLU', inplace=True)))),
            positional_encoding=dict(
                num_feats=embed_dims // 2, normalize=True)),
        enforce_decoder_input_project=False,
        positional_encoding=dict(num_feats=embed_dims // 2, normalize=True),
        transformer_decoder=dict(
            return_intermediate=True,
            num_layers=3,
            layer_cfg=dict(
                self_attn_cfg=dict(
                    embed_dims=embed_dims,
                    num_heads=8,
                    dropout=0.0,
                    batch_first=True),
                cross_attn_cfg=dict(
                    embed_dims=embed_dims,
                    num_heads=8,
                    dropout=0.0,
                    batch_first=True),
                ffn_cfg=dict(
                    embed_dims=embed_dims,
                    feedforward_channels=embed_dims * 8,
                    num_fcs=2,
                    ffn_drop=0.0,
                    act_cfg=dict(type='ReLU', inplace=True))),
            init_cfg=None),
        loss_cls=dict(
            type='CrossEntropyLoss',
            use_sigmoid=False,
            loss_weight=2.0,
            reduction='mean',
            class_weight=[1.0] * num_classes + [0.1]),
        loss_mask=dict(
            type='CrossEntropyLoss',
            use_sigmoid=True,
            reduction='mean',
            loss_weight=5.0),
        loss_dice=dict(
            type='DiceLoss',
            use_sigmoid=True,
            activate=True,
            reduction='mean',
            naive_dice=True,
            eps=1.0,
            loss_weight=5.0)),
    panoptic_fusion_head=dict(
        type='MaskFormerFusionHead',
        num_things_classes=num_classes,
        num_stuff_classes=0,
        loss_panoptic=None,
        init_cfg=None),
    # mmdet samples 12544 points (112^2) per mask at 1024 px; these masks are 32x32
    train_cfg=dict(
        num_points=784,
        oversample_ratio=3.0,
        importance_sample_ratio=0.75,
        assigner=dict(
            type='HungarianAssigner',
            match_costs=[
                dict(type='ClassificationCost', weight=2.0),
                dict(
                    type='CrossEntropyLossCost', weight=5.0, use_sigmoid=True),
                dict(type='DiceCost', weight=5.0, pred_act=True, eps=1.0)
            ]),
        sampler=dict(type='MaskPseudoSampler')),
    test_cfg=dict(
        panoptic_on=False,
        semantic_on=False,
        instance_on=True,
        max_per_image=20,
        iou_thr=0.8,
        filter_low_score=True),
    init_cfg=None)

embed_multi = dict(lr_mult=1.0, decay_mult=0.0)
optim_wrapper = dict(
    type='OptimWrapper',
    optimizer=dict(
        type='AdamW', lr=4e-4, weight_decay=0.05, eps=1e-8,
        betas=(0.9, 0.999)),
    paramwise_cfg=dict(
        custom_keys={
            'query_embed': embed_multi,
            'query_feat': embed_multi,
            'level_embed': embed_multi,
        },
        norm_decay_mult=0.0),
    clip_grad=dict(max_norm=1.0, norm_type=2))

# 2 x 250 iterations of batch 4 on the 1000 train images, at a constant rate after warm-up
max_epochs = 2
train_cfg = dict(max_epochs=max_epochs, val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=100)
]
