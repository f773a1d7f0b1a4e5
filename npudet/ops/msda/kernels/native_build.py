"""Build-on-first-use of the native kernels with ``torch.utils.cpp_extension``.

The sources are this package's ``csrc/`` (shipped as package data: the same place in a
checkout and in an installed wheel). Builds land in a cache keyed by the extension name, the
sources, the compiler flags, torch, Python and the architecture (and the CPU model for a
build tied to one CPU), so a second process loads in milliseconds. Set ``NPUDET_EXT_CACHE``
to move the cache.

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
from typing import Dict, List, Optional, Sequence, Union

import torch

CSRC = Path(__file__).resolve().parent / "csrc"

_loaded: Dict[str, Union[ModuleType, str]] = {}

# -fno-trapping-math lets the compiler vectorise branch-free selects and floor (nothing
# here runs with floating-point traps enabled; NaN and inf are still honoured). The
# instruction set (-march) is the caller's: one build per variant.
FLAGS = ["-O3", "-fopenmp", "-ffp-contract=fast", "-fno-trapping-math"]


def _cpu_model() -> str:
    """The CPU's model and feature lines, for the key of a build tied to this CPU."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def source_root(relative_sources: Sequence[str]) -> Optional[Path]:
    """``CSRC`` if it holds every one of ``relative_sources``, else None."""
    return CSRC if all((CSRC / rel).is_file() for rel in relative_sources) else None


def cache_dir(
    name: str, sources: Sequence[Path], flags: Sequence[str], cpu_specific: bool = False
) -> Path:
    """The build folder for extension ``name`` from ``sources`` compiled with ``flags``."""
    digest = hashlib.sha256()
    headers = sorted({h for src in sources for h in src.parent.glob("*.h")})
    for src in [*sources, *headers]:  # a header edit must rebuild too
        digest.update(src.read_bytes())
    parts = [*flags, torch.__version__, sys.version, platform.machine()]
    if cpu_specific:
        parts.append(_cpu_model())
    for part in parts:
        digest.update(part.encode())
    root = Path(os.environ.get("NPUDET_EXT_CACHE", Path.home() / ".cache" / "npudet" / "ext"))
    return root / f"{name}-{digest.hexdigest()[:16]}"


def compiler_missing() -> Optional[str]:
    """Why no C++ extension can be built here, or None."""
    cxx = os.environ.get("CXX", "c++")
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx!r} not on PATH; set CXX)"
    return None


def load_extension(
    name: str,
    relative_sources: List[str],
    extra_flags: Sequence[str] = (),
    cpu_specific: bool = False,
    extra_ldflags: Sequence[str] = (),
) -> Union[ModuleType, str]:
    """Build (once) and import extension ``name``; on failure return the reason as a string.

    ``relative_sources`` are paths under ``csrc/``; ``extra_flags`` follow ``FLAGS`` (e.g.
    ``-march=x86-64-v3``); ``cpu_specific`` keys the cache by this CPU (``-march=native``);
    ``extra_ldflags`` follow ``-fopenmp`` at link time.
    Each distinct build needs a distinct ``name``: torch imports an extension by name.
    """
    if name in _loaded:
        return _loaded[name]
    missing = compiler_missing()
    if missing:
        _loaded[name] = missing
        return missing
    root = source_root(relative_sources)
    if root is None:
        _loaded[name] = f"kernel sources {relative_sources} not found under {CSRC}"
        return _loaded[name]
    from torch.utils.cpp_extension import load

    sources = [root / rel for rel in relative_sources]
    flags = [*FLAGS, *extra_flags]
    build = cache_dir(name, sources, flags, cpu_specific)
    build.mkdir(parents=True, exist_ok=True)
    try:
        module = load(
            name=name,
            sources=[str(s) for s in sources],
            extra_cflags=flags,
            extra_ldflags=["-fopenmp", *extra_ldflags],
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
