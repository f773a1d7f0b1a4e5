"""``MSDAProfilerHook``: time spent in MSDA per training iteration.

Per iteration it measures, over all MSDA calls of the model (at the op level, so any
layer or model that calls ``npudet.ops.multi_scale_deformable_attn`` is covered):
forward ms, backward ms, their share of the iteration (``before_train_iter`` to
``after_train_iter``: preprocessing, forward, backward and optimiser step; data loading
excluded) and the number of calls. The numbers go to the message hub as
``train/msda_fwd_ms``, ``train/msda_bwd_ms``, ``train/msda_share`` (percent) and
``train/msda_calls``, so the LoggerHook prints them and sends them to the visualizer's
backends (local / TensorBoard). ``after_train`` logs the means and writes them to
``msda_profile.json`` in the log dir.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, List, Optional

import torch
from mmdet.registry import HOOKS
from mmengine.dist import is_main_process
from mmengine.hooks import Hook

from npudet.ops.msda.observe import add_observer, remove_observer

from .hook_types import DataBatch, Outputs
from .msda_timer import MSDATimer


@HOOKS.register_module()
class MSDAProfilerHook(Hook):
    """Per-iteration MSDA forward/backward time, share and calls.

    Args:
        sync: synchronise the device at each timing mark (needed for device times on
            CUDA/NPU; no effect on CPU).
        warmup_iters: iterations left out of the end-of-training summary (first-call
            compilation, allocator warm-up); none are left out if training is shorter.
    """

    priority = "NORMAL"

    def __init__(self, sync: bool = True, warmup_iters: int = 1) -> None:
        self.timer = MSDATimer(sync=sync)
        self.warmup_iters = warmup_iters
        self.records: List[Dict[str, float]] = []
        self._iter_start = 0.0

    def _device(self, runner: Any) -> torch.device:
        param = next(runner.model.parameters(), None)
        return param.device if param is not None else torch.device("cpu")

    def before_train(self, runner: Any) -> None:
        self.records = []

    def before_train_iter(
        self, runner: Any, batch_idx: int, data_batch: Optional[Any] = None
    ) -> None:
        self.timer.reset()
        add_observer(self.timer)
        self._iter_start = self.timer.now(self._device(runner))

    def after_train_iter(
        self, runner: Any, batch_idx: int, data_batch: DataBatch = None, outputs: Outputs = None
    ) -> None:
        iter_s = self.timer.now(self._device(runner)) - self._iter_start
        remove_observer(self.timer)
        msda_s = self.timer.forward_s + self.timer.backward_s
        record = {
            "fwd_ms": 1e3 * self.timer.forward_s,
            "bwd_ms": 1e3 * self.timer.backward_s,
            "iter_ms": 1e3 * iter_s,
            "share": 100.0 * msda_s / iter_s if iter_s > 0 else 0.0,
            "calls": float(self.timer.calls),
        }
        self.records.append(record)
        hub = runner.message_hub
        for key in ("fwd_ms", "bwd_ms", "share", "calls"):
            hub.update_scalar(f"train/msda_{key}", record[key])

    def summary(self) -> Dict[str, float]:
        """Means over the recorded iterations (after warm-up), plus ``iters``."""
        kept = self.records[self.warmup_iters :] or self.records
        if not kept:
            return {"iters": 0}
        means = {key: sum(r[key] for r in kept) / len(kept) for key in kept[0]}
        return {**means, "iters": len(kept)}

    def after_train(self, runner: Any) -> None:
        remove_observer(self.timer)
        result = self.summary()
        if not result["iters"]:
            return
        runner.logger.info(
            "MSDA profile over %d iterations: forward %.2f ms, backward %.2f ms, "
            "%.1f%% of %.1f ms per iteration, %.1f calls per iteration",
            result["iters"],
            result["fwd_ms"],
            result["bwd_ms"],
            result["share"],
            result["iter_ms"],
            result["calls"],
        )
        if is_main_process():
            with open(os.path.join(runner.log_dir, "msda_profile.json"), "w") as f:
                json.dump(result, f, indent=2)
