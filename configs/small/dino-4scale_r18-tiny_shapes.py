# Small DINO-4scale for the built-in shapes set, trained from scratch on CPU: the small
# Deformable DETR's backbone, queries and depth with mmdet's DINO settings
# (dino-4scale_r50_8xb2-12e_coco.py) and 20 denoising queries. mmdet's DINO decoder
# fixes the query position encoding at 256 channels, so the transformer is 256-d here.
_base_ = './deformable-detr-refine-twostage_r18-tiny_shapes.py'

embed_dims = 256
model = dict(
    type='DINO',
    neck=dict(out_channels=embed_dims),
    encoder=dict(
        layer_cfg=dict(
            self_attn_cfg=dict(embed_dims=embed_dims),
            ffn_cfg=dict(embed_dims=embed_dims))),
    decoder=dict(
        layer_cfg=dict(
            self_attn_cfg=dict(embed_dims=embed_dims),
            cross_attn_cfg=dict(embed_dims=embed_dims),
            ffn_cfg=dict(embed_dims=embed_dims))),
    positional_encoding=dict(
        num_feats=embed_dims // 2, offset=0.0, temperature=20),
    bbox_head=dict(
        type='DINOHead', embed_dims=embed_dims, loss_cls=dict(loss_weight=1.0)),
    dn_cfg=dict(
        label_noise_scale=0.5,
        box_noise_scale=1.0,
        group_cfg=dict(dynamic=True, num_groups=None, num_dn_queries=20)))
