"""The MSDA call an exporter should record instead of an implementation's own graph.

A deployment route (``npudet.deploy.onnx_nodes``) sets a node function for the length of an
export; while ``torch.onnx.export`` or ``torch.export`` traces, ``multi_scale_deformable_attn``
then hands each checked call to it (one fused ONNX node per call) instead of choosing an
implementation. Eager calls are never redirected. The op library does not import the
deployment layer (``npudet.deploy``): the route reaches down by setting the function here.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Iterator, Optional

import torch

from npudet.utils.torch_compat import is_exporting

# (value, spatial_shapes, level_start_index, sampling_locations, attention_weights,
#  level_shapes=None or the (H, W) pairs) -> (bs, num_queries, heads * head_dim)
NodeFunction = Callable[..., torch.Tensor]

_NODE: Optional[NodeFunction] = None


@contextlib.contextmanager
def recording_as(node: NodeFunction) -> Iterator[None]:
    """Within the block, traced MSDA calls are recorded as ``node(...)`` (see ``NodeFunction``);
    the previous setting comes back on exit. Not thread-safe: one export at a time."""
    global _NODE
    if not callable(node):
        raise TypeError(f"node: expected a callable, got {type(node).__name__}")
    previous, _NODE = _NODE, node
    try:
        yield
    finally:
        _NODE = previous


def active() -> Optional[NodeFunction]:
    """The node function to record this call as: set and an exporter tracing, else None."""
    if _NODE is None:
        return None
    if torch.onnx.is_in_onnx_export() or is_exporting():
        return _NODE
    return None
