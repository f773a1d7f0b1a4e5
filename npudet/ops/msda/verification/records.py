"""Recorded verifications: the store ``tools/misc/check_device.py --save`` writes and ``auto``
reads, and the key (``fingerprint``) that says whether a record still holds.

A record holds for a process whose ``fingerprint`` of the implementation equals the
record's key: a hash of the sources the implementation runs (the modules of its classes
and their ``MSDAImpl.SOURCES``: the C++ kernel, the Triton kernels and launch planners),
its ``MSDAImpl.build_key()`` (the CPU kernel's instruction-set variant and compiler), the
torch / triton / triton-ascend / mmcv / mx_driving / torch_npu versions, the device's
driver and, on Ascend, the CANN toolkit. The device's model and capability are in the file's
device key (``device_identity``: ``"cuda|NVIDIA L4 (sm_89)"``), so each GPU model in a machine
has records of its own. The
key is worked out at most once per process per (implementation, device type): sources are
hashed once per process.

Record store (``NPUDET_VERIFY_FILE``, default ``~/.cache/npudet/verified.json``)::

    {"version": 2,
     "devices": {"cuda|NVIDIA L4 (sm_89)": {
         "device_type": "cuda", "device_name": "NVIDIA L4 (sm_89)",
         "records": {"triton": {"float32": {
             "correct": true, "error": "", "fwd_bwd_ms": 3.1, "case": "ddetr-enc",
             "key": {"sources": "3f2a...", "build": null, "torch": "2.6.0", "triton": "3.2.0",
                     "triton-ascend": null, "mmcv": "2.1.0", "mx_driving": null,
                     "torch_npu": null, "driver": "550.54.15"}}}}}}}

``save_records`` merges (same implementation and dtype replaced), ``load_records`` reads the
whole file (a file of an older format raises ``ValueError``; ``save_records`` replaces it;
``generation`` counts the writes of this process), ``recorded`` looks one record up as
stored and ``stale_reasons`` says whether it is current. ``auto`` orders the implementations
that a current record calls correct and times by their recorded forward+backward time (the
dtype's own, else float32's) within the slots they hold in the static priority list, so on
CUDA ``triton`` goes before ``mmcv`` only where a record says it is correct and faster on
this GPU.

"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple, Union

import torch

from npudet.utils.json_io import write_json_atomic

from .. import call_plan
from ..kernels.native_build import native_path
from ..registry import MSDAImpl, get_impl
from .device_identity import describe, identity

VERIFY_FILE_ENV = "NPUDET_VERIFY_FILE"
FORMAT_VERSION = 2
# The ``npudet/ops/msda`` package: ``MSDAImpl.SOURCES`` are relative to it, but for
# ``native:<path>`` (under the native source root, ``ops/``) and ``env:<VARIABLE>`` entries.
PACKAGE = Path(__file__).resolve().parents[1]

# Distributions whose version is part of every record's key: the code under each
# implementation (torch for all; triton and triton-ascend for ``triton``; mmcv for ``mmcv``
# and ``npu_vendor``'s mmcv route; mx_driving and torch_npu on Ascend). One list for every
# implementation keeps the key simple; an upgrade re-checks at most a few ms per dtype.
KEY_PACKAGES = ("torch", "triton", "triton-ascend", "mmcv", "mx_driving", "torch_npu")

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
    """The file's key of one device: ``"cuda|NVIDIA L4 (sm_89)"`` (``device_name`` as
    ``current_device_name`` gives it; versions are in each record's key)."""
    return f"{device_type}|{device_name}"


def _source_path(entry: str) -> Optional[Path]:
    """An ``MSDAImpl.SOURCES`` entry (or an absolute path) as a file or folder, None if absent."""
    if entry.startswith("env:"):
        named = os.environ.get(entry[len("env:") :])
        path = Path(named) if named else None
    elif entry.startswith("native:"):
        path = native_path(entry[len("native:") :])
    else:
        path = PACKAGE / entry
    return path if path is not None and path.exists() else None


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
    """The files ``impl`` runs: the modules of its classes and their ``SOURCES``.

    Module files are absolute paths; ``SOURCES`` stay as listed (resolved when hashed).
    """
    files: List[str] = []
    for cls in type(get_impl(impl)).__mro__:
        if not issubclass(cls, MSDAImpl) or cls is MSDAImpl:
            continue
        module = getattr(sys.modules.get(cls.__module__), "__file__", None)
        if module and module not in files:
            files.append(module)
        files.extend(vars(cls).get("SOURCES", ()))
    return files


@functools.cache
def source_digest(entries: Tuple[str, ...]) -> str:
    """sha256 (16 hex digits) of the names and bytes of the files ``entries`` stand for
    (``MSDAImpl.SOURCES`` entries or absolute paths); once per process per tuple.

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


def toolkit_version(device_type: str) -> Optional[str]:
    """The device toolkit installed apart from torch: CANN on Ascend (``torch.version.cann``,
    which torch_npu sets, e.g. ``"8.0.RC2"``); None elsewhere (CUDA's comes with the torch
    build, whose version is in the key)."""
    return getattr(torch.version, "cann", None) if device_type == "npu" else None


@functools.cache
def fingerprint(impl: str, device_type: str) -> Dict[str, Optional[str]]:
    """What a verification of ``impl`` on ``device_type`` holds for: the record's key.

    Worked out once per process per (impl, device type); callers must not modify it.
    ``build`` is the implementation's ``build_key()`` (the ``cpu`` kernel's instruction-set
    variant and compiler, building the kernel if needed; None for the others).
    """
    key: Dict[str, Optional[str]] = {"sources": source_digest(tuple(implementation_sources(impl)))}
    key["build"] = get_impl(impl).build_key()
    for package in KEY_PACKAGES:
        key[package] = _distribution_version(package)
    key["driver"] = driver_version(device_type)
    key["toolkit"] = toolkit_version(device_type)
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
    global _writes
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
    _writes += 1
    call_plan.clear()  # the plans were decided on the records read before
    return path


_writes = 0


def generation() -> int:
    """How many times this process wrote a record file: what was read before is stale."""
    return _writes


def recorded(
    device_type: str, device_name: str, impl: str, dtype: DType, path: Optional[str] = None
) -> Optional[Record]:
    """The record of ``impl`` for ``dtype`` on this device, if any, as stored (current or not:
    ``stale_reasons``)."""
    return lookup(load_records(path), device_type, device_name, impl, dtype_name(dtype))


def lookup(data: dict, device_type: str, name: str, impl: str, dtype: str) -> Optional[Record]:
    """The record of ``impl`` for ``dtype`` on device (``device_type``, ``name``) in ``data``
    (what ``load_records`` returns), as stored."""
    device = data.get("devices", {}).get(device_key(device_type, name), {})
    fields = device.get("records", {}).get(impl, {}).get(dtype)
    return None if fields is None else Record(impl=impl, dtype=dtype, **fields)


def current_device_name(device_type: str, index: Optional[int] = None) -> Optional[str]:
    """The records' name of device ``index`` of ``device_type`` (None: the current one): its
    model and capability (``device_identity.identity``), or None when this process has none."""
    device = describe(device_type, index)
    return None if device is None else identity(device)
