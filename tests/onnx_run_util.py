"""What the detector export tests share: running an ONNX file in ONNX Runtime, its node
types, and which of a descending score list are apart from their neighbours."""

from __future__ import annotations

from typing import Dict, List

import numpy as np
import onnx

TIE = 1e-6  # scores closer than this may swap places between runtimes


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


def untied(scores: np.ndarray) -> np.ndarray:
    """(N,) True where a score (sorted descending) is apart from both neighbours."""
    gaps = np.abs(np.diff(scores)) > TIE
    return np.concatenate(([True], gaps)) & np.concatenate((gaps, [True]))
