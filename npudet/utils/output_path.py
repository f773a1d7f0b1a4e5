"""Whether a tool's output file can be written, asked before the work whose result it holds.

Every tool that writes a file at its end (``tools/test.py --out`` and its work dir,
``tools/export.py --out``, ``tools/deployment/eval_export.py --json``,
``tools/misc/check_device.py --json`` / ``--save``) checks its path here first: a path that
cannot be written used to fail after minutes of work.
"""

from __future__ import annotations

import os
from typing import Optional, Union


def output_path_error(
    path: Union[str, os.PathLike], key: str, folder: bool = False
) -> Optional[str]:
    """One line naming ``key`` (the option) and ``path`` when ``path`` cannot be written: a
    file path that is a folder, or (``folder``: a folder the run writes into, a work dir) a
    path whose nearest existing part is not a writable folder (a file in the way, a
    read-only folder or mount); None when it can be written."""
    path = os.fspath(path)
    if os.path.isdir(path) and not folder:
        return f"{key} {path}: a folder; expected a file path"
    where = os.path.abspath(path if folder else os.path.dirname(os.path.abspath(path)))
    while not os.path.exists(where):  # missing folders are created: their parent decides
        where = os.path.dirname(where)
    if not os.path.isdir(where) or not os.access(where, os.W_OK | os.X_OK):
        return f"{key} {path}: cannot be written ({where} is not a writable folder)"
    return None
