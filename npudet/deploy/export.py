"""Export a trained Deformable DETR / DINO or BEV detector: ``tools/export.py``'s logic.

``load_detector`` builds the config's model, loads the checkpoint (checked first: a
missing, corrupt or foreign checkpoint is one line naming it) and wraps it in its family's
graph (:class:`~npudet.deploy.detector.DetectorGraph`,
:class:`~npudet.deploy.bev_graph.BEVGraph`: each names its inputs and outputs, example
inputs and dynamic sizes); ``export_onnx`` writes an ONNX graph (``torch.onnx.export``,
dynamo exporter) and ``export_aoti`` an AOTInductor package (``npudet.deploy.aoti``) of it,
with the batch and the image height and width dynamic. ``main`` is the command line.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path
from typing import List, Optional, Sequence, Union

import torch
from mmengine.config import Config

from npudet.bev.models import BEVFormer
from npudet.engine.cli import fail
from npudet.engine.preflight import PreflightError, check_checkpoint, load_state_dict
from npudet.models.detectors import apply_msda_cfg
from npudet.utils.output_path import output_path_error

from . import aoti
from .bev_graph import BEVGraph
from .detector import FAMILIES, MIN_SIDE, DetectorGraph
from .onnx_nodes import FLAVOURS, GRIDSAMPLE, check_flavour, msda_onnx_node

FORMATS = ("onnx", "aoti")
# How MSDA appears in an ONNX graph: plain GridSample nodes, or one fused node of mmdeploy's
# TensorRT plugin, of the Ascend ATC parser or of npudet's ONNX Runtime library.
MSDA_NODES = (GRIDSAMPLE, *FLAVOURS)
DEFAULT_OPSET = 18
# The MSDA implementation each route traces: grid_sample is plain ONNX; AOTInductor keeps
# the fused C++ kernel as one call that the operator library serves.
ROUTE_IMPL = {"onnx": "grid_sample", "aoti": "cpu"}
Graph = Union[DetectorGraph, BEVGraph]


def load_detector(config: str, checkpoint: str, impl: str) -> Graph:
    """The config's detector with the checkpoint's weights, every MSDA layer on ``impl``,
    in eval mode, wrapped as its family's graph (:class:`BEVGraph` for a ``BEVFormer``,
    else :class:`DetectorGraph`). PreflightError / FileNotFoundError with one line naming
    the file when either is unusable; TypeError for a model of another family."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    if not Path(config).is_file():
        raise FileNotFoundError(f"config: file not found: {config}")
    cfg = Config.fromfile(config)
    check_checkpoint(cfg, checkpoint, "checkpoint", strict=True)
    init_default_scope(cfg.get("default_scope", "mmdet"))
    detector = MODELS.build(cfg.model)
    if not isinstance(detector, (BEVFormer, *FAMILIES)):
        names = ", ".join(f.__name__ for f in (*FAMILIES, BEVFormer))
        raise TypeError(
            f"config: the export takes npudet's {names}; {config} builds {type(detector).__name__}"
        )
    detector.load_state_dict(load_state_dict(checkpoint, "checkpoint"))
    apply_msda_cfg(detector, dict(impl=impl))
    family = BEVGraph if isinstance(detector, BEVFormer) else DetectorGraph
    return family(detector).eval()


def trace(graph: Graph, inputs: Sequence[torch.Tensor]) -> torch.export.ExportedProgram:
    """``torch.export`` of ``graph`` at ``inputs`` with the graph's dynamic sizes (batch,
    image height and width); the constraint error names a size the model fixes."""
    with torch.no_grad():
        return torch.export.export(graph, tuple(inputs), dynamic_shapes=graph.dynamic_shapes())


