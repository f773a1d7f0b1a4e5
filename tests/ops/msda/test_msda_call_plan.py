"""The host path: a steady-state call decides nothing (call plans), ``prepare`` decides ahead,
and ``auto``'s decision reaches the training log."""

from __future__ import annotations

import glob
import logging
import os
import re
import warnings

import pytest
import torch
from msda_util import random_inputs
from plugin_util import SMALL_DETR, data_options, run_tool

import npudet.ops.msda.api as api
from npudet.ops import multi_scale_deformable_attn, prepare
from npudet.ops.msda import auto, call_plan, get_impl, registry
from npudet.ops.msda.observe import MSDAObserver, observing
from npudet.ops.msda.verification import parity
from npudet.utils.device import device_name

CPU = device_name("cpu")  # auto's trust decisions are keyed by the device model


def _refuse(*args, **kwargs):
    raise AssertionError("the call took the whole path")


@pytest.fixture
def whole_path_refused(monkeypatch):
    """After this, a call that validates or selects fails: only planned calls pass."""

    def refuse():
        monkeypatch.setattr(api, "validate_inputs", _refuse)
        monkeypatch.setattr(api, "select_impl", _refuse)

    return refuse


@pytest.mark.parametrize("impl", ["auto", "cpu", "gather", "grid_sample"])
def test_steady_state_call_neither_validates_nor_selects(impl, whole_path_refused):
    value, shapes, starts, loc, attn = random_inputs()
    leaves = [t.clone().requires_grad_() for t in (value, loc, attn)]
    first = multi_scale_deformable_attn(leaves[0], shapes, starts, *leaves[1:], impl=impl)
    whole_path_refused()
    for _ in range(3):
        out = multi_scale_deformable_attn(leaves[0], shapes, starts, *leaves[1:], impl=impl)
        grads = torch.autograd.grad(out.sum(), leaves)
    torch.testing.assert_close(out, first)
    assert all(torch.isfinite(g).all() for g in grads)
    assert call_plan.count() == 1


@pytest.mark.parametrize(
    "change",
    ["dtype", "requires_grad", "no_grad", "deterministic", "shape", "index dtype", "impl"],
)
def test_a_new_signature_takes_the_whole_path(change, whole_path_refused):
    value, shapes, starts, loc, attn = random_inputs()
    multi_scale_deformable_attn(value, shapes, starts, loc, attn)
    whole_path_refused()
    args = [value, shapes, starts, loc, attn]
    impl = "auto"
    context = torch.enable_grad()
    if change == "dtype":
        args[0] = value.double()
    elif change == "requires_grad":
        args[3] = loc.clone().requires_grad_()
    elif change == "no_grad":
        context = torch.no_grad()
    elif change == "shape":
        args[3], args[4] = loc[:, :2], attn[:, :2]
    elif change == "index dtype":
        args[2] = starts.int()
    elif change == "impl":
        impl = "gather"
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(change == "deterministic" or deterministic)
        with context, pytest.raises(AssertionError, match="took the whole path"):
            multi_scale_deformable_attn(*args, impl=impl)
    finally:
        torch.use_deterministic_algorithms(deterministic)


def test_plans_are_dropped_when_their_grounds_change():
    inputs = random_inputs()
    multi_scale_deformable_attn(*inputs)
    assert call_plan.count() == 1
    auto.reset()
    assert call_plan.count() == 0
    multi_scale_deformable_attn(*inputs)
    registry.register(get_impl("gather"))  # re-registering may change what auto takes
    assert call_plan.count() == 0


def test_a_nondeterministic_call_is_never_planned():
    inputs = random_inputs()
    leaves = [t.clone().requires_grad_() for t in (inputs[0], inputs[3], inputs[4])]
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True, warn_only=True)
        for _ in range(2):  # each call warns: nothing kept would skip the warning
            with pytest.warns(UserWarning, match="backward not deterministic"):
                multi_scale_deformable_attn(
                    leaves[0], inputs[1], inputs[2], *leaves[1:], impl="cpu_atomic"
                )
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert call_plan.count() == 0


def test_observers_see_calls_that_have_plans():
    inputs = random_inputs()
    multi_scale_deformable_attn(*inputs)

    class Count(MSDAObserver):
        calls = 0

        def around(self, call, run):
            Count.calls += 1
            return run(call)

    with observing(Count()):
        multi_scale_deformable_attn(*inputs)
    assert Count.calls == 1


def test_prepare_verifies_ahead_so_the_first_call_checks_nothing(monkeypatch):
    auto.reset()
    monkeypatch.setattr(auto, "_decisions", {})
    assert prepare("cpu", (torch.float32, torch.float64)) == {
        torch.float32: "cpu",
        torch.float64: "cpu",
    }
    assert auto._decisions == {
        ("cpu", CPU, "cpu", "float32"): "",
        ("cpu", CPU, "cpu", "float64"): "",
    }
    monkeypatch.setattr(parity, "check_impl", _refuse)
    multi_scale_deformable_attn(*random_inputs())


def test_auto_logs_dtype_build_and_failed_verification(monkeypatch, caplog):
    monkeypatch.setattr(auto, "_announced", set())
    monkeypatch.setattr(auto, "_decisions", {("cpu", CPU, "cpu", "float32"): "output: wrong"})
    with caplog.at_level(logging.INFO, logger="npudet"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        multi_scale_deformable_attn(*random_inputs())
    by_level = {r.levelno: r.getMessage() for r in caplog.records}
    assert by_level[logging.INFO].startswith("npudet MSDA auto on cpu float32: using 'gather'")
    assert by_level[logging.WARNING] == (
        "npudet MSDA auto on cpu float32: not using 'cpu': failed verification: output: wrong"
    )
    caplog.clear()
    monkeypatch.setattr(auto, "_decisions", {})
    call_plan.clear()  # the plan was decided on the patched trust decision
    with caplog.at_level(logging.INFO, logger="npudet"):
        multi_scale_deformable_attn(*random_inputs())
    from npudet.ops.msda.backends.cpu_library import isa

    assert f"using 'cpu' ({isa()} build, autograd: C++ node)" in caplog.records[0].getMessage()


def test_training_log_names_each_part_and_autos_choice(tiny_shapes, tmp_path):
    proc = run_tool(
        [
            "tools/train.py",
            SMALL_DETR,
            "--work-dir",
            str(tmp_path),
            "--cfg-options",
            *data_options(tiny_shapes),
            "train_cfg.max_epochs=1",
            "train_cfg.val_interval=2",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (log,) = glob.glob(os.path.join(str(tmp_path), "*", "*.log"))
    text = open(log).read()
    part = r"auto \(\d+ layers?\)"
    assert re.search(f"MSDA implementation per model part: decoder: {part}, encoder: {part}", text)
    assert "npudet MSDA auto on cpu float32: using 'cpu' (" in text
