"""Observers of MSDA calls: profiling and parity checks without touching any layer.

An observer sees every ``multi_scale_deformable_attn`` call while it is active and runs
*around* it: it gets the call (inputs plus the resolved implementation name) and a
``run`` function, and returns the output. It may time the call, wrap the inputs or the
output (e.g. identity autograd functions to time the backward), or keep copies of the
inputs. With no observer active the op only reads one empty list (zero cost), and under
``torch.compile`` observers are bypassed.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace
from typing import Callable, Iterator, List

import torch


@dataclass(frozen=True)
class MSDACall:
    """One MSDA call: the five inputs of the op contract and the implementation chosen.

    Shapes: value (bs, keys, heads, D); spatial_shapes (L, 2); level_start_index (L,);
    sampling_locations (bs, q, heads, L, P, 2); attention_weights (bs, q, heads, L, P).
    """

    impl: str
    value: torch.Tensor
    spatial_shapes: torch.Tensor
    level_start_index: torch.Tensor
    sampling_locations: torch.Tensor
    attention_weights: torch.Tensor

    def tensors(self) -> tuple:
        """The five inputs in the op's argument order."""
        return (
            self.value,
            self.spatial_shapes,
            self.level_start_index,
            self.sampling_locations,
            self.attention_weights,
        )

    def with_inputs(self, **tensors: torch.Tensor) -> MSDACall:
        """A copy with some inputs replaced (same names as the fields)."""
        return replace(self, **tensors)


Run = Callable[[MSDACall], torch.Tensor]


class MSDAObserver:
    """Base class: override ``around``; the default just runs the call."""

    def around(self, call: MSDACall, run: Run) -> torch.Tensor:
        """Run ``call`` through ``run`` and return its (bs, q, heads * D) output."""
        return run(call)


_ACTIVE: List[MSDAObserver] = []


def active_observers() -> List[MSDAObserver]:
    """The observers now active, outermost first (a copy)."""
    return list(_ACTIVE)


def add_observer(observer: MSDAObserver) -> None:
    """Activate ``observer`` (innermost of those active); adding it twice is a no-op."""
    if observer not in _ACTIVE:
        _ACTIVE.append(observer)


def remove_observer(observer: MSDAObserver) -> None:
    """Deactivate ``observer`` if it is active."""
    if observer in _ACTIVE:
        _ACTIVE.remove(observer)


@contextlib.contextmanager
def observing(observer: MSDAObserver) -> Iterator[MSDAObserver]:
    """Activate ``observer`` within the block."""
    add_observer(observer)
    try:
        yield observer
    finally:
        remove_observer(observer)


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """No observer sees the calls made within the block (e.g. an observer's own checks)."""
    saved = list(_ACTIVE)
    _ACTIVE.clear()
    try:
        yield
    finally:
        _ACTIVE[:] = saved


def run_observed(call: MSDACall, run: Run) -> torch.Tensor:
    """Run ``call`` through every active observer, outermost first, then ``run``."""
    chain = run
    for observer in reversed(list(_ACTIVE)):
        chain = _bind(observer, chain)
    return chain(call)


def _bind(observer: MSDAObserver, inner: Run) -> Run:
    return lambda call: observer.around(call, inner)
