"""Let ``torch.load(weights_only=True)`` (torch >= 2.6's default) read mmengine checkpoints.

mmengine 0.10.7 calls ``torch.load`` without ``weights_only``; its checkpoints carry
the message hub (``HistoryBuffer`` objects holding numpy arrays) besides tensors. We
allow-list exactly those types with ``torch.serialization.add_safe_globals`` instead
of turning the weights-only unpickler off.
"""

from __future__ import annotations

from typing import List

import numpy as np
import torch
from mmengine.logging import HistoryBuffer


def _numpy_globals() -> List[object]:
    try:
        from numpy._core.multiarray import _reconstruct, scalar
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct, scalar  # type: ignore[no-redef]
    dtype_classes = [type(np.dtype(name)) for name in ("float64", "float32", "int64", "int32")]
    return [_reconstruct, scalar, np.ndarray, np.dtype, *dtype_classes]


def allow_mmengine_checkpoints() -> None:
    """Allow-list the non-tensor types of mmengine checkpoints (idempotent)."""
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals([HistoryBuffer, *_numpy_globals()])
