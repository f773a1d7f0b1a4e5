"""``model.msda.layers``: mmcv's FFN and MSDA layer converted in place to npudet's training-grade
pieces (``ffn``, ``dropout``, ``projections``) train as stock's layers do, with stock's
parameters, checkpoints and random numbers."""

from __future__ import annotations

import copy
from typing import Dict

import pytest
import torch
from mmcv.cnn.bricks.transformer import FFN as MMCVFFN
from msda_models_util import offsets_off_grid
from plugin_util import build_model, fake_batch, loss_and_grads, small_cfg

from npudet.engine.msda_log import msda_summary
from npudet.models.layers import (
    FFN,
    FusedMultiScaleDeformableAttention,
    MultiScaleDeformableAttention,
    active_pieces,
    convert_layers,
    resolve_layers,
)
from npudet.nn.dropout_add import dropout_add
from npudet.ops import msda_impls

pytestmark = pytest.mark.skipif("cpu" not in msda_impls(), reason="cpu kernel did not build")

# the three MSDA gradients the proof compares, in every layer
MSDA_PROJECTIONS = ("value_proj", "sampling_offsets", "attention_weights")


def with_dropout(cfg, p: float):
    """``cfg`` with every FFN's and attention's dropout at ``p`` (the small configs have 0)."""
    for part in (cfg.model.encoder, cfg.model.decoder):
        layer = part.layer_cfg
        layer.ffn_cfg.ffn_drop = p
        for attn in ("self_attn_cfg", "cross_attn_cfg"):
            if attn in layer:
                layer[attn].dropout = p
    return cfg


def pair(layers: str = "fast", dropout: float = 0.0) -> Dict[str, torch.nn.Module]:
    """The small Deformable DETR on ``cpu`` with stock layers and with ``layers``, the same
    weights (offsets off the pixel lattice: msda_models_util.offsets_off_grid)."""
    models = {
        name: build_model(with_dropout(small_cfg(impl="cpu", layers=name), dropout))
        for name in ("stock", layers)
    }
    offsets_off_grid(models["stock"])
    models[layers].load_state_dict(models["stock"].state_dict())
    return models


def test_resolve_layers() -> None:
    assert resolve_layers(None) == resolve_layers("fast") == {"ffn", "dropout", "projections"}
    assert resolve_layers("stock") == frozenset()
    assert resolve_layers("ffn+projections") == resolve_layers(["projections", "ffn"])
    with pytest.raises(ValueError, match=r"model\.msda\.layers: expected 'fast', 'stock' or "):
        resolve_layers("ffn+gelu")
    with pytest.raises(ValueError, match=r"model\.msda: unknown keys \['layer'\]"):
        build_model(small_cfg(layer="fast"))


def test_conversion_changes_classes_only() -> None:
    models = pair()
    stock, fast = models["stock"], models["fast"]
    kinds = {type(m) for m in fast.modules()}
    assert FFN in kinds and FusedMultiScaleDeformableAttention in kinds
    assert MMCVFFN not in kinds and MultiScaleDeformableAttention not in kinds
    assert {type(m) for m in stock.modules()} >= {MMCVFFN, MultiScaleDeformableAttention}
    shapes = {k: v.shape for k, v in stock.state_dict().items()}
    assert {k: v.shape for k, v in fast.state_dict().items()} == shapes
    assert active_pieces(fast) == {"ffn": 6, "dropout": 12, "projections": 6}
    pieces = "layer pieces (model.msda.layers): "
    assert msda_summary(fast).endswith(pieces + "ffn (6), dropout (12), projections (6)")
    assert msda_summary(stock).endswith(pieces + "none (stock)")
    # back to stock and on again, in place
    assert convert_layers(fast, frozenset()) == {"ffn": 0, "msda": 0}
    assert {type(m) for m in fast.modules()} == {type(m) for m in stock.modules()}
    assert not any("fused_dropout" in vars(m) for m in fast.modules())
    assert convert_layers(fast, resolve_layers("projections")) == {"ffn": 0, "msda": 6}


