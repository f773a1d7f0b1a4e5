"""``torch.export`` of the op and of ``npudet.nn.MSDeformAttn`` with the batch, the query
count and every feature map's size dynamic, for each implementation that runs here.

The exported programs are run at sizes other than the export size (batch 1 and 3, other
maps, other query counts) and compared with eager calls: nothing was specialized. The level
shapes come from the feature maps' ``.shape`` as (H, W) pairs (``npudet.ops.msda.levels``),
which is how a model keeps them symbolic; with a level tensor instead, the fused kernels
still export, and ``grid_sample`` (which must read it on the host) refuses with a clear error.
"""

from __future__ import annotations

import pytest
import torch
from export_util import (
    BATCH,
    HEAD_DIM,
    HEADS,
    POINTS,
    QUERIES,
    SIZES,
    OpFromMaps,
    feature_maps,
    map_dims,
    query_inputs,
)
from torch.export import Dim, export

from npudet.nn import MSDeformAttn
from npudet.ops.msda import level_start_index, msda_impls, multi_scale_deformable_attn

IMPLS = [name for name in ("grid_sample", "gather", "cpu", "triton") if name in msda_impls()]


@pytest.mark.parametrize("impl", [*IMPLS, "auto"])
def test_op_exports_with_dynamic_batch_queries_and_maps(impl):
    batch, sizes, queries = SIZES[0]
    args = (*feature_maps(batch, sizes, 0), *query_inputs(batch, queries, 1))
    loc_dims = {0: BATCH, 1: QUERIES}
    program = export(OpFromMaps(impl), args, dynamic_shapes=(*map_dims(), loc_dims, loc_dims))
    for n, (batch, sizes, queries) in enumerate(SIZES):
        args = (*feature_maps(batch, sizes, n), *query_inputs(batch, queries, n + 10))
        got = program.module()(*args)
        want = OpFromMaps("grid_sample")(*args)
        assert got.shape == (batch, queries, HEADS * HEAD_DIM)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


class OpWithLevelTensor(torch.nn.Module):
    def __init__(self, impl: str):
        super().__init__()
        self.impl = impl

    def forward(self, value, spatial_shapes, level_start_index, loc, attn):
        return multi_scale_deformable_attn(
            value, spatial_shapes, level_start_index, loc, attn, impl=self.impl
        )


def _tensor_args(batch: int, sizes, queries: int, seed: int):
    maps = feature_maps(batch, sizes, seed)
    value = torch.cat([m.flatten(2).transpose(1, 2) for m in maps], 1).unflatten(2, (HEADS, -1))
    shapes = torch.tensor(sizes)
    return (value, shapes, level_start_index(shapes), *query_inputs(batch, queries, seed + 10))


@pytest.mark.parametrize("impl", [i for i in IMPLS if i != "grid_sample"])
def test_fused_kernels_export_with_a_level_tensor(impl):
    keys = Dim("keys", min=2, max=1 << 20)
    loc_dims = {0: BATCH, 1: QUERIES}
    program = export(
        OpWithLevelTensor(impl),
        _tensor_args(*SIZES[0], seed=0),
        dynamic_shapes=({0: BATCH, 1: keys}, None, None, loc_dims, loc_dims),
    )
    for n, size in enumerate(SIZES):
        args = _tensor_args(*size, seed=n)
        torch.testing.assert_close(
            program.module()(*args), OpWithLevelTensor("grid_sample")(*args), rtol=1e-5, atol=1e-5
        )


def test_grid_sample_with_a_level_tensor_refuses_export_naming_the_fix():
    with pytest.raises(Exception, match="spatial_shapes: under torch.export, grid_sample needs"):
        export(OpWithLevelTensor("grid_sample"), _tensor_args(*SIZES[0], seed=0))


class LayerFromMaps(torch.nn.Module):
    """``MSDeformAttn`` (batch first) over two feature maps, queries given."""

    def __init__(self, impl: str):
        super().__init__()
        torch.manual_seed(0)
        self.attn = MSDeformAttn(
            embed_dims=HEADS * HEAD_DIM,
            num_heads=HEADS,
            num_levels=2,
            num_points=POINTS,
            batch_first=True,
            impl=impl,
        )
        self.attn.eval()

    def forward(self, map0, map1, query, reference_points):
        maps = (map0, map1)
        value = torch.cat([m.flatten(2).transpose(1, 2) for m in maps], 1)
        pairs = [(m.shape[2], m.shape[3]) for m in maps]
        return self.attn(
            query, value=value, reference_points=reference_points, spatial_shapes=pairs
        )


def _layer_args(batch: int, sizes, queries: int, seed: int):
    gen = torch.Generator().manual_seed(seed + 20)
    query = torch.randn(batch, queries, HEADS * HEAD_DIM, generator=gen)
    ref = torch.rand(batch, queries, 2, 2, generator=gen)
    return (*feature_maps(batch, sizes, seed), query, ref)


@pytest.mark.parametrize("impl", IMPLS)
def test_msdeformattn_exports_with_dynamic_batch_queries_and_maps(impl):
    model = LayerFromMaps(impl)
    query_dims = {0: BATCH, 1: QUERIES}
    program = export(
        model,
        _layer_args(*SIZES[0], seed=0),
        dynamic_shapes=(*map_dims(), query_dims, query_dims),
    )
    reference = LayerFromMaps("grid_sample")
    for n, size in enumerate(SIZES):
        args = _layer_args(*size, seed=n)
        with torch.no_grad():
            torch.testing.assert_close(
                program.module()(*args), reference(*args), rtol=1e-5, atol=1e-5
            )
