"""The MSDA op library's decisions in a training run's log.

The op library logs on the standard ``npudet`` logger and never imports mmengine. Here its
records are handed to mmengine's current ``MMLogger`` (the runner's, whose file is the
run's log): ``auto``'s choice per (device, dtype) with the build that runs and why earlier
candidates were skipped (INFO), and each candidate that failed verification (WARNING).
``msda_summary`` states what every model part was set to, which the tools log at start.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Dict

from mmengine.logging import MMLogger
from torch import nn

from npudet.models.detectors.msda_config import layer_part
from npudet.models.layers.layer_switch import active_pieces
from npudet.models.layers.msda_switch import deformable_layers

OP_LOGGER = "npudet"


class MMLoggerHandler(logging.Handler):
    """Hands each record to mmengine's current ``MMLogger`` at the record's level."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            MMLogger.get_current_instance().log(record.levelno, record.getMessage())
        except Exception:  # a log line must never break a training step
            self.handleError(record)


def install() -> MMLoggerHandler:
    """Route the ``npudet`` logger's INFO and above to the current MMLogger (once)."""
    logger = logging.getLogger(OP_LOGGER)
    for handler in logger.handlers:
        if isinstance(handler, MMLoggerHandler):
            return handler
    handler = MMLoggerHandler(logging.INFO)
    logger.addHandler(handler)
    if logger.getEffectiveLevel() > logging.INFO:
        logger.setLevel(logging.INFO)
    logger.propagate = False  # the MMLogger prints it; the root logger would print it twice
    return handler


def msda_summary(model: nn.Module) -> str:
    """``"MSDA implementation per model part: decoder: auto (6 layers), encoder: cpu (6
    layers); layer pieces (model.msda.layers): ffn (12), dropout (24), projections (12)"``:
    what each part's deformable-attention layers were set to (``auto`` names its own choice
    in the log at the first call) and how many modules run each training-grade piece."""
    parts: Dict[str, Counter] = {}
    for name, layer in deformable_layers(model):
        part = layer_part(name) or "other"
        parts.setdefault(part, Counter())[layer.impl] += 1
    if not parts:
        return "MSDA implementation per model part: the model has no deformable-attention layer"
    listed = ", ".join(
        f"{part}: "
        + ", ".join(f"{impl} ({n} layer{'s' if n > 1 else ''})" for impl, n in sorted(c.items()))
        for part, c in sorted(parts.items())
    )
    pieces = ", ".join(f"{piece} ({n})" for piece, n in active_pieces(model).items() if n)
    return (
        f"MSDA implementation per model part: {listed}; layer pieces (model.msda.layers): "
        f"{pieces or 'none (stock)'}"
    )
