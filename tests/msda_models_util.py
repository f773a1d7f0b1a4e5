"""Helpers for the tests of mmdet's MSDA models on npudet's layers: mmdet's configs, tiny
models, and a record of which MSDA code ran (npudet's op per implementation, mmcv's)."""

from __future__ import annotations

import contextlib
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Dict, Iterator, List, Optional, Sequence

import torch
from mmengine.config import Config, ConfigDict

from npudet.ops.msda.observe import MSDACall, MSDAObserver, Run, observing

# the implementations every model test runs: the reference and the two CPU ones
IMPLS = ("grid_sample", "gather", "cpu")


def mmdet_config(rel: str) -> Config:
    """mmdet's own config at ``rel`` (shipped in its package under ``.mim/configs``)."""
    import mmdet

    return Config.fromfile(os.path.join(os.path.dirname(mmdet.__file__), ".mim", "configs", rel))


@dataclass
class MSDARecord:
    """What ran while :func:`record_msda` was active: ``npudet`` counts npudet's op calls by
    implementation, ``mmcv`` mmcv's MSDA computations (its CUDA function and its pytorch
    reference), ``layers`` the calls of each deformable-attention layer, by name."""

    npudet: Counter = field(default_factory=Counter)
    mmcv: int = 0
    layers: Counter = field(default_factory=Counter)


class _Count(MSDAObserver):
    def __init__(self, record: MSDARecord) -> None:
        self.record = record

    def around(self, call: MSDACall, run: Run) -> torch.Tensor:
        self.record.npudet[call.impl] += 1
        return run(call)


def msda_layers(model: torch.nn.Module) -> Dict[str, torch.nn.Module]:
    """{qualified name: module} of every MSDA layer, npudet's or mmcv's, converting none
    (``deformable_layers`` would convert mmcv's on the way)."""
    from mmcv.ops import MultiScaleDeformableAttention as MMCVMSDA

    from npudet.nn import DeformableAttention

    kinds = (MMCVMSDA, DeformableAttention)
    return {name: m for name, m in model.named_modules() if isinstance(m, kinds)}


@contextlib.contextmanager
def record_msda(model: torch.nn.Module) -> Iterator[MSDARecord]:
    """Count, within the block, npudet's MSDA op calls, mmcv's MSDA computations and the
    forward calls of each of ``model``'s deformable-attention layers."""
    import mmcv.ops.multi_scale_deform_attn as mmcv_msda

    record = MSDARecord()

    def counted(fn):
        def wrapper(*args, **kwargs):
            record.mmcv += 1
            return fn(*args, **kwargs)

        return wrapper

    reference, function = (
        mmcv_msda.multi_scale_deformable_attn_pytorch,
        mmcv_msda.MultiScaleDeformableAttnFunction,
    )
    mmcv_msda.multi_scale_deformable_attn_pytorch = counted(reference)
    mmcv_msda.MultiScaleDeformableAttnFunction = type(
        "Counted", (function,), {"apply": staticmethod(counted(function.apply))}
    )
    handles = [
        layer.register_forward_hook(lambda *_, n=name: record.layers.update([n]))
        for name, layer in msda_layers(model).items()
    ]
    try:
        with observing(_Count(record)):
            yield record
    finally:
        mmcv_msda.multi_scale_deformable_attn_pytorch = reference
        mmcv_msda.MultiScaleDeformableAttnFunction = function
        for handle in handles:
            handle.remove()


def assert_ran_on(record: MSDARecord, model: torch.nn.Module, impl: str) -> None:
    """Every MSDA layer of ``model`` is npudet's and ran, each call on npudet's op with
    ``impl``, none on mmcv's."""
    from npudet.nn import DeformableAttention

    layers = msda_layers(model)
    assert layers, "the model has no MSDA layer"
    stock = [n for n, m in layers.items() if not isinstance(m, DeformableAttention)]
    assert not stock, f"mmcv's layers left: {stock}"
    names: List[str] = list(layers)
    assert record.mmcv == 0, f"mmcv's MSDA ran {record.mmcv} times"
    idle = [n for n in names if not record.layers[n]]
    assert not idle, f"layers that did not run: {idle}"
    calls = sum(record.layers.values())
    assert dict(record.npudet) == {impl: calls}, (dict(record.npudet), calls)


@contextlib.contextmanager
def running_on(model: torch.nn.Module, impl: str) -> Iterator[MSDARecord]:
    """:func:`record_msda` over the block, then :func:`assert_ran_on` ``impl`` when it ends."""
    with record_msda(model) as record:
        yield record
    assert_ran_on(record, model, impl)


def layer_impls(model: torch.nn.Module) -> Dict[str, str]:
    """{qualified name: impl} of every MSDA layer; an mmcv layer left unconverted has none."""
    return {name: getattr(m, "impl", "mmcv") for name, m in msda_layers(model).items()}


