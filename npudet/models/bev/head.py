"""DETR-style 3D detection head decoding object queries against the BEV map."""

from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F
from mmdet.models.layers.transformer.utils import coordinate_to_encoding
from mmdet.registry import MODELS
from mmengine.model import BaseModule
from mmengine.structures import InstanceData
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

from npudet.ops import multi_scale_deformable_attn

from ..layers import check_impl_name
from .box_coder import CODE_SIZE, BEVBoxCoder
from .temporal_self_attention import bev_reference_points


def inverse_sigmoid(x: Tensor, eps: float = 1e-5) -> Tensor:
    x = x.clamp(0.0, 1.0)
    return torch.log(x.clamp(min=eps) / (1.0 - x).clamp(min=eps))


def sigmoid_focal_loss(
    logits: Tensor, targets: Tensor, alpha: float = 0.25, gamma: float = 2.0
) -> Tensor:
    """Elementwise sigmoid focal loss; logits and 0/1 targets of the same shape."""
    prob = logits.sigmoid()
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = prob * targets + (1 - prob) * (1 - targets)
    a_t = alpha * targets + (1 - alpha) * (1 - targets)
    return a_t * (1 - p_t).pow(gamma) * ce


class BEVCrossAttention(nn.Module):
    """MSDA of object queries (B, nq, C) over the BEV map (B, Q, C), one level."""

    def __init__(
        self, embed_dims: int, num_heads: int, num_points: int, dropout: float, impl: str = "auto"
    ) -> None:
        super().__init__()
        self.num_heads, self.num_points = num_heads, num_points
        self.impl = check_impl_name(impl, "impl")
        self.sampling_offsets = nn.Linear(embed_dims, num_heads * num_points * 2)
        self.attention_weights = nn.Linear(embed_dims, num_heads * num_points)
        self.value_proj = nn.Linear(embed_dims, embed_dims)
        self.output_proj = nn.Linear(embed_dims, embed_dims)
        self.dropout = nn.Dropout(dropout)
        nn.init.zeros_(self.sampling_offsets.weight)
        nn.init.uniform_(self.sampling_offsets.bias, -1.0, 1.0)
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)

    def forward(
        self, query: Tensor, query_pos: Tensor, bev: Tensor, ref: Tensor, bev_hw: Tuple[int, int]
    ) -> Tensor:
        """ref (B, nq, 2) normalised BEV (u, v). Returns (B, nq, C)."""
        b, nq, c = query.shape
        h, p = self.num_heads, self.num_points
        q = query + query_pos
        value = self.value_proj(bev).view(b, bev.shape[1], h, c // h)
        offsets = self.sampling_offsets(q).view(b, nq, h, 1, p, 2)
        normalizer = q.new_tensor([bev_hw[1], bev_hw[0]])
        locations = ref[:, :, None, None, None, :] + offsets / normalizer
        weights = self.attention_weights(q).view(b, nq, h, p).softmax(-1).view(b, nq, h, 1, p)
        shapes = torch.tensor([bev_hw], dtype=torch.long, device=q.device)
        out = multi_scale_deformable_attn(
            value, shapes, shapes.new_zeros(1), locations, weights, impl=self.impl
        )
        return self.dropout(self.output_proj(out)) + query


class DecoderLayer(nn.Module):
    """Self-attention -> norm -> BEV cross-attention -> norm -> FFN -> norm."""

    def __init__(
        self, embed_dims: int, num_heads: int, num_points: int, ffn_dims: int, dropout: float
    ) -> None:
        super().__init__()
        self.self_attn = nn.MultiheadAttention(embed_dims, num_heads, dropout, batch_first=True)
        self.cross_attn = BEVCrossAttention(embed_dims, num_heads, num_points, dropout)
        self.ffn = nn.Sequential(
            nn.Linear(embed_dims, ffn_dims),
            nn.ReLU(inplace=True),
            nn.Dropout(dropout),
            nn.Linear(ffn_dims, embed_dims),
            nn.Dropout(dropout),
        )
        self.norms = nn.ModuleList(nn.LayerNorm(embed_dims) for _ in range(3))

    def forward(
        self, query: Tensor, query_pos: Tensor, bev: Tensor, ref: Tensor, bev_hw: Tuple[int, int]
    ) -> Tensor:
        qk = query + query_pos
        query = self.norms[0](query + self.self_attn(qk, qk, query, need_weights=False)[0])
        query = self.norms[1](self.cross_attn(query, query_pos, bev, ref, bev_hw))
        return self.norms[2](query + self.ffn(query))


def regression_mlp(embed_dims: int) -> nn.Module:
    """Linear -> ReLU -> Linear to the 10-d code deltas."""
    return nn.Sequential(
        nn.Linear(embed_dims, embed_dims), nn.ReLU(inplace=True), nn.Linear(embed_dims, CODE_SIZE)
    )


def refine_codes(ref: Tensor, delta: Tensor) -> Tensor:
    """Reference (u, v) (..., 2) and raw deltas (..., 10) -> codes (..., 10).

    u, v move in inverse-sigmoid space; the normalised height is a sigmoid.
    """
    uv = (inverse_sigmoid(ref) + delta[..., :2]).sigmoid()
    return torch.cat([uv, delta[..., 2:3].sigmoid(), delta[..., 3:]], -1)


@MODELS.register_module()
class BEVDetrHead(BaseModule):
    """Object queries decoded against the BEV map with iterative (u, v) refinement.

    Per decoder layer: class logits (B, nq, K) and codes (B, nq, 10) in the
    :class:`BEVBoxCoder` space. Losses: sigmoid focal + code-weighted L1 after
    Hungarian matching, for every layer (``d{i}.`` prefix for all but the last).

    ``two_stage=False``: learned query positions and reference points (BEVFormer).
    ``two_stage=True``: every BEV cell proposes a box (``enc.`` losses, matched like a
    decoder layer); the ``num_queries`` best proposals seed the decoder, whose query
    content is the proposal's feature and whose positional query is an MLP of the
    sine embedding of its current reference point (Deformable DETR two-stage / DINO).
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
        match_code_weights: Optional[Sequence[float]] = None,
        loss_cls_weight: float = 2.0,
        loss_bbox_weight: float = 0.25,
        cls_cost_weight: float = 2.0,
        reg_cost_weight: float = 0.25,
        max_per_img: int = 100,
        two_stage: bool = False,
        init_cfg=None,
    ) -> None:
        super().__init__(init_cfg)
        self.num_classes, self.num_queries = num_classes, num_queries
        self.bev_hw = (bev_h, bev_w)
        self.coder = BEVBoxCoder(pc_range)
        self.register_buffer("code_weights", torch.tensor(code_weights), persistent=False)
        match_w = code_weights[:8] if match_code_weights is None else match_code_weights
        if len(match_w) != 8:
            raise ValueError(
                f"match_code_weights: expected 8 weights (u, v, z, log w, log l, log h, sin, cos), "
                f"got {len(match_w)}"
            )
        self.register_buffer("match_code_weights", torch.tensor(match_w), persistent=False)
        self.loss_cls_weight, self.loss_bbox_weight = loss_cls_weight, loss_bbox_weight
        self.cls_cost_weight, self.reg_cost_weight = cls_cost_weight, reg_cost_weight
        self.max_per_img = max_per_img
        self.two_stage = two_stage
        if two_stage:
            self.memory_proj = nn.Sequential(
                nn.Linear(embed_dims, embed_dims), nn.LayerNorm(embed_dims)
            )
            self.enc_cls = nn.Linear(embed_dims, num_classes)
            self.enc_reg = regression_mlp(embed_dims)
            self.pos_mlp = nn.Sequential(
                nn.Linear(embed_dims, embed_dims),
                nn.ReLU(inplace=True),
                nn.Linear(embed_dims, embed_dims),
            )
        else:
            self.query_embedding = nn.Embedding(num_queries, embed_dims * 2)
            self.ref_points = nn.Linear(embed_dims, 2)
        self.layers = nn.ModuleList(
            DecoderLayer(embed_dims, num_heads, num_points, ffn_dims, dropout)
            for _ in range(num_layers)
        )
        self.cls_branches = nn.ModuleList(
            nn.Linear(embed_dims, num_classes) for _ in range(num_layers)
        )
        self.reg_branches = nn.ModuleList(regression_mlp(embed_dims) for _ in range(num_layers))
        prior = -torch.log(torch.tensor((1 - 0.01) / 0.01)).item()
        for cls in [*self.cls_branches, *([self.enc_cls] if two_stage else [])]:
            nn.init.constant_(cls.bias, prior)

    def positional_query(self, ref: Tensor) -> Tensor:
        """Two-stage positional query of reference points (B, nq, 2) -> (B, nq, C)."""
        c = self.pos_mlp[0].in_features
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

    def forward(self, bev: Tensor) -> Tuple[List[Tensor], List[Tensor]]:
        """bev (B, Q, C) -> per layer: logits (B, nq, K), codes (B, nq, 10).

        With ``two_stage`` the lists start with the proposals (B, Q, K), (B, Q, 10).
        """
        query, pos, ref, enc = self.initial_queries(bev)
        all_cls, all_codes = enc[:1], enc[1:]
        for i, (layer, cls_b, reg_b) in enumerate(
            zip(self.layers, self.cls_branches, self.reg_branches)
        ):
            if self.two_stage and i > 0:
                pos = self.positional_query(ref)
            query = layer(query, pos, bev, ref, self.bev_hw)
            codes = refine_codes(ref, reg_b(query))
            all_cls.append(cls_b(query))
            all_codes.append(codes)
            ref = codes[..., :2].detach()
        return all_cls, all_codes

    @torch.no_grad()
    def match(self, logits: Tensor, codes: Tensor, labels: Tensor, targets: Tensor) -> Tuple:
        """Hungarian matching of one sample: logits (nq, K), codes (nq, 10), targets (N, 10).

        Returns (query indices, target indices) as long tensors.
        """
        if labels.numel() == 0:
            empty = labels.new_zeros(0, dtype=torch.long)
            return empty, empty
        prob = logits.sigmoid()[:, labels]
        alpha, gamma = 0.25, 2.0
        neg = (1 - alpha) * prob.pow(gamma) * -(1 - prob + 1e-8).log()
        pos = alpha * (1 - prob).pow(gamma) * -(prob + 1e-8).log()
        cost = self.cls_cost_weight * (pos - neg)
        w = self.match_code_weights
        cost = cost + self.reg_cost_weight * torch.cdist(codes[:, :8] * w, targets[:, :8] * w, p=1)
        rows, cols = linear_sum_assignment(cost.float().cpu().numpy())
        dev = logits.device
        return torch.as_tensor(rows, device=dev), torch.as_tensor(cols, device=dev)

    def loss_single(
        self, logits: Tensor, codes: Tensor, gt: List[InstanceData]
    ) -> Tuple[Tensor, Tensor]:
        """One decoder layer: logits (B, nq, K), codes (B, nq, 10) -> (loss_cls, loss_bbox)."""
        cls_target = torch.zeros_like(logits)
        pred_sel, tgt_sel = [], []
        for i, inst in enumerate(gt):
            labels = inst.labels_3d.to(logits.device).long()
            targets = self.coder.encode(inst.bboxes_3d.to(codes))
            rows, cols = self.match(logits[i], codes[i], labels, targets)
            cls_target[i, rows, labels[cols]] = 1.0
            pred_sel.append(codes[i, rows])
            tgt_sel.append(targets[cols])
        num_pos = max(float(sum(len(t) for t in tgt_sel)), 1.0)
        loss_cls = sigmoid_focal_loss(logits, cls_target).sum() / num_pos
        pred, tgt = torch.cat(pred_sel), torch.cat(tgt_sel)
        l1 = ((pred - tgt).abs() * self.code_weights).nan_to_num()
        loss_bbox = l1.sum() / num_pos
        return loss_cls * self.loss_cls_weight, loss_bbox * self.loss_bbox_weight

    def loss(self, bev: Tensor, gt: List[InstanceData]) -> Dict[str, Tensor]:
        """Losses of every decoder layer; ``gt``: InstanceData with bboxes_3d (N, 9), labels_3d."""
        all_cls, all_codes = self(bev)
        losses: Dict[str, Tensor] = {}
        prefixes = ["enc."] * self.two_stage + [f"d{i}." for i in range(len(self.layers) - 1)]
        for prefix, logits, codes in zip(prefixes + [""], all_cls, all_codes):
            losses[f"{prefix}loss_cls"], losses[f"{prefix}loss_bbox"] = self.loss_single(
                logits, codes, gt
            )
        return losses

    def predict(self, bev: Tensor) -> List[InstanceData]:
        """Top-k (query, class) pairs by sigmoid score of the last layer, per sample."""
        all_cls, all_codes = self(bev)
        logits, codes = all_cls[-1], all_codes[-1]
        results = []
        k = min(self.max_per_img, logits.shape[1] * logits.shape[2])
        for i in range(logits.shape[0]):
            scores, idx = logits[i].sigmoid().flatten().topk(k)
            labels = idx % self.num_classes
            boxes = self.coder.decode(codes[i, idx // self.num_classes])
            results.append(InstanceData(bboxes_3d=boxes, scores_3d=scores, labels_3d=labels))
        return results
