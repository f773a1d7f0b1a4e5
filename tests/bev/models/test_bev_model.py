"""BEVFormer-style model: SCA re-batching, TSA alignment, detector loss / predict / impl switch."""

from __future__ import annotations

import pytest
import torch
from bev_util import IMG_HW, PC_RANGE, random_batch, ring_lidar2img, small_model, tiny_encoder
from mmengine.structures import InstanceData
from plugin_util import drop_pretrained

from npudet.bev.models import BEVFormer, SpatialCrossAttention
from npudet.bev.models.spatial_cross_attention import (
    bev_pillar_points,
    flatten_levels,
    project_to_cameras,
)
from npudet.bev.models.temporal_self_attention import (
    bev_reference_points,
    ego_motion,
    prev_reference_points,
)
from npudet.models.detectors.msda_config import msda_parts_of

# The head tests' one-layer head over 16 dims.
TINY_HEAD = dict(num_classes=2, embed_dims=16, num_layers=1, num_heads=2, ffn_dims=32)


def test_projection_sees_points_ahead() -> None:
    l2i = ring_lidar2img(2)[None]
    pts = torch.tensor([[[5.0, 0.0, 1.5]], [[-5.0, 0.0, 1.5]]])
    uv, mask = project_to_cameras(pts, l2i, IMG_HW)
    assert mask[0, 0, 0, 0] and not mask[0, 0, 1, 0]
    assert mask[0, 1, 1, 0] and not mask[0, 1, 0, 0]
    torch.testing.assert_close(uv[0, 0, 0, 0], torch.tensor([0.5, 0.5]))


def naive_sca(sca, query, feats, shapes, starts, l2i, bev_hw):
    """Per-sample, per-camera loop over only the visible queries."""
    b, q, c = query.shape
    n = feats.shape[1]
    pts = bev_pillar_points(bev_hw[0], bev_hw[1], sca.num_z, sca.pc_range, query.device)
    uv, mask = project_to_cameras(pts, l2i, IMG_HW)
    value = sca.project_cameras(feats)
    acc = torch.zeros(b, q, c)
    count = torch.zeros(b, q)
    for bi in range(b):
        for ni in range(n):
            idx = mask[bi, ni].any(-1).nonzero()[:, 0]
            if idx.numel() == 0:
                continue
            out = sca.attend(
                query[bi, idx][None],
                uv[bi, ni, idx][None],
                mask[bi, ni, idx][None].float(),
                value[bi * n + ni][None],
                shapes,
                starts,
            )[0]
            acc[bi, idx] += out
            count[bi, idx] += 1
    return sca.output_proj(acc / count.clamp(min=1)[..., None]) + query


def test_sca_rebatch_matches_naive_loop() -> None:
    torch.manual_seed(0)
    b, n, c, bev_hw = 2, 3, 16, (6, 5)
    sca = SpatialCrossAttention(
        c,
        num_heads=2,
        num_levels=2,
        num_points=4,
        num_z=2,
        pc_range=PC_RANGE,
        dropout=0.0,
        impl="cpu",
    ).eval()
    for p in sca.parameters():
        torch.nn.init.normal_(p, std=0.3)
    feats, shapes, starts = flatten_levels(
        [torch.randn(b, n, c, 8, 12), torch.randn(b, n, c, 4, 6)]
    )
    l2i = sca_test_cameras(b, n)
    query = torch.randn(b, bev_hw[0] * bev_hw[1], c)
    out = sca(query, feats, shapes, starts, l2i, IMG_HW, bev_hw)
    ref = naive_sca(sca, query, feats, shapes, starts, l2i, bev_hw)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    sca.packed = False  # every cell in every camera, the unseen masked: the export's form
    unpacked = sca(query, feats, shapes, starts, l2i, IMG_HW, bev_hw)
    torch.testing.assert_close(unpacked, out, atol=1e-6, rtol=0)


