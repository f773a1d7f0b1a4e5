"""Registry of MSDA implementations and the ``auto`` dispatch (xformers style).

Each implementation states why it cannot run on this machine (``unavailable_reasons``)
and why it cannot take a given call (``not_supported_reasons``). ``auto`` walks the
priority list of the inputs' device and takes the first with no reasons; when nothing
fits, the error lists every candidate with its reasons.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
from typing import Callable, Dict, Iterator, List, Mapping, Optional, Sequence

import torch

from .inputs import MSDAInputs

logger = logging.getLogger("npudet")

MSDAFn = Callable[..., torch.Tensor]


class MSDAImpl:
    """One MSDA implementation. Subclasses set the class attributes and ``forward``."""

    NAME: str = ""
    DEVICES: Sequence[str] = ()
    DTYPES: Sequence[torch.dtype] = (torch.float32, torch.float64)
    MAX_HEAD_DIM: int = 1 << 30

    def unavailable_reasons(self) -> List[str]:
        """Why this implementation cannot run on this machine at all ([] if it can)."""
        return []

    def not_supported_reasons(self, inputs: MSDAInputs) -> List[str]:
        """Why this implementation cannot take a call with these inputs ([] if it can)."""
        reasons = list(_unavailable(self.NAME))
        if inputs.device_type not in self.DEVICES:
            reasons.append(f"device {inputs.device_type!r} not in {list(self.DEVICES)}")
        if inputs.dtype not in self.DTYPES:
            names = [str(d).replace("torch.", "") for d in self.DTYPES]
            reasons.append(f"dtype {inputs.dtype} not in {names}")
        if inputs.head_dim > self.MAX_HEAD_DIM:
            reasons.append(f"head_dim {inputs.head_dim} > {self.MAX_HEAD_DIM}")
        return reasons

    def forward(
        self,
        value: torch.Tensor,
        spatial_shapes: torch.Tensor,
        level_start_index: torch.Tensor,
        sampling_locations: torch.Tensor,
        attention_weights: torch.Tensor,
    ) -> torch.Tensor:
        """(bs, num_keys, heads, D), ... -> (bs, num_queries, heads * D)."""
        raise NotImplementedError


_REGISTRY: Dict[str, MSDAImpl] = {}

# Fastest first; only names registered and usable are considered.
AUTO_PRIORITY: Dict[str, List[str]] = {
    "cpu": ["cpu", "gather", "grid_sample"],
    "cuda": ["triton", "gather", "grid_sample"],
    "npu": ["npu_vendor", "triton", "gather", "grid_sample"],
}
DEFAULT_PRIORITY: List[str] = ["gather", "grid_sample"]

_announced: set = set()

_versions: Dict[str, Optional[str]] = {}
_assumed: Optional[Mapping[str, str]] = None


def package_version(package: str) -> Optional[str]:
    """``package.__version__`` ("" if it has none) when ``import package`` succeeds, else None.

    Tried once per process, then cached. Inside ``assume_packages`` the answer comes from
    the assumed mapping instead, so selection can be tested as a pure function.
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


@torch.compiler.assume_constant_result
def _unavailable(name: str) -> tuple:
    """``unavailable_reasons`` of a registered name; a constant to ``torch.compile``."""
    return tuple(_REGISTRY[name].unavailable_reasons())


def register(impl: MSDAImpl) -> MSDAImpl:
    """Add an implementation under ``impl.NAME`` (replacing one of the same name)."""
    if not impl.NAME:
        raise ValueError("impl.NAME: expected a non-empty name")
    _REGISTRY[impl.NAME] = impl
    return impl


def get_impl(name: str) -> MSDAImpl:
    """The registered implementation called ``name``."""
    if name not in _REGISTRY:
        raise ValueError(
            f"impl: unknown MSDA implementation {name!r}; expected 'auto' or one of "
            f"{sorted(_REGISTRY)}"
        )
    return _REGISTRY[name]


def registered_impls() -> List[str]:
    """Every registered name, usable here or not."""
    return sorted(_REGISTRY)


def msda_impls() -> List[str]:
    """Names of the implementations usable on this machine."""
    return [name for name in sorted(_REGISTRY) if not _unavailable(name)]


def auto_order(device_type: str) -> List[str]:
    """The ``auto`` candidates for a device type, fastest first."""
    order = AUTO_PRIORITY.get(device_type, DEFAULT_PRIORITY)
    return [name for name in order if name in _REGISTRY]


def select_impl(impl: str, inputs: MSDAInputs) -> MSDAImpl:
    """Resolve ``impl`` ('auto' or a name) for these inputs, or raise saying why not."""
    if impl != "auto":
        chosen = get_impl(impl)
        reasons = chosen.not_supported_reasons(inputs)
        if reasons:
            raise ValueError(
                f"impl={impl!r} cannot run these inputs: {'; '.join(reasons)}. "
                f"Use impl='auto' or one of {msda_impls()}"
            )
        return chosen
    rejected = []
    for name in auto_order(inputs.device_type):
        reasons = _REGISTRY[name].not_supported_reasons(inputs)
        if not reasons:
            key = (inputs.device_type, name, tuple(r for r, _ in rejected))
            if key not in _announced:
                _announced.add(key)
                skipped = "; ".join(f"{n}: {', '.join(r)}" for n, r in rejected)
                logger.info(
                    "npudet MSDA auto on %s: using %r%s",
                    inputs.device_type,
                    name,
                    f" (skipped {skipped})" if skipped else "",
                )
            return _REGISTRY[name]
        rejected.append((name, reasons))
    listed = "; ".join(f"{n}: {', '.join(r)}" for n, r in rejected) or "none registered"
    raise ValueError(f"impl='auto': no MSDA implementation supports these inputs ({listed})")