def tiny_dino_cfg(rel: str, num_classes: int, **msda: str) -> ConfigDict:
    """The model of mmdet's 4-scale R50 DINO-family config ``rel`` (DINO, DDQ-DETR,
    Grounding DINO) shrunk as mmdet's own tests do: ResNet-18 at 32 channels, 1 encoder and 2
    decoder layers with 256-wide FFNs, 20 queries (10 denoising), ``num_classes`` classes, at
    most 20 detections an image; ``model.msda`` set to ``msda``."""
    cfg = mmdet_config(rel).model
    cfg.msda = dict(msda)
    cfg.backbone.update(depth=18, base_channels=32, init_cfg=None)
    cfg.neck.in_channels = [64, 128, 256]
    cfg.encoder.num_layers = 1
    cfg.decoder.num_layers = 2
    cfg.encoder.layer_cfg.ffn_cfg.feedforward_channels = 256
    cfg.decoder.layer_cfg.ffn_cfg.feedforward_channels = 256
    cfg.num_queries = 20
    cfg.dn_cfg.group_cfg.num_dn_queries = 10
    cfg.bbox_head.num_classes = num_classes
    cfg.test_cfg.max_per_img = 20  # top-k over the 20 queries
    return cfg


def tiny_mask2former_head(
    head: ConfigDict, num_classes: Optional[int] = None, base: int = 32
) -> ConfigDict:
    """A Mask2Former head config (mmdet's ``panoptic_head`` / ``track_head``, mmseg's
    ``decode_head``) shrunk in place as mmdet's own tests shrink it: ``base`` channels
    (backbone levels ``base * 2**i``), 2 pixel-decoder and 2 decoder layers, 10 queries;
    ``num_classes`` classes (None: the config's). Returns ``head``."""
    head.update(in_channels=[base * 2**i for i in range(4)], feat_channels=base)
    head.update(out_channels=base, num_queries=10)
    if num_classes is not None:
        head.num_classes = num_classes
        head.loss_cls.class_weight = [1.0] * num_classes + [0.1]
    encoder = head.pixel_decoder.encoder
    encoder.num_layers = 2
    encoder.layer_cfg.self_attn_cfg.embed_dims = base
    encoder.layer_cfg.ffn_cfg.update(embed_dims=base, feedforward_channels=base * 4)
    head.pixel_decoder.positional_encoding.num_feats = base // 2
    head.positional_encoding.num_feats = base // 2
    decoder = head.transformer_decoder
    decoder.num_layers = 2
    decoder.layer_cfg.self_attn_cfg.embed_dims = base
    decoder.layer_cfg.cross_attn_cfg.embed_dims = base
    decoder.layer_cfg.ffn_cfg.update(embed_dims=base, feedforward_channels=base * 8)
    return head


def build(model_cfg: Config, seed: int = 0, init: bool = True) -> torch.nn.Module:
    """mmdet's ``MODELS.build`` of a model config under the mmdet scope, initialised from
    ``seed`` (``init_weights``, unless ``init`` is False: construction alone); the
    pretrained weights must already be dropped."""
    from mmdet.registry import MODELS
    from mmengine.registry import init_default_scope

    import npudet.models  # noqa: F401  (registers the switched models)

    init_default_scope("mmdet")
    torch.manual_seed(seed)
    model = MODELS.build(model_cfg)
    if init:
        model.init_weights()
    return model


def offsets_off_grid(model: torch.nn.Module, seed: int = 1) -> None:
    """Move every ``sampling_offsets`` bias off mmcv's pixel-centre lattice, as training
    does: on it bilinear sampling has no location gradient (one-sided slopes, round-off
    picks the side), so implementations could disagree there by design."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "sampling_offsets.bias" in name:
                param.add_(torch.rand_like(param) * 0.5 + 0.25)


def write_tiny_bert(folder: str, words: Sequence[str]) -> str:
    """A local BERT for mmdet's ``BertModel(name=folder)``: a 2-layer, 32-wide config, its
    randomly initialised weights and a vocabulary of BERT's special tokens, Grounding DINO's
    separators and ``words``; nothing is fetched (``HF_HUB_OFFLINE=1``). Returns ``folder``."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    from transformers import BertConfig, BertModel

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", "?", ","]
    vocab += sorted({w for word in words for w in word.lower().split()} - set(vocab))
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "vocab.txt"), "w") as f:
        f.write("\n".join(vocab) + "\n")
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    BertModel(config, add_pooling_layer=False).save_pretrained(folder)
    return folder


def assert_same_step(make_cfg: Callable[[str], Config], batch: Callable[[], dict]) -> None:
    """One training step of the model ``make_cfg(impl)`` on ``batch()`` gives ``cpu`` the
    same losses and ``sampling_offsets`` gradients as ``grid_sample``, from the same weights
    (offsets moved off the lattice: :func:`offsets_off_grid`)."""
    from plugin_util import loss_and_grads

    ref = build(make_cfg("grid_sample"))
    offsets_off_grid(ref)
    fused = build(make_cfg("cpu"))
    fused.load_state_dict(ref.state_dict())
    ref_losses, ref_grads = loss_and_grads(ref, batch())
    losses, grads = loss_and_grads(fused, batch())
    assert set(losses) == set(ref_losses)
    for key, value in ref_losses.items():
        torch.testing.assert_close(losses[key], value, rtol=1e-4, atol=1e-5, msg=key)
    offsets = [f"{name}.sampling_offsets.weight" for name in msda_layers(ref)]
    for name in offsets:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-3, atol=1e-5, msg=name)
