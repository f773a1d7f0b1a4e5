"""The AOTInductor route: the op (``impl="cpu"``) exported with every size dynamic, compiled
into a ``.pt2`` package, and run by the C++ runner (``ops/aoti_runner/``) with no Python,
at sizes other than the export size, against eager PyTorch.

Cold (fresh inductor cache, runner not built) on the 2-core machine of 2026-12-06: packaging
42 s, the runner's build 23 s (then cached), both runs 1.5 s, 74 s in all (the command is in
docs/deploy.md): within the default run's ~90 s budget, so nothing here is ``slow``.
"""

from __future__ import annotations

import subprocess
import zipfile
from pathlib import Path

import pytest
import torch
from export_util import HEAD_DIM, HEADS, SIZES, OpFromMaps, op_dynamic_shapes, op_inputs

from npudet.deploy import aoti
from npudet.ops.msda import msda_impls
from npudet.ops.msda.backends import cpu_library
from npudet.ops.msda.kernels import native_build

PYTHON_LIBRARIES = ("libpython", "libtorch_python")

pytestmark = pytest.mark.skipif(
    "cpu" not in msda_impls() or native_build.compiler_missing() is not None,
    reason="needs the cpu kernel and a C++ compiler",
)


def _links_python(path: Path) -> list:
    return [name for name in aoti.linked_libraries(path) if name.startswith(PYTHON_LIBRARIES)]


@pytest.fixture(scope="module")
def runner() -> Path:
    return aoti.build_runner()


@pytest.fixture(scope="module")
def op_package(tmp_path_factory) -> Path:
    """The op's package, exported at SIZES[0]."""
    if cpu_library.unavailable_reason():
        pytest.skip(cpu_library.unavailable_reason())
    out = tmp_path_factory.mktemp("aoti") / "op.pt2"
    return aoti.package(OpFromMaps("cpu"), op_inputs(*SIZES[0], 0), op_dynamic_shapes(), out)


def test_runner_and_operator_library_link_no_python(runner: Path) -> None:
    """The runner and the library it loads name libtorch, never libpython/libtorch_python."""
    assert "libtorch_cpu.so" in aoti.linked_libraries(runner)
    assert _links_python(runner) == []
    for library in aoti.operator_libraries():
        assert _links_python(library) == [], library


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "expected 3 paths, got 0"),
        (["--load-library"], "--load-library needs a path"),
        (["--bogus", "a", "b", "c"], "unknown option --bogus"),
    ],
)
def test_runner_refuses_bad_arguments_in_one_line(runner: Path, argv, message) -> None:
    done = subprocess.run([str(runner), *argv], capture_output=True, text=True, env={})
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and message in done.stderr, done.stderr


def test_package_runs_in_the_cpp_runner_at_other_sizes(op_package: Path, runner: Path) -> None:
    """Batch 1 and 3 with other maps and query counts than the export's, through the C++
    runner (bare environment: no PYTHONPATH, no virtual environment), within 1e-5 of eager."""
    for n, size in enumerate(SIZES[1:], start=1):
        args = op_inputs(*size, seed=n)
        (got,) = aoti.run_package(op_package, args, runner=runner)
        batch, _, queries = size
        assert got.shape == (batch, queries, HEADS * HEAD_DIM)
        with torch.no_grad():
            for impl in ("cpu", "grid_sample"):
                torch.testing.assert_close(got, OpFromMaps(impl)(*args), rtol=1e-5, atol=1e-5)


def test_package_holds_the_op_and_needs_its_library(op_package: Path, runner: Path) -> None:
    """The package's compiled model links no Python and calls ``npudet::msda_cpu_forward``
    by schema: without the operator library the runner says so."""
    with zipfile.ZipFile(op_package) as archive:
        models = [name for name in archive.namelist() if name.endswith(".so")]
        assert models, archive.namelist()
        for name in models:
            extracted = Path(archive.extract(name, op_package.parent / "unzipped"))
            assert _links_python(extracted) == [], name
    with pytest.raises(RuntimeError, match="Could not find schema for npudet::msda_cpu_forward"):
        aoti.run_package(op_package, op_inputs(*SIZES[1], seed=1), libraries=[], runner=runner)
