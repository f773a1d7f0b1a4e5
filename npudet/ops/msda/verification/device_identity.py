"""Which device a verification holds for: its type, model and capability.

``auto``'s trust decisions and the recorded verifications (``records``) are keyed by ``identity``,
so a check made on one GPU model is not trusted for another model in the same machine:

- CUDA: ``torch.cuda.get_device_name(i)`` and ``get_device_capability(i)``
  (``"NVIDIA H100 80GB HBM3 (sm_90)"``);
- Ascend: torch_npu's device name and SoC version (``"Ascend910B3 (soc 222)"``);
- CPU: the CPU model; the ``cpu`` kernel's instruction-set variant and compiler are in the
  record's key already (``MSDAImpl.build_key``).

``describe`` reads the device the inputs are on (its index; the current device when the
index is None); ``identity`` turns a descriptor into the key, and is what tests exercise with
descriptors of devices this machine does not have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from npudet.utils.device import device_name


@dataclass(frozen=True)
class DeviceDescriptor:
    """A device's type, model name and capability (``""`` where there is none)."""

    device_type: str
    name: str
    capability: str = ""


def identity(device: DeviceDescriptor) -> str:
    """The key of a device's trust decisions and records: its name, and its capability if any."""
    return f"{device.name} ({device.capability})" if device.capability else device.name


def _npu_descriptor(index: int) -> DeviceDescriptor:
    import torch_npu

    name = str(torch_npu.npu.get_device_name(index))
    soc = getattr(torch_npu.npu, "get_soc_version", None)
    return DeviceDescriptor("npu", name, f"soc {soc()}" if callable(soc) else "")


def describe(device_type: str, index: Optional[int] = None) -> Optional[DeviceDescriptor]:
    """The descriptor of device ``index`` of ``device_type`` (None: the current one), or None
    when this process has no such device (``meta``, a type without a usable device)."""
    if device_type == "cpu":
        return DeviceDescriptor("cpu", device_name("cpu"))
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return None
        i = torch.cuda.current_device() if index is None else index
        major, minor = torch.cuda.get_device_capability(i)
        return DeviceDescriptor("cuda", torch.cuda.get_device_name(i), f"sm_{major}{minor}")
    module = getattr(torch, device_type, None)  # torch.npu once torch_npu is imported; torch.xpu
    is_available = getattr(module, "is_available", None)
    if device_type == "meta" or is_available is None or not is_available():
        return None
    if device_type == "npu":
        return _npu_descriptor(module.current_device() if index is None else index)
    return DeviceDescriptor(device_type, device_name(device_type))
