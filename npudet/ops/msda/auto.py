"""``auto``: the fastest implementation that fits a call and is trusted on its device.

``select_impl`` walks the priority list of the inputs' device (``AUTO_PRIORITY``),
reordered by recorded measurements (``measured_order``), and takes the first with no
reasons (``MSDAImpl.not_supported_reasons``) whose results it has verified on this device
(``untrusted_reason``); when nothing fits, the error lists every candidate with its
reasons. A name given explicitly is used as it is, without verification. Under
``torch.use_deterministic_algorithms(True)`` only implementations that declare a
deterministic backward on the device (``MSDAImpl.DETERMINISTIC``) are taken.

``auto`` verifies before it trusts: per-process checks and recorded verifications.

The first time ``auto`` would hand a call on (device, dtype) to an implementation, it asks
``untrusted_reason``: "" (trusted) or why not. The device is the one the inputs are on (its
index), named by its model and capability (``verification.device_identity``:
``"NVIDIA H100 80GB HBM3 (sm_90)"``), so a check made on one GPU model is not trusted for
another in the same machine. The answer (the trust decision) comes from, in order:

1. this process's earlier trust decision for (device, implementation, dtype);
2. a record written by ``tools/misc/check_device.py --save`` for this device model
   (``verification.records``), if it is current: its key (``records.fingerprint``) must equal this
   process's. The key holds everything that changes the answer: a hash of the sources the
   implementation runs (its modules, the C++ kernel, the Triton kernels and launch
   planners), the CPU kernel's instruction-set variant, the torch / triton / triton-ascend /
   mmcv / mx_driving / torch_npu versions and the device's driver (the device's model and
   capability are in the file's device key). A stale record is ignored with one log line
   naming what changed, and the implementation is checked again;
3. ``verification.parity.check_impl``: one small call (``parity.PROBE_CASE``: bs 2, levels 6x4 and
   3x2, 32 queries, 4 heads, head_dim 32, 4 points, some points off the map), forward and
   the gradients of value, locations and weights, against ``grid_sample`` computed in
   float64 on the CPU from the same (dtype-rounded) inputs, run on the inputs' device.

A failing implementation is skipped with one ``RuntimeWarning`` naming it and the error.
Not checked, and why:

- ``grid_sample``: it is the reference the others are checked against;
- ``meta`` tensors: they carry no values, nothing is computed;
- a device type this process has no device for (``MSDAInputs`` descriptions in planning
  and tests): no tensor can reach an implementation there, so nothing would run.

On the CPU ``cpu`` and ``gather`` are checked like every other implementation: the ``cpu``
kernel is compiled on the user's machine for its instruction set, which no test suite run
elsewhere has seen. A process checks the one it uses per dtype: 9-16 ms for the first,
4-6 ms for each further dtype (measured on a busy 2-core machine, the check on one
intra-op thread; ``tests/ops/msda/test_msda_dispatch.py`` holds it under 50 ms). The key is worked
out at most once per process per (implementation, device type), and only when a record
exists: sources are hashed once per process.

Under ``torch.compile`` nothing runs inside the trace: ``select_impl`` asks
``known_untrusted_reason``, which dynamo evaluates once, outside the graph, as a constant; it
runs the check as plain eager code when no decision is known yet.

The trust decisions and orders are kept per process and forgotten (``reset``) when
``records.save_records`` writes the record file.
"""

from __future__ import annotations

import logging
import warnings
from typing import Dict, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import _disable_current_modes

from npudet.utils.torch_compat import assume_constant_result, is_compiling

from . import call_plan
from .inputs import MSDAInputs
from .registry import MSDAImpl, get_impl, msda_impls, registered_impls
from .verification import parity, records
from .verification.records import DType, Record, current_device_name, dtype_name

logger = logging.getLogger("npudet")

# Fastest first; only names registered and usable are considered.
AUTO_PRIORITY: Dict[str, List[str]] = {
    "cpu": ["cpu", "gather", "grid_sample"],
    # mmcv's kernel is the proven one; triton moves ahead only on a recorded measurement.
    "cuda": ["mmcv", "triton", "gather", "grid_sample"],
    # gather_det before gather: gather's value gradient (aten::_embedding_bag_backward) has
    # no NPU kernel in torch_npu, which runs it through its CPU fallback (a host round trip
    # per layer and step); gather_det's (index_put_ with accumulate) has one, and it is the
    # one whose backward is deterministic on npu (deterministic mode).
    "npu": ["npu_vendor", "triton", "gather_det", "gather", "grid_sample"],
}
DEFAULT_PRIORITY: List[str] = ["gather", "grid_sample"]

_announced: set = set()


