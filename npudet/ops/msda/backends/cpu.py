"""``cpu``: the fused C++/OpenMP kernel (``kernels/csrc/cpu/msda_cpu.cpp``) as torch ops whose
autograd is C++ too (``kernels/csrc/cpu/msda_cpu_op.cpp``): a call is one dispatcher call.

The kernel is built on first use for the instruction set chosen at run time from the CPU's
features (``cpu_isa``; ``NPUDET_CPU_ISA`` forces one); ``isa()`` names the one loaded.

The kernel's design choices are one typed option set, ``cpu_options.CPUKernelOptions``,
passed to the ops as ``as_ints()``. Experiment variants (``msda_variants()``, not
``msda_impls()``) let the benchmark and the ablation tool price each choice; each differs
from ``cpu`` (the defaults: fused 4-corner pass, prefetch, query order, ``auto`` backward)
in exactly the one option its name says: ``cpu_atomic`` (backward="atomic"),
``cpu_owner`` (backward="owner"), ``cpu_corner`` (fused_corners=False),
``cpu_noprefetch`` (prefetch=False) and ``cpu_headmajor`` (order="head").
"""

from __future__ import annotations

import os
from typing import List, Optional

import torch

from ..inputs import MSDAInputs, register_fake_kernels
from ..kernels.native_build import load_extension
from ..registry import Kernel, MSDAImpl, register, register_variant
from . import cpu_isa
from .cpu_options import CPUKernelOptions

# NPUDET_CPU_SANITIZE=1 builds the kernel with AddressSanitizer and UndefinedBehaviorSanitizer
# (a build of its own). Python is not built with them: the process must start with the ASan
# runtime preloaded, as tools/sanitize_cpu.sh does.
SANITIZE_ENV = "NPUDET_CPU_SANITIZE"
SANITIZE_FLAGS = [
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=undefined",
    "-fno-omit-frame-pointer",
    "-g",
]


def _sanitized() -> bool:
    return os.environ.get(SANITIZE_ENV, "") not in ("", "0")


# The choice made once per process: "isa" (a cpu_isa variant name) and "ext" (the module,
# or why no variant could be loaded).
_chosen: dict = {}


def _load():
    """The built extension module of the chosen instruction-set variant, or why none is
    available (a string). Only the chosen variant is built; under ``auto`` one the compiler
    cannot build falls back to the next best."""
    if "ext" in _chosen:
        return _chosen["ext"]
    variants = cpu_isa.candidates()
    if isinstance(variants, str):
        _chosen["ext"] = variants
        return variants
    failures = []
    suffix, flags = ("_sanitized", SANITIZE_FLAGS) if _sanitized() else ("", [])
    for variant in variants:
        ext = load_extension(
            f"npudet_msda_cpu_{variant.name}{suffix}",
            ["cpu/msda_cpu.cpp", "cpu/msda_cpu_op.cpp"],
            [variant.march, *flags],
            cpu_specific=variant.cpu_specific,
            extra_ldflags=flags,
        )
        if not isinstance(ext, str):
            _chosen.update(isa=variant.name, ext=ext, sanitized=bool(flags))
            return ext
        failures.append(ext)
    _chosen["ext"] = "; ".join(failures)
    return _chosen["ext"]


def isa() -> Optional[str]:
    """The instruction-set variant ``cpu`` runs in this process (``baseline``, ``avx2``,
    ``avx512`` or ``native``, see ``cpu_isa``), building it if needed; None when the
    kernel is unavailable."""
    _load()
    return _chosen.get("isa")


def ext():
    """The loaded kernel extension module (raises RuntimeError when unavailable)."""
    ext = _load()
    if isinstance(ext, str):
        raise RuntimeError(f"npudet cpu MSDA kernel unavailable: {ext}")
    return ext


