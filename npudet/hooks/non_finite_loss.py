"""``NonFiniteLossHook``: a NaN/Inf loss stops training, or skips the update, before the step.

The check has to happen between the loss and the optimiser step, which no hook stage
sits at, so in ``before_train`` the hook wraps two methods of the runner's own objects:
the model's ``parse_losses`` (to know which loss terms are non-finite) and the optim
wrapper's ``update_params`` (to act before ``backward``/``step``). Nothing is changed in
configs or classes, so it works with any optim wrapper (AMP included) and any model.

- ``action='stop'``: raises ``NonFiniteLossError`` naming the iteration, the non-finite
  terms and the last checkpoint; the weights are not updated and no later checkpoint is
  written, so the last one saved by ``CheckpointHook`` stays the last good one.
- ``action='skip'``: no backward, no step, gradients zeroed, the non-finite terms left out
  of that iteration's log; after ``max_consecutive_skips`` skips in a row it stops.

Under distributed training the ranks agree (all-reduce of the flag), so all of them skip
or stop together.
"""

from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapperDict

ACTIONS = ("stop", "skip")


class NonFiniteLossError(RuntimeError):
    """Training stopped on a NaN/Inf loss, before the optimiser step."""


def _any_rank(flag: bool, device: torch.device) -> bool:
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return flag
    tensor = torch.tensor([float(flag)], device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return bool(tensor.item())


@HOOKS.register_module()
class NonFiniteLossHook(Hook):
    """Stop or skip on a non-finite loss, before it reaches the weights.

    Args:
        action: ``"stop"`` (raise) or ``"skip"`` (drop the update).
        max_consecutive_skips: with ``"skip"``, stop after this many skips in a row.
    """

    priority = "VERY_HIGH"

    def __init__(self, action: str = "stop", max_consecutive_skips: int = 10) -> None:
        if action not in ACTIONS:
            raise ValueError(f"action: expected one of {list(ACTIONS)}, got {action!r}")
        self.action = action
        self.max_consecutive_skips = max_consecutive_skips
        self.skipped = 0
        self._consecutive = 0
        self._log_vars: Optional[Dict[str, torch.Tensor]] = None
        self._patched: List[Any] = []

    def before_train(self, runner: Any) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model
        parse_losses = model.parse_losses

        def guarded_parse_losses(losses: Dict[str, Any]) -> Any:
            loss, log_vars = parse_losses(losses)
            self._log_vars = log_vars
            return loss, log_vars

        model.parse_losses = guarded_parse_losses
        wrappers = runner.optim_wrapper
        wrappers = wrappers.values() if isinstance(wrappers, OptimWrapperDict) else [wrappers]
        for wrapper in wrappers:
            wrapper.update_params = self._guard(runner, wrapper, wrapper.update_params)
        self._patched = [model, *wrappers]

    def _guard(self, runner: Any, wrapper: Any, update_params: Any) -> Any:
        def guarded_update_params(loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            if not _any_rank(not bool(torch.isfinite(loss).all()), loss.device):
                self._consecutive = 0
                return update_params(loss, *args, **kwargs)
            self._on_non_finite(runner, wrapper, loss)
            return None

        return guarded_update_params

    def _bad_terms(self) -> Dict[str, float]:
        log_vars = self._log_vars or {}
        return {
            name: float(value.detach().float().mean())
            for name, value in log_vars.items()
            if isinstance(value, torch.Tensor) and not bool(torch.isfinite(value).all())
        }

    def _on_non_finite(self, runner: Any, wrapper: Any, loss: torch.Tensor) -> None:
        bad = self._bad_terms()
        terms = ", ".join(f"{k}={v}" for k, v in bad.items()) or "none logged"
        value = float(loss.detach().float().mean()) if loss.numel() else math.nan
        where = f"iteration {runner.iter + 1}, epoch {runner.epoch + 1}"
        message = f"non-finite loss {value} at {where} (non-finite terms: {terms})"
        checkpoint = _last_checkpoint(runner.work_dir)
        if self.action == "skip" and self._consecutive < self.max_consecutive_skips:
            wrapper.zero_grad()
            self.skipped += 1
            self._consecutive += 1
            for name in bad:
                self._log_vars.pop(name, None)  # type: ignore[union-attr]
            runner.message_hub.update_scalar("train/nonfinite_skips", float(self.skipped))
            runner.logger.warning(f"{message}; update skipped ({self.skipped} so far)")
            return
        if self.action == "skip":
            message += f"; {self._consecutive} consecutive updates skipped before this one"
        raise NonFiniteLossError(
            f"{message}. Stopped before the optimizer step: the weights are not updated "
            f"and the last checkpoint is {checkpoint or 'none (no checkpoint saved yet)'}"
        )

    def after_train(self, runner: Any) -> None:
        for obj in self._patched:
            for name in ("parse_losses", "update_params"):
                obj.__dict__.pop(name, None)
        self._patched = []


def _last_checkpoint(work_dir: str) -> Optional[str]:
    """The path CheckpointHook recorded in ``work_dir/last_checkpoint``, if any."""
    record = os.path.join(work_dir, "last_checkpoint")
    if not os.path.exists(record):
        return None
    with open(record) as f:
        return f.read().strip() or None
