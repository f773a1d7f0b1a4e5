"""Export a trained Deformable DETR / DINO or BEV detector out of PyTorch.

python tools/export.py CONFIG CHECKPOINT --format onnx|aoti --out FILE
    [--msda-node gridsample|mmdeploy|npu|npudet] [--shape H W] [--batch N] [--opset 18]

``onnx``: an ONNX graph (opset 18 by default) that stock ONNX Runtime runs (MSDA as GridSample
nodes; the fused-node flavours need ``npudet.deploy.onnx_nodes``). ``aoti``: an AOTInductor
package run by ``npudet.deploy.aoti.run_package`` (MSDA on the fused C++ kernel). A DETR's
graph takes normalised images (B, 3, H, W), B and H, W >= 65 dynamic, and returns boxes
(B, N, 4) xyxy in the input's pixels, scores (B, N) and labels (B, N); the BEV detector's
takes one frame of every camera (B, N_cam, 3, H, W), its lidar2img matrices, the previous
BEV, the ego motion and a has-a-previous-frame flag, and returns 3D boxes, scores, labels
and the next BEV. See docs/deploy.md. The logic is ``npudet.deploy.export``.
"""

from __future__ import annotations

import npudet.plugin  # noqa: F401  (registers what the configs name; checkpoint loading)
from npudet.deploy.export import main

if __name__ == "__main__":
    main()
