"""Temporal self-attention: the ego-motion alignment of the previous BEV, the no-history
switch, and dev/tools/bev_temporal_ablation.py end to end on a tiny set."""

from __future__ import annotations

import copy
import json
import math
import os

import numpy as np
import pytest
import torch
from bev_util import random_batch, small_model, tiny_bev_set, tiny_encoder
from plugin_util import ROOT, run_tool

from npudet.bev.models import BEVFormer
from npudet.bev.models.temporal_self_attention import ego_motion

# 1 m cells on a grid 20 wide (x) and 16 tall (y): a row / column mix-up cannot pass
PC_RANGE = (-10.0, -8.0, -2.0, 10.0, 8.0, 2.0)
BEV_H, BEV_W = 16, 20


def pose(x: float, y: float, yaw: float) -> torch.Tensor:
    """ego2global (4, 4) float64 of an ego at global (x, y) heading ``yaw`` (CCW from +x)."""
    m = torch.eye(4, dtype=torch.float64)
    c, s = math.cos(yaw), math.sin(yaw)
    m[:2, :2] = torch.tensor([[c, -s], [s, c]], dtype=torch.float64)
    m[:2, 3] = torch.tensor([x, y], dtype=torch.float64)
    return m


def cell_of(xy) -> int:
    """Index (row * W + col) of the BEV cell holding the ego-frame point ``xy``, from the
    grid's definition (x along columns, y along rows over PC_RANGE)."""
    col = math.floor((xy[0] - PC_RANGE[0]) / (PC_RANGE[3] - PC_RANGE[0]) * BEV_W)
    row = math.floor((xy[1] - PC_RANGE[1]) / (PC_RANGE[4] - PC_RANGE[1]) * BEV_H)
    assert 0 <= col < BEV_W and 0 <= row < BEV_H, xy
    return row * BEV_W + col


def align(prev_map: torch.Tensor, ego_cur: torch.Tensor, ego_prev: torch.Tensor) -> torch.Tensor:
    """The previous frame's BEV (1, Q, C) as the encoder's temporal self-attention reads it
    at the current cells (1, Q, C): the encoder's geometry (poses -> previous-frame reference
    points) and the TSA layer's sampling, with zero learned offsets, a single point and
    identity projections, so the layer returns exactly what it sampled."""
    c = prev_map.shape[-1]
    one = dict(num_heads=1, num_cams=1, sca_points=1, tsa_points=1, num_z=1)
    enc = tiny_encoder((BEV_H, BEV_W), c, pc_range=PC_RANGE, ffn_dims=c, **one).eval()
    tsa = enc.layers[0].tsa
    with torch.no_grad():
        for linear in (tsa.sampling_offsets, tsa.attention_weights):
            linear.weight.zero_()
            linear.bias.zero_()
        for linear in (tsa.value_proj, tsa.output_proj):
            linear.weight.copy_(torch.eye(c))
            linear.bias.zero_()
        bev = enc.geometry(1, prev_map.device, ego_motion(ego_cur[None], ego_prev[None]))
        query = torch.zeros_like(prev_map)
        out = tsa(query, bev.ref, bev.ref_prev, bev.hw, prev_map)
    # TSA averages its two queue entries; the current one (zero queries) adds nothing
    return 2.0 * out


def test_static_point_stays_after_ego_move_and_turn() -> None:
    """A one-hot feature at a static world point's cell in frame t-1 peaks at that point's
    cell in frame t after the ego drove 3.1 m and turned 30 degrees."""
    turn = math.radians(30.0)
    p_cur, p_prev = np.array([2.5, 3.5]), np.array([3.5, 4.5])  # cell centres in both frames
    rot = np.array([[math.cos(turn), -math.sin(turn)], [math.sin(turn), math.cos(turn)]])
    shift = p_prev - rot @ p_cur  # the move (in the t-1 ego frame) that puts the point there
    ego_prev = pose(120.0, -40.0, 0.7)
    ego_cur = ego_prev @ pose(shift[0], shift[1], turn)
    world = ego_prev @ torch.tensor([*p_prev, 0.0, 1.0], dtype=torch.float64)
    # the same world point, seen from the new pose: p_cur
    torch.testing.assert_close(
        torch.linalg.solve(ego_cur, world)[:2], torch.from_numpy(p_cur), atol=1e-9, rtol=0
    )
    assert cell_of(p_cur) != cell_of(p_prev)  # without alignment the peak would be wrong

    prev_map = torch.zeros(1, BEV_H * BEV_W, 2)
    prev_map[0, cell_of(p_prev)] = torch.tensor([1.0, -3.0])
    aligned = align(prev_map, ego_cur, ego_prev)
    assert int(aligned[0, :, 0].argmax()) == cell_of(p_cur)
    torch.testing.assert_close(aligned[0, cell_of(p_cur)], prev_map[0, cell_of(p_prev)])
    others = torch.cat([aligned[0, : cell_of(p_cur), 0], aligned[0, cell_of(p_cur) + 1 :, 0]])
    assert float(others.max()) < 0.25  # neighbours get only bilinear tails


