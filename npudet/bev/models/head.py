"""DETR-style 3D detection head decoding object queries against the BEV map."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
from mmdet.models.layers import (
    MLP,
    DeformableDetrTransformerDecoderLayer,
    coordinate_to_encoding,
    inverse_sigmoid,
)
from mmdet.registry import MODELS, TASK_UTILS
from mmdet.utils import reduce_mean
from mmengine.model import BaseModule, bias_init_with_prob
from mmengine.structures import InstanceData
from torch import Tensor, nn

from npudet.models.layers import convert_msda

from .box_coder import CODE_SIZE, BEVBoxCoder
from .history_velocity import HistoryVelocity
from .levels import msda_levels
from .temporal_self_attention import bev_reference_points


def refine_codes(ref: Tensor, delta: Tensor) -> Tensor:
    """Reference (u, v) (..., 2) and raw deltas (..., 10) -> codes (..., 10).

    u, v move in inverse-sigmoid space; the normalised height is a sigmoid.
    """
    uv = (inverse_sigmoid(ref) + delta[..., :2]).sigmoid()
    return torch.cat([uv, delta[..., 2:3].sigmoid(), delta[..., 3:]], -1)


def default_loss_cls() -> dict:
    """Sigmoid focal loss, as in mmdet's Deformable DETR head."""
    return dict(type="FocalLoss", use_sigmoid=True, gamma=2.0, alpha=0.25, loss_weight=2.0)


def default_train_cfg() -> dict:
    """Hungarian matching on the focal classification cost and the code L1 cost."""
    return dict(
        assigner=dict(
            type="HungarianAssigner",
            match_costs=[
                dict(type="FocalLossCost", weight=2.0),
                dict(type="BEVBoxL1Cost", weight=0.25),
            ],
        )
    )


