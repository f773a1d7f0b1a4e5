"""The level layout given as (H, W) pairs: how ``torch.export`` keeps feature-map sizes dynamic.

``spatial_shapes`` may be a (num_levels, 2) integer tensor, as mmcv takes it, or a sequence of
(H, W) pairs: Python ints, or a feature map's sizes (``feat.shape[-2:]``), which are symbolic
while ``torch.export`` or ``torch.compile`` traces. A tensor's values are data to a tracer: an
implementation that needs the sizes on the host (``grid_sample`` splits and reshapes by them)
would read them, and the exporter refuses a size that depends on data. Pairs are sizes, so
they stay symbolic, and the tensor the fused kernels take is built from them in the graph
(``level_shapes_tensor``) instead of being baked in at the export size.

Not to be confused with ``npudet.bev.models.levels`` (which layout the BEV attentions hand the
op) or ``npudet.models.detectors.level_pairs`` (the DETR transformers built on pairs).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple, Union

import torch

# (H, W) per level: ints, or torch.SymInt while tracing.
LevelPairs = List[Tuple[Union[int, torch.SymInt], Union[int, torch.SymInt]]]
_SIZE_TYPES = (int, torch.SymInt)


def as_level_pairs(spatial_shapes: Sequence) -> LevelPairs:
    """``spatial_shapes`` given as (H, W) pairs, checked; TypeError / ValueError naming it."""
    try:
        pairs = [tuple(pair) for pair in spatial_shapes]
    except TypeError:
        raise TypeError(
            "spatial_shapes: expected a (num_levels, 2) torch.Tensor or a sequence of (H, W) "
            f"pairs, got {type(spatial_shapes).__name__}"
        ) from None
    if not pairs or any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"spatial_shapes: expected one (H, W) pair per level, got {pairs}")
    for pair in pairs:
        if any(isinstance(s, bool) or not isinstance(s, _SIZE_TYPES) for s in pair):
            raise TypeError(f"spatial_shapes: expected int sizes, got {pair}")
        if any(isinstance(s, int) and s <= 0 for s in pair):
            raise ValueError(f"spatial_shapes: expected positive (H, W) per level, got {pairs}")
    return pairs


def check_pairs_cover(pairs: LevelPairs, num_keys: Union[int, torch.SymInt]) -> None:
    """The levels' H*W add up to ``num_keys`` (value.shape[1]): checked now for ints, as a
    runtime assertion of the traced graph for symbolic sizes."""
    total = sum(h * w for h, w in pairs)
    message = (
        f"spatial_shapes: sum of H*W over levels is {total}, but value has "
        f"num_keys={num_keys} (value.shape[1])"
    )
    if isinstance(total, int) and isinstance(num_keys, int):
        if total != num_keys:
            raise ValueError(message)
    else:
        torch._check(total == num_keys, lambda: message)


def level_shapes_tensor(pairs: LevelPairs, device: torch.device) -> torch.Tensor:
    """(num_levels, 2) int64 tensor of ``pairs``, one ``scalar_tensor`` per size: under
    ``torch.export`` each stays a function of the input's symbolic size (``torch.tensor`` of
    symbolic sizes would fix them at the export size)."""
    flat = [size for pair in pairs for size in pair]
    return torch.stack(
        [torch.scalar_tensor(s, dtype=torch.long, device=device) for s in flat]
    ).view(-1, 2)


def level_start_index(spatial_shapes: torch.Tensor) -> torch.Tensor:
    """(num_levels,) first key of each level: the cumulative H*W of ``spatial_shapes``."""
    areas = spatial_shapes[:, 0] * spatial_shapes[:, 1]
    return torch.cat((areas.new_zeros(1), areas.cumsum(0)[:-1]))


def shapes_tensor(
    spatial_shapes: Union[torch.Tensor, Sequence], device: torch.device
) -> torch.Tensor:
    """``spatial_shapes`` in either form as the (num_levels, 2) tensor (a tensor as is)."""
    if isinstance(spatial_shapes, torch.Tensor):
        return spatial_shapes
    return level_shapes_tensor(as_level_pairs(spatial_shapes), device)