def test_tsa_alignment() -> None:
    ref = bev_reference_points(4, 5, torch.device("cpu"))
    eye = torch.eye(4, dtype=torch.float64)[None]
    torch.testing.assert_close(prev_reference_points(ref, ego_motion(eye, eye), PC_RANGE)[0], ref)
    prev = eye.clone()
    cur = eye.clone()
    cur[0, 0, 3] = 2.0  # the ego moved 2 m forward (+x) since the previous frame
    cur[0, 1, 3] = -1.0  # and 1 m right
    moved = prev_reference_points(ref, ego_motion(cur, prev), PC_RANGE)[0]
    shift = torch.tensor([2.0 / 20.0, -1.0 / 20.0])
    torch.testing.assert_close(moved - ref, shift.expand_as(ref))


def run_loss(model: BEVFormer):
    data = model.data_preprocessor(random_batch(), True)
    return model(**data, mode="loss")


def test_detector_loss_and_backbone_grad() -> None:
    torch.manual_seed(0)
    model = small_model().train()
    losses = run_loss(model)
    assert {"loss_cls", "loss_bbox", "d0.loss_cls", "d0.loss_bbox"} <= set(losses)
    total = sum(losses.values())
    assert all(torch.isfinite(v) for v in losses.values())
    total.backward()
    grad = model.backbone.conv1.weight.grad
    assert grad is not None and grad.abs().sum() > 0
    assert model.encoder.layers[0].tsa.sampling_offsets.weight.grad is not None


def test_detector_predict_shapes() -> None:
    torch.manual_seed(0)
    model = small_model().eval()
    data = model.data_preprocessor(random_batch(), False)
    with torch.no_grad():
        out = model(**data, mode="predict")
    for s in out:
        pred = s.pred_instances_3d
        assert pred.bboxes_3d.shape == (7, 9)
        assert pred.scores_3d.shape == (7,) and pred.labels_3d.shape == (7,)
        assert int(pred.labels_3d.max()) < 3


@pytest.mark.parametrize("part", ["encoder", "decoder"])
def test_msda_cfg_reaches_layers(part: str) -> None:
    from npudet.models import apply_msda_cfg

    model = small_model()
    impls = apply_msda_cfg(model, dict(impl="cpu", **{part: "grid_sample"}))
    other = "cpu"
    assert impls == {
        "encoder": "grid_sample" if part == "encoder" else other,
        "decoder": "grid_sample" if part == "decoder" else other,
    }
    enc_impl, dec_impl = impls["encoder"], impls["decoder"]
    layer = model.encoder.layers[0]
    assert layer.sca.impl == layer.tsa.impl == enc_impl
    assert model.bbox_head.decoder[0].cross_attn.impl == dec_impl


@pytest.mark.parametrize("two_stage", [False, True])
def test_impl_switch_same_losses(two_stage: bool) -> None:
    torch.manual_seed(0)
    model_a = small_model("cpu", two_stage=two_stage).train()
    model_b = small_model("grid_sample", two_stage=two_stage).train()
    model_b.load_state_dict(model_a.state_dict())
    la, lb = run_loss(model_a), run_loss(model_b)
    for key in la:
        torch.testing.assert_close(la[key], lb[key], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["bev-small_r18_synthetic.py", "bevformer-tiny_r50_nuscenes.py"])
def test_bev_configs_build(name: str) -> None:
    import os

    from mmdet.registry import MODELS
    from mmengine.config import Config
    from mmengine.registry import init_default_scope

    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    cfg = Config.fromfile(os.path.join(root, "configs", "bev", name))
    assert cfg.model.type == "BEVFormer" and cfg.model.msda.impl == "auto"
    assert cfg.model.use_temporal is True and cfg.train_dataloader.dataset.queue_length >= 2
    assert cfg.custom_imports.imports == ["npudet.plugin"]
    drop_pretrained(cfg)  # BEVFormer-tiny's ImageNet ResNet-50: the tests download nothing
    assert cfg.val_evaluator.type == "BEVDetMetric"
    init_default_scope("mmdet")
    cfg.model.msda.decoder = "grid_sample"
    model = MODELS.build(cfg.model)
    assert model.msda_impls == {"encoder": "auto", "decoder": "grid_sample"}
    assert model.bbox_head.decoder[0].cross_attn.impl == "grid_sample"
    assert msda_parts_of(model) == BEVFormer.msda_parts  # what the preflight reads
    # one training step of every shipped config, these included (finite losses, gradients
    # at every MSDA layer): tests/models/test_shipped_configs.py


