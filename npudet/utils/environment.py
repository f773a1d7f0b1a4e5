"""A report of the software and hardware this process runs on (for the device check).

Packages are asked through ``npudet.utils.packages`` (imported only when asked about);
nothing here needs a device to be present.
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Dict, List, Optional

import torch

from .packages import importable, package_version

# CPU instruction-set extensions that decide which kernels a CPU build can use.
_ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni")
_ISA_FLAGS += ("avx512_bf16", "amx_bf16", "amx_tile", "asimd", "sve")


def device_problem(device_type: str) -> Optional[str]:
    """Why ``device_type`` ("cpu", "cuda" or "npu") is not usable here (None if it is)."""
    if device_type == "cpu":
        return None
    if device_type == "cuda":
        return None if torch.cuda.is_available() else "torch.cuda.is_available() is False"
    if device_type == "npu":
        try:
            import torch_npu
        except Exception as exc:  # absent, or present but broken (no driver, ABI mismatch)
            return f"torch_npu does not import ({exc})"
        return None if torch_npu.npu.is_available() else "torch_npu.npu.is_available() is False"
    return "expected cpu, cuda or npu"


def _cpu_info() -> Dict[str, object]:
    """CPU model, its ISA flags of interest, and what ATen's dispatch picked."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip().lower()
                if key in ("model name", "cpu model") and model in ("", platform.machine()):
                    model = val.strip()
                elif key in ("flags", "features") and not flags:
                    flags = set(val.split())
    except OSError:  # not Linux
        pass
    capability = getattr(torch.backends.cpu, "get_cpu_capability", lambda: "unknown")()
    return {
        "model": model,
        "isa": [flag for flag in _ISA_FLAGS if flag in flags],
        "aten_cpu_capability": capability,
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
    }


def _mmcv_info() -> Dict[str, object]:
    """mmcv's version and whether its compiled ops import, with or without CUDA."""
    info: Dict[str, object] = {"version": package_version("mmcv"), "ops": False, "cuda_ops": False}
    if info["version"] is None or not importable("mmcv._ext"):
        return info
    info["ops"] = True
    try:
        from mmcv.ops import get_compiling_cuda_version

        cuda = str(get_compiling_cuda_version())
    except Exception as exc:  # an mmcv without the helper, or a broken build
        cuda = f"unknown ({type(exc).__name__})"
    info["compiled_cuda"] = cuda
    info["cuda_ops"] = cuda not in ("", "not available") and not cuda.startswith("unknown")
    return info


def _device_info(device_type: str) -> Dict[str, object]:
    """Name, capability and memory of device 0 of ``device_type``."""
    if device_type == "cuda" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        major, minor = torch.cuda.get_device_capability(0)
        return {
            "name": torch.cuda.get_device_name(0),
            "capability": f"sm_{major}{minor}",
            "memory_gib": round(props.total_memory / 2**30, 1),
            "count": torch.cuda.device_count(),
            "multiprocessors": props.multi_processor_count,
        }
    if device_type == "npu" and importable("torch_npu"):
        import torch_npu

        if torch_npu.npu.is_available():
            return {
                "name": str(torch_npu.npu.get_device_name(0)),
                "count": torch_npu.npu.device_count(),
            }
    if device_type == "cpu":
        return {"name": _cpu_info()["model"]}
    return {"name": None, "error": f"no {device_type} device usable here"}


def environment_report(device_type: str) -> Dict[str, object]:
    """Versions of the stack and a description of ``device_type`` and of the CPU."""
    versions: Dict[str, Optional[str]] = {
        name: package_version(name)
        for name in ("triton", "torch_npu", "mx_driving", "mmengine", "mmdet")
    }
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "packages": versions,
        "mmcv": _mmcv_info(),
        "device_type": device_type,
        "device": _device_info(device_type),
        "cpu": _cpu_info(),
    }


def report_lines(report: Dict[str, object]) -> List[str]:
    """The report as short human-readable lines."""
    pkgs = report["packages"]
    listed = ", ".join(f"{k} {v if v is not None else '-'}" for k, v in pkgs.items())
    mmcv = report["mmcv"]
    cpu = report["cpu"]
    device = report["device"]
    lines = [
        f"python {report['python']} on {report['platform']}",
        f"torch {report['torch']} (CUDA {report['torch_cuda'] or '-'}); {listed}",
        f"mmcv {mmcv['version'] or '-'}: compiled ops {'yes' if mmcv['ops'] else 'no'}, "
        f"CUDA ops {'yes' if mmcv['cuda_ops'] else 'no'}",
        f"device {report['device_type']}: "
        + ", ".join(f"{k} {v}" for k, v in device.items() if v is not None),
        f"cpu {cpu['model']}: {cpu['cores']} cores, torch threads {cpu['torch_threads']}, "
        f"ATen {cpu['aten_cpu_capability']}, ISA {' '.join(cpu['isa']) or '-'}",
    ]
    return lines
