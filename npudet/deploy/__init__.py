"""Deployment: routes that take a model using npudet's op out of Python.

``aoti``: ``torch.export`` + AOTInductor packages (``.pt2``) and the C++ runner
(``ops/aoti_runner/``) that runs them with no Python. This wing imports the op library and
the layers; nothing below it imports it.
"""

from .aoti import build_runner, linked_libraries, operator_libraries, package, run_package

__all__ = ["build_runner", "linked_libraries", "operator_libraries", "package", "run_package"]
