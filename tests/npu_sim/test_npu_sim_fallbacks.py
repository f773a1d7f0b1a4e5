"""torch_npu's CPU fallback on the simulated NPU: an op torch_npu has no NPU kernel for warns
with torch_npu's text once per op and is counted (``torch_npu._simulation.fallbacks()``); an
op with a kernel is neither."""

from __future__ import annotations

import warnings

import pytest
import torch

CAUTION = (
    "CAUTION: The operator '{}' is not currently supported on the NPU backend and will fall "
    "back to run on the CPU. This may have performance implications."
)


def _cautions(caught) -> list:
    return [str(w.message) for w in caught if str(w.message).startswith("CAUTION: The operator")]


def test_an_op_without_an_npu_kernel_warns_once_and_is_counted(simulated_npu):
    from torch_npu import _simulation

    x = torch.arange(12.0).reshape(3, 4).npu()
    _simulation.reset_fallbacks()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        values, _ = torch.mode(x, dim=1)  # aten::mode: no NPU kernel in torch_npu 2.13.0
        torch.mode(x, dim=1)
    assert values.device.type == "npu"
    assert _simulation.fallbacks() == {"aten::mode": 2}
    cautions = _cautions(caught)
    assert len(cautions) == 1 and cautions[0].startswith(CAUTION.format("aten::mode"))
    assert all(w.category is UserWarning for w in caught if str(w.message) in cautions)
    _simulation.reset_fallbacks()
    assert not _simulation.fallbacks()


def test_an_op_with_an_npu_kernel_is_not_reported(simulated_npu):
    from torch_npu import _simulation
    from torch_npu._simulation.cpu_fallback import npu_kernels

    assert "aten::add.Tensor" in npu_kernels()
    x = torch.ones(2, 3, device="npu", requires_grad=True)
    _simulation.reset_fallbacks()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # add.Tensor with a CPU scalar tensor first: the result stays on the npu
        y = torch.tensor(2.0) + x
        (y * x).relu().sum().backward()
    assert y.device.type == "npu" and x.grad.device.type == "npu"
    assert not _cautions(caught)
    assert not _simulation.fallbacks()


def test_an_op_with_an_npu_kernel_still_refuses_tensors_of_another_device(simulated_npu):
    """add.Tensor runs through the CPU fallback as a whole, which would take any device: it
    refuses what the composite kernel (TensorIterator) refused, and takes CPU scalars and CPU
    index lists."""
    x = torch.ones(3, 2, device="npu")
    for other in (torch.ones(2), torch.ones(2, device="npu:1")):
        with pytest.raises(RuntimeError, match="Expected all tensors to be on the same device"):
            x + other
    assert (torch.tensor(2.0) * x).device.type == "npu"
    assert x[:, [1, 0]].device.type == "npu"


# One training step of the small Deformable DETR per MSDA implementation: the ops a real NPU
# would run through torch_npu's CPU fallback (ops/npu_sim/README.md lists them).
STEP_FALLBACKS = {
    "npu_vendor": {},
    "grid_sample": {},
    "gather": {"aten::_embedding_bag_backward": 6},
    "gather_det": {},
}


@pytest.mark.slow
@pytest.mark.parametrize("impl", sorted(STEP_FALLBACKS))
def test_cpu_fallbacks_of_a_training_step(simulated_npu, impl):
    from mmengine.optim import build_optim_wrapper
    from plugin_util import build_model, fake_batch, loss_and_grads, small_cfg
    from torch_npu import _simulation

    cfg = small_cfg(impl=impl)
    model = build_model(cfg).npu()
    optimizer = build_optim_wrapper(model, cfg.optim_wrapper)
    _simulation.reset_fallbacks()
    loss_and_grads(model, fake_batch())
    optimizer.step()
    assert dict(_simulation.fallbacks()) == STEP_FALLBACKS[impl]
