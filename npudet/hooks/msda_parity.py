"""``MSDAParityHook``: every N iterations, the live MSDA kernels against a reference.

On a check iteration the inputs of every MSDA call of the live batch are copied (see
``msda_capture``). After the iteration each call is recomputed with the implementation
it ran with and with the reference (default ``grid_sample``) from the same detached
inputs, and both VJPs are taken with the same fixed random cotangent, so no training
graph is kept. Errors, per output and per gradient (value, sampling_locations,
attention_weights), as the parity engine measures them (``npudet.ops.msda.verification.parity``):
``abs`` = max |live - ref|, ``rel`` = abs / max(max |ref|, 1) (relative to the reference's
scale, absolute where the reference is below 1).
A call whose ``rel`` exceeds ``rel_threshold`` (or ``abs`` exceeds ``abs_threshold``) is
reported naming the layer; ``action='stop'`` raises ``MSDAParityError``. With
``MSDAProfilerHook`` also on, the input copies of a check iteration count as MSDA forward
time of that iteration; the recomputation is not timed (it runs after the profiler).
"""

from __future__ import annotations

from typing import Any, List, Optional

from mmdet.registry import HOOKS
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper

from npudet.ops.msda.observe import add_observer, remove_observer
from npudet.ops.msda.verification.parity import REFERENCE, CallParity, compare_call

from .hook_types import DataBatch, Outputs
from .msda_capture import MSDACapture

__all__ = ["CallParity", "MSDAParityError", "MSDAParityHook", "compare_call"]

ACTIONS = ("warn", "stop")


class MSDAParityError(RuntimeError):
    """A live MSDA implementation disagreed with the reference beyond the threshold."""


@HOOKS.register_module()
class MSDAParityHook(Hook):
    """Check the MSDA calls of every ``interval``-th training iteration against a reference.

    Args:
        interval: check every this many iterations.
        reference: implementation compared against.
        rel_threshold: largest allowed ``rel`` error (output or any gradient): abs error
            over max(max |reference|, 1).
        abs_threshold: largest allowed ``abs`` error; None for no absolute limit.
        action: ``"warn"`` (log a warning) or ``"stop"`` (raise ``MSDAParityError``).
        seed: seed of the cotangent.
    """

    # After MSDAProfilerHook (NORMAL, so the check is not in its timing) and before
    # LoggerHook (BELOW_NORMAL, so the scalars are logged with this iteration).
    priority = 55

    def __init__(
        self,
        interval: int = 500,
        reference: str = REFERENCE,
        rel_threshold: float = 1e-3,
        abs_threshold: Optional[float] = None,
        action: str = "warn",
        seed: int = 0,
    ) -> None:
        if action not in ACTIONS:
            raise ValueError(f"action: expected one of {list(ACTIONS)}, got {action!r}")
        if interval < 1:
            raise ValueError(f"interval: expected >= 1, got {interval}")
        self.interval = interval
        self.reference = reference
        self.rel_threshold = rel_threshold
        self.abs_threshold = abs_threshold
        self.action = action
        self.seed = seed
        self.capture = MSDACapture()
        self.results: List[CallParity] = []

    def _exceeds(self, result: CallParity) -> bool:
        if result.max_rel > self.rel_threshold:
            return True
        return self.abs_threshold is not None and result.max_abs > self.abs_threshold

    def before_train_iter(
        self, runner: Any, batch_idx: int, data_batch: Optional[Any] = None
    ) -> None:
        if self.every_n_train_iters(runner, self.interval):
            model = runner.model.module if is_model_wrapper(runner.model) else runner.model
            self.capture.attach(model)
            add_observer(self.capture)

    def after_train_iter(
        self, runner: Any, batch_idx: int, data_batch: DataBatch = None, outputs: Outputs = None
    ) -> None:
        if not self.every_n_train_iters(runner, self.interval):
            return
        remove_observer(self.capture)
        calls = self.capture.calls
        self.capture.detach()
        results = [
            CallParity(
                runner.iter + 1,
                layer,
                call.impl,
                self.reference,
                compare_call(call, self.reference, self.seed),
            )
            for layer, call in calls
        ]
        self.results.extend(results)
        if not results:
            runner.logger.warning(f"MSDA parity: no MSDA call in iteration {runner.iter + 1}")
            return
        runner.message_hub.update_scalar(
            "train/msda_parity_max_abs", max(r.max_abs for r in results)
        )
        runner.message_hub.update_scalar(
            "train/msda_parity_max_rel", max(r.max_rel for r in results)
        )
        bad = [r for r in results if self._exceeds(r)]
        runner.logger.info(
            f"MSDA parity at iteration {runner.iter + 1}: {len(results)} calls vs "
            f"{self.reference!r}, max abs {max(r.max_abs for r in results):.3g}, "
            f"max rel {max(r.max_rel for r in results):.3g}, {len(bad)} over threshold"
        )
        if bad:
            message = "; ".join(self._describe(r) for r in bad)
            if self.action == "stop":
                raise MSDAParityError(f"MSDA parity failed: {message}")
            runner.logger.warning(f"MSDA parity failed: {message}")

    def _describe(self, result: CallParity) -> str:
        worst = max(result.errors, key=lambda k: result.errors[k][1])
        abs_err, rel_err = result.errors[worst]
        limit = f"rel {self.rel_threshold:g}" + (
            f" / abs {self.abs_threshold:g}" if self.abs_threshold is not None else ""
        )
        return (
            f"layer {result.layer!r} (impl {result.impl!r} vs {result.reference!r}, "
            f"iteration {result.iteration}): worst {worst} abs {abs_err:.3g} rel "
            f"{rel_err:.3g} > {limit}"
        )

    def after_train(self, runner: Any) -> None:
        remove_observer(self.capture)
        self.capture.detach()
