"""Run as a script by ``.venv-torch21``'s python (``tests/project/test_oldest_torch.py``): what
the op library and ``npudet.nn`` do on the oldest supported torch.

Imports ``npudet.ops`` and ``npudet.nn``, builds the ``cpu`` kernel (its C++ autograd node
included), runs an ``MSDeformAttn`` layer forward and backward through ``cpu`` and through
``grid_sample`` and compares them, runs the ``cpu`` and ``triton`` forward ops on meta
tensors (their fake kernels), then prints one JSON line: torch's version, ``msda_impls()``,
the autograd kernel, why ``triton`` is unavailable, the largest difference, the meta shapes.
Self-contained: only torch and npudet.
"""

from __future__ import annotations

import json

import torch

from npudet.nn import MSDeformAttn
from npudet.ops.msda import get_impl, level_start_index, msda_impls
from npudet.ops.msda.backends import cpu_library
from npudet.ops.msda.backends.cpu_options import CPUKernelOptions


def layer_outputs(impl: str) -> tuple:
    """Output and parameter gradients of a seeded ``MSDeformAttn`` run through ``impl``."""
    torch.manual_seed(0)
    layer = MSDeformAttn(embed_dims=32, num_heads=4, num_levels=2, num_points=2, impl=impl)
    layer.eval()  # no dropout: both runs must see the same computation
    shapes = torch.tensor([[6, 4], [3, 2]])
    keys = int(shapes.prod(1).sum())
    gen = torch.Generator().manual_seed(1)
    query = torch.randn(5, 2, 32, generator=gen)
    value = torch.randn(keys, 2, 32, generator=gen)
    reference_points = torch.rand(2, 5, 2, 2, generator=gen)
    out = layer(
        query,
        value=value,
        reference_points=reference_points,
        spatial_shapes=shapes,
        level_start_index=level_start_index(shapes),
    )
    out.square().sum().backward()
    return (out.detach(), *(p.grad for p in layer.parameters()))


def meta_output_shapes() -> dict:
    """Output shapes of the ``cpu`` and ``triton`` forward ops on meta tensors: their fake
    kernels (C++ for ``cpu``; ``torch_compat.register_fake``'s for ``triton``) run, no data."""
    meta = torch.device("meta")
    shapes = torch.tensor([[6, 4], [3, 2]], device=meta)
    starts = torch.tensor([0, 24], device=meta)
    value = torch.empty(2, 30, 4, 8, device=meta)
    loc = torch.empty(2, 5, 4, 2, 2, 2, device=meta)
    attn = torch.empty(2, 5, 4, 2, 2, device=meta)
    cpu = cpu_library.forward_op()(value, shapes, starts, loc, attn, CPUKernelOptions().as_ints())
    triton = torch.ops.npudet.msda_triton_forward(value, shapes, starts, loc, attn)
    return {"cpu": list(cpu.shape), "triton": list(triton.shape)}


def main() -> None:
    impls = msda_impls()
    assert "cpu" in impls, f"cpu unavailable: {get_impl('cpu').unavailable_reasons()}"
    want = layer_outputs("grid_sample")
    got = layer_outputs("cpu")
    diffs = [(g - w).abs().max().item() for g, w in zip(got, want)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
    report = {
        "torch": torch.__version__,
        "impls": impls,
        "autograd": cpu_library.autograd(),
        "isa": cpu_library.isa(),
        "triton": get_impl("triton").unavailable_reasons(),
        "layer_max_diff": max(diffs),
        "meta_shapes": meta_output_shapes(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
