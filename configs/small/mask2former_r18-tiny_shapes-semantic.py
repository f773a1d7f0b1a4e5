# Small Mask2Former for semantic segmentation (MMSegmentation 1.2, the `seg` extra) on the
# built-in shapes set: 4 classes (background + the 3 shapes; the semantic maps are drawn from
# the instance masks: `python tools/dataset_converters/make_shapes_dataset.py`). mmseg's own
# R50 ADE20K Mask2Former (inherited) at the small Mask2Former's sizes: ResNet-18 at half width
# from scratch, a 128-d pixel decoder with 3 MSDA encoder layers over 3 levels, 3 decoder
# layers, 20 queries, the 256x256 images at 128x128. Its MSDA layers run on npudet's op
# through MSDASwitchHook: mmseg's EncoderDecoder is no npudet class. Evaluated by mmseg's
# IoUMetric (mIoU) at the images' own 256x256.
_base_ = ['mmseg::mask2former/mask2former_r50_8xb2-160k_ade20k-512x512.py']

custom_imports = dict(imports=['npudet.plugin'], allow_failed_imports=False)
# RNGStateHook is in mmdet's registry: named with its scope from mmseg's
custom_hooks = [
    dict(type='MSDASwitchHook', impl='auto'),
    dict(type='mmdet.RNGStateHook')
]

classes = ('background', 'circle', 'square', 'triangle')
num_classes = len(classes)
image_size = 128
embed_dims = 128
data_preprocessor = dict(
    size=(image_size, image_size), test_cfg=dict(size_divisor=32))
model = dict(
    data_preprocessor=data_preprocessor,
    backbone=dict(
        depth=18,
        stem_channels=32,
        base_channels=32,
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        init_cfg=None),
    decode_head=dict(
        in_channels=[32, 64, 128, 256],
        feat_channels=embed_dims,
        out_channels=embed_dims,
        num_classes=num_classes,
        num_queries=20,
        pixel_decoder=dict(
            encoder=dict(
                num_layers=3,
                layer_cfg=dict(
                    self_attn_cfg=dict(embed_dims=embed_dims),
                    ffn_cfg=dict(
                        embed_dims=embed_dims,
                        feedforward_channels=embed_dims * 4))),
            positional_encoding=dict(num_feats=embed_dims // 2)),
        positional_encoding=dict(num_feats=embed_dims // 2),
        transformer_decoder=dict(
            num_layers=3,
            layer_cfg=dict(
                self_attn_cfg=dict(embed_dims=embed_dims),
                cross_attn_cfg=dict(embed_dims=embed_dims),
                ffn_cfg=dict(
                    embed_dims=embed_dims,
                    feedforward_channels=embed_dims * 8))),
        loss_cls=dict(class_weight=[1.0] * num_classes + [0.1]),
        # mmseg samples 12544 points (112^2) per mask at 512 px; these masks are 32x32
        train_cfg=dict(num_points=784)))

data_root = 'data/shapes/'
metainfo = dict(
    classes=classes,
    palette=[(0, 0, 0), (220, 20, 60), (0, 128, 255), (0, 200, 80)])
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=True),
    dict(type='LoadAnnotations'),
    dict(type='PackSegInputs')
]


def shapes_loader(split, pipeline, batch_size, shuffle):
    return dict(
        _delete_=True,
        batch_size=batch_size,
        num_workers=0,
        persistent_workers=False,
        sampler=dict(type='DefaultSampler', shuffle=shuffle),
        dataset=dict(
            type='BaseSegDataset',
            data_root=data_root,
            metainfo=metainfo,
            data_prefix=dict(
                img_path=split, seg_map_path='semantic/' + split),
            img_suffix='.jpg',
            seg_map_suffix='.png',
            pipeline=pipeline))


train_dataloader = shapes_loader('train', train_pipeline, 4, True)
val_dataloader = shapes_loader('val', test_pipeline, 1, False)
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

optim_wrapper = dict(
    optimizer=dict(lr=4e-4),
    clip_grad=dict(max_norm=1.0),
    paramwise_cfg=dict(custom_keys=dict(backbone=dict(lr_mult=1.0))))
# 2 x 250 iterations of batch 4 on the 1000 train images, at a constant rate after warm-up
max_epochs = 2
train_cfg = dict(
    _delete_=True,
    type='EpochBasedTrainLoop',
    max_epochs=max_epochs,
    val_interval=max_epochs)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=100)
]
default_hooks = dict(
    logger=dict(interval=20),
    checkpoint=dict(
        by_epoch=True, interval=max_epochs, max_keep_ckpts=1, save_best=None))
log_processor = dict(by_epoch=True)
# TensorBoard scalars next to the JSON log, as npudet's other configs
vis_backends = [
    dict(type='LocalVisBackend'),
    dict(type='TensorboardVisBackend')
]
visualizer = dict(vis_backends=vis_backends)
randomness = dict(seed=0)
env_cfg = dict(dist_cfg=dict(backend='gloo'))
