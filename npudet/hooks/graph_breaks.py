"""Where ``torch.compile`` breaks a graph: Dynamo's ``graph_breaks`` log, collected.

Dynamo reports every graph break on its ``graph_breaks`` logging artifact (what
``TORCH_LOGS=graph_breaks`` prints) with the user code location and the reason. The
recorder turns that channel on, keeps the messages off the console and groups them by
(location, reason).
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

# The modules that log on the ``graph_breaks`` artifact (torch 2.x); an artifact logger is
# named "<module>.__<artifact>".
_LOGGERS = tuple(
    f"torch._dynamo.{module}.__graph_breaks"
    for module in ("symbolic_convert", "convert_frame", "exc")
)
_LOCATION = re.compile(r"in user code at (\S+?):(\d+)")
_TRACEBACK_FRAME = re.compile(r'File "([^"]+)", line (\d+)')
# Dynamo's "Explanation:" line names the cause ("Dynamo does not know how to trace the builtin
# `scipy.optimize._lsap.linear_sum_assignment`"); "Graph Break Reason:" only the bytecode.
_REASONS = (re.compile(r"Explanation:\s*(.+)"), re.compile(r"Graph Break Reason:\s*(.+)"))

# Files whose code is the MSDA path: the op and the layers that call it.
MSDA_FILES = ("npudet/ops/msda/", "npudet/models/layers/")


@dataclass(frozen=True)
class GraphBreak:
    """One distinct graph break: ``location`` is ``file:line`` of the innermost user frame."""

    location: str
    reason: str
    count: int

    def in_files(self, parts: Sequence[str]) -> bool:
        """Whether the break lies in a file whose path contains one of ``parts``."""
        path = self.location.rsplit(":", 1)[0].replace("\\", "/")
        return any(part in path for part in parts)


def _parse(message: str) -> Tuple[str, str]:
    """(``file:line``, first line of the reason) of one graph-break log message."""
    found = _LOCATION.search(message)
    if found:
        location = f"{found.group(1)}:{found.group(2)}"
    else:
        frames = _TRACEBACK_FRAME.findall(message)
        location = f"{frames[-1][0]}:{frames[-1][1]}" if frames else "unknown"
    for pattern in _REASONS:
        reason = pattern.search(message)
        if reason:
            return location, reason.group(1).strip()[:200]
    return location, message.strip().splitlines()[0][:200]


class GraphBreakRecorder(logging.Handler):
    """Collects Dynamo's graph-break reports between :meth:`start` and :meth:`stop`."""

    def __init__(self) -> None:
        super().__init__(level=logging.DEBUG)
        self._seen: Counter = Counter()
        self._saved: Dict[str, Tuple[int, bool]] = {}

    def emit(self, record: logging.LogRecord) -> None:
        self._seen[_parse(record.getMessage())] += 1

    def start(self) -> None:
        """Turn the ``graph_breaks`` artifact on, routed here instead of to the console.

        Only these loggers' levels change (``torch._logging.set_logs`` would reset every
        other log setting a user made)."""
        for name in _LOGGERS:
            log = logging.getLogger(name)
            self._saved[name] = (log.level, log.propagate)
            log.setLevel(logging.DEBUG)
            log.propagate = False
            log.addHandler(self)

    def stop(self) -> None:
        """Detach from Dynamo's loggers and restore their settings."""
        for name, (level, propagate) in self._saved.items():
            log = logging.getLogger(name)
            log.removeHandler(self)
            log.setLevel(level)
            log.propagate = propagate
        self._saved.clear()

    def breaks(self) -> List[GraphBreak]:
        """The distinct breaks so far, most frequent first."""
        return [
            GraphBreak(location, reason, count)
            for (location, reason), count in self._seen.most_common()
        ]

    def total(self) -> int:
        """Graph-break reports so far (a break hit again after a recompile counts again)."""
        return sum(self._seen.values())
