"""Build-on-first-use of the native operator libraries with ``torch.utils.cpp_extension``.

The sources are the repository's top-level ``ops/`` (one folder per library, see its
README). A checkout and an editable install read them there; a wheel carries them as
``npudet/_native/`` (``setup.py``). A library is built as a plain shared object that
registers torch operators (``TORCH_LIBRARY``) and links libtorch only, never
libtorch_python: a C++ program with no Python can load the same build. Builds land in a
cache keyed by the library's name, its folder's sources, the compiler and its flags, torch,
Python and the architecture (and the CPU model for a build tied to one CPU), so a second
process loads in milliseconds. ``NPUDET_EXT_CACHE`` moves the cache.

One process builds a folder at a time (:func:`build_lock`): an ``fcntl.flock`` that the
kernel drops when its owner dies, so a killed build never blocks a later one. A compiler
stopped by SIGINT is the user's Ctrl-C: :class:`BuildInterrupted` ends the process, never a
fall back to another build (a background job ignores SIGINT in Python, so only ninja and the
compiler see it).
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import torch

from .build_lock import build_lock

_PACKAGE = Path(__file__).resolve().parents[3]  # the npudet package folder
# Where the native sources are, in order: inside an installed wheel, then the checkout.
SOURCE_ROOTS = (_PACKAGE / "_native", _PACKAGE.parent / "ops")
CACHE_ENV = "NPUDET_EXT_CACHE"

_loaded: Dict[str, Union[Path, str]] = {}

# -fno-trapping-math lets the compiler vectorise branch-free selects and floor (nothing
# here runs with floating-point traps enabled; NaN and inf are still honoured). The
# instruction set (-march) is the caller's: one build per variant.
FLAGS = ["-O3", "-fopenmp", "-ffp-contract=fast", "-fno-trapping-math"]
# cpp_extension links every library against libtorch_python; --as-needed drops it (and any
# other library whose symbols the sources do not use), so the build loads without Python.
LDFLAGS = ["-Wl,--as-needed", "-fopenmp"]


class BuildInterrupted(KeyboardInterrupt):
    """A native build stopped because its compiler was interrupted (SIGINT): the user asked
    the run to end. A KeyboardInterrupt, so no ``except Exception`` on the way (a fallback to
    another build) takes it."""


def build_interrupted(exc: BaseException) -> bool:
    """Whether the failed build ``exc`` (``torch.utils.cpp_extension``'s error, its cause
    ninja's ``CalledProcessError``) stopped on SIGINT: ninja takes Ctrl-C to its process
    group (its own handler, also where Python ignores SIGINT), stops its compilers and says
    "interrupted by user"; a ninja that died of SIGINT itself exits with -SIGINT."""
    seen: Optional[BaseException] = exc
    while seen is not None:
        if isinstance(seen, subprocess.CalledProcessError) and seen.returncode == -signal.SIGINT:
            return True
        output = getattr(seen, "output", None)
        if isinstance(output, bytes):
            output = output.decode(errors="replace")
        if "interrupted by user" in f"{seen}\n{output or ''}":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _cpu_model() -> str:
    """The CPU's model and feature lines, for the key of a build tied to this CPU."""
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return platform.processor()


def source_root(relative_sources: Sequence[str]) -> Optional[Path]:
    """The first of ``SOURCE_ROOTS`` that holds every one of ``relative_sources``, or None."""
    for root in SOURCE_ROOTS:
        if all((root / rel).is_file() for rel in relative_sources):
            return root
    return None


def native_path(relative: str) -> Optional[Path]:
    """The file or folder ``relative`` under the first of ``SOURCE_ROOTS`` that has it, or None."""
    for root in SOURCE_ROOTS:
        if (root / relative).exists():
            return root / relative
    return None


def compiler() -> str:
    """The C++ compiler torch's extensions use: ``$CXX``, else ``c++``."""
    return os.environ.get("CXX", "c++")


@functools.cache
def compiler_version(cxx: Optional[str] = None) -> str:
    """The first line ``cxx --version`` prints (``"c++ (Debian 12.2.0-14) 12.2.0"``), or why
    there is none; part of every build key and of the ``cpu`` records' key."""
    cxx = cxx or compiler()
    try:
        done = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unavailable: {exc}"
    lines = done.stdout.strip().splitlines()
    return lines[0] if done.returncode == 0 and lines else f"unavailable: exit {done.returncode}"


def cache_root() -> Path:
    """``$NPUDET_EXT_CACHE``, else ``~/.cache/npudet/ext``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "npudet" / "ext")


def cache_dir(
    name: str, sources: Sequence[Path], flags: Sequence[str], cpu_specific: bool = False
) -> Path:
    """The build folder for library ``name`` from ``sources`` compiled with ``flags``."""
    digest = hashlib.sha256()
    headers = sorted({h for src in sources for h in src.parent.glob("*.h")})
    for src in [*sources, *headers]:  # a header edit must rebuild too
        digest.update(src.read_bytes())
    parts = [*flags, compiler_version(), torch.__version__, sys.version, platform.machine()]
    if cpu_specific:
        parts.append(_cpu_model())
    for part in parts:
        digest.update(part.encode())
    return cache_root() / f"{name}-{digest.hexdigest()[:16]}"


def compiler_missing() -> Optional[str]:
    """Why no C++ library can be built here, or None."""
    cxx = compiler()
    if shutil.which(cxx) is None:
        return f"no C++ compiler ({cxx!r} not on PATH; set CXX)"
    return None


def first_error(text: str) -> str:
    """The line of a compiler's output worth showing: its first diagnostic
    (``file:line: error:``), else the first line naming an error, else the last line ("" for
    no output)."""
    lines = text.strip().splitlines()
    errors = (
        [line for line in lines if "error:" in line]
        or [line for line in lines if "error" in line.lower()]
        or lines[-1:]
        or [""]
    )
    return errors[0].strip()[:300]


def load_library(
    name: str,
    relative_sources: List[str],
    extra_flags: Sequence[str] = (),
    cpu_specific: bool = False,
    extra_ldflags: Sequence[str] = (),
    what: str = "",
) -> Union[Path, str]:
    """Build (once) and load operator library ``name``: its path, or why not (a string).

    ``relative_sources`` are paths under the native source root; ``extra_flags`` follow
    ``FLAGS`` (e.g. ``-march=x86-64-v3``); ``cpu_specific`` keys the cache by this CPU
    (``-march=native``); ``extra_ldflags`` follow ``LDFLAGS``; ``what`` names the library
    in the line printed when a build starts. A failure warns once and is remembered, but
    for a compiler interrupted by SIGINT: :class:`BuildInterrupted`. Each distinct build
    needs a distinct ``name``: torch loads a library by its file name.
    """
    if name in _loaded:
        return _loaded[name]
    missing = compiler_missing()
    if missing:
        _loaded[name] = missing
        return missing
    root = source_root(relative_sources)
    if root is None:
        where = " or ".join(str(r) for r in SOURCE_ROOTS)
        _loaded[name] = f"native sources {relative_sources} not found under {where}"
        return _loaded[name]
    sources = [root / rel for rel in relative_sources]
    flags = [*FLAGS, *extra_flags]
    try:
        build = cache_dir(name, sources, flags, cpu_specific)
        library = build / f"{name}.so"
        # The folder's key already names the sources, compiler and flags: a library there is
        # current, and loading it directly skips ninja's check (and a rebuild when only the
        # compiler's path differs). One that does not load (a build cut short) is rebuilt.
        if library.is_file() and _loads(library):
            _loaded[name] = library
            return library
        build.mkdir(parents=True, exist_ok=True)
        with build_lock(build, what or name):
            # Another process may have built it while this one waited for the lock.
            if not (library.is_file() and _loads(library)):
                _build(name, sources, flags, [*LDFLAGS, *extra_ldflags], build, what)
    except Exception as exc:  # a compiler error, a missing header, an unusable cache: say why
        if build_interrupted(exc):
            raise BuildInterrupted(
                f"building {what or name} stopped: its compiler was interrupted (SIGINT)"
            ) from None
        reason = f"building {name} failed: {first_error(str(exc)) or repr(exc)}"
        warnings.warn(f"npudet: {reason}", stacklevel=2)
        _loaded[name] = reason
        return reason
    _loaded[name] = library
    return library


def _build(
    name: str,
    sources: List[Path],
    flags: List[str],
    ldflags: List[str],
    build: Path,
    what: str,
) -> None:
    """Compile and load ``name`` into ``build`` (the caller holds its build lock)."""
    from torch.utils.cpp_extension import load

    print(
        f"npudet: building {what or name} into {build} (once; about a minute)",
        file=sys.stderr,
        flush=True,
    )
    load(
        name=name,
        sources=[str(s) for s in sources],
        extra_cflags=flags,
        extra_ldflags=ldflags,
        build_directory=str(build),
        is_python_module=False,
        verbose=False,
    )


def _loads(library: Path) -> bool:
    """Load ``library`` into this process; False if the file is not a loadable library."""
    try:
        torch.ops.load_library(str(library))
    except OSError:
        return False
    return True
