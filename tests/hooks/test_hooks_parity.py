"""MSDAParityHook on a real Runner: quiet on a correct kernel, fires on a perturbed one."""

from __future__ import annotations

import glob
import os
from typing import Any

import pytest
import torch
from hooks_util import toy_runner
from msda_util import random_inputs

import npudet.hooks  # noqa: F401  (register)
from npudet.hooks import MSDAParityError, compare_call
from npudet.ops import multi_scale_deformable_attn
from npudet.ops.msda import MSDAImpl, get_impl
from npudet.ops.msda.observe import MSDACall, active_observers
from npudet.ops.msda.registry import _REGISTRY


class _OffOutput(MSDAImpl):
    """The reference, with every output 1% + 0.01 off."""

    NAME = "test_off_output"
    DEVICES = ("cpu",)

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        return get_impl("grid_sample").forward(*inputs) * 1.01 + 0.01


class _ScaleGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return 1.1 * grad


class _OffGradient(MSDAImpl):
    """The reference's output, with the gradient of ``value`` 10% too large."""

    NAME = "test_off_gradient"
    DEVICES = ("cpu",)

    def forward(self, value: torch.Tensor, *rest: torch.Tensor) -> torch.Tensor:
        return get_impl("grid_sample").forward(_ScaleGrad.apply(value), *rest)


@pytest.fixture
def perturbed(monkeypatch):
    for impl in (_OffOutput(), _OffGradient()):
        monkeypatch.setitem(_REGISTRY, impl.NAME, impl)


def _call(impl: str) -> MSDACall:
    return MSDACall(impl, *random_inputs())


def test_compare_call_agrees_for_a_correct_kernel():
    errors = compare_call(_call("gather"), "grid_sample")
    assert set(errors) == {
        "output",
        "grad_value",
        "grad_sampling_locations",
        "grad_attention_weights",
    }
    assert all(rel < 1e-5 for _, rel in errors.values())


def test_compare_call_sees_output_and_gradient_errors(perturbed):
    out_errors = compare_call(_call("test_off_output"), "grid_sample")
    assert out_errors["output"][1] > 5e-3
    grad_errors = compare_call(_call("test_off_gradient"), "grid_sample")
    assert grad_errors["output"][1] < 1e-6
    assert grad_errors["grad_value"][1] == pytest.approx(0.1, rel=1e-3)
    assert grad_errors["grad_attention_weights"][1] < 1e-6


def test_parity_hook_checks_every_layer_every_interval(tmp_path):
    hook = {"type": "MSDAParityHook", "interval": 2, "action": "stop"}
    runner = toy_runner(str(tmp_path), [hook], max_iters=4, impl="gather")
    runner.train()
    parity = next(h for h in runner.hooks if type(h).__name__ == "MSDAParityHook")
    assert [(r.iteration, r.layer, r.impl) for r in parity.results] == [
        (2, "layers.0", "gather"),
        (2, "layers.1", "gather"),
        (4, "layers.0", "gather"),
        (4, "layers.1", "gather"),
    ]
    assert all(0 < r.max_rel < 1e-5 for r in parity.results)
    assert runner.message_hub.get_scalar("train/msda_parity_max_rel").current() < 1e-5
    assert active_observers() == []
    assert not any(m._forward_pre_hooks for m in runner.model.modules())


def test_parity_hook_stops_naming_the_layer(tmp_path, perturbed):
    hook = {"type": "MSDAParityHook", "interval": 2, "action": "stop"}
    runner = toy_runner(str(tmp_path), [hook], max_iters=4, impl="test_off_gradient")
    with pytest.raises(
        MSDAParityError,
        match=r"layer 'layers\.0' \(impl 'test_off_gradient'.*"
        r"grad_value",
    ):
        runner.train()
    assert runner.iter == 1  # stopped after the 2nd iteration


def test_parity_hook_warns_and_trains_on(tmp_path, perturbed):
    hook = {"type": "MSDAParityHook", "interval": 3, "action": "warn"}
    runner = toy_runner(str(tmp_path), [hook], max_iters=3, impl="test_off_output")
    runner.train()
    parity = next(h for h in runner.hooks if type(h).__name__ == "MSDAParityHook")
    assert runner.iter == 3
    assert [r.layer for r in parity.results if r.max_rel > parity.rel_threshold] == [
        "layers.0",
        "layers.1",
    ]
    logs = glob.glob(os.path.join(runner.log_dir, "*.log"))
    with open(logs[0]) as f:
        text = f.read()
    assert "MSDA parity failed: layer 'layers.0' (impl 'test_off_output'" in text


def test_capture_names_repeated_calls():
    from npudet.hooks.msda_capture import MSDACapture
    from npudet.ops.msda.observe import observing

    class Twice(torch.nn.Module):
        def forward(self, inputs):
            return multi_scale_deformable_attn(*inputs) + multi_scale_deformable_attn(*inputs)

    model = torch.nn.Sequential(Twice())
    capture = MSDACapture()
    capture.attach(model)
    with observing(capture):
        model(random_inputs())
    assert [name for name, _ in capture.calls] == ["0", "0#2"]
    capture.detach()
    assert capture.calls == [] and not model[0]._forward_pre_hooks
