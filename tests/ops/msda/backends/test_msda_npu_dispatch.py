"""Which implementation takes an NPU call: a pure function of the call and the packages.

No NPU here: calls are described by ``MSDAInputs(device_type="npu", ...)`` and the
packages that import are stated with ``assume_packages``; nothing is imported. The routes'
argument plumbing runs on CPU tensors against stand-ins for the vendor functions.
"""

from __future__ import annotations

import logging
import sys
import types

import pytest
import torch
from msda_util import random_inputs

from npudet.ops.msda import (
    MSDAInputs,
    auto,
    auto_order,
    get_impl,
    registry,
    select_impl,
    validate_inputs,
)
from npudet.ops.msda.backends.npu import ROUTES, VendorRoute, vendor_route
from npudet.utils.packages import assume_packages

TORCH_NPU = {"torch_npu": "2.6.0"}
MX = {**TORCH_NPU, "mx_driving": "7.1.0"}
TRITON = {"triton": "3.2.0"}
MMCV_22 = {**TORCH_NPU, "mmcv": "2.2.0", "mmcv._ext": ""}


def npu_call(dtype=torch.float32, heads=8, dim=32, levels=4, points=4, queries=300) -> MSDAInputs:
    """A Deformable-DETR-like call (bs 2, 300 queries by default) on an NPU."""
    return MSDAInputs(
        device_type="npu",
        dtype=dtype,
        batch=2,
        num_keys=13294,
        num_heads=heads,
        head_dim=dim,
        num_levels=levels,
        num_queries=queries,
        num_points=points,
        requires_grad=True,
    )


def auto_on(packages, **call) -> str:
    with assume_packages(packages):
        return select_impl("auto", npu_call(**call)).NAME


def test_npu_priority_order():
    assert auto_order("npu") == ["npu_vendor", "triton", "gather_det", "gather", "grid_sample"]


