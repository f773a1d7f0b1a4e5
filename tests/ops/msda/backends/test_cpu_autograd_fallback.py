"""The ``cpu`` kernel survives a C++ autograd node that cannot be built.

The node (``ops/msda_cpu/msda_cpu_autograd.cpp``) is a library of its own, written against
torch's internal autograd headers. Here its build is made to fail for real: a subprocess runs
with ``CXX`` set to a compiler wrapper that refuses that one source and passes everything
else to the real compiler, and with an extension cache that holds only the operator library
this process built (copied, so nothing else is rebuilt). The kernel must then serve through
the Python autograd kernel: ``cpu`` usable, outputs and gradients equal to ``grid_sample``'s,
forward-mode AD and second-order gradients still raising, and one warning saying why.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from npudet.ops import msda_impls
from npudet.ops.msda.backends import cpu_library
from npudet.ops.msda.kernels.native_build import CACHE_ENV, compiler

CHECK = Path(__file__).resolve().parent / "cpu_variant_check.py"


def _failing_compiler(path: Path) -> Path:
    """A compiler wrapper that fails on the autograd node's source, like a broken header."""
    path.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do case "$arg" in *msda_cpu_autograd.cpp)\n'
        '  echo "msda_cpu_autograd.cpp:1:1: error: forced by the test" >&2; exit 1;;\n'
        "esac; done\n"
        f'exec {shutil.which(compiler())} "$@"\n'
    )
    path.chmod(0o755)
    return path


@pytest.mark.skipif("cpu" not in msda_impls(), reason="no C++ compiler here")
def test_a_failed_node_build_leaves_the_kernel_serving_through_python_autograd(tmp_path):
    assert cpu_library.autograd() == "C++ node"  # this process: the normal route
    built = cpu_library.require().parent
    cache = tmp_path / "cache"
    shutil.copytree(built, cache / built.name)  # the operators only
    env = {**os.environ, CACHE_ENV: str(cache), "CXX": str(_failing_compiler(tmp_path / "cxx"))}
    env["NPUDET_CPU_ISA"] = cpu_library.isa()
    done = subprocess.run(
        [sys.executable, str(CHECK)], env=env, capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert "cpu" in report["impls"] and report["isa"] == cpu_library.isa()
    assert report["autograd"].startswith("Python (building npudet_msda_cpu_autograd failed")
    assert "forced by the test" in report["autograd"]
    warned = [
        line for line in done.stderr.splitlines() if "C++ autograd node is unavailable" in line
    ]
    assert len(warned) == 1, done.stderr[-3000:]
    # The operator library was reused, not rebuilt; the node's build was tried and failed.
    assert sorted(p.name.split("-")[0] for p in cache.iterdir()) == sorted(
        [built.name.split("-")[0], "npudet_msda_cpu_autograd"]
    )
    assert not list(cache.glob("npudet_msda_cpu_autograd-*/*.so"))
