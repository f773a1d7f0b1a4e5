"""The ``model.msda`` switch on stock mmdet DeformableDETR / DINO configs."""

from __future__ import annotations

import copy

import pytest
import torch
from mmcv.ops import MultiScaleDeformableAttention as MMCVMSDA
from plugin_util import SMALL_DETR, SMALL_DINO, build_model, fake_batch, loss_and_grads, small_cfg

from npudet.models import MultiScaleDeformableAttention, resolve_msda_cfg
from npudet.models.detectors.msda_config import msda_parts_of
from npudet.ops import msda_impls

pytestmark = pytest.mark.skipif("cpu" not in msda_impls(), reason="cpu kernel did not build")


def _impls(model: torch.nn.Module, part: str) -> set:
    return {m.impl for m in getattr(model, part).modules() if isinstance(m, MMCVMSDA)}


def test_resolve_defaults_and_overrides() -> None:
    assert resolve_msda_cfg(None) == {"encoder": "auto", "decoder": "auto"}
    assert resolve_msda_cfg(dict(impl="cpu", decoder="grid_sample")) == {
        "encoder": "cpu",
        "decoder": "grid_sample",
    }
    with pytest.raises(ValueError, match=r"model\.msda\.encoder: unknown MSDA implementation"):
        resolve_msda_cfg(dict(encoder="fast"))
    with pytest.raises(ValueError, match=r"model\.msda: unknown keys \['imp'\]"):
        resolve_msda_cfg(dict(imp="cpu"))


def test_per_part_switch_reaches_every_layer() -> None:
    model = build_model(small_cfg(encoder="grid_sample", decoder="cpu"))
    assert all(
        isinstance(m, MultiScaleDeformableAttention)
        for m in model.modules()
        if isinstance(m, MMCVMSDA)
    )
    assert _impls(model, "encoder") == {"grid_sample"}
    assert _impls(model, "decoder") == {"cpu"}
    assert model.msda_impls == {"encoder": "grid_sample", "decoder": "cpu"}


def test_stock_config_without_msda_key_uses_auto() -> None:
    cfg = small_cfg()
    cfg.model.pop("msda")
    model = build_model(cfg)
    assert _impls(model, "encoder") == _impls(model, "decoder") == {"auto"}


def test_stock_mmdet_checkpoint_loads_and_predicts_the_same() -> None:
    from mmdet.models.detectors.deformable_detr import DeformableDETR as StockDETR
    from mmdet.registry import MODELS

    cfg = small_cfg(impl="cpu")
    cfg.model.as_two_stage = False  # mmdet's two-stage proposal embedding needs 256 dims
    stock_cfg = copy.deepcopy(cfg.model)
    ours = build_model(cfg)
    stock_cfg.pop("msda")
    stock_cfg.pop("type")
    torch.manual_seed(0)
    stock = StockDETR(**stock_cfg)
    assert not isinstance(stock.encoder.layers[0].self_attn, MultiScaleDeformableAttention)
    stock.init_weights()
    ours.load_state_dict(stock.state_dict(), strict=True)
    assert MODELS.get("DeformableDETR") is type(ours)
    batch = fake_batch()
    outs = []
    for model in (stock, ours):
        model.eval()
        with torch.no_grad():
            data = model.data_preprocessor(batch, False)
            outs.append(model(**data, mode="predict")[0].pred_instances)
    torch.testing.assert_close(outs[1].bboxes, outs[0].bboxes, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(outs[1].scores, outs[0].scores, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("config", [SMALL_DETR, SMALL_DINO], ids=["deformable_detr", "dino"])
def test_two_impls_same_losses_and_grads(config: str) -> None:
    batch = fake_batch()
    ref = build_model(small_cfg(config, impl="grid_sample"))
    fused = build_model(small_cfg(config, impl="cpu"))
    assert msda_parts_of(ref) == type(ref).msda_parts  # what the preflight reads
    # At init the encoder samples exactly on pixel centres, where bilinear sampling has
    # no gradient w.r.t. the location (one-sided slopes; round-off picks the side). Move
    # the offsets off the grid, as training does, so the gradients are well defined.
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in ref.named_parameters():
            if "sampling_offsets.bias" in name:
                param.add_(torch.rand_like(param) * 0.5 + 0.25)
    fused.load_state_dict(ref.state_dict())
    ref_losses, ref_grads = loss_and_grads(ref, batch)
    losses, grads = loss_and_grads(fused, batch)
    assert set(losses) == set(ref_losses) and len(grads) == len(ref_grads) > 100
    for key, value in ref_losses.items():
        torch.testing.assert_close(losses[key], value, rtol=1e-4, atol=1e-5, msg=key)
    for name, value in ref_grads.items():
        torch.testing.assert_close(grads[name], value, rtol=1e-3, atol=1e-5, msg=name)
