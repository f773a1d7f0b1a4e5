"""``model.msda.layers``: which pieces of the transformer layers run npudet's training-grade
code (``ffn``, ``dropout``, ``projections``), converted in place like the MSDA layers."""

from __future__ import annotations

from typing import Dict, FrozenSet, Union

from mmcv.cnn.bricks.transformer import FFN as MMCVFFN
from torch import nn

from .ffn import FFN
from .msda import MultiScaleDeformableAttention
from .msda_fused import FusedMultiScaleDeformableAttention

# ffn: mmcv's FFN without the in-place ReLU on a view; dropout: each FFN's and MSDA layer's
# output dropout fused with its residual add; projections: an MSDA layer's sampling-offset
# and attention-weight projections as one GEMM.
PIECES = ("ffn", "dropout", "projections")
ALL, NONE = "fast", "stock"


def resolve_layers(
    layers: Union[None, str, tuple, list], key: str = "model.msda.layers"
) -> FrozenSet[str]:
    """``'fast'`` (or None: the default) -> every piece, ``'stock'`` -> none, ``'ffn+dropout'``
    or ``['ffn', 'dropout']`` -> those. Anything else raises ``ValueError`` naming ``key``."""
    if layers is None or layers == ALL:
        return frozenset(PIECES)
    if layers == NONE:
        return frozenset()
    names = layers.split("+") if isinstance(layers, str) else layers
    if not isinstance(names, (tuple, list)) or not names or not set(names) <= set(PIECES):
        raise ValueError(
            f"{key}: expected {ALL!r}, {NONE!r} or pieces of {list(PIECES)} joined by '+' "
            f"(e.g. 'ffn+dropout'), got {layers!r}"
        )
    return frozenset(names)


def convert_layers(module: nn.Module, pieces: FrozenSet[str]) -> Dict[str, int]:
    """Give every mmcv ``FFN`` and npudet mmcv-MSDA layer in ``module`` the ``pieces``, in place.

    Only classes change (to :class:`~.ffn.FFN` / :class:`~.msda_fused.
    FusedMultiScaleDeformableAttention` with the pieces as flags, or back to mmcv's ``FFN`` /
    :class:`~.msda.MultiScaleDeformableAttention` for none), so parameters, buffers and
    ``state_dict`` keys are untouched and the call can be repeated with other pieces. Run it
    after the MSDA layers are converted (``deformable_layers``). Returns how many FFNs and MSDA
    layers now carry at least one piece.
    """
    ffn_on = bool(pieces & {"ffn", "dropout"})
    msda_on = bool(pieces & {"dropout", "projections"})
    msda_class = FusedMultiScaleDeformableAttention if msda_on else MultiScaleDeformableAttention
    counts = {"ffn": 0, "msda": 0}
    for sub in module.modules():
        # Exact classes: a subclass of either (a project's own FFN) keeps its own forward.
        if type(sub) in (MMCVFFN, FFN):
            sub.__class__ = FFN if ffn_on else MMCVFFN
            _set_flags(sub, ffn_on, plain_act="ffn" in pieces, fused_dropout="dropout" in pieces)
            counts["ffn"] += ffn_on
        elif type(sub) in (MultiScaleDeformableAttention, FusedMultiScaleDeformableAttention):
            sub.__class__ = msda_class
            flags = dict(fused_projections="projections" in pieces)
            _set_flags(sub, msda_on, fused_dropout="dropout" in pieces, **flags)
            counts["msda"] += msda_on
    return counts


def _set_flags(module: nn.Module, on: bool, **flags: bool) -> None:
    """Set the piece flags on a converted module; remove them from one back on its stock class
    (which has none)."""
    for name, value in flags.items():
        if on:
            setattr(module, name, value)
        else:
            vars(module).pop(name, None)


def active_pieces(module: nn.Module) -> Dict[str, int]:
    """How many FFNs / MSDA layers inside ``module`` run each piece: ``{'ffn': 6, 'dropout':
    12, 'projections': 6}`` for 6 converted layers with both; zeros for stock layers."""
    counts = dict.fromkeys(PIECES, 0)
    for sub in module.modules():
        if type(sub) is FFN:
            counts["ffn"] += sub.plain_act
            counts["dropout"] += sub.fused_dropout
        elif type(sub) is FusedMultiScaleDeformableAttention:
            counts["projections"] += sub.fused_projections
            counts["dropout"] += sub.fused_dropout
    return counts
