"""``TimeSplitHook``: where each training iteration's wall time goes.

Per iteration (data loading before it included), in ms:

- ``data``: loading the batch (between iterations) and the model's data preprocessor;
- ``backbone``: backbone + neck, forward (module hooks) and backward (from the first
  gradient reaching a neck output to the end of ``backward()``: autograd runs nodes in
  reverse creation order, so the image features' backward comes last and in one piece);
- ``msda_fwd`` / ``msda_bwd``: inside the sampling op (:class:`~npudet.hooks.msda_timer.MSDATimer`);
- ``loss_assigner``: the head's ``loss_by_feat`` (Hungarian matching and the losses),
  forward;
- ``transformer_rest``: the rest of forward + backward (encoder/decoder/head layers around
  the op, losses' backward);
- ``optimizer``: gradient clipping, ``step`` and ``zero_grad``;
- ``other``: the iteration's remainder (loss parsing, other hooks' ``before_train_iter``).

Besides the wall time ``iter_ms``, ``iter_cpu_ms`` is the process's CPU time over the
iteration. The op timer sees npudet's op through an observer; a stock (mmcv) model routes mmcv's
sampling function through the same timer (:func:`time_mmcv_sampling`).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Dict, List, Optional

import torch
from mmengine.hooks import Hook

from npudet.hooks.hook_types import DataBatch, Outputs
from npudet.hooks.msda_timer import MSDATimer
from npudet.ops.msda.observe import MSDACall, add_observer, remove_observer

PHASES = (
    "data",
    "backbone",
    "msda_fwd",
    "msda_bwd",
    "loss_assigner",
    "transformer_rest",
    "optimizer",
    "other",
)
# the head method whose forward counts as loss/assigner: mmdet's DETR heads, npudet's BEV head
LOSS_METHODS = ("loss_by_feat", "loss_by_feat_single")


class _Span:
    """Accumulated seconds of a region entered and left by hooks (``enter`` / ``leave``)."""

    def __init__(self) -> None:
        self.total = 0.0
        self.last_end = 0.0
        self._start: Optional[float] = None

    def enter(self, *_: Any) -> None:
        self._start = time.perf_counter()

    def leave(self, *_: Any) -> None:
        if self._start is not None:
            self.last_end = time.perf_counter()
            self.total += self.last_end - self._start
            self._start = None


def _timed_method(obj: Any, name: str, span: _Span) -> None:
    """Replace ``obj.name`` by a wrapper counting its calls' time in ``span``."""
    method = getattr(obj, name)

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        span.enter()
        try:
            return method(*args, **kwargs)
        finally:
            span.leave()

    setattr(obj, name, wrapper)


def time_mmcv_sampling(timer: MSDATimer) -> Callable[[], None]:
    """Route mmcv's pure-PyTorch MSDA sampling (what its ``MultiScaleDeformableAttention``
    runs on CPU) through ``timer``, as npudet's op is; returns the undo function."""
    from mmcv.ops import multi_scale_deform_attn as mmcv_msda

    original = mmcv_msda.multi_scale_deformable_attn_pytorch

    def run(call: MSDACall) -> torch.Tensor:
        return original(
            call.value, call.spatial_shapes, call.sampling_locations, call.attention_weights
        )

    def timed(value, value_spatial_shapes, sampling_locations, attention_weights):  # noqa: ANN001
        call = MSDACall(
            impl="mmcv_pytorch",
            value=value,
            spatial_shapes=value_spatial_shapes,
            level_start_index=value_spatial_shapes.new_zeros(0),
            sampling_locations=sampling_locations,
            attention_weights=attention_weights,
        )
        return timer.around(call, run)

    mmcv_msda.multi_scale_deformable_attn_pytorch = timed

    def undo() -> None:
        mmcv_msda.multi_scale_deformable_attn_pytorch = original

    return undo


