"""The simulation behind the ``torch_npu`` stand-in: the native device, loaded and named ``npu``.

``load(device_module)`` builds (once, cached: ``build.py``) and loads ``ops/npu_sim/npu_sim.cpp``,
renames PyTorch's PrivateUse1 backend ``npu``, registers ``device_module`` (the stand-in's
``npu`` package) as ``torch.npu``, generates the ``Tensor.npu()`` / ``Module.npu()`` / storage
methods and registers the ``hccl`` stand-in (``hccl.py``), as torch_npu does at import, and
passes the device the ops torch_npu has NPU kernels for (``cpu_fallback.py``: the others warn and
are counted, as torch_npu's CPU fallback warns; ``fallbacks()`` reads the counts). The
stand-in's ``__init__`` calls it and passes the device module in: this package imports torch
and the standard library only, so the stand-in's imports run one way.

The device proves framework glue and the vendor contract: tensors on another device type,
dispatch keys, ``torch.npu.*``, checkpoints and mmengine's NPU branches. Memory is host
memory and arithmetic is the CPU's: it says nothing of NPU speed or numerics.
"""

from __future__ import annotations

from types import ModuleType

import torch

from . import hccl
from .build import library_path
from .cpu_fallback import fallbacks, reset_fallbacks
from .cpu_fallback import register as _register_npu_kernels

__all__ = ["fallbacks", "load", "reset_fallbacks"]


def load(device_module: ModuleType) -> None:
    """Build and load the native device, rename PrivateUse1 ``npu``, register ``device_module``
    as ``torch.npu``.

    Once per process: torch cannot unregister a backend, so a later import of the stand-in
    (the tests' fixture imports it again) finds ``torch.npu`` registered and returns. Raises
    RuntimeError if PrivateUse1 already carries another name (another out-of-tree backend).
    """
    name = torch._C._get_privateuse1_backend_name()
    if name == "npu" and hasattr(torch, "npu"):
        return
    if name not in ("privateuseone", "npu"):
        raise RuntimeError(
            f"the simulated NPU needs PyTorch's PrivateUse1 backend, already named {name!r}"
        )
    torch.ops.load_library(str(library_path()))
    _register_npu_kernels()
    if name != "npu":
        torch.utils.rename_privateuse1_backend("npu")
    torch._register_device_module("npu", device_module)
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_storage=True
    )
    # torch_npu publishes CANN's version here; the records of `auto` key on it.
    torch.version.cann = "simulated"
    hccl.register()
