"""``MergedGroupsOptimWrapperConstructor`` trains as mmengine's default constructor does, bit
for bit, and its checkpoints resume both ways with stock's (``optimizer.state_dict()``, the
param schedulers, ``Runner.resume``)."""

from __future__ import annotations

import copy
from typing import Any, Dict, List, Optional

import pytest
import torch
import torch.nn.functional as F
from mmengine.model import BaseModel
from mmengine.optim import DefaultOptimWrapperConstructor, OptimWrapper
from mmengine.optim.scheduler import LinearLR, MultiStepLR
from mmengine.runner import Runner
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.data import Dataset

from npudet.engine.merged_groups import (
    MergedGroupsOptimWrapperConstructor,
    merge_param_groups,
)

# Deformable DETR's optimizer (mmdet's config), clip_grad included; foreach as torch chooses
# on an accelerator (on CPU its default is a per-parameter loop, which merging cannot shorten)
OPTIM_WRAPPER = dict(
    type="OptimWrapper",
    optimizer=dict(type="AdamW", lr=2e-4, weight_decay=1e-4, foreach=True),
    clip_grad=dict(max_norm=0.1, norm_type=2),
    paramwise_cfg=dict(
        custom_keys={
            "backbone": dict(lr_mult=0.1),
            "sampling_offsets": dict(lr_mult=0.1),
            "reference_points": dict(lr_mult=0.1),
        }
    ),
)


class Toy(BaseModel):
    """A backbone, an attention with ``sampling_offsets`` / ``reference_points`` and a head:
    (n, 4) -> a regression loss."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8))
        self.attn = nn.ModuleDict(
            dict(sampling_offsets=nn.Linear(8, 8), reference_points=nn.Linear(8, 8))
        )
        self.head = nn.Linear(8, 2)

    def forward(
        self, x: torch.Tensor, y: torch.Tensor, mode: str = "loss"
    ) -> Dict[str, torch.Tensor]:
        h = self.backbone(x)
        h = h + self.attn["sampling_offsets"](h).tanh() * self.attn["reference_points"](h)
        return {"loss": F.mse_loss(self.head(h), y)}


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while it is on."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self.ops += 1
        return func(*args, **(kwargs or {}))


def build(merged: bool, model: nn.Module) -> OptimWrapper:
    cfg = copy.deepcopy(OPTIM_WRAPPER)
    cls = MergedGroupsOptimWrapperConstructor if merged else DefaultOptimWrapperConstructor
    return cls(cfg, cfg.pop("paramwise_cfg"))(model)


def batch(step: int) -> Dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(step)
    return dict(x=torch.randn(5, 4, generator=gen), y=torch.randn(5, 2, generator=gen))


def train(merged: bool, steps: int = 3, resume_from: Optional[Dict] = None) -> Dict[str, Any]:
    """``steps`` AdamW steps with clip_grad under LinearLR + MultiStepLR; the losses, the
    per-parameter lr at each step, the parameters and the optimizer's state_dict."""
    torch.manual_seed(0)
    model = Toy()
    wrapper = build(merged, model)
    schedulers = [
        LinearLR(wrapper, start_factor=0.5, begin=0, end=2, by_epoch=False),
        MultiStepLR(wrapper, milestones=[2], gamma=0.1, by_epoch=False),
    ]
    first = 0
    if resume_from is not None:
        model.load_state_dict(resume_from["model"])
        wrapper.load_state_dict(resume_from["optimizer"])
        for scheduler, state in zip(schedulers, resume_from["schedulers"]):
            scheduler.load_state_dict(state)
        first = resume_from["steps"]
    losses: List[torch.Tensor] = []
    lrs: List[List[float]] = []
    hook_calls, counter = [], OpCounter()
    wrapper.optimizer.register_step_post_hook(lambda *args: hook_calls.append(1))
    for step in range(first, steps):
        loss = model(**batch(step))["loss"]
        wrapper.backward(loss)
        with counter:  # the step's ops: clip_grad's and the optimizer's
            wrapper.step()
        wrapper.zero_grad()
        losses.append(loss.detach())
        lrs.append([g["lr"] for g in wrapper.optimizer.param_groups])
        for scheduler in schedulers:
            scheduler.step()
    return dict(
        losses=losses,
        lrs=lrs,
        params=[p.detach().clone() for p in model.parameters()],
        model=copy.deepcopy(model.state_dict()),
        optimizer=copy.deepcopy(wrapper.state_dict()),
        schedulers=[s.state_dict() for s in schedulers],
        steps=steps,
        step_ops=counter.ops,
        hook_calls=len(hook_calls),
        groups=(
            len(wrapper.optimizer.param_groups),
            len(merge_param_groups(wrapper.optimizer.param_groups)),
        ),
    )