class TimeSplitHook(Hook):
    """Records :data:`PHASES` (ms) and ``iter_ms`` of every training iteration in ``records``.

    Args:
        observe_op: time npudet's op through an observer (npudet models); False when the
            caller routes the model's sampling through :attr:`msda` itself (stock mmcv).
    """

    # first in before_train_iter and after_train_iter: the logger's work stays outside
    priority = "VERY_HIGH"

    def __init__(self, observe_op: bool = True) -> None:
        self.msda = MSDATimer(sync=False)
        self.observe_op = observe_op
        self.records: List[Dict[str, float]] = []
        self._spans: Dict[str, _Span] = {}
        self._neck_grad_at: Optional[float] = None
        self._last_end = 0.0
        self._last_end_cpu = 0.0
        self._iter_start = 0.0
        self._data_load = 0.0

    def before_train(self, runner: Any) -> None:
        model = runner.model.module if hasattr(runner.model, "module") else runner.model
        spans = self._spans = {
            k: _Span()
            for k in ("preprocess", "forward", "backbone_fwd", "loss", "backward", "optimizer")
        }
        model.data_preprocessor.register_forward_pre_hook(spans["preprocess"].enter)
        model.data_preprocessor.register_forward_hook(spans["preprocess"].leave)
        model.register_forward_pre_hook(spans["forward"].enter)
        model.register_forward_hook(spans["forward"].leave)
        # the image features: backbone + neck (Mask2Former has no neck: its pixel decoder,
        # the MSDA encoder, is part of its head and counts as transformer)
        parts = [model.backbone] + ([model.neck] if getattr(model, "neck", None) else [])
        for part in parts:
            part.register_forward_pre_hook(spans["backbone_fwd"].enter)
            part.register_forward_hook(spans["backbone_fwd"].leave)
        parts[-1].register_forward_hook(self._watch_features)
        head = model.bbox_head if hasattr(model, "bbox_head") else model.panoptic_head
        _timed_method(head, next(m for m in LOSS_METHODS if hasattr(head, m)), spans["loss"])
        wrapper = runner.optim_wrapper
        _timed_method(wrapper, "backward", spans["backward"])
        for name in ("step", "zero_grad"):
            _timed_method(wrapper, name, spans["optimizer"])
        self._last_end = time.perf_counter()
        self._last_end_cpu = time.process_time()

    def _watch_features(self, module: Any, args: Any, outputs: Any) -> None:
        """Note when the first gradient reaches the neck's outputs (the start of the
        backbone + neck backward)."""
        if not torch.is_grad_enabled():
            return
        for out in outputs if isinstance(outputs, (list, tuple)) else [outputs]:
            if isinstance(out, torch.Tensor) and out.requires_grad:
                out.register_hook(self._on_feature_grad)

    def _on_feature_grad(self, grad: torch.Tensor) -> None:
        if self._neck_grad_at is None:
            self._neck_grad_at = time.perf_counter()

    def before_train_iter(
        self, runner: Any, batch_idx: int, data_batch: Optional[Any] = None
    ) -> None:
        now = time.perf_counter()
        self._data_load = now - self._last_end
        for span in self._spans.values():
            span.total = 0.0
        self._neck_grad_at = None
        self.msda.reset()
        if self.observe_op:
            add_observer(self.msda)
        self._iter_start = time.perf_counter()

    def after_train_iter(
        self, runner: Any, batch_idx: int, data_batch: DataBatch = None, outputs: Outputs = None
    ) -> None:
        end = time.perf_counter()
        if self.observe_op:
            remove_observer(self.msda)
        s = {k: span.total for k, span in self._spans.items()}
        # the backbone's backward: from the first feature gradient to the end of backward()
        bwd_end = self._spans["backward"].last_end
        backbone_bwd = max(bwd_end - self._neck_grad_at, 0.0) if self._neck_grad_at else 0.0
        msda_f, msda_b = self.msda.forward_s, self.msda.backward_s
        step = end - self._iter_start
        forward_rest = s["forward"] - s["backbone_fwd"] - s["loss"] - msda_f
        backward_rest = s["backward"] - backbone_bwd - msda_b
        phases = {
            "data": self._data_load + s["preprocess"],
            "backbone": s["backbone_fwd"] + backbone_bwd,
            "msda_fwd": msda_f,
            "msda_bwd": msda_b,
            "loss_assigner": s["loss"],
            "transformer_rest": forward_rest + backward_rest,
            "optimizer": s["optimizer"],
        }
        phases["other"] = step - sum(phases.values()) + self._data_load
        record = {k: 1e3 * v for k, v in phases.items()}
        record["iter_ms"] = 1e3 * (self._data_load + step)
        # this process's CPU time over the same span (all its threads): a second view on a
        # shared machine, where the wall time counts the other processes' turns (the CPU time
        # grows under load too: threads spin waiting for a descheduled sibling)
        record["iter_cpu_ms"] = 1e3 * (time.process_time() - self._last_end_cpu)
        self.records.append(record)
        self._last_end = time.perf_counter()
        self._last_end_cpu = time.process_time()