def test_identity_move_keeps_the_map() -> None:
    torch.manual_seed(0)
    prev_map = torch.randn(1, BEV_H * BEV_W, 3)
    ego = pose(-7.0, 31.0, -2.2)
    torch.testing.assert_close(align(prev_map, ego, ego), prev_map, atol=1e-5, rtol=0)


def test_quarter_turn_moves_every_cell() -> None:
    """A 90 degree turn with a whole-cell move maps cell centres onto cell centres: every
    current cell reads the previous cell of its world point, and 0 where that point was
    outside the previous grid."""
    torch.manual_seed(0)
    prev_map = torch.randn(1, BEV_H * BEV_W, 3)
    ego_prev = pose(5.0, 5.0, 0.3)
    move = pose(3.0, -2.0, math.pi / 2)
    ego_cur = ego_prev @ move
    expected = torch.zeros_like(prev_map)
    inside = 0
    for row in range(BEV_H):
        for col in range(BEV_W):
            p_cur = (PC_RANGE[0] + col + 0.5, PC_RANGE[1] + row + 0.5, 0.0, 1.0)
            x, y = (move @ torch.tensor(p_cur, dtype=torch.float64))[:2].tolist()
            if PC_RANGE[0] < x < PC_RANGE[3] and PC_RANGE[1] < y < PC_RANGE[4]:
                expected[0, row * BEV_W + col] = prev_map[0, cell_of((x, y))]
                inside += 1
    assert 0 < inside < BEV_H * BEV_W
    torch.testing.assert_close(align(prev_map, ego_cur, ego_prev), expected, atol=1e-5, rtol=0)


def _bev(model, batch) -> torch.Tensor:
    data = model.data_preprocessor(copy.deepcopy(batch), False)
    with torch.no_grad():
        return model.obtain_bev(data["inputs"], data["data_samples"])[0]


def _last_frame_only(batch: dict) -> dict:
    out = copy.deepcopy(batch)
    for item in out["inputs"]:
        item["imgs"] = item["imgs"][-1:]
    for sample in out["data_samples"]:
        meta = {k: sample.metainfo[k][-1:] for k in ("lidar2img", "ego2global", "prev_exists")}
        sample.set_metainfo(meta)
    return out


def test_no_history_switch_uses_no_earlier_frame() -> None:
    """``use_temporal=False``: the BEV does not depend on the earlier frame's images or pose,
    equals the BEV of the last frame alone, and temporal self-attention gets no previous
    BEV; with the switch on, a sample with a valid earlier frame does depend on it."""
    torch.manual_seed(0)
    model = small_model().eval()
    batch = random_batch(b=2, t=2, n=2)  # sample 0 has a valid earlier frame, sample 1 not
    altered = copy.deepcopy(batch)
    gen = torch.Generator().manual_seed(5)
    for item in altered["inputs"]:
        item["imgs"][0] = torch.randint(0, 255, item["imgs"][0].shape, generator=gen).to(
            torch.uint8
        )
    for sample in altered["data_samples"]:
        ego = sample.metainfo["ego2global"].copy()
        ego[0, :2, 3] += (4.0, -3.0)
        sample.set_metainfo(dict(ego2global=ego))

    temporal = _bev(model, batch)
    assert not torch.allclose(_bev(model, altered)[0], temporal[0])

    model.use_temporal = False
    prev_args = []
    tsa = model.encoder.layers[0].tsa
    handle = tsa.register_forward_pre_hook(lambda _, args: prev_args.append(args[4]))
    none = _bev(model, batch)
    handle.remove()
    assert prev_args == [None]  # one encoder pass, no previous BEV
    torch.testing.assert_close(_bev(model, altered), none, atol=0, rtol=0)
    torch.testing.assert_close(_bev(model, _last_frame_only(batch)), none, atol=0, rtol=0)
    # sample 1 has no valid earlier frame: the temporal path already fell back to no history
    torch.testing.assert_close(temporal[1], none[1])
    assert not torch.allclose(temporal[0], none[0])


