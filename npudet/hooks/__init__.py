"""All of npudet's training hooks, registered in mmdet's ``HOOKS``.

``custom_imports=dict(imports=['npudet.plugin'])`` (which imports this package; or
``'npudet.hooks'`` for the hooks alone) then e.g.
``custom_hooks=[dict(type='MSDAProfilerHook')]``. MSDA hooks:
``MSDAProfilerHook``, ``MSDAParityHook``, ``NonFiniteLossHook``, ``NPUSetupHook``;
evaluation and run-state hooks: ``CocoSummaryHook``, ``EvalProgressHook``, ``RNGStateHook``,
``RunGuardHook`` (checkpoint on SIGINT / SIGTERM, a run that trains nothing fails) and
``CheckpointChecksumHook`` (``tools/train.py`` adds both, and ``NonFiniteLossHook``),
``AtomicCheckpointHook`` (mmengine's ``CheckpointHook`` saving atomically; ``tools/train.py``
uses it in its place); ``TorchCompileHook``
(``tools/train.py --compile``).
"""

from .atomic_checkpoint import AtomicCheckpointHook, CheckpointSaveError
from .coco_summary_hook import CocoSummaryHook, coco_table
from .eval_progress_hook import EvalProgressHook
from .msda_parity import CallParity, MSDAParityError, MSDAParityHook, compare_call
from .msda_profiler import MSDAProfilerHook
from .non_finite_loss import NonFiniteLossError, NonFiniteLossHook
from .npu_setup import (
    NPUSetupHook,
    SetupAction,
    apply_device_setup,
    launch_env_setup,
    plan_device_setup,
)
from .rng_state_hook import RNGStateHook
from .run_guard import (
    CheckpointChecksumHook,
    CheckpointCorruptError,
    NothingTrainedError,
    RunGuardHook,
    TrainingFailed,
    TrainingInterrupted,
    checkpoint_digest,
    train_keeping_progress,
    verify_checkpoint,
)
from .torch_compile import TorchCompileHook, compile_forward, compile_with_hook

__all__ = [
    "AtomicCheckpointHook",
    "CheckpointSaveError",
    "CallParity",
    "CheckpointChecksumHook",
    "CheckpointCorruptError",
    "NothingTrainedError",
    "RunGuardHook",
    "TrainingFailed",
    "TrainingInterrupted",
    "checkpoint_digest",
    "train_keeping_progress",
    "verify_checkpoint",
    "CocoSummaryHook",
    "EvalProgressHook",
    "MSDAParityError",
    "MSDAParityHook",
    "MSDAProfilerHook",
    "RNGStateHook",
    "coco_table",
    "compare_call",
    "NonFiniteLossError",
    "NonFiniteLossHook",
    "NPUSetupHook",
    "SetupAction",
    "TorchCompileHook",
    "apply_device_setup",
    "compile_forward",
    "compile_with_hook",
    "launch_env_setup",
    "plan_device_setup",
]
