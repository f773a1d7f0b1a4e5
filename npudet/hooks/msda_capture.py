"""Copies of the inputs of MSDA calls, each named after the module that made it.

Naming: while capturing, forward pre/post hooks on every module of the model keep a
stack of the module names whose ``forward`` is running; a call is named after the
innermost one (e.g. ``encoder.layers.0.self_attn``). This needs no knowledge of the
layer classes, so any module calling the op directly is named (the module hooks exist
only while capturing). A module calling the op more than once gets ``name#1``, ``name#2``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

import torch
from torch import nn

from npudet.ops.msda.observe import MSDACall, MSDAObserver, Run


class MSDACapture(MSDAObserver):
    """Records ``(layer name, detached copy of the call)`` for every call it sees."""

    def __init__(self) -> None:
        self.calls: List[Tuple[str, MSDACall]] = []
        self._stack: List[str] = []
        self._handles: List[Any] = []
        self._seen: Dict[str, int] = {}

    def attach(self, model: nn.Module) -> None:
        """Track which module of ``model`` is running (until ``detach``)."""
        for name, module in model.named_modules():
            label = name or type(model).__name__
            self._handles.append(module.register_forward_pre_hook(self._pusher(label)))
            self._handles.append(module.register_forward_hook(self._pop, always_call=True))

    def detach(self) -> None:
        """Remove the module hooks and forget the captured calls."""
        for handle in self._handles:
            handle.remove()
        self._handles, self._stack, self._seen, self.calls = [], [], {}, []

    def _pusher(self, label: str) -> Any:
        def push(module: nn.Module, args: Any) -> None:
            self._stack.append(label)

        return push

    def _pop(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._stack:
            self._stack.pop()

    def around(self, call: MSDACall, run: Run) -> torch.Tensor:
        name = self._stack[-1] if self._stack else "<no module>"
        count = self._seen[name] = self._seen.get(name, 0) + 1
        if count > 1:
            name = f"{name}#{count}"
        copies = {
            field: getattr(call, field).detach().clone()
            for field in (
                "value",
                "spatial_shapes",
                "level_start_index",
                "sampling_locations",
                "attention_weights",
            )
        }
        self.calls.append((name, call.with_inputs(**copies)))
        return run(call)
