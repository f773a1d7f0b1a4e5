"""Where a stored figure came from: the commit it was measured at, and the machine.

Every results file names both (``commit``, ``machine``), so a figure quoted in the docs can be
traced to the code and the CPU that produced it.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Dict, Optional

from .harness import machine_info

ROOT = Path(__file__).resolve().parents[2]


def git_commit(root: Optional[Path] = None) -> str:
    """HEAD's hash of the checkout at ``root``, with ``+dirty`` when tracked files differ;
    ``unknown`` outside a git checkout (an installed wheel)."""
    where = str(root or ROOT)
    try:
        head = subprocess.run(
            ["git", "-C", where, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", where, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty else "")


def provenance(root: Optional[Path] = None) -> Dict[str, object]:
    """``{"commit": ..., "machine": machine_info()}`` for a results file's header."""
    return {"commit": git_commit(root), "machine": machine_info()}
