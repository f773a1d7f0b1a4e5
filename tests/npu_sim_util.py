"""The simulated NPU (``ops/npu_sim``) in tests: in this process, or in child processes.

``simulated_npu`` (a fixture) loads it here the way ``NPUDET_SIMULATED_NPU=1`` does in a new
process, and hides it again afterwards: with the variable unset ``torch.npu.is_available()``
turns False, and ``torch_npu`` / ``mx_driving`` stop importing, so later tests see a machine
without an NPU. PyTorch cannot unregister a backend, so ``torch.npu`` itself stays. mmengine
decides once, at its import, whether an NPU exists; the fixture imports it first so that answer
stays "no" for the rest of the session (runs that must see the NPU through mmengine are child
processes).

``npu_env`` is the environment of such a child: the variable alone, as a user sets it; the
``.pth`` line that ``tools/setup.sh`` writes does the rest.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Dict, Iterator

import pytest

REPO = Path(__file__).resolve().parents[1]
SIM_PATH = REPO / "ops" / "npu_sim" / "python"
ENV = "NPUDET_SIMULATED_NPU"
_SIM_MODULES = ("torch_npu", "mx_driving")


def npu_env(**extra: str) -> Dict[str, str]:
    """``os.environ`` with the simulation on (and ``extra``), for a child process.

    The Triton interpreter is switched off by value, not by removing the variable: callers
    such as ``run_tool`` lay this dict over ``os.environ``, where the test session set it on,
    and an interpreted Triton on npu tensors would run every parity case for minutes.
    """
    env = dict(os.environ)
    env.update({ENV: "1", "PYTHONUNBUFFERED": "1", "TRITON_INTERPRET": "0"}, **extra)
    return env


def preload() -> None:
    """Register the simulated device in this process now, hidden until ``simulated_npu``.

    Autograd sizes its per-device queues at the process's first backward; a device type
    registered after that cannot run one (an internal assert in the engine). The device is
    hidden while the variable is unset. Where ``NPUDET_SIMULATED_NPU=1`` is set, torch already
    loaded it at import, visible.
    """
    if os.environ.get(ENV) == "1":
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(SIM_PATH))
        import torch_npu  # noqa: F401  (loads the device, as importing torch_npu does)

        _unimport()


def _unimport() -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in _SIM_MODULES:
            del sys.modules[name]


def _forget_packages() -> None:
    from npudet.utils import packages

    for name in _SIM_MODULES:
        packages._versions.pop(name, None)


@pytest.fixture
def simulated_npu(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """The simulated NPU in this process for one test; yields the ``torch_npu`` stand-in."""
    try:
        import mmengine.device  # noqa: F401  (decides "no NPU" before the device appears)
    except ImportError:
        pass
    monkeypatch.setenv(ENV, "1")  # shows the device; monkeypatch unsets it after the test
    monkeypatch.syspath_prepend(str(SIM_PATH))
    import torch_npu

    _forget_packages()
    try:
        yield torch_npu
    finally:
        _unimport()
        _forget_packages()
