"""What pyproject.toml cannot say: the native sources of the top-level ``ops/`` ship inside
the package as ``npudet/_native/`` (wheel), where an installed npudet builds them on first
use (``npudet.ops.msda.kernels.native_build``); a checkout reads ``ops/`` itself."""

from pathlib import Path

from setuptools import find_packages, setup

NATIVE_FILES = ["*.cpp", "*.h", "*.cuh", "*.md"]
# Every folder of ops/ as a package of data (setuptools ships a folder's files only as a
# package's), ops/ itself being npudet._native. The simulated NPU (ops/npu_sim) is a test
# device for checkouts, never shipped: a wheel must not carry a torch_npu stand-in. Neither is
# the project's own machinery (dev/, the npudet_dev distribution).
native = [
    ".".join(("npudet._native", *folder.relative_to("ops").parts))
    for folder in sorted(p for p in Path("ops").rglob("*") if p.is_dir())
    if folder.relative_to("ops").parts[0] != "npu_sim"
]
native = ["npudet._native", *native]

setup(
    packages=[*find_packages(include=["npudet", "npudet.*"]), *native],
    package_dir={"npudet._native": "ops"},
    package_data={name: NATIVE_FILES for name in native},
)