def sca_test_cameras(b: int = 2, n: int = 3) -> torch.Tensor:
    """3 cameras 120 deg apart (gaps between them); sample 1 duplicates camera 0 as camera 2."""
    l2i = ring_lidar2img(n)[None].repeat(b, 1, 1, 1)
    l2i[1, 2] = l2i[1, 0]
    return l2i


def test_sca_test_geometry_is_mixed() -> None:
    """The naive-loop test's cameras: some cells seen by no camera, some by 2."""
    pts = bev_pillar_points(6, 5, 2, PC_RANGE, torch.device("cpu"))
    _, mask = project_to_cameras(pts, sca_test_cameras(), IMG_HW)
    seen = mask.any(-1).sum(1)
    assert int(seen[0].min()) == 0 and int(seen[1].max()) == 2


def test_encoder_missing_prev_frame_uses_current_queries() -> None:
    torch.manual_seed(0)
    enc = tiny_encoder().eval()
    feats = [torch.randn(2, 2, 16, 8, 12)]
    l2i = ring_lidar2img(2)[None].repeat(2, 1, 1, 1)
    still = torch.eye(4, dtype=torch.float64)[None].repeat(2, 1, 1)  # no ego motion
    prev = torch.randn(2, 20, 16)
    none = enc(feats, l2i, IMG_HW)
    masked = enc(feats, l2i, IMG_HW, prev, still, torch.tensor([False, True]))
    with_prev = enc(feats, l2i, IMG_HW, prev, still, torch.tensor([True, True]))
    torch.testing.assert_close(masked[0], none[0])
    torch.testing.assert_close(masked[1], with_prev[1])
    assert not torch.allclose(masked[1], none[1])


def test_two_stage_losses_and_grads() -> None:
    torch.manual_seed(0)
    model = small_model(two_stage=True).train()
    losses = run_loss(model)
    assert {"enc.loss_cls", "enc.loss_bbox", "d0.loss_cls", "loss_cls", "loss_bbox"} <= set(losses)
    assert all(torch.isfinite(v) for v in losses.values())
    sum(losses.values()).backward()
    head = model.bbox_head
    for param in (head.enc_cls.weight, head.memory_proj[0].weight, head.pos_mlp.layers[0].weight):
        assert param.grad is not None and param.grad.abs().sum() > 0
    model.eval()
    data = model.data_preprocessor(random_batch(), False)
    with torch.no_grad():
        out = model(**data, mode="predict")
    assert out[0].pred_instances_3d.bboxes_3d.shape == (7, 9)


def test_two_stage_queries_start_at_best_proposals() -> None:
    """With zero proposal deltas the decoder starts at the centres of the top-k cells."""
    from npudet.bev.models import BEVDetrHead

    torch.manual_seed(0)
    head = BEVDetrHead(**TINY_HEAD, num_queries=5, bev_h=4, bev_w=6, two_stage=True)
    nn_init = torch.nn.init
    nn_init.zeros_(head.enc_reg.layers[1].weight)
    nn_init.zeros_(head.enc_reg.layers[1].bias)
    bev = torch.randn(2, 24, 16)
    logits, codes, memory = head.proposals(bev)
    query, _, ref, _ = head.initial_queries(bev)
    cells = bev_reference_points(4, 6, bev.device)
    torch.testing.assert_close(codes[..., :2], cells.expand(2, -1, -1))
    for b in range(2):
        best = logits[b].max(-1).values.argsort(descending=True)[:5]
        torch.testing.assert_close(ref[b], cells[best])
        torch.testing.assert_close(query[b], memory[b, best])


def _hungarian(code_weights):
    from mmdet.registry import TASK_UTILS

    return TASK_UTILS.build(
        dict(
            type="HungarianAssigner",
            match_costs=[
                dict(type="FocalLossCost", weight=2.0),
                dict(type="BEVBoxL1Cost", weight=0.25, code_weights=code_weights),
            ],
        )
    )


