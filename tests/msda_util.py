"""Shared input builders for the MSDA tests, and the device they run on.

``NPUDET_TEST_DEVICE`` (``cpu`` by default, or ``cuda`` / ``npu``) is where the parity,
gradcheck and validation tests run the implementations; the reference (``grid_sample``)
always runs on the CPU. Every (implementation, device) pair a test runs is recorded in
``EXERCISED``, which ``conftest.py`` prints at the end of the run.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import random
from typing import List, Sequence, Set, Tuple
from unittest import mock

import pytest
import torch

# npudet is imported inside the functions: conftest.py imports this module before it
# decides on TRITON_INTERPRET.

Inputs = Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

# Every implementation under test is compared with this one, run on the CPU
# (``npudet.ops.msda.verification.parity.REFERENCE``, not imported here: see above).
REFERENCE = "grid_sample"

DEVICE_ENV = "NPUDET_TEST_DEVICE"

EXERCISED: Set[Tuple[str, str]] = set()

# torch 2.1 (the oldest supported, run by test_oldest_torch.py): its dynamo cannot trace the
# op's input checks whole ("Sets with TorchVariable NYI": a set of devices; then the frozen
# dataclass MSDAInputs), so torch.compile(fullgraph=True) of the op raises there and a
# default torch.compile breaks the graph at the op. Seen on 2.1.2; 2.13.0 traces it whole.
TORCH_2_1 = torch.__version__.startswith("2.1.")
DYNAMO_2_1 = pytest.mark.xfail(
    TORCH_2_1,
    # torch._dynamo (a second to import) only where the mark applies.
    raises=importlib.import_module("torch._dynamo.exc").Unsupported if TORCH_2_1 else None,
    strict=True,
    reason="torch 2.1's dynamo cannot trace the op's input checks with fullgraph=True",
)


def requested_device() -> str:
    """The device type the device-parametrised tests run on (``NPUDET_TEST_DEVICE``)."""
    return os.environ.get(DEVICE_ENV, "cpu").strip().lower() or "cpu"


DEVICE = requested_device()

# The property tests' seed (test_msda_property.py): NPUDET_PROPERTY_SEED, else drawn per run
# and printed in the run's header (conftest.py) so a failure can be replayed.
PROPERTY_SEED = int(
    os.environ.get("NPUDET_PROPERTY_SEED") or random.SystemRandom().randrange(2**32)
)


def device_impls(device: str = DEVICE) -> List[str]:
    """Usable implementations that declare ``device`` (the reference included)."""
    from npudet.ops.msda import get_impl, msda_impls

    return [name for name in msda_impls() if device in get_impl(name).DEVICES]


def candidate_impls(
    dtype: torch.dtype = torch.float32,
    device: str = DEVICE,
    compiling: bool = False,
    variants: bool = False,
) -> list:
    """Usable implementations, other than the reference, that take ``dtype`` on ``device``
    (with ``compiling``: also inside ``torch.compile``, where some decline; with
    ``variants``: the experiment variants of ``msda_variants()`` too)."""
    from npudet.ops.msda import get_impl, msda_impls, msda_variants, validate_inputs

    info = validate_inputs(*random_inputs(dtype=dtype))
    info = dataclasses.replace(info, device_type=device)
    with mock.patch("npudet.utils.torch_compat.torch_is_compiling", return_value=compiling):
        return [
            name
            for name in msda_impls() + (msda_variants() if variants else [])
            if name != REFERENCE and not get_impl(name).not_supported_reasons(info)
        ]


def declined_reasons(impl: str, inputs: Sequence, device: str = DEVICE) -> List[str]:
    """``impl``'s own reasons for not taking ``inputs`` (CPU tensors) on ``device``."""
    from npudet.ops.msda import get_impl, validate_inputs

    info = validate_inputs(*inputs, check_values=False)
    return get_impl(impl).not_supported_reasons(dataclasses.replace(info, device_type=device))


def random_inputs(**case: object) -> Inputs:
    """``verification.parity.small_inputs(**case)`` drawn in float32 unless ``dtype`` says."""
    from npudet.ops.msda.verification.parity import small_inputs

    return small_inputs(**{"dtype": torch.float32, **case})


def to_device(inputs: Sequence, device: str = DEVICE) -> tuple:
    """``inputs`` on ``device`` (non-tensors, e.g. a list standing for a tensor, unchanged)."""
    return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in inputs)


def msda(*args, impl: str) -> torch.Tensor:
    """``multi_scale_deformable_attn(*args, impl=impl)``; records (impl, device) when it ran."""
    from npudet.ops import multi_scale_deformable_attn

    out = multi_scale_deformable_attn(*args, impl=impl)
    EXERCISED.add((impl, out.device.type))
    return out


def run(impl: str, inputs: Inputs, grad_seed: int = 1, device: str = "cpu"):
    """Output and (grad value, grad locations, grad weights) of one implementation on
    ``device``, returned on the CPU."""
    value, spatial, starts, loc, attn = to_device(inputs, device)
    leaves = [t.detach().clone().requires_grad_() for t in (value, loc, attn)]
    out = msda(leaves[0], spatial, starts, leaves[1], leaves[2], impl=impl)
    gen = torch.Generator().manual_seed(grad_seed)
    # Half-precision gradients are drawn in float32 and rounded: torch 2.1 draws float16 and
    # bfloat16 from another stream than float32, and the reference runs in float32.
    draw = out.dtype if out.dtype in (torch.float32, torch.float64) else torch.float32
    grad = torch.randn(out.shape, generator=gen, dtype=draw).to(out.dtype).to(device)
    grads = torch.autograd.grad(out, leaves, grad)
    return out.cpu(), tuple(g.cpu() for g in grads)


def reference(inputs: Inputs, grad_seed: int = 1):
    """``run`` of the reference implementation on the CPU."""
    return run(REFERENCE, inputs, grad_seed, device="cpu")
