"""The head's velocity readout of the ego-motion-aligned previous BEV (HistoryVelocity)."""

from __future__ import annotations

import math

import pytest
import torch
from bev_util import PC_RANGE, random_batch, small_model

from npudet.bev.models import HistoryVelocity
from npudet.bev.models.temporal_self_attention import bev_reference_points, ego_motion

BEV_HW = (20, 20)  # 1 m cells over PC_RANGE's 20 m


def pose(x: float, y: float, yaw: float) -> torch.Tensor:
    m = torch.eye(4, dtype=torch.float64)
    m[:2, :2] = torch.tensor([[math.cos(yaw), -math.sin(yaw)], [math.sin(yaw), math.cos(yaw)]])
    m[:2, 3] = torch.tensor([x, y])
    return m[None]


def coordinate_readout(window: int = 3, step: float = 1.0) -> HistoryVelocity:
    """A readout whose projection passes 2 channels through: BEV features that are each
    cell's (x, y) in metres come back as the metric position of every window point."""
    hv = HistoryVelocity(2, PC_RANGE, window=window, step=step, dims=2)
    with torch.no_grad():
        hv.proj.weight.copy_(torch.eye(2))
        hv.proj.bias.zero_()
    return hv


def coordinate_map(hv: HistoryVelocity, batch: int = 1) -> torch.Tensor:
    """The readout's map (batch, 2, H, W) of a BEV whose cells hold their centre's (x, y) in
    metres."""
    x0, y0, _, x1, y1, _ = PC_RANGE
    ref = bev_reference_points(*BEV_HW, torch.device("cpu"))
    bev = (ref * torch.tensor([x1 - x0, y1 - y0]) + torch.tensor([x0, y0]))[None]
    return hv.project(bev.expand(batch, -1, -1), BEV_HW)


def to_uv(xy: torch.Tensor) -> torch.Tensor:
    x0, y0, _, x1, y1, _ = PC_RANGE
    return (xy - torch.tensor([x0, y0])) / torch.tensor([x1 - x0, y1 - y0])


def test_window_points_in_row_major_order() -> None:
    hv = coordinate_readout(window=3, step=1.5)
    centre = torch.tensor([[[1.2, -2.3]]])
    got = hv.window(to_uv(centre), coordinate_map(hv))[0, 0]
    d = torch.tensor([-1.5, 0.0, 1.5])
    dy, dx = torch.meshgrid(d, d, indexing="ij")
    expected = centre[0] + torch.stack([dx, dy], -1).view(-1, 2)
    torch.testing.assert_close(got, expected, atol=1e-4, rtol=0)


def test_static_point_at_the_centre_after_ego_move_and_turn() -> None:
    """A static world point read at its current position finds where it was in the previous
    frame; a point that moved d metres (ego frame) is found d away from the window's centre."""
    hv = coordinate_readout(window=5, step=1.0)
    prev, cur = pose(10.0, 5.0, 0.3), pose(12.0, 5.5, 0.45)  # 2 m forward, turned 8.6 degrees
    world = torch.tensor([[14.0, 8.0, 0.0, 1.0]], dtype=torch.float64).T
    in_cur = (torch.linalg.inv(cur[0]) @ world)[:2, 0].float()
    in_prev = (torch.linalg.inv(prev[0]) @ world)[:2, 0].float()
    got = hv.window(to_uv(in_cur[None, None]), coordinate_map(hv), ego_motion(cur, prev))[0, 0]
    torch.testing.assert_close(got[12], in_prev, atol=1e-4, rtol=0)  # the window's centre
    # an object now at in_cur that moved (+1, -2) m in the current ego frame since the
    # previous frame was at in_cur - (1, -2): the window point at offset (-1, +2)
    was = torch.cat([in_cur - torch.tensor([1.0, -2.0]), torch.tensor([0.0, 1.0])]).double()
    was_prev = (torch.linalg.inv(prev[0]) @ cur[0] @ was)[:2].float()
    torch.testing.assert_close(got[(2 + 2) * 5 + (2 - 1)], was_prev, atol=1e-4, rtol=0)


def test_without_a_previous_frame_the_window_stays_put() -> None:
    hv = coordinate_readout()
    prev, cur = pose(0.0, 0.0, 0.0), pose(3.0, 0.0, 0.2)
    centre = to_uv(torch.tensor([[[2.0, 1.0]]])).expand(2, 1, 2)
    valid = torch.tensor([True, False])
    got = hv.window(
        centre,
        coordinate_map(hv, 2),
        ego_motion(cur, prev).expand(2, -1, -1),
        valid,
    )
    torch.testing.assert_close(got[1, 0, 4], torch.tensor([2.0, 1.0]), atol=1e-4, rtol=0)
    assert (got[0, 0, 4] - torch.tensor([2.0, 1.0])).abs().max() > 1.0


@pytest.mark.parametrize(
    "kwargs, message",
    [(dict(window=4), "window: expected an odd"), (dict(step=0.0), "step: expected")],
)
def test_bad_options(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HistoryVelocity(8, PC_RANGE, **kwargs)


def test_head_velocity_comes_from_the_previous_bev() -> None:
    """Velocity is the readout's (it changes with the previous BEV, nothing else does) and
    the velocity loss trains the readout."""
    model = small_model(two_stage=True, history_velocity=dict(window=3, dims=4, hidden=16)).eval()
    bev = torch.randn(2, 64, 32)
    prev = torch.randn(2, 64, 32)
    poses = dict(cur2prev=ego_motion(pose(1.0, 0.0, 0.1), pose(0.0, 0.0, 0.0)).expand(2, -1, -1))
    with torch.no_grad():
        _, codes_a = model.bbox_head(bev, prev_bev=prev, **poses)
        _, codes_b = model.bbox_head(bev, prev_bev=prev + 1.0, **poses)
        _, codes_c = model.bbox_head(
            bev, prev_bev=prev + 1.0, **poses, prev_valid=torch.tensor([False, False])
        )
        _, codes_d = model.bbox_head(bev)
    for a, b in zip(codes_a[1:], codes_b[1:]):
        torch.testing.assert_close(a[..., :8], b[..., :8])
        assert (a[..., 8:] - b[..., 8:]).abs().max() > 1e-4
    # without a valid previous frame the current BEV stands in, as without history
    for c, d in zip(codes_c[1:], codes_d[1:]):
        torch.testing.assert_close(c, d)
    model.train()
    data = model.data_preprocessor(random_batch(), True)
    losses = model(**data, mode="loss")
    sum(v for k, v in losses.items() if "loss" in k).backward()
    grad = model.bbox_head.history_velocity.mlp.layers[-1].weight.grad
    assert grad is not None and grad.abs().sum() > 0
