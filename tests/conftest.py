"""Shared fixtures (a tiny generated shapes set) and the device the MSDA tests run on.

``NPUDET_TEST_DEVICE=cuda`` (or ``npu``) runs the parity, gradcheck, validation and
torch.compile tests on that device (``msda_util.DEVICE``); an unavailable device stops the
run before any test (checking it imports ``torch_npu``, which registers the ``npu`` device).
The run ends with a line listing which implementations ran on which device.
"""

from __future__ import annotations

import os

import pytest
import torch

# pytest's default import mode (prepend) puts this folder on sys.path before it imports this
# rootdir conftest, so the helper modules kept here, the ones tests of several folders share
# (msda_util, bev_util, ...), import as is; a helper of one folder's tests sits beside them
# (tests/README.md).
from msda_util import DEVICE, DEVICE_ENV, EXERCISED, PROPERTY_SEED
from npu_sim_util import preload

from npudet.utils.environment import device_problem

# On the CPU without a GPU, Triton kernels run under its interpreter on CPU tensors. Set
# before any kernel is decorated (npudet.ops.msda.kernels.triton is imported on first use);
# never for a device run, whose Triton kernels must be compiled for the device.
if DEVICE == "cpu" and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_configure(config: pytest.Config) -> None:
    preload()  # before any test runs a backward (see npu_sim_util.preload)
    problem = device_problem(DEVICE)
    if problem:
        raise pytest.UsageError(f"{DEVICE_ENV}={DEVICE}: device unavailable: {problem}")


def pytest_report_header(config: pytest.Config) -> str:
    return f"MSDA property tests: NPUDET_PROPERTY_SEED={PROPERTY_SEED}"


def pytest_terminal_summary(terminalreporter) -> None:
    terminalreporter.write_line(
        f"MSDA property tests ran with NPUDET_PROPERTY_SEED={PROPERTY_SEED}"
    )
    if not EXERCISED:
        return
    by_device = {}
    for impl, device in sorted(EXERCISED):
        by_device.setdefault(device, []).append(impl)
    listed = "; ".join(f"{device}: {', '.join(impls)}" for device, impls in by_device.items())
    terminalreporter.write_line(
        f"MSDA implementations run by device ({DEVICE_ENV}={DEVICE}): {listed}"
    )


@pytest.fixture(autouse=True)
def _fresh_call_plans():
    """Each test decides its MSDA calls afresh: many patch what ``auto`` decides on
    (priority lists, trust decisions, the loaded kernel), which a kept plan would not see."""
    from npudet.ops.msda import call_plan

    call_plan.clear()
    yield
    call_plan.clear()


@pytest.fixture(scope="session")
def tiny_shapes(tmp_path_factory: pytest.TempPathFactory) -> str:
    from npudet.datasets import make_shapes_dataset

    root = str(tmp_path_factory.mktemp("shapes"))
    make_shapes_dataset(root, num_train=8, num_val=4, seed=3)
    return root
