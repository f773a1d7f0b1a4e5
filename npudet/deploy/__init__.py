"""Deployment: routes that take a model using npudet's op out of Python.

``aoti``: ``torch.export`` + AOTInductor packages (``.pt2``) and the C++ runner
(``ops/aoti_runner/``) that runs them with no Python. ``onnx_nodes``: MSDA as one fused ONNX
node per call (npudet's, mmdeploy's or the NPU's flavour), or plain GridSample;
``ort_custom_ops``: ``ort_library()``, the ONNX Runtime custom-op library
(``ops/onnxruntime/``) that runs npudet's and mmdeploy's node. ``detector``: a Deformable DETR /
DINO as one traceable graph (images -> boxes, scores, labels); ``bev_graph``: the BEV detector
as one (a frame, its cameras, the previous BEV and the ego motion -> 3D boxes, scores,
labels, the next BEV); ``export``: ``tools/export.py``'s ONNX and AOTInductor exports of a
trained detector (imported by name: they need mmdet).
This layer imports the op library, the layers, the detectors and the engine's checks; nothing
below it imports it (the op reaches the ONNX route only through
``npudet.ops.msda.export_node``).
"""

from .aoti import build_runner, linked_libraries, operator_libraries, package, run_package
from .onnx_nodes import FLAVOURS, export_with_msda_node, msda_onnx_node
from .ort_custom_ops import ort_library

__all__ = [
    "FLAVOURS",
    "build_runner",
    "export_with_msda_node",
    "linked_libraries",
    "msda_onnx_node",
    "operator_libraries",
    "ort_library",
    "package",
    "run_package",
]
