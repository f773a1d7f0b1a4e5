"""The level layout the BEV attentions hand to MSDA: a tensor in eager, (H, W) pairs in export.

Eagerly the op takes a (levels, 2) shapes tensor, and its call plan then serves every repeat
call without host work (a call with pairs is checked anew each time). While ``torch.export``
traces, a tensor's values are data: the feature maps' sizes in it would be fixed at the
export size, and the ``grid_sample`` route would read them back; the pairs stay the maps'
symbolic sizes (``npudet.ops.msda.levels``).
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import Tensor

from npudet.ops.msda import LevelPairs, level_start_index
from npudet.utils.torch_compat import is_exporting


def msda_levels(
    pairs: LevelPairs, device: torch.device
) -> Tuple[Union[Tensor, LevelPairs], Optional[Tensor]]:
    """``spatial_shapes`` and ``level_start_index`` for MSDA of levels ``pairs`` ((H, W)
    each): the (levels, 2) long tensor on ``device`` and its start index, or while
    ``torch.export`` traces the pairs themselves and None (the op derives it)."""
    if is_exporting():
        return pairs, None
    shapes = torch.tensor(pairs, dtype=torch.long, device=device)
    return shapes, level_start_index(shapes)
