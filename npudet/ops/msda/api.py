"""The one public MSDA entry point."""

from __future__ import annotations

import torch

from . import observe
from .inputs import validate_inputs
from .registry import select_impl


def multi_scale_deformable_attn(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    impl: str = "auto",
) -> torch.Tensor:
    """Multi-scale deformable attention with mmcv's reference semantics.

    Bilinear sampling with zero padding and ``align_corners=False``; locations outside
    [0, 1] contribute zeros.

    Args:
        value: (bs, num_keys, num_heads, head_dim) float.
        spatial_shapes: (num_levels, 2) int, (H, W) per level; sum of H*W = num_keys.
        level_start_index: (num_levels,) int, cumulative H*W.
        sampling_locations: (bs, num_queries, num_heads, num_levels, num_points, 2), (x, y).
        attention_weights: (bs, num_queries, num_heads, num_levels, num_points).
        impl: a name from ``msda_impls()`` (or an experiment variant from
            ``msda_variants()``), used as given; or ``"auto"``: the fastest that fits and
            has been verified on this device (``registry.select_impl``).

    Returns:
        (bs, num_queries, num_heads * head_dim), the dtype of ``value``.
    """
    if not isinstance(impl, str):
        raise TypeError(f"impl: expected a string, got {type(impl).__name__}")
    inputs = validate_inputs(
        value,
        spatial_shapes,
        level_start_index,
        sampling_locations,
        attention_weights,
        check_values=not torch.compiler.is_compiling(),
    )
    chosen = select_impl(impl, inputs)
    if observe._ACTIVE and not torch.compiler.is_compiling():
        call = observe.MSDACall(
            chosen.NAME,
            value,
            spatial_shapes,
            level_start_index,
            sampling_locations,
            attention_weights,
        )
        return observe.run_observed(call, lambda c: chosen.forward(*c.tensors()))
    return chosen.forward(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    )
