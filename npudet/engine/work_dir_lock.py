"""One training per work dir: a second ``tools/train.py`` on a work dir in use stops at once.

Two trainings in one work dir used to both run to the end, each overwriting the other's
checkpoints, ``last_checkpoint``, logs and config dump. The first takes an ``fcntl.flock`` on
``WORK_DIR/.npudet-train.lock`` for its whole life (the kernel releases it when the process
ends, however it ends, so a killed run never blocks the next); a second one is refused with
one line naming the process that holds it. Only rank 0 of a distributed run takes it.
"""

from __future__ import annotations

import fcntl
import os
import time
from typing import Dict, TextIO

from .preflight import PreflightError

LOCK_NAME = ".npudet-train.lock"

# The open lock files of this process by work dir: a lock lives as long as its file stays
# open (and a second flock from this process on a new open of the file would conflict).
_held: Dict[str, TextIO] = {}


def lock_work_dir(work_dir: str) -> None:
    """Create ``work_dir`` if needed and hold its training lock until this process ends.

    Raises PreflightError when the folder cannot be created or written, or another
    training holds it.
    """
    if os.path.realpath(work_dir) in _held:
        return
    try:
        os.makedirs(work_dir, exist_ok=True)
        handle = open(os.path.join(work_dir, LOCK_NAME), "a+")
    except OSError as err:
        raise PreflightError(
            f"work dir {work_dir}: cannot create or write it ({err.strerror or err}); "
            "pass a writable --work-dir"
        ) from err
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        owner = handle.read().strip() or "another process"
        handle.close()
        raise PreflightError(
            f"work dir {work_dir} is in use by {owner}: two trainings there would overwrite "
            "each other's checkpoints and logs; wait for it to end or pass another --work-dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"training process {os.getpid()} (started {time.strftime('%Y-%m-%d %H:%M:%S')})")
    handle.flush()
    _held[os.path.realpath(work_dir)] = handle
