"""One deformable-attention base: its sampling math, and implementation switching through it."""

from __future__ import annotations

import pytest
import torch
from bev_util import random_batch, small_model
from mmcv.ops import MultiScaleDeformableAttention as MMCVMSDA
from mmcv.ops.multi_scale_deform_attn import multi_scale_deformable_attn_pytorch
from plugin_util import SMALL_DETR, SMALL_DINO, build_model, fake_batch, small_cfg
from torch import nn

from npudet.hooks.msda_capture import MSDACapture
from npudet.models import apply_msda_cfg
from npudet.models.layers import (
    DeformableAttention,
    MultiScaleDeformableAttention,
    convert_msda,
    deformable_layers,
)
from npudet.ops import msda_impls
from npudet.ops.msda.observe import observing

pytestmark = pytest.mark.skipif("cpu" not in msda_impls(), reason="cpu kernel did not build")


class GroupedAttention(DeformableAttention, nn.Module):
    """A layer written only against the base: 2 softmax groups, 2 levels, 4 points."""

    def __init__(self, dims: int = 8, impl: str = "grid_sample") -> None:
        super().__init__()
        self.num_heads, self.num_levels, self.num_points, self.num_groups = 2, 2, 4, 2
        self.impl = impl
        self.build_sampling(dims)
        self.value_proj = nn.Linear(dims, dims)
        self.output_proj = nn.Linear(dims, dims)
        self.init_weights()


SHAPES = torch.tensor([[4, 6], [2, 3]])
STARTS = torch.tensor([0, 24])


def test_grouped_per_point_sampling_matches_mmcv_reference() -> None:
    """Groups fold into the batch, per-point references and the weight mask apply as stated."""
    torch.manual_seed(0)
    layer = GroupedAttention()
    for p in (layer.sampling_offsets.weight, layer.attention_weights.weight):
        nn.init.normal_(p, std=0.5)
    bs, nq, groups, heads, levels, points = 2, 5, 2, 2, 2, 4
    query = torch.randn(bs, nq, 8)
    value = torch.randn(bs * groups, 30, heads, 4)
    ref = torch.rand(bs * groups, nq, 1, points, 2)
    mask = (torch.rand(bs * groups, nq, 1, 1, points) > 0.3).float()
    out = layer.deformable_attend(query, value, ref, SHAPES, STARTS, weight_mask=mask)

    # the same by hand: group g of sample b is batch row b * groups + g
    offsets = layer.sampling_offsets(query).view(bs, nq, heads, groups, levels, points, 2)
    logits = layer.attention_weights(query).view(bs, nq, heads, groups, levels * points)
    weights = logits.softmax(-1).view(bs, nq, heads, groups, levels, points)
    normalizer = torch.tensor([[6.0, 4.0], [3.0, 2.0]])  # (W, H) per level
    for b in range(bs):
        for g in range(groups):
            row = b * groups + g
            loc = ref[row][:, None] + offsets[b, :, :, g] / normalizer[None, None, :, None]
            want = multi_scale_deformable_attn_pytorch(
                value[row : row + 1], SHAPES, loc[None], (weights[b, :, :, g] * mask[row])[None]
            )
            torch.testing.assert_close(out[row : row + 1], want, rtol=1e-5, atol=1e-6)


def test_bad_reference_points_are_refused() -> None:
    layer = GroupedAttention()
    args = (torch.randn(1, 3, 8), torch.randn(2, 30, 2, 4))
    with pytest.raises(ValueError, match="reference_points: expected 4 or 5 dims"):
        layer.deformable_attend(*args, torch.rand(2, 3, 2), SHAPES, STARTS)
    with pytest.raises(ValueError, match="reference_points: last dim must be 2 or 4"):
        layer.deformable_attend(*args, torch.rand(2, 3, 2, 3), SHAPES, STARTS)


