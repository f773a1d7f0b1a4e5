"""Drop-in replacement for mmcv's ``MultiScaleDeformableAttention`` on npudet's op."""

from __future__ import annotations

from typing import Any, Optional

import torch
from mmcv.ops import MultiScaleDeformableAttention as MMCVMultiScaleDeformableAttention

from npudet.ops.msda import check_impl_name

from .deformable_attention import DeformableAttention


class MultiScaleDeformableAttention(DeformableAttention, MMCVMultiScaleDeformableAttention):
    """mmcv's MSDA module with the sampling done by :class:`DeformableAttention`.

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
        if reference_points.dim() != 4:
            raise ValueError(
                f"reference_points: expected (bs, nq, levels, 2 or 4), "
                f"got shape {tuple(reference_points.shape)}"
            )
        output = self.deformable_attend(
            query,
            self.project_value(value, key_padding_mask),
            reference_points,
            spatial_shapes,
            level_start_index,
        )
        output = self.output_proj(output)
        if not self.batch_first:
            output = output.permute(1, 0, 2)
        return self.dropout(output) + identity
