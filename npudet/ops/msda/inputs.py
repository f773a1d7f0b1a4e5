"""Validation of MSDA inputs and the summary that implementations decide on.

Dtypes: value, sampling_locations and attention_weights may each have any floating dtype,
mixed (autocast gives a bfloat16/float16 value out of a Linear next to float32 locations).
The output has value's dtype and each gradient its input's dtype. Sampling coordinates are
computed in at least float32 and half-precision (float16/bfloat16) products are accumulated
in float32 (``grid_sample``, ``gather`` and ``cpu`` compute half inputs in float32;
``triton`` reads them as they are and accumulates in float32; mmcv's kernel casts locations
and weights to value's dtype).
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from npudet.utils.torch_compat import is_compiling, register_fake

_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


@dataclass(frozen=True)
class MSDAInputs:
    """What an implementation needs to know to say whether it supports a call."""

    device_type: str
    dtype: torch.dtype
    batch: int
    num_keys: int
    num_heads: int
    head_dim: int
    num_levels: int
    num_queries: int
    num_points: int
    requires_grad: bool
    # The inputs' device index (``cuda:1`` -> 1); None: the type's current device.
    device_index: Optional[int] = None

    @property
    def value_numel(self) -> int:
        return self.batch * self.num_keys * self.num_heads * self.head_dim

    @property
    def device(self) -> str:
        """``"cuda:1"``, or the device type when there is no index (``"cpu"``)."""
        if self.device_index is None:
            return self.device_type
        return f"{self.device_type}:{self.device_index}"


def typical_inputs(
    device_type: str, dtype: torch.dtype = torch.float32, device_index: Optional[int] = None
) -> MSDAInputs:
    """A usual training call (head_dim 32, 4 levels, 4 points, 8 heads): what ``prepare``
    and the run preflight ask implementations about before any real call."""
    return MSDAInputs(
        device_type=device_type,
        dtype=dtype,
        batch=1,
        num_keys=100,
        num_heads=8,
        head_dim=32,
        num_levels=4,
        num_queries=100,
        num_points=4,
        requires_grad=True,
        device_index=device_index,
    )


def empty_output(value: torch.Tensor, sampling_locations: torch.Tensor) -> torch.Tensor:
    """An uninitialised output of the contract: (bs, num_queries, heads * D), value's dtype
    (what the ops' fake kernels return)."""
    bs, _, heads, dim = value.shape
    return value.new_empty((bs, sampling_locations.shape[1], heads * dim))


def empty_grads(
    value: torch.Tensor, sampling_locations: torch.Tensor, attention_weights: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Uninitialised, contiguous gradients of value, sampling_locations and
    attention_weights, each shaped and typed as its input (the backward ops' fake kernels)."""
    return tuple(
        torch.empty_like(t, memory_format=torch.contiguous_format)
        for t in (value, sampling_locations, attention_weights)
    )


def register_fake_kernels(lib: torch.library.Library, forward: str, backward: str) -> None:
    """Register the fake kernels (``torch.compile``, fake tensors) of a forward op
    ``(value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
    *options)`` and of its backward op ``(grad_output, <the forward's arguments>)``:
    ``empty_output`` and ``empty_grads``."""

    def fake_forward(value, spatial_shapes, starts, sampling_locations, *rest):
        return empty_output(value, sampling_locations)

    def fake_backward(grad_output, value, spatial_shapes, starts, sampling_locations, attn, *rest):
        return empty_grads(value, sampling_locations, attn)

    register_fake(forward, fake_forward, lib)
    register_fake(backward, fake_backward, lib)


def _shape_error(name: str, expected: str, tensor: torch.Tensor) -> ValueError:
    return ValueError(f"{name}: expected shape {expected}, got {tuple(tensor.shape)}")


def validate_inputs(
    value: torch.Tensor,
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    sampling_locations: torch.Tensor,
    attention_weights: torch.Tensor,
    check_values: bool = True,
) -> MSDAInputs:
    """Check the MSDA op contract and summarise the call.

    Args:
        value: (bs, num_keys, num_heads, head_dim) float.
        spatial_shapes: (num_levels, 2) integer, (H, W) of each level.
        level_start_index: (num_levels,) integer, first key of each level.
        sampling_locations: (bs, num_queries, num_heads, num_levels, num_points, 2).
        attention_weights: (bs, num_queries, num_heads, num_levels, num_points).
        check_values: also check the contents of ``spatial_shapes`` and
            ``level_start_index`` (reads them; skipped while tracing).

    Raises:
        TypeError: a non-tensor argument or a wrong dtype.
        ValueError: a wrong rank, mismatched sizes, inconsistent level layout or devices.
    """
    args = {
        "value": value,
        "spatial_shapes": spatial_shapes,
        "level_start_index": level_start_index,
        "sampling_locations": sampling_locations,
        "attention_weights": attention_weights,
    }
    for name, arg in args.items():
        if not isinstance(arg, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(arg).__name__}")
    if value.dim() != 4:
        raise _shape_error("value", "(bs, num_keys, num_heads, head_dim)", value)
    bs, num_keys, num_heads, head_dim = value.shape
    if spatial_shapes.dim() != 2 or spatial_shapes.shape[1] != 2:
        raise _shape_error("spatial_shapes", "(num_levels, 2)", spatial_shapes)
    num_levels = spatial_shapes.shape[0]
    if sampling_locations.dim() != 6 or sampling_locations.shape[-1] != 2:
        raise _shape_error(
            "sampling_locations",
            "(bs, num_queries, num_heads, num_levels, num_points, 2)",
            sampling_locations,
        )
    num_queries, num_points = sampling_locations.shape[1], sampling_locations.shape[4]
    expected_loc = (bs, num_queries, num_heads, num_levels, num_points, 2)
    if tuple(sampling_locations.shape) != expected_loc:
        raise _shape_error(
            "sampling_locations",
            f"{expected_loc} = (bs, num_queries, num_heads, num_levels, num_points, 2) "
            "matching value and spatial_shapes",
            sampling_locations,
        )
    expected_attn = expected_loc[:-1]
    if tuple(attention_weights.shape) != expected_attn:
        raise _shape_error(
            "attention_weights",
            f"{expected_attn} = (bs, num_queries, num_heads, num_levels, num_points)",
            attention_weights,
        )
    if tuple(level_start_index.shape) != (num_levels,):
        raise _shape_error(
            "level_start_index", f"({num_levels},) = (num_levels,)", level_start_index
        )
    for name in ("value", "sampling_locations", "attention_weights"):
        if args[name].dtype not in _FLOAT_DTYPES:
            raise TypeError(f"{name}: expected a floating dtype, got {args[name].dtype}")
    # Mixed floating dtypes are accepted: see the module docstring.
    for name in ("spatial_shapes", "level_start_index"):
        if args[name].dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name}: expected an int32 or int64 tensor, got {args[name].dtype}")
    devices = {name: arg.device for name, arg in args.items()}
    if len(set(devices.values())) != 1:
        listed = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        raise ValueError(f"all inputs must be on one device, got {listed}")
    sizes = (bs, num_keys, num_heads, head_dim, num_levels, num_queries, num_points)
    # One comparison per size, not min(): under torch.export min() of symbolic and fixed
    # sizes guards each symbol against the fixed ones and specializes it.
    if any(size == 0 for size in sizes):
        raise ValueError(
            "value, sampling_locations: empty dimension in "
            f"(bs, num_keys, num_heads, head_dim, num_levels, num_queries, num_points) = {sizes}"
        )
    if check_values:
        _check_levels(spatial_shapes, level_start_index, num_keys)
    return MSDAInputs(
        device_type=value.device.type,
        dtype=value.dtype,
        batch=bs,
        num_keys=num_keys,
        num_heads=num_heads,
        head_dim=head_dim,
        num_levels=num_levels,
        num_queries=num_queries,
        num_points=num_points,
        requires_grad=any(t.requires_grad for t in (value, sampling_locations, attention_weights)),
        device_index=value.device.index,
    )


# spatial_shapes -> (level_start_index, (both tensors' in-place write counts, num_keys), the
# (H, W) pairs when a model told them: note_level_layout) of the last layout whose values were
# checked. Weak keys: a freed tensor's id can be reused.
_checked_layouts: WeakIdKeyDictionary = WeakIdKeyDictionary()
# The last pair found valid, tried first: a model hands one pair to every layer of a
# forward, so most calls end at an identity test instead of a weak-key look-up (which
# costs about as much as the rest of a planned call). (weakref, weakref, state) or None.
_last_checked: Optional[tuple] = None


def _check_levels(
    spatial_shapes: torch.Tensor, level_start_index: torch.Tensor, num_keys: int
) -> None:
    """Check the level layout's values, reading them to the host once per distinct tensor pair.

    A later call with the same two tensors, unmodified (``_version`` counts in-place
    writes), and the same ``num_keys`` reads nothing: no device-to-host sync per call.
    Inference tensors have no write count, so they are read on every call.
    """
    global _last_checked
    last = _last_checked
    # Identity first: only a stored (so trackable) pair reaches the write counts.
    if (
        last is not None
        and last[0]() is spatial_shapes
        and last[1]() is level_start_index
        and last[2] == (spatial_shapes._version, level_start_index._version, num_keys)
    ):
        return
    trackable = not (spatial_shapes.is_inference() or level_start_index.is_inference())
    if trackable:
        state = (spatial_shapes._version, level_start_index._version, num_keys)
        checked = _checked_layouts.get(spatial_shapes)
        if checked is not None and checked[0]() is level_start_index and checked[1] == state:
            _last_checked = (weakref.ref(spatial_shapes), checked[0], state)
            return
    num_levels = spatial_shapes.shape[0]
    # Both tensors in one host read.
    flat = torch.cat((spatial_shapes.detach().reshape(-1), level_start_index.detach()))
    values = flat.long().tolist()
    shapes = [values[2 * i : 2 * i + 2] for i in range(num_levels)]
    _check_layout(shapes, values[2 * num_levels :], num_keys)
    if trackable:
        _remember(spatial_shapes, level_start_index, state)


def _check_layout(shapes: List[List[int]], starts: List[int], num_keys: int) -> None:
    """The level layout's values, on the host: ValueError naming the argument."""
    if any(h <= 0 or w <= 0 for h, w in shapes):
        raise ValueError(f"spatial_shapes: expected positive (H, W) per level, got {shapes}")
    sizes = [h * w for h, w in shapes]
    if sum(sizes) != num_keys:
        raise ValueError(
            f"spatial_shapes: sum of H*W over levels is {sum(sizes)}, but value has "
            f"num_keys={num_keys} (value.shape[1])"
        )
    expected = [sum(sizes[:i]) for i in range(len(sizes))]
    if starts != expected:
        raise ValueError(
            f"level_start_index: expected {expected} (cumulative H*W of spatial_shapes), "
            f"got {starts}"
        )


def _remember(
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    state: tuple,
    pairs: Optional[List[Tuple[int, int]]] = None,
) -> None:
    global _last_checked
    starts_ref = weakref.ref(level_start_index)
    _checked_layouts[spatial_shapes] = (starts_ref, state, pairs)
    _last_checked = (weakref.ref(spatial_shapes), starts_ref, state)


def note_level_layout(
    spatial_shapes: torch.Tensor,
    level_start_index: torch.Tensor,
    pairs: Sequence[Tuple[int, int]],
) -> None:
    """Tell the op what the level tensors hold, so that no call ever reads them back.

    For a model that builds ``spatial_shapes`` (num_levels, 2) and ``level_start_index``
    (num_levels,) on the device from its feature maps' sizes (mmdet's ``pre_transformer``):
    it knows their values on the host as ``pairs``, (H, W) per level. The pairs are checked
    as the tensors' values would be, the tensors' shapes against them; the tensors are taken
    to hold them (the caller built them so). Calls with these two tensors, unmodified, and
    ``num_keys`` = sum of H*W then check nothing more: no device-to-host read, not even the
    first call's. Inference tensors (no write count) are not remembered: read as usual.
    Under ``torch.compile`` it does nothing: the traced graph holds no host reads to spare,
    and dynamo would break the graph at the weak-keyed table.
    """
    if is_compiling():
        return
    shapes = [[int(h), int(w)] for h, w in pairs]
    if tuple(spatial_shapes.shape) != (len(shapes), 2):
        raise ValueError(
            f"spatial_shapes: expected shape ({len(shapes)}, 2) for {len(shapes)} level pairs, "
            f"got {tuple(spatial_shapes.shape)}"
        )
    if tuple(level_start_index.shape) != (len(shapes),):
        raise ValueError(
            f"level_start_index: expected shape ({len(shapes)},) for {len(shapes)} level "
            f"pairs, got {tuple(level_start_index.shape)}"
        )
    sizes = [h * w for h, w in shapes]
    num_keys = sum(sizes)
    _check_layout(shapes, [sum(sizes[:i]) for i in range(len(sizes))], num_keys)
    if not (spatial_shapes.is_inference() or level_start_index.is_inference()):
        state = (spatial_shapes._version, level_start_index._version, num_keys)
        _remember(spatial_shapes, level_start_index, state, [(h, w) for h, w in shapes])


def noted_level_pairs(spatial_shapes: torch.Tensor) -> Optional[List[Tuple[int, int]]]:
    """The (H, W) pairs :func:`note_level_layout` was told ``spatial_shapes`` holds, while it
    is unmodified since; None otherwise. Lets model code that iterates over the level sizes
    (reference points, proposals) take them from the host instead of reading the tensor.
    None under ``torch.compile`` (see :func:`note_level_layout`)."""
    if is_compiling():
        return None
    entry = _checked_layouts.get(spatial_shapes)
    if entry is None or entry[2] is None or entry[1][0] != spatial_shapes._version:
        return None
    return list(entry[2])
