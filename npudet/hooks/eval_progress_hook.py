"""A progress bar over the val / test batches."""

from __future__ import annotations

from typing import Any, Optional

from mmdet.registry import HOOKS
from mmengine.dist import is_main_process
from mmengine.hooks import Hook
from mmengine.utils import ProgressBar


@HOOKS.register_module()
class EvalProgressHook(Hook):
    """Draw mmengine's ``ProgressBar`` (count, rate, ETA) during evaluation."""

    priority = "BELOW_NORMAL"

    def __init__(self) -> None:
        self._bar: Optional[ProgressBar] = None

    def _start(self, dataloader: Any) -> None:
        self._bar = ProgressBar(len(dataloader)) if is_main_process() else None

    def _step(self) -> None:
        if self._bar is not None:
            self._bar.update()

    def _end(self) -> None:
        if self._bar is not None:
            self._bar.file.write("\n")
            self._bar = None

    def before_val_epoch(self, runner: Any) -> None:
        self._start(runner.val_dataloader)

    def before_test_epoch(self, runner: Any) -> None:
        self._start(runner.test_dataloader)

    def after_val_iter(self, runner: Any, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._step()

    def after_test_iter(self, runner: Any, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._step()

    def after_val_epoch(self, runner: Any, metrics=None) -> None:
        self._end()

    def after_test_epoch(self, runner: Any, metrics=None) -> None:
        self._end()
