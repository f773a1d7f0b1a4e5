"""Atomic JSON writes (readers never see a half-written annotation or info file) and the
``meta.json`` of a generated data set."""

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


def recorded_settings_match(meta_file: str, settings: Any) -> bool:
    """True if ``meta_file`` exists and records ``settings``: a generated set is up to date
    (the generators write it last, so an interrupted run is redone)."""
    if not os.path.isfile(meta_file):
        return False
    with open(meta_file) as fh:
        return json.load(fh) == settings
