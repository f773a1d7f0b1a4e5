"""``auto`` verifies before it trusts: per-process checks and recorded verifications.

The first time ``auto`` would hand a call on (device type, dtype) to an implementation,
it asks ``verdict``: "" (trusted) or why not. The answer comes from, in order:

1. this process's earlier verdict for (device type, implementation, dtype);
2. a record written by ``tools/check_device.py --save`` for this device, if it is current:
   its key (``fingerprint``) must equal this process's. The key holds everything that
   changes the answer: a hash of the sources the implementation runs (its modules, the C++
   kernel, the Triton kernels and launch planners), the CPU kernel's instruction-set
   variant, the torch / triton / triton-ascend / mmcv / mx_driving / torch_npu versions and
   the device's driver (the device name is in the file's device key). A stale record is
   ignored with one log line naming what changed, and the implementation is checked again;
3. ``check_impl``: one small call (bs 2, levels 6x4 and 3x2, 32 queries, 4 heads, head_dim
   32, 4 points, some points off the map), forward and the gradients of value, locations
   and weights, against ``grid_sample`` computed in float64 on the CPU from the same
   (dtype-rounded) inputs.

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
intra-op thread; ``tests/test_msda_dispatch.py`` holds it under 50 ms). The key is worked
out at most once per process per (implementation, device type), and only when a record
exists: sources are hashed once per process.

Under ``torch.compile`` nothing runs inside the trace: ``select_impl`` asks ``known_verdict``,
which dynamo evaluates once, outside the graph, as a constant; it runs the check as plain
eager code when no verdict is known yet.

Record store (``NPUDET_VERIFY_FILE``, default ``~/.cache/npudet/verified.json``)::

    {"version": 2,
     "devices": {"cuda|NVIDIA L4": {
         "device_type": "cuda", "device_name": "NVIDIA L4",
         "records": {"triton": {"float32": {
             "correct": true, "error": "", "fwd_bwd_ms": 3.1, "case": "ddetr-enc",
             "key": {"sources": "3f2a...", "isa": null, "torch": "2.6.0", "triton": "3.2.0",
                     "triton-ascend": null, "mmcv": "2.1.0", "mx_driving": null,
                     "torch_npu": null, "driver": "550.54.15"}}}}}}}

``save_records`` merges (same implementation and dtype replaced), ``load_records`` reads
the whole file (a file of an older format raises ``ValueError``; ``save_records`` replaces
it), ``recorded`` looks one record up as stored and ``stale_reasons`` says whether it is
current. ``auto`` orders the implementations that a current record calls correct and times
by their recorded forward+backward time (the dtype's own, else float32's) within the slots
they hold in the static priority list, so on CUDA ``triton`` goes before ``mmcv`` only where
a record says it is correct and faster on this GPU.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import sys
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Tuple, Union

import torch
from torch.utils._python_dispatch import _disable_current_modes

from npudet.utils.device import device_name
from npudet.utils.json_io import write_json_atomic

from . import call_plan

logger = logging.getLogger(__name__)

VERIFY_FILE_ENV = "NPUDET_VERIFY_FILE"
REFERENCE = "grid_sample"
FORMAT_VERSION = 2

# Files an implementation runs besides the modules of its classes, by the ``NAME`` of a
# class in its MRO (so the ``cpu_*`` variants inherit ``cpu``'s). Paths are relative to
# this package; ``ops:`` ones are the native sources, found where the kernel build finds
# them (the checkout's ``ops/``, an installed package's ``_ops/``); a trailing ``/`` takes
# every file of that folder; ``env:NAME`` is the file the environment variable names (a
# library built on the machine). An implementation with kernel files of its own lists them.
KERNEL_SOURCES: Dict[str, Tuple[str, ...]] = {
    "cpu": ("ops:cpu/", "cpu_options.py", "native_build.py"),
    # mmcv's own build is keyed by mmcv's version; the ``cuda_lib`` route by its sources and
    # the library $NPUDET_MMCV_CUDA_LIB names (``mmcv_cuda_lib``).
    "mmcv": ("mmcv_cuda_lib.py", "ops:cuda/", "env:NPUDET_MMCV_CUDA_LIB"),
    "triton": (
        "triton_kernels.py",
        "triton_launch.py",
        "triton_ascend_kernels.py",
        "triton_ascend_launch.py",
    ),
}
# Distributions whose version is part of every record's key: the code under each
# implementation (torch for all; triton and triton-ascend for ``triton``; mmcv for ``mmcv``
# and ``npu_vendor``'s mmcv route; mx_driving and torch_npu on Ascend). One list for every
# implementation keeps the key simple; an upgrade re-checks at most a few ms per dtype.
KEY_PACKAGES = ("torch", "triton", "triton-ascend", "mmcv", "mx_driving", "torch_npu")

# Max error relative to max(|reference|, 1), per dtype of the inputs. Loose enough for
# kernels that compute in the input's precision (mmcv's half kernel), tight enough for the
# O(1) errors of a wrong index, a lost atomic add or a race.
TOLERANCE = {
    torch.float64: 1e-7,
    torch.float32: 1e-4,
    torch.float16: 3e-2,
    torch.bfloat16: 1e-1,
}

DType = Union[str, torch.dtype]


@dataclass(frozen=True)
class Record:
    """One recorded verification of an implementation for one dtype on one device."""

    impl: str
    dtype: str
    correct: bool
    error: str = ""
    fwd_bwd_ms: Optional[float] = None
    case: str = ""
    # ``fingerprint`` of the process that verified it; None: ``save_records`` fills it in.
    key: Optional[Dict[str, Optional[str]]] = None


def dtype_name(dtype: DType) -> str:
    """``torch.float32`` or ``"float32"`` -> ``"float32"``."""
    return str(dtype).replace("torch.", "")


def records_path() -> str:
    """``$NPUDET_VERIFY_FILE``, else ``~/.cache/npudet/verified.json``."""
    env = os.environ.get(VERIFY_FILE_ENV)
    if env:
        return env
    return os.path.join(os.path.expanduser("~"), ".cache", "npudet", "verified.json")


def device_key(device_type: str, device_name: str) -> str:
    """The file's key of one device: ``"cuda|NVIDIA L4"`` (versions are in each record's key)."""
    return f"{device_type}|{device_name}"


def _source_path(entry: str) -> Optional[Path]:
    """A ``KERNEL_SOURCES`` entry (or an absolute path) as a file or folder, None if absent."""
    if entry.startswith("env:"):
        named = os.environ.get(entry[len("env:") :])
        candidates = [Path(named)] if named else []
    elif entry.startswith("ops:"):
        from .native_build import SOURCE_ROOTS

        candidates = [root / entry[len("ops:") :] for root in SOURCE_ROOTS]
    else:
        candidates = [Path(__file__).resolve().parent / entry]
    return next((path for path in candidates if path.exists()), None)


def _source_files(entry: str) -> List[Tuple[str, Optional[Path]]]:
    """(name, path) of each file an entry stands for; path None when it is missing."""
    path = _source_path(entry)
    if entry.startswith("env:"):
        return [(entry, path if path is not None and path.is_file() else None)]
    if path is None or path.is_file():
        return [(os.path.basename(entry.rstrip("/")), path)]
    files = sorted(f for f in path.rglob("*") if f.is_file() and "__pycache__" not in f.parts)
    return [(str(f.relative_to(path)), f) for f in files]


def implementation_sources(impl: str) -> List[str]:
    """The files ``impl`` runs: the modules of its classes and its ``KERNEL_SOURCES``.

    Module files are absolute paths; kernel sources stay as listed (resolved when hashed).
    """
    from .registry import MSDAImpl, get_impl

    files: List[str] = []
    for cls in type(get_impl(impl)).__mro__:
        if not issubclass(cls, MSDAImpl) or cls is MSDAImpl:
            continue
        module = getattr(sys.modules.get(cls.__module__), "__file__", None)
        if module and module not in files:
            files.append(module)
        files.extend(KERNEL_SOURCES.get(cls.NAME, ()))
    return files


@functools.cache
def source_digest(entries: Tuple[str, ...]) -> str:
    """sha256 (16 hex digits) of the names and bytes of the files ``entries`` stand for
    (``KERNEL_SOURCES`` entries or absolute paths); once per process per tuple.

    A missing file counts as a distinct content (its name marked missing).
    """
    digest = hashlib.sha256()
    for entry in entries:
        for name, path in _source_files(entry):
            data = path.read_bytes() if path is not None else b"<missing>"
            digest.update(name.encode() + b"\0" + data + b"\0")
    return digest.hexdigest()[:16]


def _distribution_version(name: str) -> Optional[str]:
    """The installed version of distribution ``name`` (metadata only, nothing imported)."""
    if name == "torch":
        return torch.__version__
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# Where the kernel drivers state their version (Linux): NVIDIA's kernel module, Ascend's
# driver package.
_DRIVER_FILES = {
    "cuda": "/proc/driver/nvidia/version",
    "npu": "/usr/local/Ascend/driver/version.info",
}


def driver_version(device_type: str) -> Optional[str]:
    """The device driver's version (``"580.159.04"``), or None (the CPU; not found)."""
    path = _DRIVER_FILES.get(device_type)
    if path is None:
        return None
    try:
        with open(path) as fh:
            text = fh.read()
    except OSError:
        return None
    if device_type == "npu":
        found = re.search(r"^\s*Version\s*=\s*(\S+)", text, re.MULTILINE)
    else:
        # "NVRM version: NVIDIA UNIX [Open ]Kernel Module[ for x86_64]  580.159.04  ..."
        found = re.search(r"Kernel Module.*?\s(\d+\.\d+(?:\.\d+)*)(?:\s|$)", text)
    return found.group(1) if found else None