def assert_same_training(a: Dict[str, Any], b: Dict[str, Any]) -> None:
    assert all(torch.equal(x, y) for x, y in zip(a["losses"], b["losses"], strict=True))
    assert a["lrs"] == b["lrs"]
    assert all(torch.equal(x, y) for x, y in zip(a["params"], b["params"], strict=True))


def assert_same_state(a: Dict, b: Dict) -> None:
    """Two optimizer state_dicts are equal: the same groups (settings, parameter indices)
    and the same per-parameter state, bit for bit."""
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for index, state in a["state"].items():
        assert state.keys() == b["state"][index].keys()
        assert all(torch.equal(v, b["state"][index][k]) for k, v in state.items())


def test_trains_and_saves_as_stock_bit_for_bit() -> None:
    stock, merged = train(False), train(True)
    # one group per parameter (10), stepped as two: lr 2e-4 and lr_mult 0.1's 2e-5
    assert stock["groups"] == (10, 2) and merged["groups"] == (10, 2)
    assert merged["step_ops"] < stock["step_ops"] / 2, (merged["step_ops"], stock["step_ops"])
    assert stock["hook_calls"] == merged["hook_calls"] == 3  # torch's step hooks run once
    # the schedulers move each group's lr: 0.5x (LinearLR's start), 1x, MultiStepLR's 0.1x
    assert [lrs[0] for lrs in stock["lrs"]] == pytest.approx([1e-5, 2e-5, 2e-6])  # backbone
    assert [lrs[-1] for lrs in stock["lrs"]] == pytest.approx([1e-4, 2e-4, 2e-5])  # head
    assert_same_training(stock, merged)
    assert_same_state(stock["optimizer"], merged["optimizer"])


@pytest.mark.parametrize("saved_by, resumed_by", [(False, True), (True, False)])
def test_resumes_the_other_ones_checkpoint(saved_by: bool, resumed_by: bool) -> None:
    """Saved after 2 steps by one, resumed for the 3rd by the other: as 3 uninterrupted."""
    reference = train(resumed_by)
    resumed = train(resumed_by, resume_from=train(saved_by, steps=2))
    assert all(torch.equal(x, y) for x, y in zip(reference["params"], resumed["params"]))
    assert_same_state(reference["optimizer"], resumed["optimizer"])


def test_refuses_an_optimizer_it_cannot_merge() -> None:
    cfg = dict(type="OptimWrapper", optimizer=dict(type="LBFGS", lr=1.0))
    with pytest.raises(TypeError, match="optim_wrapper.optimizer.type: .*got LBFGS"):
        MergedGroupsOptimWrapperConstructor(cfg)(Toy())


class Samples(Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        return {k: v[0] for k, v in batch(index).items()}


def run(work_dir: str, merged: bool, resume: Optional[str] = None) -> Runner:
    """A Runner training :class:`Toy` 4 iterations, a checkpoint every 2."""
    optim_wrapper = copy.deepcopy(OPTIM_WRAPPER)
    if merged:
        optim_wrapper["constructor"] = "MergedGroupsOptimWrapperConstructor"
    torch.manual_seed(0)
    runner = Runner(
        model=Toy(),
        work_dir=work_dir,
        experiment_name=f"{'merged' if merged else 'stock'}-{resume is not None}",
        train_dataloader=dict(
            dataset=Samples(),
            sampler=dict(type="DefaultSampler", shuffle=False),
            batch_size=2,
            collate_fn=dict(type="default_collate"),
            num_workers=0,
        ),
        optim_wrapper=optim_wrapper,
        param_scheduler=[
            dict(type="LinearLR", start_factor=0.5, begin=0, end=2, by_epoch=False),
            dict(type="MultiStepLR", milestones=[3], gamma=0.1, by_epoch=False),
        ],
        train_cfg=dict(by_epoch=False, max_iters=4),
        default_hooks=dict(
            checkpoint=dict(type="CheckpointHook", interval=2, by_epoch=False),
            logger=dict(type="LoggerHook", interval=100),
        ),
        resume=resume is not None,
        load_from=resume,
        default_scope="mmengine",
        log_level="WARNING",
    )
    runner.train()
    return runner


def test_runner_resume_both_ways(tmp_path) -> None:
    """``Runner.resume`` of the other constructor's iteration-2 checkpoint ends where an
    uninterrupted run of 4 iterations does."""
    stock = run(str(tmp_path / "stock"), merged=False)
    merged = run(str(tmp_path / "merged"), merged=True)
    assert type(merged.optim_wrapper.optimizer).__name__ == "MergedGroupsAdamW"
    final = list(stock.model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(final, merged.model.parameters()))
    for saved_by, resumer in ((stock, True), (merged, False)):
        checkpoint = f"{saved_by.work_dir}/iter_2.pth"
        resumed = run(str(tmp_path / f"resumed-{resumer}"), merged=resumer, resume=checkpoint)
        assert resumed.iter == 4
        assert all(torch.equal(a, b) for a, b in zip(final, resumed.model.parameters()))
