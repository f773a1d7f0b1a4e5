"""The environment variables that switch npudet's op library and device, checked in one place.

``tools/train.py`` / ``tools/test.py`` (their preflight) and ``tools/misc/check_device.py`` call
:func:`environment_problem` before any work; it lives here, not in ``npudet.engine``, because
the device check runs on machines without OpenMMLab.
"""

from __future__ import annotations

from typing import Optional

from npudet.utils.device import simulated_npu_problem

from .msda.backends.cpu_library import sanitize_requested
from .msda.kernels.triton_launch import forced_schedule


def environment_problem() -> Optional[str]:
    """The first of ``NPUDET_TRITON_SCHEDULE`` (cuda / ascend), ``NPUDET_CPU_SANITIZE`` (1 / 0)
    and ``NPUDET_SIMULATED_NPU`` (1 / 0) holding an undocumented value, as one line naming the
    variable, its value and what it takes; None when all are unset or documented."""
    try:
        forced_schedule()
    except ValueError as err:
        return str(err)
    sanitize = sanitize_requested()
    if isinstance(sanitize, str):
        return sanitize
    return simulated_npu_problem()