@functools.cache
def fingerprint(impl: str, device_type: str) -> Dict[str, Optional[str]]:
    """What a verification of ``impl`` on ``device_type`` holds for: the record's key.

    Worked out once per process per (impl, device type); callers must not modify it.
    ``isa`` is the ``cpu`` kernel's instruction-set variant (building the kernel if needed)
    for the ``cpu`` family, else None.
    """
    from .registry import get_impl

    key: Dict[str, Optional[str]] = {"sources": source_digest(tuple(implementation_sources(impl)))}
    family = {cls.NAME for cls in type(get_impl(impl)).__mro__ if hasattr(cls, "NAME")}
    isa = None
    if "cpu" in family:
        from .cpu_impl import isa as cpu_isa

        isa = cpu_isa()
    key["isa"] = isa
    for package in KEY_PACKAGES:
        key[package] = _distribution_version(package)
    key["driver"] = driver_version(device_type)
    return key


def stale_reasons(record: Record, device_type: str) -> List[str]:
    """What changed since ``record`` was verified on ``device_type`` ([] if it is current)."""
    if record.key is None:
        return ["recorded without a key"]
    now = fingerprint(record.impl, device_type)
    reasons = []
    for name in sorted(set(now) | set(record.key)):
        was, is_ = record.key.get(name), now.get(name)
        if was != is_:
            what = "kernel sources" if name == "sources" else name
            reasons.append(f"{what} {was} -> {is_}")
    return reasons


