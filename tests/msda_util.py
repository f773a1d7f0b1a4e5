"""Shared input builders for the MSDA tests."""

from __future__ import annotations

from typing import Sequence, Tuple

import torch

from npudet.ops import msda_impls, multi_scale_deformable_attn

Inputs = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

# Every implementation under test is compared with this one.
REFERENCE = "grid_sample"


def candidate_impls() -> list:
    """Usable implementations, other than the reference, that take CPU float32 inputs."""
    from npudet.ops.msda import get_impl, validate_inputs

    info = validate_inputs(*random_inputs())
    return [
        name
        for name in msda_impls()
        if name != REFERENCE and not get_impl(name).not_supported_reasons(info)
    ]


def level_layout(shapes: Sequence[Tuple[int, int]]) -> Tuple[torch.Tensor, torch.Tensor, int]:
    spatial = torch.tensor(shapes, dtype=torch.long)
    sizes = spatial.prod(1)
    starts = torch.cat((sizes.new_zeros(1), sizes.cumsum(0)[:-1]))
    return spatial, starts, int(sizes.sum())


def random_inputs(
    shapes: Sequence[Tuple[int, int]] = ((6, 4), (3, 2)),
    batch: int = 2,
    queries: int = 5,
    heads: int = 2,
    dim: int = 8,
    points: int = 2,
    dtype: torch.dtype = torch.float32,
    low: float = -0.2,
    high: float = 1.2,
    seed: int = 0,
) -> Inputs:
    gen = torch.Generator().manual_seed(seed)
    spatial, starts, keys = level_layout(shapes)
    levels = len(shapes)
    value = torch.randn(batch, keys, heads, dim, generator=gen, dtype=dtype)
    loc = low + (high - low) * torch.rand(
        batch, queries, heads, levels, points, 2, generator=gen, dtype=dtype
    )
    attn = torch.rand(batch, queries, heads, levels, points, generator=gen, dtype=dtype)
    return value, spatial, starts, loc, attn


def run(impl: str, inputs: Inputs, grad_seed: int = 1):
    """Output and (grad value, grad locations, grad weights) of one implementation."""
    value, spatial, starts, loc, attn = inputs
    leaves = [t.detach().clone().requires_grad_() for t in (value, loc, attn)]
    out = multi_scale_deformable_attn(leaves[0], spatial, starts, leaves[1], leaves[2], impl=impl)
    gen = torch.Generator().manual_seed(grad_seed)
    grad = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    grads = torch.autograd.grad(out, leaves, grad)
    return out, grads
