"""MSDA as one fused ONNX node per call, in the flavour a runtime's plugin parses.

Interface for a detector export (``torch.onnx.export(..., dynamo=True)``, torch 2.13)::

    from npudet.deploy.onnx_nodes import msda_onnx_node, export_with_msda_node

    with msda_onnx_node("npudet"):          # or "mmdeploy", "npu", "gridsample"
        torch.onnx.export(model, args, "model.onnx", dynamo=True, dynamic_shapes=...)

    export_with_msda_node(model, args, "model.onnx", msda_node="npudet",
                          dynamic_shapes=..., opset_version=18)   # the same, in one call

Inside ``msda_onnx_node``, every call of ``npudet.ops.multi_scale_deformable_attn`` (the
layers' too, whatever their ``impl``) that the exporter traces becomes one node with mmcv's
five inputs — value (B, K, NH, D), spatial_shapes (L, 2), level_start_index (L,),
sampling_locations (B, Q, NH, L, P, 2), attention_weights (B, Q, NH, L, P) — and one typed
output (B, Q, NH * D) of value's dtype. Eager calls are untouched. Level shapes given as
(H, W) pairs from feature maps' sizes stay dynamic: the shapes tensor is computed in the
graph, so the file runs at other image sizes.

Flavours (``FLAVOURS``):

* ``"npudet"``: ``npudet::MultiScaleDeformableAttn`` v1, int64 shapes; run by npudet's
  ONNX Runtime library (``npudet.deploy.ort_library()``).
* ``"mmdeploy"``: ``mmdeploy::MMCVMultiScaleDeformableAttention`` v1 with ``im2col_step=64``,
  as mmdeploy 1.3's symbolic writes it; the shapes are cast to int32, which its TensorRT
  plugin (``MultiScaleDeformableAttnPluginDynamic``) requires of inputs 1 and 2.
* ``"npu"``: ``npu::MultiScaleDeformableAttn`` v1, shapes cast to int32, as DrivingSDK's
  (mx_driving 26.2) symbolic writes it for CANN's ATC parser.
* ``"gridsample"``: no fused node: the ``grid_sample`` implementation (ONNX GridSample).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, Optional, Sequence, Union

import torch

from npudet.ops.msda import get_impl
from npudet.ops.msda.export_node import recording_as
from npudet.ops.msda.levels import LevelPairs


@dataclass(frozen=True)
class NodeFlavour:
    """One fused node's ONNX identity: ``domain::op_type`` at ``version``, its attributes,
    and the integer dtype its level inputs (spatial_shapes, level_start_index) carry."""

    domain: str
    op_type: str
    version: int
    index_dtype: torch.dtype
    attributes: Dict[str, int] = field(default_factory=dict)
    runs_on: str = ""


FLAVOURS: Dict[str, NodeFlavour] = {
    "npudet": NodeFlavour(
        "npudet", "MultiScaleDeformableAttn", 1, torch.int64, runs_on="npudet's ORT library"
    ),
    "mmdeploy": NodeFlavour(
        "mmdeploy",
        "MMCVMultiScaleDeformableAttention",
        1,
        torch.int32,
        {"im2col_step": 64},
        runs_on="mmdeploy's TensorRT plugin; npudet's ORT library",
    ),
    "npu": NodeFlavour(
        "npu", "MultiScaleDeformableAttn", 1, torch.int32, runs_on="CANN's ATC (an Ascend OM)"
    ),
}
GRIDSAMPLE = "gridsample"


def check_flavour(flavour: object, argument: str = "msda_node") -> str:
    """``flavour`` if it names a fused node flavour or ``"gridsample"``; else ValueError
    naming ``argument`` and the choices."""
    choices = [*FLAVOURS, GRIDSAMPLE]
    if not isinstance(flavour, str) or flavour not in choices:
        raise ValueError(f"{argument}: expected one of {choices}, got {flavour!r}")
    return flavour


def fused_node(
    flavour: NodeFlavour,
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> torch.Tensor:
    """The call as one ``flavour`` node (only meaningful while exporting: eagerly,
    ``torch.onnx.ops.symbolic`` returns a placeholder). Shapes as in the module docstring;
    the output (B, Q, NH * D) is typed, so ONNX shape inference sees it."""
    batch, _, heads, head_dim = value.shape
    queries = sampling_locations.shape[1]
    inputs = (
        value,
        spatial_shapes.to(flavour.index_dtype),
        level_start_index.to(flavour.index_dtype),
        sampling_locations,
        attention_weights,
    )
    return torch.onnx.ops.symbolic(
        f"{flavour.domain}::{flavour.op_type}",
        inputs,
        dict(flavour.attributes),
        dtype=value.dtype,
        shape=(batch, queries, heads * head_dim),
        version=flavour.version,
    )


def _grid_sample(*tensors: torch.Tensor, level_shapes: Optional[LevelPairs]) -> torch.Tensor:
    """The ``grid_sample`` implementation (plain ONNX GridSample nodes), with the (H, W)
    pairs when the caller gave them: it reads the level shapes on the host."""
    shapes = {"level_shapes": level_shapes} if level_shapes is not None else {}
    return get_impl("grid_sample").forward(*tensors, **shapes)


@contextlib.contextmanager
def msda_onnx_node(flavour: str) -> Iterator[NodeFlavour | None]:
    """Within the block, exported MSDA calls become ``flavour``'s node (``FLAVOURS``), or
    plain GridSample for ``"gridsample"``; yields the ``NodeFlavour`` (None for
    ``"gridsample"``). ValueError naming ``msda_node`` for an unknown flavour."""
    check_flavour(flavour)
    if flavour == GRIDSAMPLE:
        with recording_as(_grid_sample):
            yield None
        return
    chosen = FLAVOURS[flavour]

    def node(*tensors: torch.Tensor, level_shapes: Optional[LevelPairs] = None) -> torch.Tensor:
        return fused_node(chosen, *tensors)

    with recording_as(node):
        yield chosen


def export_with_msda_node(
    module: torch.nn.Module,
    args: tuple,
    path: Union[str, Path],
    msda_node: str = GRIDSAMPLE,
    dynamic_shapes: Any = None,
    opset_version: int = 18,
    input_names: Optional[Sequence[str]] = None,
    output_names: Optional[Sequence[str]] = None,
) -> Path:
    """``torch.onnx.export(module, args, path, dynamo=True, ...)`` with MSDA recorded as
    ``msda_node``'s node; ``dynamic_shapes`` is ``torch.export``'s (a ``Dim`` per dynamic
    size). Returns ``path``; the file holds its weights (no external data)."""
    check_flavour(msda_node)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with msda_onnx_node(msda_node):
        torch.onnx.export(
            module,
            tuple(args),
            str(path),
            dynamo=True,
            dynamic_shapes=dynamic_shapes,
            opset_version=opset_version,
            input_names=list(input_names) if input_names else None,
            output_names=list(output_names) if output_names else None,
            external_data=False,
        )
    return path
