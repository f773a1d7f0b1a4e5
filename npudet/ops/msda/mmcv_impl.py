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
"""

from __future__ import annotations

import functools
from typing import List, Optional

import torch

from npudet.utils.packages import importable

from .inputs import MSDAInputs
from .registry import MSDAImpl, register

IM2COL_STEP = 64  # mmcv's MultiScaleDeformableAttention default


@functools.cache
def compiled_cuda_version() -> Optional[str]:
    """The CUDA version mmcv's ops were compiled with, or None (no ops, or CPU-only ops)."""
    if not importable("mmcv._ext"):
        return None
    import mmcv._ext

    reported = str(mmcv._ext.get_compiling_cuda_version())
    return None if reported == "not available" else reported


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

    def unavailable_reasons(self) -> List[str]:
        # Without a device nothing can run: mmcv is not even imported to say more.
        if not torch.cuda.is_available():
            return ["no CUDA device (torch.cuda.is_available() is False)"]
        if compiled_cuda_version() is None:
            return [
                "mmcv's compiled ops are missing or were built without CUDA "
                "(mmcv._ext.get_compiling_cuda_version() is 'not available')"
            ]
        return []

    def not_supported_reasons(self, inputs: MSDAInputs) -> List[str]:
        reasons = super().not_supported_reasons(inputs)
        return reasons + call_reasons(inputs, torch.compiler.is_compiling())

    def forward(
        self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    ):
        from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction

        return MultiScaleDeformableAttnFunction.apply(
            value.contiguous(),
            spatial_shapes.long().contiguous(),
            level_start_index.long().contiguous(),
            sampling_locations.contiguous(),
            attention_weights.contiguous(),
            IM2COL_STEP,
        )


register(MMCVImpl())
