"""Registry of MSDA implementations and the ``auto`` dispatch (xformers style).

Each implementation states why it cannot run on this machine (``unavailable_reasons``)
and why it cannot take a given call (``not_supported_reasons``). ``auto`` walks the
priority list of the inputs' device, reordered by recorded measurements
(``verification.measured_order``), and takes the first with no reasons whose results it
has verified on this device (``verification.verdict``); when nothing fits, the error
lists every candidate with its reasons. A name given explicitly is used as it is, without
verification. Under ``torch.use_deterministic_algorithms(True)`` only implementations that
declare a deterministic backward on the device (``MSDAImpl.DETERMINISTIC``) are taken.

Experiment variants (``register_variant``: the ``cpu`` kernel with one design choice
changed) have names of their own, listed by ``msda_variants()`` and not by
``msda_impls()``; ``auto`` never takes them, but ``get_impl``, ``impl=`` and the benchmark
and ablation tools accept their names.
"""

from __future__ import annotations

import logging
import warnings
from typing import Dict, List, Optional, Sequence, Set, Tuple

import torch

from . import call_plan, verification
from .call_plan import Kernel
from .inputs import MSDAInputs

logger = logging.getLogger("npudet")


class MSDAImpl:
    """One MSDA implementation. Subclasses set the class attributes and ``forward``."""

    NAME: str = ""
    DEVICES: Sequence[str] = ()
    DTYPES: Sequence[torch.dtype] = (torch.float32, torch.float64)
    MAX_HEAD_DIM: int = 1 << 30
    # Device types on which forward and backward give bitwise-identical results run to run
    # (at a fixed thread count): what torch.use_deterministic_algorithms(True) asks for.
    # None by default: atomic adds (mmcv, triton) or an undocumented vendor kernel.
    DETERMINISTIC: Sequence[str] = ()

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

    def build_info(self) -> str:
        """What build of this implementation runs here, for the log (e.g. the CPU kernel's
        instruction-set variant); empty when there is nothing to say."""
        return ""

    def bind(self, inputs: MSDAInputs) -> Kernel:
        """``forward`` for calls of ``inputs``' signature, with whatever can be decided from
        it decided now (kernel options, launch plans): what a steady-state call runs."""
        return self.forward


_REGISTRY: Dict[str, MSDAImpl] = {}
_VARIANTS: Set[str] = set()

# Fastest first; only names registered and usable are considered.
AUTO_PRIORITY: Dict[str, List[str]] = {
    "cpu": ["cpu", "gather", "grid_sample"],
    # mmcv's kernel is the proven one; triton moves ahead only on a recorded measurement.
    "cuda": ["mmcv", "triton", "gather", "grid_sample"],
    "npu": ["npu_vendor", "triton", "gather", "grid_sample"],
}
DEFAULT_PRIORITY: List[str] = ["gather", "grid_sample"]

_announced: set = set()


@torch.compiler.assume_constant_result
def _unavailable(name: str) -> tuple:
    """``unavailable_reasons`` of a registered name; a constant to ``torch.compile``."""
    return tuple(_REGISTRY[name].unavailable_reasons())


def register(impl: MSDAImpl) -> MSDAImpl:
    """Add an implementation under ``impl.NAME`` (replacing one of the same name)."""
    if not impl.NAME:
        raise ValueError("impl.NAME: expected a non-empty name")
    _REGISTRY[impl.NAME] = impl
    _VARIANTS.discard(impl.NAME)
    call_plan.clear()
    return impl


def register_variant(impl: MSDAImpl) -> MSDAImpl:
    """Add an experiment variant: selectable by name, never listed by ``msda_impls()``."""
    register(impl)
    _VARIANTS.add(impl.NAME)
    return impl


def get_impl(name: str) -> MSDAImpl:
    """The registered implementation or experiment variant called ``name``."""
    if name not in _REGISTRY:
        public = sorted(set(_REGISTRY) - _VARIANTS)
        raise ValueError(
            f"impl: unknown MSDA implementation {name!r}; expected 'auto' or one of "
            f"{public} (experiment variants: {sorted(_VARIANTS)})"
        )
    return _REGISTRY[name]


def registered_impls() -> List[str]:
    """Every registered name, variants included, usable here or not."""
    return sorted(_REGISTRY)


def msda_impls() -> List[str]:
    """Names of the implementations usable on this machine (no experiment variants)."""
    return [name for name in sorted(_REGISTRY) if name not in _VARIANTS and not _unavailable(name)]


def msda_variants() -> List[str]:
    """Names of the experiment variants usable on this machine."""
    return [name for name in sorted(_VARIANTS) if not _unavailable(name)]


def auto_order(device_type: str, dtype: Optional[torch.dtype] = None) -> List[str]:
    """The ``auto`` candidates for a device type, fastest first.

    Without ``dtype``, the static priority; with it, reordered by the verifications
    recorded for this device (``verification.measured_order``).
    """
    if dtype is None:
        return _static_order(device_type)
    return list(_measured_order(device_type, verification.dtype_name(dtype)))


