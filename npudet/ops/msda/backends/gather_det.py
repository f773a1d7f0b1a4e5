"""``gather_det``: ``gather`` with a value gradient that is bit-identical run to run on
cpu, cuda and npu, for ``torch.use_deterministic_algorithms(True)`` (mmengine's
``randomness=dict(deterministic=True)``).

The forward is ``gather``'s (bilinear corners as weighted row bags, one ``embedding_bag``
forward). The backward is written out instead of left to ``embedding_bag``'s:

- value's gradient adds each corner's ``weight * grad_out`` row into its value row with
  ``index_put_(accumulate=True)``, the accumulation PyTorch documents as deterministic under
  ``torch.use_deterministic_algorithms(True)`` (CUDA: sort then segment sums; CPU: one
  thread, in index order). On an NPU, torch_npu (2.6.0, its wheel read) runs ``index_put_``
  as CANN's ``aclnnIndexPutImpl`` and turns ``use_deterministic_algorithms(True)`` into
  ``ACL_OPT_DETERMINISTIC``; CANN lists ``aclnnIndexPutImpl`` among the operators that
  option makes deterministic. (``embedding_bag``'s own value gradient,
  ``_embedding_bag_dense_backward``, has no NPU kernel in that torch_npu.)
- each corner weight's gradient is a dot product of its value row with ``grad_out``'s: a
  gather and a reduction over D, no accumulation across samples.
- the location and attention-weight gradients follow from the corner weights through
  plain elementwise torch ops (``bilinear_corners``), as in ``gather``.

The other NPU operators this path runs (``aclnnEmbeddingBag`` forward, the gathers, sums
over a fixed dimension) are not on CANN's list of operators whose results may vary.

The corners are added in chunks of whole bag columns, so the (rows, D) buffer of
contributions stays under ``CHUNK_ELEMENTS`` however large the call; chunks run in a fixed
order, so the sum is the same every run.
"""

from __future__ import annotations

from typing import Tuple

import torch
import torch.nn.functional as F

from ..registry import register
from .first_order import first_order
from .gather import GatherImpl, RowBags

# Contributions buffered per index_put_ (elements): 64 MB in float32.
CHUNK_ELEMENTS = 1 << 24


def _bags_backward(
    grad_out: torch.Tensor, table: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Gradients of table (N, D) and weights (M, bag) from grad_out (M, D)."""
    num_bags, bag = rows.shape
    head_dim = table.shape[1]
    grad_table = torch.zeros_like(table)
    grad_weights = torch.empty_like(weights)
    step = max(1, min(bag, CHUNK_ELEMENTS // max(1, num_bags * head_dim)))
    grad_rows = grad_out.unsqueeze(1)  # (M, 1, D)
    for start in range(0, bag, step):
        stop = min(bag, start + step)
        chunk = rows[:, start:stop]
        contributions = grad_rows * weights[:, start:stop].unsqueeze(-1)
        grad_table.index_put_(
            (chunk.reshape(-1),), contributions.reshape(-1, head_dim), accumulate=True
        )
        grad_weights[:, start:stop] = (table[chunk] * grad_rows).sum(-1)
    return grad_table, grad_weights


class _OrderedBags(torch.autograd.Function):
    """``RowBags`` whose backward accumulates with ``index_put_(accumulate=True)``."""

    @staticmethod
    def forward(ctx, table: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor):
        ctx.save_for_backward(table, rows, weights)
        return F.embedding_bag(rows, table, per_sample_weights=weights, mode="sum")

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        table, rows, weights = ctx.saved_tensors
        grad_table, grad_weights = first_order(
            "npudet gather_det backward",
            _bags_backward,
            grad_out.contiguous(),
            table,
            rows,
            weights,
        )
        return grad_table, None, grad_weights


def ordered_bags(table: torch.Tensor, rows: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """``RowBags`` with a deterministic backward (module docstring)."""
    return _OrderedBags.apply(table, rows, weights)


class GatherDetImpl(GatherImpl):
    """``gather`` whose backward is deterministic on cpu, cuda and npu."""

    NAME = "gather_det"
    DEVICES = ("cpu", "cuda", "npu", "meta")
    DETERMINISTIC = ("cpu", "cuda", "npu")
    BAGS: RowBags = staticmethod(ordered_bags)


register(GatherDetImpl())