@MODELS.register_module()
class BEVDetrHead(BaseModule):
    """Object queries decoded against the BEV map with iterative (u, v) refinement.

    Decoder layers are mmdet's ``DeformableDetrTransformerDecoderLayer`` (self-attention,
    one-level deformable cross-attention over the BEV map, mmcv FFN) on npudet's MSDA.
    Per decoder layer: class logits (B, nq, K) and codes (B, nq, 10) in the
    :class:`BEVBoxCoder` space. Training, for every layer (``d{i}.`` prefix for all but
    the last): ``train_cfg['assigner']`` (mmdet's ``HungarianAssigner``) matches queries
    to objects, then ``loss_cls`` (mmdet ``FocalLoss``) on all queries and ``loss_bbox``
    (mmdet ``L1Loss``, entries weighted by ``code_weights``) on the matched ones, both
    averaged over the number of objects, as mmdet's DETR heads do.

    ``two_stage=False``: learned query positions and reference points (BEVFormer).
    ``two_stage=True``: every BEV cell proposes a box (``enc.`` losses, matched like a
    decoder layer); the ``num_queries`` best proposals seed the decoder, whose query
    content is the proposal's feature and whose positional query is an MLP of the
    sine embedding of its current reference point (Deformable DETR two-stage / DINO).

    ``yaw_frame``: what the (sin, cos) code's angle is measured from, :class:`BEVBoxCoder`'s
    ``'ego'`` (the yaw, BEVFormer) or ``'ray'`` (heading relative to the line of sight).

    ``history_velocity``: dict of :class:`HistoryVelocity` options (window, step, dims,
    hidden) or None. Given, each decoder layer's velocity comes from that readout of the
    ego-motion-aligned previous BEV (the current BEV stands in without one) around the
    layer's refined centre instead of from its regression branch.

    ``loss_cls`` defaults to :func:`default_loss_cls`, ``loss_bbox`` to
    ``L1Loss(loss_weight=0.25)``, ``train_cfg`` to :func:`default_train_cfg`,
    ``test_cfg`` to ``dict(max_per_img=100)``.
    """

    def __init__(
        self,
        num_classes: int = 10,
        embed_dims: int = 256,
        num_queries: int = 900,
        num_layers: int = 6,
        num_heads: int = 8,
        num_points: int = 4,
        ffn_dims: int = 512,
        dropout: float = 0.1,
        bev_h: int = 50,
        bev_w: int = 50,
        pc_range: Sequence[float] = (-51.2, -51.2, -5.0, 51.2, 51.2, 3.0),
        code_weights: Sequence[float] = (1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 0.2, 0.2),
        two_stage: bool = False,
        yaw_frame: str = "ego",
        history_velocity: Optional[dict] = None,
        loss_cls: Optional[dict] = None,
        loss_bbox: Optional[dict] = None,
        train_cfg: Optional[dict] = None,
        test_cfg: Optional[dict] = None,
        init_cfg=None,
    ) -> None:
        super().__init__(init_cfg)
        self.num_classes, self.num_queries = num_classes, num_queries
        self.bev_hw = (bev_h, bev_w)
        self.coder = BEVBoxCoder(pc_range, yaw_frame)
        if len(code_weights) != CODE_SIZE:
            raise ValueError(f"code_weights: expected {CODE_SIZE} weights, got {len(code_weights)}")
        self.register_buffer("code_weights", torch.tensor(code_weights), persistent=False)
        loss_cls = loss_cls or default_loss_cls()
        if not loss_cls.get("use_sigmoid", False):
            raise ValueError(f"loss_cls: the head scores classes by sigmoid, got {loss_cls}")
        self.loss_cls = MODELS.build(loss_cls)
        self.loss_bbox = MODELS.build(loss_bbox or dict(type="L1Loss", loss_weight=0.25))
        train_cfg = train_cfg or default_train_cfg()
        if "assigner" not in train_cfg:
            raise ValueError(f"train_cfg: expected an 'assigner' entry, got {dict(train_cfg)}")
        self.assigner = TASK_UTILS.build(train_cfg["assigner"])
        self.test_cfg = {"max_per_img": 100, **(test_cfg or {})}
        self.two_stage = two_stage
        self.history_velocity = (
            HistoryVelocity(embed_dims, pc_range, **history_velocity)
            if history_velocity is not None
            else None
        )
        if two_stage:
            self.memory_proj = nn.Sequential(
                nn.Linear(embed_dims, embed_dims), nn.LayerNorm(embed_dims)
            )
            self.enc_cls = nn.Linear(embed_dims, num_classes)
            self.enc_reg = MLP(embed_dims, embed_dims, CODE_SIZE, 2)
            self.pos_mlp = MLP(embed_dims, embed_dims, embed_dims, 2)
        else:
            self.query_embedding = nn.Embedding(num_queries, embed_dims * 2)
            self.ref_points = nn.Linear(embed_dims, 2)
        self.decoder = nn.ModuleList(
            DeformableDetrTransformerDecoderLayer(
                self_attn_cfg=dict(embed_dims=embed_dims, num_heads=num_heads, attn_drop=dropout),
                cross_attn_cfg=dict(
                    embed_dims=embed_dims,
                    num_heads=num_heads,
                    num_levels=1,
                    num_points=num_points,
                    dropout=dropout,
                ),
                ffn_cfg=dict(
                    embed_dims=embed_dims, feedforward_channels=ffn_dims, ffn_drop=dropout
                ),
            )
            for _ in range(num_layers)
        )
        convert_msda(self.decoder, "auto")  # mmdet builds mmcv's class; sample on npudet's op
        self.cls_branches = nn.ModuleList(
            nn.Linear(embed_dims, num_classes) for _ in range(num_layers)
        )
        self.reg_branches = nn.ModuleList(
            MLP(embed_dims, embed_dims, CODE_SIZE, 2) for _ in range(num_layers)
        )
        prior = bias_init_with_prob(0.01)
        for cls in [*self.cls_branches, *([self.enc_cls] if two_stage else [])]:
            nn.init.constant_(cls.bias, prior)

    def positional_query(self, ref: Tensor) -> Tensor:
        """Two-stage positional query of reference points (B, nq, 2) -> (B, nq, C)."""
        c = self.pos_mlp.layers[0].in_features
        return self.pos_mlp(coordinate_to_encoding(ref, num_feats=c // 2))

    def proposals(self, bev: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
        """Per-cell proposals of the BEV map (B, Q, C): logits (B, Q, K), codes (B, Q, 10),
        and the projected cell features (B, Q, C)."""
        memory = self.memory_proj(bev)
        cells = bev_reference_points(*self.bev_hw, bev.device).to(bev.dtype)
        codes = refine_codes(cells.expand(bev.shape[0], -1, -1), self.enc_reg(memory))
        return self.enc_cls(memory), codes, memory

    def initial_queries(self, bev: Tensor) -> Tuple[Tensor, Tensor, Tensor, List[Tensor]]:
        """Content (B, nq, C), positional query (B, nq, C) and reference points
        (B, nq, 2) of the first decoder layer, plus the proposal outputs (two-stage) or []."""
        b = bev.shape[0]
        if not self.two_stage:
            pos, query = self.query_embedding.weight.chunk(2, -1)
            pos, query = pos[None].expand(b, -1, -1), query[None].expand(b, -1, -1)
            return query, pos, self.ref_points(pos).sigmoid(), []
        logits, codes, memory = self.proposals(bev)
        k = min(self.num_queries, logits.shape[1])
        top = logits.max(-1).values.topk(k, dim=1).indices
        ref = codes[..., :2].gather(1, top[..., None].expand(-1, -1, 2)).detach()
        query = memory.gather(1, top[..., None].expand(-1, -1, memory.shape[-1])).detach()
        return query, self.positional_query(ref), ref, [logits, codes]

    def forward(
        self,
        bev: Tensor,
        prev_bev: Optional[Tensor] = None,
        cur2prev: Optional[Tensor] = None,
        prev_valid: Optional[Tensor] = None,
    ) -> Tuple[List[Tensor], List[Tensor]]:
        """bev (B, Q, C) -> per layer: logits (B, nq, K), codes (B, nq, 10).

        With ``two_stage`` the lists start with the proposals (B, Q, K), (B, Q, 10).
        The previous frame (``prev_bev`` (B, Q, C), ``cur2prev`` (B, 4, 4) the ego motion,
        ``prev_valid`` (B,)) is read by ``history_velocity`` only; without it the current BEV
        stands in.
        """
        query, pos, ref, enc = self.initial_queries(bev)
        if self.history_velocity is not None:
            history = self.history_velocity.project(bev, self.bev_hw, prev_bev, prev_valid)
        all_cls, all_codes = enc[:1], enc[1:]
        shapes, starts = msda_levels([self.bev_hw], bev.device)
        for i, (layer, cls_b, reg_b) in enumerate(
            zip(self.decoder, self.cls_branches, self.reg_branches)
        ):
            if self.two_stage and i > 0:
                pos = self.positional_query(ref)
            query = layer(
                query,
                value=bev,
                query_pos=pos,
                reference_points=ref[:, :, None],
                spatial_shapes=shapes,
                level_start_index=starts,
            )
            codes = refine_codes(ref, reg_b(query))
            if self.history_velocity is not None:
                velocity = self.history_velocity(
                    query, codes[..., :2], history, cur2prev, prev_valid
                )
                codes = torch.cat([codes[..., :8], velocity], -1)
            all_cls.append(cls_b(query))
            all_codes.append(codes)
            ref = codes[..., :2].detach()
        return all_cls, all_codes

    def get_targets_single(
        self, logits: Tensor, codes: Tensor, gt: InstanceData
    ) -> Tuple[Tensor, Tensor, Tensor]:
        """Assign one sample's queries: logits (nq, K), codes (nq, 10), ``gt`` with
        bboxes_3d (N, 9) and labels_3d (N,).

        Returns labels (nq,) long (``num_classes`` = background), code targets (nq, 10)
        and their weights (nq, 10): 1 on matched queries, 0 elsewhere.
        """
        gt_labels = gt.labels_3d.to(logits.device).long()
        targets = self.coder.encode(gt.bboxes_3d.to(codes))
        assigned = self.assigner.assign(
            InstanceData(scores=logits.detach(), bboxes=codes.detach()),
            InstanceData(labels=gt_labels, bboxes=targets),
        )
        pos = (assigned.gt_inds > 0).nonzero(as_tuple=True)[0]
        matched = assigned.gt_inds[pos] - 1
        labels = gt_labels.new_full((logits.shape[0],), self.num_classes)
        labels[pos] = gt_labels[matched]
        code_targets = codes.new_zeros(codes.shape)
        code_targets[pos] = targets[matched]
        code_weights = codes.new_zeros(codes.shape)
        code_weights[pos] = 1.0
        return labels, code_targets, code_weights

    def loss_by_feat_single(
        self, logits: Tensor, codes: Tensor, gt: List[InstanceData]
    ) -> Tuple[Tensor, Tensor]:
        """One decoder layer: logits (B, nq, K), codes (B, nq, 10) -> (loss_cls, loss_bbox)."""
        per_sample = [self.get_targets_single(*args) for args in zip(logits, codes, gt)]
        labels, targets, weights = (torch.cat(parts) for parts in zip(*per_sample))
        num_pos = logits.new_tensor([float((labels < self.num_classes).sum())])
        num_pos = reduce_mean(num_pos).clamp(min=1.0).item()
        loss_cls = self.loss_cls(logits.flatten(0, 1), labels, avg_factor=num_pos)
        # unknown entries (e.g. a velocity nuScenes leaves NaN) carry no loss
        weights = weights * self.code_weights * targets.isfinite()
        loss_bbox = self.loss_bbox(
            codes.flatten(0, 1), targets.nan_to_num(), weights, avg_factor=num_pos
        )
        return loss_cls, loss_bbox

    def loss(self, bev: Tensor, gt: List[InstanceData], **history: Tensor) -> Dict[str, Tensor]:
        """Losses of every decoder layer; ``gt``: InstanceData with bboxes_3d (N, 9), labels_3d;
        ``history``: the previous frame as :meth:`forward` takes it."""
        all_cls, all_codes = self(bev, **history)
        losses: Dict[str, Tensor] = {}
        prefixes = ["enc."] * self.two_stage + [f"d{i}." for i in range(len(self.decoder) - 1)]
        for prefix, logits, codes in zip(prefixes + [""], all_cls, all_codes):
            losses[f"{prefix}loss_cls"], losses[f"{prefix}loss_bbox"] = self.loss_by_feat_single(
                logits, codes, gt
            )
        return losses

    def predict(self, bev: Tensor, **history: Tensor) -> List[InstanceData]:
        """Top ``test_cfg['max_per_img']`` (query, class) pairs of the last layer by sigmoid
        score, per sample; ``history`` as :meth:`forward` takes it."""
        all_cls, all_codes = self(bev, **history)
        logits, codes = all_cls[-1], all_codes[-1]
        results = []
        k = min(self.test_cfg["max_per_img"], logits.shape[1] * logits.shape[2])
        for i in range(logits.shape[0]):
            scores, idx = logits[i].sigmoid().flatten().topk(k)
            labels = idx % self.num_classes
            boxes = self.coder.decode(codes[i, idx // self.num_classes])
            results.append(InstanceData(bboxes_3d=boxes, scores_3d=scores, labels_3d=labels))
        return results
