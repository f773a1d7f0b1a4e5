"""``torch_npu.npu.utils``: what mmengine asks of the SoC."""

from __future__ import annotations

import os

# mmengine counts SoC versions >= 220 (Ascend 910B and later) as able to train in full
# precision, and forces AMP below. NPUDET_SIMULATED_NPU_SOC sets another value, e.g. 100 to
# take mmengine's forced-AMP branch.
DEFAULT_SOC_VERSION = 220


def get_soc_version() -> int:
    """The simulated SoC's version number (``NPUDET_SIMULATED_NPU_SOC``, default 220)."""
    value = os.environ.get("NPUDET_SIMULATED_NPU_SOC", "")
    if not value:
        return DEFAULT_SOC_VERSION
    if not value.isdigit():
        raise ValueError(f"NPUDET_SIMULATED_NPU_SOC: expected an integer, got {value!r}")
    return int(value)
