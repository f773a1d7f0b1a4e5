"""Setuptools hook: ship the native kernel sources with the package.

The sources live in the repository's top-level ``ops/``; a wheel carries them as
``npudet/_ops/`` so an installed npudet builds its CPU kernel on first use
(``npudet/ops/msda/native_build.py``). An editable install reads ``ops/`` in place.
Everything else is configured in ``pyproject.toml``.
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

KERNEL_SUFFIXES = {".cpp", ".cc", ".h", ".hpp", ".cu", ".cuh"}


class BuildPyWithKernels(build_py):
    """``build_py`` that also copies ``ops/**`` kernel sources to ``npudet/_ops/``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return  # the checkout's ops/ is found in place
        root = Path(__file__).resolve().parent / "ops"
        for src in sorted(root.rglob("*")):
            if src.is_file() and src.suffix in KERNEL_SUFFIXES:
                target = Path(self.build_lib) / "npudet" / "_ops" / src.relative_to(root)
                self.mkpath(str(target.parent))
                self.copy_file(str(src), str(target))


setup(cmdclass={"build_py": BuildPyWithKernels})
