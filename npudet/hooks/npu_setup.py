"""``NPUSetupHook``: the process settings Ascend training of MSDA models needs, logged.

``plan_device_setup`` decides, as a pure function of the device type, the environment,
the importable packages and the run's facts (world size, whether the process group is
already up, the gradient clipping config), which actions to take; the hook applies them
in ``before_run`` only on an NPU and logs each one. On CPU/CUDA the plan is empty and
the hook logs that it changed nothing.

Actions on NPU:
- ``set_compile_mode``: binary kernels (``jit_compile=False``) unless ``NPUJITCompile`` is
  non-empty (mmengine's rule), so each new MSDA shape is not compiled again.
- ``allow_internal_format = False``: private formats (NC1HWC0, FRACTAL_NZ) off, so MSDA's
  gathers read ``value`` in the ND layout it was written in.
- ``clip_grad_norm_(foreach=False)``: the foreach norm fails with ``_foreach_norm ...
  internal format`` on NPU; the per-tensor loop does not. Only when clipping by norm.
- ``HCCL_CONNECT_TIMEOUT=1200`` with more than one rank: the first step compiles kernels,
  and ranks that finish early time out at the 120 s default. Set only if not already set,
  and only before the process group exists: ``launch_env_setup`` does it from
  ``tools/train.py`` before the Runner; the hook reports it if it is still missing.
- a note when ``mx_driving`` is missing: the ``npu_vendor`` MSDA is then unavailable.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, List, Mapping, MutableMapping, Optional

import torch
from mmdet.registry import HOOKS
from mmengine.dist import get_world_size
from mmengine.hooks import Hook
from mmengine.optim import OptimWrapperDict

from npudet.utils.device import current_device_type
from npudet.utils.packages import package_version

HCCL_CONNECT_TIMEOUT = "1200"
KINDS = ("compile_mode", "internal_format", "clip_foreach", "env", "note")


@dataclass(frozen=True)
class SetupAction:
    """One decision: ``kind`` (see ``KINDS``), what it sets, the value and why."""

    kind: str
    target: str
    value: Any
    reason: str


def plan_device_setup(
    device_type: str,
    env: Mapping[str, str],
    packages: Mapping[str, Optional[str]],
    world_size: int = 1,
    dist_initialized: bool = False,
    clip_grad: Optional[Mapping[str, Any]] = None,
) -> List[SetupAction]:
    """The setup actions for a run; [] off NPU.

    Args:
        device_type: ``"npu"``, ``"cuda"``, ``"cpu"``, ...
        env: the environment variables (e.g. ``os.environ``).
        packages: package name -> version, None (or absent) when it does not import.
        world_size: number of ranks.
        dist_initialized: whether the process group already exists.
        clip_grad: the optim wrapper's ``clip_grad`` config (None when not clipping).
    """
    if device_type != "npu":
        return []
    actions = [
        SetupAction(
            "compile_mode",
            "torch_npu.npu.set_compile_mode(jit_compile=...)",
            bool(env.get("NPUJITCompile", "")),
            "binary kernels unless NPUJITCompile is set (mmengine's rule): new MSDA "
            "shapes are not compiled again",
        ),
        SetupAction(
            "internal_format",
            "torch_npu.npu.config.allow_internal_format",
            False,
            "MSDA inputs stay in ND layout; private formats break clip_grad_norm_",
        ),
    ]
    if clip_grad and clip_grad.get("type", "norm") == "norm":
        actions.append(
            SetupAction(
                "clip_foreach",
                "optim_wrapper.clip_grad_kwargs['foreach']",
                False,
                "clip_grad_norm_'s foreach path raises '_foreach_norm ... internal format'",
            )
        )
    if world_size > 1 and "HCCL_CONNECT_TIMEOUT" not in env:
        too_late = "; the process group already exists: export it before launching"
        actions.append(
            SetupAction(
                "note" if dist_initialized else "env",
                "HCCL_CONNECT_TIMEOUT",
                HCCL_CONNECT_TIMEOUT,
                "first-step kernel compilation outlasts the 120 s default"
                + (too_late if dist_initialized else ""),
            )
        )
    if packages.get("mx_driving") is None:
        actions.append(
            SetupAction(
                "note",
                "mx_driving",
                None,
                "not importable: MSDA impl 'npu_vendor' unavailable, 'auto' takes the next",
            )
        )
    return actions


def apply_device_setup(actions: List[SetupAction], optim_wrapper: Any = None) -> None:
    """Carry out ``actions`` (``note`` ones are only reported); NPU actions need torch_npu."""
    wrappers = _wrappers(optim_wrapper)
    for action in actions:
        if action.kind == "compile_mode":
            import torch_npu

            torch_npu.npu.set_compile_mode(jit_compile=action.value)
        elif action.kind == "internal_format":
            import torch_npu

            torch_npu.npu.config.allow_internal_format = action.value
        elif action.kind == "clip_foreach":
            for wrapper in wrappers:
                if getattr(wrapper, "clip_grad_kwargs", None):
                    wrapper.clip_grad_kwargs["foreach"] = action.value
        elif action.kind == "env":
            os.environ.setdefault(action.target, str(action.value))


def launch_env_setup(
    device_type: Optional[str] = None, env: Optional[MutableMapping[str, str]] = None
) -> List[SetupAction]:
    """Apply the environment actions of the plan to ``env`` (default ``os.environ``) now.

    For launch scripts: call it before the Runner is built (``tools/train.py`` does), as
    mmengine creates the process group in the Runner's constructor and HCCL reads its
    variables then; the hook's ``before_run`` is too late for them. The number of ranks
    comes from ``WORLD_SIZE`` (set by torchrun / mmengine's launchers).
    """
    env = os.environ if env is None else env
    world_size = int(env.get("WORLD_SIZE") or 1)
    plan = plan_device_setup(device_type or current_device_type(), env, {}, world_size=world_size)
    actions = [action for action in plan if action.kind == "env"]
    for action in actions:
        env.setdefault(action.target, str(action.value))
    return actions


def _wrappers(optim_wrapper: Any) -> List[Any]:
    if isinstance(optim_wrapper, OptimWrapperDict):
        return list(optim_wrapper.values())
    return [] if optim_wrapper is None or isinstance(optim_wrapper, dict) else [optim_wrapper]


@HOOKS.register_module()
class NPUSetupHook(Hook):
    """Apply ``plan_device_setup`` on NPU in ``before_run`` and log every action."""

    priority = "VERY_HIGH"

    def __init__(self) -> None:
        self.actions: List[SetupAction] = []
        self.device_type = ""

    def before_run(self, runner: Any) -> None:
        self.device_type = current_device_type()
        wrapper = getattr(runner, "optim_wrapper", None)
        norm_clipped = any(
            getattr(w, "clip_grad_kwargs", None) and w.grad_name == "grad_norm"
            for w in _wrappers(wrapper)
        )
        self.actions = plan_device_setup(
            self.device_type,
            os.environ,
            {name: package_version(name) for name in ("torch_npu", "mx_driving")},
            world_size=get_world_size(),
            dist_initialized=torch.distributed.is_available()
            and torch.distributed.is_initialized(),
            clip_grad={"type": "norm"} if norm_clipped else None,
        )
        if not self.actions:
            runner.logger.info(f"NPUSetupHook: device {self.device_type}, nothing to set up")
            return
        apply_device_setup(self.actions, wrapper)
        for action in self.actions:
            verb = "note" if action.kind == "note" else "set"
            runner.logger.info(
                f"NPUSetupHook: {verb} {action.target} = {action.value!r} ({action.reason})"
            )
