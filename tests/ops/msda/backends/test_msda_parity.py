"""Every MSDA implementation against the grid_sample baseline: forward and all gradients."""

from __future__ import annotations

import pytest
import torch
from msda_util import (
    DEVICE,
    REFERENCE,
    candidate_impls,
    declined_reasons,
    msda,
    random_inputs,
    reference,
    run,
    to_device,
)

from npudet.ops import msda_impls
from npudet.ops.msda import msda_variants
from npudet.ops.msda.verification.parity import PARITY_CASES, PROBE_CASE, level_layout

# Implementations taking each dtype on the test device (NPUDET_TEST_DEVICE, cpu by default);
# the experiment variants are held to the same parity as the public implementations.
IMPLS = candidate_impls(variants=True)
IMPLS_F64 = candidate_impls(torch.float64, variants=True)
IMPLS_HALF = [(i, d) for d in (torch.float16, torch.bfloat16) for i in candidate_impls(d)]

# The device check's cases (``verification.parity``) but the probe (``test_msda_dispatch``) and
# NaN locations (tested below on their own terms), and a batch of one.
EDGE_CASES = {
    **{n: c for n, c in PARITY_CASES.items() if n != PROBE_CASE and not c.get("nan")},
    "batch-1": dict(batch=1),
}


def test_expected_impls_are_usable_here():
    assert {"grid_sample", "gather", "cpu"} <= set(msda_impls())
    variants = {"cpu_atomic", "cpu_owner", "cpu_corner", "cpu_noprefetch", "cpu_headmajor"}
    assert set(msda_variants()) == variants and not variants & set(msda_impls())


def assert_matches_reference(impl, inputs, rtol=1e-4, atol=1e-4):
    if declined_reasons(impl, inputs):
        # Outside the implementation's declared limits (a vendor kernel's, on a device run):
        # the op refuses, naming them, rather than computing.
        with pytest.raises(ValueError, match=f"impl='{impl}' cannot run these inputs"):
            run(impl, inputs, device=DEVICE)
        return
    out, grads = run(impl, inputs, device=DEVICE)
    ref_out, ref_grads = reference(inputs)
    torch.testing.assert_close(out, ref_out, rtol=rtol, atol=atol)
    for name, got, want in zip(("value", "locations", "weights"), grads, ref_grads):
        scale = max(want.abs().max().item(), 1.0)
        torch.testing.assert_close(
            got, want, rtol=rtol, atol=atol * scale, msg=lambda m, n=name: f"grad {n}: {m}"
        )


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("case", sorted(EDGE_CASES))
def test_float32_matches_grid_sample(impl, case):
    assert_matches_reference(impl, random_inputs(**EDGE_CASES[case]))


@pytest.mark.parametrize("impl", IMPLS_F64)
def test_exact_borders_match_grid_sample(impl):
    """Locations on pixel centres, pixel edges, the map edges and one pixel beyond.

    Power-of-two maps make ``loc * W - 0.5`` exact in every implementation's arithmetic,
    so even the gradients at these kinks must agree (float64).
    """
    shapes = ((4, 8), (2, 2))
    spatial, starts, keys = level_layout(shapes)
    gen = torch.Generator().manual_seed(3)
    batch, queries, heads, dim, points = 1, 24, 2, 5, 3
    value = torch.randn(batch, keys, heads, dim, generator=gen, dtype=torch.float64)
    # multiples of 1/16 from -3/16 to 19/16: covers x = -1, -0.5, 0, W-0.5, W on both levels
    grid = torch.arange(-3, 20, dtype=torch.float64) / 16
    pick = torch.randint(
        0, grid.numel(), (batch, queries, heads, len(shapes), points, 2), generator=gen
    )
    loc = grid[pick]
    loc[0, 0, 0, :, 0] = torch.tensor([0.0, 0.0], dtype=torch.float64)
    loc[0, 1, 0, :, 0] = torch.tensor([1.0, 1.0], dtype=torch.float64)
    attn = torch.rand(
        batch, queries, heads, len(shapes), points, generator=gen, dtype=torch.float64
    )
    assert_matches_reference(impl, (value, spatial, starts, loc, attn), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", IMPLS)
def test_non_contiguous_inputs(impl):
    value, spatial, starts, loc, attn = random_inputs(heads=3, dim=6, queries=7)
    value_nc = value.transpose(2, 3).contiguous().transpose(2, 3)
    loc_nc = torch.cat((loc, loc), dim=1)[:, ::2]
    attn_nc = attn.transpose(0, 1).contiguous().transpose(0, 1)
    assert not (value_nc.is_contiguous() or loc_nc.is_contiguous() or attn_nc.is_contiguous())
    assert_matches_reference(impl, (value_nc, spatial, starts, loc_nc, attn_nc))


@pytest.mark.parametrize("impl", IMPLS)
def test_nan_locations_contribute_nothing(impl):
    value, spatial, starts, loc, attn = random_inputs(queries=4)
    loc = loc.clone()
    loc[:, 1] = float("nan")
    loc[:, 2, :, :, :, 0] = float("inf")
    out, grads = run(impl, (value, spatial, starts, loc, attn), device=DEVICE)
    assert torch.all(out[:, 1:3] == 0)
    assert torch.isfinite(out).all()
    assert torch.isfinite(grads[0]).all() and torch.isfinite(grads[2]).all()
    clean = loc.clone()
    clean[:, 1:3] = 5.0  # outside: contributes zero, exactly like NaN
    torch.testing.assert_close(
        out, msda(*to_device((value, spatial, starts, clean, attn)), impl=impl).cpu()
    )


@pytest.mark.parametrize("impl", [*IMPLS_F64, REFERENCE])
def test_float64_gradcheck(impl):
    inputs = random_inputs(
        shapes=((3, 4), (2, 2)),
        batch=1,
        queries=2,
        heads=2,
        dim=3,
        points=2,
        dtype=torch.float64,
        low=0.05,
        high=0.95,
        seed=5,
    )
    value, spatial, starts, loc, attn = [t.clone() for t in to_device(inputs)]
    value.requires_grad_()
    loc.requires_grad_()
    attn.requires_grad_()

    def fn(v, l_, a):
        return msda(v, spatial, starts, l_, a, impl=impl)

    assert torch.autograd.gradcheck(fn, (value, loc, attn), eps=1e-6, atol=1e-5)


@pytest.mark.parametrize(("impl", "dtype"), IMPLS_HALF)
def test_half_precision_inputs(impl, dtype):
    value, spatial, starts, loc, attn = random_inputs(dim=16, low=0.0, high=1.0)
    want = msda(value, spatial, starts, loc, attn, impl=REFERENCE)
    half = (value.to(dtype), spatial, starts, loc.to(dtype), attn.to(dtype))
    got = msda(*to_device(half), impl=impl)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float().cpu(), want, rtol=5e-2, atol=5e-2)


