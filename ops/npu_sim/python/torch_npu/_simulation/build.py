"""Build the simulated device's library once per source, torch and compiler; load it later.

The build lands in ``$NPUDET_EXT_CACHE`` (default ``~/.cache/npudet/ext``) under a folder
keyed by the source's bytes, torch's version and Python's, so every process of a run (and
every clone) shares it. One process builds at a time: an ``fcntl.flock`` on a lock file,
which the kernel releases when its holder dies, so a killed build never blocks a later one
(torch's own build lock, a file that outlives a killed owner, is removed under ours first).
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import sys
import time
from pathlib import Path

import torch

# ops/npu_sim/npu_sim.cpp, from ops/npu_sim/python/torch_npu/_simulation/build.py.
SOURCE = Path(__file__).resolve().parents[3] / "npu_sim.cpp"
NAME = "npudet_npu_sim"  # the library's name (TORCH_EXTENSION_NAME), not a Python module


def _cache_root() -> Path:
    named = os.environ.get("NPUDET_EXT_CACHE")
    return Path(named) if named else Path.home() / ".cache" / "npudet" / "ext"


def build_dir() -> Path:
    """The folder this source, torch and Python build into."""
    digest = hashlib.sha256(SOURCE.read_bytes())
    digest.update(f"{torch.__version__}|{sys.version_info[:2]}".encode())
    return _cache_root() / f"npu_sim-{digest.hexdigest()[:16]}"


def library_path() -> Path:
    """The built library, building it first if needed (about a minute, once)."""
    folder = build_dir()
    library = folder / f"{NAME}.so"
    if library.is_file():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "npudet.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(
                f"[npu_sim] waiting for another process building the simulated NPU in {folder}",
                file=sys.stderr,
                flush=True,
            )
            fcntl.flock(lock, fcntl.LOCK_EX)
        if library.is_file():
            return library
        (folder / "lock").unlink(missing_ok=True)
        from torch.utils.cpp_extension import load

        began = time.monotonic()
        print("[npu_sim] building the simulated NPU device (once)", file=sys.stderr, flush=True)
        load(
            NAME,
            [str(SOURCE)],
            build_directory=str(folder),
            is_python_module=False,
            extra_cflags=["-O2"],
        )
        print(
            f"[npu_sim] built in {time.monotonic() - began:.0f} s: {library}",
            file=sys.stderr,
            flush=True,
        )
    return library
