"""The one deformable-attention path: offsets -> weight softmax -> sampling locations -> op.

Not a layer itself: the base of ``MSDeformAttn`` (torch only),
``npudet.models.layers.MultiScaleDeformableAttention`` (mmcv's subclass) and the BEV
attentions (docs/architecture.md, "Names that look alike").
"""

from __future__ import annotations

import math
from typing import Optional, Tuple, Union

import torch
from torch import Tensor, nn

from npudet.ops import multi_scale_deformable_attn
from npudet.ops.msda import LevelPairs, shapes_tensor


class DeformableAttention:
    """Base (mixin) of every layer that samples with ``npudet.ops`` MSDA.

    The host module has ``sampling_offsets`` (Linear, query dims -> heads * groups *
    levels * points * 2), ``attention_weights`` (-> heads * groups * levels * points),
    ``value_proj``, ``output_proj``, ``num_heads``, ``num_levels``, ``num_points`` and
    ``impl`` (an MSDA implementation name or ``"auto"``). mmcv's
    ``MultiScaleDeformableAttention`` has all of them with exactly these names; npudet's
    other layers create the two sampling linears with :meth:`build_sampling`.

    ``num_groups`` > 1 splits the weights into independent softmax groups whose
    samplings are folded into the batch (temporal self-attention's queue entries).

    Implementation switching finds layers with ``isinstance(module, DeformableAttention)``
    (see :func:`~npudet.models.layers.deformable_layers`), so no model lists layer classes.
    """

    num_heads: int
    num_levels: int
    num_points: int
    num_groups: int = 1
    impl: str = "auto"
    sampling_offsets: nn.Linear
    attention_weights: nn.Linear
    value_proj: nn.Linear
    output_proj: nn.Linear

    def build_sampling(self, query_dims: int) -> None:
        """Create ``sampling_offsets`` / ``attention_weights`` for ``query_dims``-wide queries."""
        samples = self.num_heads * self.num_groups * self.num_levels * self.num_points
        self.sampling_offsets = nn.Linear(query_dims, samples * 2)
        self.attention_weights = nn.Linear(query_dims, samples)

    def point_scales(self) -> Tensor:
        """Initial distance of each point from the reference, in cells: (num_points,)."""
        return torch.arange(1, self.num_points + 1, dtype=torch.float32)

    def init_weights(self) -> None:
        """mmcv's initialisation: head ``h`` samples along angle ``2 pi h / heads`` (the
        larger of |x|, |y| scaled to 1) at :meth:`point_scales` cells in every group and
        level; uniform attention weights; xavier-uniform projections with zero bias."""
        nn.init.zeros_(self.sampling_offsets.weight)
        device = self.sampling_offsets.weight.device
        heads = self.num_heads
        thetas = torch.arange(heads, dtype=torch.float32, device=device) * (2.0 * math.pi / heads)
        grid = torch.stack([thetas.cos(), thetas.sin()], -1)
        grid = (grid / grid.abs().max(-1, keepdim=True)[0]).view(heads, 1, 1, 2)
        grid = grid.repeat(1, self.num_groups * self.num_levels, self.num_points, 1)
        self.sampling_offsets.bias.data = (grid * self.point_scales().to(grid)[:, None]).view(-1)
        nn.init.zeros_(self.attention_weights.weight)
        nn.init.zeros_(self.attention_weights.bias)
        for proj in (self.value_proj, self.output_proj):
            nn.init.xavier_uniform_(proj.weight)
            nn.init.zeros_(proj.bias)
        self._is_init = True  # mmengine's BaseModule: its initialiser must not redo this

    def project_value(self, value: Tensor, key_padding_mask: Optional[Tensor] = None) -> Tensor:
        """(n, keys, C) -> MSDA value (n, keys, heads, C / heads); masked keys (n, keys) -> 0."""
        value = self.value_proj(value)
        if key_padding_mask is not None:
            value = value.masked_fill(key_padding_mask[..., None], 0.0)
        return value.view(*value.shape[:2], self.num_heads, -1)

    def project_sampling(self, query: Tensor) -> Tuple[Tensor, Tensor]:
        """(bs, nq, Cq) -> (sampling offsets (bs, nq, samples * 2), attention-weight logits
        (bs, nq, samples)), ``samples`` = heads * groups * levels * points: the two linears.
        A subclass may compute both at once
        (``npudet.models.layers.FusedMultiScaleDeformableAttention``)."""
        return self.sampling_offsets(query), self.attention_weights(query)

    def deformable_attend(
        self,
        query: Tensor,
        value: Tensor,
        reference_points: Tensor,
        spatial_shapes: Union[Tensor, LevelPairs],
        level_start_index: Optional[Tensor],
        weight_mask: Optional[Tensor] = None,
    ) -> Tensor:
        """Sample ``value`` around ``reference_points`` with offsets and weights from ``query``.

        Args:
            query: (bs, nq, Cq), the input of ``sampling_offsets`` / ``attention_weights``.
            value: (bs * groups, keys, heads, head_dim), group-major within a sample.
            reference_points: normalised (x, y) in [0, 1], per level (bs * groups, nq,
                levels or 1, 2), per level and point (bs * groups, nq, levels or 1,
                points, 2), or boxes (bs * groups, nq, levels or 1, 4) as (cx, cy, w, h)
                whose offsets are scaled by half the box over ``num_points`` (mmcv).
            spatial_shapes: (levels, 2) long (H, W), or (H, W) pairs (the op's ``levels``:
                what keeps feature-map sizes dynamic under torch.export);
                level_start_index: (levels,) long, None: derived.
            weight_mask: multiplies the softmaxed weights, broadcastable to
                (bs * groups, nq, heads, levels, points).

        Returns:
            (bs * groups, nq, heads * head_dim).
        """
        bs, nq, _ = query.shape
        groups, heads, levels, points = (
            self.num_groups,
            self.num_heads,
            self.num_levels,
            self.num_points,
        )
        offsets, weights = self.project_sampling(query)
        offsets = offsets.view(bs, nq, heads, groups, levels, points, 2)
        weights = weights.view(bs, nq, heads, groups, levels * points)
        weights = weights.softmax(-1).view(bs, nq, heads, groups, levels, points)
        # (bs, nq, heads, groups, ...) -> (bs * groups, nq, heads, ...)
        offsets = offsets.movedim(3, 1).flatten(0, 1)
        weights = weights.movedim(3, 1).flatten(0, 1)
        if reference_points.dim() == 4:
            ref = reference_points[:, :, None, :, None, :]
        elif reference_points.dim() == 5:
            ref = reference_points[:, :, None]
        else:
            raise ValueError(
                f"reference_points: expected 4 or 5 dims, got shape {tuple(reference_points.shape)}"
            )
        if ref.shape[-1] == 2:
            shapes = shapes_tensor(spatial_shapes, query.device)
            normalizer = torch.stack([shapes[..., 1], shapes[..., 0]], -1)
            locations = ref + offsets / normalizer[None, None, None, :, None, :]
        elif ref.shape[-1] == 4:
            locations = ref[..., :2] + offsets / points * ref[..., 2:] * 0.5
        else:
            raise ValueError(
                f"reference_points: last dim must be 2 or 4, got {reference_points.shape[-1]}"
            )
        if weight_mask is not None:
            weights = weights * weight_mask
        out = multi_scale_deformable_attn(
            value, spatial_shapes, level_start_index, locations, weights, impl=self.impl
        )
        if self.training:
            # The fused kernels treat a NaN / Inf location as out of the map (a zero sample);
            # grid_sample returns NaN. Make every implementation's output non-finite then, so
            # a diverged sampling_offsets reaches the loss (and NonFiniteLossHook) instead of
            # training on silently. No host sync; the sum is in float32 so that many finite
            # float16 locations cannot overflow to Inf; x + 0 * finite == x.
            out = out + locations.sum(dtype=torch.float32) * 0
        return out
