"""``triton``: the Triton kernels of ``kernels/triton.py`` as torch custom ops.

Runs on CUDA tensors (triton) and Ascend NPU tensors (triton-ascend). CPU tensors are
accepted only under the Triton interpreter (``TRITON_INTERPRET=1`` set before the
kernels are first compiled): a test path, never chosen by ``auto`` on CPU. float16 and
bfloat16 inputs are read as they are and accumulated in float32; float64 in float64.
What runs is what ``triton_launch.plan_launches`` plans: the ``cuda`` schedule
(``kernels/triton.py``) except on npu tensors, which take the ``ascend`` one
(``NPUDET_TRITON_SCHEDULE`` forces either); the compile checks compile the same plans.
``triton`` is imported only when a kernel first runs.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor
from torch.autograd import forward_ad

from npudet.utils.packages import package_version
from npudet.utils.torch_compat import assume_constant_result

from .. import kernels
from ..inputs import MSDAInputs, empty_output, register_fake_kernels
from ..kernels.triton_launch import KernelLaunch, MSDAShape, plan_launches, schedule_for
from ..registry import Kernel, MSDAImpl, register
from .first_order import first_order

_KERNELS = f"{kernels.__name__}.triton"


def _interpret_requested() -> bool:
    """Whether ``triton.jit`` would interpret a kernel decorated now."""
    import triton

    knobs = getattr(triton, "knobs", None)  # triton >= 3.4
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def _interpreted() -> bool:
    """Whether the kernels run under the interpreter: as they were decorated if loaded, else
    as they would be now."""
    loaded = sys.modules.get(_KERNELS)
    return loaded.INTERPRETED if loaded is not None else _interpret_requested()


@assume_constant_result
def _cpu_reasons() -> tuple:
    """Why CPU tensors cannot run here: they need the interpreter."""
    if _interpreted():
        return ()
    if _KERNELS in sys.modules:
        return (
            "cpu tensors need the Triton interpreter, but the kernels were compiled "
            "before TRITON_INTERPRET=1 was set",
        )
    return (
        "cpu tensors run only under the Triton interpreter (set TRITON_INTERPRET=1 "
        "before the first Triton kernel is compiled; a slow test path)",
    )


@assume_constant_result
def _npu_reasons() -> tuple:
    """Why NPU tensors cannot run here: compiled kernels need triton-ascend's backend (the
    ``ascend`` folder it adds to ``triton/backends``); interpreted ones need nothing."""
    if _interpreted():
        return ()
    import triton.backends

    if os.path.isdir(os.path.join(os.path.dirname(triton.backends.__file__), "ascend")):
        return ()
    return (
        "npu tensors need triton-ascend (pip install triton-ascend, which replaces triton: "
        "this triton has no Ascend backend), or the Triton interpreter (TRITON_INTERPRET=1)",
    )


MIN_TRITON_MAJOR = 3  # as the ``triton`` extra of pyproject.toml declares


def _major(version: str) -> Optional[int]:
    """The major release of a version string (``"2.1.0"`` -> 2); None when it states none."""
    head = version.split(".", 1)[0]
    return int(head) if head.isdigit() else None


# The runtime arguments each op can pass, in the order its launchers take them.
FWD_ARGS = ("value", "shapes", "starts", "loc", "attn", "out", "batch", "num_keys", "num_queries")
BWD_ARGS = (
    "grad_out",
    "value",
    "shapes",
    "starts",
    "loc",
    "attn",
    "grad_value",
    "grad_loc",
    "grad_attn",
    "batch",
    "num_keys",
    "num_queries",
)


class Launcher:
    """One planned launch, bound once: the kernel object, its grid, its constexprs, and the
    positions of its runtime arguments among ``FWD_ARGS`` / ``BWD_ARGS``."""

    __slots__ = ("launch", "_bound", "_order", "_meta")

    def __init__(self, launch: KernelLaunch, arg_names: Sequence[str]) -> None:
        module = importlib.import_module(f"{kernels.__name__}.{launch.module}")
        self.launch = launch
        self._bound = getattr(module, launch.kernel)[launch.grid]
        self._order = tuple(arg_names.index(name) for name in launch.signature)
        self._meta = dict(launch.constexprs, num_warps=launch.num_warps)

    def __call__(self, *args: object) -> None:
        self._bound(*[args[i] for i in self._order], **self._meta)


def build_launchers(
    schedule: str, dtype: str, shape: MSDAShape, index_dtype: str
) -> Tuple[Launcher, Launcher]:
    """The forward and backward launchers of a call (``triton_launch.plan_launches``)."""
    plans = plan_launches(schedule, dtype, shape, index_dtype)
    return Launcher(plans["fwd"], FWD_ARGS), Launcher(plans["bwd"], BWD_ARGS)


# (schedule, dtype, shape, index dtype) -> launchers: planned and bound once per signature.
# Bounded: padded batches of varying image sizes make a new num_keys nearly every step.
_LAUNCHERS: Dict[tuple, Tuple[Launcher, Launcher]] = {}
MAX_LAUNCHERS = 512


def _launchers(
    value: torch.Tensor, shapes: torch.Tensor, sampling_locations: torch.Tensor
) -> Tuple[Launcher, Launcher]:
    bs, num_keys, heads, dim = value.shape
    num_queries, levels, points = (sampling_locations.shape[i] for i in (1, 3, 4))
    key = (
        schedule_for(value.device.type),
        value.dtype,
        (bs, num_keys, num_queries, heads, dim, levels, points),
        shapes.dtype,
    )
    launchers = _LAUNCHERS.get(key)
    if launchers is None:
        if len(_LAUNCHERS) >= MAX_LAUNCHERS:
            del _LAUNCHERS[next(iter(_LAUNCHERS))]
        launchers = _LAUNCHERS[key] = build_launchers(
            key[0],
            str(value.dtype).removeprefix("torch."),
            MSDAShape(*key[2]),
            str(shapes.dtype).removeprefix("torch."),
        )
    return launchers


def _levels(
    spatial_shapes: torch.Tensor, level_start_index: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Both level tensors contiguous in one index dtype (int64 when theirs differ): one index
    type per kernel signature."""
    if spatial_shapes.dtype != level_start_index.dtype:
        spatial_shapes, level_start_index = spatial_shapes.long(), level_start_index.long()
    return spatial_shapes.contiguous(), level_start_index.contiguous()


