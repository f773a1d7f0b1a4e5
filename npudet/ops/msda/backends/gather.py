"""``gather``: MSDA in plain PyTorch without ``grid_sample``.

Every bilinear corner becomes one (row index, weight) pair, with the attention weight
and the validity mask folded into the weight; ``F.embedding_bag(mode='sum')`` then
gathers and accumulates the ``levels * points * 4`` rows of each (batch, query, head) in
one call, so the sampled tensor is never materialised. Pure tensor arithmetic: it runs
on any device with ``embedding_bag`` and traces under ``torch.compile(fullgraph=True)``.
"""

from __future__ import annotations

from typing import Callable, List, NamedTuple, Optional, Tuple

import torch
import torch.nn.functional as F

from npudet.utils.torch_compat import register_missing_meta_kernels

from ..inputs import MSDAInputs
from ..registry import Kernel, MSDAImpl, register

# embedding_bag's backward on fake / meta tensors (torch 2.1 lacks its Meta kernel).
register_missing_meta_kernels()


class CornerConstants(NamedTuple):
    """What ``bilinear_corners`` needs besides the call's tensors, fixed per call signature."""

    offsets: torch.Tensor  # (4, 2) int64 (dx, dy): (y0,x0), (y0,x1), (y1,x0), (y1,x1)
    is_high: torch.Tensor  # (4, 2) bool, offsets == 1
    batch_head_rows: torch.Tensor  # (bs, 1, heads, 1, 1, 1) row of key 0 of (batch, head)


