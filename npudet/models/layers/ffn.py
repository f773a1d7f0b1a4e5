"""mmcv's ``FFN`` without the in-place activation on a view, its last dropout fused with the
residual add: the same module, parameters and random numbers."""

from __future__ import annotations

from typing import Optional

import torch.nn.functional as F
from mmcv.cnn.bricks.transformer import FFN as MMCVFFN
from torch import Tensor, nn

from npudet.nn.dropout_add import dropout_add


class FFN(MMCVFFN):
    """mmcv's ``FFN`` (a subclass: parameters, ``state_dict`` keys and ``isinstance`` hold), to
    which :func:`~.layer_switch.convert_layers` turns mmcv's instances in place.

    ``plain_act`` (piece ``ffn``): a ``nn.ReLU`` runs out of place. mmcv builds it with
    ``inplace=True`` and applies it to the hidden ``Linear``'s output, which for a (bs, n, C)
    input is a view of the 2-D GEMM result: autograd answers the in-place write with
    ``CopySlices`` and an ``AsStridedBackward`` (a zero-fill and a copy of the whole hidden
    tensor in backward). Out of place, the values and gradients are the same.

    ``fused_dropout`` (piece ``dropout``): the last dropout and the residual add are one op
    (:func:`~npudet.nn.dropout_add.dropout_add`: the same mask as mmcv's). Where mmcv's layer
    scale (``gamma2``) or ``dropout_layer`` (drop path) sits between them, or there is no
    residual, they stay apart.
    """

    plain_act: bool = False
    fused_dropout: bool = False

    def forward(self, x: Tensor, identity: Optional[Tensor] = None) -> Tensor:
        """(..., embed_dims) -> (..., embed_dims): ``identity`` (default ``x``) + FFN(``x``)."""
        out = x
        for linear, act, drop in self.layers[:-2]:
            hidden = linear(out)
            plain = self.plain_act and type(act) is nn.ReLU
            out = drop(F.relu(hidden) if plain else act(hidden))
        out = self.layers[-2](out)
        identity = x if identity is None else identity
        last_drop = self.layers[-1]
        fusable = isinstance(self.gamma2, nn.Identity) and isinstance(
            self.dropout_layer, nn.Identity
        )
        if self.fused_dropout and self.add_identity and fusable:
            return dropout_add(out, identity, last_drop.p, last_drop.training)
        out = self.gamma2(last_drop(out))
        if not self.add_identity:
            return self.dropout_layer(out)
        return identity + self.dropout_layer(out)