def _device_guard(device: torch.device):
    """The launch's device made current (a no-op for CPU tensors under the interpreter)."""
    if device.type == "cpu":
        return contextlib.nullcontext()
    return torch.get_device_module(device).device(device)


def _forward(value: Tensor, shapes: Tensor, starts: Tensor, loc: Tensor, attn: Tensor) -> Tensor:
    """The forward op's kernel: the op's five inputs -> (bs, num_queries, heads * D)."""
    value, loc, attn = (t.contiguous() for t in (value, loc, attn))
    shapes, starts = _levels(shapes, starts)
    out = empty_output(value, loc)
    fwd, _ = _launchers(value, shapes, loc)
    with _device_guard(value.device):
        fwd(value, shapes, starts, loc, attn, out, value.shape[0], value.shape[1], loc.shape[1])
    return out


def _backward(
    grad_output: torch.Tensor,
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    grad_out, value, loc, attn = (
        t.contiguous() for t in (grad_output, value, sampling_locations, attention_weights)
    )
    shapes, starts = _levels(spatial_shapes, level_start_index)
    acc = torch.float64 if value.dtype == torch.float64 else torch.float32
    grad_value = torch.zeros(value.shape, dtype=acc, device=value.device)
    grad_loc = torch.empty_like(loc)
    grad_attn = torch.empty_like(attn)
    _, bwd = _launchers(value, shapes, loc)
    with _device_guard(value.device):
        tensors = (grad_out, value, shapes, starts, loc, attn, grad_value, grad_loc, grad_attn)
        bwd(*tensors, value.shape[0], value.shape[1], loc.shape[1])
    return grad_value.to(value.dtype), grad_loc, grad_attn


# Two plain ops (schema, one Python kernel for every device, fake kernels) under one
# autograd.Function: an eager call goes Function -> dispatcher -> kernel, without the
# Python layers of torch.library.custom_op (its autograd and backend wrappers, argument
# binding); torch.compile traces the Function and keeps each op as one node.
_LIB = torch.library.Library("npudet", "FRAGMENT")
_LIB.define(
    "msda_triton_forward(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
    "Tensor sampling_locations, Tensor attention_weights) -> Tensor"
)
_LIB.define(
    "msda_triton_backward(Tensor grad_output, Tensor value, Tensor spatial_shapes, "
    "Tensor level_start_index, Tensor sampling_locations, Tensor attention_weights) "
    "-> (Tensor, Tensor, Tensor)"
)
_LIB.impl("msda_triton_forward", _forward, "CompositeExplicitAutograd")
_LIB.impl("msda_triton_backward", _backward, "CompositeExplicitAutograd")
# value (bs, keys, heads, D) -> (bs, num_queries, heads * D), the dtype of value. Not
# differentiable itself: ``msda_triton`` is.
msda_triton_forward = torch.ops.npudet.msda_triton_forward.default
# grad_output (bs, num_queries, heads * D) + the forward's inputs -> the three gradients.
msda_triton_backward = torch.ops.npudet.msda_triton_backward.default


register_fake_kernels(_LIB, "npudet::msda_triton_forward", "npudet::msda_triton_backward")


class _MSDATriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *tensors: Tensor) -> Tensor:
        ctx.save_for_backward(*tensors)
        return msda_triton_forward(*tensors)

    # No jvp: forward-mode AD raises; the backward op has no formula: second order raises.
    @staticmethod
    def backward(ctx, grad_output):
        grad_value, grad_loc, grad_attn = first_order(
            "npudet::msda_triton_backward", msda_triton_backward, grad_output, *ctx.saved_tensors
        )
        return grad_value, None, None, grad_loc, grad_attn