@pytest.mark.parametrize(
    ("packages", "call", "expected"),
    [
        (MX, {}, "npu_vendor"),
        ({**MX, **TRITON}, {}, "npu_vendor"),
        ({**MX, **TRITON}, dict(dtype=torch.bfloat16), "npu_vendor"),  # cast to float32
        ({**MX, **TRITON}, dict(dtype=torch.float16), "npu_vendor"),
        ({**MX, **TRITON}, dict(queries=1), "npu_vendor"),
        ({**MX, **TRITON}, dict(heads=16), "triton"),
        ({**MX, **TRITON}, dict(dim=36), "triton"),
        ({**MX, **TRITON}, dict(dim=264), "triton"),
        ({**MX, **TRITON}, dict(levels=5, points=13), "triton"),
        ({**MX, **TRITON}, dict(dtype=torch.float64), "gather_det"),
        (MX, dict(heads=16), "gather_det"),
        ({**TORCH_NPU, **TRITON}, {}, "triton"),
        (TRITON, {}, "triton"),
        ({}, {}, "gather_det"),
        ({"mx_driving": "7.1.0", **TRITON}, {}, "triton"),  # no torch_npu: no vendor path
        (MMCV_22, {}, "npu_vendor"),
        (MMCV_22, dict(dtype=torch.float16), "npu_vendor"),
        (MMCV_22, dict(dtype=torch.bfloat16), "npu_vendor"),  # cast to float32
        (MMCV_22, dict(queries=31), "gather_det"),
        (MMCV_22, dict(queries=500_000), "gather_det"),
        (MMCV_22, dict(levels=17), "gather_det"),
        (MMCV_22, dict(dim=40), "npu_vendor"),
        (MMCV_22, dict(dim=36), "gather_det"),
        (MMCV_22, dict(heads=2), "gather_det"),
        (MMCV_22, dict(points=2), "gather_det"),
        (MMCV_22, dict(dim=16), "gather_det"),
        ({**TORCH_NPU, "mmcv": "2.1.0", "mmcv._ext": ""}, {}, "gather_det"),
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
    monkeypatch.setattr(auto, "_announced", set())
    with caplog.at_level(logging.INFO, logger="npudet"):
        for _ in range(3):
            assert auto_on({**MX, **TRITON}, dim=36) == "triton"
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 1
    assert "using 'triton'" in messages[0] and "npu_vendor: mx_driving: head_dim 36" in messages[0]


def test_route_limits_match_the_shipped_packages():
    """Pinned to what the wheels and CANN's documentation state (see ``backends.npu``'s docstring).

    mx_driving 26.2.0.post2: op info float32 only; binding refuses head_dim > 256 and
    levels * points > 64; documented heads <= 8, head_dim % 8 == 0. mmcv >= 2.2: heads
    [4, 8], head_dim [32, 256], points [4, 8]; its aclnn kernel: head_dim % 8 == 0,
    32 <= num_queries < 500000, levels <= 16.
    """
    f32 = (torch.float32,)
    # VendorRoute's fields in order: kernel dtypes, heads, head_dim, head_dim multiple, points,
    # max levels, max levels x points, queries
    pinned = {
        "mx_driving": (f32, (1, 8), (1, 256), 8, (1, None), None, 64, (1, None)),
        "mmcv": (f32, (4, 8), (32, 256), 8, (4, 8), 16, None, (32, 499_999)),
    }
    # and no other: torch_npu exposes no MSDA op of its own
    assert ROUTES == {name: VendorRoute(name, *limits) for name, limits in pinned.items()}


@pytest.mark.parametrize(
    ("route", "call", "expected"),
    [
        ("mx_driving", dict(heads=8, dim=256, levels=16, points=4), []),
        ("mx_driving", dict(dim=264), ["head_dim 264 > 256"]),
        ("mx_driving", dict(levels=8, points=9), ["num_levels * num_points = 72 > 64"]),
        ("mmcv", dict(heads=4, dim=32, points=8, levels=16, queries=32), []),
        ("mmcv", dict(heads=3), ["num_heads 3 < 4"]),
        ("mmcv", dict(points=9), ["num_points 9 > 8"]),
        ("mmcv", dict(queries=499_999), []),
        ("mmcv", dict(queries=500_000), ["num_queries 500000 > 499999"]),
        ("mmcv", dict(levels=17), ["num_levels 17 > 16"]),
        ("mmcv", dict(dim=44), ["head_dim 44 not a multiple of 8"]),
    ],
)
def test_route_reasons_at_the_bounds(route, call, expected):
    assert ROUTES[route].reasons(npu_call(**call)) == [f"{route}: {r}" for r in expected]


class _StandIn:
    """A stand-in for a vendor module: records its arguments, computes with grid_sample."""

    def __init__(self):
        self.calls = []

    def __call__(self, value, shapes, starts, loc, attn, *rest):
        self.calls.append((value, shapes, starts, loc, attn, rest))
        return get_impl("grid_sample").forward(value, shapes.long(), starts.long(), loc, attn)


@pytest.fixture(params=["mx_driving", "mmcv"])
def vendor_stand_in(request, monkeypatch):
    """Route name and stand-in kernel; the route is chosen through assume_packages."""
    stand_in = _StandIn()
    if request.param == "mx_driving":
        module = types.ModuleType("mx_driving")
        module.multi_scale_deformable_attn = stand_in
        monkeypatch.setitem(sys.modules, "mx_driving", module)
        packages = MX
    else:
        module = types.ModuleType("mmcv.ops.multi_scale_deform_attn")
        module.MultiScaleDeformableAttnFunction = types.SimpleNamespace(apply=stand_in)
        for name in ("mmcv", "mmcv.ops"):  # stand-in parents: the real mmcv is not imported
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
        monkeypatch.setitem(sys.modules, module.__name__, module)
        packages = MMCV_22
    with assume_packages(packages):
        yield request.param, stand_in


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_forward_hands_the_kernel_float32_and_contiguous_int32(vendor_stand_in, dtype):
    """Plumbing only (CPU tensors, a stand-in kernel): dtypes, layout and gradients' way back."""
    route, stand_in = vendor_stand_in
    value, shapes, starts, loc, attn = random_inputs(dim=8, low=0.0, high=1.0)
    shapes = torch.cat((shapes, shapes)).t().contiguous().t()[: len(starts)]  # non-contiguous
    assert not shapes.is_contiguous() and shapes.dtype == torch.int64
    leaves = [t.to(dtype).requires_grad_() for t in (value, loc, attn)]
    out = get_impl("npu_vendor").forward(leaves[0], shapes, starts, leaves[1], leaves[2])
    (args,) = stand_in.calls
    for tensor in (args[0], args[3], args[4]):
        assert tensor.dtype == torch.float32 and tensor.is_contiguous()
    for tensor in (args[1], args[2]):
        assert tensor.dtype == torch.int32 and tensor.is_contiguous()
    assert args[5] == (() if route == "mx_driving" else (64,))
    assert out.dtype == dtype
    grads = torch.autograd.grad(out.float().sum(), leaves)
    assert [g.dtype for g in grads] == [dtype] * 3
    want = get_impl("grid_sample").forward(value, shapes, starts, loc, attn)
    tol = 1e-5 if dtype == torch.float32 else 5e-2
    torch.testing.assert_close(out.float(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dim", ["bs", "keys", "heads", "head_dim", "levels", "queries", "points"])
def test_empty_inputs_never_reach_the_vendor_kernel(vendor_stand_in, dim):
    _, stand_in = vendor_stand_in
    sizes = dict(batch=2, queries=5, heads=2, dim=8, points=2)
    inputs = list(random_inputs(**sizes))
    value, shapes, starts, loc, attn = inputs
    if dim == "keys":
        inputs[0] = value[:, :0]
    elif dim == "levels":
        inputs[1:] = [shapes[:0], starts[:0], loc[:, :, :, :0], attn[:, :, :, :0]]
    else:
        axis = {"bs": (0, 0, 0), "heads": (2, 2, 2), "head_dim": (3, None, None)}
        axis.update({"queries": (None, 1, 1), "points": (None, 4, 4)})
        for index, ax in zip((0, 3, 4), axis[dim]):
            if ax is not None:
                inputs[index] = inputs[index].narrow(ax, 0, 0)
    with pytest.raises(ValueError, match="empty"):
        validate_inputs(*inputs)
    with pytest.raises(ValueError, match="non-empty"):
        get_impl("npu_vendor").forward(*inputs)
    assert not stand_in.calls