def load_records(path: Optional[str] = None) -> dict:
    """The whole record file (format in the module docstring); ``{}`` if absent."""
    path = path or records_path()
    if not os.path.exists(path):
        return {}
    with open(path) as fh:
        data = json.load(fh)
    if not isinstance(data, dict) or data.get("version") != FORMAT_VERSION:
        raise ValueError(f"{path}: expected a verification file of version {FORMAT_VERSION}")
    return data


def _older_format(path: str) -> bool:
    """Whether ``path`` holds a record file of an earlier ``FORMAT_VERSION`` (a cache: replaced)."""
    try:
        with open(path) as fh:
            version = json.load(fh).get("version")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(version, int) and version < FORMAT_VERSION


def save_records(
    device_type: str,
    device_name: str,
    records: Iterable[Record],
    path: Optional[str] = None,
) -> str:
    """Merge ``records`` into the file under this device; returns its path.

    A record without a ``key`` gets this process's ``fingerprint`` of its implementation.
    """
    path = path or records_path()
    empty = {"version": FORMAT_VERSION, "devices": {}}
    data = empty if _older_format(path) else (load_records(path) or empty)
    entry = data["devices"].setdefault(
        device_key(device_type, device_name),
        {"device_type": device_type, "device_name": device_name, "records": {}},
    )
    for record in records:
        fields = asdict(record)
        impl, dtype = fields.pop("impl"), dtype_name(fields.pop("dtype"))
        if fields["key"] is None:
            fields["key"] = dict(fingerprint(impl, device_type))
        entry["records"].setdefault(impl, {})[dtype] = fields
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_json_atomic(path, data)
    reset()
    return path


