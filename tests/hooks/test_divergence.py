"""Divergence stops the run with one line and keeps the last good checkpoint (issue 48, item 3).

``tools/train.py`` adds ``NonFiniteLossHook`` to every run (``guard_training``). A finite
blow-up (the toy model at a huge learning rate) stops before its update, so no checkpoint of
diverged weights rotates the good one out; NaN predictions stop the run before the matcher
(scipy's ``linear_sum_assignment``, as mmdet's ``HungarianAssigner`` calls it) dies on them.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from hooks_util import CHANNELS, toy_runner
from mmengine.config import Config
from mmengine.model import BaseModel
from scipy.optimize import linear_sum_assignment

import npudet.hooks  # noqa: F401  (register)
from npudet.engine.cli import TRAINING_HOOKS, guard_training
from npudet.hooks import NonFiniteLossError, NonFiniteLossHook


def _guarded(work: str) -> Config:
    """The hooks and checkpoint settings tools/train.py gives a run in ``work``."""
    checkpoint = dict(type="CheckpointHook", interval=2, by_epoch=False, max_keep_ckpts=1)
    cfg = Config(dict(work_dir=work, default_hooks=dict(checkpoint=checkpoint)))
    guard_training(cfg)
    return cfg


def test_train_py_adds_the_hook() -> None:
    assert "NonFiniteLossHook" in TRAINING_HOOKS


def test_a_finite_blow_up_stops_and_keeps_the_good_checkpoint(tmp_path) -> None:
    work = str(tmp_path)
    cfg = _guarded(work)
    hooks = [h for h in cfg.custom_hooks if h["type"] == "NonFiniteLossHook"]
    # lr 0.05 trains; 20 makes the loss grow by orders of magnitude per step, finite for a
    # while: without the check iteration 4 would save diverged weights over iter_2.pth.
    runner = toy_runner(
        work,
        hooks,
        max_iters=8,
        checkpoint_interval=2,
        checkpoint_options=cfg.default_hooks.checkpoint,
        lr=20.0,
    )
    with pytest.raises(NonFiniteLossError, match=r"diverged loss.*iter_2\.pth") as err:
        runner.train()
    assert "nan" not in str(err.value).split("(non-finite terms")[0]  # finite when caught
    assert runner.iter < 4 and os.listdir(work).count("iter_2.pth") == 1
    saved = torch.load(os.path.join(work, "iter_2.pth"), weights_only=False)["state_dict"]
    assert all(torch.isfinite(v).all() for v in saved.values())


def test_a_normal_run_is_not_taken_for_divergence(tmp_path) -> None:
    runner = toy_runner(str(tmp_path), [dict(type="NonFiniteLossHook")], max_iters=8)
    runner.train()
    assert runner.iter == 8


class _MatchedHead(torch.nn.Module):
    """Box predictions per query (``bbox_head``: where NonFiniteLossHook looks)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(CHANNELS, 4)

    def forward(self, query: torch.Tensor) -> torch.Tensor:
        return self.fc(query).sigmoid()


class _MatcherModel(BaseModel):
    """Predicts boxes and matches them to targets as mmdet's ``HungarianAssigner`` does."""

    def __init__(self) -> None:
        super().__init__()
        self.bbox_head = _MatchedHead()

    def init_weights(self) -> None:
        """Keep the weights the test set (the Runner initialises models before training)."""

    def forward(self, query, feats, target, mode: str = "loss"):
        boxes = self.bbox_head(query)
        gt = target[..., :4].sigmoid()
        loss = boxes.new_zeros(())
        for pred, truth in zip(boxes, gt):
            cost = torch.cdist(pred, truth, p=1).detach().numpy()
            rows, cols = linear_sum_assignment(cost)  # raises on NaN costs
            loss = loss + F.l1_loss(pred[rows], truth[cols])
        return {"loss_bbox": loss} if mode == "loss" else boxes


def test_nan_predictions_stop_before_the_matcher(tmp_path) -> None:
    model = _MatcherModel()
    runner = toy_runner(str(tmp_path), [dict(type="NonFiniteLossHook")], max_iters=4, model=model)
    with torch.no_grad():
        model.bbox_head.fc.bias[0] = float("nan")  # diverged weights
    # Before: ValueError "matrix contains invalid numeric entries" from inside the loss.
    with pytest.raises(
        NonFiniteLossError, match=r"non-finite predictions .*_MatchedHead at iteration 1"
    ):
        runner.train()
    # Outside training (validation, test) the hook is gone and the head is unchecked.
    assert not model.bbox_head._forward_hooks


def test_divergence_factor_is_checked() -> None:
    with pytest.raises(ValueError, match="divergence_factor: expected a number > 1"):
        NonFiniteLossHook(divergence_factor=0.5)


def test_a_zero_first_loss_is_no_reference() -> None:
    hook = NonFiniteLossHook()
    assert hook._divergence(torch.tensor(0.0)) is None and hook.first_loss is None
    assert hook._divergence(torch.tensor(2.0)) is None and hook.first_loss == 2.0
    assert hook._divergence(torch.tensor(1999.0)) is None
    assert "more than 1000 times the run's first loss (2;" in hook._divergence(torch.tensor(2001.0))
