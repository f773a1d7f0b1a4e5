"""Build-on-first-use of the native kernels in ``ops/`` with ``torch.utils.cpp_extension``.

Builds land in a cache keyed by the source, torch, Python and CPU, so a second process
loads in milliseconds. Set ``NPUDET_EXT_CACHE`` to move the cache.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Dict, List, Optional, Union

import torch

SOURCE_ROOT = Path(__file__).resolve().parents[3] / "ops"

_loaded: Dict[str, Union[ModuleType, str]] = {}


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("model name", "flags", "Features")):
                    return line
    except OSError:
        pass
    return platform.processor()


# -fno-trapping-math lets the compiler vectorise branch-free selects and floor (nothing
# here runs with floating-point traps enabled; NaN and inf are still honoured).
FLAGS = ["-O3", "-fopenmp", "-march=native", "-ffp-contract=fast", "-fno-trapping-math"]


def cache_dir(name: str, sources: List[Path]) -> Path:
    """The build folder for extension ``name`` from ``sources`` and ``FLAGS`` on this machine."""
    digest = hashlib.sha256()
    for src in sources:
        digest.update(src.read_bytes())
    for part in (*FLAGS, torch.__version__, sys.version, platform.machine(), _cpu_model()):
        digest.update(part.encode())
    root = Path(os.environ.get("NPUDET_EXT_CACHE", Path.home() / ".cache" / "npudet" / "ext"))
    return root / f"{name}-{digest.hexdigest()[:16]}"


def compiler_missing() -> Optional[str]:
    """Why no C++ extension can be built here, or None."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx!r} not on PATH; set CXX)"
    return None


def load_extension(name: str, relative_sources: List[str]) -> Union[ModuleType, str]:
    """Build (once) and import an extension; on failure return the reason as a string."""
    if name in _loaded:
        return _loaded[name]
    missing = compiler_missing()
    if missing:
        _loaded[name] = missing
        return missing
    sources = [SOURCE_ROOT / rel for rel in relative_sources]
    absent = [str(s) for s in sources if not s.is_file()]
    if absent:
        _loaded[name] = f"kernel sources not found: {absent} (install npudet from a checkout)"
        return _loaded[name]
    from torch.utils.cpp_extension import load

    build = cache_dir(name, sources)
    build.mkdir(parents=True, exist_ok=True)
    try:
        module = load(
            name=name,
            sources=[str(s) for s in sources],
            extra_cflags=FLAGS,
            extra_ldflags=["-fopenmp"],
            build_directory=str(build),
            verbose=False,
        )
    except Exception as exc:  # a compiler error, a missing header: fall back, say why
        lines = str(exc).strip().splitlines()
        errors = [line for line in lines if "error" in line.lower()] or lines[-1:]
        reason = f"building {name} failed: {errors[0].strip()[:300]}"
        warnings.warn(f"npudet: {reason}; MSDA falls back to other implementations", stacklevel=2)
        _loaded[name] = reason
        return reason
    _loaded[name] = module
    return module