def recorded(
    device_type: str, device_name: str, impl: str, dtype: DType, path: Optional[str] = None
) -> Optional[Record]:
    """The record of ``impl`` for ``dtype`` on this device, if any, as stored (current or not:
    ``stale_reasons``)."""
    return _lookup(load_records(path), device_type, device_name, impl, dtype_name(dtype))


def _lookup(data: dict, device_type: str, name: str, impl: str, dtype: str) -> Optional[Record]:
    device = data.get("devices", {}).get(device_key(device_type, name), {})
    fields = device.get("records", {}).get(impl, {}).get(dtype)
    return None if fields is None else Record(impl=impl, dtype=dtype, **fields)


# Per process: (device type, impl, dtype name) -> "" or the error; records by file path;
# measured orders by (device type, dtype name, static order); stale records already logged.
_verdicts: Dict[Tuple[str, str, str], str] = {}
_loaded: Dict[str, dict] = {}
_orders: Dict[Tuple[str, str, Tuple[str, ...]], List[str]] = {}
_stale_logged: set = set()


def reset() -> None:
    """Forget this process's verdicts, loaded records and orders (e.g. after ``save_records``).

    Fingerprints are kept: the sources and packages of a running process do not change.
    """
    _verdicts.clear()
    _loaded.clear()
    _orders.clear()
    _stale_logged.clear()
    call_plan.clear()  # the plans were decided on these verdicts


def current_device_name(device_type: str) -> Optional[str]:
    """Name of device 0 of ``device_type``, or None when this process has none."""
    if device_type == "cpu":
        return device_name("cpu")
    module = getattr(torch, device_type, None)  # torch.cuda, torch.xpu; torch.npu via torch_npu
    is_available = getattr(module, "is_available", None)
    if device_type == "meta" or is_available is None or not is_available():
        return None
    return device_name(device_type)


def _record(device_type: str, impl: str, dtype: str) -> Optional[Record]:
    """``recorded`` for this process's device if current, the file read once per process.

    An unreadable file is ignored with one warning: the checks then decide, as without one.
    A stale record (``stale_reasons``) is ignored with one log line.
    """
    name = current_device_name(device_type)
    if name is None:
        return None
    path = records_path()
    if path not in _loaded:
        try:
            _loaded[path] = load_records(path)
        except (OSError, ValueError, TypeError) as exc:  # JSON errors are ValueErrors
            warnings.warn(f"npudet MSDA auto: ignoring {path}: {exc}", RuntimeWarning, stacklevel=2)
            _loaded[path] = {}
    record = _lookup(_loaded[path], device_type, name, impl, dtype)
    if record is None:
        return None
    stale = stale_reasons(record, device_type)
    if not stale:
        return record
    if (device_type, impl, dtype) not in _stale_logged:
        _stale_logged.add((device_type, impl, dtype))
        logger.warning(
            "npudet MSDA auto: the recorded verification of %r %s on %s (%s) is stale (%s); "
            "checking it again (tools/check_device.py --save records it anew)",
            impl,
            dtype,
            device_type,
            name,
            "; ".join(stale),
        )
    return None


