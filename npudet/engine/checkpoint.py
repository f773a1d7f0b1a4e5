"""Let ``torch.load(weights_only=True)`` (torch >= 2.6's default) read mmengine checkpoints.

mmengine 0.10.7 calls ``torch.load`` without ``weights_only``; its checkpoints carry the
message hub, whose ``HistoryBuffer`` objects pickle numpy arrays and bound methods (the
latter through ``builtins.getattr``, which must never be allow-listed). Instead of
turning the weights-only unpickler off we (1) make ``HistoryBuffer`` pickle as
``HistoryBuffer(log_history, count_history, max_length)`` of plain lists, via ``copyreg``,
and (2) allow-list ``HistoryBuffer`` and numpy's array / dtype reconstruction with
``torch.serialization.add_safe_globals``. Checkpoints saved this way load weights-only;
ones written by plain mmengine still contain ``getattr`` and are refused by torch.
"""

from __future__ import annotations

import copyreg
from typing import List, Tuple

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


def _reduce_history_buffer(buffer: HistoryBuffer) -> Tuple[type, tuple]:
    data = buffer.data
    return HistoryBuffer, (data[0].tolist(), data[1].tolist(), buffer.max_length)


def allow_mmengine_checkpoints() -> None:
    """Pickle ``HistoryBuffer`` safely and allow-list what checkpoints hold (idempotent)."""
    copyreg.pickle(HistoryBuffer, _reduce_history_buffer)
    if hasattr(torch.serialization, "add_safe_globals"):
        torch.serialization.add_safe_globals([HistoryBuffer, *_numpy_globals()])
