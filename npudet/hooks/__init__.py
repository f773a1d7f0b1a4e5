"""Training hooks, registered in mmdet's ``HOOKS``.

``custom_imports=dict(imports=['npudet.hooks'])`` then e.g.
``custom_hooks=[dict(type='MSDAProfilerHook')]``.
"""

from .msda_parity import MSDAParityError, MSDAParityHook, ParityResult, compare_call
from .msda_profiler import MSDAProfilerHook
from .non_finite_loss import NonFiniteLossError, NonFiniteLossHook
from .npu_setup import (
    NPUSetupHook,
    SetupAction,
    apply_device_setup,
    launch_env_setup,
    plan_device_setup,
)

__all__ = [
    "MSDAParityError",
    "MSDAParityHook",
    "MSDAProfilerHook",
    "ParityResult",
    "compare_call",
    "NonFiniteLossError",
    "NonFiniteLossHook",
    "NPUSetupHook",
    "SetupAction",
    "apply_device_setup",
    "launch_env_setup",
    "plan_device_setup",
]
