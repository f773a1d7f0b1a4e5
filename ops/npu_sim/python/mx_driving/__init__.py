"""Double of DrivingSDK (``mx_driving``) for the simulated NPU: its MSDA op only.

The Python wrapper repeats DrivingSDK's own (``mx_driving/ops/multi_scale_deformable_attn.py``
of 26.2.0.post2): inputs cast to float32 under autocast only, the same exception on empty
tensors, shapes and start index cast with ``.int()``, locations and weights ``type_as(value)``;
the binding double (``_C``) enforces the kernel's contract. DrivingSDK's other ops and its
``transfer_to_npu`` patching of ``torch.cuda`` are not reproduced.
"""

from __future__ import annotations

from typing import Any, Tuple

import torch
from torch.autograd.function import Function, once_differentiable
from torch.npu.amp import custom_bwd, custom_fwd

from . import _C

__version__ = "0+npudet.simulated"


class MultiScaleDeformableAttnFunction(Function):
    @staticmethod
    @custom_fwd(cast_inputs=torch.float32)
    def forward(
        ctx: Any,
        value: torch.Tensor,
        value_spatial_shapes: torch.Tensor,
        value_level_start_index: torch.Tensor,
        sampling_locations: torch.Tensor,
        attention_weights: torch.Tensor,
    ) -> torch.Tensor:
        if min(value.numel(), value_spatial_shapes.numel(), attention_weights.numel()) == 0:
            # DrivingSDK's message, typo included.
            raise Exception("Erorr! Input Tensor can not be a empty Tensor.\n")
        value_spatial_shapes = value_spatial_shapes.int()
        value_level_start_index = value_level_start_index.int()
        sampling_locations = sampling_locations.type_as(value)
        attention_weights = attention_weights.type_as(value)
        output = _C.multi_scale_deformable_attn(
            value,
            value_spatial_shapes,
            value_level_start_index,
            sampling_locations,
            attention_weights,
        )
        ctx.save_for_backward(
            value,
            value_spatial_shapes,
            value_level_start_index,
            sampling_locations,
            attention_weights,
        )
        return output

    @staticmethod
    @once_differentiable
    @custom_bwd
    def backward(ctx: Any, grad_output: torch.Tensor) -> Tuple[Any, ...]:
        grad_value, grad_locations, grad_weights = _C.multi_scale_deformable_attn_backward(
            *ctx.saved_tensors, grad_output
        )
        return grad_value, None, None, grad_locations, grad_weights


multi_scale_deformable_attn = MultiScaleDeformableAttnFunction.apply
