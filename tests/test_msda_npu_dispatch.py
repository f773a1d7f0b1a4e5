"""Which implementation takes an NPU call: a pure function of the call and the packages.

No NPU here: calls are described by ``MSDAInputs(device_type="npu", ...)`` and the
packages that import are stated with ``assume_packages``; nothing is run or imported.
"""

from __future__ import annotations

import logging
import sys

import pytest
import torch

from npudet.ops.msda import MSDAInputs, auto_order, get_impl, registry, select_impl
from npudet.ops.msda.npu_impl import vendor_route
from npudet.ops.msda.registry import assume_packages

TORCH_NPU = {"torch_npu": "2.6.0"}
MX = {**TORCH_NPU, "mx_driving": "7.1.0"}
TRITON = {"triton": "3.2.0"}
MMCV_22 = {**TORCH_NPU, "mmcv": "2.2.0", "mmcv._ext": ""}


def npu_call(dtype=torch.float32, heads=8, dim=32, levels=4, points=4) -> MSDAInputs:
    """A Deformable-DETR-like call (bs 2, 300 queries) on an NPU."""
    return MSDAInputs(
        device_type="npu",
        dtype=dtype,
        batch=2,
        num_keys=13294,
        num_heads=heads,
        head_dim=dim,
        num_levels=levels,
        num_queries=300,
        num_points=points,
        requires_grad=True,
    )


def auto_on(packages, **call) -> str:
    with assume_packages(packages):
        return select_impl("auto", npu_call(**call)).NAME


def test_npu_priority_order():
    assert auto_order("npu") == ["npu_vendor", "triton", "gather", "grid_sample"]


@pytest.mark.parametrize(
    ("packages", "call", "expected"),
    [
        (MX, {}, "npu_vendor"),
        ({**MX, **TRITON}, {}, "npu_vendor"),
        ({**MX, **TRITON}, dict(dtype=torch.bfloat16), "npu_vendor"),
        ({**MX, **TRITON}, dict(heads=16), "triton"),
        ({**MX, **TRITON}, dict(dim=36), "triton"),
        ({**MX, **TRITON}, dict(dim=264), "triton"),
        ({**MX, **TRITON}, dict(levels=5, points=13), "triton"),
        ({**MX, **TRITON}, dict(dtype=torch.float64), "gather"),
        (MX, dict(heads=16), "gather"),
        ({**TORCH_NPU, **TRITON}, {}, "triton"),
        (TRITON, {}, "triton"),
        ({}, {}, "gather"),
        ({"mx_driving": "7.1.0", **TRITON}, {}, "triton"),  # no torch_npu: no vendor path
        (MMCV_22, {}, "npu_vendor"),
        (MMCV_22, dict(dtype=torch.float16), "npu_vendor"),
        (MMCV_22, dict(dtype=torch.bfloat16), "gather"),
        (MMCV_22, dict(heads=2), "gather"),
        (MMCV_22, dict(points=2), "gather"),
        (MMCV_22, dict(dim=16), "gather"),
        ({**TORCH_NPU, "mmcv": "2.1.0", "mmcv._ext": ""}, {}, "gather"),
    ],
)
def test_auto_on_npu(packages, call, expected):
    assert auto_on(packages, **call) == expected


def test_vendor_route_prefers_mx_driving():
    with assume_packages({**MX, **MMCV_22}):
        assert vendor_route() == "mx_driving"
    with assume_packages(MMCV_22):
        assert vendor_route() == "mmcv"
    with assume_packages({**TORCH_NPU, "mmcv": "2.1.0", "mmcv._ext": ""}):
        assert vendor_route() is None


def test_vendor_limits_are_named():
    impl = get_impl("npu_vendor")
    with assume_packages(MX):
        reasons = impl.not_supported_reasons(npu_call(heads=9, dim=20, levels=4, points=17))
    assert any("num_heads 9 > 8" in r for r in reasons)
    assert any("head_dim 20 not a multiple of 8" in r for r in reasons)
    assert any("num_levels * num_points = 68 > 64" in r for r in reasons)
    with assume_packages({}):
        assert any("torch_npu" in r for r in impl.not_supported_reasons(npu_call()))


def test_npu_impls_never_take_other_devices():
    cpu_call = MSDAInputs("cpu", torch.float32, 2, 13294, 8, 32, 4, 300, 4, True)
    with assume_packages({**MX, **TRITON}):
        assert get_impl("npu_vendor").not_supported_reasons(cpu_call)
        assert select_impl("auto", npu_call()).NAME == "npu_vendor"
        assert "npu_vendor" not in auto_order("cpu") and "npu_vendor" not in auto_order("cuda")


def test_unlisted_where_packages_do_not_import():
    with assume_packages({}):
        listed = registry.msda_impls()
    assert "npu_vendor" not in listed and "triton" not in listed and "gather" in listed
    with assume_packages({**MX, **TRITON}):
        assert {"npu_vendor", "triton"} <= set(registry.msda_impls())


def test_selection_imports_nothing():
    before = set(sys.modules)
    auto_on({**MX, **TRITON}, heads=16)
    assert not {"torch_npu", "mx_driving"} & (set(sys.modules) - before)


def test_auto_logs_its_choice_once(monkeypatch, caplog):
    monkeypatch.setattr(registry, "_announced", set())
    with caplog.at_level(logging.INFO, logger="npudet"):
        for _ in range(3):
            assert auto_on({**MX, **TRITON}, dim=36) == "triton"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert "using 'triton'" in messages[0] and "npu_vendor: mx_driving: head_dim 36" in messages[0]
