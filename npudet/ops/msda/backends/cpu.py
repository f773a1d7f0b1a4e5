"""``cpu``: the fused C++/OpenMP kernel (``ops/msda_cpu/``) as the torch op
``npudet::msda_cpu_forward``, whose schema, kernels and autograd node are C++ too: a call is
one dispatcher call. ``cpu_library`` builds and loads the native libraries (its ``isa()``
names the instruction-set build loaded).

The kernel's design choices are one typed option set, ``cpu_options.CPUKernelOptions``,
passed to the ops as ``as_ints()``. Experiment variants (``msda_variants()``, not
``msda_impls()``) let the benchmark and the ablation tool price each choice; each differs
from ``cpu`` (the defaults: fused 4-corner pass, prefetch, query order, ``auto`` backward)
in exactly the one option its name says: ``cpu_atomic`` (backward="atomic"),
``cpu_owner`` (backward="owner"), ``cpu_corner`` (fused_corners=False),
``cpu_noprefetch`` (prefetch=False) and ``cpu_headmajor`` (order="head").
"""

from __future__ import annotations

from typing import List, Optional

import torch

from ..inputs import MSDAInputs
from ..kernels.native_build import compiler_version
from ..registry import Kernel, MSDAImpl, register, register_variant
from . import cpu_library
from .cpu_options import CPUKernelOptions


class CPUImpl(MSDAImpl):
    """Fused CPU kernel; half/bfloat16 inputs are computed in float32."""

    NAME = "cpu"
    OPTIONS = CPUKernelOptions()
    DEVICES = ("cpu",)
    # Private-copy and ownership backward: each grad_value element has one writer and the
    # copies are added in thread order, fixed for a fixed thread count (tested bitwise).
    DETERMINISTIC = ("cpu",)
    DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    SOURCES = ("native:msda_cpu/", "backends/cpu_options.py", *cpu_library.BUILD_FILES)

    def unavailable_reasons(self) -> List[str]:
        reason = cpu_library.unavailable_reason()
        return [reason] if reason else []

    def forward(self, *tensors: torch.Tensor) -> torch.Tensor:
        """The five inputs of ``MSDAImpl.forward`` -> (bs, num_queries, heads * D)."""
        return cpu_library.forward_op()(*tensors, self.OPTIONS.as_ints())

    def build_info(self) -> str:
        info = f"{cpu_library.isa()} build, autograd: {cpu_library.autograd()}"
        return info + (", sanitized" if cpu_library.sanitized() else "")

    def build_key(self) -> Optional[str]:
        """The instruction-set variant and the compiler that built it (a verification holds
        for that build only); None when the kernel is unavailable."""
        isa = cpu_library.isa()
        if isa is None:
            return None
        return f"{isa}; {compiler_version()}" + ("; sanitized" if cpu_library.sanitized() else "")

    def bind(self, inputs: MSDAInputs) -> Kernel:
        op, options = cpu_library.forward_op(), self.OPTIONS.as_ints()

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