# The ops' schemas and fake kernels live here, so torch.compile traces a call before the
# kernel is built; the CPU and Autograd kernels come from the C++ library
# (kernels/csrc/cpu/msda_cpu_op.cpp), registered when ``ext()`` loads it: a call is one dispatcher
# call, forward and backward, with no Python between the op and the kernel.
_LIB = torch.library.Library("npudet", "FRAGMENT")
_LIB.define(
    "msda_cpu_forward(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
    "Tensor sampling_locations, Tensor attention_weights, int[] options) -> Tensor"
)
_LIB.define(
    "msda_cpu_backward(Tensor grad_output, Tensor value, Tensor spatial_shapes, "
    "Tensor level_start_index, Tensor sampling_locations, Tensor attention_weights, "
    "int[] options) -> (Tensor, Tensor, Tensor)"
)
# value (bs, keys, heads, D), any floating dtypes (half computed in float32) ->
# (bs, num_queries, heads * D) of value's dtype; ``options`` is CPUKernelOptions.as_ints().
# Differentiable w.r.t. value, sampling_locations and attention_weights. Load ``ext()`` first.
msda_cpu_forward = torch.ops.npudet.msda_cpu_forward.default
# grad_output (bs, num_queries, heads * D) + the forward's inputs -> the three gradients.
msda_cpu_backward = torch.ops.npudet.msda_cpu_backward.default


register_fake_kernels(_LIB, "npudet::msda_cpu_forward", "npudet::msda_cpu_backward")


class CPUImpl(MSDAImpl):
    """Fused CPU kernel; half/bfloat16 inputs are computed in float32."""

    NAME = "cpu"
    OPTIONS = CPUKernelOptions()
    DEVICES = ("cpu",)
    # Private-copy and ownership backward: each grad_value element has one writer and the
    # copies are added in thread order, fixed for a fixed thread count (tested bitwise).
    DETERMINISTIC = ("cpu",)
    DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    SOURCES = ("kernels/csrc/cpu/", "backends/cpu_options.py", "kernels/native_build.py")

    def unavailable_reasons(self) -> List[str]:
        ext = _load()
        return [ext] if isinstance(ext, str) else []

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        """The five inputs of ``MSDAImpl.forward`` -> (bs, num_queries, heads * D)."""
        return msda_cpu_forward(*tensors, self.OPTIONS.as_ints())

    def build_info(self) -> str:
        return f"{isa()} build" + (", sanitized" if _chosen.get("sanitized") else "")

    def build_key(self) -> Optional[str]:
        return isa()

    def bind(self, inputs: MSDAInputs) -> Kernel:
        ext()  # the op's kernels are registered when the library loads
        op, options = msda_cpu_forward, self.OPTIONS.as_ints()

        def run(*tensors: torch.Tensor) -> torch.Tensor:
            return op(*tensors, options)

        return run


class CPUAtomicImpl(CPUImpl):
    NAME = "cpu_atomic"
    OPTIONS = CPUKernelOptions(backward="atomic")
    DETERMINISTIC = ()  # atomic adds land in thread-timing order


class CPUOwnerImpl(CPUImpl):
    NAME = "cpu_owner"
    OPTIONS = CPUKernelOptions(backward="owner")


class CPUCornerImpl(CPUImpl):
    NAME = "cpu_corner"
    OPTIONS = CPUKernelOptions(fused_corners=False)


class CPUNoPrefetchImpl(CPUImpl):
    NAME = "cpu_noprefetch"
    OPTIONS = CPUKernelOptions(prefetch=False)


class CPUHeadMajorImpl(CPUImpl):
    NAME = "cpu_headmajor"
    OPTIONS = CPUKernelOptions(order="head")


register(CPUImpl())
# Experiment variants: selectable by name, not listed by msda_impls(), never taken by auto.
for _variant in (
    CPUAtomicImpl(),
    CPUOwnerImpl(),
    CPUCornerImpl(),
    CPUNoPrefetchImpl(),
    CPUHeadMajorImpl(),
):
    register_variant(_variant)