def export_onnx(
    graph: Graph,
    inputs: Sequence[torch.Tensor],
    out: Path,
    msda_node: str = "gridsample",
    opset: int = DEFAULT_OPSET,
) -> Path:
    """Write ``graph`` traced at ``inputs`` (``graph.example_inputs``) as ONNX to ``out``,
    its inputs and outputs named as the graph names them (``DetectorGraph``: ``images``
    (B, 3, H, W) -> ``boxes`` (B, N, 4), ``scores`` (B, N), ``labels`` (B, N); ``BEVGraph``:
    see there); B, H, W dynamic. ``msda_node`` picks how MSDA appears (``MSDA_NODES``: plain
    GridSample, or one fused node per layer in ``npudet.deploy.onnx_nodes``'s flavours);
    ValueError naming ``msda_node`` for any other string."""
    check_flavour(msda_node)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    names = dict(input_names=list(graph.input_names), output_names=list(graph.output_names))
    # Every MSDA call traced inside the block is recorded as msda_node's node (plain
    # GridSample for "gridsample", whatever implementation the layers were built with).
    with torch.no_grad(), warnings.catch_warnings(), msda_onnx_node(msda_node):
        warnings.simplefilter("ignore")  # the exporter's notes on every traced mmdet assert
        # torch.export first: it refuses a dynamic size the model fixes, where
        # torch.onnx.export's fallbacks would quietly write a graph of the traced size.
        onnx_program = torch.onnx.export(
            trace(graph, inputs),
            dynamo=True,
            opset_version=opset,
            # onnxscript 0.7.2's optimizer left a node reading a value it had removed
            # ("Node input 'sigmoid_1_min_1' is not a graph input"); the plain graph is valid.
            optimize=False,
            verbose=False,
            **names,
        )
    onnx_program.save(str(out))
    return out


def export_aoti(graph: Graph, inputs: Sequence[torch.Tensor], out: Path) -> Path:
    """Compile ``graph`` traced at ``inputs`` into the AOTInductor package ``out`` (``.pt2``),
    run by ``npudet.deploy.aoti.run_package`` on the graph's inputs, in order."""
    with torch.no_grad():
        return aoti.package(graph, tuple(inputs), graph.dynamic_shapes(), out)


def parse_args(argv: Optional[Sequence[str]] = None) -> argparse.Namespace:
    """The command line of ``tools/export.py``; a bad argument is one line and exit 2."""
    parser = _OneLineParser(description="Export a trained Deformable DETR / DINO / BEV detector")
    parser.add_argument("config", help="the model's config file")
    parser.add_argument("checkpoint", help="the trained checkpoint (.pth)")
    parser.add_argument("--format", required=True, choices=FORMATS, help="onnx or aoti")
    parser.add_argument("--out", required=True, type=Path, help="the .onnx / .pt2 to write")
    parser.add_argument(
        "--msda-node", default="gridsample", choices=MSDA_NODES, help="ONNX only: MSDA's nodes"
    )
    parser.add_argument(
        "--shape", nargs=2, type=int, default=(320, 320), metavar=("H", "W"),
        help="the image size traced (any size >= 65 runs afterwards)",
    )  # fmt: skip
    parser.add_argument("--batch", type=int, default=2, help="the batch traced (any runs)")
    parser.add_argument("--opset", type=int, default=DEFAULT_OPSET, help="ONNX opset (>= 16)")
    args = parser.parse_args(argv)
    if min(args.shape) < MIN_SIDE:
        parser.error(f"argument --shape: expected H and W >= {MIN_SIDE}, got {args.shape}")
    if args.batch < 2:
        # torch.export specializes a size traced at 1: trace at 2 or more to keep B dynamic.
        parser.error(f"argument --batch: expected >= 2 (any batch runs), got {args.batch}")
    if args.opset < 16:
        parser.error(f"argument --opset: expected >= 16 (GridSample), got {args.opset}")
    if args.format == "aoti" and args.msda_node != "gridsample":
        parser.error("argument --msda-node: ONNX only; --format aoti runs the fused C++ kernel")
    # Before loading and tracing (minutes), not when the traced graph is saved.
    problem = output_path_error(args.out, "--out")
    if problem:
        parser.error(problem)
    return args


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        fail(message)


def main(argv: Optional[List[str]] = None) -> Path:
    """``tools/export.py``: load, export, print where it went; errors are one line."""
    args = parse_args(argv)
    try:
        # TypeError / ValueError: a config of another model family, or one DetectorGraph
        # cannot take (softmax scores).
        graph = load_detector(args.config, args.checkpoint, ROUTE_IMPL[args.format])
    except (PreflightError, FileNotFoundError, TypeError, ValueError) as err:
        fail(str(err))
    inputs = graph.example_inputs(args.batch, *args.shape)
    try:
        if args.format == "onnx":
            out = export_onnx(graph, inputs, args.out, args.msda_node, args.opset)
        else:
            out = export_aoti(graph, inputs, args.out)
    except NotImplementedError as err:  # a fused-node flavour this install lacks
        fail(str(err))
    height, width = args.shape
    print(f"wrote {out} ({args.format}, traced at batch {args.batch}, {height}x{width})")
    return out
