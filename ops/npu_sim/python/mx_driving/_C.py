"""Double of DrivingSDK's compiled binding ``mx_driving._C`` for MSDA: the contract, then a
reference computation.

Each check either repeats a message the real binding carries (read from the strings of
mx_driving 26.2.0.post2's ``_C`` library, quoted exactly) or, where DrivingSDK documents a
limit but not how the op fails beyond it, raises with ``UNDOCUMENTED`` in its message
(``ops/npu_sim/README.md`` lists which is which). The reference is mmcv's
``multi_scale_deformable_attn_pytorch`` (one ``grid_sample`` per level) in float32 on the
inputs' device, and the backward differentiates it.
"""

from __future__ import annotations

from typing import List, Tuple

import torch
import torch.nn.functional as F

UNDOCUMENTED = "mx_driving double: documented limit, failure mode not documented by DrivingSDK"
# Op info of MultiScaleDeformableAttn(Grad) for ascend910b / ascend910_93: float32 only.
KERNEL_DTYPE = torch.float32
MAX_EMBED = 256  # "The number of embedding dimensions should be less than or equal to 256"
MAX_LEVELS_X_POINTS = 64
MAX_HEADS = 8  # DrivingSDK's documentation
EMBED_MULTIPLE = 8  # DrivingSDK's documentation
# The dtypes each binding takes for the shapes and start index (strings of the shipped _C).
FORWARD_INDEX_DTYPES = (torch.int32,)
BACKWARD_INDEX_DTYPES = (torch.int32, torch.int64)


def _dtype_name(t: torch.Tensor) -> str:
    """How c10 prints a scalar type in a TORCH_CHECK message (``Long``, ``Float``)."""
    return {
        torch.int64: "Long",
        torch.int32: "Int",
        torch.float32: "Float",
        torch.float16: "Half",
        torch.bfloat16: "BFloat16",
        torch.float64: "Double",
    }.get(t.dtype, str(t.dtype))


def _check(
    value: torch.Tensor,
    shapes: torch.Tensor,
    starts: torch.Tensor,
    locations: torch.Tensor,
    weights: torch.Tensor,
    index_dtypes: Tuple[torch.dtype, ...],
) -> None:
    named = {
        "value": value,
        "value_spatial_shapes": shapes,
        "value_level_start_index": starts,
        "sampling_locations": locations,
        "attention_weights": weights,
    }
    for name, tensor in named.items():
        if tensor.device.type != "npu":
            raise RuntimeError(f"{UNDOCUMENTED}: {name} must be an NPU tensor, got {tensor.device}")
    wanted = " or ".join(str(dtype).removeprefix("torch.") for dtype in index_dtypes)
    for name in ("value_spatial_shapes", "value_level_start_index"):
        if named[name].dtype not in index_dtypes:
            raise RuntimeError(
                f"{name}: {wanted} tensor expected but got a tensor with dtype: "
                f"{_dtype_name(named[name])}"
            )
    for name in ("value", "sampling_locations", "attention_weights"):
        if named[name].dtype != KERNEL_DTYPE:
            raise RuntimeError(
                f"{UNDOCUMENTED}: {name} is {named[name].dtype}; the op info declares float32 "
                "only (the Python wrapper casts under autocast only)"
            )
        if not named[name].is_contiguous():
            raise RuntimeError(f"{UNDOCUMENTED}: {name} must be contiguous (ND format)")
    if value.dim() != 4 or locations.dim() != 6 or weights.dim() != 5:
        raise RuntimeError(
            f"{UNDOCUMENTED}: expected value (bs, keys, heads, embed), sampling_locations "
            "(bs, queries, heads, levels, points, 2), attention_weights (bs, queries, heads, "
            f"levels, points); got {tuple(value.shape)}, {tuple(locations.shape)}, "
            f"{tuple(weights.shape)}"
        )
    heads, embed = value.shape[2], value.shape[3]
    levels, points = locations.shape[3], locations.shape[4]
    if embed > MAX_EMBED:
        raise RuntimeError("The number of embedding dimensions should be less than or equal to 256")
    if levels * points > MAX_LEVELS_X_POINTS:
        raise RuntimeError(
            "The product of the number of levels and the number of points should be less than "
            "or equal to 64"
        )
    if heads > MAX_HEADS:
        raise RuntimeError(f"{UNDOCUMENTED}: num_heads {heads} > {MAX_HEADS}")
    if embed % EMBED_MULTIPLE:
        raise RuntimeError(f"{UNDOCUMENTED}: embed {embed} is not a multiple of {EMBED_MULTIPLE}")
    hw = shapes.long()
    if shapes.shape != (levels, 2) or starts.shape != (levels,):
        raise RuntimeError(
            f"{UNDOCUMENTED}: value_spatial_shapes ({levels}, 2) and value_level_start_index "
            f"({levels},) expected, got {tuple(shapes.shape)} and {tuple(starts.shape)}"
        )
    if int((hw[:, 0] * hw[:, 1]).sum()) != value.shape[1]:
        raise RuntimeError(
            f"{UNDOCUMENTED}: the levels' H*W sum to {int((hw[:, 0] * hw[:, 1]).sum())}, value "
            f"has {value.shape[1]} keys"
        )


def _reference(
    value: torch.Tensor, shapes: torch.Tensor, locations: torch.Tensor, weights: torch.Tensor
) -> torch.Tensor:
    """(bs, queries, heads * embed): bilinear, zero padding, align_corners=False."""
    bs, _, heads, embed = value.shape
    _, queries, _, levels, points, _ = locations.shape
    sizes: List[int] = [int(h) * int(w) for h, w in shapes.tolist()]
    grids = 2 * locations - 1
    sampled = []
    for level, part in enumerate(value.split(sizes, dim=1)):
        h, w = (int(x) for x in shapes[level].tolist())
        image = part.flatten(2).transpose(1, 2).reshape(bs * heads, embed, h, w)
        grid = grids[:, :, :, level].transpose(1, 2).flatten(0, 1)
        sampled.append(
            F.grid_sample(image, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        )
    attention = weights.transpose(1, 2).reshape(bs * heads, 1, queries, levels * points)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * attention).sum(-1)
    return out.view(bs, heads * embed, queries).transpose(1, 2).contiguous()


def multi_scale_deformable_attn(
    value: torch.Tensor,
    shapes: torch.Tensor,
    starts: torch.Tensor,
    locations: torch.Tensor,
    weights: torch.Tensor,
) -> torch.Tensor:
    """Forward binding: int32 shapes / start index, float32 contiguous NPU tensors."""
    _check(value, shapes, starts, locations, weights, FORWARD_INDEX_DTYPES)
    with torch.no_grad():
        return _reference(value, shapes, locations, weights)


def multi_scale_deformable_attn_backward(
    value: torch.Tensor,
    shapes: torch.Tensor,
    starts: torch.Tensor,
    locations: torch.Tensor,
    weights: torch.Tensor,
    grad_output: torch.Tensor,
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Backward binding (int32 or int64 shapes): grads of value, locations, weights."""
    _check(value, shapes, starts, locations, weights, BACKWARD_INDEX_DTYPES)
    inputs = [t.detach().requires_grad_() for t in (value, locations, weights)]
    with torch.enable_grad():
        out = _reference(inputs[0], shapes, inputs[1], inputs[2])
    grads = torch.autograd.grad(out, inputs, grad_output.contiguous())
    return grads[0], grads[1], grads[2]
