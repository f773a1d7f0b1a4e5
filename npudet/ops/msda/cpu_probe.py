"""The gather-only probe: the machine's row-load limit for one MSDA call's access pattern.

For every output row (b, q, h) and every sample of it, the four bilinear corner rows of
``head_dim`` values that the fused kernel reads (the same out-of-map rule: a corner outside
the map is not read) are listed once, outside the timing; the probe then only sums those
rows per output row in the kernel's extension (same threads, work grain and one-row-ahead
prefetch as its forward). Nothing is weighted, planned or written back but one row per
output row, so a fused implementation's time over the probe's ("x of the limit") says how
far it is from the rate at which this machine can load its rows.
"""

from __future__ import annotations

import torch

from . import cpu_impl


def corner_rows(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
) -> torch.Tensor:
    """(bs * num_queries * heads, levels * points * 4) int64: for each output row, the rows
    of ``value.reshape(-1, head_dim)`` its samples' corners read, -1 for a corner outside
    the map. value (bs, keys, heads, D); sampling_locations (bs, nq, heads, L, P, 2)."""
    bs, keys, heads, _ = value.shape
    _, nq, _, levels, points, _ = sampling_locations.shape
    shapes = spatial_shapes.to(torch.long)
    h = shapes[:, 0].view(1, 1, 1, levels, 1)
    w = shapes[:, 1].view(1, 1, 1, levels, 1)
    start = level_start_index.to(torch.long).view(1, 1, 1, levels, 1)
    loc = sampling_locations.to(torch.float32)
    x = loc[..., 0] * w - 0.5
    y = loc[..., 1] * h - 0.5
    inside = (x >= -1) & (y >= -1) & (x < w) & (y < h)  # as the kernel plans a sample
    x0 = torch.where(inside, x, torch.zeros_like(x)).floor().long()
    y0 = torch.where(inside, y, torch.zeros_like(y)).floor().long()
    batch = torch.arange(bs).view(bs, 1, 1, 1, 1)
    head = torch.arange(heads).view(1, 1, heads, 1, 1)
    corners = []
    for dy, dx in ((0, 0), (0, 1), (1, 0), (1, 1)):
        cx, cy = x0 + dx, y0 + dy
        ok = inside & (cx >= 0) & (cx < w) & (cy >= 0) & (cy < h)
        key = start + cy * w + cx
        row = (batch * keys + key) * heads + head
        corners.append(torch.where(ok, row, torch.full_like(row, -1)))
    # (bs, nq, heads, L, P, 4) -> one line of L*P*4 rows per output row (b, q, h).
    return torch.stack(corners, -1).reshape(bs * nq * heads, levels * points * 4).contiguous()


def gather_probe(rows: torch.Tensor, index: torch.Tensor, grain: int) -> torch.Tensor:
    """(N, D) sums of ``rows`` (num_rows, D) float32 at ``index`` (N, m), -1 skipped; work in
    chunks of ``grain`` output rows per thread."""
    return cpu_impl.ext().gather_probe(rows, index, grain)


def forward_grain(heads: int, levels: int, points: int) -> int:
    """Output rows per parallel chunk in the kernel's query-order forward: its grain of
    max(1, 256 / (heads * levels * points)) queries, of ``heads`` rows each."""
    return max(1, 256 // (heads * levels * points)) * heads
