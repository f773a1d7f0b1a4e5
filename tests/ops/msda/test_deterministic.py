"""Deterministic mode (``torch.use_deterministic_algorithms(True)``, what mmengine's
``randomness=dict(deterministic=True)`` sets): ``auto`` takes only implementations that
declare a deterministic backward, a named nondeterministic one is refused, the declared
ones give bitwise-identical gradients run to run, and two short trainings give identical
losses."""

from __future__ import annotations

import pytest
import torch
from mmengine.config import Config
from train_util import train_losses

from npudet.engine.preflight import PreflightError, check_msda_deterministic
from npudet.ops import msda_impls, multi_scale_deformable_attn
from npudet.ops.msda import MSDAInputs, auto, registry
from npudet.ops.msda.backends import gather_det
from npudet.ops.msda.inputs import validate_inputs
from npudet.utils.packages import assume_packages

# The packages of an Ascend machine with DrivingSDK (npu_vendor usable), described, not imported.
ASCEND = {"torch_npu": "2.6.0", "mx_driving": "7.1.0", "triton": "3.2.0"}


@pytest.fixture
def deterministic():
    """torch.use_deterministic_algorithms(True) for one test, then off again."""
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def _inputs(bs=2, heads=4, dim=16, queries=300, points=4, seed=0, grad=True):
    """A call big enough that the CPU kernel splits work (and batch entries) across threads."""
    gen = torch.Generator().manual_seed(seed)
    shapes = torch.tensor([[24, 32], [12, 16], [6, 8]])
    starts = torch.tensor([0, 24 * 32, 24 * 32 + 12 * 16])
    keys = int((shapes[:, 0] * shapes[:, 1]).sum())
    value = torch.randn(bs, keys, heads, dim, generator=gen)
    loc = torch.rand(bs, queries, heads, 3, points, 2, generator=gen) * 1.2 - 0.1
    attn = torch.rand(bs, queries, heads, 3, points, generator=gen)
    tensors = [value, loc, attn]
    if grad:
        tensors = [t.requires_grad_() for t in tensors]
    return tensors[0], shapes, starts, tensors[1], tensors[2]


def _grads(impl):
    value, shapes, starts, loc, attn = _inputs()
    out = multi_scale_deformable_attn(value, shapes, starts, loc, attn, impl=impl)
    grad_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    return [out.detach(), *torch.autograd.grad(out, (value, loc, attn), grad_out)]


@pytest.mark.parametrize("impl", ["cpu", "cpu_owner", "gather", "gather_det", "grid_sample"])
def test_declared_deterministic_backward_is_bitwise_reproducible(impl, deterministic):
    if impl not in msda_impls() + registry.msda_variants():
        pytest.fail(f"{impl} unavailable: {registry.get_impl(impl).unavailable_reasons()}")
    assert "cpu" in registry.get_impl(impl).DETERMINISTIC
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the parallel reductions, at a fixed thread count
    try:
        first, second = _grads(impl), _grads(impl)
    finally:
        torch.set_num_threads(threads)
    for a, b, name in zip(first, second, ("output", "value", "locations", "weights")):
        assert torch.equal(a, b), f"{impl}: {name} differs between two identical runs"


def test_declarations():
    assert registry.get_impl("cpu_atomic").DETERMINISTIC == ()
    assert registry.get_impl("triton").DETERMINISTIC == ()
    assert registry.get_impl("grid_sample").DETERMINISTIC == ("cpu",)
    assert registry.get_impl("gather_det").DETERMINISTIC == ("cpu", "cuda", "npu")
    assert "npu" not in registry.get_impl("npu_vendor").DETERMINISTIC