def test_bev_box_cost_weights_make_matching_geometric() -> None:
    """mmdet's HungarianAssigner with the BEV code cost: a heavy (u, v) weight matches by
    position, equal weights by size; a wrong number of weights is refused."""
    from npudet.bev.models import BEVBoxL1Cost

    targets = torch.tensor([[0.2, 0.2] + [0.0] * 8, [0.8, 0.8] + [0.0] * 8])
    # query 0 sits on target 0 but has target 1's size; query 1 the other way round
    codes = torch.tensor([[0.2, 0.2, 0, 2.0] + [0.0] * 6, [0.8, 0.8, 0, -2.0] + [0.0] * 6])
    targets[0, 3], targets[1, 3] = -2.0, 2.0
    preds = InstanceData(scores=torch.zeros(2, 1), bboxes=codes)
    gts = InstanceData(labels=torch.zeros(2, dtype=torch.long), bboxes=targets)
    cost = BEVBoxL1Cost(code_weights=[1.0] * 8, weight=0.5)(preds, gts)
    torch.testing.assert_close(cost, 0.5 * torch.tensor([[4.0, 1.2], [1.2, 4.0]]))
    assert (_hungarian([1.0] * 8).assign(preds, gts).gt_inds - 1).tolist() == [1, 0]
    geometric = _hungarian([10.0, 10.0] + [1.0] * 6)
    assert (geometric.assign(preds, gts).gt_inds - 1).tolist() == [0, 1]
    with pytest.raises(ValueError, match="code_weights: expected 1 to 10"):
        BEVBoxL1Cost(code_weights=[1.0] * 11)


def test_head_losses_are_mmdets_built_from_config() -> None:
    """The head's loss goes through mmdet's FocalLoss, L1Loss and HungarianAssigner."""
    from mmdet.models.losses import FocalLoss, L1Loss
    from mmdet.models.task_modules import FocalLossCost, HungarianAssigner

    from npudet.bev.models import BEVBoxL1Cost

    torch.manual_seed(0)
    model = small_model().eval()  # eval: batch norm statistics stay as they are between runs
    head = model.bbox_head
    assert type(head.loss_cls) is FocalLoss and type(head.loss_bbox) is L1Loss
    assert type(head.assigner) is HungarianAssigner
    assert [type(c) for c in head.assigner.match_costs] == [FocalLossCost, BEVBoxL1Cost]
    calls = {"assign": 0, "loss_cls": 0, "loss_bbox": 0}
    assign = head.assigner.assign

    def counted_assign(*args, **kwargs):
        calls["assign"] += 1
        return assign(*args, **kwargs)

    head.assigner.assign = counted_assign
    for name in ("loss_cls", "loss_bbox"):
        getattr(head, name).register_forward_hook(
            lambda *_, key=name: calls.__setitem__(key, calls[key] + 1)
        )
    torch.manual_seed(0)
    losses = run_loss(model)
    layers, samples = len(head.decoder), 2
    assert calls == {"assign": layers * samples, "loss_cls": layers, "loss_bbox": layers}
    # the configured loss weight reaches mmdet's FocalLoss: doubling it doubles loss_cls only
    head.loss_cls.loss_weight *= 2
    torch.manual_seed(0)
    doubled = run_loss(model)
    torch.testing.assert_close(doubled["loss_cls"], 2 * losses["loss_cls"])
    torch.testing.assert_close(doubled["loss_bbox"], losses["loss_bbox"])


def test_head_refuses_bad_loss_and_train_cfg() -> None:
    from npudet.bev.models import BEVDetrHead

    kw = dict(TINY_HEAD, num_queries=4)
    with pytest.raises(ValueError, match="loss_cls: the head scores classes by sigmoid"):
        BEVDetrHead(**kw, loss_cls=dict(type="CrossEntropyLoss", use_sigmoid=False))
    with pytest.raises(ValueError, match="train_cfg: expected an 'assigner'"):
        BEVDetrHead(**kw, train_cfg=dict(sampler=None))
    with pytest.raises(ValueError, match="code_weights: expected 10"):
        BEVDetrHead(**kw, code_weights=[1.0] * 8)
