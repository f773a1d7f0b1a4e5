"""npudet's mmcv MSDA layer with its two sampling projections as one GEMM and its output
dropout fused with the residual add."""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor

from npudet.nn.dropout_add import dropout_add

from .msda import MultiScaleDeformableAttention


class FusedMultiScaleDeformableAttention(MultiScaleDeformableAttention):
    """:class:`~.msda.MultiScaleDeformableAttention` with two pieces that
    :func:`~.layer_switch.convert_layers` turns on per instance; no parameter or buffer is
    added, so ``state_dict`` keys and shapes stay mmcv's and checkpoints load both ways.

    ``fused_projections`` (piece ``projections``): ``sampling_offsets`` and
    ``attention_weights`` read the same query, so they run as one ``F.linear`` over their
    weights concatenated at call time (each a few hundred rows; the concatenation's backward
    hands each parameter its own gradient). Module hooks on the two ``Linear`` s do not run.

    ``fused_dropout`` (piece ``dropout``): ``identity + dropout(output)`` as one op
    (:func:`~npudet.nn.dropout_add.dropout_add`: the same mask as mmcv's).
    """

    fused_projections: bool = False
    fused_dropout: bool = False

    def project_sampling(self, query: Tensor) -> Tuple[Tensor, Tensor]:
        """(bs, nq, C) -> (offsets (bs, nq, samples * 2), weight logits (bs, nq, samples)),
        views of one GEMM's output when ``fused_projections``."""
        if not self.fused_projections:
            return super().project_sampling(query)
        offsets, weights = self.sampling_offsets, self.attention_weights
        both = F.linear(
            query,
            torch.cat((offsets.weight, weights.weight)),
            torch.cat((offsets.bias, weights.bias)),
        )
        return both.split((offsets.out_features, weights.out_features), -1)

    def residual(self, output: Tensor, identity: Tensor) -> Tensor:
        """``identity + dropout(output)``, one op when ``fused_dropout``."""
        if not self.fused_dropout:
            return super().residual(output, identity)
        return dropout_add(output, identity, self.dropout.p, self.dropout.training)