# Per process: (device type, device identity, impl, dtype name) -> "" or the error; records by
# file path; measured orders by (device type, identity, dtype name, static order); stale records
# already logged; the ``records.generation()`` they were worked out at.
_decisions: Dict[Tuple[str, str, str, str], str] = {}
_loaded: Dict[str, dict] = {}
_orders: Dict[Tuple[str, str, str, Tuple[str, ...]], List[str]] = {}
_stale_logged: set = set()
_generation = records.generation()


def reset() -> None:
    """Forget this process's trust decisions, loaded records and orders (done after
    ``records.save_records``).

    Fingerprints are kept: the sources and packages of a running process do not change.
    """
    global _generation
    _decisions.clear()
    _loaded.clear()
    _orders.clear()
    _stale_logged.clear()
    _generation = records.generation()
    call_plan.clear()  # the plans were decided on these trust decisions


def _current() -> None:
    """``reset`` if the record file was written since the cached answers were worked out."""
    if _generation != records.generation():
        reset()


def _parse(device: str) -> Tuple[str, Optional[int]]:
    """``"cuda:1"`` -> ("cuda", 1), ``"npu"`` -> ("npu", None); parsed by hand, as
    ``torch.device`` refuses ``npu`` until torch_npu is imported."""
    device_type, _, index = str(device).partition(":")
    return device_type, int(index) if index else None


def _where(device: str) -> Tuple[str, Optional[str]]:
    """(device type, identity) of ``device`` (``"cuda"``, ``"cuda:1"``, ``"cpu"``): identity
    None when this process has no such device."""
    device_type, index = _parse(device)
    return device_type, current_device_name(device_type, index)


def _record(device_type: str, name: Optional[str], impl: str, dtype: str) -> Optional[Record]:
    """``recorded`` for device ``name`` if current, the file read once per process.

    An unreadable file is ignored with one warning: the checks then decide, as without one.
    A stale record (``stale_reasons``) is ignored with one log line.
    """
    if name is None:
        return None
    path = records.records_path()
    if path not in _loaded:
        try:
            _loaded[path] = records.load_records(path)
        except (OSError, ValueError, TypeError) as exc:  # JSON errors are ValueErrors
            warnings.warn(f"npudet MSDA auto: ignoring {path}: {exc}", RuntimeWarning, stacklevel=2)
            _loaded[path] = {}
    record = records.lookup(_loaded[path], device_type, name, impl, dtype)
    if record is None:
        return None
    stale = records.stale_reasons(record, device_type)
    if not stale:
        return record
    if (device_type, name, impl, dtype) not in _stale_logged:
        _stale_logged.add((device_type, name, impl, dtype))
        logger.warning(
            "npudet MSDA auto: the recorded verification of %r %s on %s (%s) is stale (%s); "
            "checking it again (tools/misc/check_device.py --save records it anew)",
            impl,
            dtype,
            device_type,
            name,
            "; ".join(stale),
        )
    return None


def exempt(impl: str, device: str) -> bool:
    """Whether ``impl`` on ``device`` (a type, or ``"cuda:1"``) is trusted without a check
    (module docstring)."""
    return impl == parity.REFERENCE or _where(device)[1] is None


def untrusted_reason(impl: str, device: str, dtype: DType) -> str:
    """Empty if ``auto`` may hand ``device``'s ``dtype`` calls to ``impl``, else why not.

    ``device``: a device type (its current device) or ``"cuda:1"``. Runs ``parity.check_impl``
    at most once per process per (device model and capability, impl, dtype), on that device; a
    failure warns once.
    """
    _current()
    device_type, name = _where(device)
    key = (device_type, name or "", impl, dtype_name(dtype))
    if key not in _decisions:
        _decisions[key] = _decide(device, name, impl, key[3])
        if _decisions[key]:
            where = f"{device_type} ({name})" if name and device_type != "cpu" else device_type
            warnings.warn(
                f"npudet MSDA auto: skipping {impl!r} on {where} {key[3]}: {_decisions[key]}",
                RuntimeWarning,
                stacklevel=4,
            )
    return _decisions[key]


def _decide(device: str, name: Optional[str], impl: str, dtype: str) -> str:
    if impl == parity.REFERENCE or name is None:  # exempt
        return ""
    record = _record(_parse(device)[0], name, impl, dtype)
    if record is not None:
        return "" if record.correct else f"recorded by tools/misc/check_device.py: {record.error}"
    # Real tensors even when the caller runs under a dispatch mode (fake tensors, counters).
    with _disable_current_modes():
        return parity.check_impl(impl, device, getattr(torch, dtype))


@assume_constant_result
def known_untrusted_reason(impl: str, device: str, dtype: str) -> str:
    """``untrusted_reason`` as a constant to ``torch.compile``: evaluated eagerly, never traced."""
    return untrusted_reason(impl, device, dtype)


