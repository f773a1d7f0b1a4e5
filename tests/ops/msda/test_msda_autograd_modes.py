"""What each implementation supports beyond first-order reverse mode, and that the rest
raises: forward-mode AD (``torch.func.jvp``, ``forward_ad`` dual tensors) and second-order
gradients (``create_graph=True`` then differentiating a gradient). A tangent or a second
derivative is never dropped silently, as ATen's ops without a formula behave.

``SUPPORT`` declares each implementation's answer; an implementation usable here that it does
not list fails the test, so a new one must declare itself.
"""

from __future__ import annotations

import pytest
import torch
import torch.autograd.forward_ad as fwAD
from msda_util import DEVICE, random_inputs

from npudet.ops.msda import msda_impls, msda_variants, multi_scale_deformable_attn


def _aten_grid_sample_second_order() -> bool:
    """Whether this torch differentiates ``grid_sampler_2d_backward`` (torch 2.1 does not)."""
    x = torch.rand(1, 1, 2, 2, dtype=torch.float64)
    grid = torch.rand(1, 1, 1, 2, dtype=torch.float64, requires_grad=True)
    out = torch.nn.functional.grid_sample(x, grid, align_corners=False)
    (grad,) = torch.autograd.grad(out.sum(), grid, create_graph=True)
    try:
        torch.autograd.grad(grad.sum(), grid)
    except RuntimeError:
        return False
    return True


# Which of the gradients of (value, sampling_locations, attention_weights) can be
# differentiated again: all, none, or (grid_sample on a torch without the formula for
# grid_sampler_2d_backward) only attention_weights', which is grid_sample's forward output.
ALL, NONE, ATTN_ONLY = (True, True, True), (False, False, False), (False, False, True)
# implementation -> (forward-mode AD, second-order gradients): True works, False raises.
# grid_sample is ATen's: no forward-mode formula; second order as this torch has it.
SUPPORT = {
    "grid_sample": (False, ALL if _aten_grid_sample_second_order() else ATTN_ONLY),
    "gather": (False, NONE),
    "gather_det": (False, NONE),
    "cpu": (False, NONE),
    "triton": (False, NONE),
    "mmcv": (False, NONE),
    "npu_vendor": (False, NONE),
    **{name: (False, NONE) for name in msda_variants() if name.startswith("cpu_")},
}
IMPLS = [*msda_impls(), *(v for v in msda_variants() if v.startswith("cpu_"))]


def _call(impl: str, value, loc, attn, spatial, starts):
    return multi_scale_deformable_attn(value, spatial, starts, loc, attn, impl=impl)


def _inputs():
    value, spatial, starts, loc, attn = random_inputs(dtype=torch.float64, low=0.1, high=0.9)
    return [t.to(DEVICE) for t in (value, loc, attn)], spatial.to(DEVICE), starts.to(DEVICE)


@pytest.mark.parametrize("impl", IMPLS)
def test_every_implementation_declares_its_support(impl):
    assert impl in SUPPORT, f"{impl}: add it to SUPPORT (forward AD, second order)"


@pytest.mark.parametrize("impl", IMPLS)
def test_forward_mode_ad_works_or_raises(impl):
    (value, loc, attn), spatial, starts = _inputs()
    tangent = torch.randn_like(value)

    def jvp():
        return torch.func.jvp(
            lambda v: _call(impl, v, loc, attn, spatial, starts), (value,), (tangent,)
        )

    def dual():
        with fwAD.dual_level():
            out = _call(impl, fwAD.make_dual(value, tangent), loc, attn, spatial, starts)
            return fwAD.unpack_dual(out).tangent

    if SUPPORT[impl][0]:
        want = _call(impl, tangent, loc, attn, spatial, starts)  # linear in value
        torch.testing.assert_close(jvp()[1], want)
        torch.testing.assert_close(dual(), want)
    else:
        for run in (jvp, dual):
            with pytest.raises((RuntimeError, NotImplementedError)):
                run()


@pytest.mark.parametrize("impl", IMPLS)
def test_second_order_gradients_work_or_raise(impl):
    (value, loc, attn), spatial, starts = _inputs()
    if SUPPORT[impl][1] == ALL:
        assert torch.autograd.gradgradcheck(
            lambda v, lo, a: _call(impl, v, lo, a, spatial, starts),
            [t.clone().requires_grad_() for t in (value, loc, attn)],
        )
        return
    leaves = [t.clone().requires_grad_() for t in (value, loc, attn)]
    out = _call(impl, *leaves, spatial, starts)
    grads = torch.autograd.grad(out.square().sum(), leaves, create_graph=True)
    names = ("value", "sampling_locations", "attention_weights")
    for name, grad, works in zip(names, grads, SUPPORT[impl][1]):
        assert grad.requires_grad, f"{impl}: the gradient of {name} lost its graph silently"
        if works:
            torch.autograd.grad(grad.sum(), leaves, allow_unused=True, retain_graph=True)
            continue
        with pytest.raises((RuntimeError, NotImplementedError)):
            torch.autograd.grad(grad.sum(), leaves, allow_unused=True, retain_graph=True)
