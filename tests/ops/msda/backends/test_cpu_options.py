"""The CPU kernel's typed options, and kernel paths the parity suite's shapes never reach:
more than one 64-query block on the head-major path, the private-copy -> ownership
fallback and the ownership memory bound, NaN inputs, half/bfloat16 backward and the
gather-only probe's corner rows. (A variant forced by ``NPUDET_CPU_ISA``: test_cpu_isa.)
"""

from __future__ import annotations

import pytest
import torch
from msda_util import random_inputs, reference, run

from npudet.ops import msda_impls
from npudet.ops.msda.backends import cpu_library
from npudet.ops.msda.backends.cpu_options import DEFAULT_PRIVATE_BUDGET_BYTES, CPUKernelOptions

pytestmark = pytest.mark.skipif("cpu" not in msda_impls(), reason="no C++ compiler here")


@pytest.fixture
def two_threads():
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


def grads_of(options: CPUKernelOptions, inputs, grad_seed: int = 1):
    """Output and the three gradients of the cpu custom op run with ``options``."""
    value, spatial, starts, loc, attn = inputs
    leaves = [t.detach().clone().requires_grad_() for t in (value, loc, attn)]
    out = cpu_library.forward_op()(
        leaves[0], spatial, starts, leaves[1], leaves[2], options.as_ints()
    )
    grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(grad_seed))
    return out, torch.autograd.grad(out, leaves, grad.to(out.dtype))


def assert_matches_reference(got, inputs, atol=1e-4):
    want_out, want_grads = reference(inputs)
    out, grads = got
    torch.testing.assert_close(out, want_out, rtol=1e-4, atol=atol)
    for g, w in zip(grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=atol * 10)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"backward": "private"}, ValueError, "backward: expected one of"),
        ({"order": "column"}, ValueError, "order: expected one of"),
        ({"fused_corners": 1}, TypeError, "fused_corners: expected a bool"),
        ({"prefetch": "yes"}, TypeError, "prefetch: expected a bool"),
        ({"private_budget_bytes": -1}, TypeError, "private_budget_bytes"),
        ({"private_budget_bytes": True}, TypeError, "private_budget_bytes"),
        ({"backward": "atomic", "private_budget_bytes": 0}, ValueError, "makes none"),
    ],
)
def test_unknown_or_conflicting_options_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        CPUKernelOptions(**kwargs)


def test_options_reach_the_kernel_as_its_struct():
    assert CPUKernelOptions().as_ints() == [0, 1, 1, 0, DEFAULT_PRIVATE_BUDGET_BYTES]
    opts = CPUKernelOptions("atomic", False, False, "head")
    assert opts.as_ints() == [2, 0, 0, 1, DEFAULT_PRIVATE_BUDGET_BYTES]
    assert cpu_library.num_options() == len(opts.as_ints())
    inputs = random_inputs()
    # The kernel checks what it is given too (the custom op takes plain ints).
    for bad, match in (([0, 1, 1, 0], "expected 5 ints"), ([3, 1, 1, 0, 0], "backward code 3")):
        with pytest.raises(ValueError, match=match):
            cpu_library.forward_op()(*inputs, bad)


# Each ablation variant changes exactly the option its name says.
VARIANT_OPTION = {
    "cpu_atomic": ("backward", "atomic"),
    "cpu_owner": ("backward", "owner"),
    "cpu_corner": ("fused_corners", False),
    "cpu_noprefetch": ("prefetch", False),
    "cpu_headmajor": ("order", "head"),
}


@pytest.mark.parametrize("name", sorted(VARIANT_OPTION))
def test_each_variant_differs_from_cpu_in_exactly_its_one_option(name):
    from npudet.ops.msda import get_impl

    base, variant = get_impl("cpu").OPTIONS, get_impl(name).OPTIONS
    field, value = VARIANT_OPTION[name]
    assert variant.differences(base) == [field] and getattr(variant, field) == value


@pytest.mark.parametrize("backward", ["auto", "atomic", "owner"])
def test_head_major_with_more_than_one_query_block(two_threads, backward):
    """150 queries: blocks of 64, 64 and 22 per (batch, head), split across 2 threads."""
    inputs = random_inputs(batch=2, queries=150, heads=3, dim=32, points=2)
    got = grads_of(CPUKernelOptions(backward=backward, order="head"), inputs)
    assert_matches_reference(got, inputs)


