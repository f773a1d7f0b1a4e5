"""mmengine side of npudet that is not a hook: checkpoint loading, CLI and run checks.

Importing it (``npudet.plugin`` does) allow-lists mmengine's checkpoint types for torch's
weights-only loader, registers the CPU mixed-precision optim wrapper (``amp``) and the optim
wrapper constructor that steps equal param groups together (``merged_groups``), and routes the
op library's log lines (``auto``'s choice) to the run's log (``msda_log``). The hooks are
registered by ``npudet.hooks``.
"""

from . import (
    amp,  # noqa: F401  (registers CPUAmpOptimWrapper)
    merged_groups,  # noqa: F401  (registers MergedGroupsOptimWrapperConstructor)
    msda_log,
)
from .checkpoint import allow_mmengine_checkpoints

allow_mmengine_checkpoints()
msda_log.install()

__all__ = ["allow_mmengine_checkpoints"]
