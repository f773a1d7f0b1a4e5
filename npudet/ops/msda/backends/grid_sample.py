"""``grid_sample``: the baseline, the same computation as mmcv's
``multi_scale_deformable_attn_pytorch`` (one ``F.grid_sample`` per level)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import is_fake

from npudet.utils.torch_compat import is_exporting

from ..levels import LevelPairs
from ..registry import MSDAImpl, register


def _traced_by_export(spatial_shapes: torch.Tensor) -> bool:
    """Whether ``spatial_shapes`` is a tensor ``torch.export`` is tracing (whose values are
    data to it). A real tensor during an export (``auto``'s verification) reads as usual."""
    return is_exporting() and is_fake(spatial_shapes)


def msda_grid_sample(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    level_shapes: Optional[LevelPairs] = None,
) -> torch.Tensor:
    """Reference MSDA. value (bs, keys, heads, D) -> (bs, num_queries, heads * D).

    Splits and reshapes by the level shapes: ``level_shapes`` (H, W) pairs when the caller
    has them (symbolic under ``torch.export``), else ``spatial_shapes`` read on the host (as
    mmcv does), so ``torch.compile`` breaks the graph there and ``torch.export`` refuses it.
    Any floating dtypes (see ``inputs``): half precision is computed in float32, the output
    has value's dtype.
    """
    bs, _, num_heads, head_dim = value.shape
    _, num_queries, _, num_levels, num_points, _ = sampling_locations.shape
    if level_shapes is not None:
        shapes = list(level_shapes)
    elif _traced_by_export(spatial_shapes):
        raise ValueError(
            "spatial_shapes: under torch.export, grid_sample needs the level shapes as (H, W) "
            "pairs from the feature maps' .shape (a tensor's values are data to the exporter); "
            "pass the pairs, or use impl='cpu' or 'gather', which take the tensor"
        )
    else:
        shapes = [(int(h), int(w)) for h, w in spatial_shapes.tolist()]
    # grid_sample needs one dtype for value and grid; half precision would put the grid
    # (pixel coordinates) and the level/point sums in 8-11 bits, so compute in float32.
    compute = torch.promote_types(value.dtype, torch.float32)
    out_dtype = value.dtype
    value = value.to(compute)
    attention_weights = attention_weights.to(compute)
    value_list = value.split([h * w for h, w in shapes], dim=1)
    sampling_grids = 2 * sampling_locations.to(compute) - 1
    sampled = []
    for level, (h, w) in enumerate(shapes):
        # (bs, h*w, heads, D) -> (bs*heads, D, h, w)
        value_l = (
            value_list[level].flatten(2).transpose(1, 2).reshape(bs * num_heads, head_dim, h, w)
        )
        # (bs, q, heads, points, 2) -> (bs*heads, q, points, 2)
        grid_l = sampling_grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        sampled.append(
            F.grid_sample(
                value_l, grid_l, mode="bilinear", padding_mode="zeros", align_corners=False
            )
        )
    # (bs, q, heads, levels, points) -> (bs*heads, 1, q, levels*points)
    weights = attention_weights.transpose(1, 2).reshape(
        bs * num_heads, 1, num_queries, num_levels * num_points
    )
    output = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1)
    output = output.view(bs, num_heads * head_dim, num_queries).transpose(1, 2).contiguous()
    return output.to(out_dtype)


class GridSampleImpl(MSDAImpl):
    """Runs wherever ``F.grid_sample`` does; materialises (bs*heads, D, q, levels*points)."""

    NAME = "grid_sample"
    DEVICES = ("cpu", "cuda", "npu", "xpu", "mps", "meta")
    DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    # grid_sample's CPU backward writes each image's gradient from one thread (tested
    # bitwise); on CUDA it adds atomically and torch itself refuses it in deterministic mode.
    DETERMINISTIC = ("cpu",)
    TAKES_LEVEL_SHAPES = True

    def forward(
        self, *tensors: torch.Tensor, level_shapes: Optional[LevelPairs] = None
    ) -> torch.Tensor:
        return msda_grid_sample(*tensors, level_shapes=level_shapes)


register(GridSampleImpl())
