"""``npu_vendor``: Ascend's own MSDA kernels on NPU tensors.

Two routes, each declaring what its package really ships (read from the wheels):

- ``mx_driving`` (DrivingSDK, e.g. 26.2.0.post2 for torch 2.6-2.8 on Atlas A2): the op info
  for ascend910b and ascend910_93 declares ``MultiScaleDeformableAttn(Grad)`` for float32
  value / locations / weights and int32 shapes / start index only; its C++ binding refuses
  head_dim > 256 and levels * points > 64; its Python wrapper casts to float32 only under
  autocast and raises on empty tensors. Its documentation adds heads <= 8, head_dim % 8 == 0.
- ``mmcv`` >= 2.2 (mmdet 3.3 refuses it, so a patched stack): ``ms_deform_attn_npu.cpp``
  checks float32/float16, heads in [4, 8], head_dim in [32, 256], points in [4, 8], then
  calls CANN's ``aclnnMultiScaleDeformableAttnFunction``, documented for A2/A3 with
  head_dim % 8 == 0 and <= 256, 32 <= num_queries < 500000, levels, heads, points <= 16.

``torch_npu`` itself exposes no MSDA op (none in 2.6.0, 2.6.0.post5, 2.8.0.post5, 2.14.0),
so CANN's aclnn kernel is reachable only through mmcv.

Both routes run float32 kernels. float16 / bfloat16 inputs are cast to float32 here and the
output cast back (autograd casts the gradients back), rather than declined: the vendor
kernel stays the NPU path under mixed precision, as mmcv's own NPU forward does. The cost:
float32 copies of value, locations and weights held for backward (35 MB at the ddetr-enc
benchmark case) and eight elementwise casts moving about 150 MB per forward+backward there,
about 0.1 ms at the 910B's HBM bandwidth (estimated, not measured). Shapes and start index
are passed as contiguous int32. Each route's limits become ``not_supported_reasons``, so
``auto`` falls back to ``triton`` or ``gather`` outside them. Nothing is imported until a
route is probed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

import torch

from npudet.utils.packages import importable, package_version
from npudet.utils.torch_compat import is_compiling

from ..inputs import MSDAInputs
from ..registry import MSDAImpl, register

MX_DRIVING = "mx_driving"
MMCV = "mmcv"
_MMCV_IM2COL_STEP = 64


@dataclass(frozen=True)
class VendorRoute:
    """What one vendor kernel accepts; bounds are inclusive, ``None`` means unbounded."""

    name: str
    kernel_dtypes: Tuple[torch.dtype, ...]
    heads: Tuple[int, Optional[int]] = (1, None)
    head_dim: Tuple[int, Optional[int]] = (1, None)
    head_dim_multiple: int = 1
    points: Tuple[int, Optional[int]] = (1, None)
    max_levels: Optional[int] = None
    max_levels_x_points: Optional[int] = None
    queries: Tuple[int, Optional[int]] = (1, None)

    def reasons(self, inputs: MSDAInputs) -> List[str]:
        """Why this kernel cannot take a call of these sizes ([] if it can)."""
        reasons = []
        for label, size, (low, high) in (
            ("num_heads", inputs.num_heads, self.heads),
            ("head_dim", inputs.head_dim, self.head_dim),
            ("num_points", inputs.num_points, self.points),
            ("num_queries", inputs.num_queries, self.queries),
        ):
            if size < low:
                reasons.append(f"{self.name}: {label} {size} < {low}")
            if high is not None and size > high:
                reasons.append(f"{self.name}: {label} {size} > {high}")
        if inputs.head_dim % self.head_dim_multiple:
            reasons.append(
                f"{self.name}: head_dim {inputs.head_dim} not a multiple of "
                f"{self.head_dim_multiple}"
            )
        if self.max_levels is not None and inputs.num_levels > self.max_levels:
            reasons.append(f"{self.name}: num_levels {inputs.num_levels} > {self.max_levels}")
        product = inputs.num_levels * inputs.num_points
        if self.max_levels_x_points is not None and product > self.max_levels_x_points:
            reasons.append(
                f"{self.name}: num_levels * num_points = {product} > {self.max_levels_x_points}"
            )
        return reasons


ROUTES = {
    MX_DRIVING: VendorRoute(
        MX_DRIVING,
        kernel_dtypes=(torch.float32,),
        heads=(1, 8),
        head_dim=(1, 256),
        head_dim_multiple=8,
        max_levels_x_points=64,
    ),
    # mmcv's own checks, narrowed further by the aclnn kernel's documented limits.
    MMCV: VendorRoute(
        MMCV,
        kernel_dtypes=(torch.float32,),
        heads=(4, 8),
        head_dim=(32, 256),
        head_dim_multiple=8,
        points=(4, 8),
        max_levels=16,
        queries=(32, 499_999),
    ),
}


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


def int32_levels(tensor: torch.Tensor) -> torch.Tensor:
    """``spatial_shapes`` / ``level_start_index`` as the contiguous int32 both kernels take."""
    return tensor.to(torch.int32).contiguous()


class NPUVendorImpl(MSDAImpl):
    """Ascend vendor kernel (DrivingSDK, else mmcv >= 2.2) within its declared limits."""

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
        if is_compiling():
            # Both routes end in an autograd.Function around a pybind binding
            # (mx_driving._C, mmcv._ext), which dynamo cannot trace: a graph break, or an
            # error under fullgraph=True. `auto` takes the next candidate in compiled code.
            return [f"{vendor_route()}: its autograd.Function does not trace under torch.compile"]
        return ROUTES[vendor_route()].reasons(inputs)

    def forward(
        self, value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    ):
        # The op's validation rejects empty dimensions; this guards direct calls, since
        # mx_driving raises a bare Exception on empty tensors.
        if min(value.numel(), sampling_locations.numel()) == 0:
            raise ValueError(
                "value, sampling_locations: npu_vendor needs non-empty tensors, got shapes "
                f"{tuple(value.shape)} and {tuple(sampling_locations.shape)}"
            )
        route = ROUTES[vendor_route()]
        kernel_dtype = route.kernel_dtypes[0]
        # npudet's contract: a NaN / inf location contributes nothing. Neither vendor documents
        # what its kernel does with one (DrivingSDK's double, like mmcv's grid_sample
        # reference, propagates NaN), so such a point is moved off every map (-1) first.
        locations = sampling_locations.to(kernel_dtype)
        locations = torch.where(torch.isfinite(locations), locations, -1.0)
        args = (
            value.to(kernel_dtype).contiguous(),
            int32_levels(spatial_shapes),
            int32_levels(level_start_index),
            locations.contiguous(),
            attention_weights.to(kernel_dtype).contiguous(),
        )
        if route.name == MX_DRIVING:
            import mx_driving

            out = mx_driving.multi_scale_deformable_attn(*args)
        else:
            from mmcv.ops.multi_scale_deform_attn import MultiScaleDeformableAttnFunction

            out = MultiScaleDeformableAttnFunction.apply(*args, _MMCV_IM2COL_STEP)
        return out.to(value.dtype)


register(NPUVendorImpl())
