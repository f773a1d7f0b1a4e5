"""The one public MSDA entry point."""

from __future__ import annotations

from typing import Dict, Sequence, Union

import torch

from . import call_plan, observe
from .auto import nondeterministic_reason, select_impl
from .inputs import MSDAInputs, validate_inputs


def multi_scale_deformable_attn(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    impl: str = "auto",
) -> torch.Tensor:
    """Multi-scale deformable attention with mmcv's reference semantics.

    Bilinear sampling with zero padding and ``align_corners=False``; locations outside
    [0, 1] contribute zeros.

    Args:
        value: (bs, num_keys, num_heads, head_dim) float.
        spatial_shapes: (num_levels, 2) int, (H, W) per level; sum of H*W = num_keys.
        level_start_index: (num_levels,) int, cumulative H*W.
        sampling_locations: (bs, num_queries, num_heads, num_levels, num_points, 2), (x, y).
        attention_weights: (bs, num_queries, num_heads, num_levels, num_points).
        impl: a name from ``msda_impls()`` (or an experiment variant from
            ``msda_variants()``), used as given; or ``"auto"``: the fastest that fits and
            has been verified on this device (``auto.select_impl``). The decision
            is made once per call signature (``call_plan``).

    Returns:
        (bs, num_queries, num_heads * head_dim), the dtype of ``value``.
    """
    plan = call_plan.lookup(
        impl, value, spatial_shapes, level_start_index, sampling_locations, attention_weights
    )
    if plan is not None:
        return plan.kernel(
            value, spatial_shapes, level_start_index, sampling_locations, attention_weights
        )
    if not isinstance(impl, str):
        raise TypeError(f"impl: expected a string, got {type(impl).__name__}")
    compiling = torch.compiler.is_compiling()
    inputs = validate_inputs(
        value,
        spatial_shapes,
        level_start_index,
        sampling_locations,
        attention_weights,
        check_values=not compiling,
    )
    chosen = select_impl(impl, inputs)
    if compiling or not call_plan.plannable(impl, value):
        # Traced, a subclass (FakeTensor) or observed: served without a plan.
        if observe._ACTIVE and not compiling:
            call = observe.MSDACall(
                chosen.NAME,
                value,
                spatial_shapes,
                level_start_index,
                sampling_locations,
                attention_weights,
            )
            return observe.run_observed(call, lambda c: chosen.forward(*c.tensors()))
        return chosen.forward(
            value, spatial_shapes, level_start_index, sampling_locations, attention_weights
        )
    kernel = chosen.bind(inputs)
    if not nondeterministic_reason(chosen, inputs):  # else warned on every call: no plan
        key = call_plan.signature(
            impl, value, spatial_shapes, level_start_index, sampling_locations, attention_weights
        )
        call_plan.store(key, kernel, inputs.num_keys)  # levels: checked by validate_inputs
    return kernel(value, spatial_shapes, level_start_index, sampling_locations, attention_weights)


def prepare(
    device: Union[str, torch.device],
    dtypes: Sequence[torch.dtype] = (torch.float32,),
    impl: str = "auto",
) -> Dict[torch.dtype, str]:
    """Make every decision ``auto`` would make at a first call, now: for each dtype, walk
    the device's priority list, build what must be built (the ``cpu`` kernel) and run the
    verification of each candidate until one is trusted.

    Call it before capturing a CUDA graph or an NPU graph (or compiling with
    ``mode="reduce-overhead"``): a verification inside a capture would sync and allocate on
    the host. Then run each call signature once outside the capture, as CUDA-graph capture
    wants anyway (kernel compilation, the call plan, the level tensors' one host read);
    the calls inside read nothing back and decide nothing.

    Returns:
        dtype -> the implementation a call of a usual size (head_dim 32, 4 levels, 4
        points) gets, e.g. ``{torch.float32: "cpu"}``.
    """
    device = torch.device(device)
    chosen = {}
    for dtype in dtypes:
        typical = MSDAInputs(
            device_type=device.type,
            dtype=dtype,
            batch=1,
            num_keys=100,
            num_heads=8,
            head_dim=32,
            num_levels=4,
            num_queries=100,
            num_points=4,
            requires_grad=True,
        )
        chosen[dtype] = select_impl(impl, typical).NAME
    return chosen