def msda_triton(*tensors: Tensor) -> Tensor:
    """The op's five inputs (value (bs, keys, heads, D), spatial_shapes, level_start_index,
    sampling_locations, attention_weights) -> (bs, num_queries, heads * D), differentiable
    w.r.t. value, sampling_locations and attention_weights; a call that needs no gradient
    goes straight to the forward op. Inside forward-mode AD (a dual level open, as
    ``torch.func.jvp`` opens one) every call goes through the Function, whose missing jvp
    raises: a tangent is never dropped silently."""
    value, _, _, loc, attn = tensors
    if (
        torch.is_grad_enabled() and (value.requires_grad or loc.requires_grad or attn.requires_grad)
    ) or forward_ad._current_level >= 0:
        return _MSDATriton.apply(*tensors)
    return msda_triton_forward(*tensors)


class TritonImpl(MSDAImpl):
    """Fused Triton kernels; CUDA and Ascend (triton-ascend), CPU only when interpreted."""

    NAME = "triton"
    DEVICES = ("cuda", "npu", "cpu")
    DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    MAX_HEAD_DIM = 1024
    SOURCES = (
        "kernels/triton.py",
        "kernels/triton_bilinear.py",
        "kernels/triton_launch.py",
        "kernels/triton_ascend.py",
        "kernels/triton_ascend_launch.py",
    )

    def unavailable_reasons(self) -> List[str]:
        version = package_version("triton")
        if version is None:
            return [
                "triton does not import (pip install 'npudet[triton]'; triton-ascend on Ascend)"
            ]
        # The kernels use triton 3's language and interpreter; torch 2.1 pins triton 2.1.
        major = _major(version)
        if major is not None and major < MIN_TRITON_MAJOR:
            return [
                f"triton {version} is older than {MIN_TRITON_MAJOR}.0, which the kernels "
                "need (torch 2.1 and 2.2 pin triton 2.x: use torch >= 2.3 for this route)"
            ]
        return []

    def not_supported_reasons(self, inputs: MSDAInputs) -> List[str]:
        reasons = super().not_supported_reasons(inputs)
        if reasons:
            return reasons
        if inputs.device_type == "cpu":
            reasons.extend(_cpu_reasons())
        if inputs.device_type == "npu":
            reasons.extend(_npu_reasons())
            if inputs.dtype == torch.float64:
                reasons.append("float64 on npu: triton-ascend has no float64 arithmetic")
        return reasons

    def forward(self, *tensors: Tensor) -> Tensor:
        return msda_triton(*tensors)

    def bind(self, inputs: MSDAInputs) -> Kernel:
        return msda_triton


register(TritonImpl())