def exempt(impl: str, device_type: str) -> bool:
    """Whether ``impl`` on ``device_type`` is trusted without a check (module docstring)."""
    return impl == REFERENCE or current_device_name(device_type) is None


def verdict(impl: str, device_type: str, dtype: DType) -> str:
    """Empty if ``auto`` may hand (device type, dtype) calls to ``impl``, else why not.

    Runs ``check_impl`` at most once per process per (device type, impl, dtype); a failure
    warns once.
    """
    key = (device_type, impl, dtype_name(dtype))
    if key not in _verdicts:
        _verdicts[key] = _decide(*key)
        if _verdicts[key]:
            warnings.warn(
                f"npudet MSDA auto: skipping {impl!r} on {device_type} {key[2]}: {_verdicts[key]}",
                RuntimeWarning,
                stacklevel=4,
            )
    return _verdicts[key]


def _decide(device_type: str, impl: str, dtype: str) -> str:
    if exempt(impl, device_type):
        return ""
    record = _record(device_type, impl, dtype)
    if record is not None:
        return "" if record.correct else f"recorded by tools/check_device.py: {record.error}"
    # Real tensors even when the caller runs under a dispatch mode (fake tensors, counters).
    with _disable_current_modes():
        return check_impl(impl, device_type, getattr(torch, dtype))


@torch.compiler.assume_constant_result
def known_verdict(impl: str, device_type: str, dtype: str) -> str:
    """``verdict`` as a constant to ``torch.compile``: evaluated eagerly, never traced."""
    return verdict(impl, device_type, dtype)


def measured_order(order: List[str], device_type: str, dtype: DType) -> List[str]:
    """``order`` with the recorded-correct, timed implementations sorted by recorded time.

    Each keeps to the slots those implementations hold in ``order``; the others stay put.
    Worked out once per process per (device type, dtype, order).
    """
    key = (device_type, dtype_name(dtype), tuple(order))
    if key not in _orders:
        _orders[key] = _measured_order(order, device_type, dtype_name(dtype))
    return list(_orders[key])


def _measured_order(order: List[str], device_type: str, dtype: str) -> List[str]:
    if current_device_name(device_type) is None:
        return list(order)
    times = {}
    for name in order:
        ms = _recorded_ms(device_type, name, dtype)
        if ms is not None:
            times[name] = ms
    slots = [i for i, name in enumerate(order) if name in times]
    ranked = sorted((name for name in order if name in times), key=times.__getitem__)
    result = list(order)
    for slot, name in zip(slots, ranked):
        result[slot] = name
    return result


def _recorded_ms(device_type: str, impl: str, dtype: str) -> Optional[float]:
    """Recorded fwd+bwd ms of a correct ``impl``: the dtype's own, else float32's."""
    own = _record(device_type, impl, dtype)
    if own is not None and not own.correct:
        return None
    if own is not None and own.fwd_bwd_ms is not None:
        return own.fwd_bwd_ms
    fallback = _record(device_type, impl, "float32")
    if fallback is not None and fallback.correct:
        return fallback.fwd_bwd_ms
    return None


