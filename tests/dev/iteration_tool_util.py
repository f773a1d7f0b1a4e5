"""Running ``dev/tools/bench_iteration.py`` and ``profile_iteration.py`` for their tests."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any, Dict, Tuple

from plugin_util import run_tool


def run_iteration_tool(
    tool: str, config: str, out: Path, *args: str
) -> Tuple[Dict[str, Any], subprocess.CompletedProcess]:
    """``tool config *args --work-dir DIR/work --json out`` (``out`` in DIR) in its own
    process, which must succeed within 15 minutes; the JSON it wrote, and the process."""
    work = str(out.parent / "work")
    proc = run_tool([tool, config, *args, "--work-dir", work, "--json", str(out)], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), proc
