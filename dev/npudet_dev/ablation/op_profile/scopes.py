"""Named profiler scopes on a detector's parts.

:func:`mark_scopes` opens a ``record_function`` range ``npudet.scope::KIND`` around the parts
of a model that :mod:`.split` splits an iteration into: modules (forward pre/post hooks),
methods (instance wrappers) and the MSDA op (an observer). Where scopes nest, the innermost
names the op, so a head branch called from the decoder counts as the head. Kinds:

- ``detector``, ``data_preprocessor``, ``backbone_neck`` (``backbone``, ``neck``, ``img_backbone``,
  ``img_neck``), ``ref_points`` (``encoder``, ``decoder``: their glue around the layers);
- ``pos_query``: ``positional_encoding``, the decoder's ``ref_point_head`` and mmdet's
  ``DetectionTransformer.pre_transformer`` / ``pre_decoder`` (level embeddings, two-stage
  proposals, query and denoising-query generation);
- ``ffn`` (mmcv ``FFN``), ``norm`` (``nn.LayerNorm``), ``self_attn`` (mmcv or torch
  ``MultiheadAttention``), outside the backbone and neck;
- ``heads``: ``bbox_head`` and the items of any ``cls_branches`` / ``reg_branches``;
  ``loss_matcher``: the head's loss method (the one the iteration benchmark's timer wraps:
  ``time_split.LOSS_METHODS``);
- every MSDA layer (``deformable_layers``): ``msda.layer`` (its forward), ``msda.value``
  (``project_value``), ``msda.attend`` (``deformable_attend``), its four projections
  ``msda.value_proj`` / ``msda.offsets_proj`` / ``msda.weights_proj`` / ``msda.output_proj``
  (``project_sampling`` is ``msda.offsets_proj`` too: with ``model.msda.layers``' piece
  ``projections`` it runs the offsets' and the weights' projection as one GEMM, outside the
  two ``Linear`` modules; without it the modules' own scopes, inner, split the two),
  and ``msda.op`` (the op call inside the observers: npudet's op takes its unplanned path while
  an observer is active, as it does under the iteration benchmark's own timer);
- ``backward``, ``optimizer``: the optimizer wrapper's ``backward`` and ``step`` / ``zero_grad``.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional

import torch
from mmcv.cnn.bricks.transformer import FFN
from mmcv.cnn.bricks.transformer import MultiheadAttention as MMCVMultiheadAttention
from torch import nn
from torch.autograd.profiler import record_function

from npudet.models.layers import deformable_layers
from npudet.ops.msda.observe import MSDACall, MSDAObserver, Run, add_observer, remove_observer

from ..time_split import LOSS_METHODS
from .split import SCOPE

BACKBONE_ATTRS = ("backbone", "neck", "img_backbone", "img_neck")
BRANCH_ATTRS = ("cls_branches", "reg_branches")
HEAD_ATTRS = ("bbox_head", "pts_bbox_head")
# mmdet's DetectionTransformer methods building the transformer's inputs and queries
QUERY_METHODS = ("pre_transformer", "pre_decoder")
MSDA_PROJECTIONS = {
    "value_proj": "msda.value_proj",
    "sampling_offsets": "msda.offsets_proj",
    "attention_weights": "msda.weights_proj",
    "output_proj": "msda.output_proj",
}
_MISSING = object()


class _OpScope(MSDAObserver):
    """Runs each MSDA call inside the ``msda.op`` scope."""

    def around(self, call: MSDACall, run: Run) -> torch.Tensor:
        with record_function(SCOPE + "msda.op"):
            return run(call)


class _Marker:
    """Opens scopes and keeps what undoes them."""

    def __init__(self) -> None:
        self.undo: List[Callable[[], None]] = []
        self.marked: Dict[int, str] = {}

    def module(self, module: Optional[nn.Module], kind: str) -> None:
        """``module``'s forward runs in scope ``kind`` (once per module: the first kind wins)."""
        if module is None or id(module) in self.marked:
            return
        self.marked[id(module)] = kind
        open_ranges: List[record_function] = []

        def enter(*_: Any) -> None:
            scope = record_function(SCOPE + kind)
            scope.__enter__()
            open_ranges.append(scope)

        def leave(*_: Any) -> None:
            if open_ranges:
                open_ranges.pop().__exit__(None, None, None)

        handles = (
            module.register_forward_pre_hook(enter),
            module.register_forward_hook(leave, always_call=True),
        )
        self.undo.extend(h.remove for h in handles)

    def method(self, obj: Any, name: str, kind: str) -> None:
        """``obj.name(...)`` runs in scope ``kind`` (an instance attribute wrapping it)."""
        if not callable(getattr(obj, name, None)):
            return
        saved = obj.__dict__.get(name, _MISSING)
        method = getattr(obj, name)

        @functools.wraps(method)
        def scoped(*args: Any, **kwargs: Any) -> Any:
            with record_function(SCOPE + kind):
                return method(*args, **kwargs)

        setattr(obj, name, scoped)

        def restore() -> None:
            if saved is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, saved)

        self.undo.append(restore)


