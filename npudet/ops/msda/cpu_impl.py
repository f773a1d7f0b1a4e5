"""``cpu``: the fused C++/OpenMP kernel (``ops/cpu/msda_cpu.cpp``) as torch custom ops.

The kernel is built on first use for the instruction set chosen at run time from the CPU's
features (``cpu_isa``; ``NPUDET_CPU_ISA`` forces one); ``isa()`` names the one loaded.

Experiment variants (``msda_variants()``, not ``msda_impls()``) expose the kernel's
design choices so the benchmark and the ablation tool can price each one: ``cpu`` (fused
4-corner pass, prefetched corner rows, contention-free backward: private per-thread
grad_value copies while they are small, else (batch, head) ownership),
``cpu_atomic`` (backward parallel over queries with atomic adds into grad_value),
``cpu_owner`` (always the (batch, head) ownership partition), ``cpu_corner`` (one pass
over the channels per corner instead of one for all four), ``cpu_noprefetch`` and
``cpu_headmajor`` (work ordered head by head, a block of neighbouring queries per work
item, instead of query by query with all heads of a query in turn).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from . import cpu_isa
from .native_build import load_extension
from .registry import MSDAImpl, register, register_variant

# Variant bits, as in ops/cpu/msda_cpu.cpp.
FUSED = 1
ATOMIC = 2
PRIVATE = 4
OWNER = 8
NO_PREFETCH = 16
HEAD_MAJOR = 32


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


def _ext():
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
    variant: int,
) -> torch.Tensor:
    """value (bs, keys, heads, D) float32/64 -> (bs, num_queries, heads * D)."""
    return _ext().forward(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights, variant
    )


@msda_cpu_forward.register_fake
def _(value, spatial_shapes, level_start_index, sampling_locations, attention_weights, variant):
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
    variant: int,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients w.r.t. value, sampling_locations and attention_weights."""
    grad_value, grad_loc, grad_attn = _ext().backward(
        grad_output,
        value,
        spatial_shapes,
        level_start_index,
        sampling_locations,
        attention_weights,
        variant,
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
    variant,
):
    return (
        torch.empty_like(value),
        torch.empty_like(sampling_locations),
        torch.empty_like(attention_weights),
    )


def _setup_context(ctx, inputs, output) -> None:
    value, spatial_shapes, level_start_index, sampling_locations, attention_weights, variant = (
        inputs
    )
    ctx.save_for_backward(
        value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    )
    ctx.variant = variant


def _backward(ctx, grad_output):
    grad_value, grad_loc, grad_attn = msda_cpu_backward(
        grad_output.contiguous(), *ctx.saved_tensors, ctx.variant
    )
    return grad_value, None, None, grad_loc, grad_attn, None


msda_cpu_forward.register_autograd(_backward, setup_context=_setup_context)


class CPUImpl(MSDAImpl):
    """Fused CPU kernel; half/bfloat16 inputs are computed in float32."""

    NAME = "cpu"
    VARIANT = FUSED
    DEVICES = ("cpu",)
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
            self.VARIANT,
        )
        return out.to(dtype)


class CPUAtomicImpl(CPUImpl):
    NAME = "cpu_atomic"
    VARIANT = FUSED | ATOMIC


class CPUOwnerImpl(CPUImpl):
    NAME = "cpu_owner"
    VARIANT = FUSED | OWNER


class CPUCornerImpl(CPUImpl):
    NAME = "cpu_corner"
    VARIANT = 0


class CPUNoPrefetchImpl(CPUImpl):
    NAME = "cpu_noprefetch"
    VARIANT = FUSED | NO_PREFETCH


class CPUHeadMajorImpl(CPUImpl):
    NAME = "cpu_headmajor"
    VARIANT = FUSED | HEAD_MAJOR


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
