"""Timing of MSDA forward and backward at the op level (an ``MSDAObserver``).

Forward: wall time of the op call. Backward: from the moment the output's gradient
arrives (an identity autograd function on the output) until the gradients of all the
inputs that need one have been produced (identity functions on those inputs). On
accelerators each mark synchronises the device first, so the times are device times.
Recomputation under activation checkpointing counts as another forward.
"""

from __future__ import annotations

import time
from typing import Any, Optional, Tuple

import torch

from npudet.ops.msda.observe import MSDACall, MSDAObserver, Run

_GRAD_INPUTS = ("value", "sampling_locations", "attention_weights")


def synchronize(device: torch.device) -> None:
    """Wait for the queued work of ``device`` (no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":
        torch.npu.synchronize(device)  # type: ignore[attr-defined]


class _Pending:
    """Backward marks of one call: the time the output's gradient arrived."""

    def __init__(self, timer: MSDATimer, device: torch.device) -> None:
        self.timer, self.device = timer, device
        self.start: Optional[float] = None

    def mark_start(self) -> None:
        self.start = self.timer.now(self.device)

    def mark_end(self) -> None:
        if self.start is not None:
            self.timer.backward_s += self.timer.now(self.device) - self.start


class _OnOutputGrad(torch.autograd.Function):
    """Identity; its backward runs when the op's output gradient has arrived."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, pending: _Pending) -> torch.Tensor:
        ctx.pending = pending
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], None]:
        ctx.pending.mark_start()
        return grad, None


class _OnInputGrads(torch.autograd.Function):
    """Identity on the three differentiable inputs; its backward runs once all their
    gradients have been produced."""

    @staticmethod
    def forward(ctx: Any, pending: _Pending, *inputs: torch.Tensor) -> Tuple[torch.Tensor, ...]:
        ctx.pending = pending
        outs = tuple(t.view_as(t) for t in inputs)
        ctx.mark_non_differentiable(*(o for o, t in zip(outs, inputs) if not t.requires_grad))
        return outs

    @staticmethod
    def backward(ctx: Any, *grads: Optional[torch.Tensor]) -> Tuple[Optional[torch.Tensor], ...]:
        ctx.pending.mark_end()
        return (None, *grads)


class MSDATimer(MSDAObserver):
    """Accumulates MSDA forward/backward seconds and the number of calls until ``reset``."""

    def __init__(self, sync: bool = True) -> None:
        self.sync = sync
        self.reset()

    def reset(self) -> None:
        """Zero the totals (``forward_s``, ``backward_s``, ``calls``)."""
        self.forward_s = 0.0
        self.backward_s = 0.0
        self.calls = 0

    def now(self, device: torch.device) -> float:
        """``time.perf_counter()`` after the device's queued work when ``sync``."""
        if self.sync:
            synchronize(device)
        return time.perf_counter()

    def around(self, call: MSDACall, run: Run) -> torch.Tensor:
        device = call.value.device
        inputs = [getattr(call, name) for name in _GRAD_INPUTS]
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in inputs)
        pending = _Pending(self, device)
        if needs_grad:
            call = call.with_inputs(
                **dict(zip(_GRAD_INPUTS, _OnInputGrads.apply(pending, *inputs)))
            )
        start = self.now(device)
        out = run(call)
        self.forward_s += self.now(device) - start
        self.calls += 1
        return _OnOutputGrad.apply(out, pending) if needs_grad else out