@pytest.mark.parametrize("ratio", [1.0, 0.5])
def test_mmcv_layer_keeps_mmcv_parameters(ratio: float) -> None:
    """Same state_dict keys, shapes and initial values as mmcv's class (checkpoints load)."""
    kw = dict(embed_dims=32, num_heads=4, num_levels=3, num_points=2, value_proj_ratio=ratio)
    torch.manual_seed(0)
    ref = MMCVMSDA(**kw)
    torch.manual_seed(0)
    ours = MultiScaleDeformableAttention(**kw, impl="grid_sample")
    assert isinstance(ours, DeformableAttention) and isinstance(ours, MMCVMSDA)
    assert (
        list(ours.state_dict())
        == list(ref.state_dict())
        == [
            "sampling_offsets.weight",
            "sampling_offsets.bias",
            "attention_weights.weight",
            "attention_weights.bias",
            "value_proj.weight",
            "value_proj.bias",
            "output_proj.weight",
            "output_proj.bias",
        ]
    )
    for (name, want), got in zip(ref.state_dict().items(), ours.state_dict().values()):
        assert got.shape == want.shape and torch.equal(got, want), name
    ours.load_state_dict(ref.state_dict(), strict=True)


def _switched_calls(model: nn.Module, batch: dict) -> dict:
    """{layer name: set of implementations} of every MSDA call ``model`` makes computing its
    training losses on ``batch`` (no gradients)."""
    capture = MSDACapture()
    capture.attach(model)
    try:
        model.train()
        with observing(capture), torch.no_grad():
            model(**model.data_preprocessor(batch, True), mode="loss")
        calls = {}
        for name, call in capture.calls:
            calls.setdefault(name.split("#")[0], set()).add(call.impl)
        return calls
    finally:
        capture.detach()


def _expect(names, encoder: str, decoder: str) -> dict:
    return {n: {encoder if n.split(".")[0] == "encoder" else decoder} for n in names}


@pytest.mark.parametrize("config", [SMALL_DETR, SMALL_DINO], ids=["deformable_detr", "dino"])
def test_every_detr_layer_found_and_switched(config: str) -> None:
    cfg = small_cfg(config, encoder="grid_sample", decoder="cpu")
    model = build_model(cfg)
    names = [name for name, _ in deformable_layers(model)]
    # one self-attention per encoder layer, one cross-attention per decoder layer
    assert len(names) == cfg.model.encoder.num_layers + cfg.model.decoder.num_layers == 6
    mmcv_layers = [m for m in model.modules() if isinstance(m, MMCVMSDA)]
    assert len(mmcv_layers) == len(names)
    assert _switched_calls(model, fake_batch()) == _expect(names, "grid_sample", "cpu")


def test_every_bev_layer_found_and_switched() -> None:
    model = small_model("cpu")
    names = [name for name, _ in deformable_layers(model)]
    # TSA + SCA per encoder layer (1), cross-attention per head decoder layer (2)
    assert names == [
        "encoder.layers.0.tsa",
        "encoder.layers.0.sca",
        "bbox_head.decoder.0.cross_attn",
        "bbox_head.decoder.1.cross_attn",
    ]
    assert apply_msda_cfg(model, dict(impl="cpu", encoder="grid_sample")) == {
        "encoder": "grid_sample",
        "decoder": "cpu",
    }
    assert _switched_calls(model, random_batch()) == _expect(names, "grid_sample", "cpu")


def test_switching_needs_no_layer_classes() -> None:
    """A new layer type anywhere in any model is found; layers outside encoder/decoder get
    ``impl``; a stock mmcv layer is converted in place."""
    model = nn.ModuleDict(
        dict(
            encoder=nn.Sequential(GroupedAttention()),
            neck=GroupedAttention(),
            decoder=nn.ModuleList([MMCVMSDA(embed_dims=8, num_heads=2)]),
        )
    )
    apply_msda_cfg(model, dict(impl="cpu", encoder="grid_sample", decoder="gather"))
    found = {name: layer.impl for name, layer in deformable_layers(model)}
    assert found == {"encoder.0": "grid_sample", "neck": "cpu", "decoder.0": "gather"}
    assert isinstance(model["decoder"][0], MultiScaleDeformableAttention)  # or its fused subclass
    assert convert_msda(model, "grid_sample") == 3
