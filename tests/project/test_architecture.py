"""The package's layering (docs/architecture.md): import-linter's contracts and the folder rules."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest
from openmmlab_util import without_openmmlab

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULES = 14
SIMULATED_NPU = ROOT / "ops" / "npu_sim" / "python"


def test_import_contracts_hold() -> None:
    """0 import cycles between layers and 0 imports from a lower layer to a higher one, in
    npudet and in the simulated NPU's packages (root packages too: their folder goes on the
    path, read by import-linter, never imported)."""
    # In a process of its own: import-linter configures logging, which would silence the
    # loggers other tests read (dictConfig disables existing loggers).
    run = (
        "from importlinter.cli import lint_imports; "
        f"raise SystemExit(lint_imports(config_filename={str(ROOT / '.importlinter')!r}, "
        "no_cache=True, no_logo=True))"
    )
    path = os.pathsep.join(filter(None, [str(SIMULATED_NPU), os.environ.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", run],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "8 kept, 0 broken" in proc.stdout, proc.stdout


def test_torch_only_layers_run_without_openmmlab(tmp_path: Path) -> None:
    """``npudet.nn`` imports, builds, runs forward and backward with mmcv, mmdet and
    mmengine hidden (GPU machines have none of them), and never loads them."""
    code = (
        "import sys\n"
        "import torch\n"
        "from npudet.nn import MSDeformAttn\n"
        "layer = MSDeformAttn(32, 4, 2, 2, batch_first=True, impl='grid_sample')\n"
        "q = torch.randn(2, 5, 32, requires_grad=True)\n"
        "v = torch.randn(2, 30, 32)\n"
        "out = layer(q, value=v, reference_points=torch.rand(2, 5, 2, 2),\n"
        "            spatial_shapes=torch.tensor([[4, 6], [2, 3]]))\n"
        "out.sum().backward()\n"
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] in ('mmcv', 'mmdet', "
        "'mmengine') and sys.modules[m] is not None)\n"
        "print(tuple(out.shape), q.grad.abs().sum().item() > 0, loaded)\n"
    )
    env = without_openmmlab(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "(2, 5, 32) True []", proc.stdout


PACKAGES = sorted(
    p.parent for top in ("npudet", "dev/npudet_dev") for p in (ROOT / top).rglob("__init__.py")
)


# Test and tool folders are held to the same size (dev/'s packages are in PACKAGES already;
# dev/tools/ is not a package).
SIZED_TREES = ("tests", "tools", "dev/tools")


def python_folders(tree: str) -> List[Path]:
    """Every folder under ``tree`` that holds Python files."""
    return sorted({path.parent for path in (ROOT / tree).rglob("*.py")})


@pytest.mark.parametrize(
    "folder",
    PACKAGES + [folder for tree in SIZED_TREES for folder in python_folders(tree)],
    ids=lambda p: str(p.relative_to(ROOT)),
)
def test_folder_size(folder: Path) -> None:
    """No package, test or tool folder holds more than 14 modules side by side (tests,
    helpers and conftest.py count; a package's __init__.py does not)."""
    modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
    assert len(modules) <= MAX_MODULES, f"{folder.relative_to(ROOT)}: {len(modules)} modules"


def test_no_sys_path_insertion() -> None:
    """Tools and tests import the installed package; none edits sys.path to find it."""
    pattern = re.compile(r"sys\.path\.(insert|append)")
    offenders = [
        str(path.relative_to(ROOT))
        for folder in ("tools", "tests", "npudet", "dev")
        for path in (ROOT / folder).rglob("*.py")
        if path.name != "test_architecture.py" and pattern.search(path.read_text())
    ]
    assert offenders == []


NATIVE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".h", ".hpp", ".cu", ".cuh")


def test_native_code_lives_in_ops_only() -> None:
    """Every C/C++/CUDA source is in the top-level ops/ (one copy), and each of its library
    folders has a README saying what it builds and which Python module loads it."""
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.splitlines()
    native = [name for name in tracked if name.endswith(NATIVE_SUFFIXES)]
    assert native and all(name.startswith("ops/") for name in native), [
        name for name in native if not name.startswith("ops/")
    ]
    basenames = [Path(name).name for name in native]
    assert len(basenames) == len(set(basenames)), "a native source is kept twice"
    libraries = {Path(name).parts[1] for name in native}
    for library in sorted(libraries):
        readme = ROOT / "ops" / library / "README.md"
        assert readme.is_file(), f"ops/{library}/ has no README.md"
        # A loader in npudet, or the simulated NPU's own in its torch_npu stand-in (npudet
        # never imports it).
        assert re.search(r"npudet\.|torch_npu\._simulation\b", readme.read_text()), (
            f"ops/{library}/README.md names no loader"
        )


def test_simulated_npu_imports_nothing_of_npudet() -> None:
    """The simulated NPU (ops/npu_sim/python) imports torch, the standard library and its own
    packages only: it stands in for torch_npu / mx_driving, which know nothing of npudet."""
    own = {p.name for p in SIMULATED_NPU.iterdir() if p.is_dir() and "." not in p.name}
    allowed = own | {"torch", "__future__"} | set(sys.stdlib_module_names)
    imported = set()
    for path in SIMULATED_NPU.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                imported.add(node.module.split(".")[0])
    assert own == {"torch_npu", "mx_driving"}
    assert imported and imported <= allowed, sorted(imported - allowed)
