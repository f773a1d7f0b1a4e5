"""mmengine side of npudet that is not a hook: checkpoint loading, CLI and run checks.

Importing it (``custom_imports=dict(imports=['npudet.engine'])``, as the configs do)
allow-lists mmengine's checkpoint types for torch's weights-only loader, registers
every npudet hook by importing ``npudet.hooks`` and the CPU mixed-precision optim
wrapper (``amp``), and routes the op library's log lines (``auto``'s choice) to the run's
log (``msda_log``).
"""

import npudet.hooks  # noqa: F401  (registers the hooks the configs name)

from . import (
    amp,  # noqa: F401  (registers CPUAmpOptimWrapper)
    msda_log,
)
from .checkpoint import allow_mmengine_checkpoints

allow_mmengine_checkpoints()
msda_log.install()

__all__ = ["allow_mmengine_checkpoints"]
