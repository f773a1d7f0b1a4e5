"""Call plans: a steady-state MSDA call decides nothing, it looks its decision up.

The first call of a signature takes the whole path: ``validate_inputs`` (shapes, dtypes,
devices, the level tensors' values) and ``select_impl`` (``auto``'s walk of the priority
list, verification, determinism). Its outcome is kept as a ``Plan``: the implementation's
kernel bound to the signature (``MSDAImpl.bind``: options, launch plans). A later call
with the same signature builds one tuple, finds the plan and calls the kernel.

The signature is everything validation and selection read except the level tensors'
values: ``impl``; shape, dtype and device of all five inputs; whether a gradient can flow
(grad mode, requires_grad); the deterministic-algorithms flags. An input that differs
in any of these misses and takes the whole path, which refuses it with the usual error.
Only plain tensors use and make plans (``plannable``: not FakeTensors or other subclasses).
The level tensors' values are checked by ``inputs._check_levels`` on every call, as on the
whole path: the same tensors, unmodified (``_version``), are not read again; other tensors,
or the same after an in-place write, are read and checked (one host read, an error naming
the argument).

Plans are dropped (``clear``) when anything they were decided on changes: an
implementation registered, verification records reset or saved. Observers and
``torch.compile`` tracing never use plans.
"""

from __future__ import annotations

from typing import Callable, Dict, NamedTuple, Optional

import torch

from npudet.utils.torch_compat import is_compiling

from . import observe
from .inputs import _check_levels

Kernel = Callable[..., torch.Tensor]
# Distinct signatures kept; beyond it the oldest plan goes. A model has a handful per input
# size, but padded batches of varying image sizes bring a new num_keys nearly every step.
MAX_PLANS = 512


class Plan(NamedTuple):
    """A kernel bound to one call signature, and that signature's ``num_keys`` (what the
    level tensors' values are checked against)."""

    kernel: Kernel
    num_keys: int


_PLANS: Dict[tuple, Plan] = {}


def signature(
    impl: str,
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> tuple:
    """The key of a call's plan (module docstring). Raises AttributeError on a non-tensor."""
    return (
        impl,
        value.shape,
        value.dtype,
        value.device,
        value.requires_grad,
        spatial_shapes.shape,
        spatial_shapes.dtype,
        spatial_shapes.device,
        level_start_index.shape,
        level_start_index.dtype,
        level_start_index.device,
        sampling_locations.shape,
        sampling_locations.dtype,
        sampling_locations.device,
        sampling_locations.requires_grad,
        attention_weights.shape,
        attention_weights.dtype,
        attention_weights.device,
        attention_weights.requires_grad,
        torch.is_grad_enabled(),
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )


def lookup(
    impl: str,
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> Optional[Plan]:
    """The plan of this call's signature with its level tensors checked, or None (no plan
    yet, an observer active, tracing, or arguments that are not tensors / a str impl)."""
    if not plannable(impl, value):
        return None
    try:
        key = signature(
            impl, value, spatial_shapes, level_start_index, sampling_locations, attention_weights
        )
    except AttributeError:
        return None
    plan = _PLANS.get(key)
    if plan is not None:
        _check_levels(spatial_shapes, level_start_index, plan.num_keys)
    return plan


def plannable(impl: str, value: torch.Tensor) -> bool:
    """Whether a call may use or keep a plan: eager, no observer, a str ``impl`` and a plain
    tensor (not a FakeTensor or other subclass, whose calls a plan made of real tensors
    must not serve, nor make a plan that real tensors would reuse)."""
    return (
        not observe._ACTIVE
        and type(impl) is str
        and type(value) is torch.Tensor
        and not is_compiling()
    )


def store(key: tuple, kernel: Kernel, num_keys: int) -> Plan:
    """Keep ``kernel`` as the plan of signature ``key``."""
    if len(_PLANS) >= MAX_PLANS:
        del _PLANS[next(iter(_PLANS))]
    plan = _PLANS[key] = Plan(kernel, num_keys)
    return plan


def clear() -> None:
    """Drop every plan (what they were decided on has changed)."""
    _PLANS.clear()


def count() -> int:
    """How many plans are kept."""
    return len(_PLANS)
