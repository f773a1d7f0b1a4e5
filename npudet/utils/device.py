"""Which accelerator this machine has.

``torch_npu`` is imported only when asked about, through the package probe
(``npudet.utils.packages.importable``), so tests can state which packages import.
"""

from __future__ import annotations

import os
import platform
from typing import Optional

import torch

from .packages import importable


def npu_available() -> bool:
    """Whether an Ascend NPU is usable: ``torch_npu`` imports and sees a device."""
    if not importable("torch_npu"):
        return False
    import torch_npu

    return bool(torch_npu.npu.is_available())


SIMULATED_NPU_NOTE = (
    "simulated NPU (ops/npu_sim: PrivateUse1 on host memory, CPU arithmetic): times measure "
    "the simulation on the CPU, not an NPU"
)


def simulated_npu() -> bool:
    """Whether ``npu`` is npudet's simulated device (its torch_npu stand-in, loaded with
    ``NPUDET_SIMULATED_NPU=1``, reports CANN as ``"simulated"``)."""
    return getattr(torch.version, "cann", None) == "simulated"


SIMULATED_NPU_ENV = "NPUDET_SIMULATED_NPU"


def simulated_npu_problem() -> Optional[str]:
    """Why ``NPUDET_SIMULATED_NPU`` holds a value npudet does not take (None if it takes it):
    only ``1`` turns the simulation on (the ``.pth`` line of ``tools/setup.sh`` compares with
    it), so ``yes`` or ``true`` would run on the CPU without a word."""
    value = os.environ.get(SIMULATED_NPU_ENV, "")
    if value in ("", "0", "1"):
        return None
    return (
        f"{SIMULATED_NPU_ENV}={value!r}: expected 1 (the simulated NPU of ops/npu_sim) or "
        "0 / unset (no simulation)"
    )


def current_device_type() -> str:
    """``"npu"``, ``"cuda"``, ``"mps"`` or ``"cpu"``: the device this process trains on."""
    if npu_available():
        return "npu"
    if torch.cuda.is_available():
        return "cuda"
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return "mps"
    return "cpu"


def device_name(device_type: Optional[str] = None) -> str:
    """Human-readable name of device 0 of ``device_type`` (default: the current type)."""
    device_type = device_type or current_device_type()
    if device_type == "npu":
        import torch_npu

        return str(torch_npu.npu.get_device_name(0))
    if device_type == "cuda":
        return torch.cuda.get_device_name(0)
    if device_type == "mps":
        return "Apple MPS"
    return platform.processor() or platform.machine() or "cpu"
