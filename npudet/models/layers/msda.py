"""Drop-in replacement for mmcv's ``MultiScaleDeformableAttention`` on npudet's op."""

from __future__ import annotations

from typing import Any, Optional

import torch
from mmcv.ops import MultiScaleDeformableAttention as MMCVMultiScaleDeformableAttention

from npudet.ops import multi_scale_deformable_attn

from .impl_names import check_impl_name


class MultiScaleDeformableAttention(MMCVMultiScaleDeformableAttention):
    """mmcv's MSDA module with the sampling done by ``npudet.ops``.

    Same constructor, parameters, ``init_weights`` and ``forward`` as mmcv 2.1's class
    (it is a subclass, so mmdet's ``isinstance`` checks and released checkpoints keep
    working), plus ``impl``: a name from ``npudet.ops.msda_impls()`` or ``"auto"``.
    It adds no parameter or buffer, so an mmcv instance can be converted in place
    (see :func:`convert_msda`).
    """

    def __init__(self, *args: Any, impl: str = "auto", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.impl = check_impl_name(impl, "impl")

    def extra_repr(self) -> str:
        return (
            f"embed_dims={self.embed_dims}, num_heads={self.num_heads}, "
            f"num_levels={self.num_levels}, num_points={self.num_points}, impl={self.impl!r}"
        )

    def forward(  # type: ignore[override]
        self,
        query: torch.Tensor,
        key: Optional[torch.Tensor] = None,
        value: Optional[torch.Tensor] = None,
        identity: Optional[torch.Tensor] = None,
        query_pos: Optional[torch.Tensor] = None,
        key_padding_mask: Optional[torch.Tensor] = None,
        reference_points: Optional[torch.Tensor] = None,
        spatial_shapes: Optional[torch.Tensor] = None,
        level_start_index: Optional[torch.Tensor] = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """mmcv's forward: query (nq, bs, C) or (bs, nq, C) if ``batch_first``.

        ``reference_points``: (bs, nq, levels, 2) points or (bs, nq, levels, 4) boxes,
        normalised to [0, 1]. Returns the shape of ``query``.
        """
        if value is None:
            value = query
        if identity is None:
            identity = query
        if query_pos is not None:
            query = query + query_pos
        if not self.batch_first:
            query = query.permute(1, 0, 2)
            value = value.permute(1, 0, 2)
        if reference_points is None or spatial_shapes is None:
            raise ValueError("reference_points and spatial_shapes are required")
        if level_start_index is None:
            areas = spatial_shapes[:, 0] * spatial_shapes[:, 1]
            level_start_index = torch.cat((areas.new_zeros(1), areas.cumsum(0)[:-1]))
        bs, num_query, _ = query.shape
        _, num_value, _ = value.shape

        value = self.value_proj(value)
        if key_padding_mask is not None:
            value = value.masked_fill(key_padding_mask[..., None], 0.0)
        value = value.view(bs, num_value, self.num_heads, -1)
        heads, levels, points = self.num_heads, self.num_levels, self.num_points
        offsets = self.sampling_offsets(query).view(bs, num_query, heads, levels, points, 2)
        weights = self.attention_weights(query).view(bs, num_query, heads, levels * points)
        weights = weights.softmax(-1).view(bs, num_query, heads, levels, points)
        if reference_points.shape[-1] == 2:
            normalizer = torch.stack([spatial_shapes[..., 1], spatial_shapes[..., 0]], -1)
            locations = (
                reference_points[:, :, None, :, None, :]
                + offsets / normalizer[None, None, None, :, None, :]
            )
        elif reference_points.shape[-1] == 4:
            locations = (
                reference_points[:, :, None, :, None, :2]
                + offsets / points * reference_points[:, :, None, :, None, 2:] * 0.5
            )
        else:
            raise ValueError(
                f"reference_points: last dim must be 2 or 4, got {reference_points.shape[-1]}"
            )
        output = multi_scale_deformable_attn(
            value, spatial_shapes, level_start_index, locations, weights, impl=self.impl
        )
        output = self.output_proj(output)
        if not self.batch_first:
            output = output.permute(1, 0, 2)
        return self.dropout(output) + identity


def convert_msda(module: torch.nn.Module, impl: str) -> int:
    """Make every mmcv MSDA inside ``module`` an npudet one using ``impl``, in place.

    Parameters, buffers, hooks and the random-number stream are untouched (only the
    class changes), so a model built by stock mmdet code and then converted is
    bit-identical to it before the first forward. Returns how many were converted.
    """
    impl = check_impl_name(impl, "impl")
    count = 0
    for sub in module.modules():
        if isinstance(sub, MMCVMultiScaleDeformableAttention):
            if not isinstance(sub, MultiScaleDeformableAttention):
                sub.__class__ = MultiScaleDeformableAttention
            sub.impl = impl
            count += 1
    return count
