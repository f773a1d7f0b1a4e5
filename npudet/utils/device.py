"""Which accelerator this machine has, and the process-wide settings NPU training needs.

``torch_npu`` is imported only when asked about, through the op registry's package probe
(``npudet.ops.msda.registry.importable``), so tests can state which packages import.
"""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass
from typing import List, Optional

import torch

from npudet.ops.msda.registry import importable


def npu_available() -> bool:
    """Whether an Ascend NPU is usable: ``torch_npu`` imports and sees a device."""
    if not importable("torch_npu"):
        return False
    import torch_npu

    return bool(torch_npu.npu.is_available())


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


@dataclass(frozen=True)
class NPUSetting:
    """One process-wide NPU setting: what is set, to which value, why, and whether it was."""

    name: str
    value: object
    reason: str
    applied: bool


def npu_training_settings(apply: bool = True) -> List[NPUSetting]:
    """The NPU settings npudet trains with; applied when ``apply`` and an NPU is available.

    Returns every setting with ``applied`` telling whether it was set in this call, so a
    caller can log what it would do on a machine without an NPU.
    """
    # mmengine's rule (mmengine.device): any non-empty NPUJITCompile turns JIT on.
    jit_compile = bool(os.getenv("NPUJITCompile", ""))
    planned = [
        (
            "torch_npu.npu.set_compile_mode(jit_compile)",
            jit_compile,
            "binary kernels instead of compiling each new shape (NPUJITCompile=1 to JIT), "
            "the rule mmengine applies",
        ),
        (
            "torch_npu.npu.config.allow_internal_format",
            False,
            "private tensor formats make clip_grad_norm_ fail (_foreach_norm ... internal "
            "format); the DETR configs clip gradients",
        ),
    ]
    do_apply = apply and npu_available()
    if do_apply:
        import torch_npu

        torch_npu.npu.set_compile_mode(jit_compile=jit_compile)
        torch_npu.npu.config.allow_internal_format = False
    return [NPUSetting(name, value, reason, do_apply) for name, value, reason in planned]
