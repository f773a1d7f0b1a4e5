"""Device helpers: NPU detection through the package probe.

Checked against a stand-in for ``torch_npu`` that reports one device; no tensor is placed
on it.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

from npudet.utils import current_device_type, device_name, npu_available
from npudet.utils.packages import assume_packages


class StandInTorchNPU(types.ModuleType):
    """``torch_npu`` that reports one device."""

    def __init__(self):
        super().__init__("torch_npu")
        self.npu = types.SimpleNamespace(
            is_available=lambda: True,
            get_device_name=lambda index: f"Ascend910B-{index}",
        )


@pytest.fixture
def fake_torch_npu(monkeypatch):
    module = StandInTorchNPU()
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
