"""Device helpers: NPU detection through the package probe, and the NPU training settings.

Applying the settings is checked against a recording stand-in for ``torch_npu`` that only
records calls; no tensor is placed on it.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from npudet.ops.msda.registry import assume_packages
from npudet.utils import (
    current_device_type,
    device_name,
    npu_available,
    npu_training_settings,
)


class RecordingTorchNPU(types.ModuleType):
    """Records ``torch_npu.npu`` calls; reports one device."""

    def __init__(self):
        super().__init__("torch_npu")
        self.calls = []
        self.npu = types.SimpleNamespace(
            is_available=lambda: True,
            get_device_name=lambda index: f"Ascend910B-{index}",
            set_compile_mode=lambda jit_compile: self.calls.append(("jit_compile", jit_compile)),
            config=types.SimpleNamespace(allow_internal_format=True),
        )


@pytest.fixture
def fake_torch_npu(monkeypatch):
    module = RecordingTorchNPU()
    monkeypatch.setitem(sys.modules, "torch_npu", module)
    with assume_packages({"torch_npu": "2.6.0"}):
        yield module


def test_without_torch_npu_there_is_no_npu():
    with assume_packages({}):
        assert not npu_available()
        mps = torch.backends.mps.is_available()
        expected = "cuda" if torch.cuda.is_available() else "mps" if mps else "cpu"
        assert current_device_type() == expected
        assert isinstance(device_name(), str) and device_name()


def test_npu_found_through_torch_npu(fake_torch_npu):
    assert npu_available()
    assert current_device_type() == "npu"
    assert device_name() == "Ascend910B-0"


def test_settings_reported_but_not_applied_without_npu(monkeypatch):
    monkeypatch.delenv("NPUJITCompile", raising=False)
    with assume_packages({}):
        settings = npu_training_settings(apply=True)
    assert {s.name: s.value for s in settings} == {
        "torch_npu.npu.set_compile_mode(jit_compile)": False,
        "torch_npu.npu.config.allow_internal_format": False,
    }
    assert not any(s.applied for s in settings) and all(s.reason for s in settings)


@pytest.mark.parametrize(("env", "jit"), [(None, False), ("1", True), ("0", True), ("", False)])
def test_jit_compile_follows_mmengine_rule(monkeypatch, env, jit):
    if env is None:
        monkeypatch.delenv("NPUJITCompile", raising=False)
    else:
        monkeypatch.setenv("NPUJITCompile", env)
    with assume_packages({}):
        assert npu_training_settings()[0].value is jit


def test_settings_applied_on_npu(monkeypatch, fake_torch_npu):
    monkeypatch.delenv("NPUJITCompile", raising=False)
    settings = npu_training_settings(apply=True)
    assert all(s.applied for s in settings)
    assert fake_torch_npu.calls == [("jit_compile", False)]
    assert fake_torch_npu.npu.config.allow_internal_format is False


def test_dry_run_on_npu_changes_nothing(fake_torch_npu):
    settings = npu_training_settings(apply=False)
    assert not any(s.applied for s in settings)
    assert fake_torch_npu.calls == [] and fake_torch_npu.npu.config.allow_internal_format
