"""npudet on the oldest supported torch, 2.1.2 (slow: its own venv).

``.venv-torch21`` (``bash dev/tools/setup_oldtorch.sh``) holds torch 2.1.2 and npudet. Its python
runs ``oldest_torch_check.py`` (imports, the ``cpu`` kernel built with its C++ autograd node,
an ``MSDeformAttn`` layer through ``cpu`` against ``grid_sample``, the fake kernels), then the
op library's parity, gradcheck, property, autograd-mode, dispatch and compile tests, and, with
mmcv, mmengine and mmdet (``--plugin``), the plugin's tests. A venv without what a test needs
fails it, naming the command that makes it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import List, Sequence

import pytest

ROOT = Path(__file__).resolve().parents[2]
OLD_VENV = ROOT / ".venv-torch21"
OLD_PYTHON = OLD_VENV / "bin" / "python"
SETUP = "bash dev/tools/setup_oldtorch.sh"
OLDEST_TORCH = "2.1."
CHECK = Path(__file__).resolve().parent / "oldest_torch_check.py"
# The op library's tests that need torch only (no OpenMMLab); mmcv's route reports itself
# unavailable there and triton's too (torch 2.1 pins triton 2.1). torch 2.1's dynamo cannot
# trace the op whole: the fullgraph cases are strict xfails there (msda_util.DYNAMO_2_1).
OP_TESTS = [
    "tests/ops/msda/test_msda_dispatch.py",
    "tests/ops/msda/test_msda_compile.py",
    "tests/ops/msda/backends/test_msda_parity.py",
    "tests/ops/msda/test_msda_property.py",
    "tests/ops/msda/test_msda_autograd_modes.py",
    "tests/ops/msda/backends/test_cpu_autograd_fallback.py",
    "tests/ops/msda/test_msda_validation.py",
    "tests/ops/msda/test_msda_int64.py",
    "tests/ops/msda/test_msda_levels.py",
    "tests/ops/msda/backends/test_cpu_options.py",
]
# Not run on torch 2.1: the cost bound of auto's check (50 ms), set for the torch the default
# suite runs. torch 2.1's set_num_threads, which the check calls twice, costs about 17 ms a call
# on the loaded 2-core machine (profiled; under 1 ms on 2.13), so the check takes 50-130 ms.
OP_DESELECT = ["tests/ops/msda/test_msda_dispatch.py::test_check_on_cpu_costs_under_50ms"]
# The plugin in mmdet (``--plugin`` venv): the layers found and switched in mmdet's Deformable
# DETR, DINO and the BEV model; one training step of the small Deformable DETR and DINO through
# cpu and through grid_sample (same losses and gradients); every shipped config builds; an
# epoch of tools/train.py (2 iterations, evaluation, TensorBoard scalars).
PLUGIN_TESTS = [
    "tests/models/test_msda_switch.py",
    "tests/nn/test_msda_base.py",
    "tests/models/test_configs.py",
    "tests/tools/test_tensorboard.py",
]


def _old_python() -> str:
    if not OLD_PYTHON.is_file():
        pytest.fail(
            f"{OLD_PYTHON} is missing: run `{SETUP}` (torch 2.1.2, a few GB the first time)"
        )
    return str(OLD_PYTHON)


def _env() -> dict:
    """This checkout's npudet (and npudet_dev) first on the path; no pytest state of this
    process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    roots = [str(ROOT), str(ROOT / "dev")]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [*roots, env.get("PYTHONPATH")]))
    return env


@pytest.mark.slow
def test_op_library_and_nn_work_on_the_oldest_torch():
    done = subprocess.run(
        [_old_python(), str(CHECK)],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["torch"].startswith(OLDEST_TORCH), report
    assert report["autograd"] == "C++ node", report  # the shared_ptr branch of the node
    assert {"cpu", "gather", "grid_sample"} <= set(report["impls"]), report
    # triton is either usable or says why not; importing its backend never breaks.
    assert "triton" in report["impls"] or report["triton"], report
    assert report["meta_shapes"] == {"cpu": [2, 5, 32], "triton": [2, 5, 32]}, report
    assert report["layer_max_diff"] < 1e-4, report


def _pytest_in_old_venv(name: str, tests: List[str], deselect: Sequence[str] = ()) -> str:
    """Run ``tests`` with the old venv's pytest; its output (the tail is printed, with the
    time taken), after asserting that nothing failed and over ``MIN_PASSED`` passed."""
    began = time.monotonic()
    done = subprocess.run(
        [
            _old_python(),
            *("-m", "pytest", "-q", "-p", "no:cacheprovider", *tests),
            *(f"--deselect={test}" for test in deselect),
        ],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=3500,
    )
    log = done.stdout + done.stderr
    sys.stdout.write(f"{log[-3000:]}\n[torch 2.1 {name}: {time.monotonic() - began:.0f} s]\n")
    assert done.returncode == 0, log[-4000:]
    assert not re.search(r"\d+ (failed|error)", log), log[-4000:]
    return log


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_op_library_tests_pass_on_the_oldest_torch():
    log = _pytest_in_old_venv("op tests", OP_TESTS, OP_DESELECT)
    passed = re.search(r"(\d+) passed", log)
    assert passed and int(passed.group(1)) > 100, log[-4000:]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_plugin_tests_pass_on_the_oldest_torch():
    """npudet.plugin in mmdet on torch 2.1.2: ``PLUGIN_TESTS`` in the venv made with
    ``--plugin`` (mmcv 2.1.0 built against that torch, mmengine 0.10.7, mmdet 3.3.0)."""
    probe = subprocess.run(
        [_old_python(), "-c", "import mmcv.ops, mmdet, npudet.plugin"],
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.fail(
            f"the plugin does not import in {OLD_VENV.name} (run `{SETUP} --plugin`, which "
            f"builds mmcv against torch 2.1, over 10 min): {probe.stderr.strip()[-500:]}"
        )
    log = _pytest_in_old_venv("plugin tests", PLUGIN_TESTS)
    passed = re.search(r"(\d+) passed", log)
    assert passed and int(passed.group(1)) >= 20, log[-4000:]
