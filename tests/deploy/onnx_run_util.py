"""What the detector export tests share: a model exported by ``tools/export.py``, an ONNX
file run in ONNX Runtime, its node types."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

import numpy as np
import onnx
import torch
from plugin_util import run_tool

from npudet.models.detectors import apply_msda_cfg


def run_onnx(path, feeds: Dict[str, np.ndarray], library=None) -> List[np.ndarray]:
    """ONNX Runtime (CPU; with the custom-op ``library`` registered if given) on ``feeds``
    (input name -> array): the outputs in order."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if library is not None:
        options.register_custom_ops_library(str(library))
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def op_types(path) -> list:
    """The op types of an ONNX file's nodes, as (domain, op_type)."""
    return [(node.domain, node.op_type) for node in onnx.load(str(path)).graph.node]


def spread_scores(model: torch.nn.Module, scale: float, bias: float) -> None:
    """Class branches (random weights of std ``scale``, bias ``bias``) that give scores across
    (0, 1), not all near the focal prior 0.01."""
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for branch in model.bbox_head.cls_branches:
            branch.weight.copy_(torch.randn(branch.weight.shape, generator=gen) * scale)
            branch.bias.fill_(bias)


def export_with_tool(
    config: str,
    model: torch.nn.Module,
    tmp: Path,
    fmt: str,
    msda_node: str,
    export: Tuple[int, int, int],
) -> dict:
    """``model`` (built from ``config``) saved as a checkpoint under ``tmp`` and exported by
    ``tools/export.py`` to ``fmt`` (ONNX: with ``msda_node``'s MSDA nodes) traced at
    ``export`` (batch, height, width): config, checkpoint, the model on ``grid_sample`` (the
    reference: the plain graph's math) and the exported file."""
    checkpoint = tmp / "tiny.pth"
    torch.save({"state_dict": model.state_dict(), "meta": {}}, checkpoint)
    out = tmp / f"tiny.{'onnx' if fmt == 'onnx' else 'pt2'}"
    batch, height, width = export
    done = run_tool(
        ["tools/export.py", config, str(checkpoint), "--format", fmt, "--out", str(out),
         "--shape", str(height), str(width), "--batch", str(batch), "--msda-node", msda_node]
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert out.is_file() and f"wrote {out}" in done.stdout
    apply_msda_cfg(model, dict(impl="grid_sample"))
    return dict(config=config, checkpoint=checkpoint, model=model, out=out)