def test_stock_mmdet_checkpoints_load_both_ways() -> None:
    """A stock mmdet DeformableDETR's state_dict loads into the converted model and the
    converted model's (after a training step) into stock, strictly; predictions agree."""
    from mmdet.models.detectors.deformable_detr import DeformableDETR as StockDETR

    cfg = small_cfg(impl="grid_sample", layers="fast")
    cfg.model.as_two_stage = False  # mmdet's two-stage proposal embedding needs 256 dims
    stock_cfg = copy.deepcopy(cfg.model)  # before mmdet's constructor edits bbox_head's
    ours = build_model(cfg)
    stock_cfg.pop("msda")
    stock_cfg.pop("type")
    torch.manual_seed(0)
    stock = StockDETR(**stock_cfg)
    assert not any(isinstance(m, (FFN, MultiScaleDeformableAttention)) for m in stock.modules())
    stock.init_weights()
    batch = fake_batch()

    def predict(model: torch.nn.Module):
        model.eval()
        with torch.no_grad():
            data = model.data_preprocessor(batch, False)
            return model(**data, mode="predict")[0].pred_instances

    def assert_same(a, b) -> None:
        torch.testing.assert_close(a.bboxes, b.bboxes, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(a.scores, b.scores, rtol=1e-4, atol=1e-5)

    ours.load_state_dict(stock.state_dict(), strict=True)
    assert_same(predict(ours), predict(stock))
    loss_and_grads(ours, batch)
    torch.optim.SGD(ours.parameters(), lr=0.1).step()
    stock.load_state_dict(ours.state_dict(), strict=True)
    assert_same(predict(stock), predict(ours))


def test_three_iterations_match_stock_layers_at_dropout_0() -> None:
    """With dropout 0 (the small config's), three AdamW iterations of the converted model
    give stock layers' losses and the three MSDA projections' gradients within 1e-5 at every
    iteration (the first is bit for bit)."""
    models = pair()
    optims = {k: torch.optim.AdamW(m.parameters(), lr=1e-3) for k, m in models.items()}
    batch = fake_batch()
    for step in range(3):
        (ref_losses, ref_grads), (losses, grads) = (
            loss_and_grads(models[k], batch, seed=step) for k in ("stock", "fast")
        )
        for optim in optims.values():
            optim.step()
        for key, value in ref_losses.items():
            torch.testing.assert_close(losses[key], value, rtol=0, atol=1e-5, msg=key)
        names = [n for n in ref_grads if any(p in n for p in MSDA_PROJECTIONS)]
        assert len(names) == 36  # 6 layers x 3 projections x (weight, bias)
        for name in names:
            torch.testing.assert_close(grads[name], ref_grads[name], rtol=0, atol=1e-5, msg=name)


def test_with_dropout_same_random_numbers_and_eval() -> None:
    """With dropout 0.1 everywhere, a training step of the converted model draws stock's masks
    on CPU (the same losses), and eval is stock's."""
    models = pair(dropout=0.1)
    batch = fake_batch()
    (ref_losses, _), (losses, _) = (loss_and_grads(models[k], batch) for k in ("stock", "fast"))
    for key, value in ref_losses.items():
        torch.testing.assert_close(losses[key], value, rtol=0, atol=1e-5, msg=key)
    outs = []
    for model in models.values():
        model.eval()
        with torch.no_grad():
            data = model.data_preprocessor(batch, False)
            outs.append(model(**data, mode="predict")[0].pred_instances)
    torch.testing.assert_close(outs[1].bboxes, outs[0].bboxes, rtol=0, atol=1e-5)
    torch.testing.assert_close(outs[1].scores, outs[0].scores, rtol=0, atol=1e-6)


@pytest.mark.parametrize("p", [0.1, 0.3])
def test_dropout_add_drops_with_p_and_matches_stock(p: float) -> None:
    x, identity = torch.randn(64, 1000), torch.randn(64, 1000)
    torch.manual_seed(0)
    out = dropout_add(x, identity, p, True)
    dropped = (out == identity).float().mean().item()
    assert abs(dropped - p) < 0.01, dropped  # 64000 draws: 3 sigma is under 0.006
    kept = out != identity
    torch.testing.assert_close(out[kept], identity[kept] + x[kept] / (1 - p))
    torch.manual_seed(0)
    assert torch.equal(out, identity + torch.nn.functional.dropout(x, p, True))
    assert torch.equal(dropout_add(x, identity, p, False), identity + x)


def test_ffn_pieces_match_stock_ffn_with_dropout() -> None:
    """Each piece alone and both: the converted FFN gives stock's output and input gradient,
    bit for bit on CPU with dropout 0.1 (the same masks), for a (bs, n, C) input."""
    torch.manual_seed(0)
    stock = MMCVFFN(embed_dims=16, feedforward_channels=32, ffn_drop=0.1)
    x = torch.randn(2, 50, 16)
    results = []
    for pieces in ("stock", "ffn", "dropout", "ffn+dropout"):
        ffn = copy.deepcopy(stock)
        convert_layers(ffn, resolve_layers(pieces))
        assert isinstance(ffn, FFN) == (pieces != "stock")
        inp = x.clone().requires_grad_()
        torch.manual_seed(1)
        out = ffn(inp)
        out.square().sum().backward()
        results.append((out.detach(), inp.grad))
    for out, grad in results[1:]:
        assert torch.equal(out, results[0][0]) and torch.equal(grad, results[0][1])
