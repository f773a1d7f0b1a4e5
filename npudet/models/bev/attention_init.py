"""mmcv-style initialisation shared by the BEV deformable attentions (SCA and TSA)."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn


def ring_offsets(num_heads: int, groups: int, scales: Tensor) -> Tensor:
    """Initial sampling offsets (num_heads * groups * len(scales) * 2,), flattened.

    Head ``h`` points along angle ``2 pi h / num_heads`` (scaled so the larger of |x|, |y|
    is 1); within each of ``groups`` (levels or queue entries) point ``p`` lies at
    ``scales[p]`` times that direction.
    """
    theta = torch.arange(num_heads, dtype=torch.float32) * (2.0 * torch.pi / num_heads)
    grid = torch.stack([theta.cos(), theta.sin()], -1)
    grid = grid / grid.abs().max(-1, keepdim=True)[0]
    grid = grid.view(num_heads, 1, 1, 2).repeat(1, groups, len(scales), 1)
    return (grid * scales.view(1, 1, -1, 1)).flatten()


def init_deformable_attention(
    sampling_offsets: nn.Linear,
    attention_weights: nn.Linear,
    projections: Sequence[nn.Linear],
    offsets_bias: Tensor,
) -> None:
    """Zero offset weights with ``offsets_bias``, zero attention logits (uniform weights),
    xavier-uniform ``projections`` with zero bias."""
    nn.init.zeros_(sampling_offsets.weight)
    with torch.no_grad():
        sampling_offsets.bias.copy_(offsets_bias)
    nn.init.zeros_(attention_weights.weight)
    nn.init.zeros_(attention_weights.bias)
    for lin in projections:
        nn.init.xavier_uniform_(lin.weight)
        nn.init.zeros_(lin.bias)
