"""Atomic JSON writes: readers never see a half-written annotation or info file."""

from __future__ import annotations

import json
import os
from typing import Any


def write_json_atomic(path: str, obj: Any) -> str:
    """Write ``obj`` as JSON to ``path`` through a temporary file and ``os.replace``."""
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)
    return path
