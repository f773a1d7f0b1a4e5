"""mmengine 0.10.7's own tests that take NPU branches, run under the simulated NPU.

The copies in ``mmengine_0.10.7/`` (their README says where from) run in a child process with
``NPUDET_SIMULATED_NPU=1``: every test must pass, none may be skipped (a skip means the NPU
branch was not taken). None needs hardware the simulation lacks (``ops/npu_sim/README.md``).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from npu_sim_util import npu_env

COPIES = Path(__file__).parent / "mmengine_0.10.7"
# Each file with the tests of it that run: only the NPU class of the profiler hook's file.
SELECTED = {
    "test_device.py": "test_device.py",
    "test_profiler_hook.py": "test_profiler_hook.py::TestNPUProfilerHook",
    "test_amp.py": "test_amp.py",
    "test_instance_data.py": "test_instance_data.py",
}
# The NPU branches, by test id: each must have run and passed.
NPU_TESTS = {
    "test_device.py::test_get_device",
    "test_amp.py::TestAmp::test_autocast",
    *(
        f"test_profiler_hook.py::TestNPUProfilerHook::{name}"
        for name in ("test_init", "test_before_run", "test_after_train_iter", "test_with_runner")
    ),
}


def test_mmengine_npu_tests_pass_on_the_simulated_npu(tmp_path: Path) -> None:
    """Every selected mmengine test passes, the NPU ones among them, and none is skipped."""
    for name in SELECTED:
        (tmp_path / name).write_text((COPIES / f"{name}.txt").read_text())
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider"]
        + ["-o", "addopts=", "--rootdir", str(tmp_path), *SELECTED.values()],
        env=npu_env(),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    found = re.findall(r"^(PASSED|FAILED|ERROR|SKIPPED|XFAIL\w*) (\S+)", done.stdout, re.M)
    outcomes = {test: state for state, test in found}
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert set(outcomes.values()) == {"PASSED"}, tail
    assert NPU_TESTS <= set(outcomes), tail
