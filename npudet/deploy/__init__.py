"""Deployment: routes that take a model using npudet's op out of Python.

``aoti``: ``torch.export`` + AOTInductor packages (``.pt2``) and the C++ runner
(``ops/aoti_runner/``) that runs them with no Python. ``detector``: a Deformable DETR / DINO
as one traceable graph (images -> boxes, scores, labels); ``export``: ``tools/export.py``'s
ONNX and AOTInductor exports of a trained detector (imported by name: they need mmdet).
This wing imports the op library, the layers, the detectors and the engine's checks;
nothing below it imports it.
"""

from .aoti import build_runner, linked_libraries, operator_libraries, package, run_package

__all__ = ["build_runner", "linked_libraries", "operator_libraries", "package", "run_package"]
