"""The level layout npudet's Deformable DETR / DINO tell the op (``note_level_layout`` in
``LevelPairsMixin.pre_transformer``): the encoder's reference points and the two-stage
proposals are then built from the noted (H, W) sizes instead of reading mmdet's level tensor
back, with mmdet's numbers: the same losses and gradients as with the tensor read, for a batch
of equal images (no padding mask) and one of unequal images (masked)."""

from __future__ import annotations

import pytest
import torch
from plugin_util import build_model, fake_batch, loss_and_grads, small_cfg

from npudet.models.detectors import level_pairs
from npudet.ops.msda import note_level_layout, noted_level_pairs


def _unequal_batch() -> dict:
    from mmdet.testing import demo_mm_inputs

    torch.manual_seed(0)
    return demo_mm_inputs(
        batch_size=2, image_shapes=[(3, 96, 128), (3, 80, 112)], num_items=[2, 3], num_classes=3
    )


@pytest.mark.parametrize("batch", [fake_batch, _unequal_batch], ids=["equal", "masked"])
def test_noted_sizes_give_the_tensor_reads_numbers(batch, monkeypatch):
    data = batch()
    model = build_model(small_cfg())
    served = []  # the sizes the encoder and the proposals took from the note
    monkeypatch.setattr(
        level_pairs,
        "noted_level_pairs",
        lambda t: served.append(noted_level_pairs(t)) or served[-1],
    )
    noted = loss_and_grads(model, data)
    assert len(served) == 2 and all(pairs is not None for pairs in served)
    monkeypatch.setattr(level_pairs, "noted_level_pairs", lambda shapes: None)
    read = loss_and_grads(model, data)
    for key in noted[0]:
        assert torch.equal(noted[0][key], read[0][key]), key
    for name in noted[1]:
        assert torch.equal(noted[1][name], read[1][name]), name


def test_noted_pairs_last_while_the_tensor_is_unmodified():
    shapes = torch.tensor([[4, 6], [2, 3]])
    starts = torch.tensor([0, 24])
    assert noted_level_pairs(shapes) is None
    note_level_layout(shapes, starts, [(4, 6), (2, 3)])
    assert noted_level_pairs(shapes) == [(4, 6), (2, 3)]
    shapes.add_(0)  # an in-place write: the tensor may hold anything now
    assert noted_level_pairs(shapes) is None
    with pytest.raises(ValueError, match="level_start_index: expected shape"):
        note_level_layout(shapes, starts[:1], [(4, 6), (2, 3)])
