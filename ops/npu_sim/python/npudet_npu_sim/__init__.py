"""The simulated Ascend NPU: loading the native device and naming it ``npu``.

``load()`` builds (once, cached) and loads ``ops/npu_sim/npu_sim.cpp``, renames PyTorch's
PrivateUse1 backend ``npu``, registers ``torch_npu.npu`` as ``torch.npu`` and generates the
``Tensor.npu()`` / ``Module.npu()`` / storage methods, as torch_npu does at import. It is
reached only through the stand-in ``torch_npu`` package beside this one, which is on
``sys.path`` only when ``NPUDET_SIMULATED_NPU=1`` (the ``.pth`` line that ``tools/setup.sh``
writes) or inside the tests' fixture. It imports torch and the standard library only.

The device proves framework glue and the vendor contract: tensors on another device type,
dispatch keys, ``torch.npu.*``, checkpoints and mmengine's NPU branches. Memory is host
memory and arithmetic is the CPU's: it says nothing of NPU speed or numerics.
"""

from __future__ import annotations

import os
import threading

import torch

ENV = "NPUDET_SIMULATED_NPU"
DEVICE_NAME = "Simulated Ascend NPU (npudet: PrivateUse1 on host memory, CPU arithmetic)"

_lock = threading.Lock()
_loaded = False
_visible = True


def requested() -> bool:
    """Whether this process asked for the simulation (``NPUDET_SIMULATED_NPU=1``)."""
    return os.environ.get(ENV, "") == "1"


def visible() -> bool:
    """Whether ``torch.npu.is_available()`` answers True (the tests' fixture hides it after)."""
    return _visible


def set_visible(flag: bool) -> None:
    """Show or hide the device from ``is_available`` / ``device_count`` (tests only)."""
    global _visible
    _visible = bool(flag)


def load() -> None:
    """Build and load the native device, rename PrivateUse1 ``npu``, register ``torch.npu``.

    Idempotent; safe from several threads. Raises RuntimeError if PrivateUse1 already
    carries another name (another out-of-tree backend is loaded).
    """
    global _loaded
    with _lock:
        if _loaded:
            return
        from .build import library_path

        name = torch._C._get_privateuse1_backend_name()
        if name not in ("privateuseone", "npu"):
            raise RuntimeError(
                f"the simulated NPU needs PyTorch's PrivateUse1 backend, already named {name!r}"
            )
        torch.ops.load_library(str(library_path()))
        if name != "npu":
            torch.utils.rename_privateuse1_backend("npu")
        import torch_npu.npu as device_module

        torch._register_device_module("npu", device_module)
        torch.utils.generate_methods_for_privateuse1_backend(
            for_tensor=True, for_module=True, for_storage=True
        )
        # torch_npu publishes CANN's version here; the records of `auto` key on it.
        torch.version.cann = "simulated"
        from . import hccl

        hccl.register()
        _loaded = True
