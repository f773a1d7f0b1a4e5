"""The MSDA op library's decisions in a training run's log.

The op library logs on the standard ``npudet`` logger and never imports mmengine. Here its
records are handed to mmengine's current ``MMLogger`` (the runner's, whose file is the
run's log): ``auto``'s choice per (device, dtype) with the build that runs and why earlier
candidates were skipped (INFO), and each candidate that failed verification (WARNING).
``msda_summary`` states what every model part was set to, which the tools log at start.
"""

from __future__ import annotations

import logging

from mmengine.logging import MMLogger

from npudet.models.detectors.msda_config import msda_summary

__all__ = ["MMLoggerHandler", "install", "msda_summary"]

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
