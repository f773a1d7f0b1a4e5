"""``npu_vendor``: Ascend's own MSDA kernels on NPU tensors.

Prefers DrivingSDK's ``mx_driving.multi_scale_deformable_attn``; without it, mmcv's
``MultiScaleDeformableAttnFunction``, whose NPU kernel (aclnn) exists from mmcv 2.2 on
(mmcv 2.1 has none; mmdet 3.3 refuses mmcv >= 2.2, so that route needs a patched stack).
Each route's documented limits become ``not_supported_reasons``, so ``auto`` falls back
to ``triton`` or ``gather`` outside them. Nothing is imported until a route is probed.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from .inputs import MSDAInputs
from .registry import MSDAImpl, importable, package_version, register

MX_DRIVING = "mx_driving"
MMCV = "mmcv"
_MMCV_IM2COL_STEP = 64


def _version_tuple(version: str) -> Tuple[int, ...]:
    parts = []
    for part in version.split(".")[:3]:
        digits = "".join(c for c in part if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


def vendor_route() -> Optional[str]:
    """``"mx_driving"``, ``"mmcv"`` or None: which vendor kernel NPU calls would use."""
    if not importable("torch_npu"):
        return None
    if importable("mx_driving"):
        return MX_DRIVING
    mmcv_version = package_version("mmcv")
    if mmcv_version and _version_tuple(mmcv_version) >= (2, 2) and importable("mmcv._ext"):
        return MMCV
    return None


def _mx_driving_reasons(inputs: MSDAInputs) -> List[str]:
    """DrivingSDK's documented limits (heads <= 8, head_dim % 8 == 0 and <= 256, L*P <= 64)."""
    reasons = []
    if inputs.num_heads > 8:
        reasons.append(f"mx_driving: num_heads {inputs.num_heads} > 8")
    if inputs.head_dim % 8:
        reasons.append(f"mx_driving: head_dim {inputs.head_dim} not a multiple of 8")
    if inputs.num_levels * inputs.num_points > 64:
        reasons.append(
            f"mx_driving: num_levels * num_points = {inputs.num_levels * inputs.num_points} > 64"
        )
    return reasons


def _mmcv_reasons(inputs: MSDAInputs) -> List[str]:
    """mmcv's NPU checks: float32/16, heads in [4, 8], head_dim in [32, 256], points in [4, 8]."""
    reasons = []
    if inputs.dtype not in (torch.float32, torch.float16):
        reasons.append(f"mmcv npu: dtype {inputs.dtype} not in [float32, float16]")
    if not 4 <= inputs.num_heads <= 8:
        reasons.append(f"mmcv npu: num_heads {inputs.num_heads} not in [4, 8]")
    if not 32 <= inputs.head_dim <= 256:
        reasons.append(f"mmcv npu: head_dim {inputs.head_dim} not in [32, 256]")
    if not 4 <= inputs.num_points <= 8:
        reasons.append(f"mmcv npu: num_points {inputs.num_points} not in [4, 8]")
    return reasons


class NPUVendorImpl(MSDAImpl):
    """Ascend vendor kernel (DrivingSDK, else mmcv >= 2.2) within its documented limits."""

    NAME = "npu_vendor"
    DEVICES = ("npu",)
    DTYPES = (torch.float16, torch.bfloat16, torch.float32)
    MAX_HEAD_DIM = 256

    def unavailable_reasons(self) -> List[str]:
        if not importable("torch_npu"):
            return ["torch_npu does not import (no Ascend NPU stack)"]
        if vendor_route() is None:
            return [
                "neither mx_driving (DrivingSDK) imports nor mmcv >= 2.2 with compiled ops "
                "(mmcv 2.1 has no NPU MSDA kernel)"
            ]
        return []

    def not_supported_reasons(self, inputs: MSDAInputs) -> List[str]:
        reasons = super().not_supported_reasons(inputs)
        if reasons:
            return reasons
        route = vendor_route()
        return _mx_driving_reasons(inputs) if route == MX_DRIVING else _mmcv_reasons(inputs)

    def forward(
        self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    ):
        if vendor_route() == MX_DRIVING:
            import mx_driving

            return mx_driving.multi_scale_deformable_attn(
                value,
                spatial_shapes.int(),
                level_start_index.int(),
                sampling_locations,
                attention_weights,
            )
        from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction

        return MultiScaleDeformableAttnFunction.apply(
            value,
            spatial_shapes,
            level_start_index,
            sampling_locations,
            attention_weights,
            _MMCV_IM2COL_STEP,
        )


register(NPUVendorImpl())