def test_auto_on_cpu_takes_the_fused_kernel():
    from npudet.ops.msda import select_impl, validate_inputs

    assert select_impl("auto", validate_inputs(*random_inputs())).NAME == "cpu"


def init_lattice_inputs(nudge: float = 0.0):
    """mmcv's initial sampling: reference points on the first level's pixel centres, offsets
    k * (cos, sin) / max(|cos|, |sin|) for k = 1..points divided by each level's (W, H), so
    most locations fall exactly on pixel centres (plus ``nudge`` pixels); float32, maps
    whose sizes are not powers of two (``loc * W - 0.5`` is then inexact)."""
    shapes = ((20, 30), (10, 15), (5, 8), (3, 4))
    spatial, starts, keys = level_layout(shapes)
    heads, points, dim = 8, 4, 4
    h0, w0 = shapes[0]
    ys, xs = torch.meshgrid(
        (torch.arange(h0) + 0.5) / h0, (torch.arange(w0) + 0.5) / w0, indexing="ij"
    )
    ref = torch.stack([xs.reshape(-1), ys.reshape(-1)], -1)
    theta = torch.arange(heads) * (2 * torch.pi / heads)
    direction = torch.stack([theta.cos(), theta.sin()], -1)
    direction = direction / direction.abs().max(-1, keepdim=True)[0]
    steps = (torch.arange(points) + 1).view(1, 1, points, 1)
    offsets = direction.view(heads, 1, 1, 2) * steps + nudge  # (heads, 1, points, 2) pixels
    wh = torch.tensor([[w, h] for h, w in shapes], dtype=torch.float32)  # (levels, 2)
    loc = ref.view(1, -1, 1, 1, 1, 2) + offsets.unsqueeze(0).unsqueeze(0) / wh.view(
        1, 1, 1, 4, 1, 2
    )
    gen = torch.Generator().manual_seed(5)
    value = torch.randn(1, keys, heads, dim, generator=gen)
    attn = torch.rand(*loc.shape[:-1], generator=gen)
    return value, spatial, starts, loc.float().contiguous(), attn


# The fused kernel and plain PyTorch (the Triton interpreter would take minutes at this size).
@pytest.mark.parametrize("impl", [i for i in ("cpu", "gather") if i in IMPLS])
def test_pixel_centre_ties_take_grid_samples_side(impl):
    """Bilinear sampling's location gradient jumps at pixel centres, and mmcv's initial
    offsets put most locations exactly there: the last bit of the unnormalisation picks the
    side. ``loc * W - 0.5`` (one or two roundings) took the other side from grid_sample's
    ``((2 loc - 1) + 1) * W / 2 - 0.5`` at ~1% of the ties, each a full-size difference
    (why a real-size DINO's losses parted from stock's after one AdamW step); computed as
    grid_sample computes it, every gradient agrees, on and off the lattice."""
    for nudge in (0.0, 1e-3):
        inputs = init_lattice_inputs(nudge)
        got, want = run(impl, inputs)[1][1], reference(inputs)[1][1]
        scale = want.abs().max()
        off = (got - want).abs() > 1e-4 * scale
        assert not off.any(), (nudge, off.float().mean().item())


def test_the_lattice_has_ties_that_other_arithmetic_splits():
    """The lattice above is a real test: many of its samples sit exactly on a pixel centre,
    and ``loc * W - 0.5``, computed in float32 with two roundings or with one, puts ~1% of
    them on another side of it than grid_sample's arithmetic (fused, as on AVX2/AVX512)."""
    _, spatial, _, loc, _ = init_lattice_inputs()
    extent = spatial.flip(-1).double().view(1, 1, 1, -1, 1, 2)  # (W, H) per level
    grid_samples = (((2 * loc - 1) + 1).double() * (extent / 2) - 0.5).float()
    assert (grid_samples == grid_samples.round()).float().mean() > 0.1
    for other in (loc * extent.float() - 0.5, (loc.double() * extent - 0.5).float()):
        split = (other.floor() != grid_samples.floor()).float().mean()
        assert 0.001 < split < 0.05, split
