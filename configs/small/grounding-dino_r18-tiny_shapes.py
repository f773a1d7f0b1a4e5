# Small Grounding DINO for the built-in shapes set, prompted with its class names
# ('circle . square . triangle .'), trained from scratch on CPU: the small DINO's backbone,
# 256-d transformer (its decoder is DINO's, the query position encoding fixed at 256
# channels), 3+3 layers, 50 queries, 20 denoising queries, with mmdet's Grounding DINO
# settings (grounding_dino_r50_scratch_8xb2_1x_coco.py): a text layer and a text-image fusion
# layer beside each image encoder layer (narrower here), a text cross-attention in each
# decoder layer, contrastive classification against the prompt's tokens.
# The text encoder is mmdet's BertModel on lang_model_name, as in mmdet (fetched from the
# Hugging Face hub); a local folder with a BERT config, vocabulary and weights works the same
# (the tests train it on a 2-layer, 32-wide BERT they write: nothing downloaded).
_base_ = './dino-4scale_r18-tiny_shapes.py'

lang_model_name = 'bert-base-uncased'
embed_dims = 256
model = dict(
    type='GroundingDINO',
    language_model=dict(
        type='BertModel',
        name=lang_model_name,
        pad_to_max=False,
        use_sub_sentence_represent=True,
        special_tokens_list=['[CLS]', '[SEP]', '.', '?'],
        add_pooling_layer=False),
    neck=dict(bias=True),
    encoder=dict(
        text_layer_cfg=dict(
            self_attn_cfg=dict(num_heads=4, embed_dims=embed_dims, dropout=0.0),
            ffn_cfg=dict(
                embed_dims=embed_dims, feedforward_channels=512,
                ffn_drop=0.0)),
        fusion_layer_cfg=dict(
            v_dim=embed_dims,
            l_dim=embed_dims,
            embed_dim=512,
            num_heads=4,
            init_values=1e-4)),
    decoder=dict(
        layer_cfg=dict(
            cross_attn_text_cfg=dict(
                embed_dims=embed_dims, num_heads=8, dropout=0.0))),
    bbox_head=dict(
        type='GroundingDINOHead',
        contrastive_cfg=dict(max_text_len=256, log_scale='auto', bias=True)),
    train_cfg=dict(
        assigner=dict(
            type='HungarianAssigner',
            match_costs=[
                dict(type='BinaryFocalLossCost', weight=2.0),
                dict(type='BBoxL1Cost', weight=5.0, box_format='xywh'),
                dict(type='IoUCost', iou_mode='giou', weight=2.0)
            ])))

# the prompt: the dataset's class names, kept through PackDetInputs
image_size = 256
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor', 'flip', 'flip_direction', 'text',
                   'custom_entities'))
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(image_size, image_size), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor', 'text', 'custom_entities'))
]
train_dataloader = dict(
    dataset=dict(pipeline=train_pipeline, return_classes=True))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline, return_classes=True))
test_dataloader = val_dataloader