def corner_constants(
    batch: int, num_keys: int, num_heads: int, device: torch.device
) -> CornerConstants:
    """Built with ``arange`` (no host-to-device copy, so also inside a graph capture)."""
    index_dtype = _index_dtype(batch, num_keys, num_heads)
    i = torch.arange(4, device=device)
    offsets = torch.stack((i % 2, i // 2), -1)
    b = torch.arange(batch, dtype=index_dtype, device=device).view(batch, 1, 1, 1, 1, 1)
    h = torch.arange(num_heads, dtype=index_dtype, device=device).view(1, 1, num_heads, 1, 1, 1)
    return CornerConstants(offsets, offsets.bool(), b * (num_keys * num_heads) + h)


# Whether ATen's CPU grid_sample fuses its unnormalisation's multiply-add (its AVX2 and
# AVX512 kernels do, the DEFAULT one does not); read once, a constant under torch.compile.
_CPU_FUSED_UNNORMALIZE = torch.backends.cpu.get_cpu_capability() != "DEFAULT"


def pixel_coordinates(locations: torch.Tensor, extent: torch.Tensor) -> torch.Tensor:
    """Pixel coordinates (..., 2) of normalised locations (..., 2) on maps of ``extent``
    (W, H), computed as ``grid_sample(align_corners=False)`` computes them after mmcv's
    ``2 * loc - 1``: ``((2 loc - 1) + 1) * extent / 2 - 0.5``, the last multiply-add
    rounded once on CPU (where ATen fuses it) and CUDA.

    ``loc * extent - 0.5`` is the same number in exact arithmetic, but mmcv's initial
    offsets put most samples exactly on pixel centres, where the location gradient is
    one-sided and the last bit picks the side: computed differently, ~1% of those
    gradients took the other side and training parted from grid_sample's.
    """
    shifted = (2 * locations - 1) + 1
    half = extent / 2
    fused = locations.device.type == "cuda" or (
        locations.device.type == "cpu" and _CPU_FUSED_UNNORMALIZE
    )
    if fused and locations.dtype == torch.float32:
        # float64 holds the float32 product exactly: one rounding, as a fused multiply-add
        return (shifted.double() * half.double() - 0.5).float()
    return shifted * half - 0.5


def _index_dtype(batch: int, num_keys: int, num_heads: int) -> torch.dtype:
    # int32 rows where they fit: embedding_bag's backward sorts them, ~30% faster.
    return torch.int32 if batch * num_keys * num_heads < 2**31 else torch.int64


def bilinear_corners(
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    num_keys: int,
    constants: Optional[CornerConstants] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rows and weights of the 4 bilinear corners of every sample.

    x and y are computed together, the 4 corners along one axis: a fixed, small number of
    tensor ops whatever the number of levels (each op is a fixed host cost on small calls).
    ``constants`` (``corner_constants`` of this call's sizes and device) saves building them.

    Returns:
        rows: (bs, q, heads, levels * points * 4) row of ``value.reshape(-1, D)``, int32
            when every row fits, else int64.
        weights: same shape, attention * bilinear weight, 0 for corners outside the map.
    """
    bs, num_queries, num_heads, num_levels, num_points, _ = sampling_locations.shape
    # Coordinate arithmetic in at least float32: half precision cannot address pixels.
    coord_dtype = torch.promote_types(sampling_locations.dtype, torch.float32)
    if constants is None:
        constants = corner_constants(bs, num_keys, num_heads, sampling_locations.device)
    extent = spatial_shapes.flip(-1).to(coord_dtype).view(num_levels, 1, 1, 2)  # (W, H)
    pixel = pixel_coordinates(sampling_locations.to(coord_dtype), extent.squeeze(-2))
    # NaN/inf coordinates become an off-map point, so no NaN reaches any gradient.
    pixel = torch.where(torch.isfinite(pixel), pixel, -2.0)
    low = pixel.floor()
    frac = (pixel - low).unsqueeze(-2)  # (bs, q, heads, levels, points, 1, 2)
    corner = low.unsqueeze(-2) + constants.offsets  # (..., 4, 2) pixel (x, y) of each corner
    weight_xy = torch.where(constants.is_high, frac, 1 - frac)
    valid = ((corner >= 0) & (corner < extent)).all(-1)  # (..., 4)
    index_dtype = constants.batch_head_rows.dtype
    key = torch.where(valid, corner[..., 1] * extent[..., 0] + corner[..., 0], 0.0)
    starts = level_start_index.to(index_dtype).view(num_levels, 1, 1) * num_heads
    base = constants.batch_head_rows + starts
    rows = key.to(index_dtype) * num_heads + base
    weight = attention_weights.to(coord_dtype).unsqueeze(-1) * weight_xy[..., 0]
    weight = torch.where(valid, weight * weight_xy[..., 1], 0.0)
    flat = (bs, num_queries, num_heads, num_levels * num_points * 4)
    return rows.reshape(flat), weight.reshape(flat)


# (table (N, D), rows (M, bag), weights (M, bag)) -> (M, D): sum_j w[m, j] table[rows[m, j]]
RowBags = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def embedding_bags(table: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The weighted row sums (``RowBags``) as one ``embedding_bag(mode='sum')``."""
    return F.embedding_bag(rows, table, per_sample_weights=weights, mode="sum")


def msda_gather(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    constants: Optional[CornerConstants] = None,
    bags: RowBags = embedding_bags,
) -> torch.Tensor:
    """value (bs, keys, heads, D) -> (bs, num_queries, heads * D) by weighted row bags.

    Any floating dtypes (see ``inputs``); half precision is computed in float32 and the
    output has value's dtype. ``constants``: see ``bilinear_corners``. ``bags``: what sums
    the rows (and so what computes value's gradient).
    """
    bs, num_keys, num_heads, head_dim = value.shape
    num_queries = sampling_locations.shape[1]
    rows, weights = bilinear_corners(
        spatial_shapes,
        level_start_index,
        sampling_locations,
        attention_weights,
        num_keys,
        constants,
    )
    bag = rows.shape[-1]
    # Half precision gathers from a float32 copy of value: the bag sums and, in backward,
    # the value-gradient sums over every sample that hit a row are float32.
    compute = torch.promote_types(value.dtype, torch.float32)
    out = bags(
        value.reshape(-1, head_dim).to(compute),
        rows.reshape(-1, bag),
        weights.reshape(-1, bag).to(compute),
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
    # The row sums; a subclass changes how (and so how value's gradient is summed).
    BAGS: RowBags = staticmethod(embedding_bags)

    def forward(
        self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    ):
        return msda_gather(
            value,
            spatial_shapes,
            level_start_index,
            sampling_locations,
            attention_weights,
            bags=self.BAGS,
        )

    def bind(self, inputs: MSDAInputs) -> Kernel:
        sizes = (inputs.batch, inputs.num_keys, inputs.num_heads)
        built: List[CornerConstants] = []  # on the first call: the plan's device
        bags = self.BAGS

        def run(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
            if not built:
                built.append(corner_constants(*sizes, value.device))
            return msda_gather(
                value,
                spatial_shapes,
                level_start_index,
                sampling_locations,
                attention_weights,
                built[0],
                bags,
            )

        return run


register(GatherImpl())