def test_gather_det_backward_in_chunks_is_the_same_sum(monkeypatch):
    """Contributions added a few bag columns at a time (a large call) give the gradients of
    one pass, to round-off (float64)."""
    value, shapes, starts, loc, attn = _inputs(queries=40)
    tensors = [t.detach().double().requires_grad_() for t in (value, loc, attn)]

    def grads():
        out = multi_scale_deformable_attn(
            tensors[0], shapes, starts, tensors[1], tensors[2], impl="gather_det"
        )
        return torch.autograd.grad(out.square().sum(), tensors)

    whole = grads()
    monkeypatch.setattr(gather_det, "CHUNK_ELEMENTS", 1)  # one bag column per index_put_
    for a, b in zip(whole, grads()):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_auto_on_npu_takes_gather_det_in_deterministic_mode():
    npu_call = MSDAInputs("npu", torch.float32, 2, 13294, 8, 32, 4, 300, 4, True)
    with assume_packages(ASCEND):
        assert auto.select_impl("auto", npu_call).NAME == "npu_vendor"
        torch.use_deterministic_algorithms(True)
        try:
            assert auto.select_impl("auto", npu_call).NAME == "gather_det"
        finally:
            torch.use_deterministic_algorithms(False)


def _training_cfg(deterministic=True, **msda) -> Config:
    return Config(dict(model=dict(msda=msda), randomness=dict(seed=0, deterministic=deterministic)))


def test_preflight_refuses_a_nondeterministic_impl_in_one_line():
    with assume_packages(ASCEND):
        with pytest.raises(PreflightError) as err:
            check_msda_deterministic(_training_cfg(impl="npu_vendor"), device="npu")
    assert str(err.value) == (
        "model.msda.impl: MSDA implementation 'npu_vendor' has no deterministic backward on "
        "'npu' and randomness.deterministic=True is set; deterministic on 'npu': "
        "['auto', 'gather_det']"
    )
    with pytest.raises(PreflightError, match=r"^model.msda.encoder: .*'cpu_atomic'.*'gather_det'"):
        check_msda_deterministic(_training_cfg(impl="cpu", encoder="cpu_atomic"), device="cpu")
    # auto, a deterministic choice, or deterministic mode off: nothing to refuse
    check_msda_deterministic(_training_cfg(impl="auto"), device="npu")
    check_msda_deterministic(_training_cfg(impl="gather_det"), device="npu")
    check_msda_deterministic(_training_cfg(False, impl="cpu_atomic"), device="cpu")


def test_auto_skips_nondeterministic(deterministic, monkeypatch):
    value, shapes, starts, loc, attn = _inputs(queries=4)
    inputs = validate_inputs(value, shapes, starts, loc, attn)
    monkeypatch.setitem(auto.AUTO_PRIORITY, "cpu", ["triton", "gather"])
    assert auto.select_impl("auto", inputs).NAME == "gather"
    # Only the nondeterministic one left: the error says why it was passed over.
    monkeypatch.setitem(auto.AUTO_PRIORITY, "cpu", ["triton"])
    with pytest.raises(ValueError, match="triton: .*backward not deterministic on cpu"):
        auto.select_impl("auto", inputs)
    # No gradient wanted: nothing to be nondeterministic about.
    with torch.no_grad():
        assert auto.select_impl("triton", inputs).NAME == "triton"


def test_named_nondeterministic_impl_is_refused(deterministic):
    value, shapes, starts, loc, attn = _inputs(queries=4)
    with pytest.raises(RuntimeError, match=r"impl='triton': backward not deterministic on cpu"):
        multi_scale_deformable_attn(value, shapes, starts, loc, attn, impl="triton")


def test_named_nondeterministic_impl_warns_under_warn_only():
    value, shapes, starts, loc, attn = _inputs(queries=4)
    inputs = validate_inputs(value, shapes, starts, loc, attn)
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with pytest.warns(UserWarning, match="backward not deterministic"):
            assert auto.select_impl("cpu_atomic", inputs).NAME == "cpu_atomic"
    finally:
        torch.use_deterministic_algorithms(False)


def test_two_deterministic_trainings_give_identical_losses(tiny_shapes):
    try:
        first, _ = train_losses(tiny_shapes, "auto", 3, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
        second, _ = train_losses(tiny_shapes, "auto", 3, deterministic=True)
    finally:
        torch.use_deterministic_algorithms(False)
    assert first == second
    assert len(set(first)) == 3  # the model really trained (losses move)
