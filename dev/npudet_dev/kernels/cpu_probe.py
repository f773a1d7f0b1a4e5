"""The gather-only probe: the machine's row-load limit for one MSDA call's access pattern.

For every output row (b, q, h) and every sample of it, the probe loads the bilinear corner
rows of ``head_dim`` values that the fused kernel reads (the same out-of-map rule: a corner
outside the map is not read) and sums them, in the kernel's extension with its threads, work
grain and one-row-ahead prefetch. Its plan is made once, outside the timing, and is smaller
than what the kernel reads per sample (4-byte top-left row + 1-byte corner mask against the
kernel's 8-byte location + 4-byte weight): nothing is weighted, planned or written back but
one row per output row. A fused implementation's time over the probe's ("x of the limit")
says how far it is from the rate at which this machine loads its rows.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Tuple

import torch

from npudet.benchmark.cases import MSDACase
from npudet.ops.msda.backends import cpu_library

# What "limit" is, for a benchmark table's header.
DESCRIPTION = "gather-only probe (corner rows loaded, nothing computed)"


class ProbePlan(NamedTuple):
    """Where each sample's corners lie in ``value.reshape(-1, head_dim)``.

    top_left: (bs * nq * heads, levels * points) int32, the row of the sample's top-left
        corner (x0, y0) (it may be outside the map; only flagged corners are read).
    corners: same shape, uint8; bit k set when corner k (top-left, top-right, bottom-left,
        bottom-right) is inside the map.
    row_step: (levels * points,) int64, rows from a corner to the one below it (W * heads).
    x_step: rows from a corner to the one on its right (heads).
    """

    top_left: torch.Tensor
    corners: torch.Tensor
    row_step: torch.Tensor
    x_step: int


def probe_plan(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
) -> ProbePlan:
    """The probe's plan for one call. value (bs, keys, heads, D); sampling_locations
    (bs, nq, heads, L, P, 2)."""
    bs, keys, heads, _ = value.shape
    if bs * keys * heads >= 2**31:
        raise ValueError(
            f"value: the probe indexes rows with int32, got {bs * keys * heads} rows (bs * keys "
            "* heads)"
        )
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
    top_left = ((batch * keys + start + y0 * w + x0) * heads + head).to(torch.int32)
    corners = torch.zeros_like(top_left, dtype=torch.uint8)
    for bit, (dy, dx) in enumerate(((0, 0), (0, 1), (1, 0), (1, 1))):
        cx, cy = x0 + dx, y0 + dy
        ok = inside & (cx >= 0) & (cx < w) & (cy >= 0) & (cy < h)
        corners |= ok.to(torch.uint8) << bit
    top_left = torch.where(corners > 0, top_left, torch.zeros_like(top_left))
    row_step = (shapes[:, 1] * heads).repeat_interleave(points).contiguous()
    lines = bs * nq * heads
    return ProbePlan(
        top_left.reshape(lines, levels * points).contiguous(),
        corners.reshape(lines, levels * points).contiguous(),
        row_step,
        heads,
    )


def gather_probe(rows: torch.Tensor, plan: ProbePlan, grain: int) -> torch.Tensor:
    """(N, D) sums of the corner rows of ``rows`` (num_rows, D) float32 that ``plan`` flags,
    per output row; work in chunks of ``grain`` output rows per thread."""
    return cpu_library.gather_probe(
        rows, plan.top_left, plan.corners, plan.row_step, plan.x_step, grain
    )


def forward_grain(heads: int, levels: int, points: int) -> int:
    """Output rows per parallel chunk in the kernel's query-order forward: its grain of
    max(1, 256 / (heads * levels * points)) queries, of ``heads`` rows each."""
    return max(1, 256 // (heads * levels * points)) * heads


def make_probe(inputs: Tuple[torch.Tensor, ...], case: MSDACase) -> Optional[Callable[[], object]]:
    """The gather-only probe of this case (its corner rows planned once, here), or None
    without the cpu kernel: a ``npudet.benchmark.harness.Probe``."""
    if cpu_library.isa() is None:
        return None
    value, shapes, starts, loc, _ = inputs
    plan = probe_plan(value, shapes, starts, loc)
    rows = value.reshape(-1, value.shape[-1]).float().contiguous()
    grain = forward_grain(case.num_heads, len(case.levels), case.num_points)
    gather_probe(rows, plan, grain)  # warm-up
    return lambda: gather_probe(rows, plan, grain)
