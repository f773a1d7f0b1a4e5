"""COCO evaluation of a detector exported to ONNX, run in ONNX Runtime.

python tools/deployment/eval_export.py CONFIG MODEL.onnx [--threads N] [--json OUT]
    [--cfg-options k=v ...]

The config's test dataloader, data preprocessor and test evaluator do what stays outside the
graph (see docs/deploy.md); the printed metrics are those ``tools/test.py`` prints for the
PyTorch model. A graph with npudet's or mmdeploy's fused MSDA node runs through npudet's
ONNX Runtime library (``npudet.deploy.ort_library``). The logic is ``npudet.deploy.evaluate``.
"""

from __future__ import annotations

import npudet.plugin  # noqa: F401  (registers the datasets and metrics the configs name)
from npudet.deploy.evaluate import main

if __name__ == "__main__":
    main()
