"""``triton``: the Triton kernels of ``triton_kernels.py`` as torch custom ops.

Runs on CUDA tensors (triton) and Ascend NPU tensors (triton-ascend). CPU tensors are
accepted only under the Triton interpreter (``TRITON_INTERPRET=1`` set before the
kernels are first compiled): a test path, never chosen by ``auto`` on CPU. float16 and
bfloat16 inputs are read as they are and accumulated in float32; float64 in float64.
What runs is what ``triton_launch.plan_launches`` plans: the ``cuda`` schedule
(``triton_kernels.py``) except on npu tensors, which take the ``ascend`` one
(``NPUDET_TRITON_SCHEDULE`` forces either); the compile checks compile the same plans.
``triton`` is imported only when a kernel first runs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Dict, List, Sequence, Tuple

import torch

from npudet.utils.packages import importable

from .inputs import MSDAInputs
from .registry import MSDAImpl, register
from .triton_launch import KernelLaunch, MSDAShape, plan_launches, schedule_for

_KERNELS = f"{__package__}.triton_kernels"


def _interpret_requested() -> bool:
    """Whether ``triton.jit`` would interpret a kernel decorated now."""
    import triton

    knobs = getattr(triton, "knobs", None)  # triton >= 3.4
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


@torch.compiler.assume_constant_result
def _cpu_reasons() -> tuple:
    """Why CPU tensors cannot run here: they need the interpreter."""
    kernels = sys.modules.get(_KERNELS)
    interpreted = kernels.INTERPRETED if kernels is not None else _interpret_requested()
    if interpreted:
        return ()
    if kernels is not None:
        return (
            "cpu tensors need the Triton interpreter, but the kernels were compiled "
            "before TRITON_INTERPRET=1 was set",
        )
    return (
        "cpu tensors run only under the Triton interpreter (set TRITON_INTERPRET=1 "
        "before the first Triton kernel is compiled; a slow test path)",
    )


def _plan(
    value: torch.Tensor, level_tensors: Sequence[torch.Tensor], sampling_locations: torch.Tensor
) -> Tuple[Dict[str, KernelLaunch], List[torch.Tensor]]:
    """The launches of this call (``triton_launch.plan_launches``) and the level tensors.

    spatial_shapes and level_start_index are passed as they are when their dtypes agree,
    else both as int64 (one index type per kernel signature).
    """
    if len({t.dtype for t in level_tensors}) > 1:
        level_tensors = [t.to(torch.int64) for t in level_tensors]
    bs, num_keys, heads, dim = value.shape
    num_queries, levels, points = (sampling_locations.shape[i] for i in (1, 3, 4))
    shape = MSDAShape(bs, num_keys, num_queries, heads, dim, levels, points)
    launches = plan_launches(
        schedule_for(value.device.type),
        str(value.dtype).removeprefix("torch."),
        shape,
        str(level_tensors[0].dtype).removeprefix("torch."),
    )
    return launches, list(level_tensors)


def _run(launch: KernelLaunch, device: torch.device, args: Dict[str, object]) -> None:
    """Launch exactly ``launch``, binding its runtime arguments by name from ``args``."""
    kernel = getattr(importlib.import_module(f"{__package__}.{launch.module}"), launch.kernel)
    guard = (
        contextlib.nullcontext()
        if device.type == "cpu"
        else torch.get_device_module(device).device(device)
    )
    with guard:
        kernel[launch.grid](
            **{name: args[name] for name in launch.signature},
            **launch.constexprs,
            num_warps=launch.num_warps,
        )


@torch.library.custom_op("npudet::msda_triton_forward", mutates_args=())
def msda_triton_forward(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> torch.Tensor:
    """value (bs, keys, heads, D) -> (bs, num_queries, heads * D), the dtype of value."""
    value, spatial_shapes, level_start_index, sampling_locations, attention_weights = (
        t.contiguous()
        for t in (value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
    )
    bs, num_keys, heads, dim = value.shape
    num_queries = sampling_locations.shape[1]
    launches, (shapes, starts) = _plan(
        value, (spatial_shapes, level_start_index), sampling_locations
    )
    out = value.new_empty((bs, num_queries, heads * dim))
    args = dict(
        value=value,
        shapes=shapes,
        starts=starts,
        loc=sampling_locations,
        attn=attention_weights,
        out=out,
        batch=bs,
        num_keys=num_keys,
        num_queries=num_queries,
    )
    _run(launches["fwd"], value.device, args)
    return out


@msda_triton_forward.register_fake
def _(value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    bs, _, heads, dim = value.shape
    return value.new_empty((bs, sampling_locations.shape[1], heads * dim))


@torch.library.custom_op("npudet::msda_triton_backward", mutates_args=())
def msda_triton_backward(
    grad_output: torch.Tensor,
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """grad_output (bs, num_queries, heads * D) -> grads of value, locations, weights."""
    grad_output, value, spatial_shapes, level_start_index, sampling_locations, attention_weights = (
        t.contiguous()
        for t in (
            grad_output,
            value,
            spatial_shapes,
            level_start_index,
            sampling_locations,
            attention_weights,
        )
    )
    launches, (shapes, starts) = _plan(
        value, (spatial_shapes, level_start_index), sampling_locations
    )
    acc = torch.float64 if value.dtype == torch.float64 else torch.float32
    grad_value = torch.zeros(value.shape, dtype=acc, device=value.device)
    grad_loc = torch.empty_like(sampling_locations)
    grad_attn = torch.empty_like(attention_weights)
    args = dict(
        grad_out=grad_output,
        value=value,
        shapes=shapes,
        starts=starts,
        loc=sampling_locations,
        attn=attention_weights,
        grad_value=grad_value,
        grad_loc=grad_loc,
        grad_attn=grad_attn,
        batch=value.shape[0],
        num_keys=value.shape[1],
        num_queries=sampling_locations.shape[1],
    )
    _run(launches["bwd"], value.device, args)
    return grad_value.to(value.dtype), grad_loc, grad_attn


@msda_triton_backward.register_fake
def _(grad_output, value, spatial_shapes, level_start_index, sampling_locations, attention_weights):
    return (
        torch.empty_like(value, memory_format=torch.contiguous_format),
        torch.empty_like(sampling_locations, memory_format=torch.contiguous_format),
        torch.empty_like(attention_weights, memory_format=torch.contiguous_format),
    )


def _setup_context(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, grad_output):
    grad_value, grad_loc, grad_attn = msda_triton_backward(grad_output, *ctx.saved_tensors)
    return grad_value, None, None, grad_loc, grad_attn


msda_triton_forward.register_autograd(_backward, setup_context=_setup_context)


class TritonImpl(MSDAImpl):
    """Fused Triton kernels; CUDA and Ascend (triton-ascend), CPU only when interpreted."""

    NAME = "triton"
    DEVICES = ("cuda", "npu", "cpu")
    DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    MAX_HEAD_DIM = 1024

    def unavailable_reasons(self) -> List[str]:
        if importable("triton"):
            return []
        return ["triton does not import (pip install 'npudet[triton]'; triton-ascend on Ascend)"]

    def not_supported_reasons(self, inputs: MSDAInputs) -> List[str]:
        reasons = super().not_supported_reasons(inputs)
        if reasons:
            return reasons
        if inputs.device_type == "cpu":
            reasons.extend(_cpu_reasons())
        if inputs.device_type == "npu" and inputs.dtype == torch.float64:
            reasons.append("float64 on npu: triton-ascend has no float64 arithmetic")
        return reasons

    def forward(
        self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    ):
        return msda_triton_forward(
            value, spatial_shapes, level_start_index, sampling_locations, attention_weights
        )


register(TritonImpl())
