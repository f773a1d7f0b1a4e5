"""The one public MSDA entry point."""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Union

import torch

from npudet.utils.torch_compat import is_compiling

from . import call_plan, export_node, observe
from .auto import nondeterministic_reason, select_impl
from .inputs import typical_inputs, validate_inputs
from .levels import as_level_pairs, check_pairs_cover, level_shapes_tensor
from .levels import level_start_index as level_start_index_of


def multi_scale_deformable_attn(
    value: torch.Tensor,
    spatial_shapes: Union[torch.Tensor, Sequence[Sequence[int]]],
    level_start_index: Optional[torch.Tensor],
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    impl: str = "auto",
) -> torch.Tensor:
    """Multi-scale deformable attention with mmcv's reference semantics.

    Bilinear sampling with zero padding and ``align_corners=False``; locations outside
    [0, 1] contribute zeros.

    Args:
        value: (bs, num_keys, num_heads, head_dim) float.
        spatial_shapes: (num_levels, 2) int tensor, (H, W) per level; sum of H*W =
            num_keys. Or a sequence of (H, W) pairs: ints, or feature maps' sizes, which stay
            symbolic under ``torch.export`` (``levels``; such a call takes no plan).
        level_start_index: (num_levels,) int, cumulative H*W; None: derived.
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
    pairs = None
    if not isinstance(spatial_shapes, torch.Tensor):
        pairs = as_level_pairs(spatial_shapes)
        device = value.device if isinstance(value, torch.Tensor) else None
        spatial_shapes = level_shapes_tensor(pairs, device)
    if level_start_index is None:
        level_start_index = level_start_index_of(spatial_shapes)
    compiling = is_compiling()
    inputs = validate_inputs(
        value,
        spatial_shapes,
        level_start_index,
        sampling_locations,
        attention_weights,
        check_values=not compiling,
    )
    if pairs is not None:
        check_pairs_cover(pairs, inputs.num_keys)
    node = export_node.active()
    if node is not None:  # an exporter records the call as a deployment route's node
        tensors = (value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
        return node(*tensors, level_shapes=pairs)
    chosen = select_impl(impl, inputs)
    if compiling or pairs is not None or not call_plan.plannable(impl, value):
        # Traced, level pairs, a subclass (FakeTensor) or observed: served without a plan.
        # An implementation that reads the level shapes on the host takes the pairs.
        shapes = {"level_shapes": pairs} if pairs is not None and chosen.TAKES_LEVEL_SHAPES else {}
        if observe._ACTIVE and not compiling:
            call = observe.MSDACall(
                chosen.NAME,
                value,
                spatial_shapes,
                level_start_index,
                sampling_locations,
                attention_weights,
            )
            return observe.run_observed(call, lambda c: chosen.forward(*c.tensors(), **shapes))
        tensors = (value, spatial_shapes, level_start_index, sampling_locations, attention_weights)
        return chosen.forward(*tensors, **shapes)
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
        chosen[dtype] = select_impl(impl, typical_inputs(device.type, dtype, device.index)).NAME
    return chosen
