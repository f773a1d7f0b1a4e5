"""The hook that profiles training iterations inside :func:`.scopes.mark_scopes`' scopes."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from mmengine.hooks import Hook
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from npudet.hooks.hook_types import DataBatch, Outputs

from .scopes import mark_scopes
from .split import SCOPE, attribute


class OpProfileHook(Hook):
    """Profiles every training iteration from ``warmup`` on (torch.profiler, CPU activity)
    inside :func:`mark_scopes`' scopes and one ``iteration`` scope (``before_train_iter`` to
    ``after_train_iter``: the batch's loading is outside); after training, ``splits`` holds
    :func:`.split.attribute`'s split of each profiled iteration."""

    # first in before_train_iter and after_train_iter, as the iteration benchmark's timer
    priority = "VERY_HIGH"

    def __init__(self, warmup: int) -> None:
        self.warmup = warmup
        self.splits: List[Dict[str, Any]] = []
        self._profiler: Optional[profile] = None
        self._iteration: Optional[record_function] = None
        self._undo: Callable[[], None] = lambda: None

    def before_train(self, runner: Any) -> None:
        model = runner.model.module if hasattr(runner.model, "module") else runner.model
        self._undo = mark_scopes(model, runner.optim_wrapper)

    def before_train_iter(self, runner: Any, batch_idx: int, data_batch: DataBatch = None) -> None:
        if runner.iter < self.warmup:
            return
        if self._profiler is None:
            self._profiler = profile(activities=[ProfilerActivity.CPU])
            self._profiler.start()
        self._iteration = record_function(SCOPE + "iteration")
        self._iteration.__enter__()

    def after_train_iter(
        self, runner: Any, batch_idx: int, data_batch: DataBatch = None, outputs: Outputs = None
    ) -> None:
        if self._iteration is not None:
            self._iteration.__exit__(None, None, None)
            self._iteration = None

    def after_train(self, runner: Any) -> None:
        self._undo()
        if self._profiler is not None:
            self._profiler.stop()
            self.splits = attribute(list(self._profiler.events()))
            self._profiler = None
