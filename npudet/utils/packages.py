"""Which optional packages import here, asked once per process and stateable in tests.

Selection code (MSDA ``auto``, the NPU setup hook, device detection) asks these probes
instead of importing packages itself, so ``assume_packages`` can state the answers and
selection is tested as a pure function. Imports only the standard library.
"""

from __future__ import annotations

import contextlib
import importlib
from typing import Dict, Iterator, Mapping, Optional

_versions: Dict[str, Optional[str]] = {}
_assumed: Optional[Mapping[str, str]] = None


def package_version(package: str) -> Optional[str]:
    """``package.__version__`` ("" if it has none) when ``import package`` succeeds, else None.

    Tried once per process, then cached. Inside ``assume_packages`` the answer comes from
    the assumed mapping instead.
    """
    if _assumed is not None:
        return _assumed.get(package)
    if package not in _versions:
        try:
            module = importlib.import_module(package)
        except Exception:  # absent, or present but broken (no driver, ABI mismatch)
            _versions[package] = None
        else:
            _versions[package] = str(getattr(module, "__version__", ""))
    return _versions[package]


def importable(package: str) -> bool:
    """Whether ``import package`` succeeds here (see ``package_version``)."""
    return package_version(package) is not None


@contextlib.contextmanager
def assume_packages(versions: Mapping[str, str]) -> Iterator[None]:
    """Within the block exactly these packages import, at these versions; nothing is imported."""
    global _assumed
    previous, _assumed = _assumed, dict(versions)
    try:
        yield
    finally:
        _assumed = previous
