"""``gather``: MSDA in plain PyTorch without ``grid_sample``.

Every bilinear corner becomes one (row index, weight) pair, with the attention weight
and the validity mask folded into the weight; ``F.embedding_bag(mode='sum')`` then
gathers and accumulates the ``levels * points * 4`` rows of each (batch, query, head) in
one call, so the sampled tensor is never materialised. Pure tensor arithmetic: it runs
on any device with ``embedding_bag`` and traces under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

from .registry import MSDAImpl, register


def bilinear_corners(
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    num_keys: int,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rows and weights of the 4 bilinear corners of every sample.

    Returns:
        rows: (bs, q, heads, levels * points * 4) row of ``value.reshape(-1, D)``, int32
            when every row fits, else int64.
        weights: same shape, attention * bilinear weight, 0 for corners outside the map.
    """
    bs, num_queries, num_heads, num_levels, num_points, _ = sampling_locations.shape
    # Coordinate arithmetic in at least float32: half precision cannot address pixels.
    coord_dtype = torch.promote_types(sampling_locations.dtype, torch.float32)
    loc = sampling_locations.to(coord_dtype)
    shapes = spatial_shapes.to(coord_dtype)
    height = shapes[:, 0].view(num_levels, 1)
    width = shapes[:, 1].view(num_levels, 1)
    x = loc[..., 0] * width - 0.5  # (bs, q, heads, levels, points)
    y = loc[..., 1] * height - 0.5
    # NaN/inf coordinates become an off-map point, so no NaN reaches any gradient.
    off_map = torch.full((), -2.0, dtype=coord_dtype, device=loc.device)
    x = torch.where(torch.isfinite(x), x, off_map)
    y = torch.where(torch.isfinite(y), y, off_map)
    x0 = torch.floor(x)
    y0 = torch.floor(y)
    fx = x - x0
    fy = y - y0
    # Corner order (y0,x0), (y0,x1), (y1,x0), (y1,x1) along a new last axis.
    cx = torch.stack((x0, x0 + 1, x0, x0 + 1), dim=-1)
    cy = torch.stack((y0, y0, y0 + 1, y0 + 1), dim=-1)
    wx = torch.stack((1 - fx, fx, 1 - fx, fx), dim=-1)
    wy = torch.stack((1 - fy, 1 - fy, fy, fy), dim=-1)
    w_l = width.unsqueeze(-1)
    h_l = height.unsqueeze(-1)
    valid = (cx >= 0) & (cx <= w_l - 1) & (cy >= 0) & (cy <= h_l - 1)
    zero = torch.zeros((), dtype=coord_dtype, device=loc.device)
    # int32 rows where they fit: embedding_bag's backward sorts them, ~30% faster.
    index_dtype = torch.int32 if bs * num_keys * num_heads < 2**31 else torch.int64
    key = torch.where(valid, cy * w_l + cx, zero).to(index_dtype)
    key = key + level_start_index.view(num_levels, 1, 1).to(index_dtype)
    batch = torch.arange(bs, device=loc.device, dtype=index_dtype).view(bs, 1, 1, 1, 1, 1)
    head = torch.arange(num_heads, device=loc.device, dtype=index_dtype)
    head = head.view(1, 1, num_heads, 1, 1, 1)
    rows = (batch * num_keys + key) * num_heads + head
    weight = attention_weights.to(coord_dtype).unsqueeze(-1) * wx * wy
    weight = torch.where(valid, weight, zero)
    flat = (bs, num_queries, num_heads, num_levels * num_points * 4)
    return rows.reshape(flat), weight.reshape(flat)


def msda_gather(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> torch.Tensor:
    """value (bs, keys, heads, D) -> (bs, num_queries, heads * D) by weighted row bags.

    Any floating dtypes (see ``inputs``); half precision is computed in float32 and the
    output has value's dtype.
    """
    bs, num_keys, num_heads, head_dim = value.shape
    num_queries = sampling_locations.shape[1]
    rows, weights = bilinear_corners(
        spatial_shapes, level_start_index, sampling_locations, attention_weights, num_keys
    )
    bag = rows.shape[-1]
    # Half precision gathers from a float32 copy of value: the bag sums and, in backward,
    # the value-gradient sums over every sample that hit a row are float32.
    compute = torch.promote_types(value.dtype, torch.float32)
    out = F.embedding_bag(
        rows.reshape(-1, bag),
        value.reshape(-1, head_dim).to(compute),
        per_sample_weights=weights.reshape(-1, bag).to(compute),
        mode="sum",
    )
    return out.view(bs, num_queries, num_heads * head_dim).to(value.dtype)


class GatherImpl(MSDAImpl):
    """Portable fused-gather path for devices without a native MSDA kernel."""

    NAME = "gather"
    DEVICES = ("cpu", "cuda", "npu", "xpu", "meta")
    DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    # embedding_bag(mode='sum')'s backward: sequential per row on CPU (tested bitwise), and
    # sort-and-segment on CUDA (absent from torch's nondeterministic list; not run here).
    DETERMINISTIC = ("cpu", "cuda")

    def forward(
        self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    ):
        return msda_gather(
            value, spatial_shapes, level_start_index, sampling_locations, attention_weights
        )


register(GatherImpl())
