"""Gradients that may be taken once, as ATen's ops without a second-order formula behave.

A backend whose backward is an op of its own (not differentiable) calls it through
``first_order``: with ``create_graph=True`` the gradients it returns carry a node whose
inputs are the real ones, and differentiating them raises ``derivative for <op> is not
implemented``. (``torch.autograd.function.once_differentiable`` hangs its error node on
detached copies instead, so ``torch.autograd.grad(..., allow_unused=True)`` of such a gradient
returns None without an error.)
"""

from __future__ import annotations

from typing import Callable, Tuple

import torch


class _FirstOrderOnly(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name: str, backward: Callable, *args):
        ctx.name = name
        return backward(*args)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"derivative for {ctx.name} is not implemented")


def first_order(name: str, backward: Callable[..., Tuple[torch.Tensor, ...]], *args):
    """``backward(*args)``; outside grad mode (the usual backward pass) a plain call."""
    if not torch.is_grad_enabled():
        return backward(*args)
    return _FirstOrderOnly.apply(name, backward, *args)
