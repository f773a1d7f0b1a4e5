"""mmcv's ``MultiScaleDeformableAttention`` module with torch alone, on npudet's op."""

from __future__ import annotations

from typing import Any, Optional, Union

from torch import Tensor, nn

from npudet.ops.msda import LevelPairs, check_impl_name

from .deformable_attention import DeformableAttention


class MSDeformAttn(DeformableAttention, nn.Module):
    """Multi-scale deformable attention as mmcv 2.1 computes it, needing no OpenMMLab.

    Same parameters (names and shapes, so mmcv / mmdet checkpoints load), initialisation
    and ``forward`` as ``mmcv.ops.MultiScaleDeformableAttention``; the sampling is
    :class:`DeformableAttention`'s, with ``impl`` a name from ``npudet.ops.msda_impls()`` or
    ``"auto"``. npudet's mmcv subclass
    (:class:`npudet.models.layers.MultiScaleDeformableAttention`) shares this ``forward``;
    this class serves where mmcv is absent (a GPU machine without OpenMMLab, plain-torch
    models).
    """

    def __init__(
        self,
        embed_dims: int = 256,
        num_heads: int = 8,
        num_levels: int = 4,
        num_points: int = 4,
        dropout: float = 0.1,
        batch_first: bool = False,
        value_proj_ratio: float = 1.0,
        impl: str = "auto",
    ) -> None:
        super().__init__()
        if embed_dims % num_heads != 0:
            raise ValueError(
                f"embed_dims: expected a multiple of num_heads ({num_heads}), got {embed_dims}"
            )
        self.embed_dims, self.num_heads = embed_dims, num_heads
        self.num_levels, self.num_points = num_levels, num_points
        self.batch_first = batch_first
        self.impl = check_impl_name(impl, "impl")
        self.dropout = nn.Dropout(dropout)
        self.build_sampling(embed_dims)
        value_dims = int(embed_dims * value_proj_ratio)
        self.value_proj = nn.Linear(embed_dims, value_dims)
        self.output_proj = nn.Linear(value_dims, embed_dims)
        self.init_weights()

    def extra_repr(self) -> str:
        return (
            f"embed_dims={self.embed_dims}, num_heads={self.num_heads}, "
            f"num_levels={self.num_levels}, num_points={self.num_points}, impl={self.impl!r}"
        )

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        identity: Optional[Tensor] = None,
        query_pos: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        reference_points: Optional[Tensor] = None,
        spatial_shapes: Optional[Union[Tensor, LevelPairs]] = None,
        level_start_index: Optional[Tensor] = None,
        **kwargs: Any,
    ) -> Tensor:
        """mmcv's forward: ``identity + dropout(output_proj(attention))``.

        query (nq, bs, C), or (bs, nq, C) if ``batch_first``; value (keys, bs, C) likewise,
        default ``query``; identity default ``query`` (before ``query_pos`` is added);
        key_padding_mask (bs, keys), True where a key is padding; reference_points
        (bs, nq, levels, 2) points or (bs, nq, levels, 4) boxes, normalised to [0, 1];
        spatial_shapes (levels, 2) long (H, W), or (H, W) pairs (dynamic feature-map sizes under
        torch.export); level_start_index (levels,) long, derived from ``spatial_shapes`` when
        None. ``key`` and ``kwargs`` are ignored, as mmcv does.
        Returns the shape of ``query``.
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
        return self.residual(output, identity)

    def residual(self, output: Tensor, identity: Tensor) -> Tensor:
        """mmcv's ``identity + dropout(output)``, both the shape of ``query``; a subclass may
        fuse the two (``npudet.models.layers.FusedMultiScaleDeformableAttention``)."""
        return self.dropout(output) + identity
