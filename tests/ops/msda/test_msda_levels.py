"""The level layout given as (H, W) pairs (``npudet.ops.msda.levels``) in eager calls: the
same result as the level tensors for every implementation, ``level_start_index`` derived when
None, and bad pairs refused naming ``spatial_shapes``."""

from __future__ import annotations

import pytest
import torch
from msda_util import random_inputs

from npudet.ops.msda import msda_impls, multi_scale_deformable_attn


@pytest.mark.parametrize("impl", ["auto", *msda_impls()])
def test_pairs_give_what_the_level_tensors_give(impl):
    value, spatial, starts, loc, attn = random_inputs(shapes=((6, 4), (3, 2), (1, 1)))
    want = multi_scale_deformable_attn(value, spatial, starts, loc, attn, impl=impl)
    pairs = [tuple(hw) for hw in spatial.tolist()]
    for shapes, index in ((pairs, None), (pairs, starts), (spatial, None)):
        got = multi_scale_deformable_attn(value, shapes, index, loc, attn, impl=impl)
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("shapes", "error", "match"),
    [
        (5, TypeError, "spatial_shapes: expected a \\(num_levels, 2\\) torch.Tensor or a sequence"),
        ([(6, 4, 1), (3, 2)], ValueError, "one \\(H, W\\) pair per level"),
        ([(6, 4.0), (3, 2)], TypeError, "expected int sizes"),
        ([(6, 4), (3, 0)], ValueError, "expected positive"),
        ([(6, 4), (3, 3)], ValueError, "sum of H\\*W over levels is 33, but value has num_keys=30"),
    ],
)
def test_bad_pairs_are_refused_naming_spatial_shapes(shapes, error, match):
    value, _, _, loc, attn = random_inputs(shapes=((6, 4), (3, 2)))
    with pytest.raises(error, match=match):
        multi_scale_deformable_attn(value, shapes, None, loc, attn, impl="cpu")


def test_pairs_with_a_wrong_level_start_index_are_refused():
    value, spatial, starts, loc, attn = random_inputs(shapes=((6, 4), (3, 2)))
    with pytest.raises(ValueError, match="level_start_index: expected \\[0, 24\\]"):
        multi_scale_deformable_attn(value, [(6, 4), (3, 2)], starts + 1, loc, attn, impl="cpu")
