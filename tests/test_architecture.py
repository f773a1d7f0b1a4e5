"""The package's layering (docs/architecture.md): import-linter's contracts and the folder rules."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAX_MODULES = 14


def test_import_contracts_hold() -> None:
    """0 import cycles between layers and 0 imports from a lower layer to a higher one."""
    # In a process of its own: import-linter configures logging, which would silence the
    # loggers other tests read (dictConfig disables existing loggers).
    run = (
        "from importlinter.cli import lint_imports; "
        f"raise SystemExit(lint_imports(config_filename={str(ROOT / '.importlinter')!r}, "
        "no_cache=True, no_logo=True))"
    )
    proc = subprocess.run([sys.executable, "-c", run], capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "3 kept, 0 broken" in proc.stdout, proc.stdout


PACKAGES = sorted(p.parent for p in (ROOT / "npudet").rglob("__init__.py"))


@pytest.mark.parametrize("folder", PACKAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_folder_size(folder: Path) -> None:
    """No package folder holds more than 14 modules side by side."""
    modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= MAX_MODULES, f"{folder.relative_to(ROOT)}: {len(modules)} modules"


def test_no_sys_path_insertion() -> None:
    """Tools and tests import the installed package; none edits sys.path to find it."""
    pattern = re.compile(r"sys\.path\.(insert|append)")
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("tools", "tests", "npudet")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "test_architecture.py" and pattern.search(path.read_text())
    ]
    assert offenders == []
