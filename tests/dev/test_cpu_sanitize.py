"""The CPU kernel under AddressSanitizer and UndefinedBehaviorSanitizer (slow: its own build).

``dev/tools/sanitize_cpu.sh`` builds the kernel with ``NPUDET_CPU_SANITIZE=1`` and runs the parity
and property tests of ``cpu`` (and ``auto``, which takes it) with the ASan runtime preloaded;
any sanitizer report aborts the run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Tests of the project's own machinery (dev/).
pytestmark = pytest.mark.dev

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_parity_and_property_tests_run_clean_under_sanitizers():
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    result = subprocess.run(
        ["bash", str(ROOT / "dev" / "tools" / "sanitize_cpu.sh"), "-x"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    log = result.stdout + result.stderr
    sys.stdout.write(log[-4000:])
    assert "[sanitize_cpu] testing the sanitized" in log, log[-4000:]  # not a fallback
    assert "ERROR: AddressSanitizer" not in log and "runtime error:" not in log
    assert result.returncode == 0, log[-4000:]
    assert " passed" in log and " failed" not in log
