"""npudet installed from a wheel, with no checkout on the path, builds and runs its CPU kernel.

Builds the wheel from a copy of the checkout (so no build/ or egg-info lands in it),
installs it into a folder, then runs ``cpu_variant_check.py`` (``impl="cpu"`` forward and
backward against ``grid_sample``) from outside the checkout with an empty extension cache:
the kernel is compiled from the sources inside the installed package (about a minute).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from npudet.ops.msda.backends import cpu_isa

REPO = Path(__file__).resolve().parents[4]
CHECK = Path(__file__).resolve().parent / "cpu_variant_check.py"
# The kernel's sources: at the top-level ops/ in the sdist, inside the package in the wheel.
SDIST_KERNEL = "ops/msda_cpu/msda_cpu.cpp"
KERNEL = "npudet/_native/msda_cpu/msda_cpu.cpp"
NATIVE = ("msda_cpu/msda_cpu_ops.cpp", "msda_cpu/msda_cpu_autograd.cpp", "msda_cpu/msda_cpu.h")
# The project's own machinery (dev/: npudet_dev), by package and by the names its modules had
# in npudet: none of it ships.
PROJECT_ONLY = (
    "npudet_dev",
    "gpu_kit",
    "kernel_compile",
    "compile_table",
    "ascend_lowering",
    "cpu_probe",
    "deploy/bench",
    "ort_profile",
    "bench_config",
    "bench_data",
    "iteration_",
    "op_profile",
    "bev_temporal",
    "time_split",
    "roundoff_control",
    "ablation/matching",
    "run_record",
)


def _copy_checkout(dest: Path) -> Path:
    """The files a build reads, copied to a new folder ``dest``."""
    dest.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(REPO / name, dest / name)
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for folder in ("npudet", "ops", "dev"):
        shutil.copytree(REPO / folder, dest / folder, ignore=skip)
    return dest


def _pip(*args: str, cwd: Path) -> None:
    cmd = [sys.executable, "-m", "pip", *args, "--no-deps", "--no-build-isolation", "-q"]
    subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True)


def test_sdist_and_wheel_carry_the_kernel_sources(tmp_path):
    """The native sources ship (sdist: ops/, wheel: npudet/_native/), one copy each; the
    project's own machinery (dev/) does not, though the checkout it is built from has it."""
    src = _copy_checkout(tmp_path / "src")
    code = "from setuptools.build_meta import build_sdist; print(build_sdist('sdist'))"
    built = subprocess.run(
        [sys.executable, "-c", code], cwd=src, check=True, capture_output=True, text=True
    )
    sdist = src / "sdist" / built.stdout.strip().splitlines()[-1]
    with tarfile.open(sdist) as tar:
        tar_names = tar.getnames()
    assert any(n.endswith("/" + SDIST_KERNEL) for n in tar_names)
    # A wheel built from the sdist (as pip does for a source release) carries them too.
    _pip("wheel", str(sdist), "-w", str(tmp_path / "dist"), cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("npudet-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert KERNEL in names and all(f"npudet/_native/{rel}" in names for rel in NATIVE)
    # One copy of each source: none elsewhere in the wheel.
    assert [n for n in names if n.endswith("msda_cpu.cpp")] == [KERNEL]
    # What a user imports ships; the project's own machinery does not.
    assert "npudet/benchmark/device_check.py" in names and "npudet/ablation/ablate.py" in names
    assert "npudet/ops/msda/verification/parity.py" in names
    leaked = [n for n in [*names, *tar_names] if any(m in n for m in PROJECT_ONLY)]
    assert leaked == [], leaked


@pytest.mark.slow  # about 65 s, most of it the kernel's compile into an empty cache
def test_installed_wheel_builds_and_runs_the_cpu_kernel(tmp_path):
    src = _copy_checkout(tmp_path / "src")
    _pip("wheel", str(src), "-w", str(tmp_path / "dist"), cwd=tmp_path)
    (wheel,) = (tmp_path / "dist").glob("npudet-*.whl")
    assert KERNEL in zipfile.ZipFile(wheel).namelist()
    site, cache, work = tmp_path / "site", tmp_path / "cache", tmp_path / "work"
    _pip("install", "--target", str(site), str(wheel), cwd=tmp_path)
    work.mkdir()
    script = shutil.copy2(CHECK, work / CHECK.name)
    env = {**os.environ, "PYTHONPATH": str(site), "NPUDET_EXT_CACHE": str(cache)}
    env.pop("NPUDET_CPU_ISA", None)
    done = subprocess.run(
        [sys.executable, script], cwd=work, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(report["npudet"]).is_relative_to(site)
    assert Path(report["sources"]) == site / "npudet" / "_native"
    assert report["autograd"] == "C++ node"
    assert "cpu" in report["impls"]
    best = cpu_isa.runnable()[0].name
    assert report["isa"] == best
    # Built into the empty cache: the variant's operators and the (variant-free) autograd node.
    built = sorted(p.name.split("-")[0] for p in cache.iterdir())
    assert built == ["npudet_msda_cpu_autograd", f"npudet_msda_cpu_{best}"]