def _static_order(device_type: str) -> List[str]:
    return [n for n in AUTO_PRIORITY.get(device_type, DEFAULT_PRIORITY) if n in _REGISTRY]


@torch.compiler.assume_constant_result
def _measured_order(device_type: str, dtype: str) -> tuple:
    """``auto_order(device_type, dtype)``; a constant to ``torch.compile``."""
    return tuple(verification.measured_order(_static_order(device_type), device_type, dtype))


def _verdict(name: str, device_type: str, dtype: torch.dtype) -> str:
    """Empty if ``auto`` may trust ``name`` here, else why not; a constant when compiling."""
    if torch.compiler.is_compiling():
        return verification.known_verdict(name, device_type, verification.dtype_name(dtype))
    return verification.verdict(name, device_type, dtype)


def _announce(name: str, inputs: MSDAInputs, rejected: List[Tuple[str, List[str]]]) -> None:
    """Log ``auto``'s choice on the ``npudet`` logger (a training run's log through
    ``npudet.engine``): INFO once per (device, dtype, choice, skipped), and a WARNING for
    each candidate skipped because it failed verification."""
    where = f"{inputs.device_type} {verification.dtype_name(inputs.dtype)}"
    build = _REGISTRY[name].build_info()
    skipped = "; ".join(f"{n}: {', '.join(r)}" for n, r in rejected)
    logger.info(
        "npudet MSDA auto on %s: using %r%s%s",
        where,
        name,
        f" ({build})" if build else "",
        f" (skipped {skipped})" if skipped else "",
    )
    for candidate, reasons in rejected:
        for reason in reasons:
            if reason.startswith("failed verification"):
                logger.warning("npudet MSDA auto on %s: not using %r: %s", where, candidate, reason)


def nondeterministic_reason(impl: MSDAImpl, inputs: MSDAInputs) -> str:
    """Why ``impl`` breaks deterministic mode for this call ('' when it does not).

    Only a call whose backward can run counts (an input requires grad, grad mode on), and
    only while ``torch.use_deterministic_algorithms(True)`` is set (mmengine's
    ``randomness=dict(deterministic=True)``).
    """
    if not (inputs.requires_grad and torch.is_grad_enabled()):
        return ""
    if not torch.are_deterministic_algorithms_enabled():
        return ""
    if inputs.device_type in impl.DETERMINISTIC:
        return ""
    return (
        f"backward not deterministic on {inputs.device_type} "
        "(torch.use_deterministic_algorithms(True) is set)"
    )


def select_impl(impl: str, inputs: MSDAInputs) -> MSDAImpl:
    """Resolve ``impl`` ('auto' or a name) for these inputs, or raise saying why not.

    Under ``torch.use_deterministic_algorithms(True)`` ``auto`` skips implementations whose
    backward is not deterministic on the device (``MSDAImpl.DETERMINISTIC``); one named
    explicitly raises RuntimeError, as torch's own nondeterministic ops do (a warning
    under ``warn_only=True``).
    """
    if impl != "auto":
        chosen = get_impl(impl)
        reasons = chosen.not_supported_reasons(inputs)
        if reasons:
            raise ValueError(
                f"impl={impl!r} cannot run these inputs: {'; '.join(reasons)}. "
                f"Use impl='auto' or one of {msda_impls()}"
            )
        nondeterministic = nondeterministic_reason(chosen, inputs)
        if nondeterministic:
            message = (
                f"impl={impl!r}: {nondeterministic}; use impl='auto' or one of "
                f"{[n for n in msda_impls() if inputs.device_type in _REGISTRY[n].DETERMINISTIC]}"
            )
            if not torch.is_deterministic_algorithms_warn_only_enabled():
                raise RuntimeError(message)
            warnings.warn(message, stacklevel=3)
        return chosen
    rejected = []
    for name in auto_order(inputs.device_type, inputs.dtype):
        reasons = _REGISTRY[name].not_supported_reasons(inputs)
        nondeterministic = nondeterministic_reason(_REGISTRY[name], inputs)
        if nondeterministic:
            reasons = [*reasons, nondeterministic]
        if not reasons:
            error = _verdict(name, inputs.device_type, inputs.dtype)
            reasons = [f"failed verification: {error}"] if error else []
        if not reasons:
            key = (inputs.device_type, inputs.dtype, name, tuple(r for r, _ in rejected))
            # Logging does not trace; a compiled call's choice is the eager one's.
            if not torch.compiler.is_compiling() and key not in _announced:
                _announced.add(key)
                _announce(name, inputs, rejected)
            return _REGISTRY[name]
        rejected.append((name, reasons))
    listed = "; ".join(f"{n}: {', '.join(r)}" for n, r in rejected) or "none registered"
    raise ValueError(f"impl='auto': no MSDA implementation supports these inputs ({listed})")
