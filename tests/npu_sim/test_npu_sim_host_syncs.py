"""Host syncs of npudet's MSDA layer on the simulated NPU, counted with the project's dispatch
counter (npudet_dev.ablation.dispatch_count): none in a training forward + backward when the
model has told the op its level layout (``npudet.ops.msda.note_level_layout``, what npudet's
Deformable DETR and DINO do with the level tensors mmdet builds), one read per new layout
when it has not. The layer runs ``npu_vendor``, what ``auto`` picks on npu (DrivingSDK's
binding double counted as one op, as the real kernel is one launch)."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from npudet.ops.msda import note_level_layout
from npudet_dev.ablation.dispatch_count.child import vendor_doubles
from npudet_dev.ablation.dispatch_count.counter import DispatchCounter

PAIRS = [(6, 4), (3, 2)]  # (H, W) per level: 30 keys
# a small npudet MSDA layer on the vendor route
LAYER = dict(
    embed_dims=32, num_heads=4, num_levels=2, num_points=2, batch_first=True, impl="npu_vendor"
)


def _training_step(counter: DispatchCounter, note: bool) -> Callable[[], None]:
    """One forward + backward of an npudet MSDA layer on npu, with level tensors built on the
    device as mmdet's ``pre_transformer`` builds them (new tensors every step)."""
    from npudet.models.layers import MultiScaleDeformableAttention

    torch.manual_seed(0)
    layer = MultiScaleDeformableAttention(**LAYER).to("npu")
    layer.train()
    query = torch.randn(1, 5, 32, device="npu", requires_grad=True)
    value = torch.randn(1, 30, 32, device="npu", requires_grad=True)
    reference = torch.rand(1, 5, 2, 2, device="npu")

    def step() -> None:
        shapes = torch.as_tensor(PAIRS, dtype=torch.long, device="npu")
        starts = torch.cat((shapes.new_zeros((1,)), shapes.prod(1).cumsum(0)[:-1]))
        if note:
            note_level_layout(shapes, starts, PAIRS)
        out = layer(
            query,
            value=value,
            reference_points=reference,
            spatial_shapes=shapes,
            level_start_index=starts,
        )
        out.sum().backward()

    return step


@pytest.fixture
def counter(simulated_npu, monkeypatch: pytest.MonkeyPatch) -> DispatchCounter:
    counter = DispatchCounter("npu")
    for module, function, name in vendor_doubles():
        monkeypatch.setattr(module, function, counter.opaque(getattr(module, function), name))
    return counter


def test_msda_layer_trains_without_host_syncs_on_npu(counter):
    step = _training_step(counter, note=True)
    step()  # the first call decides and plans
    with counter:
        step()
    counts = counter.tally.as_dict()
    assert counts["by_source"]["layers"]["ops"] > 0 and counts["backward_ops"] > 0
    assert counts["sync_kinds"].get("item", 0) == 0
    assert counts["syncs"] == 0, counts["sync_sites"]
    # forward and backward of the vendor kernel, each one op
    ops = counts["ops_by_name"]
    assert ops["mx_driving.multi_scale_deformable_attn"] == 1
    assert ops["mx_driving.multi_scale_deformable_attn_backward"] == 1


def test_an_unnoted_layout_is_read_once_per_new_tensor_pair(counter):
    step = _training_step(counter, note=False)
    step()
    with counter:
        step()
    counts = counter.tally.as_dict()
    assert counts["syncs"] == 1
    ((source, site, kind, op, count),) = counts["sync_sites"]
    assert (source, kind, op, count) == ("layers", "copy_to_host", "_to_copy", 1)
    assert site.startswith("npudet/ops/msda/inputs.py:")
