"""The op on two feature maps with every size dynamic: the module ``torch.export`` and the
AOTInductor package are tested on (``test_msda_export``, ``test_aoti``), its inputs and
its dynamic shapes."""

from __future__ import annotations

from typing import Dict, List, Sequence, Tuple

import torch
from torch.export import Dim

from npudet.ops.msda import multi_scale_deformable_attn

HEADS, HEAD_DIM, POINTS = 2, 8, 2
BATCH, QUERIES = Dim("batch", min=1, max=64), Dim("queries", min=1, max=4096)
# Two levels, each of its own dynamic size.
MAPS = [(Dim(f"h{i}", min=2, max=256), Dim(f"w{i}", min=2, max=256)) for i in range(2)]

# Export size, then two others: batch 1 and 3, other maps and query counts.
SIZES = [
    (2, [(6, 5), (3, 4)], 7),
    (1, [(9, 4), (5, 2)], 3),
    (3, [(4, 11), (2, 6)], 12),
]


def feature_maps(batch: int, sizes: Sequence[Tuple[int, int]], seed: int) -> List[torch.Tensor]:
    """One (batch, HEADS * HEAD_DIM, h, w) map per (h, w) of ``sizes``."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(batch, HEADS * HEAD_DIM, h, w, generator=gen) for h, w in sizes]


def query_inputs(batch: int, queries: int, seed: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Sampling locations (batch, queries, HEADS, 2, POINTS, 2), a little outside [0, 1]
    too, and attention weights (batch, queries, HEADS, 2, POINTS)."""
    gen = torch.Generator().manual_seed(seed)
    shape = (batch, queries, HEADS, 2, POINTS)
    loc = torch.rand(*shape, 2, generator=gen) * 1.2 - 0.1
    return loc, torch.rand(*shape, generator=gen)


class OpFromMaps(torch.nn.Module):
    """The op on value flattened from two feature maps, level shapes from their sizes."""

    def __init__(self, impl: str):
        super().__init__()
        self.impl = impl

    def forward(self, map0, map1, loc, attn):
        maps = (map0, map1)
        value = torch.cat([m.flatten(2).transpose(1, 2) for m in maps], 1)
        value = value.unflatten(2, (HEADS, HEAD_DIM))
        pairs = [(m.shape[2], m.shape[3]) for m in maps]
        return multi_scale_deformable_attn(value, pairs, None, loc, attn, impl=self.impl)


def map_dims() -> List[Dict[int, Dim]]:
    """Dynamic batch, height and width of each map."""
    return [{0: BATCH, 2: h, 3: w} for h, w in MAPS]


def op_inputs(batch: int, sizes: Sequence[Tuple[int, int]], queries: int, seed: int) -> tuple:
    """``OpFromMaps``'s four arguments at one size."""
    return (*feature_maps(batch, sizes, seed), *query_inputs(batch, queries, seed + 10))


def op_dynamic_shapes() -> tuple:
    """``OpFromMaps``'s dynamic shapes: batch, queries and every map's size."""
    loc_dims = {0: BATCH, 1: QUERIES}
    return (*map_dims(), loc_dims, loc_dims)