def check_case(dtype: torch.dtype) -> Tuple[torch.Tensor, ...]:
    """The check's inputs on the CPU, float64 values rounded to ``dtype``.

    Within every implementation's documented limits (heads 4, head_dim 32, points 4,
    32 queries); about 10% of the points fall off the map. A private generator leaves the
    global RNG untouched.
    """
    gen = torch.Generator().manual_seed(0)
    shapes = torch.tensor([[6, 4], [3, 2]], dtype=torch.long)
    starts = torch.tensor([0, 24], dtype=torch.long)
    bs, queries, heads, dim, levels, points = 2, 32, 4, 32, 2, 4
    value = torch.randn(bs, 30, heads, dim, generator=gen, dtype=torch.float64)
    loc = torch.rand(bs, queries, heads, levels, points, 2, generator=gen, dtype=torch.float64)
    loc = loc * 1.2 - 0.1
    attn = torch.rand(bs, queries, heads, levels, points, generator=gen, dtype=torch.float64)
    grad = torch.randn(bs, queries, heads * dim, generator=gen, dtype=torch.float64)
    rounded = (t.to(dtype).to(torch.float64) for t in (value, loc, attn, grad))
    value, loc, attn, grad = rounded
    return value, shapes, starts, loc, attn, grad


def _forward_backward(
    impl: str, inputs: Tuple[torch.Tensor, ...], device: torch.device, dtype: torch.dtype
) -> List[torch.Tensor]:
    """Output and grads of (value, locations, weights) of ``impl``, float64 on the CPU."""
    from .registry import get_impl

    value, shapes, starts, loc, attn, grad = inputs
    leaves = [t.to(device=device, dtype=dtype).requires_grad_() for t in (value, loc, attn)]
    out = get_impl(impl).forward(leaves[0], shapes.to(device), starts.to(device), *leaves[1:])
    grads = torch.autograd.grad(out, leaves, grad.to(device=device, dtype=dtype))
    return [t.detach().to("cpu", torch.float64) for t in (out, *grads)]


@contextlib.contextmanager
def _check_context(device_type: str) -> Iterator[None]:
    """Whatever the caller's state: gradients on, inference mode and autocast off (the check
    runs in the dtype it names), and one intra-op CPU thread for its tiny CPU work
    (measured on a loaded 2-core machine: 4 ms per check on one thread, 60 ms on two, whose
    OpenMP workers wait for a busy core at every parallel region)."""
    threads = torch.get_num_threads()
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.inference_mode(False))
        stack.enter_context(torch.enable_grad())
        for kind in {"cpu", device_type}:
            if torch.amp.is_autocast_available(kind):
                stack.enter_context(torch.autocast(kind, enabled=False))
        torch.set_num_threads(1)
        stack.callback(torch.set_num_threads, threads)
        yield


def check_impl(impl: str, device: Union[str, torch.device], dtype: torch.dtype) -> str:
    """Run ``impl`` once on ``device`` in ``dtype`` against ``grid_sample``: "" or the error.

    Compares the output and the three gradients (max error relative to
    max(|reference|, 1), tolerance per dtype in ``TOLERANCE``).
    """
    from .inputs import validate_inputs
    from .registry import get_impl

    device = torch.device(device)
    with _check_context(device.type):
        inputs = check_case(dtype)
        info = validate_inputs(*inputs[:5], check_values=False)
        reasons = get_impl(impl).not_supported_reasons(
            replace(info, device_type=device.type, dtype=dtype)
        )
        if reasons:
            return f"the check case is outside its limits: {'; '.join(reasons)}"
        want = _forward_backward(REFERENCE, inputs, torch.device("cpu"), torch.float64)
        try:
            got = _forward_backward(impl, inputs, device, dtype)
        except Exception as exc:  # any failure of a kernel makes it untrusted: say which
            return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"
    names = ("output", "grad value", "grad sampling_locations", "grad attention_weights")
    for name, g, w in zip(names, got, want):
        if g.shape != w.shape:
            return f"{name}: shape {tuple(g.shape)}, expected {tuple(w.shape)}"
        if not bool(torch.isfinite(g).all()):
            return f"{name}: non-finite values"
        error = float((g - w).abs().max()) / max(float(w.abs().max()), 1.0)
        if error > TOLERANCE[dtype]:
            return f"{name}: max error {error:.2e} > {TOLERANCE[dtype]:.0e} vs {REFERENCE}"
    return ""
