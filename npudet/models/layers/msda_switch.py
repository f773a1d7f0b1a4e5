"""Finding every deformable-attention layer of a model and choosing its MSDA implementation."""

from __future__ import annotations

from typing import Iterator, List, Tuple

from mmcv.ops import MultiScaleDeformableAttention as MMCVMultiScaleDeformableAttention
from torch import nn

from npudet.nn import DeformableAttention
from npudet.ops.msda import check_impl_name

from .msda import MultiScaleDeformableAttention


def stock_msda_layers(module: nn.Module) -> List[str]:
    """Qualified names of the mmcv ``MultiScaleDeformableAttention`` layers inside ``module``
    that still run mmcv's code (not yet converted to npudet's subclass)."""
    return [
        name
        for name, sub in module.named_modules()
        if isinstance(sub, MMCVMultiScaleDeformableAttention)
        and not isinstance(sub, DeformableAttention)
    ]


def deformable_layers(module: nn.Module) -> Iterator[Tuple[str, DeformableAttention]]:
    """``(qualified name, layer)`` of every :class:`DeformableAttention` inside ``module``.

    Stock mmcv ``MultiScaleDeformableAttention`` instances (built by unchanged mmdet
    code) become npudet's subclass in place first: only the class changes, so
    parameters, buffers, hooks and the random-number stream are untouched.
    """
    for name, sub in module.named_modules():
        if isinstance(sub, MMCVMultiScaleDeformableAttention) and not isinstance(
            sub, DeformableAttention
        ):
            sub.__class__ = MultiScaleDeformableAttention
        if isinstance(sub, DeformableAttention):
            yield name, sub


def convert_msda(module: nn.Module, impl: str) -> int:
    """Make every deformable-attention layer inside ``module`` use ``impl``, in place.

    mmcv's own MSDA layers are converted (see :func:`deformable_layers`), so a model
    built by stock mmdet code and then converted is bit-identical to it before the
    first forward. Returns how many layers were set.
    """
    impl = check_impl_name(impl, "impl")
    count = 0
    for _, layer in deformable_layers(module):
        layer.impl = impl
        count += 1
    return count