def measured_order(order: List[str], device: str, dtype: DType) -> List[str]:
    """``order`` with the recorded-correct, timed implementations sorted by recorded time.

    Each keeps to the slots those implementations hold in ``order``; the others stay put.
    Worked out once per process per (device model and capability, dtype, order).
    """
    _current()
    device_type, name = _where(device)
    key = (device_type, name or "", dtype_name(dtype), tuple(order))
    if key not in _orders:
        _orders[key] = _measured_order(order, device_type, name, dtype_name(dtype))
    return list(_orders[key])


def _measured_order(
    order: List[str], device_type: str, device: Optional[str], dtype: str
) -> List[str]:
    if device is None:
        return list(order)
    times = {}
    for name in order:
        ms = _recorded_ms(device_type, device, name, dtype)
        if ms is not None:
            times[name] = ms
    slots = [i for i, name in enumerate(order) if name in times]
    ranked = sorted((name for name in order if name in times), key=times.__getitem__)
    result = list(order)
    for slot, name in zip(slots, ranked):
        result[slot] = name
    return result


def _recorded_ms(device_type: str, device: str, impl: str, dtype: str) -> Optional[float]:
    """Recorded fwd+bwd ms of a correct ``impl`` on ``device`` (its identity): the dtype's
    own, else float32's."""
    own = _record(device_type, device, impl, dtype)
    if own is not None and not own.correct:
        return None
    if own is not None and own.fwd_bwd_ms is not None:
        return own.fwd_bwd_ms
    fallback = _record(device_type, device, impl, "float32")
    if fallback is not None and fallback.correct:
        return fallback.fwd_bwd_ms
    return None


def auto_order(device: str, dtype: Optional[torch.dtype] = None) -> List[str]:
    """The ``auto`` candidates for a device (a type, or ``"cuda:1"``), fastest first.

    Without ``dtype``, the static priority of its type; with it, reordered by the
    verifications recorded for this device model (``measured_order``).
    """
    if dtype is None:
        return _static_order(_parse(device)[0])
    return list(_constant_order(device, dtype_name(dtype)))


def _static_order(device_type: str) -> List[str]:
    registered = set(registered_impls())
    return [n for n in AUTO_PRIORITY.get(device_type, DEFAULT_PRIORITY) if n in registered]


@assume_constant_result
def _constant_order(device: str, dtype: str) -> tuple:
    """``auto_order(device, dtype)``; a constant to ``torch.compile``."""
    return tuple(measured_order(_static_order(_parse(device)[0]), device, dtype))


def _untrusted_reason(name: str, device: str, dtype: torch.dtype) -> str:
    """Empty if ``auto`` may trust ``name`` here, else why not; a constant when compiling."""
    if is_compiling():
        return known_untrusted_reason(name, device, dtype_name(dtype))
    return untrusted_reason(name, device, dtype)


def _announce(name: str, inputs: MSDAInputs, rejected: List[Tuple[str, List[str]]]) -> None:
    """Log ``auto``'s choice on the ``npudet`` logger (a training run's log through
    ``npudet.engine``): INFO once per (device, dtype, choice, skipped), and a WARNING for
    each candidate skipped because it failed verification."""
    where = f"{inputs.device_type} {dtype_name(inputs.dtype)}"
    build = get_impl(name).build_info()
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
                f"{[n for n in msda_impls() if inputs.device_type in get_impl(n).DETERMINISTIC]}"
            )
            if not torch.is_deterministic_algorithms_warn_only_enabled():
                raise RuntimeError(message)
            warnings.warn(message, stacklevel=3)
        return chosen
    rejected = []
    for name in auto_order(inputs.device, inputs.dtype):
        candidate = get_impl(name)
        reasons = candidate.not_supported_reasons(inputs)
        nondeterministic = nondeterministic_reason(candidate, inputs)
        if nondeterministic:
            reasons = [*reasons, nondeterministic]
        if not reasons:
            error = _untrusted_reason(name, inputs.device, inputs.dtype)
            reasons = [f"failed verification: {error}"] if error else []
        if not reasons:
            key = (inputs.device_type, inputs.dtype, name, tuple(r for r, _ in rejected))
            # Logging does not trace; a compiled call's choice is the eager one's.
            if not is_compiling() and key not in _announced:
                _announced.add(key)
                _announce(name, inputs, rejected)
            return candidate
        rejected.append((name, reasons))
    listed = "; ".join(f"{n}: {', '.join(r)}" for n, r in rejected) or "none registered"
    raise ValueError(f"impl='auto': no MSDA implementation supports these inputs ({listed})")
