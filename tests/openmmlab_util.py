"""A child process's environment without OpenMMLab, as on the GPU machines."""

from __future__ import annotations

import os
from pathlib import Path

OPENMMLAB = ("mmcv", "mmdet", "mmengine")


def without_openmmlab(folder: Path) -> dict:
    """``os.environ`` plus a ``sitecustomize`` (written to ``folder``, put first on
    ``PYTHONPATH``) that makes mmcv, mmdet and mmengine unimportable in every Python process
    started with it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        f"import sys\nfor name in {OPENMMLAB!r}:\n    sys.modules[name] = None\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(folder), env.get("PYTHONPATH")]))
    return env
