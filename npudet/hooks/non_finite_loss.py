"""``NonFiniteLossHook``: a NaN/Inf or diverged loss stops training, or skips the update,
before the step; NaN/Inf predictions stop it before the loss (and mmdet's matcher) sees them.

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

A finite loss more than ``divergence_factor`` times the run's first loss counts as diverged
(a blow-up to 1e10 is finite, and a checkpoint of its weights would rotate the last good
one out). The predictions of the detector's head (``bbox_head``) are checked as they are
made: with NaN boxes mmdet's Hungarian matcher dies with scipy's "cost matrix contains
invalid numeric entries" before any loss exists, so a non-finite prediction always stops.

Under distributed training the ranks agree (all-reduce of the flag), so all of them skip
or stop together.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.optim import OptimWrapperDict

from .atomic_checkpoint import recorded_checkpoint

ACTIONS = ("stop", "skip")


class NonFiniteLossError(RuntimeError):
    """Training stopped on a NaN/Inf or diverged loss (or NaN/Inf predictions), before the
    optimiser step."""


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
        divergence_factor: a loss above this many times the run's first loss is treated
            as non-finite; None turns the check off.
    """

    priority = "VERY_HIGH"

    def __init__(
        self,
        action: str = "stop",
        max_consecutive_skips: int = 10,
        divergence_factor: Optional[float] = 1e3,
    ) -> None:
        if action not in ACTIONS:
            raise ValueError(f"action: expected one of {list(ACTIONS)}, got {action!r}")
        if divergence_factor is not None and not divergence_factor > 1:
            raise ValueError(
                f"divergence_factor: expected a number > 1 or None, got {divergence_factor!r}"
            )
        self.action = action
        self.max_consecutive_skips = max_consecutive_skips
        self.divergence_factor = divergence_factor
        self.first_loss: Optional[float] = None
        self._handles: List[Any] = []
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
        self.first_loss = None
        head = getattr(model, "bbox_head", None)
        if isinstance(head, torch.nn.Module):
            self._handles = [head.register_forward_hook(self._check_predictions(runner))]

    def _check_predictions(self, runner: Any) -> Any:
        def check(module: torch.nn.Module, args: Any, outputs: Any) -> None:
            # Under torch.compile the check would be traced: a host sync, so a graph break
            # in every step; compiled runs keep the loss check only.
            if not module.training or torch.compiler.is_compiling():
                return
            tensors = [t for t in _tensors(outputs) if t.is_floating_point()]
            # -inf is a mask, not a fault: Grounding DINO's scores of tokens outside the prompt
            bad = any(bool((t.isnan() | t.isposinf()).any()) for t in tensors)
            device = tensors[0].device if tensors else torch.device("cpu")
            if _any_rank(bad, device):
                self._unhook()
                raise NonFiniteLossError(
                    f"non-finite predictions (NaN/Inf boxes or scores) from the "
                    f"{type(module).__name__} at {_where(runner)}, before the loss: "
                    f"{_stopped(runner)}"
                )

        return check

    def _guard(self, runner: Any, wrapper: Any, update_params: Any) -> Any:
        def guarded_update_params(loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            divergence = self._divergence(loss)
            finite = bool(torch.isfinite(loss).all())
            if not _any_rank(not finite or divergence is not None, loss.device):
                self._consecutive = 0
                return update_params(loss, *args, **kwargs)
            self._on_non_finite(runner, wrapper, loss, divergence)
            return None

        return guarded_update_params

    def _divergence(self, loss: torch.Tensor) -> Optional[str]:
        """How a finite ``loss`` exceeds ``divergence_factor`` times the run's first, or None
        (the first finite non-zero loss becomes the reference)."""
        if not bool(torch.isfinite(loss).all()) or self.divergence_factor is None:
            return None
        value = float(loss.detach().float().abs().max()) if loss.numel() else 0.0
        if self.first_loss is None:  # a zero loss is no scale to compare with: wait for one
            self.first_loss = value if value > 0 else None
            return None
        if value <= self.divergence_factor * self.first_loss:
            return None
        return (
            f"more than {self.divergence_factor:g} times the run's first loss "
            f"({self.first_loss:.4g}; lower the learning rate)"
        )

    def _bad_terms(self) -> Dict[str, float]:
        log_vars = self._log_vars or {}
        return {
            name: float(value.detach().float().mean())
            for name, value in log_vars.items()
            if isinstance(value, torch.Tensor) and not bool(torch.isfinite(value).all())
        }

    def _on_non_finite(
        self, runner: Any, wrapper: Any, loss: torch.Tensor, divergence: Optional[str]
    ) -> None:
        bad = self._bad_terms()
        value = float(loss.detach().float().mean()) if loss.numel() else math.nan
        if divergence is not None:
            message = f"diverged loss {value:.6g} at {_where(runner)}, {divergence}"
        else:  # this rank's loss, or (finite here) another rank's
            terms = ", ".join(f"{k}={v}" for k, v in bad.items()) or "none logged"
            message = f"non-finite loss {value:.6g} at {_where(runner)} (non-finite terms: {terms})"
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
        self._unhook()
        raise NonFiniteLossError(f"{message}. {_stopped(runner)}")

    def after_train(self, runner: Any) -> None:
        self._unhook()

    def _unhook(self) -> None:
        """Undo what ``before_train`` patched (also when the run stops: no after_train then)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        for obj in self._patched:
            for name in ("parse_losses", "update_params"):
                obj.__dict__.pop(name, None)
        self._patched = []


def _where(runner: Any) -> str:
    return f"iteration {runner.iter + 1}, epoch {runner.epoch + 1}"


def _stopped(runner: Any) -> str:
    checkpoint = recorded_checkpoint(runner.work_dir)
    return (
        "Stopped before the optimizer step: the weights are not updated and the last "
        f"checkpoint is {checkpoint or 'none (no checkpoint saved yet)'}"
    )


def _tensors(obj: Any) -> List[torch.Tensor]:
    """The tensors in ``obj`` (a tensor or nested tuples / lists / dicts of them)."""
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        obj = list(obj.values())
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    return []
