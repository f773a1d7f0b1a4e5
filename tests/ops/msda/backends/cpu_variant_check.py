"""Run as a script (in a subprocess): ``impl="cpu"`` against ``grid_sample`` on a few cases.

Checks the output and the three gradients (value, sampling locations, attention weights)
of the public ``cpu`` and of every ``cpu_*`` experiment variant, and that forward-mode AD
and second-order gradients raise, then prints one JSON line: the instruction-set variant
loaded, which autograd kernel runs, ``msda_impls()`` and where npudet and its kernel sources
were found. Self-contained (no test helpers), so it runs from an installed wheel
with no checkout on the path; the instruction set follows ``NPUDET_CPU_ISA``.
"""

from __future__ import annotations

import json

import torch

from npudet.ops.msda import (
    level_start_index,
    msda_impls,
    msda_variants,
    multi_scale_deformable_attn,
)
from npudet.ops.msda.backends import cpu as cpu_impl
from npudet.ops.msda.backends import cpu_library
from npudet.ops.msda.kernels.native_build import source_root

# (level shapes, batch, queries, heads, dim, points, location range, dtype)
CASES = [
    (((6, 4), (3, 2)), 2, 5, 2, 8, 2, (-0.2, 1.2), torch.float32),
    (((8, 8), (4, 6), (3, 3), (2, 1), (1, 1)), 1, 7, 8, 4, 4, (-0.2, 1.2), torch.float32),
    (((5, 7),), 2, 3, 1, 33, 8, (-50.0, 50.0), torch.float32),
    (((6, 4), (3, 2)), 2, 5, 2, 32, 2, (-0.2, 1.2), torch.float64),
]


def inputs(shapes, batch, queries, heads, dim, points, bounds, dtype):
    """Random MSDA inputs: value (batch, keys, heads, dim), locations, weights."""
    gen = torch.Generator().manual_seed(0)
    spatial = torch.tensor(shapes, dtype=torch.long)
    starts = level_start_index(spatial)
    value = torch.randn(batch, int(spatial.prod(1).sum()), heads, dim, generator=gen, dtype=dtype)
    shape = (batch, queries, heads, len(shapes), points)
    low, high = bounds
    loc = low + (high - low) * torch.rand(*shape, 2, generator=gen, dtype=dtype)
    attn = torch.rand(*shape, generator=gen, dtype=dtype)
    return value, spatial, starts, loc, attn


def run(impl, case):
    """Output and gradients of ``impl`` for ``case``."""
    value, spatial, starts, loc, attn = inputs(*case)
    leaves = [t.clone().requires_grad_() for t in (value, loc, attn)]
    out = multi_scale_deformable_attn(leaves[0], spatial, starts, leaves[1], leaves[2], impl=impl)
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=out.dtype)
    return (out, *torch.autograd.grad(out, leaves, grad))


def check_unsupported_modes_raise() -> None:
    """Forward-mode AD and a second-order gradient through ``cpu`` raise (never drop silently)."""
    import torch.autograd.forward_ad as fwAD

    value, spatial, starts, loc, attn = inputs(*CASES[0])
    try:
        with fwAD.dual_level():
            dual = fwAD.make_dual(value, torch.ones_like(value))
            multi_scale_deformable_attn(dual, spatial, starts, loc, attn, impl="cpu")
    except (RuntimeError, NotImplementedError):
        pass
    else:
        raise AssertionError("forward-mode AD through cpu did not raise")
    leaves = [t.clone().requires_grad_() for t in (value, loc, attn)]
    out = multi_scale_deformable_attn(leaves[0], spatial, starts, leaves[1], leaves[2], impl="cpu")
    (grad_value, *_) = torch.autograd.grad(out.square().sum(), leaves, create_graph=True)
    try:
        torch.autograd.grad(grad_value.sum(), leaves, allow_unused=True)
    except RuntimeError:
        pass
    else:
        raise AssertionError("a second-order gradient through cpu did not raise")


def main() -> None:
    impls = msda_impls()
    assert "cpu" in impls, f"cpu not usable: {cpu_impl.CPUImpl().unavailable_reasons()}"
    checked = ["cpu", *(v for v in msda_variants() if v.startswith("cpu_"))]
    for case in CASES:
        tol = 1e-10 if case[-1] == torch.float64 else 1e-4
        want = run("grid_sample", case)
        for impl in checked:
            for name, g, w in zip(
                ("output", "value", "locations", "weights"), run(impl, case), want
            ):
                scale = max(w.abs().max().item(), 1.0)
                torch.testing.assert_close(
                    g, w, rtol=tol, atol=tol * scale, msg=lambda m, n=name, i=impl: f"{i} {n}: {m}"
                )
    check_unsupported_modes_raise()
    import npudet

    report = {
        "isa": cpu_library.isa(),
        "impls": impls,
        "checked": checked,
        "npudet": npudet.__file__,
        "sources": str(source_root(cpu_library.OPS_SOURCES)),
        "autograd": cpu_library.autograd(),
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
