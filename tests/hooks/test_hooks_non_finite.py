"""NonFiniteLossHook on a real Runner: a NaN loss stops (checkpoint intact) or is skipped."""

from __future__ import annotations

import os
from typing import List, Optional

import numpy as np
import pytest
import torch
from hooks_util import toy_runner

import npudet.hooks  # noqa: F401  (register)
from npudet.hooks import NonFiniteLossError

# Batch size 2, no shuffle: sample 8 is in the 5th iteration (runner.iter 4).
NAN_SAMPLE = 8


def _params(runner) -> dict:
    return {k: v.detach().clone() for k, v in runner.model.state_dict().items()}


def _runner(tmp_path, nan_at: List[int], checkpoint_interval: Optional[int] = None, **hook):
    """The toy runner for 6 iterations with a ``NonFiniteLossHook(**hook)``, the loss NaN on
    the samples ``nan_at``."""
    return toy_runner(
        str(tmp_path),
        [{"type": "NonFiniteLossHook", **hook}],
        max_iters=6,
        nan_at=nan_at,
        checkpoint_interval=checkpoint_interval,
    )


def test_stop_raises_before_the_step_and_keeps_the_checkpoint(tmp_path):
    runner = _runner(tmp_path, [NAN_SAMPLE], checkpoint_interval=2, action="stop")
    with pytest.raises(NonFiniteLossError, match=r"iteration 5.*loss_mse=nan.*iter_4\.pth"):
        runner.train()
    assert runner.iter == 4
    assert not os.path.exists(os.path.join(str(tmp_path), "iter_6.pth"))
    checkpoint = torch.load(os.path.join(str(tmp_path), "iter_4.pth"), weights_only=False)
    assert checkpoint["meta"]["iter"] == 4
    weights = _params(runner)
    for name, saved in checkpoint["state_dict"].items():
        assert torch.isfinite(saved).all(), name
        assert torch.equal(saved, weights[name]), f"{name} changed after the checkpoint"


def test_skip_drops_the_update_and_trains_on(tmp_path):
    runner = _runner(tmp_path, [NAN_SAMPLE], action="skip")
    runner.train()
    hook = next(h for h in runner.hooks if type(h).__name__ == "NonFiniteLossHook")
    assert runner.iter == 6 and hook.skipped == 1
    assert all(torch.isfinite(v).all() for v in _params(runner).values())
    history = runner.message_hub.get_scalar("train/loss_mse").data[0]
    assert len(history) == 5 and np.isfinite(history).all()  # the NaN is left out
    assert "update_params" not in runner.optim_wrapper.__dict__  # unpatched after training


def test_skip_stops_after_too_many_in_a_row(tmp_path):
    # NaN in the 4th and 5th iterations
    runner = _runner(tmp_path, [6, 8], action="skip", max_consecutive_skips=1)
    with pytest.raises(NonFiniteLossError, match="1 consecutive updates skipped"):
        runner.train()
    assert runner.iter == 4


def test_bad_action_is_refused():
    from npudet.hooks import NonFiniteLossHook

    with pytest.raises(ValueError, match="action"):
        NonFiniteLossHook(action="ignore")