def _under(name: str, prefixes: List[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def mark_scopes(model: nn.Module, optim_wrapper: Any = None) -> Callable[[], None]:
    """Open the module docstring's scopes on ``model`` (and ``optim_wrapper``'s methods);
    returns the function that removes them."""
    marker = _Marker()
    for _, layer in deformable_layers(model):
        marker.module(layer, "msda.layer")
        for attr, kind in MSDA_PROJECTIONS.items():
            marker.module(getattr(layer, attr, None), kind)
        marker.method(layer, "project_value", "msda.value")
        marker.method(layer, "project_sampling", "msda.offsets_proj")
        marker.method(layer, "deformable_attend", "msda.attend")
    backbone = [a for a in BACKBONE_ATTRS if isinstance(getattr(model, a, None), nn.Module)]
    for attr in backbone:
        marker.module(getattr(model, attr), "backbone_neck")
    for name, module in model.named_modules():
        if _under(name, backbone):
            continue
        if isinstance(module, FFN):
            marker.module(module, "ffn")
        elif isinstance(module, nn.LayerNorm):
            marker.module(module, "norm")
        elif isinstance(module, (MMCVMultiheadAttention, nn.MultiheadAttention)):
            marker.module(module, "self_attn")
        for attr in BRANCH_ATTRS:
            for branch in getattr(module, attr, None) or ():
                marker.module(branch, "heads")
    marker.module(getattr(model, "positional_encoding", None), "pos_query")
    marker.module(getattr(getattr(model, "decoder", None), "ref_point_head", None), "pos_query")
    for attr in ("encoder", "decoder"):
        marker.module(getattr(model, attr, None), "ref_points")
    for method in QUERY_METHODS:
        marker.method(model, method, "pos_query")
    marker.module(getattr(model, "bbox_head", None), "heads")
    for head in (getattr(model, attr, None) for attr in HEAD_ATTRS):
        method = next((m for m in LOSS_METHODS if hasattr(head, m)), None)
        if method is not None:
            marker.method(head, method, "loss_matcher")
    marker.module(getattr(model, "data_preprocessor", None), "data_preprocessor")
    marker.module(model, "detector")
    if optim_wrapper is not None:
        marker.method(optim_wrapper, "backward", "backward")
        marker.method(optim_wrapper, "step", "optimizer")
        marker.method(optim_wrapper, "zero_grad", "optimizer")
    # Added before training, ahead of the benchmark's timer (which adds its own before each
    # iteration): the outermost observer, so the timer's work counts inside the op's scope.
    observer = _OpScope()
    add_observer(observer)
    marker.undo.append(lambda: remove_observer(observer))

    def undo() -> None:
        for step in reversed(marker.undo):
            step()

    return undo
