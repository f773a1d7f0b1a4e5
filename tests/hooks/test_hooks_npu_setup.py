"""NPUSetupHook's decisions as a function of the device, and the hook on CPU/CUDA."""

from __future__ import annotations

import glob
import os

import pytest
import torch
from hooks_util import toy_runner
from mmengine.optim import OptimWrapper

import npudet.hooks  # noqa: F401  (register)
from npudet.hooks import apply_device_setup, launch_env_setup, plan_device_setup
from npudet.hooks.npu_setup import KINDS
from npudet.utils.device import current_device_type

NPU_PACKAGES = {"torch_npu": "2.6.0", "mx_driving": "1.0"}


def _kinds(actions):
    return [a.kind for a in actions]


@pytest.mark.parametrize("device", ["cpu", "cuda", "mps"])
def test_nothing_off_npu(device):
    plan = plan_device_setup(device, {}, NPU_PACKAGES, world_size=8, clip_grad={"max_norm": 1})
    assert plan == []


def test_npu_single_device_without_clipping():
    plan = plan_device_setup("npu", {}, NPU_PACKAGES)
    assert _kinds(plan) == ["compile_mode", "internal_format"]
    assert plan[0].value is False and plan[1].value is False
    assert all(a.kind in KINDS and a.reason for a in plan)


@pytest.mark.parametrize(
    "env, jit",
    [
        ({}, False),
        ({"NPUJITCompile": "1"}, True),
        ({"NPUJITCompile": "0"}, True),
        ({"NPUJITCompile": ""}, False),
    ],
)
def test_compile_mode_follows_mmengines_rule(env, jit):
    assert plan_device_setup("npu", env, NPU_PACKAGES)[0].value is jit


@pytest.mark.parametrize(
    "clip, expected",
    [
        ({"max_norm": 0.1}, True),
        ({"type": "norm", "max_norm": 0.1}, True),
        ({"type": "value", "clip_value": 1}, False),
        (None, False),
    ],
)
def test_foreach_workaround_only_when_clipping_by_norm(clip, expected):
    plan = plan_device_setup("npu", {}, NPU_PACKAGES, clip_grad=clip)
    assert ("clip_foreach" in _kinds(plan)) is expected


def test_hccl_timeout_for_several_ranks():
    assert "HCCL_CONNECT_TIMEOUT" not in [
        a.target for a in plan_device_setup("npu", {}, NPU_PACKAGES)
    ]
    env_action = plan_device_setup("npu", {}, NPU_PACKAGES, world_size=8)[-1]
    assert (env_action.kind, env_action.target, env_action.value) == (
        "env",
        "HCCL_CONNECT_TIMEOUT",
        "1200",
    )
    late = plan_device_setup("npu", {}, NPU_PACKAGES, world_size=8, dist_initialized=True)[-1]
    assert late.kind == "note" and "before launching" in late.reason
    preset = plan_device_setup("npu", {"HCCL_CONNECT_TIMEOUT": "600"}, NPU_PACKAGES, world_size=8)
    assert "HCCL_CONNECT_TIMEOUT" not in [a.target for a in preset]


def test_launch_env_setup_sets_hccl_before_the_runner():
    env = {"WORLD_SIZE": "4"}
    actions = launch_env_setup("npu", env)
    assert [a.target for a in actions] == ["HCCL_CONNECT_TIMEOUT"]
    assert env["HCCL_CONNECT_TIMEOUT"] == "1200"
    # Already set (by the user or the first call): left alone, nothing more to do.
    env["HCCL_CONNECT_TIMEOUT"] = "600"
    assert launch_env_setup("npu", env) == [] and env["HCCL_CONNECT_TIMEOUT"] == "600"
    assert launch_env_setup("npu", {"WORLD_SIZE": "1"}) == []
    assert launch_env_setup("cpu", {"WORLD_SIZE": "4"}) == []


def test_missing_vendor_library_is_noted():
    plan = plan_device_setup("npu", {}, {"torch_npu": "2.6.0"})
    assert plan[-1].kind == "note" and "npu_vendor" in plan[-1].reason


def test_apply_sets_foreach_and_env_only(monkeypatch):
    monkeypatch.delenv("HCCL_CONNECT_TIMEOUT", raising=False)
    wrapper = OptimWrapper(
        torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1), clip_grad={"max_norm": 1.0}
    )
    plan = plan_device_setup("npu", {}, NPU_PACKAGES, world_size=2, clip_grad={"max_norm": 1.0})
    # The torch_npu settings need an NPU; the others can be applied anywhere.
    apply_device_setup([a for a in plan if a.kind in ("clip_foreach", "env", "note")], wrapper)
    assert wrapper.clip_grad_kwargs == {"max_norm": 1.0, "foreach": False}
    assert os.environ["HCCL_CONNECT_TIMEOUT"] == "1200"


def test_hook_on_this_machine_logs_and_changes_nothing(tmp_path):
    if current_device_type() == "npu":
        pytest.skip("an NPU is present: the plan is not empty here")
    clip = {"max_norm": 1.0}
    hooks = [{"type": "NPUSetupHook"}]
    runner = toy_runner(str(tmp_path), hooks, max_iters=1, clip_grad=clip, log_level="INFO")
    runner.train()
    hook = next(h for h in runner.hooks if type(h).__name__ == "NPUSetupHook")
    assert hook.device_type == current_device_type() and hook.actions == []
    assert runner.optim_wrapper.clip_grad_kwargs == clip
    with open(glob.glob(os.path.join(runner.log_dir, "*.log"))[0]) as f:
        assert f"NPUSetupHook: device {hook.device_type}, nothing to set up" in f.read()
