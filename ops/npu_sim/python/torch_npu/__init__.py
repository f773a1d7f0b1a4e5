"""Stand-in for ``torch_npu`` on the simulated NPU (npudet's ``ops/npu_sim``).

Importing it loads the simulated device, as importing torch_npu loads Ascend's: ``npu`` is
what torch serves as ``torch.npu``, ``optim`` holds the fused optimizers' names, and
``_simulation`` (no part of torch_npu's API) builds and loads the native device and registers
``npu`` with torch. torch also imports it at ``import torch`` through the ``torch.backends``
entry point, as it does torch_npu. It is on ``sys.path`` only with ``NPUDET_SIMULATED_NPU=1``
(or in npudet's test fixture) and refuses to load where a real torch_npu is installed.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys

_HERE = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))


def _real_torch_npu() -> str:
    """Where another ``torch_npu`` is installed on ``sys.path``, or ""."""
    others = [p for p in sys.path if os.path.realpath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("torch_npu", others)
    if spec is None:
        return ""
    return spec.origin or ", ".join(spec.submodule_search_locations or [])


_real = _real_torch_npu()
if _real:
    raise ImportError(
        f"NPUDET_SIMULATED_NPU=1, but a real torch_npu is installed ({_real}): the simulated "
        "NPU refuses to stand in for it. Unset NPUDET_SIMULATED_NPU to use the real one."
    )

# As torch_npu does: autoload off while this package imports torch, so that `import torch_npu`
# before torch does not make torch's autoload import this half-initialised package again.
_ORG_AUTOLOAD = os.getenv("TORCH_DEVICE_BACKEND_AUTOLOAD", "1")
os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"

import torch  # noqa: E402,F401

from . import npu, optim  # noqa: E402,F401
from ._simulation import load  # noqa: E402

load(npu)

__version__ = "0+npudet.simulated"


def _autoload() -> None:
    """torch's device-backend autoload entry point (the import above did the work): restores
    the switch, which child processes inherit."""
    os.environ["TORCH_DEVICE_BACKEND_AUTOLOAD"] = _ORG_AUTOLOAD


# When `import torch_npu` comes first torch skips the autoload: restore the switch here too.
_autoload()