def test_bad_switch_and_unaligned_history_refused() -> None:
    with pytest.raises(TypeError, match="use_temporal: expected True or False"):
        BEVFormer(backbone={}, neck={}, encoder={}, bbox_head={}, use_temporal="yes")
    enc = small_model().encoder
    feats = [torch.zeros(1, 2, 32, 2, 3)]
    with pytest.raises(ValueError, match="prev_bev: given without cur2prev"):
        enc(feats, torch.eye(4).expand(1, 2, 4, 4), (32, 48), prev_bev=torch.zeros(1, 64, 32))


@pytest.mark.dev
@pytest.mark.timeout(300)
def test_temporal_ablation_tool_tiny(tmp_path) -> None:
    """One command trains the small BEV config with and without history (1 epoch of 2
    iterations each on a 1-scene set), evaluates both with the config's metric and writes
    the table; the no-history run's dumped config has the switch off and no queue."""
    from mmengine.config import Config

    data_root = f"{tmp_path}/bev/"
    tiny_bev_set(data_root)
    work = tmp_path / "ablation"
    roots = [f"{k}_dataloader.dataset.data_root={data_root}" for k in ("train", "val", "test")]
    schedule = [
        "train_cfg.max_epochs=1",
        "train_cfg.val_interval=1",
        "param_scheduler.1.T_max=1",
        "param_scheduler.1.end=1",
    ]
    proc = run_tool(
        [
            "dev/tools/bev_temporal_ablation.py",
            f"{ROOT}/configs/bev/bev-small_r18_synthetic.py",
            "--work-dir",
            str(work),
            "--cfg-options",
            *roots,
            *schedule,
        ],
        timeout=280,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with open(work / "temporal_ablation.json") as f:
        runs = json.load(f)["runs"]
    assert list(runs) == ["temporal", "no_history"]
    for rec in runs.values():
        assert rec["iters"] == 2 and rec["sec_per_iter"] > 0
        assert 0 <= rec["mAP"] <= 1 and 0 <= rec["NDS"] <= 1
        assert rec["mATE"] > 0 and rec["mAVE"] > 0
        assert rec["moving_n"] >= 0 and rec["static_n"] >= 0  # the velocity split ran
        assert {"moving_true_speed", "moving_pred_speed", "static_pred_speed"} <= set(rec)
    table = (work / "temporal_ablation.md").read_text()
    assert "| moving: true / predicted speed, along truth (m/s) |" in table
    assert table in proc.stdout
    assert "| temporal | 1 frame(s) |" in table and "| no_history | none |" in table
    assert f"| {runs['temporal']['mAP']:.4f} |" in table
    dumped = {run: Config.fromfile(str(work / run / "bev-small_r18_synthetic.py")) for run in runs}
    assert dumped["temporal"].model.use_temporal is True
    assert dumped["no_history"].model.use_temporal is False
    for key in ("train_dataloader", "val_dataloader", "test_dataloader"):
        assert dumped["temporal"][key].dataset.queue_length == 2
        assert dumped["no_history"][key].dataset.queue_length == 1


@pytest.mark.dev
def test_temporal_ablation_refuses_a_config_without_history(tmp_path) -> None:
    proc = run_tool(
        [
            "dev/tools/bev_temporal_ablation.py",
            os.path.join(ROOT, "configs", "bev", "bev-small_r18_synthetic.py"),
            "--work-dir",
            str(tmp_path / "w"),
            "--cfg-options",
            "train_dataloader.dataset.queue_length=1",
        ]
    )
    assert proc.returncode == 2
    assert "queue_length must be >= 2" in proc.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "w").exists()
