"""``cpu``: the fused C++/OpenMP kernel (``ops/cpu/msda_cpu.cpp``) as torch custom ops.

The kernel is built on first use for the instruction set chosen at run time from the CPU's
features (``cpu_isa``; ``NPUDET_CPU_ISA`` forces one); ``isa()`` names the one loaded.

The kernel's design choices are one typed option set, ``cpu_options.CPUKernelOptions``,
passed to the custom ops as ``as_ints()``. Experiment variants (``msda_variants()``, not
``msda_impls()``) let the benchmark and the ablation tool price each choice; each differs
from ``cpu`` (the defaults: fused 4-corner pass, prefetch, query order, ``auto`` backward)
in exactly the one option its name says: ``cpu_atomic`` (backward="atomic"),
``cpu_owner`` (backward="owner"), ``cpu_corner`` (fused_corners=False),
``cpu_noprefetch`` (prefetch=False) and ``cpu_headmajor`` (order="head").
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from . import cpu_isa
from .cpu_options import CPUKernelOptions
from .native_build import load_extension
from .registry import MSDAImpl, register, register_variant

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
    for variant in variants:
        ext = load_extension(
            f"npudet_msda_cpu_{variant.name}",
            ["cpu/msda_cpu.cpp"],
            [variant.march],
            cpu_specific=variant.cpu_specific,
        )
        if not isinstance(ext, str):
            _chosen.update(isa=variant.name, ext=ext)
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


@torch.library.custom_op("npudet::msda_cpu_forward", mutates_args=(), device_types="cpu")
def msda_cpu_forward(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    options: List[int],
) -> torch.Tensor:
    """value (bs, keys, heads, D) float32/64 -> (bs, num_queries, heads * D); ``options`` is
    ``CPUKernelOptions.as_ints()``."""
    return ext().forward(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights, options
    )


@msda_cpu_forward.register_fake
def _(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, options):
    bs, _, heads, dim = value.shape
    return value.new_empty((bs, sampling_locations.shape[1], heads * dim))


@torch.library.custom_op("npudet::msda_cpu_backward", mutates_args=(), device_types="cpu")
def msda_cpu_backward(
    grad_output: torch.Tensor,
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    options: List[int],
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients w.r.t. value, sampling_locations and attention_weights."""
    grad_value, grad_loc, grad_attn = ext().backward(
        grad_output,
        value,
        spatial_shapes,
        level_start_index,
        sampling_locations,
        attention_weights,
        options,
    )
    return grad_value, grad_loc, grad_attn


@msda_cpu_backward.register_fake
def _(
    grad_output,
    value,
    spatial_shapes,
    level_start_index,
    sampling_locations,
    attention_weights,
    options,
):
    return (
        torch.empty_like(value),
        torch.empty_like(sampling_locations),
        torch.empty_like(attention_weights),
    )


def _setup_context(ctx, inputs, output) -> None:
    value, spatial_shapes, level_start_index, sampling_locations, attention_weights, options = (
        inputs
    )
    ctx.save_for_backward(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    )
    ctx.options = options


def _backward(ctx, grad_output):
    grad_value, grad_loc, grad_attn = msda_cpu_backward(
        grad_output.contiguous(), *ctx.saved_tensors, ctx.options
    )
    return grad_value, None, None, grad_loc, grad_attn, None


msda_cpu_forward.register_autograd(_backward, setup_context=_setup_context)


class CPUImpl(MSDAImpl):
    """Fused CPU kernel; half/bfloat16 inputs are computed in float32."""

    NAME = "cpu"
    OPTIONS = CPUKernelOptions()
    DEVICES = ("cpu",)
    # Private-copy and ownership backward: each grad_value element has one writer and the
    # copies are added in thread order, fixed for a fixed thread count (tested bitwise).
    DETERMINISTIC = ("cpu",)
    DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)

    def unavailable_reasons(self) -> List[str]:
        ext = _load()
        return [ext] if isinstance(ext, str) else []

    def forward(
        self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    ):
        dtype = value.dtype
        compute = dtype if dtype in (torch.float32, torch.float64) else torch.float32
        out = msda_cpu_forward(
            value.to(compute).contiguous(),
            spatial_shapes,
            level_start_index,
            sampling_locations.to(compute).contiguous(),
            attention_weights.to(compute).contiguous(),
            self.OPTIONS.as_ints(),
        )
        return out.to(dtype)


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
