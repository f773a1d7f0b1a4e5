"""One process builds a native library's cache folder at a time, and a dead one blocks no one.

torch's ``cpp_extension.load`` guards a build folder with a ``lock`` file created with
``O_EXCL`` and removed when the build ends: a build killed by SIGTERM / SIGKILL leaves it
behind, and every later ``load`` of that folder waits for it for ever. Here every build
first takes an ``fcntl.flock`` on ``FOLDER/build.flock``, which the kernel releases when its
owner exits however it exits; whoever holds it knows that a ``lock`` file in the folder is
a dead build's and removes it. A process that has to wait says whose build it waits for,
and how long it has waited.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from pathlib import Path
from typing import Iterator, TextIO

LOCK_NAME = "build.flock"
TORCH_BATON = "lock"  # torch.utils.file_baton.FileBaton's file in the build folder
REPORT_EVERY_S = 30.0


def _say(message: str) -> None:
    print(f"npudet: {message}", file=sys.stderr, flush=True)


def _wait(handle: TextIO, folder: Path, what: str) -> None:
    """Block until ``handle``'s lock is ours, saying whose build it waits for now and then."""
    handle.seek(0)
    owner = handle.read().strip() or "another process"
    _say(f"waiting for {owner} to finish building {what} in {folder}")
    start = time.monotonic()
    next_report = start + REPORT_EVERY_S
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            if time.monotonic() >= next_report:
                _say(f"still waiting for {owner} ({time.monotonic() - start:.0f} s so far)")
                next_report += REPORT_EVERY_S
            time.sleep(0.2)
    _say(f"the other build of {what} ended after {time.monotonic() - start:.0f} s of waiting")


@contextlib.contextmanager
def build_lock(folder: Path, what: str) -> Iterator[None]:
    """Hold ``folder``'s build lock (waiting for another process's build if needed);
    ``what`` names the library in the lines printed while waiting."""
    with open(folder / LOCK_NAME, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _wait(handle, folder, what)
        handle.seek(0)
        handle.truncate()
        handle.write(f"process {os.getpid()} (since {time.strftime('%H:%M:%S')})")
        handle.flush()
        # Every builder holds this lock, so a baton here was left by a build that died.
        with contextlib.suppress(FileNotFoundError):
            (folder / TORCH_BATON).unlink()
        yield
