"""mmengine checkpoints written with npudet.engine load with torch's weights-only loader."""

from __future__ import annotations

import io

import torch
from mmengine.logging import MessageHub

import npudet.engine  # noqa: F401


def test_message_hub_round_trips_weights_only() -> None:
    hub = MessageHub.get_instance("npudet-ckpt-test")
    hub.update_scalar("train/loss", 1.5)
    hub.update_scalar("train/loss", 2.0, 3)
    buf = io.BytesIO()
    torch.save({"state_dict": {"w": torch.ones(2)}, "meta": {"message_hub": hub.state_dict()}}, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)
    history = loaded["meta"]["message_hub"]["log_scalars"]["train/loss"]
    assert history.data[0].tolist() == [1.5, 2.0] and history.data[1].tolist() == [1, 3]
    assert history.mean() == 3.5 / 4
