"""``mmcv``: mmcv's own CUDA kernel (``MultiScaleDeformableAttnFunction``) on CUDA tensors.

The proven path of every CUDA build of mmcv, and the baseline a CUDA user compares
against. Usable where a CUDA device is present and mmcv's compiled ops were built with
CUDA (``mmcv._ext.get_compiling_cuda_version()`` is not ``"not available"``; CPU-only
builds and ``mmcv-lite`` have no such kernel). mmcv 2.1 dispatches float32, float64 and
float16 (``AT_DISPATCH_FLOATING_TYPES_AND_HALF``), reads ``spatial_shapes`` and
``level_start_index`` as int64 and needs contiguous inputs; with its ``im2col_step`` of 64
a batch above 64 must be a multiple of 64. Its ``autograd.Function`` calls an opaque
extension that ``torch.compile`` cannot trace, so ``auto`` leaves it out of compiled code.
Nothing from mmcv is imported until a probe or a call needs it.

Without mmcv's compiled ops, the same kernel can come from the operator library that
``mmcv_cuda_lib`` builds from mmcv's sdist (``NPUDET_MMCV_CUDA_LIB`` = its path): the
``cuda_lib`` route, for machines that have a GPU and nvcc but no mmcv (``route()``).
"""

from __future__ import annotations

import functools
import os
from typing import List, Optional, Tuple

import torch

from npudet.utils.packages import importable
from npudet.utils.torch_compat import is_compiling

from ..inputs import MSDAInputs
from ..registry import MSDAImpl, register
from . import mmcv_cuda_lib

IM2COL_STEP = 64  # mmcv's MultiScaleDeformableAttention default


@functools.cache
def compiled_cuda_version() -> Optional[str]:
    """The CUDA version mmcv's ops were compiled with, or None (no ops, or CPU-only ops)."""
    if not importable("mmcv._ext"):
        return None
    import mmcv._ext

    reported = str(mmcv._ext.get_compiling_cuda_version())
    return None if reported == "not available" else reported


@functools.cache
def _cuda_lib() -> Tuple[Optional[object], str]:
    """(``torch.ops.npudet_mmcv``, "") from the library ``$NPUDET_MMCV_CUDA_LIB`` names,
    loaded once; (None, why) when it does not load; (None, "") when the variable is unset."""
    path = os.environ.get(mmcv_cuda_lib.LIB_ENV)
    if not path:
        return None, ""
    try:
        return mmcv_cuda_lib.load(path), ""
    except (OSError, RuntimeError) as exc:
        return None, f"${mmcv_cuda_lib.LIB_ENV}={path} does not load: {exc}"[:500]


def cuda_lib() -> Optional[object]:
    """The ``cuda_lib`` route's operators, or None."""
    return _cuda_lib()[0]


def route() -> Optional[str]:
    """Where the kernel comes from here: "mmcv._ext" (mmcv's CUDA build), "cuda_lib" (the
    library built from mmcv's sdist), or None."""
    if compiled_cuda_version() is not None:
        return "mmcv._ext"
    return "cuda_lib" if cuda_lib() is not None else None


class _CudaLibFunction(torch.autograd.Function):
    """mmcv's ``MultiScaleDeformableAttnFunction`` over the ``cuda_lib`` operators."""

    @staticmethod
    def forward(ctx, value, spatial_shapes, level_start_index, locations, weights, step):
        ctx.im2col_step = step
        ctx.save_for_backward(value, spatial_shapes, level_start_index, locations, weights)
        return cuda_lib().ms_deform_attn_forward(
            value, spatial_shapes, level_start_index, locations, weights, step
        )

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_output):
        value, shapes, starts, locations, weights = ctx.saved_tensors
        grad_value, grad_locations, grad_weights = cuda_lib().ms_deform_attn_backward(
            value, shapes, starts, locations, weights, grad_output, ctx.im2col_step
        )
        return grad_value, None, None, grad_locations, grad_weights, None


def call_reasons(inputs: MSDAInputs, compiling: bool) -> List[str]:
    """Limits of mmcv's kernel for one call, beyond device and dtype."""
    reasons = []
    if inputs.batch > IM2COL_STEP and inputs.batch % IM2COL_STEP:
        reasons.append(
            f"mmcv: batch {inputs.batch} > im2col_step {IM2COL_STEP} and not a multiple of it"
        )
    if compiling:
        reasons.append("mmcv: its autograd.Function does not trace under torch.compile")
    return reasons


class MMCVImpl(MSDAImpl):
    """mmcv's CUDA kernel, float16/32/64 (no bfloat16)."""

    NAME = "mmcv"
    DEVICES = ("cuda",)
    DTYPES = (torch.float16, torch.float32, torch.float64)
    # mmcv's own build is keyed by mmcv's version; the ``cuda_lib`` route by its sources and
    # the library $NPUDET_MMCV_CUDA_LIB names (``mmcv_cuda_lib``).
    SOURCES = ("backends/mmcv_cuda_lib.py", "native:mmcv_cuda/", "env:NPUDET_MMCV_CUDA_LIB")

    def unavailable_reasons(self) -> List[str]:
        # Without a device nothing can run: mmcv is not even imported to say more.
        if not torch.cuda.is_available():
            return ["no CUDA device (torch.cuda.is_available() is False)"]
        if route() is None:
            return [
                "mmcv's compiled ops are missing or were built without CUDA "
                "(mmcv._ext.get_compiling_cuda_version() is 'not available'), and "
                + (
                    _cuda_lib()[1]
                    or f"no library built from mmcv's sdist is named by ${mmcv_cuda_lib.LIB_ENV}"
                )
            ]
        return []

    def not_supported_reasons(self, inputs: MSDAInputs) -> List[str]:
        reasons = super().not_supported_reasons(inputs)
        return reasons + call_reasons(inputs, is_compiling())

    def forward(
        self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    ):
        if route() == "cuda_lib":
            function = _CudaLibFunction
        else:
            from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction

            function = MultiScaleDeformableAttnFunction
        return function.apply(
            value.contiguous(),
            spatial_shapes.long().contiguous(),
            level_start_index.long().contiguous(),
            sampling_locations.contiguous(),
            attention_weights.contiguous(),
            IM2COL_STEP,
        )


register(MMCVImpl())