def test_auto_falls_back_to_ownership_beyond_the_private_budget(two_threads):
    """One batch entry on 2 threads: thread 1 shares it with thread 0, so private copies
    need one slice; a budget of 0 sends auto to ownership, which then makes no copy."""
    batch, keys, heads, dim, queries = 1, 30, 2, 32, 9
    slice_bytes = keys * heads * dim * 4

    def plan(opts):
        return cpu_library.backward_plan(batch, keys, heads, dim, queries, 4, opts.as_ints())

    assert plan(CPUKernelOptions()) == ("private", 1, slice_bytes)
    assert plan(CPUKernelOptions(private_budget_bytes=slice_bytes)) == ("private", 1, slice_bytes)
    assert plan(CPUKernelOptions(private_budget_bytes=slice_bytes - 1)) == ("owner", 1, 0)
    # Ownership with 2 pairs on 2 threads needs no chunks; with 1 pair it splits the queries
    # into 2 chunks (one copy of grad_value) only when the budget holds that copy.
    assert plan(CPUKernelOptions(backward="owner")) == ("owner", 1, 0)
    one_pair = [1, keys, 1, dim, queries, 4]
    owner = CPUKernelOptions(backward="owner")
    assert cpu_library.backward_plan(*one_pair, owner.as_ints()) == ("owner", 2, keys * dim * 4)
    starved = CPUKernelOptions(backward="owner", private_budget_bytes=keys * dim * 4 - 1)
    assert cpu_library.backward_plan(*one_pair, starved.as_ints()) == ("owner", 1, 0)
    # Both fallbacks compute the same gradients.
    inputs = random_inputs(shapes=((5, 6),), batch=batch, queries=queries, heads=heads, dim=dim)
    assert_matches_reference(grads_of(CPUKernelOptions(private_budget_bytes=0), inputs), inputs)
    one = random_inputs(shapes=((5, 6),), batch=1, queries=queries, heads=1, dim=dim)
    assert_matches_reference(grads_of(starved, one), one)


@pytest.mark.parametrize("where", ["value", "attention_weights"])
def test_nan_propagates_as_in_grid_sample(where):
    value, spatial, starts, loc, attn = random_inputs(low=0.1, high=0.9, dim=32)
    if where == "value":
        value[0, 3, 1, 5] = float("nan")
        value[1, 20, 0, :] = float("nan")
    else:
        attn[0, 2, 1, 0, 1] = float("nan")
        attn[1, 4, 0, 1, 0] = float("nan")
        # Off the map: grid_sample's path still multiplies its zeros by the weight.
        loc[1, 1, 1, 0, 0] = torch.tensor([-3.0, 0.5])
        attn[1, 1, 1, 0, 0] = float("inf")
        loc[0, 3, 0, 1, 1] = torch.tensor([0.5, 4.0])
        attn[0, 3, 0, 1, 1] = float("nan")
    inputs = (value, spatial, starts, loc, attn)
    out, grads = run("cpu", inputs)
    want_out, want_grads = reference(inputs)
    assert out.isnan().any()
    for got, want in zip((out, *grads), (want_out, *want_grads)):
        assert torch.equal(got.isnan(), want.isnan())
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_backward(dtype):
    inputs = random_inputs(dim=32, queries=7, low=0.0, high=1.0)
    low = tuple(t.to(dtype) if t.is_floating_point() else t for t in inputs)
    out, grads = run("cpu", low)
    # The reference on the same rounded inputs, in float32.
    want_out, want_grads = reference(tuple(t.float() if t.is_floating_point() else t for t in low))
    tol = 2e-2 if dtype == torch.float16 else 6e-2
    assert out.dtype == dtype and all(g.dtype == dtype for g in grads)
    torch.testing.assert_close(out.float(), want_out, rtol=tol, atol=tol)
    for got, want in zip(grads, want_grads):
        scale = want.abs().max().item()
        torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol * scale)


@pytest.mark.dev  # npudet_dev.kernels.cpu_probe
def test_probe_reads_the_corner_rows_of_each_sample():
    from npudet_dev.kernels import cpu_probe

    spatial = torch.tensor([[4, 4]])
    starts = torch.tensor([0])
    value = torch.arange(1 * 16 * 2 * 3, dtype=torch.float32).view(1, 16, 2, 3)
    # Sample 0: pixel centre (1, 1) -> corners (1, 1), (2, 1), (1, 2), (2, 2); sample 1: on
    # the left edge (x0 = -1) -> only its right corners (0, 1), (0, 2); sample 2: left of the
    # map by more than a pixel -> no corner.
    loc = torch.tensor([[1.5 / 4, 1.5 / 4], [0.0, 1.5 / 4], [-0.5, 0.5]]).view(1, 1, 1, 1, 3, 2)
    loc = loc.expand(1, 1, 2, 1, 3, 2).contiguous()
    plan = cpu_probe.probe_plan(value, spatial, starts, loc)
    assert plan.corners[0].tolist() == [0b1111, 0b1010, 0] and plan.x_step == 2
    assert plan.row_step.tolist() == [8, 8, 8]
    rows = value.reshape(-1, 3)
    for h in range(2):
        keys = torch.tensor([5, 6, 9, 10, 4, 8])
        want = rows[keys * 2 + h].sum(0)
        got = cpu_probe.gather_probe(rows, plan, grain=1)[h]
        torch.testing.assert_close(got, want)
