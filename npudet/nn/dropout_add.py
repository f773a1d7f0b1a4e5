"""``identity + dropout(x)`` as one elementwise op: the residual of a transformer layer."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def dropout_scale(p: float) -> float:
    """The factor a kept element is multiplied by: float32 ``1 / (1 - p)``, computed as ATen's
    CPU dropout computes it (``noise.div_(1 - p)`` in float32), so the products match its bits."""
    return float(torch.ones((), dtype=torch.float32) / (1 - p))


def dropout_add(x: Tensor, identity: Tensor, p: float, training: bool) -> Tensor:
    """``identity + F.dropout(x, p, training)``, x and identity of one shape (any).

    On CPU in training with 0 < p < 1: ATen's CPU dropout draws its mask with
    ``empty_like(x).bernoulli_(1 - p)`` and scales it by :func:`dropout_scale` in a separate
    pass before a ``mul`` and the residual ``add``; this draws the same mask (so the same
    random numbers, in the same order: the result is stock's bit for bit) and applies scale,
    mask and residual in one ``addcmul``. Elsewhere (eval, p = 0, another device, whose
    dropout is a fused kernel of its own) it is stock's two ops.
    """
    if not training or p == 0:
        return identity + x
    if x.device.type != "cpu" or p >= 1:
        return identity + F.dropout(x, p, True)
    keep = torch.empty_like(x).bernoulli_(1 - p)
    return torch.addcmul(identity, x, keep, value=dropout_scale(p))
